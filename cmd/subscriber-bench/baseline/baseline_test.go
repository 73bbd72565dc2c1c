package baseline

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	"github.com/subscriberd/subscriberd/cmd/subscriber-bench/load"
	"github.com/subscriberd/subscriberd/internal/testdb"
)

// pg is the test PostgreSQL (TEST_DATABASE_URL, else a container; see internal/testdb).
var pg *testdb.Server

func TestMain(m *testing.M) { os.Exit(testdb.Main(m, &pg)) }

// setup returns a runner on a scratch database holding two newsletters: the runner's, empty,
// and another one with 7 subscribers that no baseline query may see.
func setup(t *testing.T) (*Runner, *bun.DB) {
	t.Helper()
	dsn := pg.Fresh(t)
	db, err := Open(dsn, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx := context.Background()
	mine, other := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	for _, id := range []uuid.UUID{mine, other} {
		if _, err := db.ExecContext(ctx, `INSERT INTO newsletters (id, name, api_access, created_at, updated_at)
			VALUES (?, 'n', true, now(), now())`, id); err != nil {
			t.Fatal(err)
		}
	}
	o := NewRunner(db, other, nil, "other")
	for range 7 {
		if _, err := o.InsertOne(ctx); err != nil {
			t.Fatalf("insert into the other newsletter: %v", err)
		}
	}
	return NewRunner(db, mine, nil, "t1"), db
}

func counted(t *testing.T, db *bun.DB, nl uuid.UUID, status string) int {
	t.Helper()
	var n int
	err := db.NewRaw(`SELECT coalesce(sum(n), 0) FROM subscriber_counts WHERE newsletter_id = ? AND status = ?`, nl, status).
		Scan(context.Background(), &n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestWritesSatisfyTheSchemaAndFireTheCounters(t *testing.T) {
	r, db := setup(t)
	ctx := context.Background()
	for range 3 {
		if n, err := r.Insert100(ctx); err != nil || n != 100 {
			t.Fatalf("Insert100 = %d, %v", n, err)
		}
	}
	if n, err := r.InsertOne(ctx); err != nil || n != 1 {
		t.Fatalf("InsertOne = %d, %v", n, err)
	}
	if n, err := r.InsertPending(ctx); err != nil || n != 1 {
		t.Fatalf("InsertPending = %d, %v", n, err)
	}

	var rows []Subscriber
	if err := db.NewSelect().Model(&rows).Where("newsletter_id = ?", r.Newsletter).Scan(ctx); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 302 {
		t.Fatalf("%d rows in the newsletter, want 302", len(rows))
	}
	emails := map[string]bool{}
	for _, s := range rows {
		if s.EmailKey != strings.ToLower(s.Email) || s.Email == s.EmailKey {
			t.Errorf("email %q has key %q: want the mixed-case email and its lower case", s.Email, s.EmailKey)
		}
		if emails[s.EmailKey] {
			t.Errorf("email %q twice", s.Email)
		}
		emails[s.EmailKey] = true
		if s.ID.Version() != 7 || s.CreatedAt.IsZero() || !s.UpdatedAt.Equal(s.CreatedAt) {
			t.Errorf("row %v: id version %d, created %v, updated %v", s.ID, s.ID.Version(), s.CreatedAt, s.UpdatedAt)
		}
	}
	if a, p := counted(t, db, r.Newsletter, "active"), counted(t, db, r.Newsletter, "pending"); a != 301 || p != 1 {
		t.Errorf("subscriber_counts: active %d, pending %d; want 301 and 1 (the triggers must fire)", a, p)
	}

	// The pending create queued exactly one confirmation email, for the pending subscriber.
	var mail []OutboxEntry
	if err := db.NewSelect().Model(&mail).Scan(ctx); err != nil {
		t.Fatal(err)
	}
	if len(mail) != 1 || mail[0].State != "pending" || mail[0].NewsletterID != r.Newsletter {
		t.Fatalf("outbox = %+v, want one pending entry of the newsletter", mail)
	}
	var st string
	if err := db.NewSelect().TableExpr("subscribers").Column("status").Where("id = ?", mail[0].SubscriberID).Scan(ctx, &st); err != nil || st != "pending" {
		t.Errorf("outbox subscriber status = %q, %v; want pending", st, err)
	}
}

func TestPagesAreNewestFirstWithinTheNewsletter(t *testing.T) {
	r, db := setup(t)
	ctx := context.Background()
	for range 3 {
		if _, err := r.Insert100(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.InsertPending(ctx); err != nil {
		t.Fatal(err)
	}
	// Every row of the newsletter, in the API's order.
	var want []uuid.UUID
	if err := db.NewSelect().TableExpr("subscribers").Column("id").Where("newsletter_id = ?", r.Newsletter).
		OrderExpr("created_at DESC, id DESC").Scan(ctx, &want); err != nil {
		t.Fatal(err)
	}
	if len(want) != 301 {
		t.Fatalf("%d rows, want 301", len(want))
	}

	first, total, err := r.Page(ctx, 1, "", true)
	if err != nil {
		t.Fatal(err)
	}
	if total != 301 {
		t.Errorf("count = %d, want 301 (the other newsletter's 7 must not count)", total)
	}
	if got := ids(first); !slices.Equal(got, want[:PageSize]) {
		t.Errorf("first page ids differ from the newest 25")
	}
	if first[0].Status != "pending" || first[0].Email == "" || first[0].CreatedAt.IsZero() {
		t.Errorf("first row = %+v, want the pending subscriber with its columns", first[0])
	}

	// Page 13 of 25 holds rows 300 and 301; no count was asked for.
	last, total, err := r.Page(ctx, 13, "", false)
	if err != nil {
		t.Fatal(err)
	}
	if total != -1 || !slices.Equal(ids(last), want[300:]) {
		t.Errorf("page 13: %d rows, total %d; want the last 1 and no count", len(last), total)
	}
	if rows, _, err := r.Page(ctx, DeepPage, "", true); err != nil || len(rows) != 0 {
		t.Errorf("page %d = %d rows, %v; want none past the end", DeepPage, len(rows), err)
	}

	pend, total, err := r.Page(ctx, 1, "pending", true)
	if err != nil || len(pend) != 1 || total != 1 || pend[0].ID != want[0] {
		t.Errorf("pending filter: %d rows, total %d, %v; want the one pending subscriber", len(pend), total, err)
	}
	if rows, _, err := r.Page(ctx, 1, StatusFiltered, false); err != nil || len(rows) != PageSize {
		t.Errorf("active filter: %d rows, %v; want a full page", len(rows), err)
	}
}

func TestByIDOperationsStayInTheNewsletter(t *testing.T) {
	r, db := setup(t)
	ctx := context.Background()

	if _, err := r.SelectByID(ctx); err == nil {
		t.Fatalf("SelectByID with no ids succeeded")
	}
	// Only the other newsletter's ids: the by-id operations must find nothing.
	var others []uuid.UUID
	if err := db.NewSelect().TableExpr("subscribers").Column("id").Where("newsletter_id <> ?", r.Newsletter).Scan(ctx, &others); err != nil || len(others) != 7 {
		t.Fatalf("other ids: %d, %v", len(others), err)
	}
	r.IDs = others
	if _, err := r.SelectByID(ctx); err == nil {
		t.Errorf("SelectByID found another newsletter's subscriber")
	}
	if _, err := r.UpdateByID(ctx); err == nil {
		t.Errorf("UpdateByID changed another newsletter's subscriber")
	}

	if _, err := r.InsertOne(ctx); err != nil {
		t.Fatal(err)
	}
	var mine Subscriber
	if err := db.NewSelect().Model(&mine).Where("newsletter_id = ?", r.Newsletter).Scan(ctx); err != nil {
		t.Fatal(err)
	}
	r.IDs = []uuid.UUID{mine.ID}
	if n, err := r.SelectByID(ctx); err != nil || n != 1 {
		t.Errorf("SelectByID = %d, %v", n, err)
	}
	if n, err := r.UpdateByID(ctx); err != nil || n != 1 {
		t.Fatalf("UpdateByID = %d, %v", n, err)
	}
	var after Subscriber
	if err := db.NewSelect().Model(&after).Where("id = ?", mine.ID).Scan(ctx); err != nil {
		t.Fatal(err)
	}
	if after.FirstName != "Updated" || !strings.HasPrefix(after.LastName, "Baseline ") || !after.UpdatedAt.After(after.CreatedAt) {
		t.Errorf("after update: %+v", after)
	}
	if after.Email != mine.Email || after.Status != "active" {
		t.Errorf("update changed more than the name: %+v", after)
	}
	if a := counted(t, db, r.Newsletter, "active"); a != 1 {
		t.Errorf("active count after a rename = %d, want 1", a)
	}
}

// Every scenario runs from several workers without an error (bounded by count, not time).
func TestScenariosRunConcurrently(t *testing.T) {
	r, db := setup(t)
	ctx := context.Background()
	if _, err := r.Insert100(ctx); err != nil {
		t.Fatal(err)
	}
	if err := db.NewSelect().TableExpr("subscribers").Column("id").Where("newsletter_id = ?", r.Newsletter).Scan(ctx, &r.IDs); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, sc := range r.Scenarios() {
		names[sc.Name] = true
		out := load.Run(ctx, load.Options{Clients: 4, Duration: time.Hour, MaxRequests: 24}, sc.Op)
		s := out.Summary
		if s.Requests != 24 || s.OK != 24 {
			t.Errorf("%s: %d requests, %d ok, errors %v %v", sc.Name, s.Requests, s.OK, s.Errors, out.Details)
		}
	}
	if len(names) != 10 {
		t.Errorf("%d distinct scenario names, want 10", len(names))
	}
	// 100 seeded + 24 single + 24 pending + 24×100 bulk.
	var n int
	if err := db.NewSelect().TableExpr("subscribers").ColumnExpr("count(*)").Where("newsletter_id = ?", r.Newsletter).Scan(ctx, &n); err != nil || n != 100+24+24+2400 {
		t.Errorf("rows after the write scenarios = %d, %v; want %d", n, err, 100+24+24+2400)
	}
}

func ids(rows []Subscriber) []uuid.UUID {
	out := make([]uuid.UUID, len(rows))
	for i, s := range rows {
		out[i] = s.ID
	}
	return out
}
