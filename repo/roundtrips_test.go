package repo_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/subscriberd/subscriberd/internal/testdb"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
)

// statementSpans records the statements a pool sends through the query spans it makes, one
// per statement whichever way it goes: bun's (BEGIN and COMMIT included) and prepared ones.
// With pgdriver one statement is one round trip; a prepared statement also costs one to be
// prepared, once per connection, not counted here.
type statementSpans struct {
	rec  *tracetest.SpanRecorder
	seen int
}

func newStatementSpans(db *repo.DB) (*statementSpans, context.Context) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	repo.TraceQueries(db, tp)
	ctx, _ := tp.Tracer("test").Start(context.Background(), "request")
	return &statementSpans{rec: rec}, ctx
}

// take returns the names of the statement spans ended since the last call.
func (l *statementSpans) take() []string {
	ended := l.rec.Ended()
	var out []string
	for _, s := range ended[l.seen:] {
		if s.SpanKind() == trace.SpanKindClient {
			out = append(out, s.Name())
		}
	}
	l.seen = len(ended)
	return out
}

// TestStatementsPerRequest pins how many statements (and so round trips to PostgreSQL) each
// request's store call costs: the reads and the key check one each, with no transaction
// around them; a rename two (a read, then the change with its event and its deliveries if the
// row still holds what was read); a create one, active or pending (the address's lock and the
// suppression check of docs/api-contract.md §13, the subscriber, its event with its deliveries
// and, when pending, its confirmation email, in one statement: see createStmt); an idempotent
// create five after the key's lookup (BEGIN, the key's lock, the create, its stored response,
// COMMIT); a change of tags one, changed or not (the row lock, the change, its event with its
// deliveries: see changeTagsStmt); a status change seven (the row lock, and the
// confirmations it retires).
func TestStatementsPerRequest(t *testing.T) {
	if testdb.Store() != testdb.Postgres {
		t.Skip("PostgreSQL only: on SQLite every write runs in a transaction, in process")
	}
	db, err := repo.Open(pg.Fresh(t), repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	log, ctx := newStatementSpans(db)
	accounts, subs, idem := repo.NewAccounts(db), repo.NewSubscribers(db), repo.NewIdempotency(db, time.Hour)
	nl, err := accounts.CreateNewsletter(ctx, "statements", true)
	if err != nil {
		t.Fatal(err)
	}
	_, key, err := accounts.CreateKey(ctx, nl.ID, "k")
	if err != nil {
		t.Fatal(err)
	}
	var created model.Subscriber
	for i := range 30 {
		in := model.NewSubscriber{Email: "p" + string(rune('a'+i)) + "@example.com", FirstName: "P", Status: model.StatusActive}
		if created, err = subs.Create(ctx, nl.ID, in); err != nil {
			t.Fatal(err)
		}
	}
	after := &model.Position{CreatedAt: created.CreatedAt, ID: created.ID}

	name := "Grace Hopper"
	list := func(q model.ListQuery) func() error {
		return func() error { _, _, err := subs.List(ctx, nl.ID, q); return err }
	}
	for _, c := range []struct {
		name string
		do   func() error
		want int // statements (round trips) the request makes
	}{
		{"authenticate (key cache miss)", func() error { _, err := accounts.Authenticate(ctx, model.HashKey(key)); return err }, 1},
		{"get", func() error { _, err := subs.Get(ctx, nl.ID, created.ID); return err }, 1},
		{"get, not found", func() error {
			if _, err := subs.Get(ctx, nl.ID, uuid.Must(uuid.NewV7())); err == nil {
				t.Errorf("found a subscriber that does not exist")
			}
			return nil
		}, 1},
		{"list, first page with total", list(model.ListQuery{Page: 1, Limit: 25}), 1},
		{"list, status filter", list(model.ListQuery{Page: 1, Limit: 25, Status: model.StatusActive}), 1},
		{"list, keyset page", list(model.ListQuery{Limit: 25, After: after}), 1},
		{"list, keyset page, status filter", list(model.ListQuery{Limit: 25, After: after, Status: model.StatusActive}), 1},
		{"list, deep page", list(model.ListQuery{Page: 200, Limit: 25}), 1},
		{"list, deep page, status filter", list(model.ListQuery{Page: 200, Limit: 25, Status: model.StatusActive}), 1},
		{"lookup by email", list(model.ListQuery{Page: 1, Limit: 25, Email: "pa@example.com"}), 1},
		{"idempotent replay lookup", func() error { _, _, err := idem.Lookup(ctx, nl.ID, "k"); return err }, 1},
		{"create, active", func() error {
			_, err := subs.Create(ctx, nl.ID, model.NewSubscriber{Email: "new@example.com", Status: model.StatusActive})
			return err
		}, 1},
		{"create, pending", func() error {
			_, err := subs.Create(ctx, nl.ID, model.NewSubscriber{Email: "pending@example.com", Status: model.StatusPending})
			return err
		}, 1},
		{"create, idempotent (after lookup)", func() error {
			return createKeyed(ctx, idem, nl.ID, "create-key", []byte(`{}`))
		}, 5},
		{"update, name", func() error {
			_, err := subs.Update(ctx, nl.ID, created.ID, model.SubscriberPatch{Name: &name})
			return err
		}, 2},
		{"update, same name", func() error {
			_, err := subs.Update(ctx, nl.ID, created.ID, model.SubscriberPatch{Name: &name})
			return err
		}, 1},
		{"change tags", func() error {
			_, err := subs.ChangeTags(ctx, nl.ID, created.ID, model.TagsChange{Add: []string{"new"}, Remove: []string{"old"}})
			return err
		}, 1},
		{"change tags, to the same set", func() error {
			_, err := subs.ChangeTags(ctx, nl.ID, created.ID, model.TagsChange{Add: []string{"new"}})
			return err
		}, 1},
		{"update, status", func() error {
			st := model.StatusUnsubscribed
			_, err := subs.Update(ctx, nl.ID, created.ID, model.SubscriberPatch{Status: &st})
			return err
		}, 7},
	} {
		log.take()
		if err := c.do(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got := log.take()
		t.Logf("%-32s %d statements: %q", c.name, len(got), got)
		if len(got) != c.want {
			t.Errorf("%s: %d statements %q, want %d", c.name, len(got), got, c.want)
		}
	}
}

// BenchmarkGetPaths reads one subscriber by id several ways, against the test PostgreSQL: as
// the service does ("bun": Subscribers.Get, a statement prepared once per connection and
// scanned by bun's model), bun's raw query, the same SQL through database/sql without bun with
// the values inlined into the text (pgdriver's simple protocol, as bun sends everything, so
// the server parses and plans each one), and a prepared statement scanned by hand
// (database/sql's Stmt over pgdriver's extended protocol: Bind, Execute, Sync). allocs/op and
// B/op are exact counts of the client's work; ns/op includes the server's and the machine's.
// Run with: go test ./repo -run '^$' -bench GetPaths -benchmem
func BenchmarkGetPaths(b *testing.B) {
	if testdb.Store() != testdb.Postgres {
		b.Skip("PostgreSQL only")
	}
	db, subs, nl, sub := benchSubscriber(b)
	ctx := context.Background()
	const cols = `id, newsletter_id, email, first_name, last_name, status, created_at, updated_at`
	type out struct {
		id, nl                 uuid.UUID
		email, first, last, st string
		created, updated       time.Time
	}
	scan := func(row *sql.Row, o *out) error {
		return row.Scan(&o.id, &o.nl, &o.email, &o.first, &o.last, &o.st, &o.created, &o.updated)
	}
	b.Run("bun", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := subs.Get(ctx, nl.ID, sub.ID); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bun-raw", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var o struct {
				ID           uuid.UUID `bun:"id"`
				NewsletterID uuid.UUID `bun:"newsletter_id"`
				Email        string    `bun:"email"`
				FirstName    string    `bun:"first_name"`
				LastName     string    `bun:"last_name"`
				Status       string    `bun:"status"`
				CreatedAt    time.Time `bun:"created_at"`
				UpdatedAt    time.Time `bun:"updated_at"`
			}
			if err := db.NewRaw(`SELECT `+cols+` FROM subscribers WHERE newsletter_id = ? AND id = ?`, nl.ID, sub.ID).Scan(ctx, &o); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sql-inlined", func(b *testing.B) {
		// What pgdriver makes of bun's query: the values formatted into the text.
		q := `SELECT ` + cols + ` FROM subscribers WHERE newsletter_id = '` + nl.ID.String() + `' AND id = '` + sub.ID.String() + `'`
		b.ReportAllocs()
		var o out
		for b.Loop() {
			if err := scan(db.DB.QueryRowContext(ctx, q), &o); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sql-prepared", func(b *testing.B) {
		stmt, err := db.DB.PrepareContext(ctx, `SELECT `+cols+` FROM subscribers WHERE newsletter_id = $1 AND id = $2`)
		if err != nil {
			b.Fatal(err)
		}
		defer stmt.Close()
		b.ReportAllocs()
		var o out
		for b.Loop() {
			if err := scan(stmt.QueryRowContext(ctx, nl.ID, sub.ID), &o); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkUpdateName renames one subscriber through Subscribers.Update, one client after
// another, against the test PostgreSQL: the read, the change, its event and its deliveries.
// Run with: go test ./repo -run '^$' -bench UpdateName -benchmem
func BenchmarkUpdateName(b *testing.B) {
	if testdb.Store() != testdb.Postgres {
		b.Skip("PostgreSQL only")
	}
	_, subs, nl, sub := benchSubscriber(b)
	ctx := context.Background()
	names := []string{"Ada Lovelace", "Ada King"}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if _, err := subs.Update(ctx, nl.ID, sub.ID, model.SubscriberPatch{Name: &names[i%2]}); err != nil {
			b.Fatal(err)
		}
	}
}

// benchSubscriber opens a fresh test PostgreSQL for a benchmark, closed when it ends, and
// stores one subscriber in a new newsletter.
func benchSubscriber(b *testing.B) (*repo.DB, *repo.Subscribers, model.Newsletter, model.Subscriber) {
	b.Helper()
	db, err := repo.Open(pg.Fresh(b), repo.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	ctx := context.Background()
	subs := repo.NewSubscribers(db)
	nl, err := repo.NewAccounts(db).CreateNewsletter(ctx, "bench", true)
	if err != nil {
		b.Fatal(err)
	}
	sub, err := subs.Create(ctx, nl.ID, model.NewSubscriber{Email: "ada@example.com", FirstName: "Ada", Status: model.StatusActive})
	if err != nil {
		b.Fatal(err)
	}
	return db, subs, nl, sub
}

// BenchmarkIdempotentCreate creates one active subscriber under a fresh Idempotency-Key per
// iteration, as a keyed POST does after its key's lookup missed: Idempotency.Run around
// Subscribers.Create, the response stored in the same transaction.
// Run with: go test ./repo -run '^$' -bench IdempotentCreate -benchmem
func BenchmarkIdempotentCreate(b *testing.B) {
	if testdb.Store() != testdb.Postgres {
		b.Skip("PostgreSQL only")
	}
	db, _, nl, _ := benchSubscriber(b)
	idem := repo.NewIdempotency(db, time.Hour)
	ctx := context.Background()
	body := []byte(`{"data":{"id":"0196f0a4-0000-7000-8000-000000000000"}}`)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if err := createKeyed(ctx, idem, nl.ID, fmt.Sprintf("key-%d", i), body); err != nil {
			b.Fatal(err)
		}
	}
}

// createKeyed creates the active subscriber <key>@example.com under Idempotency-Key key, as a
// keyed POST does after its key's lookup missed, storing body as its 201.
func createKeyed(ctx context.Context, idem *repo.Idempotency, nl uuid.UUID, key string, body []byte) error {
	_, err := idem.Run(ctx, nl, key, []byte("fp"), func(tx repo.Tx) (*model.StoredResponse, error) {
		in := model.NewSubscriber{Email: key + "@example.com", Status: model.StatusActive}
		if _, err := tx.Subscribers().Create(ctx, nl, in); err != nil {
			return nil, err
		}
		return &model.StoredResponse{Fingerprint: []byte("fp"), Status: 201, Body: body}, nil
	})
	return err
}

// BenchmarkListPage reads a page of 25 subscribers with its exact total through
// Subscribers.List, as the list operation does, against the test PostgreSQL: the first page,
// and the page after a cursor's position (keyset).
// Run with: go test ./repo -run '^$' -bench ListPage -benchmem
func BenchmarkListPage(b *testing.B) {
	if testdb.Store() != testdb.Postgres {
		b.Skip("PostgreSQL only")
	}
	_, subs, nl, _ := benchSubscriber(b)
	ctx := context.Background()
	in := make([]model.NewSubscriber, 100)
	for i := range in {
		in[i] = model.NewSubscriber{Email: fmt.Sprintf("reader%d@example.com", i), FirstName: "Ada", LastName: "Lovelace",
			Status: model.StatusActive}
	}
	if _, err := subs.CreateMany(ctx, nl.ID, in); err != nil {
		b.Fatal(err)
	}
	first, _, err := subs.List(ctx, nl.ID, model.ListQuery{Page: 1, Limit: 25})
	if err != nil || len(first) != 26 {
		b.Fatalf("first page: %d subscribers, %v", len(first), err)
	}
	last := first[24]
	for name, q := range map[string]model.ListQuery{
		"first": {Page: 1, Limit: 25},
		"after": {Limit: 25, After: &model.Position{CreatedAt: last.CreatedAt, ID: last.ID}},
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if page, _, err := subs.List(ctx, nl.ID, q); err != nil || len(page) != 26 {
					b.Fatalf("%d subscribers, %v", len(page), err)
				}
			}
		})
	}
}
