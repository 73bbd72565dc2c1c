package api

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/model"
)

// TestKeyCacheBounded: the cache never grows past keyCacheMax; at the bound it drops expired
// entries first and everything only when all are live.
func TestKeyCacheBounded(t *testing.T) {
	hash := func(i int) []byte { return model.HashKey(fmt.Sprintf("sk_%040d", i)) }
	tests := []struct {
		name        string
		expireFirst int // how many of the keyCacheMax entries are expired when the next is put
		wantLen     int
	}{
		{"expired entries dropped", 10, keyCacheMax - 10 + 1},
		{"all live: cleared", 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Date(2026, 6, 11, 17, 0, 0, 0, time.UTC)
			c := newKeyCache(10 * time.Second)
			c.now = func() time.Time { return now }
			start := now
			for i := range keyCacheMax {
				if i == tt.expireFirst {
					now = start.Add(5 * time.Second) // the first expireFirst entries expire before the rest
				}
				c.put(hash(i), model.Principal{APIAccess: true}, nil)
			}
			now = start.Add(10 * time.Second) // entries put at start have just expired
			c.put(hash(keyCacheMax), model.Principal{APIAccess: true}, nil)
			if got := len(c.entries); got != tt.wantLen {
				t.Errorf("entries after putting past the bound = %d; want %d", got, tt.wantLen)
			}
			if _, ok := c.get(hash(keyCacheMax)); !ok {
				t.Errorf("the entry just put is missing")
			}
			if tt.expireFirst > 0 {
				if _, ok := c.get(hash(tt.expireFirst)); !ok {
					t.Errorf("a live entry was dropped while expired ones existed")
				}
			}
		})
	}
}

// TestKeyCacheStopsAtKeyExpiry: a rotated key is trusted until its own expiry when that comes
// before the cache's TTL (docs/api-contract.md §16.2), and for the TTL otherwise.
func TestKeyCacheStopsAtKeyExpiry(t *testing.T) {
	now := time.Date(2026, 6, 11, 17, 0, 0, 0, time.UTC)
	c := newKeyCache(10 * time.Second)
	c.now = func() time.Time { return now }
	soon, later, never := model.HashKey("sk_soon"), model.HashKey("sk_later"), model.HashKey("sk_never")
	c.put(soon, model.Principal{APIAccess: true, ExpiresAt: now.Add(3 * time.Second)}, nil)
	c.put(later, model.Principal{APIAccess: true, ExpiresAt: now.Add(time.Hour)}, nil)
	c.put(never, model.Principal{APIAccess: true}, nil)
	for _, tc := range []struct {
		after time.Duration
		hash  []byte
		want  bool
	}{
		{2 * time.Second, soon, true}, {3 * time.Second, soon, false},
		{9 * time.Second, later, true}, {10 * time.Second, later, false},
		{9 * time.Second, never, true}, {10 * time.Second, never, false},
	} {
		now = time.Date(2026, 6, 11, 17, 0, 0, 0, time.UTC).Add(tc.after)
		if _, ok := c.get(tc.hash); ok != tc.want {
			t.Errorf("after %v: cached = %v; want %v", tc.after, ok, tc.want)
		}
	}
}

// TestKeyUsageOncePerMinute: a key's use is handed to the store once per minute, whatever the
// number of requests, and a failed write is kept for the next flush.
func TestKeyUsageOncePerMinute(t *testing.T) {
	u := newKeyUsage()
	id := uuid.Must(uuid.NewV7())
	t0 := time.Date(2026, 6, 11, 17, 0, 10, 0, time.UTC)
	for i := range 100 {
		u.used(id, t0.Add(time.Duration(i)*100*time.Millisecond))
	}
	if got := u.take(); len(got) != 1 || !got[id].Equal(t0.Truncate(time.Minute)) {
		t.Fatalf("take = %v; want one use at %v", got, t0.Truncate(time.Minute))
	}
	u.used(id, t0.Add(20*time.Second))
	if got := u.take(); got != nil {
		t.Fatalf("take in the same minute = %v; want nothing", got)
	}
	u.used(id, t0.Add(time.Minute))
	got := u.take()
	if len(got) != 1 {
		t.Fatalf("take in the next minute = %v; want one use", got)
	}
	u.putBack(got)
	if again := u.take(); !again[id].Equal(got[id]) {
		t.Fatalf("take after putBack = %v; want %v", again, got)
	}
}
