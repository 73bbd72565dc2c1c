package repo

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/driver/pgdriver"
	"github.com/uptrace/bun/migrate"

	"github.com/subscriberd/subscriberd/migrations"
	"github.com/subscriberd/subscriberd/model"
)

// This file is the PostgreSQL side of the engine seam (see engine): the pool, the hot
// statements prepared once per connection (prepared.go), row locks with SKIP LOCKED for the
// workers' claims, advisory locks, and writes that PostgreSQL does in one statement where
// SQLite needs a transaction. The workers poll: a NOTIFY would serialise the commits of the
// transactions that send it.

func openPostgres(dsn string, opts Options) (db *DB, err error) {
	// pgdriver panics on a DSN it cannot parse; report it as an error instead.
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("invalid PostgreSQL URL: %v", r)
		}
	}()
	if _, err := url.Parse(dsn); err != nil {
		return nil, fmt.Errorf("invalid PostgreSQL URL: %w", err)
	}
	n := opts.MaxConns
	if n <= 0 {
		n = 16
	}
	stmt := opts.StatementTimeout
	if stmt <= 0 {
		stmt = DefaultStatementTimeout
	}
	// The server gives up on a statement (and rolls it back) before the client stops waiting
	// for it: a client-side timeout alone answered 503 while the statement went on and
	// committed, so a retry met its own write. 57014 (query canceled) maps to 503.
	sqldb := sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(dsn),
		pgdriver.WithDialTimeout(5*time.Second), pgdriver.WithWriteTimeout(5*time.Second),
		pgdriver.WithReadTimeout(stmt+5*time.Second),
		// The prepared statements (prepared.go) run their generic plan from the first call:
		// the list statements' generic plans are as good as their custom ones, but under
		// the default "auto" PostgreSQL never picks them (with the LIMIT unknown their
		// estimate never beats a custom plan's) and plans those statements on every call.
		// Statements sent over the simple protocol are planned per call whatever this says.
		pgdriver.WithConnParams(map[string]any{
			"statement_timeout": strconv.FormatInt(stmt.Milliseconds(), 10),
			"plan_cache_mode":   "force_generic_plan",
		}),
		pgdriver.WithApplicationName("subscriberd"),
		// The driver's own tracing adds old-convention attributes (db.name, db.user, and
		// server.address with the port) to our span of every query, growing it; the query
		// hook sets the stable ones itself.
		pgdriver.WithTracing(false)))
	sqldb.SetMaxOpenConns(n)
	sqldb.SetMaxIdleConns(n)
	sqldb.SetConnMaxLifetime(30 * time.Minute)
	sqldb.SetConnMaxIdleTime(5 * time.Minute)
	hook := newQueryHook(dsn, "postgresql")
	bdb := bun.NewDB(sqldb, pgdialect.New()).WithQueryHook(hook)
	return &DB{DB: bdb, eng: &pgEngine{prep: &preparedStatements{db: bdb, hook: hook}}, hook: hook}, nil
}

// pgEngine is the engine of a PostgreSQL pool; it holds the pool's prepared statements.
type pgEngine struct {
	prep *preparedStatements
}

func (*pgEngine) migrations() (*migrate.Migrations, error) { return migrations.Postgres() }

func (*pgEngine) migrationsTableExists() string {
	return "SELECT to_regclass('bun_migrations') IS NOT NULL"
}

func (e *pgEngine) queryRow(ctx context.Context, db bun.IDB, st *statement, dest any, args ...any) error {
	return e.prep.queryRow(ctx, db, st, dest, args...)
}

func (e *pgEngine) queryRows(ctx context.Context, db bun.IDB, st *statement, dest any, args ...any) error {
	return e.prep.queryRows(ctx, db, st, dest, args...)
}

func (e *pgEngine) listPage(ctx context.Context, db bun.IDB, nl uuid.UUID, q model.ListQuery) ([]pageRow, error) {
	var rows []pageRow
	if q.After == nil && q.Offset() > listDirectMaxOffset {
		// Not prepared: see listDeepPostgres.
		err := db.NewRaw(listDeepPostgres(q.Status), nl, string(q.Status), q.Limit+1, q.Offset()).Scan(ctx, &rows)
		return rows, err
	}
	st, args := listPostgres(nl, q)
	err := e.queryRows(ctx, db, st, &rows, args...)
	return rows, err
}

func (e *pgEngine) insertWithEvent(ctx context.Context, db bun.IDB, s *store, row *subscriberRow, ev model.Event) (bool, bool, error) {
	stored, err := s.insertWithEventPG(ctx, db, row, ev)
	return stored, true, err
}

func (*pgEngine) rename(ctx context.Context, s *Subscribers, nl, id uuid.UUID, name *string) (model.Subscriber, bool, error) {
	return s.rename(ctx, nl, id, name)
}

// insertEvents is one statement: the events' insert feeds the deliveries' (queueDeliveriesSQL).
// Whether it queued any is not asked: the workers poll.
func (*pgEngine) insertEvents(ctx context.Context, db bun.IDB, rows []eventRow) (bool, error) {
	ins := db.NewInsert().Model(&rows).Returning("id, newsletter_id, type, created_at")
	_, err := db.NewRaw("WITH ev AS (?) "+queueDeliveriesSQL, ins).Exec(ctx)
	return false, err
}

// claimEmails chooses and leases the due emails in one statement; rows another claim holds are
// skipped, not waited for (FOR UPDATE SKIP LOCKED).
func (*pgEngine) claimEmails(ctx context.Context, s *store, now time.Time, limit int, lease time.Duration) ([]claimedRow, error) {
	var rows []claimedRow
	err := s.idb.NewRaw(`
WITH due AS (
    SELECT id FROM email_outbox
    WHERE state = 'pending' AND next_attempt_at <= ?0
    ORDER BY next_attempt_at
    LIMIT ?1
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE email_outbox AS o SET next_attempt_at = ?2, updated_at = ?0
    FROM due WHERE o.id = due.id
    RETURNING o.id, o.newsletter_id, o.subscriber_id, o.kind, o.attempts, o.unanswered, o.traceparent, o.created_at
)
SELECT c.*, s.email, s.first_name, s.last_name, n.name AS newsletter_name
FROM claimed AS c
JOIN subscribers AS s ON s.id = c.subscriber_id
JOIN newsletters AS n ON n.id = c.newsletter_id
ORDER BY c.created_at, c.id`, now, limit, now.Add(lease)).Scan(ctx, &rows)
	if errors.Is(err, sql.ErrNoRows) {
		err = nil
	}
	return rows, err
}

// claimDeliveries leases endpoints, and reads their due deliveries, in one statement. Endpoints
// other claims hold are skipped (FOR NO KEY UPDATE SKIP LOCKED: not FOR UPDATE, which the
// key-share lock of every write queueing a delivery for the endpoint would make skip it
// whenever writes are busy).
func (*pgEngine) claimDeliveries(ctx context.Context, s *store, now time.Time, endpoints, perEndpoint int, lease time.Duration) ([]claimRow, error) {
	var rows []claimRow
	err := s.idb.NewRaw(`
WITH ep AS (
    SELECT w.id FROM webhook_endpoints AS w
    WHERE `+dueEndpoint+`
    ORDER BY w.last_claimed_at
    LIMIT ?1
    FOR NO KEY UPDATE SKIP LOCKED
), claimed AS (
    UPDATE webhook_endpoints AS w SET busy_until = ?3, last_claimed_at = ?0
    FROM ep WHERE w.id = ep.id
    RETURNING w.id, w.url, w.secret, w.last_claimed_at
)
SELECT c.id AS endpoint_id, c.url, c.secret, d.event_id, d.attempts, e.type, e.payload, e.traceparent
FROM claimed AS c
CROSS JOIN LATERAL (
    SELECT event_id, attempts, next_attempt_at FROM webhook_deliveries
    WHERE endpoint_id = c.id AND state = 'pending' AND next_attempt_at <= ?0
    ORDER BY next_attempt_at
    LIMIT ?2
) AS d
JOIN subscriber_events AS e ON e.id = d.event_id
ORDER BY c.id, d.next_attempt_at`, now, endpoints, perEndpoint, now.Add(lease)).Scan(ctx, &rows)
	if errors.Is(err, sql.ErrNoRows) {
		err = nil
	}
	return rows, err
}

func (*pgEngine) forUpdate() string      { return " FOR UPDATE" }
func (*pgEngine) forNoKeyUpdate() string { return " FOR NO KEY UPDATE" }

// lockEmailKey takes a transaction-scoped advisory lock of the newsletter's key. A hash
// collision only makes two unrelated changes wait for each other.
func (*pgEngine) lockEmailKey(ctx context.Context, tx bun.IDB, nl uuid.UUID, key string) error {
	_, err := tx.NewRaw("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", nl.String()+"/"+key).Exec(ctx)
	return err
}

// lockIdempotencyKey takes the transaction-scoped advisory lock of the key, which a crash or a
// dropped connection releases at once: no marker is ever left behind. A request that finished
// between the caller's Lookup and this lock is caught by the record's insert (Idempotency.Run).
func (e *pgEngine) lockIdempotencyKey(ctx context.Context, _ *Idempotency, tx bun.IDB, nl uuid.UUID, key string) (*model.StoredResponse, error) {
	var locked bool
	if err := e.queryRow(ctx, tx, tryLockPG, &locked, advisoryKey(nl, key)); err != nil {
		return nil, err
	}
	if !locked {
		return nil, fmt.Errorf("%w", model.ErrIdempotencyInUse)
	}
	return nil, nil
}

// listen is nil: on PostgreSQL the workers poll, since writers may be other instances.
func (*pgEngine) listen(context.Context, string) <-chan struct{} { return nil }
func (*pgEngine) wake(string)                                    {}
