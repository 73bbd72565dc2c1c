package integration

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/internal/logbuf"
	"github.com/subscriberd/subscriberd/internal/testdb"
	"github.com/subscriberd/subscriberd/repo"
)

// statusCodes is an api.Metrics that keeps the status of every request.
type statusCodes struct {
	mu    sync.Mutex
	codes []int
}

func (c *statusCodes) RequestStarted()                        {}
func (c *statusCodes) RequestDone()                           {}
func (c *statusCodes) SubscribersCreated(string, string, int) {}
func (c *statusCodes) AuthFailure(string)                     {}
func (c *statusCodes) IdempotencyOutcome(string)              {}
func (c *statusCodes) BulkGateWaiting(int)                    {}
func (c *statusCodes) BulkGateWait(string, time.Duration)     {}
func (c *statusCodes) ScopeRefused(string)                    {}
func (c *statusCodes) SuppressionsCreated(string, int)        {}
func (c *statusCodes) PagePost(string, string)                {}
func (c *statusCodes) PrivacyRequest(string, string)          {}
func (c *statusCodes) ObserveRequest(_ context.Context, _, _ string, code int, _ time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.codes = append(c.codes, code)
}

// TestClientHangsUpMidBulk: a client that closes its connection while its bulk create waits
// on the database (a lock held by another connection) ends as 499 in the access log and the
// metrics; nothing is logged as an error (no "transaction has already been committed or
// rolled back", no cancelled statement as 503), net/http logs no second WriteHeader, and
// nothing of the bulk is written. On both stores.
func TestClientHangsUpMidBulk(t *testing.T) {
	t.Parallel()
	// The waiting insert stops when the request's context ends (its connection is closed,
	// package repo/pgconn); the short statement timeout only bounds the test should it not.
	e := newEnv(t, func(o *envOptions) { o.statementTimeout = 2 * time.Second })
	logs, serverLog, metrics := &logbuf.Buffer{}, &logbuf.Buffer{}, &statusCodes{}
	h := api.New(api.Config{
		Store: repo.NewSubscribers(e.db), Auth: e.accounts, Metrics: metrics,
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	srv := httptest.NewUnstartedServer(recordTraffic(h))
	srv.Config.ErrorLog = log.New(serverLog, "", 0)
	srv.Start()

	// Another connection holds what the bulk insert needs.
	other, err := repo.Open(e.dsn, repo.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	tx, err := other.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	lock := "LOCK TABLE subscribers IN EXCLUSIVE MODE"
	if testdb.Store() == testdb.SQLite {
		lock = "UPDATE newsletters SET name = name" // BEGIN IMMEDIATE took the write lock
	}
	if _, err := tx.ExecContext(context.Background(), lock); err != nil {
		t.Fatal(err)
	}

	var items []string
	for i := range 100 {
		items = append(items, fmt.Sprintf(`{"email":"gone%d@example.com","status":"pending"}`, i))
	}
	ctx, cancel := context.WithCancel(context.Background())
	r, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+api.BasePath+"/subscribers/bulk",
		strings.NewReader("["+strings.Join(items, ",")+"]"))
	r.Header.Set("Authorization", "Bearer "+e.key)
	r.Header.Set("Content-Type", "application/json")
	done := make(chan error, 1)
	go func() {
		res, err := srv.Client().Do(r)
		if err == nil {
			res.Body.Close()
		}
		done <- err
	}()
	if testdb.Store() == testdb.SQLite {
		time.Sleep(500 * time.Millisecond) // the bulk create is waiting on the write lock
	} else {
		waitFor(t, "the bulk create to wait on the lock", func() bool {
			return e.count("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'") > 0
		})
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the bulk create succeeded while the table was locked; want it cancelled")
	}
	srv.Close() // waits for the handler
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}

	metrics.mu.Lock()
	got := fmt.Sprint(metrics.codes)
	metrics.mu.Unlock()
	if got != "[499]" {
		t.Errorf("observed statuses %s; want [499]", got)
	}
	if !strings.Contains(logs.String(), `"status":499`) {
		t.Errorf("access log lacks status 499:\n%s", logs)
	}
	for _, bad := range []string{`"level":"ERROR"`, `"level":"WARN"`, `"status":500`, `"status":503`} {
		if strings.Contains(logs.String(), bad) {
			t.Errorf("log holds %s:\n%s", bad, logs)
		}
	}
	if s := serverLog.String(); s != "" {
		t.Errorf("net/http logged %q", s)
	}
	if n := e.count("SELECT count(*) FROM subscribers"); n != 0 {
		t.Errorf("%d subscribers written by a cancelled bulk; want 0", n)
	}
	if n := e.count("SELECT count(*) FROM email_outbox"); n != 0 {
		t.Errorf("%d emails queued by a cancelled bulk; want 0", n)
	}
}
