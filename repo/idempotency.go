package repo

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	"github.com/subscriberd/subscriberd/model"
)

// Idempotency keeps the stored responses of idempotent writes (docs/api-contract.md §8).
//
// How a write becomes idempotent: the API calls Run with the request's key and fingerprint
// and a function that performs the request. Run opens one transaction, takes the key's lock,
// and hands the function a context that carries the transaction; every repo method that
// opens its unit of work with runInTx (or Subscribers.atomically) joins it, so the change and
// the response record commit together or not at all. A new store method needs nothing more
// than to use runInTx for its writes.
type Idempotency struct {
	store
	ttl time.Duration
}

// NewIdempotency returns the store of idempotent responses on db; a response is replayed for
// ttl after it was stored.
func NewIdempotency(db *bun.DB, ttl time.Duration) *Idempotency {
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

// lookupIdempotencyPG is lookup's statement on PostgreSQL, prepared (see statement).
var lookupIdempotencyPG = newStatement("SELECT", "idempotency_keys",
	`SELECT fingerprint, status, location, body FROM idempotency_keys WHERE newsletter_id = $1 AND key = $2 AND expires_at > $3`)

// Lookup returns the unexpired response stored under key in the newsletter, if any. It takes
// no lock: a replay costs one indexed read.
func (s *Idempotency) Lookup(ctx context.Context, nl uuid.UUID, key string) (model.StoredResponse, bool, error) {
	return s.lookup(ctx, s.db, nl, key)
}

func (s *Idempotency) lookup(ctx context.Context, db bun.IDB, nl uuid.UUID, key string) (model.StoredResponse, bool, error) {
	var row idempotencyRow
	var err error
	if s.sqlite { // the builder names the span "SELECT idempotency_keys", as on PostgreSQL
		err = db.NewSelect().Model(&row).Column("fingerprint", "status", "location", "body").
			Where("newsletter_id = ? AND key = ? AND expires_at > ?", nl, key, s.now()).Scan(ctx)
	} else {
		err = s.queryRow(ctx, db, lookupIdempotencyPG, &row, nl, key, s.now())
	}
	if errors.Is(err, sql.ErrNoRows) {
		return model.StoredResponse{}, false, nil
	}
	if err != nil {
		return model.StoredResponse{}, false, translate(err)
	}
	return row.toModel(), true, nil
}

// Run performs an idempotent request: in one transaction it takes the lock of (nl, key) and
// calls fn with a context that carries the transaction. When fn returns a response (a 2xx) it
// is stored under the key before the commit; when fn returns nil the transaction rolls back
// and nothing is stored (a failed request changed nothing). An error from fn rolls back and
// is returned.
//
// The result says what happened: Ran (fn ran; its response, if any, is committed), or Stored
// (another request with the key finished first: replay or compare its response; whatever fn
// did was rolled back). When another request with the key is still running, Run returns
// model.ErrIdempotencyInUse without calling fn.
//
// The lock is PostgreSQL's transaction-scoped advisory lock, which a crash or a dropped
// connection releases at once: no marker is ever left behind. The caller has looked the key
// up (Lookup) just before; a request that finished between that look and the lock is caught
// by the record's insert, which refuses to replace a live record and so rolls this one's
// change back. On SQLite the immediate write transaction serialises every writer, so a
// second request waits for the first and then finds its record at once.
func (s *Idempotency) Run(ctx context.Context, nl uuid.UUID, key string, fp []byte,
	fn func(ctx context.Context) (*model.StoredResponse, error)) (model.IdempotencyResult, error) {
	var res model.IdempotencyResult
	var lost bool // a request with the key finished first; look its record up
	// A deadlock or a busy SQLite database runs the whole request again (see retry): fn
	// answers nothing to the client from inside.
	err := runInTx(ctx, s.db, func(ctx context.Context, tx bun.Tx) error {
		res, lost = model.IdempotencyResult{}, false
		if s.sqlite {
			stored, found, err := s.lookup(ctx, tx, nl, key)
			if err != nil {
				return err
			}
			if found {
				res.Stored = &stored
				return errRollback
			}
		} else {
			var locked bool
			if err := s.queryRow(ctx, tx, tryLockPG, &locked, advisoryKey(nl, key)); err != nil {
				return translate(err)
			}
			if !locked {
				return fmt.Errorf("%w", model.ErrIdempotencyInUse)
			}
		}
		var conflict error
		resp, err := fn(withTx(ctx, s.db, tx, &conflict))
		res.Ran = true
		if conflict != nil { // whatever the handler answered, the request runs again
			return conflict
		}
		if err != nil || resp == nil {
			lost = !s.sqlite // the failure may come from the change of a request that finished first
			if err == nil {
				err = errRollback
			}
			return err
		}
		now := s.now()
		var stored int
		err = s.queryRow(ctx, tx, storeResponseStmt, &stored, nl, key, fp, resp.Status, resp.Location, resp.Body, now, now.Add(s.ttl))
		if errors.Is(err, sql.ErrNoRows) { // a live record: another request with the key finished first
			lost = true
			return errRollback
		}
		return translate(err)
	})
	if lost {
		if stored, found, lerr := s.lookup(ctx, s.db, nl, key); lerr == nil && found {
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
	// tryLockPG takes the transaction-scoped advisory lock of a key if it is free, prepared.
	tryLockPG = newStatement("SELECT", "", `SELECT pg_try_advisory_xact_lock($1)`)
)

// errRollback ends a transaction of Run without an error for the caller.
var errRollback = errors.New("rollback")

// advisoryKey is the 64-bit advisory lock id of (nl, key). Two keys sharing one (a chance of
// 2⁻⁶⁴) only make one of them wait or answer 409 once.
func advisoryKey(nl uuid.UUID, key string) int64 {
	h := sha256.New()
	h.Write(nl[:])
	h.Write([]byte(key))
	return int64(binary.BigEndian.Uint64(h.Sum(nil)[:8])) //nolint:gosec // a hash, any bits will do
}

// Purge deletes up to limit expired records and returns how many it deleted. Each call is one
// short statement, so purging never holds up writes for long; call it until it returns less
// than limit.
func (s *Idempotency) Purge(ctx context.Context, limit int) (int, error) {
	res, err := s.db.NewRaw(`DELETE FROM idempotency_keys WHERE (newsletter_id, key) IN (
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

// txKey is the context key of the transaction of an idempotent request.
type txKey struct{}

type joinedTx struct {
	db *bun.DB
	tx bun.Tx
	// conflict is the first retryable error (a deadlock, a busy SQLite database) a joined unit
	// of work met: the handler answers it as an error, and Run runs the request again instead.
	conflict *error
}

func withTx(ctx context.Context, db *bun.DB, tx bun.Tx, conflict *error) context.Context {
	return context.WithValue(ctx, txKey{}, joinedTx{db: db, tx: tx, conflict: conflict})
}

// joinTx returns the transaction on db that ctx carries (see Idempotency.Run), if any.
func joinTx(ctx context.Context, db *bun.DB) (bun.Tx, bool) {
	j, ok := ctx.Value(txKey{}).(joinedTx)
	if !ok || j.db != db {
		return bun.Tx{}, false
	}
	return j.tx, true
}

// runJoined runs fn in the transaction ctx carries for db, noting a retryable error for Run.
func runJoined(ctx context.Context, db *bun.DB, fn func(ctx context.Context, tx bun.Tx) error) (bool, error) {
	j, ok := ctx.Value(txKey{}).(joinedTx)
	if !ok || j.db != db {
		return false, nil
	}
	err := fn(ctx, j.tx)
	if retryable(err) && *j.conflict == nil {
		*j.conflict = err
	}
	return true, err
}

// Secret returns the secret called name that every instance on this database shares, making
// it (32 random bytes) when it does not exist yet. The first instance to ask makes it; the
// others, and later starts, read the same value.
func Secret(ctx context.Context, db *bun.DB, name string) ([]byte, error) {
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
