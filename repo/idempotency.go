package repo

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	"github.com/subscriberd/subscriberd/model"
)

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

// lookupIdempotency is lookup's statement, prepared on PostgreSQL (see statement).
var lookupIdempotency = newStatement("SELECT", "idempotency_keys",
	`SELECT fingerprint, status, location, body FROM idempotency_keys WHERE newsletter_id = $1 AND key = $2 AND expires_at > $3`)

// Lookup returns the unexpired response stored under key in the newsletter, if any. It takes
// no lock: a replay costs one indexed read.
func (s *Idempotency) Lookup(ctx context.Context, nl uuid.UUID, key string) (model.StoredResponse, bool, error) {
	return s.lookup(ctx, s.idb, nl, key)
}

func (s *Idempotency) lookup(ctx context.Context, db bun.IDB, nl uuid.UUID, key string) (model.StoredResponse, bool, error) {
	var row idempotencyRow
	err := s.db.eng.queryRow(ctx, db, lookupIdempotency, &row, nl, key, s.now())
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
		if stored, found, lerr := s.lookup(ctx, s.idb, nl, key); lerr == nil && found {
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

// Secret returns the secret called name that every instance on this database shares, making
// it (32 random bytes) when it does not exist yet. The first instance to ask makes it; the
// others, and later starts, read the same value.
func Secret(ctx context.Context, db *DB, name string) ([]byte, error) {
	value := make([]byte, 32)
	rand.Read(value) //nolint:errcheck // never fails
	if _, err := db.NewRaw("INSERT INTO service_secrets (name, value, created_at) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING",
		name, value, time.Now().UTC()).Exec(ctx); err != nil {
		return nil, translate(err)
	}
	var stored []byte
	if err := db.NewRaw("SELECT value FROM service_secrets WHERE name = ?", name).Scan(ctx, &stored); err != nil {
		return nil, translate(err)
	}
	return stored, nil
}
