package limits

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/subscriberd/subscriberd/internal/logbuf"
	"github.com/subscriberd/subscriberd/internal/testredis"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testredis.Stop()
	os.Exit(code)
}

func redisBackend(t *testing.T, now func() time.Time) Backend {
	rdb, prefix := testredis.Client(t)
	return NewRedis(rdb, prefix, now)
}

func TestRedisConformance(t *testing.T) {
	for _, c := range conformance {
		t.Run(c.name, func(t *testing.T) { c.run(t, redisBackend) })
	}
}

// TestRedisMatchesMemory plays one random sequence of calls against both backends at the
// same injected instants and wants the same decision every time.
func TestRedisMatchesMemory(t *testing.T) {
	cfg := Config{
		Rate: []Window{{5, time.Minute}, {9, time.Hour}, {13, 24 * time.Hour}}, Bulk: []Window{{2, time.Minute}, {4, time.Hour}},
		AuthLockout: Lockout{3, 10 * time.Minute, 15 * time.Minute}, WriteLockout: Lockout{4, 10 * time.Minute, 10 * time.Minute},
	}
	c := newClock()
	mem := New(cfg, NewMemory(c.Now, 0))
	red := New(cfg, redisBackend(t, c.Now))
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	keys := []string{"a", "b", "c"}
	ips := []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")}
	for i := range 600 {
		var op string
		var dm, dr Decision
		switch n := rng.IntN(10); {
		case n < 5:
			k, bulk := keys[rng.IntN(len(keys))], rng.IntN(3) == 0
			op = fmt.Sprintf("CheckKey(%s, bulk=%v)", k, bulk)
			dm, dr = mem.CheckKey(ctx, k, bulk), red.CheckKey(ctx, k, bulk)
		case n < 6:
			k := keys[rng.IntN(len(keys))]
			op = "WriteFailed(" + k + ")"
			mem.WriteFailed(ctx, k)
			red.WriteFailed(ctx, k)
		case n < 7:
			ip := ips[rng.IntN(len(ips))]
			op = "AuthFailed(" + ip.String() + ")"
			dm, dr = mem.AuthFailed(ctx, ip), red.AuthFailed(ctx, ip)
		case n < 8:
			ip := ips[rng.IntN(len(ips))]
			op = "CheckClient(" + ip.String() + ")"
			dm, dr = mem.CheckClient(ctx, ip), red.CheckClient(ctx, ip)
		default:
			d := time.Duration(rng.Int64N(int64(3 * time.Minute)))
			op = "Advance(" + d.String() + ")"
			c.Advance(d)
		}
		if dm != dr {
			t.Fatalf("step %d %s: memory decided %+v, redis %+v", i, op, dm, dr)
		}
	}
}

// TestRedisServerTime uses the Redis server's clock, as production does.
func TestRedisServerTime(t *testing.T) {
	rdb, prefix := testredis.Client(t)
	cfg := Config{Rate: []Window{{3, time.Minute}}, AuthLockout: Lockout{2, time.Minute, time.Hour}}
	// Two instances on one Redis share one budget.
	a, b := New(cfg, NewRedis(rdb, prefix, nil)), New(cfg, NewRedis(rdb, prefix, nil))
	ctx := context.Background()
	for i, l := range []*Limiter{a, b, a} {
		if d := l.CheckKey(ctx, "k", false); !d.Allowed || d.Remaining != 2-i {
			t.Fatalf("request %d: %+v, want allowed with %d left", i+1, d, 2-i)
		}
	}
	d := b.CheckKey(ctx, "k", false)
	if d.Allowed || d.RetryAfter < 19 || d.RetryAfter > 20 {
		t.Fatalf("4th request: %+v, want denied with retry_after 20 (19 on a slow machine)", d)
	}
	a.AuthFailed(ctx, netip.MustParseAddr("192.0.2.1"))
	b.AuthFailed(ctx, netip.MustParseAddr("192.0.2.1"))
	if d := a.CheckClient(ctx, netip.MustParseAddr("192.0.2.1")); d.Allowed || d.RetryAfter < 3599 {
		t.Fatalf("client after 2 failures on 2 instances: %+v, want locked for an hour", d)
	}
	ttl, err := rdb.PTTL(ctx, prefix+clientLockKey(netip.MustParseAddr("192.0.2.1"))).Result()
	if err != nil || ttl <= 59*time.Minute || ttl > time.Hour {
		t.Errorf("lock key TTL = %v, %v; want about an hour (keys expire on their own)", ttl, err)
	}
}

// proxy forwards TCP connections to a Redis, and can cut it off and bring it back on the
// same address: Redis becomes unreachable for the client without stopping it.
type proxy struct {
	t      testing.TB
	addr   string
	target string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

func newProxy(t testing.TB, target string) *proxy {
	p := &proxy{t: t, target: target, addr: "127.0.0.1:0", conns: map[net.Conn]bool{}}
	p.Start()
	t.Cleanup(p.Stop)
	return p
}

// Start listens again on the proxy's address and forwards.
func (p *proxy) Start() { p.listen(true) }

// Hang cuts the open connections and then accepts new ones but never answers: Redis is
// reachable but does not respond, and only timeouts save the caller.
func (p *proxy) Hang() {
	p.Stop()
	p.listen(false)
}

func (p *proxy) listen(forward bool) {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("proxy listen: %v", err)
	}
	p.mu.Lock()
	p.ln, p.addr = ln, ln.Addr().String()
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !forward {
				p.mu.Lock()
				p.conns[c] = true
				p.mu.Unlock()
				continue
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[up] = true, true
			p.mu.Unlock()
			p.wg.Go(func() { io.Copy(up, c); up.Close(); c.Close() })
			p.wg.Go(func() { io.Copy(c, up); up.Close(); c.Close() })
		}
	})
}

// Stop refuses new connections and cuts the open ones.
func (p *proxy) Stop() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
	p.mu.Unlock()
	p.wg.Wait()
}

// TestFailover: two instances share a budget through Redis; Redis becomes unreachable and
// each keeps deciding in process, logging the change once; Redis comes back and the budget
// is shared again.
func TestFailover(t *testing.T) {
	prefix := testredis.Prefix(t)
	opt, err := RedisOptions(testredis.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	px := newProxy(t, opt.Addr)
	opt.Addr = px.addr
	cfg := Config{Rate: []Window{{4, time.Hour}}, AuthLockout: Lockout{2, time.Hour, time.Hour}}
	ctx := context.Background()

	type instance struct {
		l   *Limiter
		f   *Failover
		rec *recorder
		log *logbuf.Buffer
	}
	newInstance := func() instance {
		rdb := redis.NewClient(opt)
		t.Cleanup(func() { rdb.Close() })
		var in instance
		in.rec, in.log = newRecorder(), &logbuf.Buffer{}
		logger := slog.New(slog.NewTextHandler(in.log, nil))
		in.f = NewFailover(ctx, NewRedis(rdb, prefix, nil), NewMemory(nil, 0), logger, in.rec, 50*time.Millisecond)
		t.Cleanup(in.f.Close)
		in.l = New(cfg, in.f, WithRecorder(in.rec), WithLogger(logger))
		if up := <-in.rec.upCh; !up {
			t.Fatal("the failover started down")
		}
		return in
	}
	a, b := newInstance(), newInstance()

	take := func(who string, in instance, key string, wantAllowed bool, wantLeft int) {
		t.Helper()
		d := in.l.CheckKey(ctx, key, false)
		if d.Allowed != wantAllowed || d.Allowed && d.Remaining != wantLeft {
			t.Fatalf("%s %s: %+v, want allowed=%v with %d left", who, key, d, wantAllowed, wantLeft)
		}
	}
	// Shared: four requests over two instances use the one budget.
	take("a", a, "k1", true, 3)
	take("b", b, "k1", true, 2)
	take("a", a, "k1", true, 1)
	take("b", b, "k1", true, 0)
	take("a", a, "k1", false, 0)

	px.Stop()
	// Each instance now decides alone, from empty counters: requests are served.
	for i := range 3 {
		take("a (redis down)", a, "k2", true, 3-i)
		take("b (redis down)", b, "k2", true, 3-i)
	}
	a.l.AuthFailed(ctx, netip.MustParseAddr("192.0.2.1"))
	b.l.AuthFailed(ctx, netip.MustParseAddr("192.0.2.1"))
	if d := a.l.CheckClient(ctx, netip.MustParseAddr("192.0.2.1")); !d.Allowed {
		t.Errorf("one failure per instance locked a client while Redis was down: %+v", d)
	}
	for _, in := range []instance{a, b} {
		if up := <-in.rec.upCh; up {
			t.Fatal("BackendUp(true) while Redis is unreachable")
		}
		if in.f.Up() {
			t.Error("Failover.Up() while Redis is unreachable")
		}
	}

	px.Start()
	for _, in := range []instance{a, b} {
		select {
		case up := <-in.rec.upCh:
			if !up {
				t.Fatal("BackendUp(false) twice in a row")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no recovery 10 s after Redis came back")
		}
	}
	// Shared again, and what Redis held before the outage still counts.
	take("a (redis back)", a, "k1", false, 0)
	take("a (redis back)", a, "k3", true, 3)
	take("b (redis back)", b, "k3", true, 2)

	for name, in := range map[string]instance{"a": a, "b": b} {
		logs := in.log.String()
		if n := strings.Count(logs, "Redis unreachable"); n != 1 {
			t.Errorf("instance %s logged the outage %d times, want once:\n%s", name, n, logs)
		}
		if n := strings.Count(logs, "Redis answers again"); n != 1 {
			t.Errorf("instance %s logged the recovery %d times, want once:\n%s", name, n, logs)
		}
		if strings.Contains(logs, "k1") || strings.Contains(logs, "192.0.2.1") {
			t.Errorf("instance %s logged a key or an address:\n%s", name, logs)
		}
	}
}

// TestFailoverOnHang: a Redis that accepts connections but never answers costs a request
// one timeout, after which the instance decides in process; it returns to Redis once Redis
// answers again. This needs the short timeouts of RedisOptions to reach the socket.
func TestFailoverOnHang(t *testing.T) {
	prefix := testredis.Prefix(t)
	opt, err := RedisOptions(testredis.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	px := newProxy(t, opt.Addr)
	opt.Addr = px.addr
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	rec := newRecorder()
	f := NewFailover(context.Background(), NewRedis(rdb, prefix, nil), NewMemory(nil, 0), nil, rec, 50*time.Millisecond)
	t.Cleanup(f.Close)
	if up := <-rec.upCh; !up {
		t.Fatal("started down")
	}
	l := New(Config{Rate: []Window{{3, time.Hour}}}, f)
	ctx := context.Background()
	if d := l.CheckKey(ctx, "k", false); !d.Allowed || d.Remaining != 2 {
		t.Fatalf("through Redis: %+v", d)
	}

	px.Hang()
	// The request context has no deadline: only the client's own timeouts end the wait.
	if d := l.CheckKey(ctx, "k", false); !d.Allowed || d.Remaining != 2 {
		t.Fatalf("with Redis hanging: %+v, want a fresh in-process decision (2 left)", d)
	}
	if up := <-rec.upCh; up || f.Up() {
		t.Fatal("still on Redis while it hangs")
	}

	px.Stop()
	px.Start()
	select {
	case up := <-rec.upCh:
		if !up {
			t.Fatal("reported down twice")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no recovery 10 s after Redis answered again")
	}
	// Back on Redis, which still holds the first request.
	if d := l.CheckKey(ctx, "k", false); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("back on Redis: %+v, want 1 left", d)
	}
}

// TestRedisErrorFailsOpen: a plain Redis backend (no failover) that fails lets requests
// through rather than failing them.
func TestRedisErrorFailsOpen(t *testing.T) {
	opt, err := RedisOptions("redis://127.0.0.1:1/0")
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	l := New(Config{Rate: []Window{{1, time.Hour}}, AuthLockout: Lockout{1, time.Hour, time.Hour}}, NewRedis(rdb, "", nil))
	ctx := context.Background()
	for range 3 {
		if d := l.CheckKey(ctx, "k", false); d != (Decision{Allowed: true}) {
			t.Fatalf("CheckKey with Redis unreachable = %+v, want allowed without headers", d)
		}
		l.AuthFailed(ctx, netip.MustParseAddr("192.0.2.1"))
		if d := l.CheckClient(ctx, netip.MustParseAddr("192.0.2.1")); !d.Allowed {
			t.Fatalf("CheckClient with Redis unreachable = %+v, want allowed", d)
		}
	}
	var opErr *net.OpError
	if _, err := NewRedis(rdb, "", nil).Take(ctx, "x", nil); !errors.As(err, &opErr) {
		t.Errorf("Take error = %v, want the network error", err)
	}
}

// BenchmarkCheckKey measures one rate decision with the default limits: the three general
// windows (plain) or the general and bulk windows (bulk), in process and on Redis.
func BenchmarkCheckKey(b *testing.B) {
	rate, _ := ParseWindows("RATE_LIMITS", DefaultRateLimits)
	bulk, _ := ParseWindows("BULK_RATE_LIMITS", DefaultBulkRateLimits)
	wl, _ := ParseLockout("WRITE_LOCKOUT", DefaultWriteLockout)
	// Limits far above what a benchmark reaches, so every request takes the full path.
	for i := range rate {
		rate[i].Limit *= 1_000_000
	}
	for i := range bulk {
		bulk[i].Limit *= 1_000_000
	}
	cfg := Config{Rate: rate, Bulk: bulk, WriteLockout: wl}
	backends := []struct {
		name string
		new  func(b *testing.B) Backend
	}{
		{"memory", func(*testing.B) Backend { return NewMemory(nil, 0) }},
		{"redis", func(b *testing.B) Backend { rdb, prefix := testredis.Client(b); return NewRedis(rdb, prefix, nil) }},
	}
	for _, be := range backends {
		for _, isBulk := range []bool{false, true} {
			name := be.name + "/plain"
			if isBulk {
				name = be.name + "/bulk"
			}
			b.Run(name, func(b *testing.B) {
				l := New(cfg, be.new(b))
				ctx := context.Background()
				keys := make([]string, 1000)
				for i := range keys {
					keys[i] = fmt.Sprintf("key-%d", i)
				}
				b.ResetTimer()
				i := 0
				for b.Loop() {
					if !l.CheckKey(ctx, keys[i%len(keys)], isBulk).Allowed {
						b.Fatal("denied")
					}
					i++
				}
			})
		}
	}
	b.Run("memory/parallel", func(b *testing.B) {
		l := New(cfg, NewMemory(nil, 0))
		ctx := context.Background()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				l.CheckKey(ctx, "key-"+fmt.Sprint(i%1000), false)
				i++
			}
		})
	})
}
