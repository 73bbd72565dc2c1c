package repo

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/sqlitedialect"
	"github.com/uptrace/bun/migrate"
	"go.opentelemetry.io/otel/trace"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/subscriberd/subscriberd/migrations"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/outbox"
)

// This file is the SQLite side of the engine seam (see engine): what the embedded SQLite store
// does differently from PostgreSQL. The stores keep one code path; where the SQL must differ
// they call the engine, with plain values, and it names nothing of the stores. It runs the
// stores' statements without their row-lock clauses (raw), and writes in one transaction of
// several statements what PostgreSQL writes in one (a create, a rename, a change of tags, the
// claims).
//
// SQLite serialises writers. Every transaction begins IMMEDIATE (it takes the write lock at
// BEGIN, waiting up to the busy timeout), so no transaction ever has to upgrade a read lock and
// none needs FOR UPDATE or SKIP LOCKED: holding the lock already excludes every other writer.

// sqliteBusyTimeout is how long a connection waits for the write lock before SQLITE_BUSY.
// Writes take milliseconds, so a second is a long queue. With txRetries (tx.go) a request waits
// at most about 4.4 s before the store answers model.ErrUnavailable (503, Retry-After), rather
// than holding a client and a connection for longer.
const sqliteBusyTimeout = time.Second

// IsSQLite tells whether dsn selects the embedded SQLite store (scheme sqlite:).
func IsSQLite(dsn string) bool { return strings.HasPrefix(dsn, "sqlite:") }

// SQLiteURL is the DATABASE_URL of the SQLite file at path.
func SQLiteURL(path string) string {
	if filepath.IsAbs(path) {
		return "sqlite://" + filepath.ToSlash(path)
	}
	return "sqlite://" + filepath.ToSlash(filepath.Clean(path))
}

// SQLitePath is the file an SQLite URL names: sqlite:///abs/path.db is /abs/path.db and
// sqlite://relative/path.db is relative/path.db (to the working directory). Query parameters
// are not accepted: the store sets its own pragmas.
func SQLitePath(dsn string) (string, error) {
	rest, ok := strings.CutPrefix(dsn, "sqlite://")
	if !ok {
		return "", errors.New(`an SQLite URL starts with "sqlite://" (sqlite:///abs/path.db or sqlite://relative.db)`)
	}
	if strings.ContainsAny(rest, "?#") {
		return "", errors.New("an SQLite URL takes no query or fragment")
	}
	p, err := url.PathUnescape(rest)
	if err != nil {
		return "", fmt.Errorf("invalid SQLite URL: %w", err)
	}
	if p == "" || p == "/" {
		return "", errors.New("the SQLite URL names no file")
	}
	return p, nil
}

// openSQLite opens the SQLite file of dsn in WAL mode, with foreign keys enforced, a busy
// timeout, and immediate transactions.
func openSQLite(dsn string, opts Options) (*DB, error) {
	path, err := SQLitePath(dsn)
	if err != nil {
		return nil, err
	}
	if path != ":memory:" {
		// SQLite would create a missing file with the process's umask (often 0644).
		if f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600); err == nil {
			f.Close()
		}
	}
	params := "_pragma=foreign_keys(1)&_pragma=busy_timeout(" + fmt.Sprint(sqliteBusyTimeout.Milliseconds()) + ")" +
		"&_pragma=journal_mode(WAL)&_txlock=immediate"
	sqldb, err := sql.Open("sqlite", path+"?"+params)
	if err != nil {
		return nil, fmt.Errorf("open SQLite %s: %w", path, err)
	}
	n := opts.MaxConns
	if n <= 0 {
		n = 8
	}
	if path == ":memory:" {
		n = 1 // each connection to :memory: is a database of its own
	}
	sqldb.SetMaxOpenConns(n)
	sqldb.SetMaxIdleConns(n)
	hook := newQueryHook(dsn, "sqlite")
	bdb := bun.NewDB(sqldb, sqlitedialect.New()).WithQueryHook(hook)
	return &DB{DB: bdb, eng: &sqliteEngine{wakers: map[string]*waker{emailQueue: newWaker(), webhookQueue: newWaker()}},
		hook: hook}, nil
}

// ensureSQLiteFile creates the directory of the SQLite file of dsn and the file itself, empty
// (a valid database) and readable by its owner only: SQLite gives the -wal and -shm files it
// makes beside it the same mode. It reports whether it created the file; an existing file
// keeps its mode.
func ensureSQLiteFile(dsn string) (created bool, err error) {
	path, err := SQLitePath(dsn)
	if err != nil {
		return false, err
	}
	if path == ":memory:" {
		return false, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return false, fmt.Errorf("create the SQLite directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("create the SQLite file: %w", err)
	}
	return true, f.Close()
}

// sqliteFileExists reports whether the SQLite file of dsn exists.
func sqliteFileExists(dsn string) (bool, error) {
	path, err := SQLitePath(dsn)
	if err != nil {
		return false, err
	}
	if path == ":memory:" {
		return true, nil
	}
	_, err = os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

func asSQLiteError(err error) (*sqlite.Error, bool) {
	var e *sqlite.Error
	ok := errors.As(err, &e)
	return e, ok
}

// translateSQLite maps an SQLite error onto model errors. SQLite names no constraint in a
// unique violation, only the columns ("UNIQUE constraint failed: subscribers.newsletter_id,
// subscribers.email_key"), so the subscriber email key is recognised by those.
func translateSQLite(err error, e *sqlite.Error) error {
	if errors.Is(err, model.ErrUnavailable) { // translated already
		return err
	}
	code := e.Code()
	switch {
	case code == sqlite3.SQLITE_CONSTRAINT_UNIQUE &&
		strings.Contains(e.Error(), "subscribers.newsletter_id, subscribers.email_key"):
		return fmt.Errorf("%w", model.ErrEmailTaken)
	case code&0xff == sqlite3.SQLITE_BUSY, code&0xff == sqlite3.SQLITE_LOCKED,
		code&0xff == sqlite3.SQLITE_CANTOPEN, code&0xff == sqlite3.SQLITE_IOERR,
		code&0xff == sqlite3.SQLITE_FULL, code&0xff == sqlite3.SQLITE_READONLY:
		// The chain keeps the driver's error so retry can tell a busy database.
		return fmt.Errorf("%w: %w", model.ErrUnavailable, err)
	}
	return err
}

// isBusy tells whether err is SQLite's "database is busy or locked".
func isBusy(err error) bool {
	e, ok := asSQLiteError(err)
	return ok && (e.Code()&0xff == sqlite3.SQLITE_BUSY || e.Code()&0xff == sqlite3.SQLITE_LOCKED)
}

// sqliteEngine is the engine of an SQLite file. It wakes the workers at once: per queue
// (emails, webhook deliveries), the channels of its Listen calls, signalled after a commit that
// queued into it. An SQLite file has one writer process, so every insert happens in this
// process.
type sqliteEngine struct {
	wakers map[string]*waker // made whole by openSQLite, read-only after
}

type waker struct {
	mu    sync.Mutex
	chans map[chan struct{}]struct{}
}

func newWaker() *waker { return &waker{chans: map[chan struct{}]struct{}{}} }

// listen returns a channel signalled (coalesced) after each notify, until ctx ends.
func (w *waker) listen(ctx context.Context) <-chan struct{} {
	c := make(chan struct{}, 1)
	w.mu.Lock()
	w.chans[c] = struct{}{}
	w.mu.Unlock()
	context.AfterFunc(ctx, func() {
		w.mu.Lock()
		delete(w.chans, c)
		w.mu.Unlock()
	})
	return c
}

func (w *waker) notify() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for c := range w.chans {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

func (e *sqliteEngine) listen(ctx context.Context, queue string) <-chan struct{} {
	return e.wakers[queue].listen(ctx)
}

func (e *sqliteEngine) wake(queue string) { e.wakers[queue].notify() }

func (*sqliteEngine) migrations() (*migrate.Migrations, error) { return migrations.SQLite() }

func (*sqliteEngine) migrationsTableExists() string {
	return "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'bun_migrations'"
}

// queryRow runs st's text through bun, whose query hook names its span as the prepared
// statement's on PostgreSQL ("SELECT subscribers").
func (*sqliteEngine) queryRow(ctx context.Context, db bun.IDB, st *statement, dest any, args ...any) error {
	return db.NewRaw(st.bunText, args...).Scan(withStatement(ctx, st), dest)
}

func (*sqliteEngine) queryRows(ctx context.Context, db bun.IDB, st *statement, dest any, args ...any) error {
	err := db.NewRaw(st.bunText, args...).Scan(withStatement(ctx, st), dest)
	if errors.Is(err, sql.ErrNoRows) { // a slice: no row leaves it empty
		err = nil
	}
	return err
}

func (*sqliteEngine) listPage(ctx context.Context, db bun.IDB, dest any, nl uuid.UUID, q model.ListQuery) error {
	if !q.Filter.IsZero() {
		return listFilteredSQLite(ctx, db, dest, nl, q)
	}
	var statusFilter, afterTime, afterID any
	if q.Status != "" {
		statusFilter = string(q.Status)
	}
	stmt := listSQLite
	if q.After != nil {
		stmt = listAfterSQLite
		afterTime, afterID = q.After.CreatedAt.UTC(), q.After.ID
	}
	return db.NewRaw(stmt, nl, statusFilter, q.Limit+1, q.Offset(), afterTime, afterID).Scan(ctx, dest)
}

// create makes the check and the writes of PostgreSQL's one statement as statements of one
// immediate transaction, which holds the write lock from its start: no suppression can commit
// between the check and the insert, as none can under suppression_after_lock's lock.
func (e *sqliteEngine) create(ctx context.Context, db bun.IDB, c creation) (bool, error) {
	var delivering bool
	err := runInTx(ctx, db, func(ctx context.Context, tx bun.IDB) error {
		delivering = false
		var reason string
		err := e.queryRow(ctx, tx, suppressionReasonSQLite, &reason, c.NewsletterID, c.EmailHash, c.LegacyHash)
		switch {
		case err == nil:
			return model.Suppressed(model.SuppressionReason(reason))
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		res, err := e.exec(ctx, tx, insertSubscriberSQLite,
			c.ID, c.NewsletterID, c.Email, c.EmailKey, c.FirstName, c.LastName, c.Status, c.CreatedAt, c.UpdatedAt,
			c.Attributes, tagsJSON(c.Tags))
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("%w", model.ErrEmailTaken)
		}
		if delivering, err = e.insertEvents(ctx, tx, []eventRow{c.Event}, outbox.Interactive); err != nil {
			return err
		}
		if c.MailID == nil {
			return nil
		}
		_, err = e.exec(ctx, tx, insertConfirmationSQLite, *c.MailID, c.NewsletterID, c.ID, c.UpdatedAt, c.MailTraceparent)
		return err
	})
	return delivering, err
}

// The statements of create: the reason the address (its newsletter, its own key's hash and
// its 1.2 key's) is suppressed for, the entry under its own key's hash first, as
// suppression_after_lock reads it; the subscriber's insert, which a taken address skips; the
// confirmation email's (id, newsletter, subscriber, due time, traceparent).
var (
	suppressionReasonSQLite = newStatement("SELECT", "suppressions",
		`SELECT reason FROM suppressions WHERE newsletter_id = $1 AND email_hash IN ($2, $3)
ORDER BY email_hash = $2 DESC LIMIT 1`)
	insertSubscriberSQLite = newStatement("INSERT", "subscribers",
		`INSERT INTO subscribers (id, newsletter_id, email, email_key, first_name, last_name, status, created_at, updated_at,
    attributes, tags)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (newsletter_id, email_key) DO NOTHING`)
	insertConfirmationSQLite = newStatement("INSERT", "email_outbox",
		`INSERT INTO email_outbox (id, newsletter_id, subscriber_id, kind, state, attempts, next_attempt_at, last_error,
    traceparent, created_at, updated_at)
VALUES ($1, $2, $3, '`+model.EmailKindConfirmation+`', 'pending', 0, $4, '', $5, $4, $4)`)
)

// exec runs st, which returns no row, through bun, its span named as st's (see queryRow).
func (*sqliteEngine) exec(ctx context.Context, db bun.IDB, st *statement, args ...any) (sql.Result, error) {
	return db.NewRaw(st.bunText, args...).Exec(withStatement(ctx, st))
}

// rename changes the row when it still holds what r read, then records the event and its
// deliveries, in one immediate transaction.
func (e *sqliteEngine) rename(ctx context.Context, db bun.IDB, r renaming) (bool, bool, error) {
	var renamed, delivering bool
	err := runInTx(ctx, db, func(ctx context.Context, tx bun.IDB) error {
		renamed, delivering = false, false
		res, err := e.exec(ctx, tx, renameSQLite, r.NewsletterID, r.ID, r.Email, r.FirstName, r.LastName, r.Status,
			r.UpdatedAt, r.NewFirstName, r.NewLastName, r.NewUpdatedAt)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return nil
		}
		renamed = true
		delivering, err = e.insertEvents(ctx, tx, []eventRow{r.Event}, outbox.Interactive)
		return err
	})
	return renamed, delivering, err
}

// renameSQLite is rename's change: $1 and $2 the subscriber, $3 to $7 the email, names,
// status and update time read, $8 to $10 the new names and update time.
var renameSQLite = newStatement("UPDATE", "subscribers", `UPDATE subscribers SET first_name = $8, last_name = $9, updated_at = $10
WHERE newsletter_id = $1 AND id = $2 AND email = $3 AND first_name = $4 AND last_name = $5
    AND status = $6 AND updated_at = $7`)

// changeTags reads the subscriber, applies the change with model.TagsChange.Apply, and writes
// the new set with its event (model.NewEventOf) and the event's deliveries, in one immediate
// transaction: it holds the write lock from the read on, so no other change of the tags comes
// in between (SQLite has no data-modifying CTE to do it in one statement).
func (e *sqliteEngine) changeTags(ctx context.Context, db bun.IDB, t retagging) (model.Subscriber, bool, error) {
	var (
		sub        model.Subscriber
		delivering bool
	)
	err := runInTx(ctx, db, func(ctx context.Context, tx bun.IDB) error {
		sub, delivering = model.Subscriber{}, false
		var row subscriberValues
		err := e.queryRow(ctx, tx, subscriberTagsSQLite, &row, t.NewsletterID, t.ID)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w", model.ErrNotFound)
		}
		if err != nil {
			return err
		}
		before := row.model()
		tags, changed, verr := t.Change.Apply(before.Tags)
		switch {
		case verr != nil:
			return verr
		case !changed:
			sub = before
			return nil
		}
		after := before
		after.Tags, after.UpdatedAt = tags, t.Now
		if _, err := e.exec(ctx, tx, setTagsSQLite, t.ID, tagsJSON(tags), t.Now); err != nil {
			return err
		}
		ev := model.NewEventOf(model.EventUpdated, after, map[string]any{"tags": before.Tags}, t.Source, t.Now)
		delivering, err = e.insertEvents(ctx, tx, []eventRow{{ID: ev.ID, NewsletterID: ev.NewsletterID,
			SubscriberID: ev.SubscriberID, Type: string(ev.Type), Payload: string(ev.Payload), Traceparent: t.Traceparent,
			CreatedAt: ev.Timestamp}}, outbox.Interactive)
		if err != nil {
			return err
		}
		sub = after
		return nil
	})
	return sub, delivering, err
}

// The statements of changeTags: the read of the newsletter's ($1) subscriber ($2), and the
// write of the subscriber's ($1) new tags ($2, a JSON array) and update time ($3).
var (
	subscriberTagsSQLite = newStatement("SELECT", "subscribers",
		`SELECT id, newsletter_id, email, first_name, last_name, status, created_at, updated_at, attributes, tags
FROM subscribers WHERE newsletter_id = $1 AND id = $2`)
	setTagsSQLite = newStatement("UPDATE", "subscribers", `UPDATE subscribers SET tags = $2, updated_at = $3 WHERE id = $1`)
)

// insertEvents inserts the events, then their deliveries from them, and reports whether it
// queued any, for the caller to wake the workers after its commit.
func (*sqliteEngine) insertEvents(ctx context.Context, db bun.IDB, rows []eventRow, lane outbox.Lane) (bool, error) {
	if _, err := db.NewInsert().Model(&rows).Exec(ctx); err != nil {
		return false, err
	}
	ids := make([]uuid.UUID, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	res, err := db.NewRaw(`WITH ev AS (SELECT id, newsletter_id, type, created_at FROM subscriber_events WHERE id IN (?)) `+
		queueDeliveriesIn(lane)+eventMatchSQLite, bun.List(ids)).Exec(ctx)
	if err != nil {
		return false, err
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// claimEmails leases the due emails of lane with one UPDATE … RETURNING and reads what they
// need, in one immediate transaction: it holds the database's write lock, so no other claim
// runs meanwhile and none needs SKIP LOCKED.
func (*sqliteEngine) claimEmails(ctx context.Context, db bun.IDB, now time.Time, lane outbox.Lane, limit int, lease time.Duration) ([]claimedRow, error) {
	due := dueInteractiveSQLite
	if lane == outbox.Bulk {
		due = dueBulkSQLite
	}
	var rows []claimedRow
	err := runInTx(ctx, db, func(ctx context.Context, tx bun.IDB) error {
		rows = nil
		var ids []uuid.UUID
		if err := tx.NewRaw(due+`
UPDATE email_outbox SET next_attempt_at = ?0, stale_at = ?3, updated_at = ?1
WHERE id IN (SELECT id FROM due)
RETURNING id`, now.Add(lease), now, limit, now.Add(outbox.StaleAfter(lease))).Scan(ctx, &ids); err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if len(ids) == 0 {
			return nil
		}
		err := tx.NewRaw(`SELECT o.id, o.newsletter_id, o.subscriber_id, o.kind, o.attempts, o.unanswered, o.traceparent, o.created_at,
    s.email, s.first_name, s.last_name, n.name AS newsletter_name
FROM email_outbox AS o
JOIN subscribers AS s ON s.id = o.subscriber_id
JOIN newsletters AS n ON n.id = o.newsletter_id
WHERE o.id IN (?)
ORDER BY o.created_at, o.id`, bun.List(ids)).Scan(ctx, &rows)
		if errors.Is(err, sql.ErrNoRows) {
			err = nil
		}
		return err
	})
	return rows, err
}

// dueInteractiveSQLite is the CTE "due" of the interactive lane's claim (?1 now, ?2 limit):
// its oldest due emails.
const dueInteractiveSQLite = `WITH due AS (
    SELECT id FROM email_outbox
    WHERE state = 'pending' AND lane = 0 AND next_attempt_at <= ?1
    ORDER BY next_attempt_at
    LIMIT ?2
)`

// dueBulkSQLite is the CTE "due" of the bulk lane's claim (?1 now, ?2 limit), where the
// newsletters take turns, as in dueBulkPG: nl walks the newsletters with pending bulk emails,
// each gives up to ?2 of its oldest due ones, and the first of each go first.
const dueBulkSQLite = `WITH RECURSIVE nl (id) AS (
    SELECT (SELECT newsletter_id FROM email_outbox WHERE state = 'pending' AND lane = 1 ORDER BY newsletter_id LIMIT 1)
    UNION ALL
    SELECT (SELECT o.newsletter_id FROM email_outbox AS o
            WHERE o.state = 'pending' AND o.lane = 1 AND o.newsletter_id > nl.id
            ORDER BY o.newsletter_id LIMIT 1)
    FROM nl WHERE nl.id IS NOT NULL
), turns AS (
    SELECT o.id, o.next_attempt_at, row_number() OVER (PARTITION BY o.newsletter_id ORDER BY o.next_attempt_at) AS turn
    FROM nl JOIN email_outbox AS o ON o.id IN (
        SELECT x.id FROM email_outbox AS x
        WHERE x.state = 'pending' AND x.lane = 1 AND x.newsletter_id = nl.id AND x.next_attempt_at <= ?1
        ORDER BY x.next_attempt_at
        LIMIT ?2)
), due AS (
    SELECT id FROM turns ORDER BY turn, next_attempt_at LIMIT ?2
)`

// claimableEndpointsSQLite is claimableEndpoints without its row locks (see raw).
var claimableEndpointsSQLite = withoutRowLocks(claimableEndpoints)

// claimDeliveries leases the endpoints with one UPDATE … RETURNING and reads their due
// deliveries, in one immediate transaction (see claimEmails), which no other claim runs
// beside: a newsletter's bound holds exactly.
func (*sqliteEngine) claimDeliveries(ctx context.Context, db bun.IDB, now time.Time, c deliveryClaim) ([]claimRow, error) {
	var rows []claimRow
	err := runInTx(ctx, db, func(ctx context.Context, tx bun.IDB) error {
		rows = nil
		var ids []uuid.UUID
		if err := tx.NewRaw(`UPDATE webhook_endpoints SET busy_until = ?3, last_claimed_at = ?0, stale_at = ?6
WHERE id IN (`+claimableEndpointsSQLite+`)
RETURNING id`, c.args(now)...).Scan(ctx, &ids); err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if len(ids) == 0 {
			return nil
		}
		err := tx.NewRaw(`SELECT w.id AS endpoint_id, w.url, w.secret, d.event_id, d.attempts, d.lane, e.type, e.payload, e.traceparent
FROM (
    SELECT endpoint_id, event_id, attempts, lane, next_attempt_at,
        row_number() OVER (PARTITION BY endpoint_id ORDER BY lane, next_attempt_at) AS n
    FROM webhook_deliveries
    WHERE endpoint_id IN (?0) AND state = 'pending' AND next_attempt_at <= ?1
) AS d
JOIN webhook_endpoints AS w ON w.id = d.endpoint_id
JOIN subscriber_events AS e ON e.id = d.event_id
WHERE d.n <= ?2
ORDER BY w.id, d.lane, d.next_attempt_at`, bun.List(ids), now, c.perEndpoint).Scan(ctx, &rows)
		if errors.Is(err, sql.ErrNoRows) {
			err = nil
		}
		return err
	})
	return rows, err
}

// raw runs query without its row-lock clauses, which SQLite does not have: an immediate
// transaction already holds the write lock, which excludes every other writer, and a read
// outside one sees committed rows only.
func (*sqliteEngine) raw(db bun.IDB, query string, args ...any) *bun.RawQuery {
	return db.NewRaw(withoutRowLocks(query), args...)
}

// rowLock matches a row-lock clause of PostgreSQL's in a statement.
var rowLock = regexp.MustCompile(`\s+FOR\s+(?:NO\s+KEY\s+UPDATE|UPDATE|KEY\s+SHARE|SHARE)(?:\s+SKIP\s+LOCKED|\s+NOWAIT)?\b`)

// lockFree holds the statements withoutRowLocks made: each store's statement is a constant,
// rewritten once.
var lockFree sync.Map // string → string

// withoutRowLocks is query with its row-lock clauses removed.
func withoutRowLocks(query string) string {
	if q, ok := lockFree.Load(query); ok {
		return q.(string)
	}
	q := rowLock.ReplaceAllString(query, "")
	lockFree.Store(query, q)
	return q
}

// deleteResponsesContaining looks for each needle with instr(), which searches a blob's bytes.
func (*sqliteEngine) deleteResponsesContaining(ctx context.Context, db bun.IDB, nl uuid.UUID, needles [][]byte) error {
	q := db.NewDelete().TableExpr("idempotency_keys").Where("newsletter_id = ?", nl)
	q = q.WhereGroup(" AND ", func(q *bun.DeleteQuery) *bun.DeleteQuery {
		for _, n := range needles {
			q = q.WhereOr("instr(body, ?) > 0", n)
		}
		return q
	})
	_, err := q.Exec(ctx)
	return err
}

// dropEmptyTagCounts deletes the tags' rows whose count is 0: one row a tag, and the immediate
// transaction excludes every other writer.
func (*sqliteEngine) dropEmptyTagCounts(ctx context.Context, db bun.IDB, nl uuid.UUID, tags []string) error {
	if len(tags) == 0 {
		return nil
	}
	js, err := json.Marshal(tags)
	if err != nil {
		return err
	}
	_, err = db.NewRaw(`DELETE FROM subscriber_tag_counts
WHERE newsletter_id = ? AND n = 0 AND tag IN (SELECT value FROM json_each(?))`, nl, string(js)).Exec(ctx)
	return err
}

// lockEmailKeys has nothing to do: the immediate transaction excludes every other writer.
func (*sqliteEngine) lockEmailKeys(context.Context, bun.IDB, uuid.UUID, []string) error { return nil }

// lockIdempotencyKey has nothing to take: the immediate transaction serialises every writer,
// so no other request with the key runs meanwhile, and one that finished first is caught by
// the record's insert, as on PostgreSQL.
func (*sqliteEngine) lockIdempotencyKey(context.Context, bun.IDB, uuid.UUID, string) error {
	return nil
}

// eventMatchSQLite completes queueDeliveriesFrom on SQLite: the endpoint's events name the
// event's type.
const eventMatchSQLite = `instr(w.events, '"' || ev.type || '"') > 0`

// listSQLite reads the total and the page in one statement (SQLite lacks LATERAL, so the
// page is a plain subquery). One statement reads one snapshot, so page and total agree.
const listSQLite = `
SELECT t.total, s.id, s.email, s.first_name, s.last_name, s.status, s.created_at, s.attributes, s.tags
FROM (SELECT coalesce(sum(n), 0) AS total FROM subscriber_counts
      WHERE newsletter_id = ?0 AND (?1 IS NULL OR status = ?1)) AS t
LEFT JOIN (
    SELECT s.id, s.email, s.first_name, s.last_name, s.status, s.created_at, s.attributes, s.tags FROM (
        SELECT id FROM subscribers
        WHERE newsletter_id = ?0 AND (?1 IS NULL OR status = ?1)
        ORDER BY created_at DESC, id DESC
        LIMIT ?2 OFFSET ?3
    ) AS p JOIN subscribers AS s USING (id)
) AS s ON true
ORDER BY s.created_at DESC, s.id DESC`

// listAfterSQLite is listSQLite for a keyset page: the rows after (?4, ?5) in the order.
const listAfterSQLite = `
SELECT t.total, s.id, s.email, s.first_name, s.last_name, s.status, s.created_at, s.attributes, s.tags
FROM (SELECT coalesce(sum(n), 0) AS total FROM subscriber_counts
      WHERE newsletter_id = ?0 AND (?1 IS NULL OR status = ?1)) AS t
LEFT JOIN (
    SELECT s.id, s.email, s.first_name, s.last_name, s.status, s.created_at, s.attributes, s.tags FROM (
        SELECT id FROM subscribers
        WHERE newsletter_id = ?0 AND (?1 IS NULL OR status = ?1) AND (created_at, id) < (?4, ?5)
        ORDER BY created_at DESC, id DESC
        LIMIT ?2
    ) AS p JOIN subscribers AS s USING (id)
) AS s ON true
ORDER BY s.created_at DESC, s.id DESC`

// stageImport stages an import in short transactions, the import hidden until its last row is
// stored, so that a long upload never holds the write lock (Imports.Stage).
func (*sqliteEngine) stageImport(ctx context.Context, db *bun.DB, st staging) (err error) {
	if err := st.insert(ctx, db, true); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			// The client may be gone, and the cleanup must not go with it: it gets a deadline
			// of its own, under the upload's span. A cleanup that fails is left to the
			// worker's sweep (SweepUploads).
			cctx, cancel := context.WithTimeout(trace.ContextWithSpan(context.Background(), trace.SpanFromContext(ctx)), 5*time.Second)
			defer cancel()
			st.drop(cctx) //nolint:errcheck // see above
		}
	}()
	var n int64
	batch := make([]stagedRow, 0, sqliteStageBatch)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := runInTx(ctx, db, func(ctx context.Context, tx bun.IDB) error {
			// One statement prepared for the batch's rows: SQLite parsing one INSERT of 500
			// rows of literals took most of an upload's time.
			btx, ok := tx.(bun.Tx)
			if !ok {
				return fmt.Errorf("staging an import: %T is not a transaction", tx)
			}
			stmt, err := btx.PrepareContext(ctx, stageRowSQLite)
			if err != nil {
				return err
			}
			defer stmt.Close()
			for i := range batch {
				r := &batch[i]
				if _, err := stmt.ExecContext(ctx, r.ImportID.String(), r.RowNo, nullText(r.Email), nullText(r.EmailKey),
					nullBytes(r.EmailHash), nullBytes(r.LegacyHash), r.FirstName, r.LastName, nullText(r.Status),
					nullText(r.Errors), nullText(r.Extra)); err != nil {
					return err
				}
			}
			return st.alive(ctx, tx)
		})
		batch = batch[:0]
		return translate(err)
	}
	for {
		r, err := st.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		n++
		batch = append(batch, r)
		if len(batch) == sqliteStageBatch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	return st.finish(ctx, db, n)
}

// stageRowSQLite stores one staged row (stageImport).
const stageRowSQLite = `INSERT INTO import_rows (import_id, row_no, email, email_key, email_hash, legacy_hash,
    first_name, last_name, status, errors, extra) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

// nullText and nullBytes are v, or NULL when it is empty.
func nullText(v string) any {
	if v == "" {
		return nil
	}
	return v
}

func nullBytes(v []byte) any {
	if len(v) == 0 {
		return nil
	}
	return v
}

// sqliteStageBatch is how many staged rows one SQLite transaction holds.
const sqliteStageBatch = 500

// markDuplicates finds the rows by an IN list, which SQLite builds once.
func (*sqliteEngine) markDuplicates(ctx context.Context, db bun.IDB, id uuid.UUID, after, last int64) error {
	_, err := db.NewRaw(`UPDATE import_rows SET duplicate = TRUE
WHERE import_id = ?0 AND row_no IN (
    SELECT row_no FROM (
        SELECT row_no, row_number() OVER (PARTITION BY email_key ORDER BY row_no) AS n
        FROM import_rows
        WHERE import_id = ?0 AND row_no > ?1 AND row_no <= ?2 AND email_key IS NOT NULL) AS d
    WHERE n > 1)`, id, after, last).Exec(ctx)
	return err
}

// listFilteredSQLite is a list page with the filters of docs/api-contract.md §19.3, read with
// JSON1 functions, and its exact total, in one statement (one snapshot), as listSQLite. Values
// are bound, never spliced, so metacharacters match literally.
func listFilteredSQLite(ctx context.Context, db bun.IDB, dest any, nl uuid.UUID, q model.ListQuery) error {
	where, args := filterSQLite(nl, q)
	page, limit, pageArgs := filteredPage(where, args, q)
	query := `
SELECT t.total, s.id, s.email, s.first_name, s.last_name, s.status, s.created_at, s.attributes, s.tags
FROM (SELECT count(*) AS total FROM subscribers WHERE ` + where + `) AS t
LEFT JOIN (
    SELECT id, email, first_name, last_name, status, created_at, attributes, tags FROM subscribers
    WHERE ` + page + `
    ORDER BY created_at DESC, id DESC` + limit + `
) AS s ON true
ORDER BY s.created_at DESC, s.id DESC`
	return db.NewRaw(query, append(args, pageArgs...)...).Scan(ctx, dest)
}

// filterSQLite is the WHERE clause of a filtered list and its arguments.
func filterSQLite(nl uuid.UUID, q model.ListQuery) (string, []any) {
	conds := []string{"newsletter_id = ?"}
	args := []any{nl}
	if q.Status != "" {
		conds, args = append(conds, "status = ?"), append(args, string(q.Status))
	}
	f := q.Filter
	if f.Status != "" { // a segment's (§20.1), ANDed with the list's own
		conds, args = append(conds, "status = ?"), append(args, string(f.Status))
	}
	for _, t := range f.Tags {
		conds, args = append(conds, "EXISTS (SELECT 1 FROM json_each(tags) WHERE value = ?)"), append(args, t)
	}
	for _, t := range f.NotTags {
		conds, args = append(conds, "NOT EXISTS (SELECT 1 FROM json_each(tags) WHERE value = ?)"), append(args, t)
	}
	for _, c := range f.Attributes {
		// The attribute's JSON text against each probe's (model.AttributeProbes): the key is
		// bound as a path; keys match [a-z][a-z0-9_]*, so '$."k"' quotes nothing else.
		path := `$."` + c.Key + `"`
		probes := model.AttributeProbes(c.Key, c.Value)
		alts, cargs := make([]string, len(probes)), []any{path}
		for i, p := range probes {
			alts[i] = "? -> ?"
			cargs = append(cargs, string(p), path)
		}
		conds, args = append(conds, "(attributes -> ?) IN ("+strings.Join(alts, ", ")+")"), append(args, cargs...)
	}
	for _, k := range f.HasAttributes {
		conds, args = append(conds, "(attributes -> ?) IS NOT NULL"), append(args, `$."`+k+`"`)
	}
	if f.CreatedAfter != nil {
		conds, args = append(conds, "created_at > ?"), append(args, f.CreatedAfter.UTC())
	}
	if f.CreatedBefore != nil {
		conds, args = append(conds, "created_at < ?"), append(args, f.CreatedBefore.UTC())
	}
	return strings.Join(conds, " AND "), args
}

// importBatch applies the batch in a few statements of the caller's immediate transaction: the
// counts, the invalid rows' errors, and the subscribers' insert (stagedSuppressedSQLite, ids
// made in SQL as uuidV7SQLite), whose created rows come back to make their events with
// model.NewEvent and, for pending ones, their confirmation emails.
func (e *sqliteEngine) importBatch(ctx context.Context, tx bun.IDB, b importBatch) (batchCounts, bool, error) {
	var c batchCounts
	if err := tx.NewRaw(`SELECT count(*) AS processed,
    coalesce(sum(errors IS NOT NULL), 0) AS invalid,
    coalesce(sum(errors IS NULL AND `+stagedSuppressedSQLite+`), 0) AS suppressed
FROM import_rows AS r WHERE r.import_id = ?0 AND r.row_no > ?2 AND r.row_no <= ?3`,
		b.Import, b.Newsletter, b.After, b.Last).Scan(ctx, &c); err != nil {
		return c, false, err
	}
	if _, err := tx.NewRaw(`INSERT INTO import_errors (import_id, row_no, errors)
SELECT import_id, row_no, errors FROM import_rows
WHERE import_id = ?0 AND row_no > ?1 AND row_no <= ?2 AND errors IS NOT NULL`, b.Import, b.After, b.Last).Exec(ctx); err != nil {
		return c, false, err
	}
	ms := b.Now.UnixMilli()
	var created []subscriberValues // no updated_at: the events do not show it
	if err := tx.NewRaw(`INSERT INTO subscribers (id, newsletter_id, email, email_key, first_name, last_name, status, created_at, updated_at,
    attributes, tags)
SELECT `+uuidV7SQLite+`, ?1, email, email_key, first_name, last_name, status, ?5, ?5,
    coalesce(json_extract(r.extra, '$.attributes'), '{}'), coalesce(json_extract(r.extra, '$.tags'), '[]')
FROM import_rows AS r
WHERE r.import_id = ?0 AND r.row_no > ?2 AND r.row_no <= ?3 AND r.errors IS NULL AND NOT r.duplicate
    AND NOT `+stagedSuppressedSQLite+`
ON CONFLICT (newsletter_id, email_key) DO NOTHING
RETURNING id, newsletter_id, email, first_name, last_name, status, created_at, attributes, tags`,
		b.Import, b.Newsletter, b.After, b.Last, fmt.Sprintf("%08x-%04x-7", ms>>16, ms&0xffff), b.Now).
		Scan(ctx, &created); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return c, false, err
	}
	c.Created = int64(len(created))
	evs := make([]eventRow, len(created))
	for i, r := range created {
		sub := r.model()
		ev := model.NewEvent(model.EventCreated, sub, nil, b.Source, b.Now)
		evs[i] = eventRow{ID: ev.ID, NewsletterID: ev.NewsletterID, SubscriberID: ev.SubscriberID, Type: string(ev.Type),
			Payload: string(ev.Payload), Traceparent: b.Traceparent, CreatedAt: ev.Timestamp}
		if r.Status != string(model.StatusPending) {
			continue
		}
		c.Pending++
		if _, err := e.exec(ctx, tx, insertBulkConfirmationSQLite, uuid.Must(uuid.NewV7()), r.NewsletterID, r.ID, b.Now, b.Traceparent); err != nil {
			return c, false, err
		}
	}
	if len(evs) == 0 {
		return c, false, nil
	}
	delivering, err := e.insertEvents(ctx, tx, evs, outbox.Bulk)
	return c, delivering, err
}

// insertBulkConfirmationSQLite is insertConfirmationSQLite in the bulk lane (outbox.Bulk).
var insertBulkConfirmationSQLite = newStatement("INSERT", "email_outbox",
	`INSERT INTO email_outbox (id, newsletter_id, subscriber_id, kind, lane, state, attempts, next_attempt_at, last_error,
    traceparent, created_at, updated_at)
VALUES ($1, $2, $3, '`+model.EmailKindConfirmation+`', `+strconv.Itoa(int(outbox.Bulk))+`, 'pending', 0, $4, '', $5, $4, $4)`)

// stagedSuppressedSQLite is the condition that the staged row r's address is on the
// suppression list of the newsletter ?1, by either of its hashes (model.EmailHashes).
const stagedSuppressedSQLite = `EXISTS (SELECT 1 FROM suppressions AS x WHERE x.newsletter_id = ?1 AND x.email_hash IN (r.email_hash, r.legacy_hash))`

// uuidV7SQLite is a UUID version 7 in SQL, as uuid.NewV7 makes them: ?4 its time part, the
// text "tttttttt-tttt-7" of the batch's millisecond, then random bits and the variant.
const uuidV7SQLite = `?4 || substr(lower(hex(randomblob(2))), 2, 3) || '-' || substr('89ab', 1 + (random() & 3), 1) ||
    substr(lower(hex(randomblob(2))), 2, 3) || '-' || lower(hex(randomblob(6)))`

// stageBulk stages the targets in one INSERT … SELECT: the filter's matches by filterSQLite,
// the list's WHERE clause, or the given ids that the newsletter has.
func (*sqliteEngine) stageBulk(ctx context.Context, tx bun.IDB, id, nl uuid.UUID, target model.BulkTarget) (int64, error) {
	const head = `INSERT INTO bulk_action_targets (action_id, n, subscriber_id)
SELECT ?, row_number() OVER (ORDER BY id), id FROM subscribers WHERE `
	var (
		where string
		args  []any
	)
	if target.Filter != nil {
		where, args = filterSQLite(nl, model.ListQuery{Filter: *target.Filter})
	} else {
		ids := make([]string, len(target.IDs))
		for i, x := range target.IDs {
			ids[i] = x.String()
		}
		list, _ := json.Marshal(ids) // strings
		where, args = "newsletter_id = ? AND id IN (SELECT value FROM json_each(?))", []any{nl, string(list)}
	}
	res, err := tx.NewRaw(head+where, append([]any{id}, args...)...).Exec(ctx)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// bulkBatch reads the batch's subscribers, decides each change with the single operation's
// own rule (model.TagsChange.Apply, model.MergeAttributes, the unsubscribe's status test),
// writes the changed ones with events made by model.NewEventOf, and removes the targets, in
// the caller's immediate transaction.
func (e *sqliteEngine) bulkBatch(ctx context.Context, tx bun.IDB, b bulkBatch) (bulkCounts, bool, error) {
	var c bulkCounts
	if err := tx.NewRaw(`SELECT count(*) AS processed FROM bulk_action_targets WHERE action_id = ? AND n > ? AND n <= ?`,
		b.Action, b.After, b.Last).Scan(ctx, &c); err != nil {
		return c, false, err
	}
	var subs []subscriberValues // no updated_at: the events do not show it
	if err := tx.NewRaw(`SELECT s.id, s.newsletter_id, s.email, s.first_name, s.last_name, s.status, s.created_at, s.attributes, s.tags
FROM bulk_action_targets AS t JOIN subscribers AS s ON s.id = t.subscriber_id AND s.newsletter_id = ?
WHERE t.action_id = ? AND t.n > ? AND t.n <= ?
ORDER BY s.id`, b.Newsletter, b.Action, b.After, b.Last).Scan(ctx, &subs); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return c, false, err
	}
	var (
		evs     []eventRow
		retired []string
	)
	for _, r := range subs {
		sub := r.model()
		attrs, tags := sub.Attributes, sub.Tags
		var (
			prev        map[string]any
			set         string
			value       any
			evType      = model.EventUpdated
			ch          = b.Change
			changedThis bool
		)
		switch ch.Action {
		case model.ActionAddTags, model.ActionRemoveTags:
			after, changed, verr := ch.TagsChange().Apply(tags)
			if verr == nil && changed {
				changedThis, prev, set, value = true, map[string]any{"tags": tags}, "tags", tagsJSON(after)
				sub.Tags = after
			}
		case model.ActionSetAttributes:
			after, p, verr := model.MergeAttributes(attrs, ch.Attributes, "attributes")
			if verr == nil && len(p) > 0 {
				changedThis, prev, set, value = true, map[string]any{"attributes": p}, "attributes", string(after.JSON())
				sub.Attributes = after
			}
		case model.ActionUnsubscribe:
			if sub.Status != model.StatusUnsubscribed {
				changedThis, prev, set, value = true, map[string]any{"status": string(sub.Status)}, "status", string(model.StatusUnsubscribed)
				sub.Status, evType = model.StatusUnsubscribed, model.EventUnsubscribed
				retired = append(retired, r.ID.String())
			}
		}
		if !changedThis {
			continue
		}
		if _, err := tx.NewRaw(`UPDATE subscribers SET `+set+` = ?, updated_at = ? WHERE id = ?`, value, b.Now, r.ID).Exec(ctx); err != nil {
			return c, false, err
		}
		c.Changed++
		ev := model.NewEventOf(evType, sub, prev, b.Source, b.Now)
		evs = append(evs, eventRow{ID: ev.ID, NewsletterID: ev.NewsletterID, SubscriberID: ev.SubscriberID, Type: string(ev.Type),
			Payload: string(ev.Payload), Traceparent: b.Traceparent, CreatedAt: ev.Timestamp})
	}
	if len(retired) > 0 {
		list, _ := json.Marshal(retired) // strings
		if _, err := tx.NewRaw(`UPDATE email_outbox SET state = 'cancelled', updated_at = ?
WHERE subscriber_id IN (SELECT value FROM json_each(?)) AND state = 'pending'`, b.Now, string(list)).Exec(ctx); err != nil {
			return c, false, err
		}
		if _, err := tx.NewRaw(`UPDATE confirmation_tokens SET retired_at = ?
WHERE subscriber_id IN (SELECT value FROM json_each(?)) AND retired_at IS NULL`, b.Now, string(list)).Exec(ctx); err != nil {
			return c, false, err
		}
	}
	if _, err := tx.NewRaw(`DELETE FROM bulk_action_targets WHERE action_id = ? AND n > ? AND n <= ?`,
		b.Action, b.After, b.Last).Exec(ctx); err != nil {
		return c, false, err
	}
	if len(evs) == 0 {
		return c, false, nil
	}
	delivering, err := e.insertEvents(ctx, tx, evs, outbox.Bulk)
	return c, delivering, err
}

func (*sqliteEngine) countMatching(ctx context.Context, db bun.IDB, nl uuid.UUID, f model.Filter) (int64, error) {
	where, args := filterSQLite(nl, model.ListQuery{Filter: f})
	var n int64
	err := db.NewRaw("SELECT count(*) FROM subscribers WHERE "+where, args...).Scan(ctx, &n)
	return n, err
}
