package repo_test

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/subscriberd/subscriberd/internal/testdb"
	"github.com/subscriberd/subscriberd/repo"
)

var pg *testdb.Server

func TestMain(m *testing.M) { os.Exit(testdb.Main(m, &pg)) }

// TestInTxRetriesADeadlock makes two transactions lock two rows in opposite orders, so
// PostgreSQL kills one of them with deadlock_detected (40P01); InTx runs the killed one
// again, and both succeed, each update applied once.
func TestInTxRetriesADeadlock(t *testing.T) {
	if testdb.Store() != testdb.Postgres {
		t.Skip("PostgreSQL only: SQLite has no row locks, so no deadlock; its busy database is retried by the same helper")
	}
	db, err := repo.Open(pg.Fresh(t), repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE pair (id int PRIMARY KEY, n int NOT NULL);
INSERT INTO pair VALUES (1, 0), (2, 0)`); err != nil {
		t.Fatal(err)
	}
	var attempts atomic.Int64
	var both sync.WaitGroup // the first attempts meet here, each holding its first row
	both.Add(2)
	run := func(first, second int) error {
		var met atomic.Bool
		return db.InTx(ctx, func(tx repo.Tx) error {
			attempts.Add(1)
			if _, err := tx.IDB().ExecContext(ctx, "UPDATE pair SET n = n + 1 WHERE id = ?", first); err != nil {
				return err
			}
			if met.CompareAndSwap(false, true) {
				both.Done()
				both.Wait()
			}
			_, err := tx.IDB().ExecContext(ctx, "UPDATE pair SET n = n + 1 WHERE id = ?", second)
			return err
		})
	}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = run(1, 2) })
	wg.Go(func() { errs[1] = run(2, 1) })
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("transaction %d: %v, want it retried past the deadlock", i, err)
		}
	}
	if n := attempts.Load(); n != 3 {
		t.Errorf("%d attempts, want 3 (one transaction run again)", n)
	}
	var sum int
	if err := db.NewRaw("SELECT sum(n) FROM pair").Scan(ctx, &sum); err != nil {
		t.Fatal(err)
	}
	if sum != 4 {
		t.Errorf("sum = %d, want 4: each transaction's two updates applied once", sum)
	}
}
