package api

import (
	"context"
	"sync"
	"time"

	"github.com/google/uuid"
)

// KeyUsageStore records when API keys were last used; *repo.Accounts is the implementation.
type KeyUsageStore interface {
	// TouchKeys sets each key's last use to its time in used (to the minute), unless the key
	// holds a later one.
	TouchKeys(ctx context.Context, used map[uuid.UUID]time.Time) error
}

// keyUsage notes, off the request's path to the database, the minute in which each key was
// last used (docs/api-contract.md §16.2), for RunKeyUsage to write: at most once a minute per
// key, and never by the request itself.
type keyUsage struct {
	mu      sync.Mutex
	noted   map[uuid.UUID]time.Time // the last minute noted for each key
	pending map[uuid.UUID]time.Time // noted and not yet written
}

// keyUsageMax bounds noted; past it, it starts again (a key then may be written twice in
// its minute, which the store's condition makes harmless).
const keyUsageMax = 10000

func newKeyUsage() *keyUsage {
	return &keyUsage{noted: map[uuid.UUID]time.Time{}, pending: map[uuid.UUID]time.Time{}}
}

// used notes that the key id authenticated a request at now.
func (u *keyUsage) used(id uuid.UUID, now time.Time) {
	minute := now.UTC().Truncate(time.Minute)
	u.mu.Lock()
	defer u.mu.Unlock()
	if last, ok := u.noted[id]; ok && !last.Before(minute) {
		return
	}
	if len(u.noted) >= keyUsageMax {
		clear(u.noted)
	}
	u.noted[id] = minute
	u.pending[id] = minute
}

// take returns the uses not yet written and forgets them.
func (u *keyUsage) take() map[uuid.UUID]time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.pending) == 0 {
		return nil
	}
	out := u.pending
	u.pending = map[uuid.UUID]time.Time{}
	return out
}

// putBack returns uses whose write failed, for the next flush, unless a later one came.
func (u *keyUsage) putBack(used map[uuid.UUID]time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for id, at := range used {
		if cur, ok := u.pending[id]; !ok || cur.Before(at) {
			u.pending[id] = at
		}
	}
}

// FlushKeyUsage writes the key uses noted since the last flush (Config.KeyUsage). Uses whose
// write failed are kept for the next one.
func (s *Server) FlushKeyUsage(ctx context.Context) error {
	if s.cfg.KeyUsage == nil {
		return nil
	}
	used := s.usage.take()
	if used == nil {
		return nil
	}
	if err := s.cfg.KeyUsage.TouchKeys(ctx, used); err != nil {
		s.usage.putBack(used)
		return err
	}
	return nil
}

// RunKeyUsage flushes the key uses every interval until ctx ends, then once more, so that
// the last minute of use before a shutdown is written too. Failures go to the log.
func (s *Server) RunKeyUsage(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := s.FlushKeyUsage(fctx); err != nil {
				s.log.WarnContext(ctx, "recording when API keys were last used", "error", err)
			}
			return
		case <-t.C:
			if err := s.FlushKeyUsage(ctx); err != nil {
				s.log.WarnContext(ctx, "recording when API keys were last used", "error", err)
			}
		}
	}
}
