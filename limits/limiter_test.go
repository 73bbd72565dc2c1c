package limits

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// clock is an injected clock that moves only when told.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 6, 11, 17, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// newBackend makes a fresh, empty backend reading time from now.
type newBackend func(t *testing.T, now func() time.Time) Backend

func memoryBackend(_ *testing.T, now func() time.Time) Backend { return NewMemory(now, 0) }

// recorder counts decisions by "scope/outcome".
type recorder struct {
	mu   sync.Mutex
	n    map[string]int
	up   []bool
	upCh chan bool
}

func newRecorder() *recorder { return &recorder{n: map[string]int{}, upCh: make(chan bool, 16)} }

func (r *recorder) Decision(scope, outcome string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n[scope+"/"+outcome]++
}

func (r *recorder) Lockout(subject string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n["lockout/"+subject]++
}

func (r *recorder) BackendUp(up bool) {
	r.mu.Lock()
	r.up = append(r.up, up)
	r.mu.Unlock()
	r.upCh <- up
}

func (r *recorder) count(k string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[k]
}

// conformance lists the behaviours both backends must show identically; memory_test and
// redis_test run each against their backend.
var conformance = []struct {
	name string
	run  func(t *testing.T, nb newBackend)
}{
	{"EachWindow", testEachWindow},
	{"BulkStacks", testBulkStacks},
	{"DeniedTakesNothing", testDeniedTakesNothing},
	{"RetryAfterRounding", testRetryAfterRounding},
	{"Headers", testHeaders},
	{"AuthLockout", testAuthLockout},
	{"WriteLockout", testWriteLockout},
	{"KeysAreIndependent", testKeysAreIndependent},
	{"Confirm", testConfirm},
}

func TestMemoryConformance(t *testing.T) {
	for _, c := range conformance {
		t.Run(c.name, func(t *testing.T) { c.run(t, memoryBackend) })
	}
}

func newLimiter(t *testing.T, nb newBackend, cfg Config) (*Limiter, *clock, *recorder) {
	t.Helper()
	c := newClock()
	rec := newRecorder()
	return New(cfg, nb(t, c.Now), WithRecorder(rec)), c, rec
}

func wantDecision(t *testing.T, what string, got, want Decision) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: got %+v, want %+v", what, got, want)
	}
}

// testEachWindow exhausts each of three windows on its own and watches it refill.
func testEachWindow(t *testing.T, nb newBackend) {
	windows := []Window{{3, time.Minute}, {4, time.Hour}, {5, 24 * time.Hour}}
	for i, w := range windows {
		t.Run(w.String(), func(t *testing.T) {
			// Each window is the tightest in turn: the others get room to spare.
			cfg := Config{}
			for j, o := range windows {
				if j != i {
					o.Limit *= 100
				}
				cfg.Rate = append(cfg.Rate, o)
			}
			l, c, rec := newLimiter(t, nb, cfg)
			ctx := context.Background()
			em := w.Period / time.Duration(w.Limit)
			for n := 1; n <= w.Limit; n++ {
				wantDecision(t, fmt.Sprintf("request %d", n), l.CheckKey(ctx, "key1", false),
					Decision{Allowed: true, Limit: w.Limit, Remaining: w.Limit - n, Reset: seconds(time.Duration(n) * em)})
			}
			wantDecision(t, "request over the limit", l.CheckKey(ctx, "key1", false),
				Decision{Limit: w.Limit, Remaining: 0, Reset: seconds(w.Period), RetryAfter: seconds(em)})
			c.Advance(em - time.Second)
			if d := l.CheckKey(ctx, "key1", false); d.Allowed || d.RetryAfter != 1 {
				t.Fatalf("1 s before the refill: got %+v, want denied with retry_after 1", d)
			}
			c.Advance(time.Second)
			if d := l.CheckKey(ctx, "key1", false); !d.Allowed || d.Remaining != 0 {
				t.Fatalf("after one emission interval: got %+v, want allowed with 0 remaining", d)
			}
			// A full period later the window has reset.
			c.Advance(w.Period)
			wantDecision(t, "after a full period", l.CheckKey(ctx, "key1", false),
				Decision{Allowed: true, Limit: w.Limit, Remaining: w.Limit - 1, Reset: seconds(em)})
			if got, want := rec.count("key/limited"), 2; got != want {
				t.Errorf("key/limited decisions = %d, want %d", got, want)
			}
			if got, want := rec.count("key/allowed"), w.Limit+2; got != want {
				t.Errorf("key/allowed decisions = %d, want %d", got, want)
			}
		})
	}
}

// testBulkStacks checks that bulk requests use the general windows and the bulk windows.
func testBulkStacks(t *testing.T, nb newBackend) {
	l, _, rec := newLimiter(t, nb, Config{Rate: []Window{{5, time.Minute}}, Bulk: []Window{{2, time.Minute}, {3, time.Hour}}})
	ctx := context.Background()
	for n := 1; n <= 2; n++ {
		if d := l.CheckKey(ctx, "k", true); !d.Allowed {
			t.Fatalf("bulk request %d: got %+v, want allowed", n, d)
		}
	}
	d := l.CheckKey(ctx, "k", true)
	wantDecision(t, "third bulk request in a minute", d, Decision{Limit: 2, Remaining: 0, Reset: 60, RetryAfter: 30})
	// The two bulk requests used the general window too: 3 left, and plain requests go on.
	wantDecision(t, "plain request after two bulk", l.CheckKey(ctx, "k", false),
		Decision{Allowed: true, Limit: 5, Remaining: 2, Reset: 36})
	if got := rec.count("bulk/allowed"); got != 2 {
		t.Errorf("bulk/allowed = %d, want 2", got)
	}
	if got := rec.count("bulk/limited"); got != 1 {
		t.Errorf("bulk/limited = %d, want 1", got)
	}
}

// testDeniedTakesNothing checks all-or-nothing: a request denied by one window takes nothing
// from the others.
func testDeniedTakesNothing(t *testing.T, nb newBackend) {
	l, c, _ := newLimiter(t, nb, Config{Rate: []Window{{2, time.Minute}, {3, time.Hour}}, Bulk: []Window{{1, time.Minute}}})
	ctx := context.Background()
	if d := l.CheckKey(ctx, "k", true); !d.Allowed {
		t.Fatalf("first bulk: %+v", d)
	}
	for range 5 { // denied by the bulk window: must not drain the hour window
		if d := l.CheckKey(ctx, "k", true); d.Allowed {
			t.Fatalf("second bulk within the minute: %+v, want denied", d)
		}
	}
	if d := l.CheckKey(ctx, "k", false); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("plain request: got %+v, want allowed, 0 left in the minute window", d)
	}
	for range 5 { // denied by the minute window
		if d := l.CheckKey(ctx, "k", false); d.Allowed {
			t.Fatalf("third request in the minute: %+v, want denied", d)
		}
	}
	c.Advance(time.Minute)
	wantDecision(t, "a minute later", l.CheckKey(ctx, "k", false), Decision{Allowed: true, Limit: 3, Remaining: 0, Reset: 3540})
}

// testRetryAfterRounding checks that retry-after rounds up to whole seconds, at least 1.
func testRetryAfterRounding(t *testing.T, nb newBackend) {
	l, c, _ := newLimiter(t, nb, Config{Rate: []Window{{7, time.Minute}}}) // one per 8.571428 s
	ctx := context.Background()
	for range 7 {
		l.CheckKey(ctx, "k", false)
	}
	for _, step := range []struct {
		advance time.Duration
		want    int
	}{{0, 9}, {500 * time.Millisecond, 9}, {600 * time.Millisecond, 8}, {7 * time.Second, 1}, {471 * time.Millisecond, 1}, {427 * time.Microsecond, 1}} {
		c.Advance(step.advance)
		if d := l.CheckKey(ctx, "k", false); d.Allowed || d.RetryAfter != step.want {
			t.Fatalf("after %v more: got %+v, want denied with retry_after %d", step.advance, d, step.want)
		}
	}
	c.Advance(time.Microsecond)
	if d := l.CheckKey(ctx, "k", false); !d.Allowed {
		t.Fatalf("at the instant of the refill: got %+v, want allowed", d)
	}
}

// testHeaders checks which window the headers describe, with the default limits.
func testHeaders(t *testing.T, nb newBackend) {
	rate, _ := ParseWindows("RATE_LIMITS", DefaultRateLimits)
	bulk, _ := ParseWindows("BULK_RATE_LIMITS", DefaultBulkRateLimits)
	l, _, _ := newLimiter(t, nb, Config{Rate: rate, Bulk: bulk})
	ctx := context.Background()
	wantDecision(t, "first request", l.CheckKey(ctx, "k", false), Decision{Allowed: true, Limit: 60, Remaining: 59, Reset: 1})
	wantDecision(t, "first bulk request", l.CheckKey(ctx, "k", true), Decision{Allowed: true, Limit: 10, Remaining: 9, Reset: 6})
	// 58 more in the minute: the minute window is closest to running out (0 left).
	for range 57 {
		l.CheckKey(ctx, "k", false)
	}
	wantDecision(t, "60th request", l.CheckKey(ctx, "k", false), Decision{Allowed: true, Limit: 60, Remaining: 0, Reset: 60})
	d := l.CheckKey(ctx, "k", false)
	wantDecision(t, "61st request", d, Decision{Limit: 60, Remaining: 0, Reset: 60, RetryAfter: 1})
	h := http.Header{}
	d.SetHeaders(h)
	for k, v := range map[string]string{"RateLimit-Limit": "60", "RateLimit-Remaining": "0", "RateLimit-Reset": "60", "Retry-After": "1"} {
		if got := h.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	h = http.Header{}
	(Decision{Allowed: true}).SetHeaders(h)
	if len(h) != 0 {
		t.Errorf("a decision without a window set headers %v", h)
	}

	// Windows 10/1m and 12/1h (one per 5 minutes): after 10 requests the minute window has 0
	// left, the hour 2; a minute later the minute window is full again (9 left after this
	// request) and the hour window, with 1 left, is the one closest to running out.
	l, c, _ := newLimiter(t, nb, Config{Rate: []Window{{10, time.Minute}, {12, time.Hour}}})
	for range 9 {
		l.CheckKey(ctx, "k", false)
	}
	wantDecision(t, "10th request", l.CheckKey(ctx, "k", false), Decision{Allowed: true, Limit: 10, Remaining: 0, Reset: 60})
	c.Advance(time.Minute)
	wantDecision(t, "a minute later", l.CheckKey(ctx, "k", false), Decision{Allowed: true, Limit: 12, Remaining: 1, Reset: 54 * 60})
}

// testAuthLockout checks the client lockout threshold, window and lock time.
func testAuthLockout(t *testing.T, nb newBackend) {
	l, c, rec := newLimiter(t, nb, Config{AuthLockout: Lockout{Failures: 3, Window: 10 * time.Minute, Lock: 15 * time.Minute}})
	ctx := context.Background()
	ip := netip.MustParseAddr("203.0.113.9")
	other := netip.MustParseAddr("2001:db8::9")

	// Two failures, then the window passes: the count starts over.
	l.AuthFailed(ctx, ip)
	c.Advance(time.Minute)
	l.AuthFailed(ctx, ip)
	c.Advance(10 * time.Minute)
	l.AuthFailed(ctx, ip)
	wantDecision(t, "3 failures over 11 minutes", l.CheckClient(ctx, ip), Decision{Allowed: true})
	l.AuthFailed(ctx, ip) // 2 within the window, then the 3rd locks
	wantDecision(t, "2 failures within the window", l.CheckClient(ctx, ip), Decision{Allowed: true})
	c.Advance(9*time.Minute + 59*time.Second)
	wantDecision(t, "the failure that locks (still a 401)", l.AuthFailed(ctx, ip), Decision{Allowed: true})
	wantDecision(t, "3rd failure within the window", l.CheckClient(ctx, ip), Decision{RetryAfter: 900, Locked: true})
	wantDecision(t, "another client", l.CheckClient(ctx, other), Decision{Allowed: true})
	// A failure that raced the one that locked (past CheckClient before the lock existed) gets
	// the lockout's answer and is not recorded: it neither restarts the lock nor counts
	// toward the next one.
	c.Advance(time.Minute)
	for range 5 {
		wantDecision(t, "a failure while locked", l.AuthFailed(ctx, ip), Decision{RetryAfter: 840, Locked: true})
	}
	c.Advance(14*time.Minute - 1500*time.Millisecond)
	wantDecision(t, "1.5 s before the end", l.CheckClient(ctx, ip), Decision{RetryAfter: 2, Locked: true})
	c.Advance(1500 * time.Millisecond)
	wantDecision(t, "at the end of the lock", l.CheckClient(ctx, ip), Decision{Allowed: true})
	// The lock cleared the log: a single failure does not lock again.
	l.AuthFailed(ctx, ip)
	wantDecision(t, "one failure after the lock", l.CheckClient(ctx, ip), Decision{Allowed: true})
	if got := rec.count("client_lockout/locked"); got != 7 {
		t.Errorf("client_lockout/locked = %d, want 7 (2 checks, 5 failures while locked)", got)
	}
	if got := rec.count("lockout/client"); got != 1 {
		t.Errorf("client lockouts imposed = %d, want 1", got)
	}
}

// testWriteLockout checks the key lockout: threshold, that a locked key takes nothing from
// its windows, and the headers while locked.
func testWriteLockout(t *testing.T, nb newBackend) {
	l, c, rec := newLimiter(t, nb, Config{Rate: []Window{{10, time.Minute}}, WriteLockout: Lockout{Failures: 2, Window: time.Minute, Lock: 10 * time.Minute}})
	ctx := context.Background()
	l.CheckKey(ctx, "k", false)
	l.WriteFailed(ctx, "k")
	if d := l.CheckKey(ctx, "k", false); !d.Allowed {
		t.Fatalf("after 1 write failure: %+v", d)
	}
	l.WriteFailed(ctx, "k")
	for range 20 {
		wantDecision(t, "after 2 write failures", l.CheckKey(ctx, "k", false), Decision{Limit: 10, Reset: 600, RetryAfter: 600, Locked: true})
	}
	wantDecision(t, "another key", l.CheckKey(ctx, "k2", false), Decision{Allowed: true, Limit: 10, Remaining: 9, Reset: 6})
	// Writes admitted before the lock and answered after it do not start it again.
	c.Advance(5 * time.Minute)
	for range 3 {
		l.WriteFailed(ctx, "k")
	}
	wantDecision(t, "after 3 more failures while locked", l.CheckKey(ctx, "k", false), Decision{Limit: 10, Reset: 300, RetryAfter: 300, Locked: true})
	c.Advance(5 * time.Minute)
	wantDecision(t, "after the lock", l.CheckKey(ctx, "k", false), Decision{Allowed: true, Limit: 10, Remaining: 9, Reset: 6})
	if got := rec.count("key_lockout/locked"); got != 21 {
		t.Errorf("key_lockout/locked = %d, want 21", got)
	}
	if got := rec.count("lockout/key"); got != 1 {
		t.Errorf("key lockouts imposed = %d, want 1", got)
	}
	// With the rate limits off the lockout still holds, without headers.
	l2, _, _ := newLimiter(t, nb, Config{WriteLockout: Lockout{Failures: 1, Window: time.Minute, Lock: time.Minute}})
	wantDecision(t, "no windows, not locked", l2.CheckKey(ctx, "k", false), Decision{Allowed: true})
	l2.WriteFailed(ctx, "k")
	wantDecision(t, "no windows, locked", l2.CheckKey(ctx, "k", false), Decision{RetryAfter: 60, Locked: true})
}

func testKeysAreIndependent(t *testing.T, nb newBackend) {
	l, _, _ := newLimiter(t, nb, Config{Rate: []Window{{1, time.Hour}}, AuthLockout: Lockout{1, time.Hour, time.Hour}})
	ctx := context.Background()
	for _, k := range []string{"a", "b", "{a}", "a:rate"} {
		if d := l.CheckKey(ctx, k, false); !d.Allowed {
			t.Errorf("first request of key %q: %+v", k, d)
		}
	}
	l.AuthFailed(ctx, netip.MustParseAddr("192.0.2.1"))
	if d := l.CheckClient(ctx, netip.MustParseAddr("192.0.2.2")); !d.Allowed {
		t.Errorf("a neighbour of a locked client: %+v", d)
	}
}

// testConfirm: the confirmation pages' windows count per client address, refill like any
// window, and are independent of the client's authentication lockout and of key windows.
func testConfirm(t *testing.T, nb newBackend) {
	w := Window{3, time.Minute}
	l, c, rec := newLimiter(t, nb, Config{Confirm: []Window{w}, Rate: []Window{{1, time.Hour}},
		AuthLockout: Lockout{1, time.Hour, time.Hour}})
	ctx := context.Background()
	ip, other := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")
	l.AuthFailed(ctx, ip) // locks the client out of the API, not out of the pages
	for n := 1; n <= w.Limit; n++ {
		wantDecision(t, fmt.Sprintf("page %d", n), l.CheckConfirm(ctx, ip),
			Decision{Allowed: true, Limit: 3, Remaining: 3 - n, Reset: seconds(time.Duration(n) * 20 * time.Second)})
	}
	wantDecision(t, "page over the budget", l.CheckConfirm(ctx, ip),
		Decision{Limit: 3, Remaining: 0, Reset: 60, RetryAfter: 20})
	if d := l.CheckConfirm(ctx, other); !d.Allowed || d.Remaining != 2 {
		t.Errorf("another address: %+v; want its own budget", d)
	}
	if d := l.CheckKey(ctx, ip.String(), false); !d.Allowed {
		t.Errorf("a key named like the address: %+v; want its own windows", d)
	}
	c.Advance(20 * time.Second)
	if d := l.CheckConfirm(ctx, ip); !d.Allowed || d.Remaining != 0 {
		t.Errorf("20 s later: %+v; want one more page", d)
	}
	if got := rec.count("confirm/limited"); got != 1 {
		t.Errorf("confirm/limited decisions = %d, want 1", got)
	}
	if got := rec.count("confirm/allowed"); got != 5 {
		t.Errorf("confirm/allowed decisions = %d, want 5", got)
	}
}

func TestCountsAsWriteFailure(t *testing.T) {
	for _, tt := range []struct {
		method string
		status int
		want   bool
	}{
		{"POST", 422, true}, {"PUT", 404, true}, {"DELETE", 404, true}, {"POST", 400, true}, {"POST", 413, true},
		{"POST", 401, false}, {"PUT", 403, false}, {"DELETE", 429, false}, {"POST", 499, false},
		{"POST", 201, false}, {"POST", 500, false}, {"GET", 404, false}, {"PATCH", 422, false},
	} {
		if got := CountsAsWriteFailure(tt.method, tt.status); got != tt.want {
			t.Errorf("CountsAsWriteFailure(%s, %d) = %v, want %v", tt.method, tt.status, got, tt.want)
		}
	}
}

func TestOffDecidesNothing(t *testing.T) {
	b := NewMemory(nil, 0)
	l := New(Config{}, b)
	ctx := context.Background()
	ip := netip.MustParseAddr("192.0.2.1")
	for range 100 {
		l.AuthFailed(ctx, ip)
		l.WriteFailed(ctx, "k")
		if d := l.CheckClient(ctx, ip); d != (Decision{Allowed: true}) {
			t.Fatalf("CheckClient with everything off = %+v", d)
		}
		if d := l.CheckKey(ctx, "k", true); d != (Decision{Allowed: true}) {
			t.Fatalf("CheckKey with everything off = %+v", d)
		}
		if d := l.CheckConfirm(ctx, ip); d != (Decision{Allowed: true}) {
			t.Fatalf("CheckConfirm with everything off = %+v", d)
		}
	}
	if b.Len() != 0 {
		t.Errorf("backend holds %d entries with everything off", b.Len())
	}
}

// TestSpansCarryNoSecrets checks the decision spans: their attributes and never the key or
// the address.
func TestSpansCarryNoSecrets(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := trace.NewTracerProvider(trace.WithSpanProcessor(sr))
	cfg := Config{Rate: []Window{{1, time.Minute}}, AuthLockout: Lockout{1, time.Minute, time.Minute}, WriteLockout: Lockout{1, time.Minute, time.Minute}}
	l := New(cfg, NewMemory(nil, 0), WithTracerProvider(tp))
	ctx, server := tp.Tracer("test").Start(context.Background(), "server")
	const key, ip = "key-id-4f2a", "198.51.100.77"
	l.CheckKey(ctx, key, false)
	l.CheckKey(ctx, key, false)
	l.WriteFailed(ctx, key)
	l.AuthFailed(ctx, netip.MustParseAddr(ip))
	l.CheckClient(ctx, netip.MustParseAddr(ip))

	server.End()
	spans := sr.Ended()
	if len(spans) != 6 {
		t.Fatalf("%d spans, want 6", len(spans))
	}
	seen := map[string]string{}
	for _, s := range spans {
		for _, a := range s.Attributes() {
			v := a.Value.String()
			if strings.Contains(v, key) || strings.Contains(v, ip) {
				t.Errorf("span %s attribute %s = %q carries the key or the address", s.Name(), a.Key, v)
			}
			seen[s.Name()+" "+string(a.Key)] = v
		}
	}
	for k, v := range map[string]string{
		"limits.key limits.decision":               "limited",
		"limits.key limits.window":                 "1/1m0s",
		"limits.key limits.remaining":              "0",
		"limits.key limits.retry_after":            "60",
		"limits.client_lockout limits.decision":    "locked",
		"limits.write_failure limits.lock_started": "true",
		// The last check of the request wins on the request's own span.
		"server app.ratelimit.decision": "locked",
		"server app.ratelimit.policy":   "client_lockout",
	} {
		if seen[k] != v {
			t.Errorf("span attribute %q = %q, want %q", k, seen[k], v)
		}
	}
}

// Each lockout the limiter starts is counted exactly once, by subject.
func TestLockoutsAreRecorded(t *testing.T) {
	rec := newRecorder()
	cfg := Config{AuthLockout: Lockout{Failures: 2, Window: time.Minute, Lock: time.Minute},
		WriteLockout: Lockout{Failures: 2, Window: time.Minute, Lock: time.Minute}}
	l := New(cfg, NewMemory(nil, 0), WithRecorder(rec))
	ctx := context.Background()
	ip := netip.MustParseAddr("192.0.2.7")
	l.AuthFailed(ctx, ip)
	if n := rec.count("lockout/client"); n != 0 {
		t.Errorf("after one failure: %d client lockouts, want 0", n)
	}
	l.AuthFailed(ctx, ip)
	l.WriteFailed(ctx, "key-1")
	l.WriteFailed(ctx, "key-1")
	if c, k := rec.count("lockout/client"), rec.count("lockout/key"); c != 1 || k != 1 {
		t.Errorf("lockouts: client %d, key %d; want 1 and 1", c, k)
	}
}
