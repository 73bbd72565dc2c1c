package limits

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/subscriberd/subscriberd/internal/outage"
)

// DefaultProbeEvery is how often Failover checks whether its primary is back.
const DefaultProbeEvery = 2 * time.Second

// Failover is a Backend that uses its primary (Redis) while it answers and its fallback
// (Memory) otherwise. The first failed call switches to the fallback — that call is answered
// by the fallback too, so a limiter outage never fails a request — and a probe then pings the
// primary every probeEvery until it answers again. Each change of state is logged once (and a
// summary of the failed probes every 30 s while Redis stays away, as every outage is logged:
// internal/outage) and reported to the Recorder.
type Failover struct {
	primary, fallback Backend
	outage            *outage.Log
	rec               Recorder
	probeEvery        time.Duration

	up      atomic.Bool
	mu      sync.Mutex // serialises state changes
	probing bool
	stop    chan struct{}
	done    sync.WaitGroup
}

// NewFailover returns a Backend over primary and fallback. It pings the primary once, so the
// state it starts in (and reports) is the real one. Call Close to stop its probe.
func NewFailover(ctx context.Context, primary, fallback Backend, log *slog.Logger, rec Recorder, probeEvery time.Duration) *Failover {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if rec == nil {
		rec = nopRecorder{}
	}
	if probeEvery <= 0 {
		probeEvery = DefaultProbeEvery
	}
	f := &Failover{primary: primary, fallback: fallback, rec: rec, probeEvery: probeEvery, stop: make(chan struct{}),
		outage: outage.New(log.With(slog.String("backend", primary.Name())), RedisOutage, 0, nil)}
	f.up.Store(true)
	if err := primary.Ping(ctx); err != nil {
		f.down(err)
	} else {
		rec.BackendUp(true)
	}
	return f
}

// RedisOutage is how an outage of the shared backend reads in the log (docs/limits.md).
var RedisOutage = outage.Messages{
	Start:   "rate limiter: Redis unreachable; deciding in process until it answers again",
	Summary: "rate limiter: Redis still down; deciding in process",
	End:     "rate limiter: Redis answers again; counters are shared again",
}

// Up reports whether the primary is in use.
func (f *Failover) Up() bool { return f.up.Load() }

// Close stops the probe. The backends stay usable.
func (f *Failover) Close() {
	f.mu.Lock()
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	f.mu.Unlock()
	f.done.Wait()
}

// Name returns the name of the backend in use.
func (f *Failover) Name() string {
	if f.up.Load() {
		return f.primary.Name()
	}
	return f.fallback.Name()
}

// Ping pings the backend in use.
func (f *Failover) Ping(ctx context.Context) error {
	if f.up.Load() {
		return f.primary.Ping(ctx)
	}
	return f.fallback.Ping(ctx)
}

// Take implements Backend.
func (f *Failover) Take(ctx context.Context, lockKey string, buckets []Bucket) (Outcome, error) {
	if f.up.Load() {
		out, err := f.primary.Take(ctx, lockKey, buckets)
		if err == nil || ctx.Err() != nil {
			return out, err
		}
		f.down(err)
	}
	return f.fallback.Take(ctx, lockKey, buckets)
}

// LockedFor implements Backend.
func (f *Failover) LockedFor(ctx context.Context, lockKey string) (time.Duration, error) {
	if f.up.Load() {
		d, err := f.primary.LockedFor(ctx, lockKey)
		if err == nil || ctx.Err() != nil {
			return d, err
		}
		f.down(err)
	}
	return f.fallback.LockedFor(ctx, lockKey)
}

// Fail implements Backend.
func (f *Failover) Fail(ctx context.Context, logKey, lockKey string, rule Lockout) (bool, time.Duration, error) {
	if f.up.Load() {
		started, held, err := f.primary.Fail(ctx, logKey, lockKey, rule)
		if err == nil || ctx.Err() != nil {
			return started, held, err
		}
		f.down(err)
	}
	return f.fallback.Fail(ctx, logKey, lockKey, rule)
}

// down switches to the fallback, once, and starts the probe.
func (f *Failover) down(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.up.Load() {
		return
	}
	f.up.Store(false)
	f.outage.Failed(context.Background(), err)
	f.rec.BackendUp(false)
	select {
	case <-f.stop:
		return
	default:
	}
	if !f.probing {
		f.probing = true
		f.done.Go(f.probe)
	}
}

// probe pings the primary until it answers, then switches back to it.
func (f *Failover) probe() {
	t := time.NewTicker(f.probeEvery)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			f.mu.Lock()
			f.probing = false
			f.mu.Unlock()
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), f.probeEvery)
		err := f.primary.Ping(ctx)
		cancel()
		if err != nil {
			f.outage.Failed(context.Background(), err)
			continue
		}
		f.mu.Lock()
		f.probing = false
		f.up.Store(true)
		f.outage.OK(context.Background())
		f.rec.BackendUp(true)
		f.mu.Unlock()
		return
	}
}
