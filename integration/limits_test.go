package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/internal/testredis"
	"github.com/subscriberd/subscriberd/limits"
	"github.com/subscriberd/subscriberd/repo"
)

// limitsConfig parses a configuration the way cmd does, from the variables' values.
func limitsConfig(t *testing.T, rate, bulk, auth, write string) limits.Config {
	t.Helper()
	var c limits.Config
	var err error
	if c.Rate, err = limits.ParseWindows("RATE_LIMITS", rate); err != nil {
		t.Fatal(err)
	}
	if c.Bulk, err = limits.ParseWindows("BULK_RATE_LIMITS", bulk); err != nil {
		t.Fatal(err)
	}
	if c.AuthLockout, err = limits.ParseLockout("AUTH_LOCKOUT", auth); err != nil {
		t.Fatal(err)
	}
	if c.WriteLockout, err = limits.ParseLockout("WRITE_LOCKOUT", write); err != nil {
		t.Fatal(err)
	}
	return c
}

// withLimits gives the env an in-process limiter.
func withLimits(cfg limits.Config) func(*envOptions) {
	return func(o *envOptions) { o.limiter = limits.New(cfg, limits.NewMemory(nil, 0)) }
}

// want429 checks the contract's 429: the exact envelope with the message of its cause (msg:
// api.MsgRateLimited when not given, api.MsgClientLocked, api.MsgKeyLocked), and
// errors.retry_after equal to Retry-After, within (0, max].
func want429(t *testing.T, r response, max int, msg ...string) int {
	t.Helper()
	if len(msg) == 0 { // a rate limit unless the caller names a lockout's message
		msg = []string{api.MsgRateLimited}
	}
	r.want(t, http.StatusTooManyRequests, "rate_limit_exceeded")
	ra, err := strconv.Atoi(r.header.Get("Retry-After"))
	if err != nil || ra < 1 || ra > max {
		t.Fatalf("Retry-After = %q, want whole seconds in 1..%d", r.header.Get("Retry-After"), max)
	}
	want := fmt.Sprintf(`{"success":false,"code":"rate_limit_exceeded","message":%q,"errors":{"retry_after":%d}}`, msg[0], ra)
	if got := strings.TrimSpace(string(r.raw)); got != want {
		t.Fatalf("429 body = %s, want %s", got, want)
	}
	return ra
}

// wantRateHeaders checks the RateLimit-* headers; the reset is at most the window's period.
func wantRateHeaders(t *testing.T, r response, limit, remaining int, period time.Duration) {
	t.Helper()
	if got := r.header.Get("RateLimit-Limit"); got != strconv.Itoa(limit) {
		t.Errorf("RateLimit-Limit = %q, want %d", got, limit)
	}
	if got := r.header.Get("RateLimit-Remaining"); got != strconv.Itoa(remaining) {
		t.Errorf("RateLimit-Remaining = %q, want %d", got, remaining)
	}
	if reset, err := strconv.Atoi(r.header.Get("RateLimit-Reset")); err != nil || reset < 1 || reset > int(period.Seconds()) {
		t.Errorf("RateLimit-Reset = %q, want seconds in 1..%d", r.header.Get("RateLimit-Reset"), int(period.Seconds()))
	}
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withLimits(limitsConfig(t, "5/1m", "off", "off", "off")))
	for i := range 5 {
		r := e.do("GET", "/subscribers", nil).want(t, http.StatusOK, "")
		wantRateHeaders(t, r, 5, 4-i, time.Minute)
	}
	r := e.do("GET", "/subscribers", nil)
	ra := want429(t, r, 12, api.MsgRateLimited)
	wantRateHeaders(t, r, 5, 0, time.Minute)
	// A denied request took nothing: the next answer names the same wait or less.
	if ra2 := want429(t, e.do("POST", "/subscribers", map[string]any{"email": "x@x.io"}), ra, api.MsgRateLimited); ra2 > ra {
		t.Errorf("second 429 retry_after %d > first %d", ra2, ra)
	}
	if n := e.count("SELECT count(*) FROM subscribers"); n != 0 {
		t.Errorf("a rate-limited create wrote %d subscribers", n)
	}
	// Another key has its own budget; unauthenticated answers carry no rate headers.
	_, other := e.newKey(t, true)
	e.do("GET", "/subscribers", nil, "Authorization: Bearer "+other).want(t, http.StatusOK, "")
	r = e.do("GET", "/subscribers", nil, "Authorization: Bearer sk_"+strings.Repeat("0", 40)).want(t, http.StatusUnauthorized, "unauthorized")
	if h := r.header.Get("RateLimit-Limit"); h != "" {
		t.Errorf("a 401 carries RateLimit-Limit %q", h)
	}
	r = e.do("GET", "/openapi.json", nil)
	if r.status != http.StatusOK || r.header.Get("RateLimit-Limit") != "" {
		t.Errorf("openapi.json: status %d, RateLimit-Limit %q; want 200 without rate headers", r.status, r.header.Get("RateLimit-Limit"))
	}
}

func TestBulkRateLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withLimits(limitsConfig(t, "10/1m", "2/1m", "off", "off")))
	for i := range 2 {
		r := e.do("POST", "/subscribers/bulk", []any{map[string]any{"email": fmt.Sprintf("b%d@x.io", i)}}).want(t, http.StatusCreated, "")
		wantRateHeaders(t, r, 2, 1-i, time.Minute)
	}
	want429(t, e.do("POST", "/subscribers/bulk", []any{map[string]any{"email": "b9@x.io"}}), 30, api.MsgRateLimited)
	// The bulk requests counted in the general window too: 10 - 2 = 8, and this one leaves 7.
	r := e.do("GET", "/subscribers", nil).want(t, http.StatusOK, "")
	wantRateHeaders(t, r, 10, 7, time.Minute)
}

func TestAuthLockout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withLimits(limitsConfig(t, "off", "off", "3/10m:15m", "off")))
	bad := "Authorization: Bearer sk_" + strings.Repeat("x", 40)
	e.do("GET", "/subscribers", nil, bad).want(t, http.StatusUnauthorized, "unauthorized")
	e.do("GET", "/subscribers", nil, "Authorization:").want(t, http.StatusUnauthorized, "unauthorized")
	// The valid key still works before the threshold.
	e.do("GET", "/subscribers", nil).want(t, http.StatusOK, "")
	// The 3rd failure still gets its 401 ...
	e.do("POST", "/subscribers", map[string]any{"email": "a@x.io"}, bad).want(t, http.StatusUnauthorized, "unauthorized")
	// ... and from then on everything from this client is 429, the valid key included, and a
	// bad key learns nothing.
	if ra := want429(t, e.do("GET", "/subscribers", nil), 900, api.MsgClientLocked); ra < 899 {
		t.Errorf("retry_after %d, want about 15 minutes", ra)
	}
	want429(t, e.do("GET", "/subscribers", nil, bad), 900, api.MsgClientLocked)
	want429(t, e.do("POST", "/subscribers", map[string]any{"email": "b@x.io"}), 900, api.MsgClientLocked)
	// Routing and the key-free documents answer as before.
	e.do("GET", "/nowhere", nil).want(t, http.StatusNotFound, "not_found")
	if r := e.do("GET", "/openapi.json", nil); r.status != http.StatusOK {
		t.Errorf("openapi.json while locked out: %d", r.status)
	}
}

func TestSpoofedForwardedForDoesNotEscape(t *testing.T) {
	t.Parallel()
	// No trusted proxies: X-Forwarded-For is the client's own claim and changes nothing.
	e := newEnv(t, withLimits(limitsConfig(t, "off", "off", "3/10m:15m", "off")))
	bad := "Authorization: Bearer sk_" + strings.Repeat("y", 40)
	for i := range 3 {
		e.do("GET", "/subscribers", nil, bad, fmt.Sprintf("X-Forwarded-For: 198.51.100.%d", i)).
			want(t, http.StatusUnauthorized, "unauthorized")
	}
	want429(t, e.do("GET", "/subscribers", nil, "X-Forwarded-For: 203.0.113.99"), 900, api.MsgClientLocked)
}

func TestTrustedProxy(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withLimits(limitsConfig(t, "off", "off", "3/10m:15m", "off")),
		func(o *envOptions) {
			o.trusted = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
		})
	bad := "Authorization: Bearer sk_" + strings.Repeat("z", 40)
	for range 3 {
		e.do("GET", "/subscribers", nil, bad, "X-Forwarded-For: 203.0.113.1").want(t, http.StatusUnauthorized, "unauthorized")
	}
	want429(t, e.do("GET", "/subscribers", nil, "X-Forwarded-For: 203.0.113.1"), 900, api.MsgClientLocked)
	// Another client behind the same proxy is not locked out.
	e.do("GET", "/subscribers", nil, "X-Forwarded-For: 203.0.113.2").want(t, http.StatusOK, "")
	// The locked client cannot escape by sending its own header: the proxy appends its address.
	want429(t, e.do("GET", "/subscribers", nil, "X-Forwarded-For: 203.0.113.2, 203.0.113.1"), 900, api.MsgClientLocked)
}

func TestWriteLockout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withLimits(limitsConfig(t, "100/1m", "off", "off", "3/10m:10m")))
	e.do("POST", "/subscribers", map[string]any{"email": "dup@x.io"}).want(t, http.StatusCreated, "")
	e.do("POST", "/subscribers", map[string]any{"email": "not an email"}).want(t, http.StatusUnprocessableEntity, "validation_error")
	e.do("PUT", "/subscribers/00000000-0000-0000-0000-000000000000", map[string]any{"name": "x"}).want(t, http.StatusNotFound, "not_found")
	// Reads do not count, whatever their status.
	for range 5 {
		e.do("GET", "/subscribers/00000000-0000-0000-0000-000000000000", nil).want(t, http.StatusNotFound, "not_found")
	}
	e.do("POST", "/subscribers", map[string]any{"email": "dup@x.io"}).want(t, http.StatusUnprocessableEntity, "email_already_subscribed")
	r := e.do("GET", "/subscribers", nil)
	if ra := want429(t, r, 600, api.MsgKeyLocked); ra < 599 {
		t.Errorf("retry_after %d, want about 10 minutes", ra)
	}
	if got := r.header.Get("RateLimit-Remaining"); got != "0" {
		t.Errorf("RateLimit-Remaining while locked = %q, want 0", got)
	}
	// The lockout is the key's: another key of the same client goes on.
	_, other := e.newKey(t, true)
	e.do("GET", "/subscribers", nil, "Authorization: Bearer "+other).want(t, http.StatusOK, "")
}

// TestWriteLockoutIgnores401403429 sends many 401, 403 and 429 answers to writes and wants no
// lockout; then two 422s, to show the same configuration does lock.
func TestWriteLockoutIgnores401403429(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withLimits(limitsConfig(t, "100/1m", "1/1h", "off", "2/10m:10m")),
		func(o *envOptions) { o.keyCacheTTL = -1 })
	ctx := context.Background()
	one := []any{map[string]any{"email": "bulk@x.io"}}

	// 403: the plan has API access off.
	if _, err := e.accounts.UpdateNewsletter(ctx, e.nl, new(false), nil); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		e.do("POST", "/subscribers", map[string]any{"email": "a@x.io"}).want(t, http.StatusForbidden, "api_access_disabled")
		e.do("DELETE", "/subscribers/00000000-0000-0000-0000-000000000000", nil).want(t, http.StatusForbidden, "api_access_disabled")
	}
	if _, err := e.accounts.UpdateNewsletter(ctx, e.nl, new(true), nil); err != nil {
		t.Fatal(err)
	}
	// 429: the bulk window allows one an hour.
	e.do("POST", "/subscribers/bulk", one).want(t, http.StatusCreated, "")
	for range 3 {
		want429(t, e.do("POST", "/subscribers/bulk", one), 3600, api.MsgRateLimited)
	}
	// 401: no key at all.
	for range 3 {
		e.do("PUT", "/subscribers/00000000-0000-0000-0000-000000000000", map[string]any{"name": "x"}, "Authorization:").
			want(t, http.StatusUnauthorized, "unauthorized")
	}
	e.do("POST", "/subscribers", map[string]any{"email": "ok@x.io"}).want(t, http.StatusCreated, "")

	// The control: two 422s lock the key.
	for range 2 {
		e.do("POST", "/subscribers", map[string]any{"email": "bad"}).want(t, http.StatusUnprocessableEntity, "validation_error")
	}
	want429(t, e.do("GET", "/subscribers", nil), 600, api.MsgKeyLocked)
}

// instance is another service instance on e's database with its own limiter.
func (e *env) instance(t *testing.T, l api.Limiter) string {
	t.Helper()
	srv := httptest.NewServer(recordTraffic(api.New(api.Config{Store: repo.NewSubscribers(e.db), Auth: e.accounts, Limiter: l})))
	t.Cleanup(srv.Close)
	return srv.URL + api.BasePath
}

// redisLimiter is a limiter on the test Redis under prefix, with the in-process fallback,
// through addr when given (a proxy) instead of Redis itself.
func redisLimiter(t *testing.T, cfg limits.Config, prefix, addr string) (*limits.Limiter, *limits.Failover) {
	t.Helper()
	opt, err := limits.RedisOptions(testredis.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	if addr != "" {
		opt.Addr = addr
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	f := limits.NewFailover(context.Background(), limits.NewRedis(rdb, prefix, nil), limits.NewMemory(nil, 0), nil, nil, 50*time.Millisecond)
	t.Cleanup(f.Close)
	return limits.New(cfg, f), f
}

// TestInstancesShareOneBudget runs two service instances on one database and one Redis: the
// key's budget and the client's lockout are the same on both.
func TestInstancesShareOneBudget(t *testing.T) {
	t.Parallel()
	cfg := limitsConfig(t, "5/1m", "off", "2/10m:15m", "off")
	prefix := testredis.Prefix(t)
	la, _ := redisLimiter(t, cfg, prefix, "")
	lb, _ := redisLimiter(t, cfg, prefix, "")
	e := newEnv(t, func(o *envOptions) { o.limiter = la })
	b := e.instance(t, lb)
	for i := range 5 {
		base := e.base
		if i%2 == 1 {
			base = b
		}
		r := e.do("GET", base+"/subscribers", nil).want(t, http.StatusOK, "")
		wantRateHeaders(t, r, 5, 4-i, time.Minute)
	}
	want429(t, e.do("GET", b+"/subscribers", nil), 12, api.MsgRateLimited)
	want429(t, e.do("GET", "/subscribers", nil), 12, api.MsgRateLimited)

	// One auth failure on each instance locks the client out of both.
	_, other := e.newKey(t, true)
	bad := "Authorization: Bearer sk_" + strings.Repeat("q", 40)
	e.do("GET", "/subscribers", nil, bad).want(t, http.StatusUnauthorized, "unauthorized")
	e.do("GET", b+"/subscribers", nil, bad).want(t, http.StatusUnauthorized, "unauthorized")
	want429(t, e.do("GET", "/subscribers", nil, "Authorization: Bearer "+other), 900, api.MsgClientLocked)
	want429(t, e.do("GET", b+"/subscribers", nil, "Authorization: Bearer "+other), 900, api.MsgClientLocked)
}

// TestRedisOutage: Redis becomes unreachable mid-test and both instances keep serving, each
// deciding alone; Redis comes back and the budget is shared again.
func TestRedisOutage(t *testing.T) {
	t.Parallel()
	cfg := limitsConfig(t, "4/1h", "off", "off", "off")
	prefix := testredis.Prefix(t)
	u, err := url.Parse(testredis.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := newTCPProxy(t, u.Host)
	la, fa := redisLimiter(t, cfg, prefix, proxy.addr)
	lb, fb := redisLimiter(t, cfg, prefix, proxy.addr)
	e := newEnv(t, func(o *envOptions) { o.limiter = la })
	b := e.instance(t, lb)
	_, key2 := e.newKey(t, true)
	_, key3 := e.newKey(t, true)
	k2, k3 := "Authorization: Bearer "+key2, "Authorization: Bearer "+key3

	e.do("GET", "/subscribers", nil).want(t, http.StatusOK, "")
	e.do("GET", b+"/subscribers", nil).want(t, http.StatusOK, "")

	proxy.cut()
	// Served throughout, each instance counting alone from zero.
	for i := range 3 {
		wantRateHeaders(t, e.do("GET", "/subscribers", nil, k2).want(t, http.StatusOK, ""), 4, 3-i, time.Hour)
		wantRateHeaders(t, e.do("GET", b+"/subscribers", nil, k2).want(t, http.StatusOK, ""), 4, 3-i, time.Hour)
	}
	if fa.Up() || fb.Up() {
		t.Fatal("an instance still uses Redis through a cut proxy")
	}

	proxy.restore()
	deadline := time.Now().Add(10 * time.Second)
	for !fa.Up() || !fb.Up() {
		if time.Now().After(deadline) {
			t.Fatal("the instances did not return to Redis within 10 s of it coming back")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Shared again: what Redis held before still counts, and a new budget is one budget.
	wantRateHeaders(t, e.do("GET", b+"/subscribers", nil).want(t, http.StatusOK, ""), 4, 1, time.Hour)
	for i := range 4 {
		base := e.base
		if i%2 == 1 {
			base = b
		}
		wantRateHeaders(t, e.do("GET", base+"/subscribers", nil, k3).want(t, http.StatusOK, ""), 4, 3-i, time.Hour)
	}
	want429(t, e.do("GET", "/subscribers", nil, k3), 900, api.MsgRateLimited)
}

// TestOpenAPIDocumentsLimitHeaders: the document declares the headers the server sends.
func TestOpenAPIDocumentsLimitHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.do("GET", "/openapi.json", nil)
	if r.status != http.StatusOK {
		t.Fatalf("openapi.json = %d", r.status)
	}
	var doc struct {
		Paths map[string]map[string]struct {
			Responses map[string]struct {
				Headers map[string]any `json:"headers"`
			} `json:"responses"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(r.raw, &doc); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, method, status, header string }{
		{"/api/v1/subscribers", "get", "200", "RateLimit-Limit"},
		{"/api/v1/subscribers", "post", "201", "RateLimit-Remaining"},
		{"/api/v1/subscribers/bulk", "post", "422", "RateLimit-Reset"},
		{"/api/v1/subscribers/{id}", "delete", "429", "Retry-After"},
		{"/api/v1/subscribers/{id}", "put", "429", "RateLimit-Limit"},
	} {
		if _, ok := doc.Paths[c.path][c.method].Responses[c.status].Headers[c.header]; !ok {
			t.Errorf("%s %s %s: header %s not declared", c.method, c.path, c.status, c.header)
		}
	}
	if _, ok := doc.Paths["/api/v1/subscribers"]["get"].Responses["401"].Headers["RateLimit-Limit"]; ok {
		t.Error("401 declares RateLimit-Limit, which it never carries")
	}
}
