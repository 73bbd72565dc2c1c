package repo_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
)

// runImport stages rows (JSON objects) as an import of nl by key prefix sk_pin and runs it to
// the end in batches of size, as a worker does; it returns the import.
func runImport(t *testing.T, db *repo.DB, nl uuid.UUID, size int, rows ...string) model.Import {
	t.Helper()
	ctx := context.Background()
	imports := repo.NewImports(db)
	next := func() (map[string]any, error) {
		if len(rows) == 0 {
			return nil, io.EOF
		}
		var obj map[string]any
		err := json.Unmarshal([]byte(rows[0]), &obj)
		rows = rows[1:]
		return obj, err
	}
	imp, err := imports.Stage(ctx, model.NewImport{NewsletterID: nl, Format: model.ImportNDJSON,
		DefaultStatus: model.StatusActive, KeyPrefix: "sk_pin", Traceparent: ""}, next)
	if err != nil {
		t.Fatal(err)
	}
	return finishImport(t, db, nl, imp.ID, size)
}

// finishImport claims import id and runs its batches of size until it completes.
func finishImport(t *testing.T, db *repo.DB, nl, id uuid.UUID, size int) model.Import {
	t.Helper()
	ctx := context.Background()
	imports := repo.NewImports(db)
	job, ok, err := imports.Claim(ctx, time.Minute)
	if err != nil || !ok || job.ID != id {
		t.Fatalf("claim = %v, %v, %v; want import %s", job.ID, ok, err, id)
	}
	for range 100 {
		_, done, err := imports.Batch(ctx, job, size, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			imp, err := imports.Get(ctx, nl, id)
			if err != nil {
				t.Fatal(err)
			}
			return imp
		}
	}
	t.Fatal("the import did not complete in 100 batches")
	return model.Import{}
}

// TestImportEventsAreNewEvents pins the events an import's batch writes (built in SQL on
// PostgreSQL) to model.NewEvent's, byte for byte: the same subscriber, source and time give
// the same JSON, whatever the name and address hold that JSON escapes. Subscribers, events
// and confirmation emails get UUIDv7 ids of the batch's time.
func TestImportEventsAreNewEvents(t *testing.T) {
	db, nl := openFresh(t)
	ctx := context.Background()
	start := time.Now()
	imp := runImport(t, db, nl, 3,
		`{"email":"plain@example.com","name":"Ann Lee"}`,
		`{"email":"o'brien&co+x@example.com","name":"<b>Tom</b> & \"Jerry\" \\ back/slash"}`,
		`{"email":"single@example.com","name":"Mononym"}`,
		`{"email":"noname@example.com","status":"pending"}`,
		`{"email":"uni@example.com","name":"Zoë  Ünïcödé 日本"}`,
		`{"email":"emoji@example.com","name":"  Padded 🎉 ½ '' "}`,
		`{"email":"attrs@example.com","attributes":{"plan":"<pro> & \"co\"","seats":5,"ratio":1.5,"trial":false,"zz":"日本 ½ /"},"tags":["Beta","vip"]}`,
		`{"email":"tagsonly@example.com","tags":["webinar-2026-11"]}`,
	)
	if imp.Counts.Created != 8 {
		t.Fatalf("counts = %+v", imp.Counts)
	}
	var evs []struct {
		ID           uuid.UUID `bun:"id"`
		SubscriberID uuid.UUID `bun:"subscriber_id"`
		Type         string    `bun:"type"`
		Payload      string    `bun:"payload"`
		CreatedAt    time.Time `bun:"created_at"`
	}
	if err := db.NewRaw("SELECT id, subscriber_id, type, payload, created_at FROM subscriber_events").Scan(ctx, &evs); err != nil {
		t.Fatal(err)
	}
	if int64(len(evs)) != imp.Counts.Created {
		t.Fatalf("%d events for %d created subscribers", len(evs), imp.Counts.Created)
	}
	subs := repo.NewSubscribers(db)
	checkV7 := func(what string, id uuid.UUID) {
		t.Helper()
		sec, nsec := id.Time().UnixTime()
		at := time.Unix(sec, nsec)
		if id.Version() != 7 || id.Variant() != uuid.RFC4122 || at.Before(start.Add(-time.Second)) || at.After(time.Now().Add(time.Second)) {
			t.Errorf("%s id %s: version %d, variant %v, time %v; want a UUIDv7 of the import's time", what, id, id.Version(), id.Variant(), at)
		}
	}
	for _, ev := range evs {
		sub, err := subs.Get(ctx, nl, ev.SubscriberID)
		if err != nil {
			t.Fatal(err)
		}
		want := model.NewEvent(model.EventCreated, sub, nil, model.APISource("sk_pin"), ev.CreatedAt)
		wantJSON := strings.Replace(string(want.Payload), want.ID.String(), ev.ID.String(), 1)
		if ev.Payload != wantJSON || ev.Type != string(model.EventCreated) {
			t.Errorf("event of %s:\n got %s %s\nwant %s %s", sub.Email, ev.Type, ev.Payload, model.EventCreated, wantJSON)
		}
		if !json.Valid([]byte(ev.Payload)) {
			t.Errorf("event of %s is not JSON: %s", sub.Email, ev.Payload)
		}
		checkV7("subscriber", sub.ID)
		checkV7("event", ev.ID)
		if sub.Email == "attrs@example.com" && (len(sub.Attributes) != 5 || strings.Join(sub.Tags, ",") != "beta,vip") {
			t.Errorf("%s stored attributes %v and tags %v; want the line's 5 attributes and beta,vip", sub.Email, sub.Attributes, sub.Tags)
		}
	}
	var mails []uuid.UUID
	if err := db.NewRaw("SELECT id FROM email_outbox").Scan(ctx, &mails); err != nil {
		t.Fatal(err)
	}
	if len(mails) != 1 {
		t.Fatalf("%d confirmation emails, want 1 (the pending row)", len(mails))
	}
	checkV7("email", mails[0])
}

// TestImportFileOrder: an earlier valid row of the file makes a later one with the same
// address existing, whichever batch each is in; an earlier invalid one does not. A suppressed
// address (by its entry, or an erased one by its hash) is suppressed each time it comes,
// before the file-order rule, and so is one erased before 1.3 (by its 1.2 key's hash). The
// counts add up and the counters match.
func TestImportFileOrder(t *testing.T) {
	db, nl := openFresh(t)
	ctx := context.Background()
	supp := repo.NewSuppressions(db)
	for _, s := range []model.NewSuppression{
		{Email: "blocked@example.com", Reason: model.ReasonManual},
		{Email: "gone@example.com", Reason: model.ReasonErased},
	} {
		if _, _, err := supp.Create(ctx, nl, s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := repo.NewSubscribers(db).Create(ctx, nl, model.NewSubscriber{Email: "there@example.com", Status: model.StatusActive}); err != nil {
		t.Fatal(err)
	}
	// An erased entry made before 1.3 holds the hash of the address's 1.2 key (§18).
	const old = "ann@xn--bcher-kva.example"
	if string(model.LegacyEmailHash(old)) == string(model.EmailHash(old)) {
		t.Fatal("the test's address has one key in 1.2 and 1.3")
	}
	if _, err := db.NewRaw(`INSERT INTO suppressions (id, newsletter_id, email, email_key, email_hash, reason, source, created_at)
VALUES (?, ?, NULL, NULL, ?, 'erased', '{}', ?)`, uuid.Must(uuid.NewV7()), nl, model.LegacyEmailHash(old), time.Now().UTC()).Exec(ctx); err != nil {
		t.Fatal(err)
	}
	imp := runImport(t, db, nl, 2,
		`{"email":"a@example.com","name":"First"}`,  // 1 created
		`{"email":"b@example.com","status":"nope"}`, // 2 invalid
		`{"email":"B@example.com","name":"Valid"}`,  // 3 created: the earlier one was invalid
		`{"email":"A@EXAMPLE.com","name":"Second"}`, // 4 existing: earlier in the file (another batch)
		`{"email":"Blocked@example.com"}`,           // 5 suppressed
		`{"email":"blocked@example.com"}`,           // 6 suppressed again
		`{"email":"GONE@example.com"}`,              // 7 suppressed: erased, by hash
		`{"email":"there@example.com"}`,             // 8 existing: in the newsletter
		`{"email":"a@example.com"}`,                 // 9 existing
		`{"email":"ann@xn--bcher-kva.example"}`,     // 10 suppressed: erased before 1.3, by its 1.2 key's hash
	)
	want := model.ImportCounts{Rows: 10, Processed: 10, Created: 2, Existing: 3, Suppressed: 4, Invalid: 1}
	if imp.Counts != want {
		t.Errorf("counts = %+v, want %+v", imp.Counts, want)
	}
	list, total, err := repo.NewSubscribers(db).List(ctx, nl, model.ListQuery{Page: 1, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, s := range list {
		names[s.Email] = s.Name()
	}
	if names["a@example.com"] != "First" || names["B@example.com"] != "Valid" || len(names) != 3 {
		t.Errorf("subscribers = %v, want a@ (First), B@ (Valid) and there@", names)
	}
	if total != 3 {
		t.Errorf("the counters total %d, want 3", total)
	}
	var staged int
	if err := db.NewRaw("SELECT count(*) FROM import_rows").Scan(ctx, &staged); err != nil || staged != 0 {
		t.Errorf("%d staged rows left (%v)", staged, err)
	}
}

// TestImportLegacyRows: rows an older version staged as uploaded (data) are validated when
// their batch comes, with the same outcomes.
func TestImportLegacyRows(t *testing.T) {
	db, nl := openFresh(t)
	ctx := context.Background()
	id := uuid.Must(uuid.NewV7())
	now := time.Now().UTC()
	if _, err := db.NewRaw(`INSERT INTO imports (id, newsletter_id, state, format, default_status, key_prefix, traceparent,
    row_count, processed, created, existing, suppressed, invalid, created_at, updated_at)
VALUES (?, ?, 'queued', 'ndjson', 'pending', 'sk_old', '', 4, 0, 0, 0, 0, 0, ?, ?)`, id, nl, now, now).Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for i, data := range []string{`{"email":"x@example.com"}`, `{"email":"X@example.com"}`, `{"email":"bad"}`, `{"email":"y@example.com","status":"active"}`} {
		if _, err := db.NewRaw("INSERT INTO import_rows (import_id, row_no, data) VALUES (?, ?, ?)", id, i+1, data).Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	imp := finishImport(t, db, nl, id, 3)
	want := model.ImportCounts{Rows: 4, Processed: 4, Created: 2, Existing: 1, Invalid: 1}
	if imp.Counts != want {
		t.Errorf("counts = %+v, want %+v", imp.Counts, want)
	}
	var pending int
	if err := db.NewRaw("SELECT count(*) FROM email_outbox").Scan(ctx, &pending); err != nil || pending != 1 {
		t.Errorf("%d confirmation emails (%v), want 1: x@ took the import's default, pending", pending, err)
	}
}

// TestImportSlowUpload: an upload that takes longer than the statement timeout is stored, and
// the batches then run under the timeout as usual.
func TestImportSlowUpload(t *testing.T) {
	db, err := repo.Open(pg.Fresh(t), repo.Options{StatementTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	created, err := repo.NewAccounts(db).CreateNewsletter(context.Background(), "slow", true)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	next := func() (map[string]any, error) {
		if n == 4 {
			return nil, io.EOF
		}
		n++
		time.Sleep(150 * time.Millisecond)
		return map[string]any{"email": fmt.Sprintf("slow%d@example.com", n)}, nil
	}
	imp, err := repo.NewImports(db).Stage(context.Background(), model.NewImport{NewsletterID: created.ID, Format: model.ImportNDJSON,
		DefaultStatus: model.StatusActive, KeyPrefix: "sk_slow"}, next)
	if err != nil {
		t.Fatalf("a 600 ms upload with a 300 ms statement timeout: %v", err)
	}
	if got := finishImport(t, db, created.ID, imp.ID, 10); got.Counts.Created != 4 {
		t.Errorf("counts = %+v, want 4 created", got.Counts)
	}
}
