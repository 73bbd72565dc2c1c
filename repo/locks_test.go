package repo_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/subscriberd/subscriberd/internal/testdb"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
)

// TestEmailLocksAreBounded locks the addresses of a 1,000-row batch in one transaction: it
// holds at most 64 advisory locks (PostgreSQL's shared lock table holds about 6,400, and a
// lock per address made a few concurrent batches fail with 53200). A create of one of those
// addresses, one statement that takes its lock inside (suppression_after_lock), waits for the
// same bucket, and answers model.ErrUnavailable when the lock timeout ends.
func TestEmailLocksAreBounded(t *testing.T) {
	if testdb.Store() != testdb.Postgres {
		t.Skip("PostgreSQL only: SQLite's immediate transactions take no advisory locks")
	}
	dsn := pg.Fresh(t)
	db, err := repo.Open(dsn, repo.Options{LockTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx := context.Background()
	nl, err := repo.NewAccounts(db).CreateNewsletter(ctx, "locks", true)
	if err != nil {
		t.Fatal(err)
	}
	emails := make([]string, 1000)
	for i := range emails {
		emails[i] = fmt.Sprintf("Row%d@Example.com", i)
	}
	held := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- db.InTx(ctx, func(tx repo.Tx) error {
			if err := repo.LockEmails(ctx, tx, nl.ID, emails); err != nil {
				return err
			}
			var n int
			if err := tx.IDB().NewRaw(`SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND pid = pg_backend_pid()`).Scan(ctx, &n); err != nil {
				return err
			}
			if n > 64 || n == 0 {
				t.Errorf("a transaction locking 1,000 addresses holds %d advisory locks; want 1 to 64", n)
			}
			close(held)
			<-release
			return nil
		})
	}()
	select {
	case <-held:
	case err := <-done:
		t.Fatalf("locking the batch's addresses: %v", err)
	}
	_, err = repo.NewSubscribers(db).Create(ctx, nl.ID, model.NewSubscriber{Email: "row7@example.com", Status: model.StatusActive})
	close(release)
	if !errors.Is(err, model.ErrUnavailable) {
		t.Errorf("a create of a locked address: %v; want ErrUnavailable at the lock timeout", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := repo.NewSubscribers(db).Create(ctx, nl.ID, model.NewSubscriber{Email: "row7@example.com", Status: model.StatusActive}); err != nil {
		t.Errorf("the create once the lock is gone: %v", err)
	}
}

// TestResourceExhaustionIsUnavailable: PostgreSQL's insufficient-resources errors (class 53:
// out of shared memory, too many connections, disk full) and "cannot connect now" are the
// service being unavailable (503 with Retry-After), never a 500.
func TestResourceExhaustionIsUnavailable(t *testing.T) {
	if testdb.Store() != testdb.Postgres {
		t.Skip("PostgreSQL's SQLSTATEs")
	}
	db, err := repo.Open(pg.Fresh(t), repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	for _, code := range []string{"53200", "53300", "53100", "53400", "57P03"} {
		_, err := db.ExecContext(context.Background(), `DO $$ BEGIN RAISE EXCEPTION 'exhausted' USING ERRCODE = '`+code+`'; END $$`)
		if err == nil {
			t.Fatalf("%s: raised nothing", code)
		}
		if got := repo.Translate(err); !errors.Is(got, model.ErrUnavailable) {
			t.Errorf("SQLSTATE %s translates to %v; want model.ErrUnavailable", code, got)
		}
	}
}
