package api

import (
	"sync"
	"time"

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
	expires time.Time
}

func newKeyCache(ttl time.Duration) *keyCache {
	return &keyCache{ttl: ttl, now: time.Now, entries: map[[32]byte]keyEntry{}}
}

func (c *keyCache) get(hash []byte) (model.Principal, bool) {
	if c.ttl < 0 {
		return model.Principal{}, false
	}
	c.mu.RLock()
	e, ok := c.entries[[32]byte(hash)]
	c.mu.RUnlock()
	if !ok || !c.now().Before(e.expires) {
		return model.Principal{}, false
	}
	return e.p, true
}

func (c *keyCache) put(hash []byte, p model.Principal) {
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
	c.entries[[32]byte(hash)] = keyEntry{p: p, expires: now.Add(c.ttl)}
}
