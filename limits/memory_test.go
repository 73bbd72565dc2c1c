package limits

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestMemoryEvictsIdleEntries checks that memory follows the active subjects: entries are
// dropped once they carry no state, and the decisions do not change for it.
func TestMemoryEvictsIdleEntries(t *testing.T) {
	c := newClock()
	m := NewMemory(c.Now, 0)
	cfg := Config{
		Rate: []Window{{10, time.Minute}, {100, time.Hour}}, Bulk: []Window{{5, time.Minute}},
		AuthLockout: Lockout{3, 10 * time.Minute, 15 * time.Minute}, WriteLockout: Lockout{3, 10 * time.Minute, 10 * time.Minute},
	}
	l := New(cfg, m)
	ctx := context.Background()
	for i := range 1000 {
		k := fmt.Sprintf("key-%d", i)
		l.CheckKey(ctx, k, true)
		l.WriteFailed(ctx, k)
		ip := netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})
		for range 3 {
			l.AuthFailed(ctx, ip) // the third locks: one lock entry, no log
		}
	}
	// 3 buckets + 1 write log per key, 1 client lock per address.
	if got, want := m.Len(), 1000*5; got != want {
		t.Fatalf("entries after 1000 keys and addresses = %d, want %d", got, want)
	}
	// An hour later every bucket has refilled, every log has aged out and every lock ended;
	// the next call sweeps them all.
	c.Advance(time.Hour)
	if d := l.CheckKey(ctx, "fresh", false); !d.Allowed || d.Remaining != 9 {
		t.Fatalf("fresh key after the sweep: %+v", d)
	}
	if got, want := m.Len(), 2; got != want {
		t.Errorf("entries an hour later = %d, want %d (the fresh key's two buckets)", got, want)
	}
	if d := l.CheckKey(ctx, "key-1", true); !d.Allowed || d.Remaining != 4 {
		t.Errorf("an evicted key answers as new: %+v", d)
	}
}

// TestMemoryBound checks the hard bound: a full backend sweeps, and if still full decides a
// new subject as fresh without remembering it (fail open) while known subjects keep their
// state.
func TestMemoryBound(t *testing.T) {
	c := newClock()
	m := NewMemory(c.Now, 10)
	l := New(Config{Rate: []Window{{2, time.Hour}}, AuthLockout: Lockout{2, time.Hour, time.Hour}}, m)
	ctx := context.Background()
	for i := range 50 {
		if d := l.CheckKey(ctx, fmt.Sprint("k", i), false); !d.Allowed {
			t.Fatalf("key %d: %+v", i, d)
		}
		l.AuthFailed(ctx, netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}))
		if m.Len() > 10 {
			t.Fatalf("%d entries, bound 10", m.Len())
		}
	}
	// k0..k4 and five logs filled the backend; k0 is remembered: its third request is denied.
	l.CheckKey(ctx, "k0", false)
	if d := l.CheckKey(ctx, "k0", false); d.Allowed {
		t.Errorf("a remembered key lost its state: %+v", d)
	}
	// Once the entries carry no state, room comes back.
	c.Advance(time.Hour)
	l.CheckKey(ctx, "late", false)
	l.CheckKey(ctx, "late", false)
	if d := l.CheckKey(ctx, "late", false); d.Allowed {
		t.Errorf("a key seen after the sweep is not remembered: %+v", d)
	}
}

// TestMemoryConcurrent takes from one bucket from many goroutines at one instant: exactly the
// limit is allowed. Run with -race.
func TestMemoryConcurrent(t *testing.T) {
	c := newClock()
	l := New(Config{Rate: []Window{{100, time.Minute}}, WriteLockout: Lockout{1000, time.Minute, time.Minute}}, NewMemory(c.Now, 0))
	ctx := context.Background()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for range 50 {
				if l.CheckKey(ctx, "k", g%2 == 0).Allowed {
					allowed.Add(1)
				}
				l.WriteFailed(ctx, "other")
			}
		})
	}
	wg.Wait()
	if got := allowed.Load(); got != 100 {
		t.Errorf("%d allowed from 400 concurrent requests, want exactly 100", got)
	}
}

// TestMemoryFullSweepsAtMostOnceASecond: a full backend sweeps for room at most once a
// second, so that a flood of new subjects does not scan every entry on each request.
func TestMemoryFullSweepsAtMostOnceASecond(t *testing.T) {
	c := newClock()
	m := NewMemory(c.Now, 2)
	now := func() int64 { return c.Now().UnixMicro() }
	m.tats["a"], m.tats["b"] = now()+500_000, now()+500_000 // stale in half a second
	if m.room(now()) {
		t.Fatal("room in a full backend of live entries")
	}
	c.Advance(600 * time.Millisecond) // both stale now, but the last sweep was 0.6 s ago
	if m.room(now()) || m.Len() != 2 {
		t.Fatalf("swept again within a second: room, %d entries", m.Len())
	}
	c.Advance(500 * time.Millisecond)
	if !m.room(now()) || m.Len() != 0 {
		t.Fatalf("no sweep a second later: %d entries", m.Len())
	}
}

// TestClientLockoutCountsAnIPv6Network: an IPv6 client's failures count for its /64, so that
// changing the address within it does not escape the lockout; another /64 is not locked.
func TestClientLockoutCountsAnIPv6Network(t *testing.T) {
	c := newClock()
	l := New(Config{AuthLockout: Lockout{3, time.Hour, time.Hour}}, NewMemory(c.Now, 0))
	ctx := context.Background()
	for i := range 3 {
		l.AuthFailed(ctx, netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(i + 1)}))
	}
	if d := l.CheckClient(ctx, netip.MustParseAddr("2001:db8::ffff:1")); d.Allowed {
		t.Error("another address of the same /64 is not locked")
	}
	if d := l.CheckClient(ctx, netip.MustParseAddr("2001:db8:0:1::1")); !d.Allowed {
		t.Errorf("the next /64 is locked: %+v", d)
	}
	// IPv4, mapped or not, counts per address.
	for range 3 {
		l.AuthFailed(ctx, netip.MustParseAddr("::ffff:192.0.2.1"))
	}
	if l.CheckClient(ctx, netip.MustParseAddr("192.0.2.1")).Allowed || !l.CheckClient(ctx, netip.MustParseAddr("192.0.2.2")).Allowed {
		t.Error("IPv4 lockout is not per address")
	}
}

// TestMemoryFailureLogsHaveAQuota: failures from ever new clients fill only the failure logs'
// quota; then a new client's failures are not counted, while keys keep their windows.
func TestMemoryFailureLogsHaveAQuota(t *testing.T) {
	c := newClock()
	m := NewMemory(c.Now, 100)
	m.maxLogs = 4
	l := New(Config{Rate: []Window{{2, time.Hour}}, AuthLockout: Lockout{2, time.Hour, time.Hour}}, m)
	ctx := context.Background()
	for i := range 50 {
		l.AuthFailed(ctx, netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}))
	}
	if len(m.logs) != 4 {
		t.Fatalf("%d failure logs, quota 4", len(m.logs))
	}
	// A new client's failures are not counted: no lockout.
	l.AuthFailed(ctx, netip.MustParseAddr("198.51.100.1"))
	l.AuthFailed(ctx, netip.MustParseAddr("198.51.100.1"))
	if d := l.CheckClient(ctx, netip.MustParseAddr("198.51.100.1")); !d.Allowed {
		t.Errorf("a client beyond the quota was locked: %+v", d)
	}
	// A key still gets its window: its third request in the hour is refused.
	l.CheckKey(ctx, "k", false)
	l.CheckKey(ctx, "k", false)
	if d := l.CheckKey(ctx, "k", false); d.Allowed {
		t.Error("a key lost its window to the failure logs")
	}
}
