package repo_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun/driver/pgdriver"

	"github.com/subscriberd/subscriberd/internal/testdb"
	"github.com/subscriberd/subscriberd/repo"
)

// countsDB is a fresh PostgreSQL database with one newsletter, through plain connections: the
// counter triggers are what these tests exercise, whatever store code runs the insert.
func countsDB(t *testing.T) (*sql.DB, uuid.UUID) {
	t.Helper()
	if testdb.Store() != testdb.Postgres {
		t.Skip("PostgreSQL only: the counter slots and their locks are PostgreSQL's")
	}
	dsn := pg.Fresh(t)
	db, err := repo.Open(dsn, repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	nl, err := repo.NewAccounts(db).CreateNewsletter(context.Background(), "counts", true)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	sqldb := sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(dsn)))
	t.Cleanup(func() { sqldb.Close() })
	return sqldb, nl.ID
}

// insertSubscriber inserts one active subscriber of nl on q.
func insertSubscriber(ctx context.Context, q interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, nl uuid.UUID) error {
	id := uuid.Must(uuid.NewV7())
	email := id.String() + "@example.com"
	_, err := q.ExecContext(ctx, `INSERT INTO subscribers (id, newsletter_id, email, email_key, first_name, last_name, status, created_at, updated_at)
VALUES ($1, $2, $3, $3, 'A', 'B', 'active', now(), now())`, id, nl, email)
	return err
}

// checkTotals fails t unless the counter rows sum to the subscribers per status.
func checkTotals(t *testing.T, db *sql.DB, nl uuid.UUID) {
	t.Helper()
	var wrong int
	err := db.QueryRow(`SELECT count(*) FROM (
    SELECT status, count(*) AS n FROM subscribers WHERE newsletter_id = $1 GROUP BY status) AS s
FULL JOIN (
    SELECT status, sum(n) AS n FROM subscriber_counts WHERE newsletter_id = $1 GROUP BY status) AS c USING (status)
WHERE coalesce(s.n, 0) <> coalesce(c.n, 0)`, nl).Scan(&wrong)
	if err != nil {
		t.Fatal(err)
	}
	if wrong > 0 {
		t.Errorf("the counter rows do not sum to the subscribers for %d statuses", wrong)
	}
}

// TestCounterSlotsOfCollidingConnectionsDoNotQueue: two connections whose backend pids give
// the same slot (pid % 16, the slot every connection wrote before) both insert while the
// first one's transaction is open; the second does not wait for the first's counter row.
func TestCounterSlotsOfCollidingConnectionsDoNotQueue(t *testing.T) {
	db, nl := countsDB(t)
	ctx := context.Background()
	// Among 17 connections two share pid % 16.
	bySlot := map[int]*sql.Conn{}
	var a, b *sql.Conn
	for range 17 {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		var pid int
		if err := c.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		if other, ok := bySlot[pid%16]; ok {
			a, b = other, c
			break
		}
		bySlot[pid%16] = c
	}
	if a == nil {
		t.Fatal("17 connections and no two share pid % 16")
	}

	tx, err := a.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback() }) // before its connection is closed
	if err := insertSubscriber(ctx, tx, nl); err != nil {
		t.Fatal(err)
	}
	// The first transaction holds its slot; the second connection's insert must not wait
	// for it (before, it queued on the slot's row until the first committed).
	if _, err := b.ExecContext(ctx, "SET lock_timeout = '2s'"); err != nil {
		t.Fatal(err)
	}
	if err := insertSubscriber(ctx, b, nl); err != nil {
		t.Fatalf("the second connection's insert while the first holds its slot: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	checkTotals(t, db, nl)
}

// TestCounterSlotsWaitWhenAllAreHeld: with every slot's lock held by another transaction, an
// insert waits for its own slot's, and goes through, totals exact, once that transaction ends.
func TestCounterSlotsWaitWhenAllAreHeld(t *testing.T) {
	db, nl := countsDB(t)
	ctx := context.Background()
	w, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	holder, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Ended before w is closed, which waits for w's insert, which waits for the holder.
	t.Cleanup(func() { holder.Rollback() })
	if _, err := holder.ExecContext(ctx, `SELECT pg_advisory_xact_lock('subscriber_counts'::regclass::oid::integer, s)
FROM generate_series(0, 15) AS s`); err != nil {
		t.Fatal(err)
	}
	if err := insertSubscriber(ctx, holder, nl); err != nil { // the holder writes too
		t.Fatal(err)
	}
	var pid int
	if err := w.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- insertSubscriber(ctx, w, nl) }()

	waited := false
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && !waited; {
		var event sql.NullString
		if err := db.QueryRowContext(ctx, "SELECT wait_event FROM pg_stat_activity WHERE pid = $1", pid).Scan(&event); err != nil {
			t.Fatal(err)
		}
		waited = event.String == "advisory"
		select {
		case err := <-done:
			t.Fatalf("the insert finished (%v) while every slot was held", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	if !waited {
		t.Fatal("the insert never waited on a slot's lock")
	}
	if err := holder.Commit(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the insert after the slots were freed: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the insert still waits after the slots were freed")
	}
	checkTotals(t, db, nl)
	var n int
	if err := db.QueryRow("SELECT count(*) FROM subscribers WHERE newsletter_id = $1", nl).Scan(&n); err != nil || n != 2 {
		t.Errorf("%d subscribers (%v), want 2", n, fmt.Sprint(err))
	}
}
