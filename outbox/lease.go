package outbox

import (
	"context"
	"sync"
	"time"
)

// DefaultLease is how long a claim hides work from other workers unless its worker renews it.
// A live worker renews it every Beat, however long the work takes; one that died (kill -9, a
// lost machine) stops, and its work is claimed again by another worker within the lease and a
// poll: about 10 s, well within the 15 s the service promises (docs/operating.md).
const DefaultLease = 10 * time.Second

// Beat is how often a worker renews the lease of the work it holds: a third of the lease, so
// that one failed renewal still leaves the lease alive.
func Beat(lease time.Duration) time.Duration { return max(lease/3, time.Millisecond) }

// StaleAfter is how long after a claim or renewal its work counts as held past its heartbeat:
// two beats, so that a renewal late by most of a beat does not count. The store records the
// instant with each claim and renewal; the gauges of work held past its heartbeat read it.
func StaleAfter(lease time.Duration) time.Duration { return 2 * Beat(lease) }

// Heartbeat renews the leases of the work a worker holds, identified by keys of type K, every
// Beat of the lease, until each is dropped or the heartbeat stops. It runs on its own
// goroutine, so that work that takes long (an SMTP server or a receiver that hangs) keeps its
// lease, and a short lease hands a dead worker's work to another in seconds.
type Heartbeat[K comparable] struct {
	renew  func(ctx context.Context, keys []K) error
	failed func(ctx context.Context, n int, err error)
	every  time.Duration
	mu     sync.Mutex // held while renewing, so that a dropped key is never renewed after
	held   map[K]struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

// StartHeartbeat renews the lease of keys through renew every Beat(lease) until Stop. renew
// gets a context bounded by a beat; failed, when not nil, is told of each renewal that failed
// (not lost: the next beat tries again, and at worst the lease ends and the work is done
// twice). The heartbeat outlives ctx's cancellation (a worker shutting down still holds the
// work in hand) but keeps its values.
func StartHeartbeat[K comparable](ctx context.Context, lease time.Duration, renew func(ctx context.Context, keys []K) error,
	failed func(ctx context.Context, n int, err error), keys ...K) *Heartbeat[K] {
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	h := &Heartbeat[K]{renew: renew, failed: failed, every: Beat(lease), held: make(map[K]struct{}, len(keys)),
		cancel: cancel, done: make(chan struct{})}
	for _, k := range keys {
		h.held[k] = struct{}{}
	}
	go h.run(hctx)
	return h
}

func (h *Heartbeat[K]) run(ctx context.Context) {
	defer close(h.done)
	t := time.NewTicker(h.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h.mu.Lock()
		keys := make([]K, 0, len(h.held))
		for k := range h.held {
			keys = append(keys, k)
		}
		var err error
		if len(keys) > 0 {
			rctx, cancel := context.WithTimeout(ctx, h.every)
			err = h.renew(rctx, keys)
			cancel()
		}
		h.mu.Unlock()
		if err != nil && ctx.Err() == nil && h.failed != nil {
			h.failed(ctx, len(keys), err)
		}
	}
}

// Drop stops renewing keys; call it before recording their outcome, so that a renewal cannot
// overwrite a retry's delay.
func (h *Heartbeat[K]) Drop(keys ...K) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range keys {
		delete(h.held, k)
	}
}

// Stop ends the heartbeat and waits for a renewal in progress.
func (h *Heartbeat[K]) Stop() {
	h.cancel()
	<-h.done
}

// ClaimContext is the context a worker claims work under, and false once ctx has ended: claim
// nothing then. ctx's end does not cut it: a claim cut after its statement committed would
// leave its work leased, with nobody to give it back, for a whole lease; the lease bounds it
// instead. Work claimed after a stop is the worker's to give back at once. Call cancel when
// the claim has returned.
func ClaimContext(ctx context.Context, lease time.Duration) (cctx context.Context, cancel context.CancelFunc, ok bool) {
	if ctx.Err() != nil {
		return ctx, func() {}, false
	}
	cctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), lease)
	return cctx, cancel, true
}
