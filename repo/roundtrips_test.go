package repo_test

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	"github.com/subscriberd/subscriberd/internal/testdb"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
)

// statementLog records every statement bun sends, BEGIN and COMMIT included: with pgdriver,
// which sends each as one simple-protocol message, one statement is one round trip.
type statementLog struct {
	mu    sync.Mutex
	sent  []string
	bytes int // of statement text, which pgdriver sends with the values inlined
}

func (l *statementLog) BeforeQuery(ctx context.Context, _ *bun.QueryEvent) context.Context {
	return ctx
}

func (l *statementLog) AfterQuery(_ context.Context, e *bun.QueryEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sent = append(l.sent, strings.Fields(e.Query)[0])
	l.bytes += len(e.Query)
}

// take returns the statements since the last call, and the bytes of their text, and forgets
// them.
func (l *statementLog) take() ([]string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out, n := l.sent, l.bytes
	l.sent, l.bytes = nil, 0
	return out, n
}

// TestStatementsPerRequest pins how many statements (and so round trips to PostgreSQL) each
// request's store call costs: the reads, the key check and an active create one each, with
// no transaction around them; a pending create and an update five (a transaction: the
// change, its event with its deliveries, the confirmation email or the row lock).
func TestStatementsPerRequest(t *testing.T) {
	if testdb.Store() != testdb.Postgres {
		t.Skip("PostgreSQL only: on SQLite every write runs in a transaction, in process")
	}
	db, err := repo.Open(pg.Fresh(t), repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	accounts, subs := repo.NewAccounts(db), repo.NewSubscribers(db)
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
	log := &statementLog{}
	db.AddQueryHook(log)

	name := "Grace Hopper"
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
		{"list, first page with total", func() error {
			_, _, err := subs.List(ctx, nl.ID, model.ListQuery{Page: 1, Limit: 25})
			return err
		}, 1},
		{"list, status filter", func() error {
			_, _, err := subs.List(ctx, nl.ID, model.ListQuery{Page: 1, Limit: 25, Status: model.StatusActive})
			return err
		}, 1},
		{"create, active", func() error {
			_, err := subs.Create(ctx, nl.ID, model.NewSubscriber{Email: "new@example.com", Status: model.StatusActive})
			return err
		}, 1},
		{"create, pending", func() error {
			_, err := subs.Create(ctx, nl.ID, model.NewSubscriber{Email: "pending@example.com", Status: model.StatusPending})
			return err
		}, 5},
		{"update, name", func() error {
			_, err := subs.Update(ctx, nl.ID, created.ID, model.SubscriberPatch{Name: &name})
			return err
		}, 5},
	} {
		log.take()
		if err := c.do(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, n := log.take()
		t.Logf("%-32s %d statements, %4d bytes of SQL: %v", c.name, len(got), n, got)
		if len(got) != c.want {
			t.Errorf("%s: %d statements %v, want %d", c.name, len(got), got, c.want)
		}
	}
}

// BenchmarkGetPaths reads one subscriber by id three ways, against the test PostgreSQL: as
// the service does (bun's query builder and model scan, pgdriver's simple protocol with the
// values inlined into the text, so the server parses and plans each one), the same SQL
// through database/sql without bun, and a statement prepared once per connection
// (database/sql's Stmt over pgdriver's extended protocol: Bind, Execute, Sync). allocs/op and
// B/op are exact counts of the client's work; ns/op includes the server's and the machine's.
// Run with: go test ./repo -run '^$' -bench GetPaths -benchmem
func BenchmarkGetPaths(b *testing.B) {
	if testdb.Store() != testdb.Postgres {
		b.Skip("PostgreSQL only")
	}
	db, err := repo.Open(pg.Fresh(b), repo.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	accounts, subs := repo.NewAccounts(db), repo.NewSubscribers(db)
	nl, err := accounts.CreateNewsletter(ctx, "bench", true)
	if err != nil {
		b.Fatal(err)
	}
	sub, err := subs.Create(ctx, nl.ID, model.NewSubscriber{Email: "ada@example.com", FirstName: "Ada", Status: model.StatusActive})
	if err != nil {
		b.Fatal(err)
	}
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
