package integration

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/subscriberd/subscriberd/internal/testdb"
	"github.com/subscriberd/subscriberd/repo"
)

// tcpProxy forwards a loopback port to the database; cut simulates an outage by closing the
// listener and every connection, restore listens again on the same port.
type tcpProxy struct {
	t      *testing.T
	target string
	addr   string

	mu    sync.Mutex
	ln    net.Listener
	conns []net.Conn
}

// viaProxy is a fresh database reached through a proxy that can cut it off.
func viaProxy(t *testing.T) (*tcpProxy, func(*envOptions)) {
	t.Helper()
	direct, err := url.Parse(freshDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := newTCPProxy(t, direct.Host)
	via := *direct
	via.Host = proxy.addr
	return proxy, func(o *envOptions) { o.dsn = via.String() }
}

func newTCPProxy(t *testing.T, target string) *tcpProxy {
	p := &tcpProxy{t: t, target: target}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.cut)
	return p
}

func (p *tcpProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { io.Copy(up, c); up.Close() }() //nolint:errcheck
			go func() { io.Copy(c, up); c.Close() }()  //nolint:errcheck
		}
	}()
}

func (p *tcpProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *tcpProxy) restore() {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("proxy: listen again on %s: %v", p.addr, err)
	}
	p.serve(ln)
}

func TestDatabaseOutage(t *testing.T) {
	t.Parallel()
	postgresOnly(t, noOutageOnSQLite)
	proxy, throughProxy := viaProxy(t)
	e := newEnv(t, throughProxy)
	e.do("POST", "/subscribers", map[string]any{"email": "before@x.io"}).want(t, http.StatusCreated, "")

	proxy.cut()
	for _, req := range []struct {
		method, path string
		body         any
	}{
		{"GET", "/subscribers", nil},
		{"POST", "/subscribers", map[string]any{"email": "during@x.io"}},
		{"POST", "/subscribers/bulk", []any{map[string]any{"email": "during2@x.io"}}},
	} {
		r := e.do(req.method, req.path, req.body).want(t, http.StatusServiceUnavailable, "service_unavailable")
		if r.header.Get("Retry-After") == "" {
			t.Errorf("%s %s: 503 without Retry-After", req.method, req.path)
		}
		if _, has := r.body["errors"]; has {
			t.Errorf("503 carries errors: %s", r.raw)
		}
	}

	proxy.restore()
	// The pool may hold connections that died with the outage; the service must get past
	// them by itself within a few requests.
	var last response
	for range 3 {
		if last = e.do("GET", "/subscribers", nil); last.status == http.StatusOK {
			break
		}
	}
	last.want(t, http.StatusOK, "")
	e.do("POST", "/subscribers", map[string]any{"email": "after@x.io"}).want(t, http.StatusCreated, "")
	if n := e.count("SELECT count(*) FROM subscribers"); n != 2 {
		t.Errorf("subscribers = %d, want 2 (nothing written during the outage)", n)
	}
}

// A statement that outlives the statement timeout is cancelled by the server: the client gets
// 503 and nothing was written, so retrying is safe.
func TestStatementTimeoutAnswers503AndWritesNothing(t *testing.T) {
	t.Parallel()
	postgresOnly(t, "the slow statement is a PL/pgSQL trigger calling pg_sleep, cancelled by PostgreSQL's statement_timeout; SQLite has neither (its waits are bounded by the busy timeout, see TestSQLiteWriteLockHeldElsewhere)")
	e := newEnv(t, func(o *envOptions) { o.statementTimeout = 300 * time.Millisecond })
	if _, err := e.db.ExecContext(t.Context(), `
CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(2); RETURN NEW; END $$;
CREATE TRIGGER slow_insert BEFORE INSERT ON subscribers FOR EACH ROW EXECUTE FUNCTION slow_insert();`); err != nil {
		t.Fatal(err)
	}
	r := e.do("POST", "/subscribers", map[string]any{"email": "slow@x.io"}).want(t, http.StatusServiceUnavailable, "service_unavailable")
	if r.header.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	if n := e.count("SELECT count(*) FROM subscribers"); n != 0 {
		t.Errorf("subscribers = %d after a cancelled insert, want 0", n)
	}
}

// TestSQLiteWriteLockHeldElsewhere is the SQLite counterpart of a database outage: another
// process holds the file's write lock past the busy timeout. Writes answer 503 with
// Retry-After (never 500) once the retries are spent, reads go on (WAL), and writes work again
// when the lock is released. SQLite only: PostgreSQL has no database-wide write lock.
func TestSQLiteWriteLockHeldElsewhere(t *testing.T) {
	t.Parallel()
	if testdb.Store() != testdb.SQLite {
		t.Skip("SQLite only: PostgreSQL has no database-wide write lock to hold")
	}
	e := newEnv(t)
	e.do("POST", "/subscribers", map[string]any{"email": "before@x.io"}).want(t, http.StatusCreated, "")

	other, err := repo.Open(e.dsn, repo.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	tx, err := other.BeginTx(context.Background(), nil) // BEGIN IMMEDIATE: takes the write lock
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(context.Background(), "UPDATE newsletters SET name = name"); err != nil {
		t.Fatal(err)
	}
	for _, req := range []struct {
		method, path string
		body         any
	}{
		{"POST", "/subscribers", map[string]any{"email": "during@x.io"}},
		{"POST", "/subscribers/bulk", []any{map[string]any{"email": "during2@x.io", "status": "pending"}}},
	} {
		r := e.do(req.method, req.path, req.body)
		r.want(t, http.StatusServiceUnavailable, "service_unavailable")
		if r.header.Get("Retry-After") == "" {
			t.Errorf("%s %s: 503 without Retry-After", req.method, req.path)
		}
	}
	if r := e.do("GET", "/subscribers", nil).want(t, http.StatusOK, ""); r.body["pagination"].(map[string]any)["total"] != 1.0 {
		t.Errorf("list while locked = %s, want the one subscriber", r.raw)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	e.do("POST", "/subscribers", map[string]any{"email": "after@x.io"}).want(t, http.StatusCreated, "")
	if n := e.count("SELECT count(*) FROM subscribers"); n != 2 {
		t.Errorf("subscribers = %d, want 2 (nothing written while locked)", n)
	}
}
