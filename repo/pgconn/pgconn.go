// Package pgconn makes every PostgreSQL statement of the store's pool safe to run under its
// caller's context (habit 17): pgdriver's connector, wrapped, hands database/sql connections
// that stop a statement whose context ends and are never used again after a read or write was
// cut short. Package repo's PostgreSQL engine (pg.go) is its one user.
//
// The gap in pgdriver (v1.2.18), as it could be reported upstream:
//
//	pgdriver: a prepared statement cut short leaves its connection in the pool
//
//	Conn.ExecContext and Conn.QueryContext pass their errors through checkBadConn, which
//	closes the connection on a network or timeout error, so that database/sql drops it
//	(Conn.IsValid). The extended-protocol paths do not: PrepareContext,
//	stmt.ExecContext and stmt.QueryContext return such an error with the connection open
//	and valid. A read that times out (a context deadline) before the server's answer leaves
//	that answer unread on a connection that goes back to the pool, and the next statement
//	there reads it as its own: a SELECT returns another statement's rows. Passing those
//	errors through checkBadConn, as the simple-protocol paths do, fixes it.
//
//	Separately, only a context's deadline bounds a read (Conn.deadline sets the socket's
//	deadline from it); a context cancelled without a deadline (an HTTP client that hung up)
//	does not stop a statement waiting on a lock. Other drivers watch ctx.Done() while a
//	statement runs and interrupt the read (and send a CancelRequest).
//
// pgConn closes both gaps from outside, through the driver's exported API only: while a
// statement runs it watches its context and, when the context ends, closes the connection,
// which ends the read at once; any error that is not the server's answer (a network error, a
// timeout, a protocol error: anything but a pgdriver.Error short of FATAL) marks the
// connection broken and closes it. A broken connection reports IsValid() == false and
// ResetSession fails with driver.ErrBadConn, so database/sql drops it rather than pooling it,
// and nothing is read from it again. The server notices the closed connection when it next
// writes to it, or within client_connection_check_interval while a statement runs (repo's
// openPostgres sets it), and ends the statement.
package pgconn

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/driver/pgdriver"
)

// Wrap returns pgdriver's connector inner with its connections wrapped (see the package note),
// for sql.OpenDB.
func Wrap(inner *pgdriver.Connector) driver.Connector { return connector{inner: inner} }

// connector is pgdriver's connector, its connections wrapped in pgConn.
type connector struct {
	inner *pgdriver.Connector
}

func (c connector) Connect(ctx context.Context) (driver.Conn, error) {
	cn, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, withContextErr(ctx, err)
	}
	return &pgConn{cn: cn.(*pgdriver.Conn)}, nil
}

func (c connector) Driver() driver.Driver { return c.inner.Driver() }

// pgConn is one pgdriver connection that is dropped once a statement on it was cut short
// (see the note above). It implements what pgdriver's Conn implements, no more.
type pgConn struct {
	cn     *pgdriver.Conn
	broken atomic.Bool
}

var (
	_ driver.Conn               = (*pgConn)(nil)
	_ driver.ConnPrepareContext = (*pgConn)(nil)
	_ driver.ConnBeginTx        = (*pgConn)(nil)
	_ driver.ExecerContext      = (*pgConn)(nil)
	_ driver.QueryerContext     = (*pgConn)(nil)
	_ driver.Pinger             = (*pgConn)(nil)
	_ driver.Validator          = (*pgConn)(nil)
	_ driver.SessionResetter    = (*pgConn)(nil)
)

// breakConn marks the connection broken and closes it: its socket's read, if one is under way,
// ends at once.
func (c *pgConn) breakConn() {
	c.broken.Store(true)
	c.cn.Close() //nolint:errcheck // the connection is given up either way
}

// watch closes the connection when ctx ends before the returned stop is called; stop reports
// whether it did not (false: ctx ended and the connection is gone).
func (c *pgConn) watch(ctx context.Context) (stop func() bool) {
	if ctx.Err() != nil {
		// Ended already: the call fails at once (pgdriver's socket deadline is in the past,
		// or the watch closes the connection), and the connection is given up.
		c.broken.Store(true)
	}
	if ctx.Done() == nil {
		return func() bool { return true }
	}
	stopWatch := context.AfterFunc(ctx, c.breakConn)
	return func() bool {
		if stopWatch() {
			return true
		}
		// breakConn runs, or is about to, in its own goroutine: the connection must not go
		// back to the pool before it has.
		c.broken.Store(true)
		return false
	}
}

// check marks the connection broken after err, unless err is the server's answer: after one
// of those the driver has read the whole reply and the connection is in step. It returns err,
// or ctx's error wrapping it when the statement ended because ctx did.
func (c *pgConn) check(ctx context.Context, stopped bool, err error) error {
	if err == nil {
		return nil
	}
	var pgErr pgdriver.Error
	if !errors.As(err, &pgErr) || pgErr.Field('V') == "FATAL" || pgErr.Field('V') == "PANIC" {
		c.breakConn()
	}
	if !stopped {
		return fmt.Errorf("%w (%w)", context.Cause(ctx), err)
	}
	return withContextErr(ctx, err)
}

// withContextErr is err, which ended a statement or a connection's start, wrapped in ctx's
// error when ctx has ended: the caller then sees why, whatever the socket said.
func withContextErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%w)", context.Cause(ctx), err)
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		// pgdriver's own socket deadline, which is ctx's, fired before ctx's timer did.
		return fmt.Errorf("%w (%w)", context.DeadlineExceeded, err)
	}
	return err
}

func (c *pgConn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

func (c *pgConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	stop := c.watch(ctx)
	st, err := c.cn.PrepareContext(ctx, query)
	if err = c.check(ctx, stop(), err); err != nil {
		return nil, err
	}
	return &pgStmt{c: c, st: st}, nil
}

func (c *pgConn) Close() error { return c.cn.Close() }

func (c *pgConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *pgConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	stop := c.watch(ctx)
	tx, err := c.cn.BeginTx(ctx, opts)
	if err = c.check(ctx, stop(), err); err != nil {
		return nil, err
	}
	return tx, nil
}

func (c *pgConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	stop := c.watch(ctx)
	res, err := c.cn.ExecContext(ctx, query, args)
	if err = c.check(ctx, stop(), err); err != nil {
		return nil, err
	}
	return res, nil
}

func (c *pgConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	stop := c.watch(ctx)
	rows, err := c.cn.QueryContext(ctx, query, args)
	if err != nil {
		return nil, c.check(ctx, stop(), err)
	}
	return &pgRows{Rows: rows, c: c, ctx: ctx, stop: stop}, nil
}

func (c *pgConn) Ping(ctx context.Context) error {
	stop := c.watch(ctx)
	err := c.cn.Ping(ctx)
	return c.check(ctx, stop(), err)
}

// IsValid is false once the connection is broken: database/sql then closes it instead of
// returning it to the pool.
func (c *pgConn) IsValid() bool { return !c.broken.Load() && c.cn.IsValid() }

func (c *pgConn) ResetSession(ctx context.Context) error {
	if c.broken.Load() {
		return driver.ErrBadConn
	}
	return c.cn.ResetSession(ctx)
}

// pgStmt is a statement prepared on a pgConn: its runs are watched as the connection's own
// statements are.
type pgStmt struct {
	c  *pgConn
	st driver.Stmt
}

var (
	_ driver.StmtExecContext  = (*pgStmt)(nil)
	_ driver.StmtQueryContext = (*pgStmt)(nil)
)

// Close closes the statement on the server, unless the connection is broken (closing it
// there would only fail, and the server forgets it with the connection).
func (s *pgStmt) Close() error {
	if s.c.broken.Load() {
		return nil
	}
	return s.st.Close()
}

func (s *pgStmt) NumInput() int { return s.st.NumInput() }

func (s *pgStmt) Exec(args []driver.Value) (driver.Result, error) {
	return nil, errors.New("pgdriver: Stmt.Exec without a context is not supported")
}

func (s *pgStmt) Query(args []driver.Value) (driver.Rows, error) {
	return nil, errors.New("pgdriver: Stmt.Query without a context is not supported")
}

func (s *pgStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	stop := s.c.watch(ctx)
	res, err := s.st.(driver.StmtExecContext).ExecContext(ctx, args)
	if err = s.c.check(ctx, stop(), err); err != nil {
		return nil, err
	}
	return res, nil
}

func (s *pgStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	stop := s.c.watch(ctx)
	rows, err := s.st.(driver.StmtQueryContext).QueryContext(ctx, args)
	if err != nil {
		return nil, s.c.check(ctx, stop(), err)
	}
	return &pgRows{Rows: rows, c: s.c, ctx: ctx, stop: stop}, nil
}

// pgRows are a statement's rows, read while its context is still watched: the read of a row
// is cut short by the context's end as the statement's first read is.
type pgRows struct {
	driver.Rows
	c       *pgConn
	ctx     context.Context
	stop    func() bool
	stopped bool
	live    bool // the watch had not fired when it was stopped
}

func (r *pgRows) done() bool {
	if !r.stopped {
		r.stopped, r.live = true, r.stop()
	}
	return r.live
}

func (r *pgRows) Next(dest []driver.Value) error {
	err := r.Rows.Next(dest)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, io.EOF):
		r.done()
		return err
	}
	return r.c.check(r.ctx, r.done(), err)
}

func (r *pgRows) Close() error {
	err := r.Rows.Close()
	return r.c.check(r.ctx, r.done(), err)
}

// CopyFrom is pgdriver.CopyFrom on conn, a connection of a pool whose connector Wrap made:
// pgdriver's COPY functions need its own connection type, which pgConn wraps. The COPY runs
// on conn's pgdriver connection, in conn's transaction if one is open, watched as conn's
// statements are: when ctx ends, or the COPY fails other than by the server's answer, conn is
// dropped.
func CopyFrom(ctx context.Context, conn bun.Conn, r io.Reader, query string, args ...any) (res sql.Result, err error) {
	err = conn.Raw(func(dc any) error {
		c, ok := dc.(*pgConn)
		if !ok {
			return fmt.Errorf("COPY needs a PostgreSQL connection, not %T", dc)
		}
		stop := c.watch(ctx)
		res, err = c.rawCopyFrom(ctx, r, query, args...)
		return c.check(ctx, stop(), err)
	})
	return res, err
}

// rawCopyFrom runs pgdriver.CopyFrom on the connection's pgdriver connection, through a
// database/sql pool of that one connection made for the purpose: pgdriver reaches its
// connection through database/sql's Conn.Raw. That pool is closed after the COPY, but the
// connection is never handed back to it (database/sql would close it): the pool forgets it,
// and c goes on with it.
func (c *pgConn) rawCopyFrom(ctx context.Context, r io.Reader, query string, args ...any) (sql.Result, error) {
	one := sql.OpenDB(oneConn{c.cn})
	defer one.Close()
	raw, err := bun.NewDB(one, pgdialect.New()).Conn(ctx)
	if err != nil {
		return nil, err
	}
	return pgdriver.CopyFrom(ctx, raw, r, query, args...)
}

// oneConn is a connector of one connection, already open.
type oneConn struct{ cn *pgdriver.Conn }

func (o oneConn) Connect(context.Context) (driver.Conn, error) { return o.cn, nil }
func (o oneConn) Driver() driver.Driver                        { return pgdriver.NewDriver() }
