package repo

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/uptrace/bun"
)

// txRetries is how many times a unit of work that met a deadlock, a serialization failure
// (PostgreSQL) or a busy database (SQLite, after its busy timeout) is run again before its
// error reaches the caller. Writers take their row locks in one order (bulk rows by email key,
// email changes by id), so a deadlock should not happen at all; the retries cover what ordering
// cannot (a lock taken by a trigger, a future statement) without ever answering 5xx for a
// client's legitimate concurrency.
const txRetries = 3

// txRetryBase is the delay before the first retry; it doubles for each further one and a
// random half of it is taken off (jitter), so that two transactions that deadlocked each other
// do not meet again at once. Three retries wait at most 25+50+100 ms.
const txRetryBase = 25 * time.Millisecond

// retryable tells whether err is a conflict between transactions that running the whole unit
// of work again can resolve: PostgreSQL's deadlock_detected (40P01) and serialization_failure
// (40001), SQLite's busy or locked database. The server rolled the transaction back, so
// nothing of it took effect.
func retryable(err error) bool {
	if err == nil {
		return false
	}
	switch sqlState(err) {
	case "40P01", "40001":
		return true
	}
	return isBusy(err)
}

// retryDelay is the wait before retry number attempt (1 for the first).
func retryDelay(attempt int) time.Duration {
	d := txRetryBase << (attempt - 1)
	return d - rand.N(d/2+1)
}

// retry runs fn, the whole unit of work, and runs it again up to txRetries times while it
// fails with a retryable error. fn must be safe to run again: everything it did in the failed
// attempt was rolled back, so it starts from its own inputs (reset any state it accumulates).
func retry(ctx context.Context, fn func(ctx context.Context) error) error {
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if !retryable(err) || attempt > txRetries {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(retryDelay(attempt)):
		}
	}
}

// runInTx runs fn, a unit of work, in a transaction on db: in db itself when it is one (a unit
// of work's, whose DB.InTx runs the whole of it again), else in a new one on the pool, run
// again on a retryable error (see retry). Stores run theirs through store.inTx; engines
// theirs (a claim, SQLite's several statements of one write) through this. Nothing may be
// answered to a client from inside fn.
func runInTx(ctx context.Context, db bun.IDB, fn func(ctx context.Context, tx bun.IDB) error) error {
	if _, ok := db.(bun.Tx); ok {
		return fn(ctx, db)
	}
	return retry(ctx, func(ctx context.Context) error {
		return db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error { return fn(ctx, tx) })
	})
}

// runAtomic runs fn, one statement that takes effect whole or not at all, on db: as it is in
// a transaction, or on the pool, run again on a retryable error (see retry).
func runAtomic(ctx context.Context, db bun.IDB, fn func(ctx context.Context) error) error {
	if _, ok := db.(bun.Tx); ok {
		return fn(ctx)
	}
	return retry(ctx, fn)
}
