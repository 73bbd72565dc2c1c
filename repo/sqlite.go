package repo

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect"
	"github.com/uptrace/bun/dialect/sqlitedialect"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/subscriberd/subscriberd/model"
)

// This file holds what the embedded SQLite store does differently from PostgreSQL. The stores
// keep one code path each where the SQL must differ (a field set at construction chooses);
// everything else is shared.
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
func openSQLite(dsn string, opts Options) (*bun.DB, error) {
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
	return bun.NewDB(sqldb, sqlitedialect.New()).WithQueryHook(newQueryHook(dsn, "sqlite")), nil
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

// isSQLite tells whether db is the SQLite store.
func isSQLite(db bun.IDB) bool { return db.Dialect().Name() == dialect.SQLite }

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
		// The chain keeps the driver's error so runInTx can tell a busy database.
		return fmt.Errorf("%w: %w", model.ErrUnavailable, err)
	}
	return err
}

// isBusy tells whether err is SQLite's "database is busy or locked".
func isBusy(err error) bool {
	e, ok := asSQLiteError(err)
	return ok && (e.Code()&0xff == sqlite3.SQLITE_BUSY || e.Code()&0xff == sqlite3.SQLITE_LOCKED)
}

// wakers wake the workers at once on SQLite: per database and queue (emails, webhook
// deliveries), the channels of its Listen calls, signalled after a commit that queued into it.
// An SQLite file has one writer process, so every insert happens in this process. On
// PostgreSQL, whose writers may be other instances, the workers poll.
var wakers sync.Map // wakerKey → *waker

// wakerKey names one queue of one database.
type wakerKey struct {
	db    *bun.DB
	queue string
}

// The queues with wakers.
const (
	emailQueue   = "email"
	webhookQueue = "webhook"
)

type waker struct {
	mu    sync.Mutex
	chans map[chan struct{}]struct{}
}

func wakerOf(db *bun.DB, queue string) *waker {
	w, _ := wakers.LoadOrStore(wakerKey{db, queue}, &waker{chans: map[chan struct{}]struct{}{}})
	return w.(*waker)
}

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

// queueSignals returns a channel signalled (coalesced) after each commit of this process that
// queued into db's queue, until ctx ends, on SQLite; nil on PostgreSQL, whose workers poll: a
// NOTIFY serialises the commits of the transactions that send it and wakes every instance.
func queueSignals(ctx context.Context, db *bun.DB, queue string) <-chan struct{} {
	if !isSQLite(db) {
		return nil
	}
	return wakerOf(db, queue).listen(ctx)
}

// wake signals the listeners of db's queue (SQLite) after a commit that queued into it.
func wake(db *bun.DB, queue string) {
	if !isSQLite(db) {
		return
	}
	if w, ok := wakers.Load(wakerKey{db, queue}); ok { // nobody listens on a queue without an entry
		w.(*waker).notify()
	}
}

// emailsQueued wakes the email workers of db after a commit that queued emails.
func emailsQueued(db *bun.DB) { wake(db, emailQueue) }

// deliveriesQueued wakes the webhook workers of db after a commit that queued deliveries, when
// it did. On PostgreSQL the workers poll.
func deliveriesQueued(db *bun.DB, queued bool) {
	if queued {
		wake(db, webhookQueue)
	}
}

// forUpdate is the row-locking clause of a SELECT in a write transaction: " FOR UPDATE" on
// PostgreSQL, nothing on SQLite, whose immediate transaction already holds the write lock.
func forUpdate(sqlite bool) string {
	if sqlite {
		return ""
	}
	return " FOR UPDATE"
}

// forNoKeyUpdate is the lock of a row about to be updated without changing its key: " FOR NO
// KEY UPDATE" on PostgreSQL, which does not wait for (or block) the key-share locks of rows
// that reference it being inserted; nothing on SQLite.
func forNoKeyUpdate(sqlite bool) string {
	if sqlite {
		return ""
	}
	return " FOR NO KEY UPDATE"
}

// forShare is the lock of a row read to keep it from changing until the transaction ends:
// " FOR SHARE" on PostgreSQL, nothing on SQLite, whose immediate transaction holds the write
// lock already.
func forShare(sqlite bool) string {
	if sqlite {
		return ""
	}
	return " FOR SHARE"
}

// bytesContain is the condition that the bytes of column col contain those of the one
// parameter: position on PostgreSQL's bytea, instr on SQLite's blob.
func bytesContain(sqlite bool, col string) string {
	if sqlite {
		return "instr(" + col + ", ?) > 0"
	}
	return "position(? IN " + col + ") > 0"
}
