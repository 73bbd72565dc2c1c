package repo

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/driver/pgdriver"
	"github.com/uptrace/bun/migrate"
	"go.opentelemetry.io/otel/trace"

	"github.com/subscriberd/subscriberd/migrations"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/outbox"
	"github.com/subscriberd/subscriberd/repo/pgconn"
)

// This file is the PostgreSQL side of the engine seam (see engine): the pool (whose
// connections stop a statement when its context ends, package pgconn), the hot statements prepared
// once per connection (see statement), row locks with SKIP LOCKED for the workers' claims,
// advisory locks, an import's rows by COPY, and writes that PostgreSQL does in one statement
// where SQLite needs a transaction (a create, a rename, a change of tags, an event with its
// deliveries). It takes plain values and names nothing of the stores. The workers poll: a
// NOTIFY would serialise the commits of the transactions that send it.

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
	lock := opts.LockTimeout
	if lock <= 0 {
		lock = DefaultLockTimeout
	}
	// The server gives up on a statement (and rolls it back) before the client stops waiting
	// for it: a client-side timeout alone answered 503 while the statement went on and
	// committed, so a retry met its own write. 57014 (query canceled) maps to 503. A statement
	// waiting for a lock gives up sooner, at lock_timeout (55P03, also 503): a transaction
	// left open on a row otherwise held every connection that wanted it, and with them the
	// pool, for the whole statement timeout. The connector is wrapped (package pgconn) so that a
	// statement stops when its context ends: the connection is closed (pgdriver sends no
	// cancel request). The server notices a closed connection only when it next writes to
	// it, so a statement whose client had gone went on waiting for its lock and then
	// committed; every second it now checks the connection while a statement runs
	// (client_connection_check_interval) and ends the statement, rolled back, once the client
	// has gone. READ COMMITTED is pinned whatever the server's or the database's default: the
	// one-statement create (createStmt) must see a suppression committed while it waited for
	// the address's lock, which only a statement-level snapshot taken after the lock shows.
	sqldb := sql.OpenDB(pgconn.Wrap(pgdriver.NewConnector(pgdriver.WithDSN(dsn),
		pgdriver.WithDialTimeout(5*time.Second), pgdriver.WithWriteTimeout(5*time.Second),
		pgdriver.WithReadTimeout(stmt+5*time.Second),
		// The prepared statements (see statement) run their generic plan from the first call:
		// the list statements' generic plans are as good as their custom ones, but under
		// the default "auto" PostgreSQL never picks them (with the LIMIT unknown their
		// estimate never beats a custom plan's) and plans those statements on every call.
		// Statements sent over the simple protocol are planned per call whatever this says.
		pgdriver.WithConnParams(map[string]any{
			"statement_timeout":                strconv.FormatInt(stmt.Milliseconds(), 10),
			"lock_timeout":                     strconv.FormatInt(lock.Milliseconds(), 10),
			"plan_cache_mode":                  "force_generic_plan",
			"client_connection_check_interval": "1000",
			"default_transaction_isolation":    "read committed",
		}),
		pgdriver.WithApplicationName("subscriberd"),
		// The driver's own tracing adds old-convention attributes (db.name, db.user, and
		// server.address with the port) to our span of every query, growing it; the query
		// hook sets the stable ones itself.
		pgdriver.WithTracing(false))))
	sqldb.SetMaxOpenConns(n)
	sqldb.SetMaxIdleConns(n)
	sqldb.SetConnMaxLifetime(30 * time.Minute)
	sqldb.SetConnMaxIdleTime(5 * time.Minute)
	hook := newQueryHook(dsn, "postgresql")
	bdb := bun.NewDB(sqldb, pgdialect.New()).WithQueryHook(hook)
	return &DB{DB: bdb, eng: &pgEngine{db: bdb, hook: hook}, hook: hook}, nil
}

// pgEngine is the engine of a PostgreSQL pool. It holds the pool, its query hook (so that
// prepared statements make the spans bun's statements make) and the statements prepared on it
// so far (see statement). database/sql's Stmt prepares a statement on one connection and, by
// itself, again on each other connection that runs it.
type pgEngine struct {
	db    *bun.DB
	hook  *queryHook
	stmts sync.Map // *statement → *sql.Stmt
}

// prepared returns st prepared on the pool, preparing it on first use. A failed prepare (the
// database down, say) is not kept: the next call prepares again.
func (e *pgEngine) prepared(ctx context.Context, st *statement) (*sql.Stmt, error) {
	if s, ok := e.stmts.Load(st); ok {
		return s.(*sql.Stmt), nil
	}
	s, err := e.db.DB.PrepareContext(ctx, st.text)
	if err != nil {
		return nil, err
	}
	if kept, raced := e.stmts.LoadOrStore(st, s); raced {
		s.Close() //nolint:errcheck // another call prepared it first; this one was never used
		return kept.(*sql.Stmt), nil
	}
	return s, nil
}

// queryRow runs st with args on db (the pool, or one of its transactions) and scans its one
// row with bun into dest, a pointer to a struct with bun tags or to one value; no row gives
// sql.ErrNoRows. Errors are the driver's, for the caller to translate.
func (e *pgEngine) queryRow(ctx context.Context, db bun.IDB, st *statement, dest any, args ...any) error {
	return e.runPrepared(ctx, db, st, args, func(ctx context.Context, rows *sql.Rows) error {
		if !rows.Next() {
			if err := rows.Err(); err != nil {
				return err
			}
			return sql.ErrNoRows
		}
		if err := e.db.ScanRow(ctx, rows, dest); err != nil {
			return err
		}
		return rows.Close()
	})
}

// queryRows is queryRow for every row st returns, scanned with bun into dest, a pointer to a
// slice; no row leaves it empty.
func (e *pgEngine) queryRows(ctx context.Context, db bun.IDB, st *statement, dest any, args ...any) error {
	return e.runPrepared(ctx, db, st, args, func(ctx context.Context, rows *sql.Rows) error {
		return e.db.ScanRows(ctx, rows, dest)
	})
}

// runPrepared runs st with args on db and scan on its rows, in the span bun's query hook would
// make for it, and under ctx like every other statement: when ctx ends, the statement stops and
// its connection is dropped (package pgconn).
func (e *pgEngine) runPrepared(ctx context.Context, db bun.IDB, st *statement, args []any,
	scan func(context.Context, *sql.Rows) error) (err error) {
	if e.hook != nil && traced(ctx) {
		var span trace.Span
		ctx, span = e.hook.startSpan(ctx, st.op, st.table, st.spanText)
		defer func() { endSpan(span, err) }()
	}
	var stmt *sql.Stmt
	if tx, ok := db.(bun.Tx); !ok {
		if stmt, err = e.prepared(ctx, st); err != nil {
			return err
		}
	} else if s, ok := e.stmts.Load(st); ok {
		// The transaction's connection's own copy (prepared there if it is not yet), closed
		// with the transaction.
		stmt = tx.Tx.StmtContext(ctx, s.(*sql.Stmt))
	} else {
		// Never prepared on the pool yet: preparing it there would take a second connection
		// while the transaction holds one, and a pool whose every connection is such a
		// transaction would wait on itself. Prepared on the transaction's connection for this
		// call only.
		if stmt, err = tx.Tx.PrepareContext(ctx, st.text); err != nil {
			return err
		}
		defer stmt.Close()
	}
	rows, err := stmt.QueryContext(ctx, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	return scan(ctx, rows)
}

func (*pgEngine) migrations() (*migrate.Migrations, error) { return migrations.Postgres() }

func (*pgEngine) migrationsTableExists() string {
	return "SELECT to_regclass('bun_migrations') IS NOT NULL"
}

func (e *pgEngine) listPage(ctx context.Context, db bun.IDB, dest any, nl uuid.UUID, q model.ListQuery) error {
	if !q.Filter.IsZero() {
		return listFilteredPostgres(ctx, db, dest, nl, q)
	}
	if q.After == nil && q.Offset() > listDirectMaxOffset {
		// Not prepared: see listDeepPostgres.
		return db.NewRaw(listDeepPostgres(q.Status), nl, string(q.Status), q.Limit+1, q.Offset()).Scan(ctx, dest)
	}
	st, args := listPostgres(nl, q)
	return e.queryRows(ctx, db, st, dest, args...)
}

// insertEvents is one statement: the events' insert feeds the deliveries' (queueDeliveriesSQL,
// in lane). Whether it queued any is not asked: the workers poll.
func (*pgEngine) insertEvents(ctx context.Context, db bun.IDB, rows []eventRow, lane outbox.Lane) (bool, error) {
	ins := db.NewInsert().Model(&rows).Returning("id, newsletter_id, type, created_at")
	_, err := db.NewRaw("WITH ev AS (?) "+queueDeliveriesIn(lane)+eventMatchPG, ins).Exec(ctx)
	return false, err
}

// claimEmails chooses and leases the due emails of lane in one statement; rows another claim
// holds are skipped, not waited for (FOR UPDATE SKIP LOCKED).
func (*pgEngine) claimEmails(ctx context.Context, db bun.IDB, now time.Time, lane outbox.Lane, limit int, lease time.Duration) ([]claimedRow, error) {
	due := dueInteractivePG
	if lane == outbox.Bulk {
		due = dueBulkPG
	}
	var rows []claimedRow
	err := db.NewRaw(`
WITH RECURSIVE `+due+`, claimed AS (
    UPDATE email_outbox AS o SET next_attempt_at = ?2, stale_at = ?3, updated_at = ?0
    FROM due WHERE o.id = due.id
    RETURNING o.id, o.newsletter_id, o.subscriber_id, o.kind, o.attempts, o.unanswered, o.traceparent, o.created_at
)
SELECT c.*, s.email, s.first_name, s.last_name, n.name AS newsletter_name
FROM claimed AS c
JOIN subscribers AS s ON s.id = c.subscriber_id
JOIN newsletters AS n ON n.id = c.newsletter_id
ORDER BY c.created_at, c.id`, now, limit, now.Add(lease), now.Add(outbox.StaleAfter(lease))).Scan(ctx, &rows)
	if errors.Is(err, sql.ErrNoRows) {
		err = nil
	}
	return rows, err
}

// dueInteractivePG is the CTE "due" of the interactive lane's claim (?0 now, ?1 limit): its
// oldest due emails (email_outbox_interactive_due_idx).
const dueInteractivePG = `due AS (
    SELECT id FROM email_outbox
    WHERE state = 'pending' AND lane = 0 AND next_attempt_at <= ?0
    ORDER BY next_attempt_at
    LIMIT ?1
    FOR UPDATE SKIP LOCKED
)`

// dueBulkPG is the CTE "due" of the bulk lane's claim (?0 now, ?1 limit), where the newsletters
// take turns: nl walks the newsletters with pending bulk emails, one probe of
// email_outbox_bulk_due_idx each; each gives up to ?1 of its oldest due emails, locked
// (rows another claim holds are skipped, and the ones not taken are free again when the
// statement ends); then the first of each newsletter go first, then the second, and so on.
const dueBulkPG = `nl (id) AS (
    (SELECT newsletter_id FROM email_outbox WHERE state = 'pending' AND lane = 1 ORDER BY newsletter_id LIMIT 1)
    UNION ALL
    SELECT (SELECT o.newsletter_id FROM email_outbox AS o
            WHERE o.state = 'pending' AND o.lane = 1 AND o.newsletter_id > nl.id
            ORDER BY o.newsletter_id LIMIT 1)
    FROM nl WHERE nl.id IS NOT NULL
), turns AS (
    SELECT c.id, c.next_attempt_at, row_number() OVER (PARTITION BY nl.id ORDER BY c.next_attempt_at) AS turn
    FROM nl CROSS JOIN LATERAL (
        SELECT o.id, o.next_attempt_at FROM email_outbox AS o
        WHERE o.state = 'pending' AND o.lane = 1 AND o.newsletter_id = nl.id AND o.next_attempt_at <= ?0
        ORDER BY o.next_attempt_at
        LIMIT ?1
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE nl.id IS NOT NULL
), due AS (
    SELECT id FROM turns ORDER BY turn, next_attempt_at LIMIT ?1
)`

// claimDeliveries leases endpoints, and reads their due deliveries (interactive ones first), in
// one statement. Endpoints
// other claims hold are skipped (FOR NO KEY UPDATE SKIP LOCKED: not FOR UPDATE, which the
// key-share lock of every write queueing a delivery for the endpoint would make skip it
// whenever writes are busy). Two instances claiming at the same moment each count the other's
// leases only once committed, so a newsletter may briefly hold one endpoint more per instance
// than perNewsletter.
func (*pgEngine) claimDeliveries(ctx context.Context, db bun.IDB, now time.Time, c deliveryClaim) ([]claimRow, error) {
	var rows []claimRow
	err := db.NewRaw(`
WITH ep AS (`+claimableEndpoints+`
), claimed AS (
    UPDATE webhook_endpoints AS w SET busy_until = ?3, last_claimed_at = ?0, stale_at = ?6
    FROM ep WHERE w.id = ep.id
    RETURNING w.id, w.url, w.secret, w.last_claimed_at
)
SELECT c.id AS endpoint_id, c.url, c.secret, d.event_id, d.attempts, d.lane, e.type, e.payload, e.traceparent
FROM claimed AS c
CROSS JOIN LATERAL (
    SELECT event_id, attempts, lane, next_attempt_at FROM webhook_deliveries
    WHERE endpoint_id = c.id AND state = 'pending' AND next_attempt_at <= ?0
    ORDER BY lane, next_attempt_at
    LIMIT ?2
) AS d
JOIN subscriber_events AS e ON e.id = d.event_id
ORDER BY c.id, d.lane, d.next_attempt_at`, c.args(now)...).Scan(ctx, &rows)
	if errors.Is(err, sql.ErrNoRows) {
		err = nil
	}
	return rows, err
}

// raw runs query as it is written, row locks and all.
func (*pgEngine) raw(db bun.IDB, query string, args ...any) *bun.RawQuery {
	return db.NewRaw(query, args...)
}

// deleteResponsesContaining looks for each needle with position(), bytea's substring search.
func (*pgEngine) deleteResponsesContaining(ctx context.Context, db bun.IDB, nl uuid.UUID, needles [][]byte) error {
	q := db.NewDelete().TableExpr("idempotency_keys").Where("newsletter_id = ?", nl)
	q = q.WhereGroup(" AND ", func(q *bun.DeleteQuery) *bun.DeleteQuery {
		for _, n := range needles {
			q = q.WhereOr("position(? IN body) > 0", n)
		}
		return q
	})
	_, err := q.Exec(ctx)
	return err
}

// dropEmptyTagCountsPG deletes exactly the counter rows it locked of each tag whose locked
// rows sum to 0: deleting rows that sum to 0 changes no tag's total, whatever else happens.
//
// Why the locked rows are exactly right under READ COMMITTED: the CTE locks each of the tags'
// slot rows the statement's snapshot shows and no other transaction holds, with its newest
// committed version (EvalPlanQual: a row updated after the snapshot by a transaction that has
// committed is locked and returned as it is now; one deleted meanwhile, by another erasure or
// sweep doing the same, is not returned); nobody can change the locked values until this
// transaction ends, so their sum stays theirs. A row a writer still in flight holds is skipped
// (SKIP LOCKED): not summed, not deleted, so its delta survives whatever that writer does. A
// row inserted after the snapshot (a new slot of the same tag) is not seen either. The
// DELETE's own scan sees a row's snapshot version; when that was updated meanwhile,
// EvalPlanQual moves it to the newest version, the one this statement locked, so the row
// deleted is the row summed. A writer that then upserts into a deleted row (the triggers'
// INSERT … ON CONFLICT DO UPDATE) waits for this transaction, finds the row gone and inserts
// its delta as a new row. Skipping instead of waiting means the statement never waits, so it
// can never deadlock with the tag's writers, with another erasure holding its own slot's
// rows, or with the sweep; the price is that a tag written concurrently may keep rows summing
// to 0 when this transaction ends, which the sweep (Privacy.SweepTagCounts) deletes later.
const dropEmptyTagCountsPG = `WITH locked AS MATERIALIZED (
    SELECT tag, slot, n FROM subscriber_tag_counts
    WHERE newsletter_id = ? AND tag = ANY(?::text[])
    ORDER BY tag, slot
    FOR UPDATE SKIP LOCKED
), empty AS (
    SELECT tag FROM locked GROUP BY tag HAVING sum(n) = 0
)
DELETE FROM subscriber_tag_counts AS c
USING locked AS l
WHERE c.newsletter_id = ? AND c.tag = l.tag AND c.slot = l.slot AND l.tag IN (SELECT tag FROM empty)`

func (*pgEngine) dropEmptyTagCounts(ctx context.Context, db bun.IDB, nl uuid.UUID, tags []string) error {
	if len(tags) == 0 {
		return nil
	}
	_, err := db.NewRaw(dropEmptyTagCountsPG, nl, pgdialect.Array(tags), nl).Exec(ctx)
	return err
}

// lockEmailKeys takes, until the transaction ends, the advisory locks of the newsletter's keys
// by bucket (the SQL function lock_email_keys, see its migration: at most 64 a transaction,
// whatever the number of keys), in one statement. The one-statement create takes the same
// locks (suppression_after_lock). A set-based writer whose keys sit in a table calls the SQL
// function itself with the keys "<newsletter id>/<key>".
func (*pgEngine) lockEmailKeys(ctx context.Context, tx bun.IDB, nl uuid.UUID, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	full := make([]string, len(keys))
	for i, k := range keys {
		full[i] = nl.String() + "/" + k
	}
	_, err := tx.NewRaw(`SELECT lock_email_keys(?::uuid, ?::text[])`, nl, pgdialect.Array(full)).Exec(ctx)
	return err
}

// lockIdempotencyKey takes the transaction-scoped advisory lock of the key, which a crash or a
// dropped connection releases at once: no marker is ever left behind. A request that finished
// between the caller's Lookup and this lock is caught by the record's insert (Idempotency.Run).
func (e *pgEngine) lockIdempotencyKey(ctx context.Context, tx bun.IDB, nl uuid.UUID, key string) error {
	var locked bool
	if err := e.queryRow(ctx, tx, tryLockPG, &locked, advisoryKey(nl, key)); err != nil {
		return err
	}
	if !locked {
		return fmt.Errorf("%w", model.ErrIdempotencyInUse)
	}
	return nil
}

// tryLockPG takes the transaction-scoped advisory lock of a key if it is free, prepared.
var tryLockPG = newStatement("SELECT", "", `SELECT pg_try_advisory_xact_lock($1)`)

// advisoryKey is the 64-bit advisory lock id of (nl, key). Two keys sharing one (a chance of
// 2⁻⁶⁴) only make one of them wait or answer 409 once.
func advisoryKey(nl uuid.UUID, key string) int64 {
	h := sha256.New()
	h.Write(nl[:])
	h.Write([]byte(key))
	return int64(binary.BigEndian.Uint64(h.Sum(nil)[:8])) //nolint:gosec // a hash, any bits will do
}

// listen is nil: on PostgreSQL the workers poll, since writers may be other instances.
func (*pgEngine) listen(context.Context, string) <-chan struct{} { return nil }
func (*pgEngine) wake(string)                                    {}

// queueDeliveriesSQL queues one delivery per event of ev (a set of id, newsletter_id, type and
// created_at) and enabled endpoint of its newsletter subscribed to its type (an endpoint's
// events column is a JSON array of type names).
const queueDeliveriesSQL = queueDeliveriesFrom + eventMatchPG

// eventMatchPG completes queueDeliveriesFrom on PostgreSQL: the endpoint's events name the
// event's type.
const eventMatchPG = `strpos(w.events, '"' || ev.type || '"') > 0`

// create writes c, its created event, the event's deliveries and, when c has one, its
// confirmation email, in one statement (createStmt), after the suppression check of
// docs/api-contract.md §13 under the address's lock (suppression_after_lock, see its
// migration). The data-modifying parts of a statement take effect together or not at all, and
// the lock holds until the statement's transaction commits (the statement's own, in
// autocommit): a create is one round trip instead of a transaction's six. Whether it queued a
// delivery is not asked: the workers poll.
func (e *pgEngine) create(ctx context.Context, db bun.IDB, c creation) (bool, error) {
	var out struct {
		Reason  *string `bun:"reason"`
		Created int     `bun:"created"`
	}
	ev := c.Event
	err := runAtomic(ctx, db, func(ctx context.Context) error {
		return e.queryRow(ctx, db, createStmt, &out,
			c.ID, c.NewsletterID, c.Email, c.EmailKey, c.FirstName, c.LastName, c.Status, c.CreatedAt, c.UpdatedAt,
			ev.ID, ev.Type, ev.Payload, ev.Traceparent, ev.CreatedAt,
			c.NewsletterID.String()+"/"+c.LockKey, c.EmailHash,
			c.MailID, c.MailTraceparent, c.LegacyHash, c.Attributes, pgTextArray(c.Tags))
	})
	switch {
	case err != nil:
		return false, err
	case out.Reason != nil:
		return false, model.Suppressed(model.SuppressionReason(*out.Reason))
	case out.Created == 0:
		return false, fmt.Errorf("%w", model.ErrEmailTaken)
	}
	return false, nil
}

// createStmt is pgEngine.create's statement, prepared (see statement): $1 to $9 the subscriber's
// columns; $10 to $14 the event's id, type, payload, traceparent and time (its newsletter is
// the subscriber's); $15 and $16 the address's lock key and hash, $19 its 1.2 key's hash
// (model.EmailHashes; $16 again when the same); $17 and $18 the confirmation email's id
// (NULL: none) and traceparent; $20 and $21 the attributes and tags. It returns the reason
// the address is suppressed for (then nothing was stored) and how many subscribers it stored (0: the address is taken). Its
// span is named for its main change, "INSERT subscribers". The values are cast: in an
// INSERT … SELECT a parameter takes no type from the target column.
var createStmt = newStatement("INSERT", "subscribers", `WITH chk AS (
    SELECT suppression_after_lock($15::text, $2::uuid, $16::bytea, $19::bytea) AS reason),
s AS (
    INSERT INTO subscribers (id, newsletter_id, email, email_key, first_name, last_name, status, created_at, updated_at,
        attributes, tags)
    SELECT $1::uuid, $2::uuid, $3::text, $4::text, $5::text, $6::text, $7::text, $8::timestamptz, $9::timestamptz,
        $20::jsonb, $21::text[]
    WHERE (SELECT reason FROM chk) IS NULL
    ON CONFLICT (newsletter_id, email_key) DO NOTHING RETURNING id),
ev AS (
    INSERT INTO subscriber_events (id, newsletter_id, subscriber_id, type, payload, traceparent, created_at)
    SELECT $10::uuid, $2::uuid, s.id, $11::text, $12::text, $13::text, $14::timestamptz FROM s
    RETURNING id, newsletter_id, type, created_at),
d AS (`+queueDeliveriesSQL+`),
m AS (
    INSERT INTO email_outbox (id, newsletter_id, subscriber_id, kind, state, attempts, next_attempt_at, last_error,
        traceparent, created_at, updated_at)
    SELECT $17::uuid, $2::uuid, s.id, '`+model.EmailKindConfirmation+`', 'pending', 0, $9::timestamptz, '',
        $18::text, $9::timestamptz, $9::timestamptz
    FROM s WHERE $17::uuid IS NOT NULL)
SELECT (SELECT reason FROM chk) AS reason, (SELECT count(*) FROM s) AS created`)

// listDirectMaxOffset is the largest offset at which a page is read straight from the list
// index. Beyond it, the page's ids come from an index-only walk and only those rows are read,
// which is cheaper to execute but costlier to plan: on the bench's data the two cost the same
// a little beyond this offset.
const listDirectMaxOffset = 2000

// listPostgres is the statement of a list page that is not deep (see listDeepPostgres),
// prepared (see statement), and its arguments: the counter sum as one row whose id is NULL (it
// sorts first), and the page, in one statement and so in one snapshot. A UNION ALL plans in
// about half the time a join of the two did. Separate statements with and without the status
// filter save the planner an "IS NULL OR". Each statement has its own
// arguments, since every parameter must appear in its text. Their spans are named "SELECT", as
// bun named the raw statements.
func listPostgres(nl uuid.UUID, q model.ListQuery) (*statement, []any) {
	limit := q.Limit + 1
	switch {
	case q.After != nil && q.Status == "":
		return listAfterPostgres, []any{nl, limit, q.After.CreatedAt.UTC(), q.After.ID}
	case q.After != nil:
		return listAfterStatusPostgres, []any{nl, string(q.Status), limit, q.After.CreatedAt.UTC(), q.After.ID}
	case q.Status == "":
		return listFirstPostgres, []any{nl, limit, q.Offset()}
	}
	return listFirstStatusPostgres, []any{nl, string(q.Status), limit, q.Offset()}
}

// The prepared list statements. $1 is the newsletter id and, where filtered, $2 the status;
// then the limit, and the offset or the created_at and id of the position a keyset page starts
// after. A keyset page reads the list index from that position on, like a first page.
const (
	listTotalPostgres = `SELECT coalesce(sum(n), 0)::bigint AS total, NULL::uuid AS id, NULL AS email,
    NULL AS first_name, NULL AS last_name, NULL AS status, NULL::timestamptz AS created_at,
    NULL::jsonb AS attributes, NULL::text[] AS tags
FROM subscriber_counts WHERE newsletter_id = $1`
	listOrderPostgres = `
ORDER BY created_at DESC, id DESC`
)

var (
	listFirstPostgres = listStatement(listTotalPostgres + `
UNION ALL (
    SELECT NULL, id, email, first_name, last_name, status, created_at, attributes, tags FROM subscribers
    WHERE newsletter_id = $1
    ORDER BY created_at DESC, id DESC LIMIT $2 OFFSET $3
)` + listOrderPostgres)

	listFirstStatusPostgres = listStatement(listTotalPostgres + ` AND status = $2
UNION ALL (
    SELECT NULL, id, email, first_name, last_name, status, created_at, attributes, tags FROM subscribers
    WHERE newsletter_id = $1 AND status = $2
    ORDER BY created_at DESC, id DESC LIMIT $3 OFFSET $4
)` + listOrderPostgres)

	listAfterPostgres = listStatement(listTotalPostgres + `
UNION ALL (
    SELECT NULL, id, email, first_name, last_name, status, created_at, attributes, tags FROM subscribers
    WHERE newsletter_id = $1 AND (created_at, id) < ($3, $4)
    ORDER BY created_at DESC, id DESC LIMIT $2
)` + listOrderPostgres)

	listAfterStatusPostgres = listStatement(listTotalPostgres + ` AND status = $2
UNION ALL (
    SELECT NULL, id, email, first_name, last_name, status, created_at, attributes, tags FROM subscribers
    WHERE newsletter_id = $1 AND status = $2 AND (created_at, id) < ($4, $5)
    ORDER BY created_at DESC, id DESC LIMIT $3
)` + listOrderPostgres)
)

func listStatement(text string) *statement { return newStatement("SELECT", "", text) }

// listDeepPostgres is the statement of a page beyond listDirectMaxOffset, with or without the
// status filter: the page's ids come from an index-only walk and only those rows are read. Its
// arguments: ?0 newsletter id, ?1 status (only where filtered), ?2 limit, ?3 offset.
//
// It is not prepared, but sent through bun with its values inlined and planned on every call:
// its generic plan (which a prepared one would run, see statement) reads the page's rows by
// a sequential scan of every newsletter's subscribers and a hash join, 17-23 ms instead of
// the custom plan's nested loop over the page's 26 ids (100k subscribers, offsets 50,000 to
// 95,000).
func listDeepPostgres(status model.Status) string {
	if status == "" {
		return listDeepAllPostgres
	}
	return listDeepStatusPostgres
}

const (
	listDeepTotalPostgres = `SELECT coalesce(sum(n), 0)::bigint AS total, NULL::uuid AS id, NULL AS email,
    NULL AS first_name, NULL AS last_name, NULL AS status, NULL::timestamptz AS created_at,
    NULL::jsonb AS attributes, NULL::text[] AS tags
FROM subscriber_counts WHERE newsletter_id = ?0`

	listDeepAllPostgres = listDeepTotalPostgres + `
UNION ALL
SELECT NULL, s.id, s.email, s.first_name, s.last_name, s.status, s.created_at, s.attributes, s.tags FROM (
    SELECT id FROM subscribers
    WHERE newsletter_id = ?0
    ORDER BY created_at DESC, id DESC LIMIT ?2 OFFSET ?3
) AS p JOIN subscribers AS s USING (id)` + listOrderPostgres

	listDeepStatusPostgres = listDeepTotalPostgres + ` AND status = ?1
UNION ALL
SELECT NULL, s.id, s.email, s.first_name, s.last_name, s.status, s.created_at, s.attributes, s.tags FROM (
    SELECT id FROM subscribers
    WHERE newsletter_id = ?0 AND status = ?1
    ORDER BY created_at DESC, id DESC LIMIT ?2 OFFSET ?3
) AS p JOIN subscribers AS s USING (id)` + listOrderPostgres
)

// rename writes the new name with its event and the event's deliveries in one statement
// (renameWithEventStmt) that matches only while the row still holds every value r read. It
// needs no lock and no transaction of its own. Whether it queued a delivery is not asked: the
// workers poll.
func (e *pgEngine) rename(ctx context.Context, db bun.IDB, r renaming) (bool, bool, error) {
	var n int
	ev := r.Event
	err := runAtomic(ctx, db, func(ctx context.Context) error {
		return e.queryRow(ctx, db, renameWithEventStmt, &n,
			r.NewsletterID, r.ID, r.Email, r.FirstName, r.LastName, r.Status, r.UpdatedAt,
			r.NewFirstName, r.NewLastName, r.NewUpdatedAt, ev.ID, ev.Type, ev.Payload, ev.Traceparent)
	})
	return n == 1, false, err
}

// renameWithEventStmt is pgEngine.rename's write, prepared (see statement): $1 and $2 the subscriber,
// $3 to $7 the email, names, status and update time read, $8 to $10 the new names and update
// time, then the event's id, type, payload and traceparent. It returns 1 when the row still
// held what was read and was changed, with its event and deliveries, else 0 and changes
// nothing. Its span is named for its main change, "UPDATE subscribers".
var renameWithEventStmt = newStatement("UPDATE", "subscribers", `WITH s AS (
    UPDATE subscribers SET first_name = $8, last_name = $9, updated_at = $10
    WHERE newsletter_id = $1 AND id = $2 AND email = $3 AND first_name = $4 AND last_name = $5
        AND status = $6 AND updated_at = $7
    RETURNING id, newsletter_id),
ev AS (
    INSERT INTO subscriber_events (id, newsletter_id, subscriber_id, type, payload, traceparent, created_at)
    SELECT $11::uuid, s.newsletter_id, s.id, $12::text, $13::text, $14::text, $10::timestamptz FROM s
    RETURNING id, newsletter_id, type, created_at),
d AS (`+queueDeliveriesSQL+`)
SELECT count(*) FROM s`)

// changeTags locks the subscriber, changes its tags when the change gives another set within
// model.MaxTags, and records the event with its deliveries, in one statement (changeTagsStmt):
// one round trip instead of a transaction's five (BEGIN, the lock, the update, the event with
// its deliveries, COMMIT). The event's id is made in the statement, after the lock
// (eventIDsPG): one made before would sort before the event of a writer that held the lock
// first. Whether it queued a delivery is not asked: the workers poll.
func (e *pgEngine) changeTags(ctx context.Context, db bun.IDB, t retagging) (model.Subscriber, bool, error) {
	var out struct {
		Size int `bun:"size"`
		subscriberValues
	}
	err := runAtomic(ctx, db, func(ctx context.Context) error {
		return e.queryRow(ctx, db, changeTagsStmt, &out, t.NewsletterID, t.ID, pgTextArray(t.Change.Add),
			pgTextArray(t.Change.Remove), t.Now, model.FormatTime(t.Now), string(model.EventUpdated),
			t.Traceparent, t.SourceJSON)
	})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return model.Subscriber{}, false, fmt.Errorf("%w", model.ErrNotFound)
	case err != nil:
		return model.Subscriber{}, false, err
	}
	if verr := model.CheckTagCount(out.Size); verr != nil {
		return model.Subscriber{}, false, verr
	}
	return out.model(), false, nil
}

// changeTagsStmt is pgEngine.changeTags' statement, prepared (see statement): $1 and $2 the
// subscriber, $3 the tags to add and $4 those to remove, $5 the time and $6 the same in the
// contract's form, $7 the event's type (subscriber.updated), $8 its traceparent, $9 its source
// object. Its parts:
//   - o: the subscriber, locked (under READ COMMITTED its newest committed row, waited for: a
//     concurrent change of other tags is kept), with its new set: its tags without those
//     removed, with those added, sorted by code point (COLLATE "C": Go's order of strings),
//     each once, as model.TagsChange.Apply computes it;
//   - u: the change, when the set is another and within model.MaxTags;
//   - v, ev, d: its event (eventsPG, previous {"tags": the set before}) and the event's
//     deliveries in the interactive lane.
//
// It returns no row when the newsletter has no such subscriber, else the new set's size (past
// model.MaxTags: refused, nothing written) and the subscriber after, its tags as a JSON array.
// Its span is named for its main change, "UPDATE subscribers". The tag counters follow by
// their triggers.
var changeTagsStmt = newStatement("UPDATE", "subscribers", `WITH o AS (
    SELECT s.id, s.newsletter_id, s.email, s.first_name, s.last_name, s.status, s.created_at, s.updated_at,
        s.attributes, s.tags,
        ARRAY(SELECT n.tag COLLATE "C" FROM (
            SELECT k.tag FROM unnest(s.tags) AS k (tag) WHERE k.tag <> ALL ($4::text[])
            UNION SELECT a.tag FROM unnest($3::text[]) AS a (tag)) AS n
            ORDER BY 1) AS new_tags
    FROM subscribers AS s
    WHERE s.newsletter_id = $1 AND s.id = $2
    FOR UPDATE),
u AS (
    UPDATE subscribers AS s SET tags = o.new_tags, updated_at = $5
    FROM o WHERE s.id = o.id AND o.new_tags <> o.tags AND cardinality(o.new_tags) <= `+strconv.Itoa(model.MaxTags)+`
    RETURNING s.id, s.newsletter_id, s.email, s.first_name, s.last_name, s.status, s.created_at, s.updated_at,
        s.attributes, s.tags, `+tagsPreviousPG+` AS previous),
`+eventIDsPG+`,
`+eventsPG("$7::text", "$5::timestamptz", "$6::text", "$8::text", "$9::text")+`,
d AS (`+queueDeliveriesSQL+`)
SELECT cardinality(o.new_tags) AS size, o.id, o.newsletter_id, o.email, o.first_name, o.last_name, o.status,
    o.created_at, coalesce(u.updated_at, o.updated_at) AS updated_at, o.attributes::text AS attributes,
    array_to_json(coalesce(u.tags, o.tags))::text AS tags
FROM o LEFT JOIN u ON u.id = o.id`)

// stageImport stages an import in one transaction on a connection of its own, the rows by COPY
// (Imports.Stage).
func (*pgEngine) stageImport(ctx context.Context, db *bun.DB, st staging) (err error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return translate(err)
	}
	defer func() {
		if err != nil {
			// A COPY cut short leaves the connection in the middle of the protocol: it is
			// closed rather than returned to the pool, and the server rolls back.
			conn.Raw(func(any) error { return driver.ErrBadConn }) //nolint:errcheck // closing it is the point
		}
		conn.Close()
	}()
	if _, err := conn.ExecContext(ctx, "BEGIN"); err != nil {
		return translate(err)
	}
	if err := st.insert(ctx, conn, false); err != nil {
		return err
	}
	// The COPY lasts as long as the upload arrives, which may take minutes (docs/api-contract.md
	// §15.1): the statement timeout, meant for the server's own work, would cut an upload
	// from a slow client (or on a busy machine) after 25 s. The COPY is bounded by the
	// request instead: when its context ends the connection is dropped and the server rolls
	// back. The statements after it have the timeout again.
	if _, err := conn.ExecContext(ctx, "SET LOCAL statement_timeout = 0"); err != nil {
		return translate(err)
	}
	cr := &copyReader{next: st.next, id: st.id.String()}
	res, err := pgconn.CopyFrom(ctx, conn, cr, "COPY import_rows (import_id, row_no, email, email_key, email_hash, "+
		"legacy_hash, first_name, last_name, status, errors, extra) FROM STDIN") // pgdriver.CopyFrom on the wrapped connection
	if cr.err != nil && !errors.Is(cr.err, io.EOF) {
		return cr.err // the upload's own error, whatever the driver made of it
	}
	if err != nil {
		return translate(err)
	}
	n, _ := res.RowsAffected()
	if _, err := conn.ExecContext(ctx, "SET LOCAL statement_timeout TO DEFAULT"); err != nil {
		return translate(err)
	}
	if err := st.finish(ctx, conn, n); err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return translate(err)
	}
	// The batches read and delete the staged rows by (import_id, row_no). Until the table is
	// analyzed, PostgreSQL knows neither how many rows it holds nor for which import, and
	// planned both on a freshly staged million rows as a scan and sort of the whole import:
	// 21 ms and 10 ms a batch instead of 1 ms. A failure here costs only that: the import
	// is stored, and autovacuum analyzes the table in its own time.
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn.ExecContext(actx, "ANALYZE import_rows") //nolint:errcheck // see above
	return nil
}

// copyReader is the text of a COPY of the rows next yields: "import_id TAB row_no TAB email
// TAB email_key TAB email_hash TAB legacy_hash TAB first_name TAB last_name TAB status TAB
// errors" lines, escaped as COPY's text format wants, \N for NULL. It fills each read as far
// as it can, so that one COPY message carries many rows.
type copyReader struct {
	next func() (stagedRow, error)
	id   string
	buf  []byte
	err  error
}

func (r *copyReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if len(r.buf) == 0 {
			if r.err != nil {
				break
			}
			row, err := r.next()
			if err != nil {
				r.err = err
				break
			}
			r.buf = appendCopyLine(r.buf[:0], r.id, &row)
		}
		c := copy(p[n:], r.buf)
		r.buf = r.buf[c:]
		n += c
	}
	if n == 0 && r.err != nil {
		return 0, r.err
	}
	return n, nil
}

func appendCopyLine(b []byte, id string, row *stagedRow) []byte {
	b = append(b, id...)
	b = append(b, '\t')
	b = strconv.AppendInt(b, row.RowNo, 10)
	if row.Errors != "" {
		b = append(b, "\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t"...)
		b = appendCopyText(b, row.Errors)
		return append(b, "\t\\N\n"...)
	}
	for _, f := range []string{row.Email, row.EmailKey} {
		b = append(b, '\t')
		b = appendCopyText(b, f)
	}
	for _, h := range [][]byte{row.EmailHash, row.LegacyHash} {
		if h == nil {
			b = append(b, "\t\\N"...)
			continue
		}
		b = append(b, "\t\\\\x"...) // bytea's hex form, its backslash escaped
		b = hex.AppendEncode(b, h)
	}
	for _, f := range []string{row.FirstName, row.LastName, row.Status} {
		b = append(b, '\t')
		b = appendCopyText(b, f)
	}
	b = append(b, "\t\\N\t"...) // errors
	if row.Extra == "" {
		return append(b, "\\N\n"...)
	}
	b = appendCopyText(b, row.Extra)
	return append(b, '\n')
}

// appendCopyText appends s escaped for COPY's text format.
func appendCopyText(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			b = append(b, '\\', '\\')
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, c)
		}
	}
	return b
}

// importBatch is one statement (importBatchStmt) over the batch's staged rows. Whether it
// queued deliveries is not asked: the workers poll.
func (e *pgEngine) importBatch(ctx context.Context, tx bun.IDB, b importBatch) (batchCounts, bool, error) {
	var c batchCounts
	err := e.queryRow(ctx, tx, importBatchStmt, &c, b.Import, b.Newsletter, b.After, b.Last, b.Now,
		model.FormatTime(b.Now), string(model.EventCreated), b.Traceparent, b.SourceJSON)
	return c, false, err
}

// jsonStringPG is the SQL expression of the JSON string of the text expression x, written as
// Go's encoding/json writes it (model.NewEvent): PostgreSQL's to_json escapes quotes,
// backslashes and control characters as Go does, and Go also escapes <, >, & and the line and
// paragraph separators.
func jsonStringPG(x string) string {
	return `replace(replace(replace(replace(replace(to_json(` + x + `)::text, '<', '\u003c'), '>', '\u003e'), '&', '\u0026'), ` +
		`U&'\2028', '\u2028'), U&'\2029', '\u2029')`
}

// importBatchStmt is pgEngine.importBatch's statement, prepared (see statement): $1 the import,
// $2 its newsletter, $3 and $4 the batch's rows (row_no after $3, up to $4), $5 the time, $6
// the same in the contract's form, $7 the event type (subscriber.created), $8 the events'
// traceparent, $9 their source object. Its parts, in one snapshot:
//   - b: the batch's rows, each valid one checked against the suppression list by its hashes
//     (model.EmailHashes; the caller holds the addresses' locks, so a suppression committed
//     meanwhile is seen);
//   - e: the invalid rows' errors;
//   - s: the subscribers of the valid rows neither suppressed nor duplicates, unless the
//     newsletter has the address (ON CONFLICT … DO NOTHING: then existing), in key order as
//     every multi-row insert, ids made in SQL (uuid_v7);
//   - ev, d, m: their created events (the JSON model.NewEvent writes, pinned by a test), the
//     events' deliveries and the pending ones' confirmation emails, both in the bulk lane
//     (outbox.Bulk).
//
// It returns the counts. The subscriber counters follow by their trigger.
var importBatchStmt = newStatement("INSERT", "subscribers", `WITH b AS (
    SELECT r.row_no, r.email, r.email_key, r.first_name, r.last_name, r.status, r.errors, r.duplicate, r.extra,
        r.errors IS NULL AND EXISTS (
            SELECT 1 FROM suppressions AS x
            WHERE x.newsletter_id = $2::uuid AND x.email_hash IN (r.email_hash, r.legacy_hash)) AS suppressed
    FROM import_rows AS r
    WHERE r.import_id = $1::uuid AND r.row_no > $3::bigint AND r.row_no <= $4::bigint),
e AS (
    INSERT INTO import_errors (import_id, row_no, errors)
    SELECT $1::uuid, row_no, errors FROM b WHERE errors IS NOT NULL),
s AS (
    INSERT INTO subscribers (id, newsletter_id, email, email_key, first_name, last_name, status, created_at, updated_at,
        attributes, tags)
    SELECT uuid_v7(), $2::uuid, email, email_key, first_name, last_name, status, $5::timestamptz, $5::timestamptz,
        coalesce(extra::jsonb -> 'attributes', '{}'), coalesce(ARRAY(SELECT jsonb_array_elements_text(extra::jsonb -> 'tags')), '{}')
    FROM b WHERE errors IS NULL AND NOT suppressed AND NOT duplicate
    ORDER BY email_key COLLATE "C"
    ON CONFLICT (newsletter_id, email_key) DO NOTHING
    RETURNING id, newsletter_id, email, email_key, first_name, last_name, status),
n AS (
    SELECT uuid_v7() AS event_id, s.id, s.newsletter_id, s.email, s.first_name, s.last_name, s.status,
        coalesce(substr(b.extra, 2, length(b.extra) - 2), '"attributes":{},"tags":[]') AS extra
    FROM s JOIN b ON b.email_key = s.email_key AND b.errors IS NULL AND NOT b.duplicate),
ev AS (
    INSERT INTO subscriber_events (id, newsletter_id, subscriber_id, type, payload, traceparent, created_at)
    SELECT event_id, newsletter_id, id, $7::text,
        '{"id":"' || event_id || '","type":"' || $7::text || '","timestamp":"' || $6::text ||
        '","data":{"subscriber":{"id":"' || id || '","email":' || `+jsonStringPG("email")+` ||
        ',"name":' || `+jsonStringPG(`CASE WHEN last_name = '' THEN first_name ELSE first_name || ' ' || last_name END`)+` ||
        ',"status":"' || status || '","created_at":"' || $6::text || '",' || extra || '},"previous":{},"source":' || $9::text || '}}',
        $8::text, $5::timestamptz
    FROM n
    RETURNING id, newsletter_id, type, created_at),
d AS (`+queueDeliveriesIn(outbox.Bulk)+eventMatchPG+`),
m AS (
    INSERT INTO email_outbox (id, newsletter_id, subscriber_id, kind, lane, state, attempts, next_attempt_at,
        last_error, traceparent, created_at, updated_at)
    SELECT uuid_v7(), newsletter_id, id, '`+model.EmailKindConfirmation+`', `+strconv.Itoa(int(outbox.Bulk))+`, 'pending', 0,
        $5::timestamptz, '', $8::text, $5::timestamptz, $5::timestamptz
    FROM s WHERE status = '`+string(model.StatusPending)+`')
SELECT count(*) AS processed,
    count(*) FILTER (WHERE errors IS NOT NULL) AS invalid,
    count(*) FILTER (WHERE suppressed) AS suppressed,
    (SELECT count(*) FROM s) AS created,
    (SELECT count(*) FROM s WHERE status = '`+string(model.StatusPending)+`') AS pending
FROM b`)

// markDuplicates compares the keys bytewise (COLLATE "C": the same equality, and a sort several
// times faster than the database's collation's). The rows are found by their numbers, gathered
// first (ARRAY), so that no plan can join the whole file to itself: freshly staged rows have no
// statistics yet, and an estimate of one row made a nested loop of hours.
func (*pgEngine) markDuplicates(ctx context.Context, db bun.IDB, id uuid.UUID, after, last int64) error {
	_, err := db.NewRaw(`UPDATE import_rows SET duplicate = TRUE
WHERE import_id = ?0 AND row_no = ANY (ARRAY(
    SELECT row_no FROM (
        SELECT row_no, row_number() OVER (PARTITION BY email_key COLLATE "C" ORDER BY row_no) AS n
        FROM import_rows
        WHERE import_id = ?0 AND row_no > ?1 AND row_no <= ?2 AND email_key IS NOT NULL) AS d
    WHERE n > 1))`, id, after, last).Exec(ctx)
	return err
}

// listFilteredPostgres is a list page with the filters of docs/api-contract.md §19.3: the
// exact count of the matching subscribers as one row whose id is NULL (it sorts first), and the
// page, in one statement and so one snapshot. Not prepared: a generic plan cannot see which
// filter is selective. Each condition repeats its index's predicate (tags <> '{}',
// attributes <> '{}') so that the partial GIN indexes serve it; values are bound, never
// spliced, so metacharacters match literally.
func listFilteredPostgres(ctx context.Context, db bun.IDB, dest any, nl uuid.UUID, q model.ListQuery) error {
	query, args := FilteredListPostgres(nl, q)
	return db.NewRaw(query, args...).Scan(ctx, dest)
}

// FilteredListPostgres is the statement listFilteredPostgres sends for a filtered list of
// newsletter nl, with its arguments for bun to bind: exported so that subscriber-bench runs and
// EXPLAINs exactly what the service runs.
func FilteredListPostgres(nl uuid.UUID, q model.ListQuery) (string, []any) {
	where, args := filterPostgres(nl, q)
	page, limit, pageArgs := filteredPage(where, args, q)
	query := `SELECT count(*) AS total, NULL::uuid AS id, NULL AS email, NULL AS first_name, NULL AS last_name,
    NULL AS status, NULL::timestamptz AS created_at, NULL::jsonb AS attributes, NULL::text[] AS tags
FROM subscribers WHERE ` + where + `
UNION ALL (
    SELECT NULL, id, email, first_name, last_name, status, created_at, attributes, tags FROM subscribers
    WHERE ` + page + `
    ORDER BY created_at DESC, id DESC` + limit + `
)` + listOrderPostgres
	return query, append(args, pageArgs...)
}

// attributeNamesPG is the attributes' keys as a JSON array, the expression has_attr's index is
// built on (subscribers_attribute_names_idx, see its migration): has_attr=a,b is its
// containment of ["a","b"].
const attributeNamesPG = `jsonb_path_query_array(attributes, '$.keyvalue().key')`

// filterPostgres is the WHERE clause of a filtered list and its arguments.
func filterPostgres(nl uuid.UUID, q model.ListQuery) (string, []any) {
	conds := []string{"newsletter_id = ?"}
	args := []any{nl}
	if q.Status != "" {
		conds, args = append(conds, "status = ?"), append(args, string(q.Status))
	}
	f := q.Filter
	if f.Status != "" { // a segment's (§20.1), ANDed with the list's own
		conds, args = append(conds, "status = ?"), append(args, string(f.Status))
	}
	if len(f.Tags) > 0 {
		conds, args = append(conds, "tags <> '{}' AND tags @> ?::text[]"), append(args, pgTextArray(f.Tags))
	}
	if len(f.NotTags) > 0 {
		conds, args = append(conds, "NOT (tags && ?::text[])"), append(args, pgTextArray(f.NotTags))
	}
	for _, c := range f.Attributes {
		probes := model.AttributeProbes(c.Key, c.Value)
		alts := make([]string, len(probes))
		for i, p := range probes {
			alts[i] = "attributes @> ?::jsonb"
			args = append(args, string(p))
		}
		conds = append(conds, "attributes <> '{}' AND ("+strings.Join(alts, " OR ")+")")
	}
	if len(f.HasAttributes) > 0 {
		conds = append(conds, "attributes <> '{}' AND "+attributeNamesPG+" @> ?::jsonb")
		keys, _ := json.Marshal(f.HasAttributes) // strings always encode
		args = append(args, string(keys))
	}
	if f.CreatedAfter != nil {
		conds, args = append(conds, "created_at > ?"), append(args, f.CreatedAfter.UTC())
	}
	if f.CreatedBefore != nil {
		conds, args = append(conds, "created_at < ?"), append(args, f.CreatedBefore.UTC())
	}
	return strings.Join(conds, " AND "), args
}

// stageBulk stages the targets in one INSERT … SELECT: the filter's matches by filterPostgres,
// the list's WHERE clause, or the given ids that the newsletter has.
func (*pgEngine) stageBulk(ctx context.Context, tx bun.IDB, id, nl uuid.UUID, target model.BulkTarget) (int64, error) {
	const head = `INSERT INTO bulk_action_targets (action_id, n, subscriber_id)
SELECT ?, row_number() OVER (), id FROM subscribers WHERE `
	var (
		where string
		args  []any
	)
	if target.Filter != nil {
		where, args = filterPostgres(nl, model.ListQuery{Filter: *target.Filter})
	} else {
		ids := make([]string, len(target.IDs))
		for i, x := range target.IDs {
			ids[i] = x.String()
		}
		where, args = "newsletter_id = ? AND id = ANY (?::uuid[])", []any{nl, pgTextArray(ids)}
	}
	res, err := tx.NewRaw(head+where, append([]any{id}, args...)...).Exec(ctx)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// bulkBatch is one statement over the batch's targets (bulkBatchPG). Whether it queued
// deliveries is not asked: the workers poll.
func (*pgEngine) bulkBatch(ctx context.Context, tx bun.IDB, b bulkBatch) (bulkCounts, bool, error) {
	var c bulkCounts
	ch := b.Change
	var (
		value, remove, keys any = "{}", "{}", "{}"
		evType                  = model.EventUpdated
	)
	switch ch.Action {
	case model.ActionAddTags, model.ActionRemoveTags:
		value = pgTextArray(ch.Tags)
	case model.ActionSetAttributes:
		set := model.Attributes{}
		var removed, all []string
		for k, v := range ch.Attributes {
			all = append(all, k)
			if v == nil {
				removed = append(removed, k)
			} else {
				set[k] = v
			}
		}
		value, remove, keys = string(set.JSON()), pgTextArray(removed), pgTextArray(all)
	case model.ActionUnsubscribe:
		evType = model.EventUnsubscribed
	}
	err := tx.NewRaw(bulkBatchPG(ch.Action), b.Action, b.Newsletter, b.After, b.Last, b.Now, model.FormatTime(b.Now),
		string(evType), b.Traceparent, b.SourceJSON, value, remove, keys).Scan(ctx, &c)
	return c, false, err
}

// bulkChangePG is, for each action, the new value of the changed column computed from the
// locked row s (new_value), the column it goes to, the condition under which the row o changes
// (another result, within the limits of docs/api-contract.md §19.1), and the JSON of the
// event's "previous" as model.NewEventOf writes it. ?9 is the tags (text[]) or the attributes
// set (jsonb), ?10 the attribute keys removed, ?11 every key of the patch.
var bulkChangePG = map[string]struct{ value, column, changed, previous string }{
	model.ActionAddTags: {
		value:    `ARRAY(SELECT x COLLATE "C" FROM unnest(s.tags || ?9::text[]) AS x GROUP BY 1 ORDER BY 1)`,
		column:   "tags",
		changed:  `NOT (o.tags @> ?9::text[]) AND cardinality(o.new_value) <= ` + strconv.Itoa(model.MaxTags),
		previous: tagsPreviousPG,
	},
	model.ActionRemoveTags: {
		value:    `ARRAY(SELECT x FROM unnest(s.tags) WITH ORDINALITY AS a (x, i) WHERE x <> ALL (?9::text[]) ORDER BY i)`,
		column:   "tags",
		changed:  `o.tags && ?9::text[]`,
		previous: tagsPreviousPG,
	},
	model.ActionSetAttributes: {
		value:  `(s.attributes - ?10::text[]) || ?9::jsonb`,
		column: "attributes",
		changed: `o.new_value <> o.attributes AND (SELECT count(*) FROM jsonb_object_keys(o.new_value)) <= ` +
			strconv.Itoa(model.MaxAttributes) + ` AND octet_length(subscriber_attributes_text(o.new_value)) <= ` +
			strconv.Itoa(model.MaxAttributesBytes),
		previous: `'{"attributes":{' || (SELECT string_agg(to_json(k)::text || ':' || coalesce((o.attributes -> k)::text, 'null'), ','
            ORDER BY k COLLATE "C") FROM unnest(?11::text[]) AS k WHERE (o.attributes -> k) IS DISTINCT FROM (o.new_value -> k)) || '}}'`,
	},
	model.ActionUnsubscribe: {
		value:    `'` + string(model.StatusUnsubscribed) + `'::text`,
		column:   "status",
		changed:  `o.status <> '` + string(model.StatusUnsubscribed) + `'`,
		previous: `'{"status":"' || o.status || '"}'`,
	},
}

// bulkBatchPG is the statement of a batch of action (pgEngine.bulkBatch): ?0 the action, ?1 its
// newsletter, ?2 and ?3 the batch's targets (numbered after ?2, up to ?3), ?4 the time, ?5 the
// same in the contract's form, ?6 the event type, ?7 the events' traceparent, ?8 their source
// object, ?9 to ?11 the change (bulkChangePG). Its parts, in one snapshot:
//   - t: the batch's targets, deleted as they are read;
//   - o: those subscribers still in the newsletter (one erased or deleted meanwhile is not),
//     read by id from the primary key (= ANY: the fresh targets have no statistics, and a
//     join on them was planned as a scan of every subscriber, in every batch), locked in id
//     order as the single operations lock them, with their new value;
//   - u: the ones whose value changes, changed, with the values after and the previous JSON
//     (o's estimate, that of an = ANY over an array not known when planning, is small: each
//     row of o finds its subscriber by a probe of the primary key, whatever the statistics);
//   - v, ev, d: their events (eventsPG: the JSON model.NewEventOf writes) and the events'
//     deliveries in the bulk lane (outbox.Bulk);
//   - for unsubscribe, m and k: their unsent emails cancelled and their links retired, as
//     retireConfirmations does.
//
// It returns the targets handled and the subscribers changed. The counters follow by their
// triggers.
func bulkBatchPG(action string) string {
	c := bulkChangePG[action]
	q := `WITH t AS (
    DELETE FROM bulk_action_targets WHERE action_id = ?0 AND n > ?2 AND n <= ?3 RETURNING subscriber_id),
o AS (
    SELECT s.id, s.tags, s.attributes, s.status, ` + c.value + ` AS new_value
    FROM subscribers AS s
    WHERE s.newsletter_id = ?1 AND s.id = ANY (ARRAY(SELECT subscriber_id FROM t))
    ORDER BY s.id
    FOR UPDATE),
u AS (
    UPDATE subscribers AS s SET ` + c.column + ` = o.new_value, updated_at = ?4
    FROM o WHERE s.id = o.id AND ` + c.changed + `
    RETURNING s.id, s.newsletter_id, s.email, s.first_name, s.last_name, s.status, s.created_at, s.attributes, s.tags,
        ` + c.previous + ` AS previous),
` + eventIDsPG + `,
` + eventsPG("?6::text", "?4::timestamptz", "?5::text", "?7::text", "?8::text") + `,
d AS (` + queueDeliveriesIn(outbox.Bulk) + eventMatchPG + `)`
	if action == model.ActionUnsubscribe {
		q += `,
m AS (
    UPDATE email_outbox SET state = 'cancelled', updated_at = ?4
    WHERE subscriber_id IN (SELECT id FROM u) AND state = 'pending'),
k AS (
    UPDATE confirmation_tokens SET retired_at = ?4
    WHERE subscriber_id IN (SELECT id FROM u) AND retired_at IS NULL)`
	}
	return q + `
SELECT (SELECT count(*) FROM t) AS processed, (SELECT count(*) FROM u) AS changed`
}

// eventIDsPG is the CTE v of a statement that records the events of the subscribers it
// changed: the rows of u, each with event_id, the id of its event. A subscriber's history is
// in the order of its events' ids, so each is made after its row's lock, when u returns the row
// (the subquery names u's row, so it runs for each, after it), and from a clock reading
// of its own, as model.NewEventOf makes ids (uuid.NewV7): the Unix time in milliseconds, then
// the nanoseconds within the millisecond divided by 256 (12 bits), then 62 random bits. The
// next writer of the row waits for this one's commit, so its event sorts after, whether its
// id comes from Go or from here. (uuid_v7(), which the imports' rows use, has random bits
// where the sub-millisecond is: two events of one millisecond would sort by chance.)
const eventIDsPG = `v AS (
    SELECT encode(int8send((floor(c.ns / 1000000)::bigint << 16) | 28672 | ((c.ns::bigint % 1000000) >> 8))
            || int8send(floor(random() * 4611686018427387904)::bigint | (-9223372036854775808)::bigint), 'hex')::uuid
            AS event_id, u.*
    FROM u CROSS JOIN LATERAL (
        SELECT floor(extract(epoch FROM clock_timestamp()) * 1000000000) AS ns WHERE u.id IS NOT NULL) AS c)`

// eventsPG is the CTE ev of a statement that records the events of the subscribers it
// changed: for each row of v (event_id, the event's id; the subscriber after the change: id,
// newsletter_id, email, first_name, last_name, status, created_at, attributes and tags; and
// previous, the JSON object of the values the change replaced), the event of type typ at at
// (a timestamptz) and ts (the same in the contract's form, model.FormatTime), with traceparent
// and source (the JSON object model.NewEvent writes). Its payload is the JSON model.NewEventOf
// writes (pinned by tests), escaped as Go escapes (goJSONPG). It returns the rows the
// deliveries' insert reads (queueDeliveriesFrom). The arguments are SQL expressions: the
// statement's parameters, cast.
func eventsPG(typ, at, ts, traceparent, source string) string {
	return `ev AS (
    INSERT INTO subscriber_events (id, newsletter_id, subscriber_id, type, payload, traceparent, created_at)
    SELECT event_id, newsletter_id, id, ` + typ + `, ` + goJSONPG(`concat('{"id":"', event_id, '","type":"', `+typ+`,
        '","timestamp":"', `+ts+`, '","data":{"subscriber":{"id":"', id, '","email":', to_json(email),
        ',"name":', to_json(CASE WHEN last_name = '' THEN first_name ELSE first_name || ' ' || last_name END),
        ',"status":"', status, '","created_at":"', to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS'),
        '+00:00","attributes":', CASE WHEN attributes = '{}' THEN '{}' ELSE subscriber_attributes_text(attributes) END,
        ',"tags":', array_to_json(tags), '},"previous":', previous, ',"source":', `+source+`, '}}')`) + `,
        ` + traceparent + `, ` + at + `
    FROM v
    RETURNING id, newsletter_id, type, created_at)`
}

// tagsPreviousPG is the JSON of a change of tags' "previous" as model.NewEventOf writes it,
// of the row o's tags before: {"tags":[…]} (its strings escaped further by goJSONPG, with the
// rest of the payload).
const tagsPreviousPG = `'{"tags":' || array_to_json(o.tags)::text || '}'`

// goJSONPG is the text expression x, JSON whose strings PostgreSQL escaped (to_json), escaped
// further as Go's encoding/json escapes strings (see jsonStringPG): <, >, & and the line and
// paragraph separators occur only inside its strings.
func goJSONPG(x string) string {
	return `replace(replace(replace(replace(replace(` + x + `, '<', '\u003c'), '>', '\u003e'), '&', '\u0026'), ` +
		`U&'\2028', '\u2028'), U&'\2029', '\u2029')`
}

func (*pgEngine) countMatching(ctx context.Context, db bun.IDB, nl uuid.UUID, f model.Filter) (int64, error) {
	query, args := SegmentCountPostgres(nl, f)
	var n int64
	err := db.NewRaw(query, args...).Scan(ctx, &n)
	return n, err
}

// SegmentCountPostgres is the statement countMatching sends to count the subscribers of
// newsletter nl that filter f selects (a segment's members), with its arguments for bun to
// bind: exported, as FilteredListPostgres is, for subscriber-bench.
func SegmentCountPostgres(nl uuid.UUID, f model.Filter) (string, []any) {
	where, args := filterPostgres(nl, model.ListQuery{Filter: f})
	return "SELECT count(*) FROM subscribers WHERE " + where, args
}
