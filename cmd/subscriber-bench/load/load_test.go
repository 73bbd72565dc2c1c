package load

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestRunStopsAtMaxRequestsAndCountsErrors(t *testing.T) {
	var calls atomic.Int64
	op := func(_ context.Context, worker int, seq int64) Result {
		calls.Add(1)
		if worker < 0 || worker >= 4 {
			t.Errorf("worker index %d out of range", worker)
		}
		if seq%10 == 0 {
			return Result{Err: "503", Detail: fmt.Sprintf("seq %d", seq)}
		}
		return Result{Rows: 3}
	}
	out := Run(context.Background(), Options{Clients: 4, Duration: time.Hour, MaxRequests: 200}, op)
	s := out.Summary
	if calls.Load() != 200 || s.Requests != 200 {
		t.Fatalf("calls = %d, measured = %d; want exactly 200", calls.Load(), s.Requests)
	}
	if s.OK != 180 || s.Errors["503"] != 20 || s.Rows != 540 {
		t.Errorf("ok = %d, errors = %v, rows = %d; want 180, 503:20, 540", s.OK, s.Errors, s.Rows)
	}
	if d := out.Details["503"]; d == "" {
		t.Errorf("no detail kept for the 503s")
	}
	if s.RequestsPerSec <= 0 || s.Elapsed <= 0 || s.Elapsed > time.Hour {
		t.Errorf("rate %v over %v: the window must end at the last completion", s.RequestsPerSec, s.Elapsed)
	}
}

func TestRunUsesAllClientsConcurrently(t *testing.T) {
	// Every worker's first call waits until all four have arrived: the run can only finish if
	// four operations are in flight at once.
	const clients = 4
	var arrived sync.WaitGroup
	arrived.Add(clients)
	var first [clients]atomic.Bool
	op := func(_ context.Context, worker int, _ int64) Result {
		if first[worker].CompareAndSwap(false, true) {
			arrived.Done()
			arrived.Wait()
		}
		return Result{Rows: 1}
	}
	out := Run(context.Background(), Options{Clients: clients, Duration: time.Hour, MaxRequests: 40}, op)
	if out.Summary.OK != 40 {
		t.Fatalf("ok = %d, want 40", out.Summary.OK)
	}
	for w := range clients {
		if !first[w].Load() {
			t.Errorf("worker %d never ran", w)
		}
	}
}

func TestRunStopsWhenContextIsCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var calls atomic.Int64
	// The 50th call cancels; any call after it waits for the cancellation, so a worker can
	// start at most one call past the 50th and must then stop.
	op := func(ctx context.Context, _ int, _ int64) Result {
		switch n := calls.Add(1); {
		case n == 50:
			cancel()
		case n > 50:
			<-ctx.Done()
		}
		return Result{Rows: 1}
	}
	out := Run(ctx, Options{Clients: 2, Duration: time.Hour}, op)
	if n := calls.Load(); n < 50 || n > 51 {
		t.Errorf("calls = %d, want 50 plus at most one from the other worker", n)
	}
	if out.Summary.Requests != calls.Load() {
		t.Errorf("measured %d of %d calls", out.Summary.Requests, calls.Load())
	}
}

func TestRunDoesNotMeasureWarmup(t *testing.T) {
	// The warm-up is time-bounded; every call it makes is left out of the figures, and the
	// measured part stops at its count cap.
	var calls atomic.Int64
	op := func(context.Context, int, int64) Result {
		calls.Add(1)
		return Result{Rows: 1}
	}
	out := Run(context.Background(), Options{Clients: 2, Warmup: 20 * time.Millisecond, Duration: time.Hour, MaxRequests: 10}, op)
	if out.Summary.Requests != 10 {
		t.Fatalf("measured = %d, want 10", out.Summary.Requests)
	}
	if calls.Load() <= 10 {
		t.Errorf("calls = %d: the warm-up made none", calls.Load())
	}
}

func TestAlternatingTurnIsABBA(t *testing.T) {
	var got []int
	for k := range 8 {
		got = append(got, AlternatingTurn(k))
	}
	if fmt.Sprint(got) != "[0 1 1 0 0 1 1 0]" {
		t.Errorf("turns %v, want [0 1 1 0 0 1 1 0]", got)
	}
}

// Two identical operations on a machine that slows down steadily: run one after the other,
// the second would serve about half as many calls; run in alternating slices, both see the
// same machine. Each outcome covers its own window of opts.Duration.
func TestRunAlternatingSharesADriftingMachine(t *testing.T) {
	start := time.Now()
	var calls [2]atomic.Int64
	op := func(i int) Op {
		return func(context.Context, int, int64) Result {
			calls[i].Add(1)
			time.Sleep(time.Millisecond + time.Since(start)/40) // 1 ms, then slower and slower
			return Result{Rows: 1}
		}
	}
	const dur = 300 * time.Millisecond
	out := RunAlternating(context.Background(), Options{Clients: 4, Duration: dur}, 20*time.Millisecond, [2]Op{op(0), op(1)})
	a, b := out[0].Summary, out[1].Summary
	if a.OK == 0 || b.OK == 0 {
		t.Fatalf("ok %d and %d: both operations must run", a.OK, b.OK)
	}
	if r := float64(a.OK) / float64(b.OK); r < 0.75 || r > 1.33 {
		t.Errorf("ok %d against %d (ratio %.2f): the drift was not shared", a.OK, b.OK, r)
	}
	for i, s := range []time.Duration{a.Elapsed, b.Elapsed} {
		if s < dur || s > 2*dur {
			t.Errorf("operation %d: window %v, want its own %v (to the last completion)", i, s, dur)
		}
	}
	if got := calls[0].Load() + calls[1].Load(); got != a.Requests+b.Requests {
		t.Errorf("%d calls, %d measured: without a warm-up every call is measured", got, a.Requests+b.Requests)
	}
}

// Each operation is capped on its own: the first reaches the cap in its first slice and sits
// out the rest of it, and the run ends when the second has reached it too.
func TestRunAlternatingStopsAtMaxRequests(t *testing.T) {
	var calls [2]atomic.Int64
	op := func(i int) Op { return func(context.Context, int, int64) Result { calls[i].Add(1); return Result{} } }
	out := RunAlternating(context.Background(), Options{Clients: 3, Duration: time.Hour, MaxRequests: 45}, 50*time.Millisecond, [2]Op{op(0), op(1)})
	for i := range 2 {
		if n := out[i].Summary.Requests; n != 45 || calls[i].Load() != 45 {
			t.Errorf("operation %d: measured %d in %d calls, want 45 in 45", i, n, calls[i].Load())
		}
	}
}

// No window at all ends at once, with nothing measured, rather than dividing by zero.
func TestRunAlternatingWithoutAWindow(t *testing.T) {
	op := func(context.Context, int, int64) Result { return Result{} }
	done := make(chan [2]Outcome)
	go func() { done <- RunAlternating(context.Background(), Options{Clients: 2}, 0, [2]Op{op, op}) }()
	select {
	case out := <-done:
		if n := out[0].Summary.Requests + out[1].Summary.Requests; n > 4 {
			t.Errorf("%d calls measured in a window of 0, want at most one per worker and side", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("RunAlternating with a zero duration did not return")
	}
}
