// Package load runs one operation from N concurrent workers for a bounded time and a bounded
// number of operations, and collects a stats.Sample for every operation of the measured window.
package load

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/subscriberd/subscriberd/internal/bench/stats"
)

// Result is what one operation reports: rows written or read on success, or the kind of its
// failure (an HTTP status such as "500", or "timeout", "transport", "db").
type Result struct {
	Rows int
	Err  string
	// Detail is a short description of a failure (a response body, an error text), kept for the
	// first failure of each kind to help explain it.
	Detail string
}

// Op performs one operation. worker is the index of the calling worker (0..Clients-1), seq a
// number unique to this call within the run.
type Op func(ctx context.Context, worker int, seq int64) Result

// Options bounds a run.
type Options struct {
	Clients int // concurrent workers, ≥ 1
	// Warmup is run first and not measured.
	Warmup time.Duration
	// Duration is the measured window: no operation starts after it.
	Duration time.Duration
	// MaxRequests caps the measured operations (0 = no cap beyond Duration).
	MaxRequests int64
	// OnMeasure, when set, is called as the measured window starts (to start a profile).
	OnMeasure func()
}

// Outcome is a finished run.
type Outcome struct {
	Summary stats.Summary
	// Details holds the first Detail seen for each error kind.
	Details map[string]string
}

// DefaultMaxRequests caps a run when Options.MaxRequests is 0, so that every run is bounded in
// count as well as in time.
const DefaultMaxRequests = 5_000_000

// Run runs op from opts.Clients workers: for opts.Warmup unmeasured, then for opts.Duration (or
// until opts.MaxRequests operations have started) measured. It waits for the operations in
// flight to finish; ops must therefore bound their own time (a request timeout). Cancelling
// ctx stops the workers early; ctx is also what the operations receive.
func Run(ctx context.Context, opts Options, op Op) Outcome {
	if opts.Clients < 1 {
		opts.Clients = 1
	}
	limit := opts.MaxRequests
	if limit <= 0 {
		limit = DefaultMaxRequests
	}
	var seq atomic.Int64
	var started atomic.Int64 // measured operations started

	// Warm-up: the same workers, nothing recorded.
	if opts.Warmup > 0 {
		end := time.Now().Add(opts.Warmup)
		var wg sync.WaitGroup
		for w := range opts.Clients {
			wg.Go(func() {
				for ctx.Err() == nil && time.Now().Before(end) {
					op(ctx, w, seq.Add(1))
				}
			})
		}
		wg.Wait()
	}

	if opts.OnMeasure != nil {
		opts.OnMeasure()
	}
	t0 := time.Now()
	deadline := t0.Add(opts.Duration)
	per := make([][]stats.Sample, opts.Clients)
	details := make([]map[string]string, opts.Clients)
	var wg sync.WaitGroup
	for w := range opts.Clients {
		wg.Go(func() {
			var mine []stats.Sample
			var det map[string]string
			for ctx.Err() == nil {
				s := time.Now()
				if !s.Before(deadline) || started.Add(1) > limit {
					break
				}
				r := op(ctx, w, seq.Add(1))
				e := time.Now()
				mine = append(mine, stats.Sample{Start: s.Sub(t0), End: e.Sub(t0), Rows: r.Rows, Err: r.Err})
				if r.Err != "" {
					if det == nil {
						det = map[string]string{}
					}
					if _, ok := det[r.Err]; !ok {
						det[r.Err] = r.Detail
					}
				}
			}
			per[w], details[w] = mine, det
		})
	}
	wg.Wait()
	window := time.Since(t0)
	if window > opts.Duration {
		// The window is the planned duration unless the count cap or ctx ended it sooner;
		// Summarize extends it to the last completion.
		window = opts.Duration
	}
	n := 0
	for _, p := range per {
		n += len(p)
	}
	all := make([]stats.Sample, 0, n)
	out := Outcome{Details: map[string]string{}}
	for w, p := range per {
		all = append(all, p...)
		for k, v := range details[w] {
			if _, ok := out.Details[k]; !ok {
				out.Details[k] = v
			}
		}
	}
	if len(all) > 0 && started.Load() > limit {
		// Ended by the count cap: measure up to the last completion only.
		window = 0
	}
	out.Summary = stats.Summarize(all, window)
	return out
}
