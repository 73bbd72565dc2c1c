package api

import (
	"fmt"
	"testing"
	"time"

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
