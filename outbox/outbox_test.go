package outbox

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"
)

func TestJitter(t *testing.T) {
	for _, d := range []time.Duration{5 * time.Second, 10 * time.Hour, time.Nanosecond} {
		for range 200 {
			if got := Jitter(d); got > d || got < d*3/4 {
				t.Fatalf("Jitter(%v) = %v, want within [%v, %v]", d, got, d*3/4, d)
			}
		}
	}
}

func TestLink(t *testing.T) {
	if opts := Link(""); opts != nil {
		t.Errorf("empty traceparent links %v", opts)
	}
	if opts := Link("garbage"); opts != nil {
		t.Errorf("invalid traceparent links %v", opts)
	}
	opts := Link("00-0102030405060708090a0b0c0d0e0f10-0102030405060708-01")
	cfg := trace.NewSpanStartConfig(opts...)
	if len(cfg.Links()) != 1 || cfg.Links()[0].SpanContext.TraceID().String() != "0102030405060708090a0b0c0d0e0f10" {
		t.Errorf("links %v", cfg.Links())
	}
}

// TestLoop: at once, again at once while round says more, on wake, and on the interval; it
// returns when ctx ends.
func TestLoop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	wake := make(chan struct{})
	var calls atomic.Int64
	done := make(chan struct{})
	go func() {
		Loop(ctx, wake, time.Hour, func() bool { return calls.Add(1) < 3 })
		close(done)
	}()
	waitCalls := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for calls.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("%d calls, want %d", calls.Load(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitCalls(3) // the first round and two more at once
	wake <- struct{}{}
	waitCalls(4)
	cancel()
	<-done
	if n := calls.Load(); n != 4 {
		t.Errorf("%d calls after the stop", n)
	}
}

func TestTruncate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"abcdef", 3, "abc"},
		{"aé", 2, "a"}, // é is two bytes: cutting inside it would leave invalid UTF-8
		{"aé", 3, "aé"},
		{"€", 1, ""},
	} {
		if got := Truncate(tc.in, tc.n); got != tc.want || !utf8.ValidString(got) {
			t.Errorf("Truncate(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

// TestHeartbeat: the held keys are renewed every beat, a dropped key never after Drop returns,
// a failed renewal is reported and the next beat tries again, and nothing is renewed after
// Stop.
func TestHeartbeat(t *testing.T) {
	const lease = 150 * time.Millisecond
	var mu sync.Mutex
	renewed := map[string]int{}
	fail := true
	var failures atomic.Int64
	h := StartHeartbeat(context.Background(), lease, func(_ context.Context, keys []string) error {
		mu.Lock()
		defer mu.Unlock()
		if fail {
			fail = false
			return errors.New("database down")
		}
		for _, k := range keys {
			renewed[k]++
		}
		return nil
	}, func(_ context.Context, n int, err error) { failures.Add(1) }, "a", "b")
	time.Sleep(6 * Beat(lease))
	h.Drop("b")
	mu.Lock()
	b := renewed["b"]
	mu.Unlock()
	time.Sleep(4 * Beat(lease))
	h.Stop()
	mu.Lock()
	a := renewed["a"]
	if renewed["b"] != b {
		t.Errorf("b renewed %d times after Drop", renewed["b"]-b)
	}
	mu.Unlock()
	if a < 4 || b < 2 {
		t.Errorf("renewed a %d, b %d times, want a at least 4 (9 beats, one failed), b at least 2", a, b)
	}
	if failures.Load() != 1 {
		t.Errorf("%d failures reported, want 1", failures.Load())
	}
	time.Sleep(3 * Beat(lease))
	mu.Lock()
	defer mu.Unlock()
	if renewed["a"] != a {
		t.Errorf("a renewed after Stop")
	}
}

func TestStaleAfterIsTwoBeats(t *testing.T) {
	if Beat(DefaultLease)*3 > DefaultLease || StaleAfter(DefaultLease) != 2*Beat(DefaultLease) || StaleAfter(DefaultLease) >= DefaultLease {
		t.Errorf("lease %v: beat %v, stale after %v", DefaultLease, Beat(DefaultLease), StaleAfter(DefaultLease))
	}
	if DefaultLease+time.Second > 15*time.Second {
		t.Errorf("DefaultLease %v and a poll exceed the 15 s takeover docs/operating.md promises", DefaultLease)
	}
}

// TestLanes: the lanes are served in the order of their values, and their names are the
// metrics' lane label values.
func TestLanes(t *testing.T) {
	if len(Lanes) != 2 || Lanes[0] != Interactive || Lanes[1] != Bulk || Interactive >= Bulk {
		t.Fatalf("Lanes = %v; want interactive before bulk", Lanes)
	}
	for l, want := range map[Lane]string{Interactive: "interactive", Bulk: "bulk"} {
		if got := l.String(); got != want {
			t.Errorf("Lane(%d).String() = %q; want %q", l, got, want)
		}
	}
}

// TestClaimContext: no claim once the worker's context has ended; a claim under way is not
// cut by its end, only by the lease.
func TestClaimContext(t *testing.T) {
	ctx, stop := context.WithCancel(context.Background())
	cctx, cancel, ok := ClaimContext(ctx, time.Hour)
	defer cancel()
	if !ok {
		t.Fatal("ClaimContext of a live context: ok = false")
	}
	stop()
	if err := cctx.Err(); err != nil {
		t.Fatalf("the claim's context ended with the worker's: %v", err)
	}
	if d, has := cctx.Deadline(); !has || time.Until(d) > time.Hour {
		t.Errorf("the claim's deadline = %v, %v; want within the lease", d, has)
	}
	if _, _, ok := ClaimContext(ctx, time.Hour); ok {
		t.Error("ClaimContext of an ended context: ok = true")
	}
}
