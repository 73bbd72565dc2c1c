package repo_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
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
// COMMIT); a bulk create of 100 one, whether it goes in or an email is taken (the addresses'
// locks, the suppression and taken-address checks, the subscribers, their events with their
// deliveries and the pending ones' emails: see createManyStmt); a change of tags one, changed or not (the row lock, the change, its event with its
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
		{"bulk create, 100", func() error {
			_, err := subs.CreateMany(ctx, nl.ID, bulkOf(100, "b"))
			return err
		}, 1},
		{"bulk create, an email taken", func() error {
			in := bulkOf(100, "t")
			in[50].Email = "pa@example.com"
			var taken *model.EmailTakenError
			if _, err := subs.CreateMany(ctx, nl.ID, in); !errors.As(err, &taken) || len(taken.Indexes) != 1 || taken.Indexes[0] != 50 {
				t.Errorf("a bulk with a taken email: %v; want position 50 named", err)
			}
			return nil
		}, 1},
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

// bulkOf is a bulk create of n subscribers <prefix><i>@example.com, every third one pending.
func bulkOf(n int, prefix string) []model.NewSubscriber {
	in := make([]model.NewSubscriber, n)
	for i := range in {
		in[i] = model.NewSubscriber{Email: fmt.Sprintf("%s%d@example.com", prefix, i), FirstName: "Bulk", Status: model.StatusActive}
		if i%3 == 0 {
			in[i].Status = model.StatusPending
		}
	}
	return in
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

// BenchmarkBulkCreate creates bulks of 100 active subscribers (the bench's bulk_100) through
// Subscribers.CreateMany, one client after another, against the test PostgreSQL. Besides the
// client's time and allocations it reports, from pg_stat_statements (when the server loads
// it), the server's execution time and the statements per bulk, and logs the statements that
// took most of it.
// Run with: go test ./repo -run '^$' -bench BulkCreate -benchmem
func BenchmarkBulkCreate(b *testing.B) {
	if testdb.Store() != testdb.Postgres {
		b.Skip("PostgreSQL only")
	}
	db, subs, nl, _ := benchSubscriber(b)
	ctx := context.Background()
	stats := `SELECT coalesce(sum(total_exec_time), 0) AS ms, coalesce(sum(calls), 0) AS calls FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`
	type total struct {
		MS    float64 `bun:"ms"`
		Calls int64   `bun:"calls"`
	}
	_, err := db.ExecContext(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
	measured := err == nil
	var before, after total
	if measured {
		if err := db.NewRaw(stats).Scan(ctx, &before); err != nil {
			measured = false
		}
	}
	cpuBefore, local := backendsCPU(ctx, db)
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		n++
		in := make([]model.NewSubscriber, 100)
		for i := range in {
			in[i] = model.NewSubscriber{Email: fmt.Sprintf("b%d-%d@example.com", n, i), FirstName: "Bench", LastName: "Bulk",
				Status: model.StatusActive}
		}
		if _, err := subs.CreateMany(ctx, nl.ID, in); err != nil {
			b.Fatal(err)
		}
	}
	if cpuAfter, ok := backendsCPU(ctx, db); ok && local {
		b.ReportMetric(float64((cpuAfter-cpuBefore)*time.Second/ticksPerSecond)/float64(time.Microsecond)/float64(n), "server-cpu-µs/op")
	}
	if !measured {
		return
	}
	if err := db.NewRaw(stats).Scan(ctx, &after); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric((after.MS-before.MS)*1000/float64(n), "server-µs/op")
	b.ReportMetric(float64(after.Calls-before.Calls-1)/float64(n), "statements/op")
	var top []struct {
		Calls int64   `bun:"calls"`
		MS    float64 `bun:"ms"`
		Query string  `bun:"query"`
	}
	if err := db.NewRaw(`SELECT calls, total_exec_time AS ms, left(regexp_replace(query, '\s+', ' ', 'g'), 90) AS query
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY total_exec_time DESC LIMIT 8`).Scan(ctx, &top); err != nil {
		b.Fatal(err)
	}
	for _, s := range top {
		b.Logf("%8d calls %10.1f µs/call  %s", s.Calls, s.MS*1000/float64(s.Calls), s.Query)
	}
}

// ticksPerSecond is the unit of the CPU times of /proc/<pid>/stat (USER_HZ, 100 on Linux).
const ticksPerSecond = 100

// backendsCPU sums the CPU time (user and system, in ticksPerSecond) the server's processes
// serving db's database have used so far, when the server runs on this machine (Linux's
// /proc): what parsing, planning and executing cost, where pg_stat_statements counts only the
// execution.
func backendsCPU(ctx context.Context, db *repo.DB) (time.Duration, bool) {
	var pids []int
	if err := db.NewRaw("SELECT pid FROM pg_stat_activity WHERE datname = current_database()").Scan(ctx, &pids); err != nil {
		return 0, false
	}
	var sum time.Duration
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, false
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])) // after the command's name
		if len(f) < 13 {
			return 0, false
		}
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		sum += time.Duration(utime + stime)
	}
	return sum, len(pids) > 0
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
