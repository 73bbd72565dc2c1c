package repo

import (
	"strings"
	"testing"
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
		if got, want := redactSQL(q), `SELECT "a" FROM "t" WHERE "b" = ? AND "c" = ?`; got != want {
			t.Fatalf("redactSQL(%q) = %q, want %q", q, got, want)
		}
	})
}

func BenchmarkRedactSQL(b *testing.B) {
	q := `SELECT "s"."id", "s"."newsletter_id", "s"."email", "s"."name", "s"."status", "s"."created_at", "s"."updated_at" ` +
		`FROM "subscribers" AS "s" WHERE ("s"."newsletter_id" = '0190a3c4-0000-7000-8000-000000000001') AND ("s"."id" = '0190a3c4-0000-7000-8000-000000000002')`
	b.ReportAllocs()
	for b.Loop() {
		redactSQL(q)
	}
}
