// Package load runs one operation from N concurrent workers for a bounded time and a bounded
// number of operations, and collects a Sample for every operation of the measured window.
package load

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
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
	Summary Summary
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

	warmUp(ctx, opts, op, &seq)

	if opts.OnMeasure != nil {
		opts.OnMeasure()
	}
	t0 := time.Now()
	deadline := t0.Add(opts.Duration)
	per := make([]recorder, opts.Clients)
	var wg sync.WaitGroup
	for w := range opts.Clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				s := time.Now()
				if !s.Before(deadline) || started.Add(1) > limit {
					break
				}
				r := op(ctx, w, seq.Add(1))
				per[w].add(s.Sub(t0), time.Since(s), r)
			}
		})
	}
	wg.Wait()
	// The window is the planned duration unless the count cap or ctx ended it sooner;
	// Summarize extends it to the last completion.
	return outcome(per, min(time.Since(t0), opts.Duration), started.Load() > limit)
}

// recorder is what one worker measured: a sample per call and the first detail of each kind
// of error.
type recorder struct {
	samples []Sample
	details map[string]string
}

// add records a call that started at start (in the run's time) and took d.
func (r *recorder) add(start, d time.Duration, res Result) {
	r.samples = append(r.samples, Sample{Start: start, End: start + d, Rows: res.Rows, Err: res.Err})
	if res.Err == "" {
		return
	}
	if r.details == nil {
		r.details = map[string]string{}
	}
	if _, ok := r.details[res.Err]; !ok {
		r.details[res.Err] = res.Detail
	}
}

// warmUp runs op from opts.Clients workers for opts.Warmup, recording nothing.
func warmUp(ctx context.Context, opts Options, op Op, seq *atomic.Int64) {
	if opts.Warmup <= 0 {
		return
	}
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

// outcome summarizes the workers' samples over window. A run ended by the count cap is
// measured up to its last completion only.
func outcome(per []recorder, window time.Duration, capped bool) Outcome {
	n := 0
	for _, r := range per {
		n += len(r.samples)
	}
	all := make([]Sample, 0, n)
	out := Outcome{Details: map[string]string{}}
	for _, r := range per {
		all = append(all, r.samples...)
		for k, v := range r.details {
			if _, ok := out.Details[k]; !ok {
				out.Details[k] = v
			}
		}
	}
	if n > 0 && capped {
		window = 0
	}
	out.Summary = Summarize(all, window)
	return out
}

// RunAlternating runs two operations in turns, for a comparison of two services that the
// machine's drift must not decide. After a warm-up of each (opts.Warmup apiece), the measured
// window, opts.Duration for each operation, is cut into slices of about slice, which go to
// ops[0] and ops[1] in the order 0 1 1 0, 0 1 1 0, …: a change of the machine's speed that is
// steady over four slices costs both the same, and a slow spell of a few seconds falls on
// both instead of on whichever ran then. The same opts.Clients workers run both: each takes
// the operation of the slice in which it starts a call.
//
// Each outcome is over its own slices, put end to end: a sample's times are shifted back by
// the other operation's slices before it, so the rate, latencies and longest gap mean what
// Run's do. opts.MaxRequests caps each operation: one that reached it sits out its slices
// until the other has too. OnMeasure is called once.
func RunAlternating(ctx context.Context, opts Options, slice time.Duration, ops [2]Op) [2]Outcome {
	opts.Clients = max(opts.Clients, 1)
	limit := opts.MaxRequests
	if limit <= 0 {
		limit = DefaultMaxRequests
	}
	n := max(1, int((opts.Duration+slice/2)/max(slice, 1))) // slices per operation
	slice = max(opts.Duration/time.Duration(n), 1)          // 1 ns when there is no window at all
	var seq atomic.Int64
	var started [2]atomic.Int64
	for _, op := range ops {
		warmUp(ctx, opts, op, &seq)
	}

	if opts.OnMeasure != nil {
		opts.OnMeasure()
	}
	t0 := time.Now()
	per := [2][]recorder{make([]recorder, opts.Clients), make([]recorder, opts.Clients)}
	var wg sync.WaitGroup
	for w := range opts.Clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				s := time.Now()
				k := int(s.Sub(t0) / slice) // the slice the call starts in
				if k >= 2*n {
					break
				}
				i := AlternatingTurn(k)
				if started[i].Add(1) > limit {
					if started[1-i].Load() >= limit {
						break
					}
					sleep(ctx, t0.Add(time.Duration(k+1)*slice).Sub(s)) // to the next slice
					continue
				}
				r := ops[i](ctx, w, seq.Add(1))
				// Slices 2m and 2m+1 hold one of each operation: this is the operation's
				// slice m, which starts at m·slice of its own time.
				per[i][w].add(time.Duration(k/2)*slice+s.Sub(t0)-time.Duration(k)*slice, time.Since(s), r)
			}
		})
	}
	wg.Wait()
	window := min(time.Since(t0)/2, opts.Duration)
	return [2]Outcome{outcome(per[0], window, started[0].Load() > limit), outcome(per[1], window, started[1].Load() > limit)}
}

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// AlternatingTurn is the operation RunAlternating gives slice k: 0 1 1 0, 0 1 1 0, …
func AlternatingTurn(k int) int {
	if k%4 == 1 || k%4 == 2 {
		return 1
	}
	return 0
}
