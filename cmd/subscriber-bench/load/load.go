// Package load runs operations from N concurrent workers for a bounded time and a bounded
// number of operations, and sums up the measured window: throughput, latency percentiles (in an
// HDR histogram), errors by kind and the longest stretch without a completion.
package load

import (
	"context"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Result is what one operation reports: rows written or read on success, or the kind of its
// failure (an HTTP status such as "500", or "timeout", "transport", "db").
type Result struct {
	Rows int
	Err  string
	// Detail describes a failure (a response body, an error text); the first of each kind is kept.
	Detail string
}

// Op performs one operation. worker is the index of the calling worker (0..Clients-1), seq a
// number unique to this call within the run.
type Op func(ctx context.Context, worker int, seq int64) Result

// Options bounds a run.
type Options struct {
	Clients  int           // concurrent workers, ≥ 1
	Warmup   time.Duration // run first, not measured
	Duration time.Duration // the measured window: no operation starts after it
	// MaxRequests caps the measured operations (0 = DefaultMaxRequests).
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

// Summary is what a run reports.
type Summary struct {
	Requests int64            // operations finished in the window
	OK       int64            // of which succeeded
	Errors   map[string]int64 // failures by kind
	Rows     int64            // rows of the successful operations
	// Elapsed is the window, extended to the last completion, so that a rate never counts
	// work done outside the time it is divided by.
	Elapsed        time.Duration
	RequestsPerSec float64 // successful operations per second
	RowsPerSec     float64

	// Latency of every finished operation, successful or not.
	Mean, P50, P90, P99, Max time.Duration

	// LongestGap is the longest interval of the window in which no operation finished: a
	// stalled service shows a gap close to the whole window or the request timeout.
	LongestGap time.Duration
}

// ErrorCount is the number of failed operations.
func (s Summary) ErrorCount() int64 {
	var n int64
	for _, c := range s.Errors {
		n += c
	}
	return n
}

// ErrorKinds returns the error kinds in a stable order.
func (s Summary) ErrorKinds() []string {
	return slices.Sorted(maps.Keys(s.Errors))
}

// Run runs op from opts.Clients workers: for opts.Warmup unmeasured, then for opts.Duration (or
// until opts.MaxRequests operations have started) measured. It waits for the operations in
// flight to finish; ops must therefore bound their own time (a request timeout). Cancelling
// ctx stops the workers early; ctx is also what the operations receive.
func Run(ctx context.Context, opts Options, op Op) Outcome {
	return run(ctx, opts, opts.Duration, []Op{op})[0]
}

// RunAlternating runs two operations in turns, for a comparison that the machine's drift must
// not decide: after a warm-up of each, the measured window, opts.Duration for each, is cut
// into slices of about slice that go to ops[0] and ops[1] in the order 0 1 1 0, 0 1 1 0, …, so
// that a steady change of speed costs both the same and a slow spell falls on both. A worker
// runs the operation of the slice in which it starts a call. Each outcome is over its own
// slices put end to end; opts.MaxRequests caps each operation.
func RunAlternating(ctx context.Context, opts Options, slice time.Duration, ops [2]Op) [2]Outcome {
	out := run(ctx, opts, slice, ops[:])
	return [2]Outcome{out[0], out[1]}
}

// AlternatingTurn is the operation RunAlternating gives slice k: 0 1 1 0, 0 1 1 0, …
func AlternatingTurn(k int) int {
	if k%4 == 1 || k%4 == 2 {
		return 1
	}
	return 0
}

// run is Run for one operation (its one slice the whole window) and RunAlternating for two.
func run(ctx context.Context, opts Options, slice time.Duration, ops []Op) []Outcome {
	clients := max(opts.Clients, 1)
	limit := opts.MaxRequests
	if limit <= 0 {
		limit = DefaultMaxRequests
	}
	m := len(ops)
	n := max(1, int((opts.Duration+slice/2)/max(slice, 1))) // slices per operation
	slice = max(opts.Duration/time.Duration(n), 1)          // 1 ns when there is no window at all
	var seq atomic.Int64
	started := make([]atomic.Int64, m)
	recs := make([]recorder, m)
	for _, op := range ops {
		warmUp(ctx, opts.Warmup, clients, op, &seq)
	}

	if opts.OnMeasure != nil {
		opts.OnMeasure()
	}
	t0 := time.Now()
	var wg sync.WaitGroup
	for w := range clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				s := time.Now()
				k := int(s.Sub(t0) / slice) // the slice the call starts in
				if k >= m*n {
					break
				}
				i := 0
				if m == 2 {
					i = AlternatingTurn(k)
				}
				if started[i].Add(1) > limit {
					if m == 1 || started[1-i].Load() >= limit {
						break
					}
					sleep(ctx, t0.Add(time.Duration(k+1)*slice).Sub(s)) // to the next slice
					continue
				}
				r := ops[i](ctx, w, seq.Add(1))
				// Slice k is the operation's own slice k/m, which starts at (k/m)·slice of
				// its own time.
				recs[i].add(time.Duration(k/m)*slice+s.Sub(t0)-time.Duration(k)*slice, time.Since(s), r)
			}
		})
	}
	wg.Wait()
	// The window is the planned duration unless the count cap or ctx ended it sooner.
	window := min(time.Since(t0)/time.Duration(m), opts.Duration)
	out := make([]Outcome, m)
	for i := range recs {
		if started[i].Load() > limit && len(recs[i].ends) > 0 {
			out[i] = recs[i].outcome(0) // ended by the count cap: up to its last completion
		} else {
			out[i] = recs[i].outcome(window)
		}
	}
	return out
}

// warmUp runs op from clients workers for d, recording nothing.
func warmUp(ctx context.Context, d time.Duration, clients int, op Op, seq *atomic.Int64) {
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := range clients {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(end) {
				op(ctx, w, seq.Add(1))
			}
		})
	}
	wg.Wait()
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

// recorder is what the workers measured of one operation: latencies in µs for the percentiles,
// with 3 significant digits (0.1 %), from 1 µs to an hour, and their exact sum and maximum;
// completion times; counts.
type recorder struct {
	mu      sync.Mutex
	lat     *hdrhistogram.Histogram
	sum     time.Duration
	max     time.Duration
	ends    []time.Duration
	ok      int64
	rows    int64
	errors  map[string]int64
	details map[string]string
}

// add records a call that started at start (in the window's time) and took d.
func (r *recorder) add(start, d time.Duration, res Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lat == nil {
		r.lat = hdrhistogram.New(1, int64(time.Hour/time.Microsecond), 3)
		r.errors, r.details = map[string]int64{}, map[string]string{}
	}
	_ = r.lat.RecordValue(max(1, d.Microseconds())) // beyond an hour: not in the percentiles
	r.sum += d
	r.max = max(r.max, d)
	r.ends = append(r.ends, start+d)
	switch {
	case res.Err == "":
		r.ok++
		r.rows += int64(res.Rows)
	case r.errors[res.Err] == 0:
		r.details[res.Err] = res.Detail
		fallthrough
	default:
		r.errors[res.Err]++
	}
}

// outcome sums up what r recorded over window (extended to the last completion).
func (r *recorder) outcome(window time.Duration) Outcome {
	s := Summary{Elapsed: window, Requests: int64(len(r.ends)), OK: r.ok, Rows: r.rows}
	out := Outcome{Summary: s, Details: r.details}
	if len(r.ends) == 0 {
		out.Summary.LongestGap = window
		return out
	}
	if len(r.errors) > 0 {
		s.Errors = r.errors
	}
	slices.Sort(r.ends)
	s.Elapsed = max(window, r.ends[len(r.ends)-1])
	us := func(v float64) time.Duration { return time.Duration(math.Round(v * float64(time.Microsecond))) }
	s.Mean, s.Max = r.sum/time.Duration(len(r.ends)), r.max
	s.P50, s.P90, s.P99 = us(float64(r.lat.ValueAtPercentile(50))), us(float64(r.lat.ValueAtPercentile(90))),
		us(float64(r.lat.ValueAtPercentile(99)))
	s.RequestsPerSec, s.RowsPerSec = Rate(s.OK, s.Elapsed), Rate(s.Rows, s.Elapsed)
	s.LongestGap = LongestGap(r.ends, s.Elapsed)
	out.Summary = s
	return out
}

// Rate is n events per second over d; 0 when d is not positive.
func Rate(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// LongestGap returns the longest interval of [0, window] containing no completion, given the
// completion offsets in ascending order.
func LongestGap(sortedEnds []time.Duration, window time.Duration) time.Duration {
	prev := time.Duration(0)
	var gap time.Duration
	for _, e := range sortedEnds {
		e = max(e, prev)
		gap = max(gap, e-prev)
		prev = e
	}
	return max(gap, window-prev)
}

// Ratio is a/b, or NaN when b is zero (no baseline to compare with).
func Ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}
