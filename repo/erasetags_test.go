package repo_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/internal/testdb"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
)

// An erasure takes with it the tag counters of the tags that nobody else holds (a tag's text
// can be personal data, docs/api-contract.md §14), and leaves every count exact.

// subscriberID returns the id of nl's subscriber with the address email.
func subscriberID(t *testing.T, db *repo.DB, nl uuid.UUID, email string) uuid.UUID {
	t.Helper()
	var id uuid.UUID
	if err := db.NewRaw("SELECT id FROM subscribers WHERE newsletter_id = ? AND email = ?", idArg(nl), email).
		Scan(context.Background(), &id); err != nil {
		t.Fatal(err)
	}
	return id
}

// tagRows returns how many counter rows nl's tag has, and their sum.
func tagRows(t *testing.T, db *repo.DB, nl uuid.UUID, tag string) (rows, sum int64) {
	t.Helper()
	var got struct {
		Rows int64 `bun:"rows"`
		Sum  int64 `bun:"sum"`
	}
	if err := db.NewRaw("SELECT count(*) AS rows, coalesce(sum(n), 0) AS sum FROM subscriber_tag_counts WHERE newsletter_id = ? AND tag = ?",
		idArg(nl), tag).Scan(context.Background(), &got); err != nil {
		t.Fatal(err)
	}
	return got.Rows, got.Sum
}

// TestEraseDropsItsOnlyTags: erasing the only holder of a tag leaves no row of it; erasing one
// of two holders leaves the count 1.
func TestEraseDropsItsOnlyTags(t *testing.T) {
	db, nl := attributesDB(t)
	ctx := context.Background()
	insertRaw(t, db, nl,
		rawSubscriber{email: "jane@x.io", tags: []string{"shared", "vip-jane-doe"}},
		rawSubscriber{email: "bob@x.io", tags: []string{"shared"}})
	// Untagged and tagged again in another statement: on PostgreSQL the tag may now have rows
	// in more than one slot, which the erasure must all take.
	setTags(t, db, nl, "jane@x.io", []string{"shared"})
	setTags(t, db, nl, "jane@x.io", []string{"shared", "vip-jane-doe"})
	privacy := repo.NewPrivacy(db)
	if _, err := privacy.Erase(ctx, nl, subscriberID(t, db, nl, "jane@x.io")); err != nil {
		t.Fatal(err)
	}
	if rows, sum := tagRows(t, db, nl, "vip-jane-doe"); rows != 0 {
		t.Errorf("vip-jane-doe: %d counter rows (sum %d) left after its only holder's erasure, want none", rows, sum)
	}
	if _, sum := tagRows(t, db, nl, "shared"); sum != 1 {
		t.Errorf("shared counts %d, want 1", sum)
	}
	checkTagCounts(t, db, nl)
	if _, err := privacy.Erase(ctx, nl, subscriberID(t, db, nl, "bob@x.io")); err != nil {
		t.Fatal(err)
	}
	if rows, _ := tagRows(t, db, nl, "shared"); rows != 0 {
		t.Errorf("shared: %d counter rows left after its last holder's erasure, want none", rows)
	}
}

// TestEraseTagsConcurrent: while the last original holder of a tag is erased, other
// transactions add the tag to other subscribers and take it from others, each a statement of
// its own (its own counter slot); the count stays exactly the number of holders. Several rounds,
// each with a tag of its own, so that the erasure lands at different points of the writes.
func TestEraseTagsConcurrent(t *testing.T) {
	if testdb.Store() != testdb.Postgres {
		t.Skip("PostgreSQL only: SQLite serialises writers")
	}
	db, nl := attributesDB(t)
	ctx := context.Background()
	const adders, removers, rounds = 12, 4, 6
	for r := range rounds {
		tag := fmt.Sprintf("round-%d", r)
		subs := []rawSubscriber{{email: fmt.Sprintf("holder-%d@x.io", r), tags: []string{tag}}}
		for i := range removers {
			subs = append(subs, rawSubscriber{email: fmt.Sprintf("rm-%d-%d@x.io", r, i), tags: []string{tag}})
		}
		for i := range adders {
			subs = append(subs, rawSubscriber{email: fmt.Sprintf("add-%d-%d@x.io", r, i)})
		}
		insertRaw(t, db, nl, subs...)
		holder := subscriberID(t, db, nl, subs[0].email)
		var wg sync.WaitGroup
		tagOne := func(email, set string) {
			defer wg.Done()
			if _, err := db.NewRaw("UPDATE subscribers SET tags = "+set+" WHERE newsletter_id = ? AND email = ?", tag, nl, email).
				Exec(ctx); err != nil {
				t.Error(err)
			}
		}
		wg.Add(1 + adders + removers)
		go func() {
			defer wg.Done()
			if _, err := repo.NewPrivacy(db).Erase(ctx, nl, holder); err != nil {
				t.Error(err)
			}
		}()
		for i := range adders {
			go tagOne(fmt.Sprintf("add-%d-%d@x.io", r, i), "array_append(tags, ?)")
		}
		for i := range removers {
			go tagOne(fmt.Sprintf("rm-%d-%d@x.io", r, i), "array_remove(tags, ?)")
		}
		wg.Wait()
		if _, sum := tagRows(t, db, nl, tag); sum != adders {
			t.Errorf("%s counts %d, want %d", tag, sum, adders)
		}
		checkTagCounts(t, db, nl)
	}
	// GET /tags' own reading agrees.
	got, err := repo.NewSubscribers(db).ListTags(ctx, nl, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	var want []model.TagCount
	for r := range rounds {
		want = append(want, model.TagCount{Tag: fmt.Sprintf("round-%d", r), Subscribers: adders})
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ListTags (-want +got):\n%s", diff)
	}
}

// TestEraseTagsSkipsWriter: a transaction adds the tag to another subscriber through a
// counter row that exists already (a slot with 0 left by earlier writes) and is still open
// when the erasure of the tag's other holder reaches the counters: the erasure neither waits
// for it nor deletes its row, and once it commits the tag counts 1. A deletion that decided on
// its snapshot's sum (0) and then waited for the row would delete the writer's +1 with the
// rest. The sweep then finds nothing to do, the tag being held.
func TestEraseTagsSkipsWriter(t *testing.T) {
	if testdb.Store() != testdb.Postgres {
		t.Skip("PostgreSQL only: SQLite serialises writers")
	}
	db, nl := attributesDB(t)
	ctx := context.Background()
	insertRaw(t, db, nl, rawSubscriber{email: "jane@x.io", tags: []string{"x"}}, rawSubscriber{email: "bob@x.io"})
	// Every slot has a row of x, so the writer's trigger updates one that exists.
	if _, err := db.NewRaw(`INSERT INTO subscriber_tag_counts (newsletter_id, tag, slot, n)
SELECT ?, 'x', s, 0 FROM generate_series(0, 15) AS s ON CONFLICT DO NOTHING`, nl).Exec(ctx); err != nil {
		t.Fatal(err)
	}
	writer, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Rollback() //nolint:errcheck // committed below; a no-op then
	if _, err := writer.NewRaw("UPDATE subscribers SET tags = array_append(tags, 'x') WHERE newsletter_id = ? AND email = 'bob@x.io'", nl).
		Exec(ctx); err != nil {
		t.Fatal(err)
	}
	jane := subscriberID(t, db, nl, "jane@x.io")
	erased := make(chan error, 1)
	go func() {
		_, err := repo.NewPrivacy(db).Erase(ctx, nl, jane)
		erased <- err
	}()
	// Until the erasure ends, or waits for a row lock the writer holds (conditions, not delays).
	waited := false
	for done := false; !done; {
		select {
		case err := <-erased:
			if err != nil {
				t.Fatal(err)
			}
			done = true
		case <-time.After(10 * time.Millisecond): // a poll's pace, not a wait for the race
			var waiting int
			if err := db.NewRaw(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
AND wait_event_type = 'Lock' AND query LIKE '%subscriber_tag_counts%'`).Scan(ctx, &waiting); err != nil {
				t.Fatal(err)
			}
			if waiting > 0 && !waited {
				waited = true
				t.Error("the erasure waits for the writer's counter row")
				if err := writer.Commit(); err != nil { // let it end
					t.Fatal(err)
				}
			}
		}
	}
	if !waited {
		if rows, _ := tagRows(t, db, nl, "x"); rows == 0 {
			t.Error("the erasure deleted the row the writer holds")
		}
		if err := writer.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if _, sum := tagRows(t, db, nl, "x"); sum != 1 {
		t.Errorf("x counts %d, want 1 (bob)", sum)
	}
	checkTagCounts(t, db, nl)
	if n, err := repo.NewPrivacy(db).SweepTagCounts(ctx, 1000); err != nil || n != 0 {
		t.Errorf("sweep = %d, %v; want 0", n, err)
	}
}

// TestSweepTagCounts: the sweep deletes the counters of the tags nobody holds any more (left
// by untagging and deletes) and nothing of a held tag.
func TestSweepTagCounts(t *testing.T) {
	db, nl := attributesDB(t)
	ctx := context.Background()
	insertRaw(t, db, nl,
		rawSubscriber{email: "a@x.io", tags: []string{"gone", "kept", "vip-jane-doe"}},
		rawSubscriber{email: "b@x.io", tags: []string{"kept"}})
	setTags(t, db, nl, "a@x.io", []string{"kept", "vip-jane-doe"})
	if _, err := db.NewRaw("DELETE FROM subscribers WHERE newsletter_id = ? AND email = 'a@x.io'", idArg(nl)).Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tag := range []string{"gone", "vip-jane-doe"} {
		if rows, _ := tagRows(t, db, nl, tag); rows == 0 {
			t.Fatalf("%s has no counter row before the sweep: the test proves nothing", tag)
		}
	}
	n, err := repo.NewPrivacy(db).SweepTagCounts(ctx, 1000)
	if err != nil || n != 2 {
		t.Fatalf("sweep = %d, %v; want 2 tags", n, err)
	}
	for _, tag := range []string{"gone", "vip-jane-doe"} {
		if rows, _ := tagRows(t, db, nl, tag); rows != 0 {
			t.Errorf("%s: %d counter rows left after the sweep", tag, rows)
		}
	}
	if _, sum := tagRows(t, db, nl, "kept"); sum != 1 {
		t.Errorf("kept counts %d, want 1", sum)
	}
	checkTagCounts(t, db, nl)
	if n, err := repo.NewPrivacy(db).SweepTagCounts(ctx, 1000); err != nil || n != 0 {
		t.Errorf("second sweep = %d, %v; want 0", n, err)
	}
}

// TestEraseHoldersConcurrently: every holder of a tag erased at once; each erasure holds its
// own slot's rows of the tag while it reaches the counters, and none waits for another's. The
// count ends at 0 and, after the sweep at the latest, no row of the tag remains.
func TestEraseHoldersConcurrently(t *testing.T) {
	db, nl := attributesDB(t)
	ctx := context.Background()
	const holders = 12
	var subs []rawSubscriber
	for i := range holders {
		subs = append(subs, rawSubscriber{email: fmt.Sprintf("h%d@x.io", i), tags: []string{"common"}})
	}
	insertRaw(t, db, nl, subs...)
	var wg sync.WaitGroup
	for _, s := range subs {
		id := subscriberID(t, db, nl, s.email)
		wg.Go(func() {
			if _, err := repo.NewPrivacy(db).Erase(ctx, nl, id); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if _, sum := tagRows(t, db, nl, "common"); sum != 0 {
		t.Errorf("common counts %d, want 0", sum)
	}
	if _, err := repo.NewPrivacy(db).SweepTagCounts(ctx, 1000); err != nil {
		t.Fatal(err)
	}
	if rows, _ := tagRows(t, db, nl, "common"); rows != 0 {
		t.Errorf("%d counter rows of common left after the sweep", rows)
	}
}
