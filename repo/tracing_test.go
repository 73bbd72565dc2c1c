package repo

import (
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
)

func TestRedactSQL(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`SELECT "s"."id" FROM "subscribers" AS "s" WHERE ("s"."id" = '0190a3c4-0000-7000-8000-000000000001') LIMIT 1`,
			`SELECT "s"."id" FROM "subscribers" AS "s" WHERE ("s"."id" = ?) LIMIT ?`},
		{`INSERT INTO "subscribers" ("email", "name", "n") VALUES ('ann@example.com', 'O''Brien', 42), ('b@example.com', '', -1.5e-3)`,
			`INSERT INTO "subscribers" ("email", "name", "n") VALUES (?, ?, ?), (?, ?, -?)`},
		{`SELECT * FROM "t1" WHERE "col""2" = '\x0a0b' AND x2 = $1 AND arr = '{"a@b",1}'::text[]`,
			`SELECT * FROM "t1" WHERE "col""2" = ? AND x2 = $1 AND arr = ?::text[]`},
		{`UPDATE t SET v = TRUE, w = NULL, at = '2026-01-02 03:04:05+00:00' WHERE k = X'00ff'`,
			`UPDATE t SET v = TRUE, w = NULL, at = ? WHERE k = X?`},
		{`SELECT 'unterminated sk_live`, `SELECT ?`},
		{`BEGIN`, `BEGIN`},
		{``, ``},
	} {
		if got := redactSQL(c.in); got != c.want {
			t.Errorf("redactSQL(%q)\n got %q\nwant %q", c.in, got, c.want)
		}
	}
}

// FuzzRedactSQL: whatever a string literal holds, nothing of it survives redaction.
func FuzzRedactSQL(f *testing.F) {
	for _, s := range []string{"ann@example.com", "O'Brien", "'; DROP TABLE x; --", `"`, "sk_live_abc", "\\x00", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		lit := "'" + strings.ReplaceAll(v, "'", "''") + "'"
		q := `SELECT "a" FROM "t" WHERE "b" = ` + lit + ` AND "c" = ` + lit
		got, want := redactSQL(q), `SELECT "a" FROM "t" WHERE "b" = ? AND "c" = ?`
		// A statement over maxQueryText is cut between tokens: what is left is a prefix of
		// the full redaction.
		if cut, ok := strings.CutSuffix(got, truncated); ok && len(q) > maxQueryText && strings.HasPrefix(want, cut) {
			return
		}
		if got != want {
			t.Fatalf("redactSQL(%q) = %q, want %q", q, got, want)
		}
	})
}

// FuzzRedactSQLShape: a statement recognised by the shape of one redacted before gets exactly
// the text a full scan gives it, whatever bytes the two hold (the second is made as long as the
// first, so that both fall in the same slot of the shape cache).
func FuzzRedactSQLShape(f *testing.F) {
	for _, c := range [][2]string{
		{`SELECT "a" FROM "t" WHERE "b" = 'ann@example.com' AND "c" = 7`, `SELECT "a" FROM "t" WHERE "b" = 'bob@example.com' AND "c" = 8`},
		{`SELECT "a" FROM "t" WHERE "b" = 'ann@example.com' AND "c" = 7`, `SELECT "a" FROM "t" WHERE "b" = 'an' AND "c" = 7 OR 'x' = 'x'`},
		{`UPDATE t SET v = 'O''Brien', n = 1.5e-3 WHERE k = 'x'`, `UPDATE t SET v = 'O''Brien', n = 1.5e-3 WHERE k = 'y'`},
		{`SELECT 'a', 'b'`, `SELECT 'a''  'b'`},
		{`SELECT 12 FROM x1`, `SELECT 1e FROM x1`},
		{`SELECT "x" = '1'`, `SELECT "x' = '1'`},
	} {
		f.Add(c[0], c[1])
	}
	f.Fuzz(func(t *testing.T, first, second string) {
		if len(second) < len(first) {
			second += strings.Repeat(" ", len(first)-len(second))
		}
		second = second[:len(first)]
		redactSQL(first)
		want, _, _ := scanSQL(second, nil)
		if got := redactSQL(second); got != want {
			t.Fatalf("after %q, redactSQL(%q) = %q; a full scan gives %q", first, second, got, want)
		}
	})
}

// Query spans name the database server, and its port only when it is not PostgreSQL's default,
// as the conventions ask.
func TestQueryHookServerAttributes(t *testing.T) {
	for dsn, want := range map[string][]attribute.KeyValue{
		"postgres://u@db.internal:5432/news?sslmode=disable": {attribute.String("server.address", "db.internal")},
		"postgres://u@db.internal/news":                      {attribute.String("server.address", "db.internal")},
		"postgres://u@10.0.0.7:6432/news":                    {attribute.String("server.address", "10.0.0.7"), attribute.Int("server.port", 6432)},
	} {
		got := newQueryHook(dsn, "postgresql").attrs
		want = append([]attribute.KeyValue{attribute.String("db.system.name", "postgresql"), attribute.String("db.namespace", "news")}, want...)
		if !slices.Equal(got, want) {
			t.Errorf("%s: attributes %v, want %v", dsn, got, want)
		}
	}
}

func BenchmarkRedactSQL(b *testing.B) {
	q := `SELECT "s"."id", "s"."newsletter_id", "s"."email", "s"."name", "s"."status", "s"."created_at", "s"."updated_at" ` +
		`FROM "subscribers" AS "s" WHERE ("s"."newsletter_id" = '0190a3c4-0000-7000-8000-000000000001') AND ("s"."id" = '0190a3c4-0000-7000-8000-000000000002')`
	b.ReportAllocs()
	for b.Loop() {
		redactSQL(q)
	}
}

// A long statement is cut between tokens: a literal that crosses the limit is still replaced
// whole, and the text says it was cut.
func TestRedactSQLCutsLongStatements(t *testing.T) {
	for _, pad := range []int{maxQueryText - 20, maxQueryText - 1, maxQueryText, maxQueryText + 5} {
		q := `INSERT INTO "t" ("a") VALUES ` + strings.Repeat(" ", pad-29) + `('secret@example.com padded to cross the limit'), (12345678)`
		got := redactSQL(q)
		if strings.Contains(got, "secret") || strings.Contains(got, "12345678") || strings.Contains(got, "padded") {
			t.Errorf("pad %d: a value survived: %q", pad, got[max(0, len(got)-80):])
		}
		if !strings.HasSuffix(got, " …") || len(got) > maxQueryText+200 {
			t.Errorf("pad %d: %d bytes, ending %q; want a cut text", pad, len(got), got[max(0, len(got)-20):])
		}
	}
	short := `SELECT "a" FROM "t" WHERE "b" = 'x'`
	if got := redactSQL(short); got != `SELECT "a" FROM "t" WHERE "b" = ?` {
		t.Errorf("short statement: %q", got)
	}
}

// A statement without literals is its own text, cut all the same when it is long; redacted
// texts are interned, so a shape seen before costs no new string.
func TestRedactSQLPlainAndInterned(t *testing.T) {
	plain := `SELECT "a" FROM "t" WHERE "b" = $1`
	if got := redactSQL(plain); got != plain {
		t.Errorf("plain statement: %q", got)
	}
	long := `SELECT ` + strings.Repeat("a, ", maxQueryText) + `b FROM t`
	if got := redactSQL(long); !strings.HasSuffix(got, truncated) || len(got) != maxQueryText+len(truncated) {
		t.Errorf("long plain statement: %d bytes, ending %q; want %d bytes, cut", len(got), got[max(0, len(got)-10):], maxQueryText+len(truncated))
	}
	q := `SELECT "a" FROM "t" WHERE "b" = 'ann@example.com' AND "c" = 7`
	want := `SELECT "a" FROM "t" WHERE "b" = ? AND "c" = ?`
	if got := redactSQL(q); got != want {
		t.Fatalf("redactSQL = %q, want %q", got, want)
	}
	if n := testing.AllocsPerRun(100, func() { redactSQL(q) }); n != 0 {
		t.Errorf("redacting a statement of a known shape allocated %v times, want 0", n)
	}
	// The same statement, as long, with its literals elsewhere: scanned, but its shape is not
	// made again on every query.
	moved := `SELECT "a" FROM "t" WHERE "b" = 'ann@example.co' AND "c" = 71`
	if got := redactSQL(moved); got != want {
		t.Fatalf("redactSQL(%q) = %q, want %q", moved, got, want)
	}
	if n := testing.AllocsPerRun(100, func() { redactSQL(q); redactSQL(moved) }); n != 0 {
		t.Errorf("alternating two placings of one statement allocated %v times a pair, want 0", n)
	}
	// A bulk insert has more literals than a shape keeps: scanned every time, still without
	// allocating once its text is interned.
	bulk := `INSERT INTO "t" ("a", "b") VALUES ` + strings.Repeat(`('ann@example.com', 7), `, 40) + `('x', 1)`
	redactSQL(bulk)
	if n := testing.AllocsPerRun(100, func() { redactSQL(bulk) }); n != 0 {
		t.Errorf("redacting a statement of 82 literals allocated %v times, want 0", n)
	}
}
