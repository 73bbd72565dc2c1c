package api_test

import (
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/model"
)

// TestCommonHeaders: every response, whoever writes it, carries the headers of docs/api-contract.md §1.
func TestCommonHeaders(t *testing.T) {
	tests := []struct {
		name  string
		setup func(*env)
		req   req
		want  int
	}{
		{"201 from an operation", nil, req{"POST", subs, strings.NewReader(`{"email":"a@example.com"}`), []string{bearer(keyA)}}, 201},
		{"200 list", nil, req{"GET", subs, nil, []string{bearer(keyA)}}, 200},
		{"400 from preflight", nil, req{"POST", subs, strings.NewReader(`{`), []string{bearer(keyA)}}, 400},
		{"401 from auth", nil, req{"GET", subs, nil, nil}, 401},
		{"404 from routing", nil, req{"GET", "/nope", nil, nil}, 404},
		{"405 from routing", nil, req{"PATCH", subs, nil, nil}, 405},
		{"422 from a handler", nil, req{"POST", subs, strings.NewReader(`{}`), []string{bearer(keyA)}}, 422},
		{"500 from a panic", func(e *env) { e.store.panicWith = "boom" }, req{"GET", subs, nil, []string{bearer(keyA)}}, 500},
		{"503 from the store", func(e *env) { e.store.err = model.ErrUnavailable }, req{"GET", subs, nil, []string{bearer(keyA)}}, 503},
		{"the OpenAPI document", nil, req{"GET", "/api/v1/openapi.json", nil, nil}, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			if tt.setup != nil {
				tt.setup(e)
			}
			rec := e.do(t, tt.req)
			if rec.Code != tt.want {
				t.Fatalf("status %d, body %.200s; want %d", rec.Code, rec.Body, tt.want)
			}
			for k, want := range map[string]string{"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"} {
				if got := rec.Header().Values(k); len(got) != 1 || got[0] != want {
					t.Errorf("%s = %q; want [%q]", k, got, want)
				}
			}
			if id := rec.Header().Get("X-Request-Id"); !validRequestID(id) {
				t.Errorf("X-Request-Id = %q; want 1–128 of [A-Za-z0-9._-]", id)
			}
			if tt.req.path != "/api/v1/openapi.json" {
				decode(t, rec) // a JSON object
			}
		})
	}
}

var requestIDShape = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

func validRequestID(id string) bool { return requestIDShape.MatchString(id) }

func TestRequestID(t *testing.T) {
	tests := []struct {
		name     string
		given    []string // X-Request-Id header values sent
		wantEcho bool
	}{
		{"letters and digits", []string{"abc123XYZ"}, true},
		{"all allowed punctuation", []string{"a-b_c.d"}, true},
		{"one character", []string{"x"}, true},
		{"128 characters", []string{strings.Repeat("r", 128)}, true},
		{"a UUID", []string{"0f8fad5b-d9cb-469f-a165-70867728950e"}, true},
		{"none", nil, false},
		{"empty", []string{""}, false},
		{"129 characters", []string{strings.Repeat("r", 129)}, false},
		{"space", []string{"a b"}, false},
		{"slash", []string{"a/b"}, false},
		{"colon", []string{"trace:1"}, false},
		{"non-ASCII", []string{"réq"}, false},
		{"log injection", []string{"x\"}\n{\"admin\":true"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			hr := req{"GET", subs, nil, []string{bearer(keyA)}}
			rec := httpDo(e, hr, tt.given)
			got := rec.Header().Values("X-Request-Id")
			if len(got) != 1 {
				t.Fatalf("X-Request-Id = %q; want one value", got)
			}
			if tt.wantEcho {
				if got[0] != tt.given[0] {
					t.Errorf("X-Request-Id = %q; want the caller's %q", got[0], tt.given[0])
				}
				return
			}
			if !validRequestID(got[0]) || (len(tt.given) > 0 && got[0] == tt.given[0]) {
				t.Errorf("X-Request-Id = %q for %q; want a new valid id", got[0], tt.given)
			}
		})
	}
}

func TestRequestIDNewEachTime(t *testing.T) {
	e := newEnv(t)
	a := e.do(t, req{"GET", subs, nil, nil}).Header().Get("X-Request-Id")
	b := e.do(t, req{"GET", subs, nil, nil}).Header().Get("X-Request-Id")
	if a == b || a == "" {
		t.Errorf("generated X-Request-Id %q then %q; want two different ids", a, b)
	}
}

// httpDo sends r with the X-Request-Id values given set raw (the helper would trim them).
func httpDo(e *env, r req, requestIDs []string) *recorder {
	hr := newRequest(r)
	for _, v := range requestIDs {
		hr.Header.Add("X-Request-Id", v)
	}
	rec := newRecorder()
	e.srv.ServeHTTP(rec, hr)
	return rec
}

// clock is a settable time source safe for concurrent use.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2026, 6, 11, 17, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }
func withTTL(d time.Duration) option     { return func(cfg *api.Config) { cfg.KeyCacheTTL = d } }
func statusOf(e *env, t *testing.T, key string) int {
	t.Helper()
	return e.do(t, req{"GET", subs, nil, []string{bearer(key)}}).Code
}

// TestKeyCache: a verified key is trusted for the TTL; revocation and plan changes take
// effect when it ends (docs/api-contract.md §5).
func TestKeyCache(t *testing.T) {
	tests := []struct {
		name string
		ttl  time.Duration // as configured
		eff  time.Duration // the TTL in effect
	}{
		{"configured TTL", 10 * time.Second, 10 * time.Second},
		{"zero means 5 s", 0, 5 * time.Second},
		{"short TTL", 50 * time.Millisecond, 50 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name+" revocation", func(t *testing.T) {
			e := newEnv(t, withTTL(tt.ttl))
			c := newClock()
			api.SetKeyCacheClock(e.srv, c.Now)
			if got := statusOf(e, t, keyA); got != 200 {
				t.Fatalf("status %d before revocation; want 200", got)
			}
			e.auth.Revoke(keyA)
			c.Advance(tt.eff - time.Nanosecond)
			if got := statusOf(e, t, keyA); got != 200 {
				t.Errorf("status %d just before the TTL ends; want 200 (cached)", got)
			}
			if n := e.auth.Lookups(); n != 1 {
				t.Errorf("lookups = %d within the TTL; want 1", n)
			}
			c.Advance(time.Nanosecond)
			if got := statusOf(e, t, keyA); got != 401 {
				t.Errorf("status %d when the TTL ends; want 401", got)
			}
			if got := statusOf(e, t, keyA); got != 401 {
				t.Errorf("status %d after revocation took effect; want 401 (an unknown key is not cached)", got)
			}
		})
		t.Run(tt.name+" plan change", func(t *testing.T) {
			e := newEnv(t, withTTL(tt.ttl))
			c := newClock()
			api.SetKeyCacheClock(e.srv, c.Now)
			if got := statusOf(e, t, keyB); got != 200 {
				t.Fatalf("status %d before the change; want 200", got)
			}
			e.auth.Set(keyB, model.Principal{KeyID: uuid.New(), NewsletterID: newsletterB, APIAccess: false})
			if got := statusOf(e, t, keyB); got != 200 {
				t.Errorf("status %d within the TTL; want 200 (cached)", got)
			}
			c.Advance(tt.eff)
			if got := statusOf(e, t, keyB); got != 403 {
				t.Errorf("status %d after the TTL; want 403", got)
			}
		})
	}
}

func TestKeyCacheDisabled(t *testing.T) {
	e := newEnv(t, withTTL(-1))
	for range 3 {
		if got := statusOf(e, t, keyA); got != 200 {
			t.Fatalf("status %d; want 200", got)
		}
	}
	if n := e.auth.Lookups(); n != 3 {
		t.Errorf("lookups = %d for 3 requests with the cache off; want 3", n)
	}
	e.auth.Revoke(keyA)
	if got := statusOf(e, t, keyA); got != 401 {
		t.Errorf("status %d right after revocation with the cache off; want 401", got)
	}
}

func TestKeyCacheFailuresNotCached(t *testing.T) {
	e := newEnv(t)
	e.auth.err = model.ErrUnavailable
	if got := statusOf(e, t, keyA); got != 503 {
		t.Fatalf("status %d with the authenticator down; want 503", got)
	}
	e.auth.err = nil
	if got := statusOf(e, t, keyA); got != 200 {
		t.Errorf("status %d once the authenticator is back; want 200", got)
	}
	e.auth.Revoke(keyUnknown)
	statusOf(e, t, keyUnknown)
	e.auth.Set(keyUnknown, model.Principal{NewsletterID: newsletterA, APIAccess: true})
	if got := statusOf(e, t, keyUnknown); got != 200 {
		t.Errorf("status %d for a key issued after a failed attempt; want 200 (401s are not cached)", got)
	}
}

// TestKeysNeverLogged: neither a valid nor a rejected key appears in the log, and an
// unexpected error's cause does (for operators), while the client sees none of it.
func TestKeysNeverLogged(t *testing.T) {
	e := newEnv(t)
	e.do(t, req{"GET", subs, nil, []string{bearer(keyA)}})
	e.do(t, req{"GET", subs, nil, []string{bearer(keyUnknown)}})
	e.do(t, req{"GET", subs, nil, []string{"Authorization: Bearer sk_short"}})
	e.store.err = errOpaque
	e.do(t, req{"POST", subs, strings.NewReader(`{"email":"a@example.com"}`), []string{bearer(keyB)}})
	logs := e.logs.String()
	for _, k := range []string{keyA, keyUnknown, keyB, "sk_short", keyA[3:20], keyB[3:20]} {
		if strings.Contains(logs, k) {
			t.Errorf("log contains key material %q:\n%s", k, logs)
		}
	}
	if !strings.Contains(logs, errOpaque.Error()) {
		t.Errorf("log lacks the unexpected error %q:\n%s", errOpaque, logs)
	}
}

var errOpaque = &opaqueError{}

type opaqueError struct{}

func (*opaqueError) Error() string { return "disk quota exceeded on tablespace ts_7" }

// TestMetricsObserveEveryRequest: each request is observed once with its route and status.
func TestMetricsObserveEveryRequest(t *testing.T) {
	e := newEnv(t)
	e.call(t, "POST", subs, `{"email":"a@example.com","status":"pending"}`)
	e.call(t, "GET", subs+"/"+unknowID, "")
	e.do(t, req{"GET", "/nope", nil, nil})
	e.do(t, req{"PATCH", subs, nil, nil})
	want := []observation{
		{"POST", "/api/v1/subscribers", 201},
		{"GET", "/api/v1/subscribers/{id}", 404},
		{"GET", api.RouteUnmatched, 404},
		{"PATCH", api.RouteUnmatched, 405},
	}
	if diff := cmp.Diff(want, e.metrics.observed); diff != "" {
		t.Errorf("observations mismatch (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int{"create/pending": 1}, e.metrics.created); diff != "" {
		t.Errorf("SubscribersCreated mismatch (-want +got):\n%s", diff)
	}
	if e.metrics.inFlight != 0 {
		t.Errorf("in-flight = %d after all requests ended; want 0", e.metrics.inFlight)
	}
}

// TestPanicIsObserved: a panicking request still ends its in-flight count and is observed
// as a 500, so the gauge does not drift and the error rate sees it.
func TestPanicIsObserved(t *testing.T) {
	e := newEnv(t)
	e.store.panicWith = "boom"
	rec := e.call(t, "GET", subs, "")
	if rec.Code != http.StatusInternalServerError {
		t.Fatalf("status %d; want 500", rec.Code)
	}
	if e.metrics.inFlight != 0 {
		t.Errorf("in-flight = %d after a panicking request; want 0", e.metrics.inFlight)
	}
	want := []observation{{"GET", "/api/v1/subscribers", 500}}
	if diff := cmp.Diff(want, e.metrics.observed); diff != "" {
		t.Errorf("observations mismatch (-want +got):\n%s", diff)
	}
}

func TestPanicAbortHandlerPropagates(t *testing.T) {
	e := newEnv(t)
	e.store.panicWith = http.ErrAbortHandler
	defer func() {
		if v := recover(); v != http.ErrAbortHandler {
			t.Errorf("recovered %v; want http.ErrAbortHandler re-panicked for net/http", v)
		}
	}()
	e.call(t, "GET", subs, "")
	t.Errorf("request returned; want the http.ErrAbortHandler panic to propagate")
}
