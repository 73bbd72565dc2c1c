package repo_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
)

// openFresh opens a fresh migrated database of the store under test, closed when t ends, with
// one newsletter.
func openFresh(t *testing.T) (*repo.DB, uuid.UUID) {
	t.Helper()
	db, err := repo.Open(pg.Fresh(t), repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	nl, err := repo.NewAccounts(db).CreateNewsletter(context.Background(), "unit", true)
	if err != nil {
		t.Fatal(err)
	}
	return db, nl.ID
}

// TestInTxStoresShareTheTransaction: the stores a Tx hands out read what the unit wrote before
// it commits, the pool does not; an error from fn rolls all of it back; a commit shows it.
func TestInTxStoresShareTheTransaction(t *testing.T) {
	db, nl := openFresh(t)
	ctx := context.Background()
	pool := repo.NewSubscribers(db)
	errStop := errors.New("stop")
	for _, commit := range []bool{false, true} {
		var id uuid.UUID
		err := db.InTx(ctx, func(tx repo.Tx) error {
			sub, err := tx.Subscribers().Create(ctx, nl, model.NewSubscriber{Email: "unit@example.com", Status: model.StatusActive})
			if err != nil {
				return err
			}
			id = sub.ID
			name := "Ada Lovelace"
			if _, err := tx.Subscribers().Update(ctx, nl, id, model.SubscriberPatch{Name: &name}); err != nil {
				return err
			}
			if _, err := tx.Subscribers().Unsubscribe(ctx, nl, id); err != nil {
				return err
			}
			if got, err := tx.Subscribers().Get(ctx, nl, id); err != nil || got.FirstName != "Ada" || got.Status != model.StatusUnsubscribed {
				t.Errorf("commit %v: the unit's own read: %+v, %v; want its renamed, unsubscribed subscriber", commit, got, err)
			}
			if evs, _, err := tx.Events().History(ctx, nl, id, model.EventPage{Limit: 10}); err != nil || len(evs) != 3 {
				t.Errorf("commit %v: the unit's history: %d events, %v; want created, updated, unsubscribed", commit, len(evs), err)
			}
			if _, err := pool.Get(ctx, nl, id); !errors.Is(err, model.ErrNotFound) {
				t.Errorf("commit %v: the pool's read before the commit: %v, want model.ErrNotFound", commit, err)
			}
			if !commit {
				return errStop
			}
			return nil
		})
		if !commit {
			if !errors.Is(err, errStop) {
				t.Fatalf("InTx = %v, want fn's error", err)
			}
			if _, err := pool.Get(ctx, nl, id); !errors.Is(err, model.ErrNotFound) {
				t.Fatalf("after a rollback: %v, want model.ErrNotFound", err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Get(ctx, nl, id); err != nil {
			t.Fatalf("after the commit: %v, want the subscriber", err)
		}
	}
}

// TestInTxWakesAfterCommit: a unit of work that queues an email wakes the email workers after
// its commit, not before, and not at all when it rolls back (SQLite; on PostgreSQL the workers
// poll and Listen is nil).
func TestInTxWakesAfterCommit(t *testing.T) {
	db, nl := openFresh(t)
	ctx := t.Context()
	signals := repo.NewOutbox(db).Listen(ctx)
	if signals == nil {
		t.Skip("the workers poll on this store")
	}
	woken := func() bool {
		select {
		case <-signals:
			return true
		case <-time.After(50 * time.Millisecond):
			return false
		}
	}
	errStop := errors.New("stop")
	for i, commit := range []bool{false, true} {
		err := db.InTx(ctx, func(tx repo.Tx) error {
			in := model.NewSubscriber{Email: "wake" + string(rune('a'+i)) + "@example.com", Status: model.StatusPending}
			if _, err := tx.Subscribers().Create(ctx, nl, in); err != nil {
				return err
			}
			if woken() {
				t.Errorf("commit %v: woken before the commit", commit)
			}
			if !commit {
				return errStop
			}
			return nil
		})
		if commit != (err == nil) {
			t.Fatalf("commit %v: InTx = %v", commit, err)
		}
		if got := woken(); got != commit {
			t.Errorf("commit %v: woken after InTx = %v", commit, got)
		}
	}
}

// TestQueryRowsOnBothEngines: a statement with $n placeholders returns every row into a slice
// on either engine, and none leaves it empty.
func TestQueryRowsOnBothEngines(t *testing.T) {
	db, nl := openFresh(t)
	ctx := context.Background()
	subs := repo.NewSubscribers(db)
	in := []model.NewSubscriber{{Email: "one@example.com", Status: model.StatusActive}, {Email: "two@example.com", Status: model.StatusActive}}
	if _, err := subs.CreateMany(ctx, nl, in); err != nil {
		t.Fatal(err)
	}
	var emails []string
	if err := repo.QueryRows(ctx, db, "SELECT email FROM subscribers WHERE newsletter_id = $1 ORDER BY email", &emails, nl); err != nil {
		t.Fatal(err)
	}
	if len(emails) != 2 || emails[0] != "one@example.com" || emails[1] != "two@example.com" {
		t.Errorf("rows = %q, want both emails in order", emails)
	}
	var none []string
	if err := repo.QueryRows(ctx, db, "SELECT email FROM subscribers WHERE id = $1", &none, uuid.Must(uuid.NewV7())); err != nil || len(none) != 0 {
		t.Errorf("no row: %q, %v; want empty, no error", none, err)
	}
}
