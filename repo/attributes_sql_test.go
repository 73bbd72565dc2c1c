package repo_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/uptrace/bun/dialect/pgdialect"

	"github.com/subscriberd/subscriberd/internal/testdb"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
)

// The schema of docs/api-contract.md §19 (migration 20261202000600) before the stores use it:
// the tag counters' triggers, and the SQL forms of model's filter rules that the list will
// run, pinned to model's functions (one rule, one function).

func attributesDB(t *testing.T) (*repo.DB, uuid.UUID) {
	t.Helper()
	db, err := repo.Open(pg.Fresh(t), repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	nl, err := repo.NewAccounts(db).CreateNewsletter(context.Background(), "Weekly", true)
	if err != nil {
		t.Fatal(err)
	}
	return db, nl.ID
}

// rawSubscriber is one subscriber inserted by hand with its attributes and tags.
type rawSubscriber struct {
	email string
	attrs model.Attributes
	tags  []string
}

// insertRaw inserts subs in one statement, so that statement triggers see them together.
func insertRaw(t *testing.T, db *repo.DB, nl uuid.UUID, subs ...rawSubscriber) {
	t.Helper()
	if err := insertRawErr(db, nl, subs...); err != nil {
		t.Fatal(err)
	}
}

func insertRawErr(db *repo.DB, nl uuid.UUID, subs ...rawSubscriber) error {
	var (
		rows []string
		args []any
	)
	now := time.Now().UTC()
	for _, s := range subs {
		tags := model.SortTags(slices.Clone(s.tags))
		if testdb.Store() == testdb.Postgres {
			rows = append(rows, "(?, ?, ?, ?, '', '', 'active', ?, ?, ?::jsonb, ?)")
			args = append(args, uuid.Must(uuid.NewV7()), nl, s.email, s.email, now, now, string(s.attrs.JSON()), pgdialect.Array(append([]string{}, tags...)))
		} else {
			js, _ := json.Marshal(append([]string{}, tags...))
			rows = append(rows, "(?, ?, ?, ?, '', '', 'active', ?, ?, ?, ?)")
			args = append(args, uuid.Must(uuid.NewV7()).String(), nl.String(), s.email, s.email, now, now, string(s.attrs.JSON()), string(js))
		}
	}
	_, err := db.NewRaw(`INSERT INTO subscribers (id, newsletter_id, email, email_key, first_name, last_name, status,
    created_at, updated_at, attributes, tags) VALUES `+strings.Join(rows, ", "), args...).Exec(context.Background())
	return err
}

func setTags(t *testing.T, db *repo.DB, nl uuid.UUID, email string, tags []string) {
	t.Helper()
	tags = model.SortTags(append([]string{}, tags...)) // never nil: NULL is no set
	var v any = pgdialect.Array(tags)
	if testdb.Store() == testdb.SQLite {
		js, _ := json.Marshal(tags)
		v = string(js)
	}
	if _, err := db.NewRaw("UPDATE subscribers SET tags = ? WHERE newsletter_id = ? AND email = ?", v, idArg(nl), email).
		Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func idArg(id uuid.UUID) any {
	if testdb.Store() == testdb.SQLite {
		return id.String()
	}
	return id
}

// checkTagCounts fails t unless subscriber_tag_counts sums, per tag, to the subscribers that
// hold it.
func checkTagCounts(t *testing.T, db *repo.DB, nl uuid.UUID) {
	t.Helper()
	type count struct {
		Tag string `bun:"tag"`
		N   int64  `bun:"n"`
	}
	var counted, real []count
	ctx := context.Background()
	if err := db.NewRaw(`SELECT tag, sum(n) AS n FROM subscriber_tag_counts WHERE newsletter_id = ?
GROUP BY tag HAVING sum(n) <> 0 ORDER BY tag`, idArg(nl)).Scan(ctx, &counted); err != nil {
		t.Fatal(err)
	}
	recount := `SELECT t AS tag, count(*) AS n FROM subscribers, unnest(tags) AS t WHERE newsletter_id = ? GROUP BY t ORDER BY t`
	if testdb.Store() == testdb.SQLite {
		recount = `SELECT j.value AS tag, count(*) AS n FROM subscribers, json_each(subscribers.tags) AS j
WHERE newsletter_id = ? GROUP BY j.value ORDER BY j.value`
	}
	if err := db.NewRaw(recount, idArg(nl)).Scan(ctx, &real); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(real, counted); diff != "" {
		t.Errorf("tag counts (-held +counted):\n%s", diff)
	}
}

// TestTagCountsExact: the counters follow every kind of write of both stores' triggers.
func TestTagCountsExact(t *testing.T) {
	db, nl := attributesDB(t)
	ctx := context.Background()
	insertRaw(t, db, nl,
		rawSubscriber{email: "a@x.io", tags: []string{"beta", "vip"}},
		rawSubscriber{email: "b@x.io", tags: []string{"beta"}},
		rawSubscriber{email: "c@x.io"})
	checkTagCounts(t, db, nl)
	insertRaw(t, db, nl, rawSubscriber{email: "d@x.io", tags: []string{"ä", "z"}})
	checkTagCounts(t, db, nl)
	setTags(t, db, nl, "a@x.io", []string{"beta", "new"})
	setTags(t, db, nl, "c@x.io", []string{"ä"})
	checkTagCounts(t, db, nl)
	if _, err := db.NewRaw("UPDATE subscribers SET first_name = 'Renamed' WHERE newsletter_id = ?", idArg(nl)).Exec(ctx); err != nil {
		t.Fatal(err)
	}
	checkTagCounts(t, db, nl)
	if _, err := db.NewRaw("DELETE FROM subscribers WHERE newsletter_id = ? AND email IN ('b@x.io', 'd@x.io')", idArg(nl)).Exec(ctx); err != nil {
		t.Fatal(err)
	}
	checkTagCounts(t, db, nl)
	setTags(t, db, nl, "a@x.io", nil)
	checkTagCounts(t, db, nl)
}

// TestTagCountsConcurrent: writers adding the same tag at once each take a counter slot of
// their own, and the total stays exact.
func TestTagCountsConcurrent(t *testing.T) {
	if testdb.Store() != testdb.Postgres {
		t.Skip("PostgreSQL only: SQLite serialises writers")
	}
	db, nl := attributesDB(t)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 10 {
				if err := insertRawErr(db, nl, rawSubscriber{email: fmt.Sprintf("w%d-%d@x.io", w, i), tags: []string{"same", fmt.Sprintf("w%d", w)}}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	checkTagCounts(t, db, nl)
	var n int64
	if err := db.NewRaw("SELECT sum(n) FROM subscriber_tag_counts WHERE newsletter_id = ? AND tag = 'same'", nl).
		Scan(context.Background(), &n); err != nil || n != 80 {
		t.Errorf("same = %d, %v; want 80", n, err)
	}
}

// TestAttributeFilterSQL: the SQL form of attr[k]=v selects exactly what model.MatchAttribute
// selects, on both stores: on PostgreSQL containment of model.AttributeProbes (what the GIN
// index serves), on SQLite the JSON text of the attribute against each probe's. Values with
// SQL and JSONPath metacharacters match literally.
func TestAttributeFilterSQL(t *testing.T) {
	db, nl := attributesDB(t)
	values := []any{"pro", "5", json.Number("5"), json.Number("5.5"), "5.5", true, false, "true", "false",
		json.Number("0"), "0", json.Number("-1.5"), "", `'`, `"`, `\`, `$`, `@`, `%`, `_`, `$.k`, `a'b"c\d`, "%_", "日本"}
	var subs []rawSubscriber
	byEmail := map[string]model.Attributes{}
	for i, v := range values {
		email := fmt.Sprintf("s%d@x.io", i)
		attrs := model.Attributes{"k": v}
		subs = append(subs, rawSubscriber{email: email, attrs: attrs})
		byEmail[email] = attrs
	}
	subs = append(subs, rawSubscriber{email: "none@x.io"}, rawSubscriber{email: "other@x.io", attrs: model.Attributes{"j": "pro"}})
	insertRaw(t, db, nl, subs...)
	queries := []string{"pro", "5", "5.0", "5.5", "true", "false", "0", "-0", "-1.5", "", `'`, `"`, `\`, `$`, `@`, `%`, `_`,
		`$.k`, `a'b"c\d`, "%_", "日本", "%", `"pro"`, "True"}
	ctx := context.Background()
	for _, q := range queries {
		probes := model.AttributeProbes("k", q)
		var got []string
		var err error
		if testdb.Store() == testdb.Postgres {
			second := probes[len(probes)-1]
			err = db.NewRaw(`SELECT email FROM subscribers WHERE newsletter_id = ? AND attributes <> '{}'
    AND (attributes @> ?::jsonb OR attributes @> ?::jsonb) ORDER BY email`, nl, string(probes[0]), string(second)).Scan(ctx, &got)
		} else {
			second := probes[len(probes)-1]
			err = db.NewRaw(`SELECT email FROM subscribers WHERE newsletter_id = ?
    AND (attributes -> ?) IN (? -> ?, ? -> ?) ORDER BY email`,
				nl.String(), `$."k"`, string(probes[0]), `$."k"`, string(second), `$."k"`).Scan(ctx, &got)
		}
		if err != nil {
			t.Fatalf("attr[k]=%q: %v", q, err)
		}
		var want []string
		for email, attrs := range byEmail {
			if model.MatchAttribute(attrs, "k", q) {
				want = append(want, email)
			}
		}
		slices.Sort(want)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("attr[k]=%q, probes %s (-MatchAttribute +SQL):\n%s", q, probes, diff)
		}
	}
}

// TestAttributeNamesExpression: PostgreSQL's repo.AttributeNamesPG, which the has_attr index is
// built on, lists exactly the attributes' keys.
func TestAttributeNamesExpression(t *testing.T) {
	if testdb.Store() != testdb.Postgres {
		t.Skip("PostgreSQL only: SQLite reads keys with json_each")
	}
	db, _ := attributesDB(t)
	for _, attrs := range []model.Attributes{{}, {"a": "x"}, {"plan": "pro", "seats": json.Number("5"), "z_9": false},
		{"$": "x", "a.b": "y", "'q\"": true, "ü": "z"}} {
		var keys []string
		if err := db.NewRaw("SELECT k FROM jsonb_array_elements_text("+strings.ReplaceAll(repo.AttributeNamesPG, "attributes", "?::jsonb")+") AS k ORDER BY k COLLATE \"C\"",
			string(attrs.JSON())).Scan(context.Background(), &keys); err != nil {
			t.Fatal(err)
		}
		want := slices.Sorted(func(yield func(string) bool) {
			for k := range attrs {
				if !yield(k) {
					return
				}
			}
		})
		if !slices.Equal(keys, want) {
			t.Errorf("%s of %s = %v; want %v", repo.AttributeNamesPG, attrs.JSON(), keys, want)
		}
	}
}
