// Package repo is subscriberd's persistence through bun, on PostgreSQL (production) or an
// embedded SQLite file (zero-setup): row types, queries, transactions, and the translation of
// driver errors into model errors. Everything that differs between the two engines stays in
// this package (see sqlite.go); callers see the same behaviour on both.
package repo

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/driver/pgdriver"
	"github.com/uptrace/bun/migrate"

	"github.com/subscriberd/subscriberd/migrations"
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
}

// DefaultStatementTimeout bounds every statement on the server side, below the HTTP server's
// write timeout and the shutdown grace.
const DefaultStatementTimeout = 25 * time.Second

// Open returns a pool for dsn: a PostgreSQL URL (postgres://, postgresql://) or an SQLite one
// (sqlite:///abs/path.db, sqlite://relative/path.db; see SQLitePath). It does not connect yet.
func Open(dsn string, opts Options) (db *bun.DB, err error) {
	if IsSQLite(dsn) {
		return openSQLite(dsn, opts)
	}
	return openPostgres(dsn, opts)
}

func openPostgres(dsn string, opts Options) (db *bun.DB, err error) {
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
	db = bun.NewDB(sqldb, pgdialect.New()).WithQueryHook(hook)
	registerPreparer(db, hook)
	return db, nil
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
func maintenanceDB(dsn string) (name string, maint *bun.DB, err error) {
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

func pgDatabaseExists(ctx context.Context, maint *bun.DB, name string) (bool, error) {
	var exists bool
	if err := maint.NewRaw("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = ?)", name).Scan(ctx, &exists); err != nil {
		return false, translate(err)
	}
	return exists, nil
}

func migrator(db *bun.DB) (*migrate.Migrator, error) {
	ms, err := migrationSet(db)
	if err != nil {
		return nil, err
	}
	return migrate.NewMigrator(db, ms, migrate.WithMarkAppliedOnSuccess(true)), nil
}

// migrationSet is the migrations of db's store.
func migrationSet(db *bun.DB) (*migrate.Migrations, error) {
	if isSQLite(db) {
		return migrations.SQLite()
	}
	return migrations.Postgres()
}

// Migrate applies every pending migration, holding bun's migration lock so that several
// instances starting at once apply each migration once. It returns the names applied.
func Migrate(ctx context.Context, db *bun.DB) ([]string, error) {
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
	defer m.Unlock(context.WithoutCancel(ctx)) //nolint:errcheck // best effort; the lock row is removed
	group, err := m.Migrate(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", translate(err))
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
func PendingMigrations(ctx context.Context, db *bun.DB) (int, error) {
	m, err := migrator(db)
	if err != nil {
		return 0, err
	}
	ms, err := m.MigrationsWithStatus(ctx)
	if err != nil {
		// A database nobody migrated has no table of applied migrations: all are pending.
		var exists bool
		q := "SELECT to_regclass('bun_migrations') IS NOT NULL"
		if isSQLite(db) {
			q = "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'bun_migrations'"
		}
		if xerr := db.NewRaw(q).Scan(ctx, &exists); xerr == nil && !exists {
			set, serr := migrationSet(db)
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
			code == "53300", // too many connections
			code == "57014", // statement timeout: cancelled and rolled back by the server
			code == "3D000": // database does not exist
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

// store is what every store type holds: the pool, whether it is the embedded SQLite store
// (which picks the SQL where the dialects differ), the pool's prepared statements on
// PostgreSQL (prepared.go), and the service's clock, in UTC.
type store struct {
	db     *bun.DB
	sqlite bool
	pg     *preparedStatements // nil on SQLite
	now    func() time.Time
}

func newStore(db *bun.DB) store {
	return store{db: db, sqlite: isSQLite(db), pg: preparerOf(db), now: func() time.Time { return time.Now().UTC() }}
}
