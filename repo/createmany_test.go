package repo_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/subscriberd/subscriberd/internal/testdb"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
)

// TestBulkCreateEventsAreNewEvents pins what a bulk create writes (in one statement, its events
// built in SQL, on PostgreSQL) to what the single operations write: each subscriber as returned
// and stored, its one created event byte for byte model.NewEvent's (escapes of names,
// addresses, attributes and tags included) with the request's traceparent and source, one
// delivery of the event per subscribed endpoint and a confirmation email per pending
// subscriber, both in the interactive lane; and its refusals: suppressed addresses (checked
// first) and taken ones name their input positions, on the pool and in a unit of work, and
// store nothing. The tag counters stay exact.
func TestBulkCreateEventsAreNewEvents(t *testing.T) {
	db, nl := attributesDB(t)
	subs := repo.NewSubscribers(db)
	if _, err := repo.NewWebhooks(db).Create(context.Background(), nl, model.NewWebhook{URL: "https://hooks.example.com/a",
		Events: []model.EventType{model.EventCreated}}); err != nil {
		t.Fatal(err)
	}
	src := model.APISource("sk_<pin>&")
	ctx, span := sdktrace.NewTracerProvider().Tracer("test").Start(model.WithSource(context.Background(), src), "request")
	defer span.End()
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	traceparent := carrier.Get("traceparent")
	asStored := cmpopts.EquateApproxTime(time.Microsecond)

	in := escapingSubscribers(t)
	for i := range 30 { // enough rows that their order (client's, email keys') matters
		st := model.StatusActive
		if i%3 == 0 {
			st = model.StatusPending
		}
		in = append(in, model.NewSubscriber{Email: fmt.Sprintf("Bulk%02d@Example.com", 29-i), FirstName: "B", Status: st})
	}
	created, err := subs.CreateMany(ctx, nl, in)
	if err != nil {
		t.Fatal(err)
	}
	if len(created) != len(in) {
		t.Fatalf("%d created; want %d", len(created), len(in))
	}

	type eventRow struct {
		ID          uuid.UUID `bun:"id"`
		Type        string    `bun:"type"`
		Payload     string    `bun:"payload"`
		Traceparent string    `bun:"traceparent"`
		CreatedAt   time.Time `bun:"created_at"`
	}
	type outboxRow struct {
		Kind        string `bun:"kind"`
		Lane        int    `bun:"lane"`
		State       string `bun:"state"`
		Traceparent string `bun:"traceparent"`
	}
	bg := context.Background()
	for i, c := range created {
		stored, err := subs.Get(ctx, nl, c.ID)
		if err != nil {
			t.Fatalf("%s: %v", in[i].Email, err)
		}
		if diff := cmp.Diff(stored, c, asStored); diff != "" {
			t.Errorf("%s: returned (-stored +returned):\n%s", in[i].Email, diff)
		}
		if c.Email != in[i].Email || c.Status != in[i].Status || !c.CreatedAt.Equal(created[0].CreatedAt) {
			t.Errorf("position %d: %s %s at %v; want %s %s, the client's order, one time", i, c.Email, c.Status,
				c.CreatedAt, in[i].Email, in[i].Status)
		}
		var evs []eventRow
		if err := db.NewRaw("SELECT id, type, payload, traceparent, created_at FROM subscriber_events WHERE subscriber_id = ?",
			idArg(c.ID)).Scan(bg, &evs); err != nil {
			t.Fatal(err)
		}
		if len(evs) != 1 {
			t.Errorf("%s: %d events; want 1", c.Email, len(evs))
			continue
		}
		ev := evs[0]
		want := model.NewEvent(model.EventCreated, stored, nil, src, ev.CreatedAt)
		wantJSON := strings.Replace(string(want.Payload), want.ID.String(), ev.ID.String(), 1)
		if ev.Payload != wantJSON || ev.Type != string(model.EventCreated) || ev.Traceparent != traceparent {
			t.Errorf("%s: event\n got %s %s %s\nwant %s %s %s", c.Email, ev.Type, ev.Traceparent, ev.Payload,
				model.EventCreated, traceparent, wantJSON)
		}
		if !ev.CreatedAt.Equal(stored.CreatedAt) || ev.ID.Version() != 7 {
			t.Errorf("%s: event %s at %v; subscriber created at %v", c.Email, ev.ID, ev.CreatedAt, stored.CreatedAt)
		}
		var lanes []int
		if err := db.NewRaw("SELECT lane FROM webhook_deliveries WHERE event_id = ?", idArg(ev.ID)).Scan(bg, &lanes); err != nil {
			t.Fatal(err)
		}
		if len(lanes) != 1 || lanes[0] != 0 {
			t.Errorf("%s: deliveries in lanes %v; want one, interactive (0)", c.Email, lanes)
		}
		var mails []outboxRow
		if err := db.NewRaw("SELECT kind, lane, state, traceparent FROM email_outbox WHERE subscriber_id = ?",
			idArg(c.ID)).Scan(bg, &mails); err != nil {
			t.Fatal(err)
		}
		var wantMails []outboxRow
		if c.Status == model.StatusPending {
			wantMails = []outboxRow{{Kind: model.EmailKindConfirmation, Lane: 0, State: "pending", Traceparent: traceparent}}
		}
		if !cmp.Equal(mails, wantMails, cmpopts.EquateEmpty()) {
			t.Errorf("%s: emails %+v; want %+v", c.Email, mails, wantMails)
		}
	}
	checkTagCounts(t, db, nl)

	// Refused: nothing stored, the positions named.
	count := func() (n int) {
		t.Helper()
		if err := db.NewRaw("SELECT (SELECT count(*) FROM subscribers) + (SELECT count(*) FROM subscriber_events) + "+
			"(SELECT count(*) FROM email_outbox) + (SELECT count(*) FROM webhook_deliveries)").Scan(bg, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := count()
	sups := repo.NewSuppressions(db)
	for _, e := range []string{"Blocked1@example.com", "blocked2@example.com"} {
		if _, _, err := sups.Create(ctx, nl, model.NewSuppression{Email: e, Reason: model.ReasonHardBounce,
			Source: model.SuppressionSource{Kind: model.SuppressionSourceAPI}}); err != nil {
			t.Fatal(err)
		}
	}
	bulk := func(emails ...string) []model.NewSubscriber {
		out := make([]model.NewSubscriber, len(emails))
		for i, e := range emails {
			out[i] = model.NewSubscriber{Email: e, Status: model.StatusPending}
		}
		return out
	}
	pool := func(in []model.NewSubscriber) error { _, err := subs.CreateMany(ctx, nl, in); return err }
	unit := func(in []model.NewSubscriber) error {
		return db.InTx(ctx, func(tx repo.Tx) error { _, err := tx.Subscribers().CreateMany(ctx, nl, in); return err })
	}
	for _, c := range []struct {
		name string
		in   []model.NewSubscriber
		want error
	}{
		{"suppressed and taken", bulk("fresh1@example.com", "BLOCKED2@example.com", "plain@example.com", "blocked1@Example.com"),
			&model.SuppressedError{Reasons: map[int]model.SuppressionReason{1: model.ReasonHardBounce, 3: model.ReasonHardBounce}, Bulk: true}},
		{"taken", bulk("bulk05@example.com", "fresh2@example.com", "fresh3@example.com", "UNI@example.com"),
			&model.EmailTakenError{Indexes: []int{0, 3}}},
	} {
		for name, run := range map[string]func([]model.NewSubscriber) error{"pool": pool, "unit": unit} {
			err := run(c.in)
			var (
				se *model.SuppressedError
				te *model.EmailTakenError
			)
			switch {
			case errors.As(err, &se):
				if !cmp.Equal(error(se), c.want) {
					t.Errorf("%s, %s: %#v; want %#v", c.name, name, se, c.want)
				}
			case errors.As(err, &te):
				if !cmp.Equal(error(te), c.want) {
					t.Errorf("%s, %s: %#v; want %#v", c.name, name, te, c.want)
				}
			default:
				t.Errorf("%s, %s: %v; want %v", c.name, name, err, c.want)
			}
			if n := count(); n != before {
				t.Errorf("%s, %s: %d rows more", c.name, name, n-before)
			}
		}
	}
	checkTagCounts(t, db, nl)
}

// TestBulkCreateMeetsALockFreeWriter: a writer that takes no address lock (an instance of an
// older version during a roll-out) inserts an address of a bulk after the bulk's check: the
// bulk's insert waits for it and fails on the unique key, and the bulk, run again, names the
// address. Nothing of the bulk is stored.
func TestBulkCreateMeetsALockFreeWriter(t *testing.T) {
	if testdb.Store() != testdb.Postgres {
		t.Skip("PostgreSQL only: SQLite's writes hold the database's lock")
	}
	db, nl := attributesDB(t)
	ctx := context.Background()
	subs := repo.NewSubscribers(db)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // committed below
	if _, err := tx.ExecContext(ctx, `INSERT INTO subscribers (id, newsletter_id, email, email_key, first_name, last_name,
    status, created_at, updated_at) VALUES (?, ?, 'race@example.com', 'race@example.com', '', '', 'active', now(), now())`,
		uuid.Must(uuid.NewV7()), nl); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := subs.CreateMany(ctx, nl, []model.NewSubscriber{
			{Email: "first@example.com", Status: model.StatusPending}, {Email: "Race@example.com", Status: model.StatusActive}})
		done <- err
	}()
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		var waiting int
		if err := db.NewRaw(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
AND wait_event_type = 'Lock' AND wait_event = 'transactionid'`).Scan(ctx, &waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Since(start) > 3*time.Second {
			t.Fatal("the bulk never waited for the other writer's row")
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var taken *model.EmailTakenError
	if err := <-done; !errors.As(err, &taken) || !cmp.Equal(taken.Indexes, []int{1}) {
		t.Fatalf("bulk: %v; want position 1 taken", err)
	}
	var n int
	if err := db.NewRaw("SELECT (SELECT count(*) FROM subscribers) + (SELECT count(*) FROM subscriber_events) + "+
		"(SELECT count(*) FROM email_outbox)").Scan(ctx, &n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("%d rows; want the other writer's subscriber alone", n)
	}
}
