package api

import (
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/subscriberd/subscriberd/model"
)

// keyCacheMax bounds the cache; past it, expired entries are dropped, then everything.
const keyCacheMax = 10000

// keyCache remembers verified keys by hash for a short time, so most requests skip the
// database. Only the hash is held, never the key.
type keyCache struct {
	ttl time.Duration
	now func() time.Time

	mu      sync.RWMutex
	entries map[[32]byte]keyEntry
}

type keyEntry struct {
	p       model.Principal
	event   []trace.EventOption // the options of the key's auth event (authEvent)
	expires time.Time
}

func newKeyCache(ttl time.Duration) *keyCache {
	return &keyCache{ttl: ttl, now: time.Now, entries: map[[32]byte]keyEntry{}}
}

func (c *keyCache) get(hash []byte) (keyEntry, bool) {
	if c.ttl < 0 {
		return keyEntry{}, false
	}
	c.mu.RLock()
	e, ok := c.entries[[32]byte(hash)]
	c.mu.RUnlock()
	if !ok || !c.now().Before(e.expires) {
		return keyEntry{}, false
	}
	return e, true
}

func (c *keyCache) put(hash []byte, p model.Principal, event []trace.EventOption) {
	if c.ttl < 0 {
		return
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= keyCacheMax {
		for k, e := range c.entries {
			if !now.Before(e.expires) {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= keyCacheMax {
			clear(c.entries)
		}
	}
	expires := now.Add(c.ttl)
	if !p.ExpiresAt.IsZero() && p.ExpiresAt.Before(expires) {
		// A rotated key stops at its own expiry, not up to a TTL later (§16.2).
		expires = p.ExpiresAt
	}
	c.entries[[32]byte(hash)] = keyEntry{p: p, event: event, expires: expires}
}
