package integration

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/subscriberd/subscriberd/repo"
)

// TestRowLockHeldOpenDoesNotStarveThePool is the failure of docs/operating.md's "A transaction
// left open on a row": another connection inserted an address and did not commit, and many
// clients create that address and hang up after 2 s. Once the last of them has gone, reads
// are served again at once (they were starved for the statement timeout, wave after wave,
// while every pool connection waited on the lock for a client long gone); a write that still
// waits answers 503 with Retry-After when the lock timeout ends, never 500 and never later;
// and once the transaction rolls back the address can be created.
func TestRowLockHeldOpenDoesNotStarveThePool(t *testing.T) {
	t.Parallel()
	postgresOnly(t, "the lock is a row another PostgreSQL connection inserted and holds uncommitted; SQLite has one writer at a time (see TestSQLiteWriteLockHeldElsewhere)")
	e := newEnv(t) // the default pool (16), statement timeout (25 s) and lock timeout (5 s)
	existing := e.do("POST", "/subscribers", map[string]any{"email": "there@x.io", "status": "active"}).
		want(t, http.StatusCreated, "").data(t)["id"].(string)

	// A transaction left open on the row of x@x.io.
	other, err := repo.Open(e.dsn, repo.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	hold, err := other.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback() //nolint:errcheck
	if _, err := hold.ExecContext(context.Background(), `INSERT INTO subscribers
    (id, newsletter_id, email, email_key, first_name, last_name, status, created_at, updated_at)
    VALUES (gen_random_uuid(), ?, 'x@x.io', 'x@x.io', '', '', 'active', now(), now())`, e.nl); err != nil {
		t.Fatal(err)
	}

	// 64 creates of the address (active and pending ones, one statement each),
	// from clients that give up after 2 s, more than the pool has connections.
	impatient := &http.Client{Timeout: 2 * time.Second}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var lastGone time.Time
	for i := range 64 {
		wg.Go(func() {
			status := "active"
			if i%4 == 0 {
				status = "pending"
			}
			code, _, err := e.sendThrough(impatient, "POST", "/subscribers", `{"email":"x@x.io","status":"`+status+`"}`)
			mu.Lock()
			defer mu.Unlock()
			if now := time.Now(); now.After(lastGone) {
				lastGone = now
			}
			if err == nil && code >= 500 && code != http.StatusServiceUnavailable {
				t.Errorf("a create of the held address answered %d", code)
			}
		})
		if i%16 == 15 {
			time.Sleep(500 * time.Millisecond) // they keep coming, as a client's retries would
		}
	}
	wg.Wait()

	// Reads are served again within the contract's 2 s of the last client hanging up: nothing
	// holds a connection for a client that went away. Asserted with room for a slow machine;
	// the failure this guards against took the statement timeout (25 s) and more.
	patient := &http.Client{Timeout: 30 * time.Second}
	for _, path := range []string{"/subscribers", "/subscribers/" + existing} {
		code, _, err := e.sendThrough(patient, "GET", path, "")
		if err != nil || code != http.StatusOK {
			t.Fatalf("GET %s after the clients left: %d, %v; want 200", path, code, err)
		}
	}
	if took := time.Since(lastGone); took > 5*time.Second {
		t.Errorf("reads were served again %v after the last client hung up; want within 2 s (5 s allowed here)", took.Round(time.Millisecond))
	} else {
		t.Logf("reads served again %v after the last client hung up", took.Round(time.Millisecond))
	}

	// A write that keeps waiting answers 503 with Retry-After once the lock timeout (5 s)
	// ends: an active create and a pending one (one statement each), and a change of
	// another subscriber's email to the held address.
	writes := []struct{ method, path, body string }{
		{"POST", "/subscribers", `{"email":"x@x.io","status":"active"}`},
		{"POST", "/subscribers", `{"email":"X@x.io","status":"pending"}`},
		{"PUT", "/subscribers/" + existing, `{"email":"x@x.io"}`},
	}
	for _, w := range writes {
		wg.Go(func() {
			start := time.Now()
			code, h, err := e.sendThrough(patient, w.method, w.path, w.body)
			took := time.Since(start)
			switch {
			case err != nil:
				t.Errorf("%s %s while the row is held: %v", w.method, w.path, err)
			case code != http.StatusServiceUnavailable || h.Get("Retry-After") == "":
				t.Errorf("%s %s while the row is held: %d, Retry-After %q; want 503 with Retry-After", w.method, w.path, code, h.Get("Retry-After"))
			case took < 4*time.Second || took > 15*time.Second:
				t.Errorf("%s %s answered 503 after %v; want it at the 5 s lock timeout", w.method, w.path, took.Round(time.Millisecond))
			}
		})
	}
	wg.Wait()

	// The transaction ends; the address is free again.
	if err := hold.Rollback(); err != nil {
		t.Fatal(err)
	}
	e.do("POST", "/subscribers", map[string]any{"email": "x@x.io", "status": "active"}).want(t, http.StatusCreated, "")
	if n := e.count("SELECT count(*) FROM subscribers WHERE email_key = 'x@x.io'"); n != 1 {
		t.Errorf("%d subscribers with the address; want 1", n)
	}
}

// sendThrough makes one request with the env's key through client, and returns its status and
// headers, or the client's error (a timeout: the client hung up).
func (e *env) sendThrough(client *http.Client, method, path, body string) (int, http.Header, error) {
	req, err := http.NewRequest(method, e.base+path, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+e.key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	io.Copy(io.Discard, res.Body) //nolint:errcheck // the status and headers are what counts
	return res.StatusCode, res.Header, nil
}
