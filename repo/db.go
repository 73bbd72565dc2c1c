// Package repo is subscriberd's persistence through bun, on PostgreSQL (production) or an
// embedded SQLite file (zero-setup): row types, queries, transactions, and the translation of
// driver errors into model errors. Everything that differs between the two engines stays
// behind one seam, the engine interface, with one file per engine (pg.go, sqlite.go); callers
// see the same behaviour on both, and no other file asks which engine runs.
//
// The files, by job:
//
//   - db.go: the database (Open, EnsureDatabase, DB), the store every store embeds,
//     migrations, the secrets every instance shares (Secret), and the translation of driver
//     errors.
//   - tx.go: units of work: DB.InTx and the Tx it hands the stores out through; Idempotency,
//     the unit of work of a write under an Idempotency-Key and the response it stores with its
//     change; and running a unit of work, or one statement atomically, again after a deadlock
//     or a busy database.
//   - engine.go: the seam: the engine interface, and what crosses it or both engines share,
//     among them statement, a statement written once for both engines.
//   - pg.go, sqlite.go: the engines, one each: opening the pool, running statements (prepared
//     once per connection on PostgreSQL), and the statements and locks that differ. They name
//     nothing of the stores (TestSeamRunsOneWay). Package pgconn holds the PostgreSQL
//     connections that stop a statement when its context ends.
//   - tracing.go: a span per statement.
//   - The stores, one file each: subscribers.go (Subscribers), events.go (the event log:
//     recording events, Events), outbox.go (Outbox: the confirmation emails' outbox),
//     webhooks.go (Webhooks: endpoints; Deliveries: their outbox), tokens.go (Confirmations:
//     confirm and decline links), imports.go (Imports), suppressions.go (Suppressions),
//     privacy.go (Privacy: export and erasure), keys.go (Accounts: newsletters and API keys),
//     segments.go (Segments: saved filters), bulkactions.go (BulkActions: bulk actions and
//     their staged targets), with jobs.go, the claim and lease that imports and bulk actions
//     share; and
//     rekey.go, the re-key of stored addresses to the 1.3 rule (Rekey, run by Migrate).
//
// A store embeds store: its statements run on s.idb (the pool, or the transaction of the unit
// of work it came from: DB.InTx hands out stores through Tx), a write of several statements
// runs in s.inTx (its unit's transaction, or a new one with retries), queued work wakes its
// workers through s.queued, and whatever differs between the engines is a call of s.db.eng,
// with plain values. A store writes a statement once for both engines: a locking one through
// s.db.eng.raw, a hot one as a statement (engine.go) through s.db.eng.queryRow. A new store
// gets a constructor New…(db *DB) and, when units of work use it, a Tx method.
package repo

import (
	"context"
	"crypto/rand"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/driver/pgdriver"
	"github.com/uptrace/bun/migrate"

	"github.com/subscriberd/subscriberd/model"
)

// Options tune the connection pool.
type Options struct {
	// MaxConns bounds open (and idle) connections. Zero means 16 (8 on SQLite).
	MaxConns int
	// StatementTimeout is how long the server lets one statement run before cancelling it
	// (and rolling it back). Zero means DefaultStatementTimeout. PostgreSQL only: on SQLite,
	// waits are bounded by the busy timeout and statements run in process.
	StatementTimeout time.Duration
	// LockTimeout is how long a statement waits for a lock (a row another transaction
	// changed, an advisory lock) before it fails with model.ErrUnavailable. Zero means
	// DefaultLockTimeout. PostgreSQL only, as StatementTimeout.
	LockTimeout time.Duration
}

// DefaultStatementTimeout bounds every statement on the server side, below the HTTP server's
// write timeout and the shutdown grace.
const DefaultStatementTimeout = 25 * time.Second

// DefaultLockTimeout bounds a statement's wait for a lock: far above the milliseconds a
// request's transaction holds its row locks, far below the statement timeout, so that a
// transaction left open on a row costs the writes that want it 503s after a few seconds and
// holds no connection longer.
const DefaultLockTimeout = 5 * time.Second

// DB is the database: the pool (bun's, embedded, for statements of callers' own), its engine
// (PostgreSQL or SQLite, the only place that knows which) and what the engine keeps per pool:
// the prepared statements on PostgreSQL, the workers' wakers on SQLite. Every store takes one;
// nothing about a database is kept outside it.
type DB struct {
	*bun.DB
	eng  engine
	hook *queryHook // the spans of its statements, bun's and prepared ones alike
}

// Open returns a pool for dsn: a PostgreSQL URL (postgres://, postgresql://) or an SQLite one
// (sqlite:///abs/path.db, sqlite://relative/path.db; see SQLitePath). It does not connect yet.
func Open(dsn string, opts Options) (*DB, error) {
	if IsSQLite(dsn) {
		return openSQLite(dsn, opts)
	}
	return openPostgres(dsn, opts)
}

// EnsureDatabase creates the database named in dsn when it does not exist yet, connecting to
// the server's "postgres" maintenance database, and reports whether it did. It does nothing
// when the database exists. For SQLite it creates the file's directory and the file, readable
// by its owner only.
func EnsureDatabase(ctx context.Context, dsn string) (created bool, err error) {
	if IsSQLite(dsn) {
		return ensureSQLiteFile(dsn)
	}
	name, maint, err := maintenanceDB(dsn)
	if err != nil || name == "" {
		return false, err
	}
	defer maint.Close()
	exists, err := pgDatabaseExists(ctx, maint, name)
	if err != nil || exists {
		return false, err
	}
	// UTF8 whatever the cluster's default, so any email or name can be stored.
	create := `CREATE DATABASE "` + strings.ReplaceAll(name, `"`, `""`) + `" ENCODING 'UTF8' TEMPLATE template0`
	if _, err := maint.ExecContext(ctx, create); err != nil {
		var pgErr pgdriver.Error
		if errors.As(err, &pgErr) && pgErr.Field('C') == "42P04" { // created meanwhile
			return false, nil
		}
		return false, fmt.Errorf("create database %q: %w", name, err)
	}
	return true, nil
}

// DatabaseExists reports whether the database of dsn exists, without creating anything: for
// SQLite whether the file exists, for PostgreSQL whether the server has the database.
func DatabaseExists(ctx context.Context, dsn string) (bool, error) {
	if IsSQLite(dsn) {
		return sqliteFileExists(dsn)
	}
	name, maint, err := maintenanceDB(dsn)
	if err != nil {
		return false, err
	}
	if name == "" {
		return true, nil // the maintenance database
	}
	defer maint.Close()
	return pgDatabaseExists(ctx, maint, name)
}

// maintenanceDB opens the "postgres" database of the server of dsn and returns the name of the
// database dsn names; name is "" (and nothing is opened) when dsn names the maintenance
// database itself or none.
func maintenanceDB(dsn string) (name string, maint *DB, err error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", nil, fmt.Errorf("invalid PostgreSQL URL: %w", err)
	}
	name = strings.TrimPrefix(u.Path, "/")
	if name == "" || name == "postgres" {
		return "", nil, nil
	}
	m := *u
	m.Path = "/postgres"
	maint, err = Open(m.String(), Options{MaxConns: 1})
	if err != nil {
		return "", nil, err
	}
	return name, maint, nil
}

func pgDatabaseExists(ctx context.Context, maint *DB, name string) (bool, error) {
	var exists bool
	if err := maint.NewRaw("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = ?)", name).Scan(ctx, &exists); err != nil {
		return false, translate(err)
	}
	return exists, nil
}

func migrator(db *DB) (*migrate.Migrator, error) {
	ms, err := db.eng.migrations()
	if err != nil {
		return nil, err
	}
	return migrate.NewMigrator(db.DB, ms, migrate.WithMarkAppliedOnSuccess(true)), nil
}

// Migrate applies every pending migration, holding bun's migration lock so that several
// instances starting at once apply each migration once, and then re-keys what needs it
// (Rekey: what a 1.2 instance wrote). It returns the names applied.
func Migrate(ctx context.Context, db *DB) ([]string, error) {
	m, err := migrator(db)
	if err != nil {
		return nil, err
	}
	if err := m.Init(ctx); err != nil {
		return nil, fmt.Errorf("init migrations: %w", translate(err))
	}
	if err := lockMigrations(ctx, m); err != nil {
		return nil, err
	}
	defer func() {
		// The lock row must go even when ctx ended meanwhile (else the next start waits for
		// it): the unlock runs under a deadline of its own.
		uctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		m.Unlock(uctx) //nolint:errcheck // best effort; the lock row is removed
	}()
	group, err := m.Migrate(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", translate(err))
	}
	if _, err := Rekey(ctx, db); err != nil {
		return nil, err
	}
	var names []string
	for _, mg := range group.Migrations {
		names = append(names, mg.Name)
	}
	return names, nil
}

// lockMigrations takes bun's migration lock, waiting while another instance holds it.
func lockMigrations(ctx context.Context, m *migrate.Migrator) error {
	for {
		err := m.Lock(ctx)
		if err == nil {
			return nil
		}
		if !strings.Contains(err.Error(), "migrations table is already locked") {
			return fmt.Errorf("lock migrations: %w", translate(err))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// PendingMigrations reports how many migrations are not applied yet.
func PendingMigrations(ctx context.Context, db *DB) (int, error) {
	m, err := migrator(db)
	if err != nil {
		return 0, err
	}
	ms, err := m.MigrationsWithStatus(ctx)
	if err != nil {
		// A database nobody migrated has no table of applied migrations: all are pending.
		var exists bool
		if xerr := db.NewRaw(db.eng.migrationsTableExists()).Scan(ctx, &exists); xerr == nil && !exists {
			set, serr := db.eng.migrations()
			if serr != nil {
				return 0, serr
			}
			return len(set.Sorted()), nil
		}
		return 0, translate(err)
	}
	return len(ms.Unapplied()), nil
}

// translate maps driver errors onto model errors by SQLSTATE and kind, never by message
// (SQLite's by result code and, for unique violations, the columns it names).
func translate(err error) error {
	if err == nil {
		return nil
	}
	if e, ok := asSQLiteError(err); ok {
		return translateSQLite(err, e)
	}
	var pgErr pgdriver.Error
	if errors.As(err, &pgErr) {
		code := pgErr.Field('C')
		switch {
		case code == "23505" && pgErr.Field('n') == "subscribers_newsletter_email_key":
			return fmt.Errorf("%w", model.ErrEmailTaken)
		case strings.HasPrefix(code, "08"), // connection exception
			code == "57P01", code == "57P02", code == "57P03", // shutdown, crash, cannot connect now
			strings.HasPrefix(code, "53"), // insufficient resources: out of shared memory (53200, the lock table), too many connections (53300), disk full, memory
			code == "57014",               // statement timeout: cancelled and rolled back by the server
			code == "55P03",               // lock timeout: the statement (and its transaction) rolled back
			code == "3D000":               // database does not exist
			return fmt.Errorf("%w: %v", model.ErrUnavailable, err)
		}
		return err
	}
	var netErr net.Error
	switch {
	case errors.As(err, &netErr),
		errors.Is(err, driver.ErrBadConn),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %v", model.ErrUnavailable, err)
	}
	return err
}

// sqlState is the SQLSTATE of a server error, or "".
func sqlState(err error) string {
	var pgErr pgdriver.Error
	if errors.As(err, &pgErr) {
		return pgErr.Field('C')
	}
	return ""
}

// store is what every store type holds: the database, where its statements run (the pool, or
// the transaction of the unit of work it is bound to, see Tx), that unit of work (nil when
// bound to the pool), and the service's clock, in UTC.
type store struct {
	db   *DB
	idb  bun.IDB
	unit *unit
	now  func() time.Time
}

func newStore(db *DB) store { return store{db: db, idb: db.DB, now: utcNow} }

func utcNow() time.Time { return time.Now().UTC() }

// inTx runs fn, a unit of work of the store's own, in a transaction: the one the store is bound
// to (whose InTx retries the whole of it), or a new one on the pool, run again on a deadlock,
// a serialization failure or a busy SQLite database (see retry). Nothing may be answered to a
// client from inside fn.
func (s *store) inTx(ctx context.Context, fn func(ctx context.Context, tx bun.IDB) error) error {
	return runInTx(ctx, s.idb, fn)
}

// atomic runs fn, one statement that takes effect whole or not at all, on the store's
// connection: in its unit of work as it is, or on the pool, run again after a deadlock or
// a busy database (see runAtomic).
func (s *store) atomic(ctx context.Context, fn func(ctx context.Context) error) error {
	return runAtomic(ctx, s.idb, fn)
}

// queued wakes the workers of queue (on SQLite; see engine.wake) after a commit that queued
// into it: at once for a store on the pool, after the unit of work's commit for one bound to it.
func (s *store) queued(queue string) {
	if s.unit != nil {
		s.unit.queued(queue)
		return
	}
	s.db.eng.wake(queue)
}

// deliveriesQueued wakes the webhook workers after a commit that queued deliveries, when it
// did (see store.queued).
func (s *store) deliveriesQueued(queued bool) {
	if queued {
		s.queued(webhookQueue)
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
