package repo

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	"github.com/subscriberd/subscriberd/model"
)

// InTx runs fn in one transaction, a unit of work: every store fn takes from tx runs its
// statements on that transaction's connection, reads included, and commits with the rest or
// not at all. When the transaction meets a deadlock, a serialization failure or a busy SQLite
// database, the whole of fn runs again (see retry), so fn must start from its own inputs and
// answer nothing to a client from inside. Workers waiting on a queue fn wrote to are woken
// after the commit.
func (db *DB) InTx(ctx context.Context, fn func(tx Tx) error) error {
	return retry(ctx, func(ctx context.Context) error {
		u := &unit{}
		err := db.RunInTx(ctx, nil, func(ctx context.Context, btx bun.Tx) error {
			return fn(Tx{db: db, tx: btx, unit: u})
		})
		if err == nil {
			u.wake(db)
		}
		return err
	})
}

// Tx is one unit of work (DB.InTx): it hands out the stores bound to its transaction.
type Tx struct {
	db   *DB
	tx   bun.Tx
	unit *unit
}

func (t Tx) store() store { return store{db: t.db, idb: t.tx, unit: t.unit, now: utcNow} }

// Subscribers returns the subscriber store bound to the transaction.
func (t Tx) Subscribers() *Subscribers { return &Subscribers{store: t.store()} }

// Events returns the event log bound to the transaction.
func (t Tx) Events() *Events { return &Events{store: t.store()} }

// Webhooks returns the webhook endpoint store bound to the transaction.
func (t Tx) Webhooks() *Webhooks { return &Webhooks{store: t.store()} }

// Confirmations returns the confirmation token store bound to the transaction.
func (t Tx) Confirmations() *Confirmations { return &Confirmations{store: t.store()} }

// Accounts returns the newsletter and key store bound to the transaction.
func (t Tx) Accounts() *Accounts { return &Accounts{store: t.store()} }

// Suppressions returns the suppression list store bound to the transaction.
func (t Tx) Suppressions() *Suppressions { return &Suppressions{store: t.store()} }

// IDB is the transaction itself, for statements of the caller's own.
func (t Tx) IDB() bun.IDB { return t.tx }

// unit is what a unit of work does after its commit: wake the workers of the queues it wrote
// to.
type unit struct{ queues []string }

func (u *unit) queued(queue string) {
	if !slices.Contains(u.queues, queue) {
		u.queues = append(u.queues, queue)
	}
}

func (u *unit) wake(db *DB) {
	for _, q := range u.queues {
		db.eng.wake(q)
	}
}

// Idempotency keeps the stored responses of idempotent writes (docs/api-contract.md §8).
//
// How a write becomes idempotent: the API calls Run with the request's key and fingerprint
// and a function that performs the request with the stores of the Tx it is given. Run opens
// that unit of work, takes the key's lock, and stores the function's response in it, so the
// change and the response record commit together or not at all.
type Idempotency struct {
	store
	ttl time.Duration
}

// NewIdempotency returns the store of idempotent responses on db; a response is replayed for
// ttl after it was stored.
func NewIdempotency(db *DB, ttl time.Duration) *Idempotency {
	return &Idempotency{store: newStore(db), ttl: ttl}
}

type idempotencyRow struct {
	bun.BaseModel `bun:"table:idempotency_keys"`

	NewsletterID uuid.UUID `bun:"newsletter_id,pk,type:uuid"`
	Key          string    `bun:"key,pk"`
	Fingerprint  []byte    `bun:"fingerprint"`
	Status       int       `bun:"status"`
	Location     string    `bun:"location"`
	Body         []byte    `bun:"body"`
	CreatedAt    time.Time `bun:"created_at"`
	ExpiresAt    time.Time `bun:"expires_at"`
}

func (r *idempotencyRow) toModel() model.StoredResponse {
	return model.StoredResponse{Fingerprint: r.Fingerprint, Status: r.Status, Location: r.Location, Body: r.Body}
}

// lookupIdempotency is Lookup's statement, prepared on PostgreSQL (see statement).
var lookupIdempotency = newStatement("SELECT", "idempotency_keys",
	`SELECT fingerprint, status, location, body FROM idempotency_keys WHERE newsletter_id = $1 AND key = $2 AND expires_at > $3`)

// Lookup returns the unexpired response stored under key in the newsletter, if any. It takes
// no lock: a replay costs one indexed read.
func (s *Idempotency) Lookup(ctx context.Context, nl uuid.UUID, key string) (model.StoredResponse, bool, error) {
	var row idempotencyRow
	err := s.db.eng.queryRow(ctx, s.idb, lookupIdempotency, &row, nl, key, s.now())
	if errors.Is(err, sql.ErrNoRows) {
		return model.StoredResponse{}, false, nil
	}
	if err != nil {
		return model.StoredResponse{}, false, translate(err)
	}
	return row.toModel(), true, nil
}

// Run performs an idempotent request: in one unit of work (DB.InTx) it takes the right to run
// the request of (nl, key) and calls fn with the unit's Tx, whose stores fn uses. When fn
// returns a response (a 2xx) it is stored under the key before the commit; when fn returns
// nil the transaction rolls back and nothing is stored (a failed request changed nothing). An
// error from fn rolls back and is returned; a deadlock or a busy SQLite database runs fn again
// (fn answers nothing to the client from inside).
//
// The result says what happened: Ran (fn ran; its response, if any, is committed), or Stored
// (another request with the key finished first: replay or compare its response; whatever fn
// did was rolled back). When another request with the key is still running, Run returns
// model.ErrIdempotencyInUse without calling fn.
//
// The caller has looked the key up (Lookup) just before; a request that finished between that
// look and the lock (engine.lockIdempotencyKey) is caught by the record's insert, which refuses
// to replace a live record and so rolls this one's change back.
func (s *Idempotency) Run(ctx context.Context, nl uuid.UUID, key string, fp []byte,
	fn func(tx Tx) (*model.StoredResponse, error)) (model.IdempotencyResult, error) {
	var res model.IdempotencyResult
	var lost bool // a request with the key may have finished first; look its record up
	err := s.db.InTx(ctx, func(tx Tx) error {
		res, lost = model.IdempotencyResult{}, false
		if err := s.db.eng.lockIdempotencyKey(ctx, tx.tx, nl, key); err != nil {
			return translate(err)
		}
		resp, err := fn(tx)
		res.Ran = true
		if err != nil || resp == nil {
			lost = true // the failure may come from the change of a request that finished first
			if err == nil {
				err = errRollback
			}
			return err
		}
		now := s.now()
		var n int
		err = s.db.eng.queryRow(ctx, tx.tx, storeResponseStmt, &n, nl, key, fp, resp.Status, resp.Location, resp.Body, now, now.Add(s.ttl))
		if errors.Is(err, sql.ErrNoRows) { // a live record: another request with the key finished first
			lost = true
			return errRollback
		}
		return translate(err)
	})
	if lost {
		if stored, found, lerr := s.Lookup(ctx, nl, key); lerr == nil && found {
			return model.IdempotencyResult{Stored: &stored}, nil
		}
	}
	if errors.Is(err, errRollback) {
		err = nil
	}
	if err != nil {
		return model.IdempotencyResult{}, translate(err)
	}
	return res, nil
}

var (
	// storeResponseStmt stores a response under its key, prepared on PostgreSQL (see
	// statement): $1 to $8 the newsletter, key, fingerprint, status, Location, body, time and
	// expiry. An expired record not purged yet is replaced; a live one is not, and no row
	// comes back.
	storeResponseStmt = newStatement("INSERT", "idempotency_keys", `INSERT INTO idempotency_keys AS k
    (newsletter_id, key, fingerprint, status, location, body, created_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (newsletter_id, key) DO UPDATE SET fingerprint = excluded.fingerprint, status = excluded.status,
    location = excluded.location, body = excluded.body, created_at = excluded.created_at, expires_at = excluded.expires_at
WHERE k.expires_at <= excluded.created_at
RETURNING 1`)
)

// errRollback ends a transaction of Run without an error for the caller.
var errRollback = errors.New("rollback")

// Purge deletes up to limit expired records and returns how many it deleted. Each call is one
// short statement, so purging never holds up writes for long; call it until it returns less
// than limit.
func (s *Idempotency) Purge(ctx context.Context, limit int) (int, error) {
	res, err := s.idb.NewRaw(`DELETE FROM idempotency_keys WHERE (newsletter_id, key) IN (
    SELECT newsletter_id, key FROM idempotency_keys WHERE expires_at <= ? LIMIT ?)`, s.now(), limit).Exec(ctx)
	if err != nil {
		return 0, translate(err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// PurgeLoop purges expired records every interval until ctx ends, in batches of 1,000.
// Errors are passed to logErr and the loop goes on.
func (s *Idempotency) PurgeLoop(ctx context.Context, interval time.Duration, logErr func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		for {
			n, err := s.Purge(ctx, 1000)
			if err != nil {
				if ctx.Err() == nil {
					logErr(err)
				}
				break
			}
			if n < 1000 {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

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
