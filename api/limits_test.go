package api_test

import (
	"context"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/limits"
)

// spyLimiter passes every call to a real in-process limiter and records what the server
// asked.
type spyLimiter struct {
	api.Limiter
	mu     sync.Mutex
	calls  []string
	client []netip.Addr
}

func (s *spyLimiter) record(call string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, call)
}

func (s *spyLimiter) CheckClient(ctx context.Context, ip netip.Addr) limits.Decision {
	s.mu.Lock()
	s.client = append(s.client, ip)
	s.mu.Unlock()
	s.record("CheckClient")
	return s.Limiter.CheckClient(ctx, ip)
}

func (s *spyLimiter) AuthFailed(ctx context.Context, ip netip.Addr) limits.Decision {
	s.record("AuthFailed")
	return s.Limiter.AuthFailed(ctx, ip)
}

func (s *spyLimiter) CheckKey(ctx context.Context, keyID string, bulk bool) limits.Decision {
	if bulk {
		s.record("CheckKey(bulk)")
	} else {
		s.record("CheckKey")
	}
	return s.Limiter.CheckKey(ctx, keyID, bulk)
}

func (s *spyLimiter) WriteFailed(ctx context.Context, keyID string) {
	s.record("WriteFailed")
	s.Limiter.WriteFailed(ctx, keyID)
}

func (s *spyLimiter) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.calls
	s.calls = nil
	return c
}

func withLimiter(cfg limits.Config, trusted ...netip.Prefix) (option, *spyLimiter) {
	spy := &spyLimiter{Limiter: limits.New(cfg, limits.NewMemory(nil, 0))}
	return func(c *api.Config) {
		c.Limiter = spy
		c.TrustedProxies = trusted
		c.KeyCacheTTL = -1
	}, spy
}

// TestLimitCalls pins which limiter calls each kind of request makes, in order.
func TestLimitCalls(t *testing.T) {
	opt, spy := withLimiter(limits.Config{
		Rate: []limits.Window{{Limit: 100, Period: time.Minute}}, Bulk: []limits.Window{{Limit: 100, Period: time.Minute}},
		AuthLockout: limits.Lockout{Failures: 100, Window: time.Minute, Lock: time.Minute}, WriteLockout: limits.Lockout{Failures: 100, Window: time.Minute, Lock: time.Minute},
	})
	e := newEnv(t, opt)
	const unknown = "/api/v1/subscribers/00000000-0000-7000-8000-000000000000"
	tests := []struct {
		name       string
		method     string
		path, body string
		key        string
		status     int
		want       string
	}{
		{"list", "GET", "/api/v1/subscribers", "", keyA, 200, "CheckClient CheckKey"},
		{"create", "POST", "/api/v1/subscribers", `{"email":"a@x.io"}`, keyA, 201, "CheckClient CheckKey"},
		{"bulk", "POST", "/api/v1/subscribers/bulk", `[{"email":"b@x.io"}]`, keyA, 201, "CheckClient CheckKey(bulk)"},
		{"422 write", "POST", "/api/v1/subscribers", `{"email":"nope"}`, keyA, 422, "CheckClient CheckKey WriteFailed"},
		{"400 write", "PUT", unknown, `{"name":`, keyA, 400, "CheckClient CheckKey WriteFailed"},
		{"404 write", "DELETE", unknown, "", keyA, 404, "CheckClient CheckKey WriteFailed"},
		{"404 read", "GET", unknown, "", keyA, 404, "CheckClient CheckKey"},
		{"401", "POST", "/api/v1/subscribers", `{"email":"c@x.io"}`, "sk_" + strings.Repeat("Z", 40), 401, "CheckClient AuthFailed"},
		{"401 no key", "GET", "/api/v1/subscribers", "", "", 401, "CheckClient AuthFailed"},
		{"403", "POST", "/api/v1/subscribers", `{"email":"d@x.io"}`, keyNoAccess, 403, "CheckClient"},
		{"document", "GET", "/api/v1/openapi.json", "", "", 200, ""},
		{"unrouted", "GET", "/api/v1/nowhere", "", keyA, 404, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := req{method: tt.method, path: tt.path}
			if tt.body != "" {
				r.body = strings.NewReader(tt.body)
			}
			if tt.key != "" {
				r.headers = []string{"Authorization: Bearer " + tt.key}
			}
			rec := e.do(t, r)
			if rec.Code != tt.status {
				t.Fatalf("status %d, want %d; body %s", rec.Code, tt.status, rec.Body)
			}
			if got := strings.Join(spy.take(), " "); got != tt.want {
				t.Errorf("limiter calls %q, want %q", got, tt.want)
			}
			hasHeaders := rec.Header().Get("RateLimit-Limit") != ""
			if wantHeaders := strings.Contains(tt.want, "CheckKey"); hasHeaders != wantHeaders {
				t.Errorf("RateLimit-Limit present = %v, want %v", hasHeaders, wantHeaders)
			}
		})
	}
}

// TestLockedClientLearnsNothing: while a client is locked out, its requests get 429 before
// any key is looked up, whatever the key.
func TestLockedClientLearnsNothing(t *testing.T) {
	opt, _ := withLimiter(limits.Config{AuthLockout: limits.Lockout{Failures: 1, Window: time.Minute, Lock: time.Minute}})
	e := newEnv(t, opt)
	bad := "Authorization: Bearer sk_" + strings.Repeat("Z", 40)
	if rec := e.do(t, req{method: "GET", path: "/api/v1/subscribers", headers: []string{bad}}); rec.Code != http.StatusUnauthorized {
		t.Fatalf("first failure: %d, want 401", rec.Code)
	}
	lookups := e.auth.Lookups()
	for _, h := range []string{bad, "Authorization: Bearer " + keyA, "Authorization: Basic eDp5"} {
		rec := e.do(t, req{method: "POST", path: "/api/v1/subscribers", body: strings.NewReader(`{"email":"x"}`), headers: []string{h}})
		if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "60" {
			t.Fatalf("%s while locked: %d, Retry-After %q; want 429 with 60", h, rec.Code, rec.Header().Get("Retry-After"))
		}
		if got := strings.TrimSpace(rec.Body.String()); got != `{"success":false,"code":"rate_limit_exceeded","message":"Too many failed authentication attempts from this address. Please try again later.","errors":{"retry_after":60}}` {
			t.Errorf("429 body %s", got)
		}
	}
	if n := e.auth.Lookups(); n != lookups {
		t.Errorf("%d key lookups while the client was locked out, want none", n-lookups)
	}
	if calls := e.store.Calls(); len(calls) != 0 {
		t.Errorf("store calls while locked out: %v", calls)
	}
}

// TestLimitedBeforeValidation: a rate-limited request is refused before its body is looked
// at, and a refused write does not count toward the write lockout.
func TestLimitedBeforeValidation(t *testing.T) {
	opt, spy := withLimiter(limits.Config{Rate: []limits.Window{{Limit: 1, Period: time.Hour}},
		WriteLockout: limits.Lockout{Failures: 1, Window: time.Hour, Lock: time.Hour}})
	e := newEnv(t, opt)
	if rec := e.call(t, "GET", "/api/v1/subscribers", ""); rec.Code != http.StatusOK {
		t.Fatalf("first request: %d", rec.Code)
	}
	rec := e.call(t, "POST", "/api/v1/subscribers", `{"email":`, "Content-Type: text/plain")
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("limited request with a bad body: %d %s, want 429", rec.Code, rec.Body)
	}
	for _, c := range spy.take() {
		if c == "WriteFailed" {
			t.Error("a 429 counted toward the write lockout")
		}
	}
}

// TestClientIPFromTrustedProxy: the server hands the limiter the address ClientIP finds.
func TestClientIPFromTrustedProxy(t *testing.T) {
	opt, spy := withLimiter(limits.Config{AuthLockout: limits.Lockout{Failures: 5, Window: time.Minute, Lock: time.Minute}},
		netip.MustParsePrefix("192.0.2.0/24"))
	e := newEnv(t, opt)
	// httptest requests come from 192.0.2.1, a trusted proxy here.
	e.call(t, "GET", "/api/v1/subscribers", "", "X-Forwarded-For: 1.1.1.1, 203.0.113.7")
	if len(spy.client) != 1 || spy.client[0] != netip.MustParseAddr("203.0.113.7") {
		t.Errorf("client addresses %v, want [203.0.113.7]", spy.client)
	}
}

// TestTooManyRequestsSaysWhy: the three 429s of docs/api-contract.md §5 share the code and
// differ in the message, so that a developer who locked themselves out knows it.
func TestTooManyRequestsSaysWhy(t *testing.T) {
	bad := "Authorization: Bearer sk_" + strings.Repeat("Z", 40)
	tests := []struct {
		name    string
		cfg     limits.Config
		prepare []req
		golden  string
		want    string
	}{
		{"rate limit", limits.Config{Rate: []limits.Window{{Limit: 1, Period: time.Hour}}},
			[]req{{method: "GET", path: subs, headers: []string{bearer(keyA)}}}, "429_rate_limit.json", api.MsgRateLimited},
		{"client lockout", limits.Config{AuthLockout: limits.Lockout{Failures: 1, Window: time.Minute, Lock: time.Minute}},
			[]req{{method: "GET", path: subs, headers: []string{bad}}}, "429_client_lockout.json", api.MsgClientLocked},
		{"key lockout", limits.Config{WriteLockout: limits.Lockout{Failures: 1, Window: time.Minute, Lock: 10 * time.Minute}},
			[]req{{method: "POST", path: subs, body: strings.NewReader(`{"email":"nope"}`), headers: []string{bearer(keyA)}}},
			"429_key_lockout.json", api.MsgKeyLocked},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opt, _ := withLimiter(tt.cfg)
			e := newEnv(t, opt)
			for _, r := range tt.prepare {
				e.do(t, r)
			}
			rec := e.do(t, req{method: "GET", path: subs, headers: []string{bearer(keyA)}})
			if rec.Code != http.StatusTooManyRequests {
				t.Fatalf("status %d, want 429; body %s", rec.Code, rec.Body)
			}
			if !strings.Contains(rec.Body.String(), `"message":"`+tt.want+`"`) {
				t.Errorf("body %s; want the message %q", rec.Body, tt.want)
			}
			golden(t, "errors/"+tt.golden, rec.Body.Bytes())
		})
	}
}

// barrierLimiter holds every CheckClient until n requests have passed it, as n requests that
// arrive at once all pass the client check before any of them has failed.
type barrierLimiter struct {
	api.Limiter
	arrived sync.WaitGroup
}

func (b *barrierLimiter) CheckClient(ctx context.Context, ip netip.Addr) limits.Decision {
	d := b.Limiter.CheckClient(ctx, ip)
	b.arrived.Done()
	b.arrived.Wait()
	return d
}

// TestConcurrentFailuresGetTheLockout: of n bad keys from one client at once, the first
// `failures` get 401 (the last of them starts the lock) and the others the lockout's 429,
// as they would one after another.
func TestConcurrentFailuresGetTheLockout(t *testing.T) {
	const n, failures = 12, 3
	b := &barrierLimiter{Limiter: limits.New(limits.Config{AuthLockout: limits.Lockout{Failures: failures, Window: time.Minute,
		Lock: time.Minute}}, limits.NewMemory(nil, 0))}
	b.arrived.Add(n)
	e := newEnv(t, func(c *api.Config) { c.Limiter = b; c.KeyCacheTTL = -1 })
	codes := make(chan int, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			rec := newRecorder()
			e.srv.ServeHTTP(rec, newRequest(req{method: "GET", path: subs, headers: []string{"Authorization: Bearer sk_" + strings.Repeat("Z", 40)}}))
			codes <- rec.Code
		})
	}
	wg.Wait()
	close(codes)
	got := map[int]int{}
	for c := range codes {
		got[c]++
	}
	if got[http.StatusUnauthorized] != failures || got[http.StatusTooManyRequests] != n-failures {
		t.Errorf("statuses %v; want %d × 401 and %d × 429", got, failures, n-failures)
	}
}
