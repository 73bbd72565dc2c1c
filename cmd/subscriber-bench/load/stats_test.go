package load

import (
	"math"
	"testing"
	"time"
)

func ms(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

// sample is one operation: its start and end (offsets in the window), its rows on success or
// its error kind.
type sample struct {
	start, end time.Duration
	rows       int
	err        string
}

// summarize records samples and sums them up over window.
func summarize(samples []sample, window time.Duration) Summary {
	var r recorder
	for _, x := range samples {
		r.add(x.start, x.end-x.start, Result{Rows: x.rows, Err: x.err})
	}
	return r.outcome(window).Summary
}

// near tells whether d is v within the histogram's 3 significant digits.
func near(d, v time.Duration) bool {
	return math.Abs(float64(d-v)) <= float64(v)/1000+float64(time.Microsecond)
}

func TestPercentilesWithinThreeDigits(t *testing.T) {
	// 1..100 ms: the p-th percentile is p ms.
	var samples []sample
	for i := 1; i <= 100; i++ {
		samples = append(samples, sample{end: ms(float64(i)), rows: 1})
	}
	s := summarize(samples, time.Second)
	for _, tc := range []struct{ got, want time.Duration }{{s.P50, ms(50)}, {s.P90, ms(90)}, {s.P99, ms(99)}, {s.Max, ms(100)}} {
		if !near(tc.got, tc.want) {
			t.Errorf("got %v, want %v", tc.got, tc.want)
		}
	}
	// One value is every percentile.
	s = summarize([]sample{{end: ms(7)}}, time.Second)
	if !near(s.P50, ms(7)) || !near(s.P99, ms(7)) || !near(s.Max, ms(7)) {
		t.Errorf("one value of 7ms: p50 %v, p99 %v, max %v", s.P50, s.P99, s.Max)
	}
}

func TestRate(t *testing.T) {
	if got := Rate(500, 2*time.Second); got != 250 {
		t.Errorf("Rate(500, 2s) = %v, want 250", got)
	}
	if got := Rate(3, 1500*time.Millisecond); got != 2 {
		t.Errorf("Rate(3, 1.5s) = %v, want 2", got)
	}
	if got := Rate(10, 0); got != 0 {
		t.Errorf("Rate over zero time = %v, want 0", got)
	}
}

func TestLongestGap(t *testing.T) {
	ends := []time.Duration{ms(100), ms(200), ms(900), ms(950)}
	if got := LongestGap(ends, ms(1000)); got != ms(700) {
		t.Errorf("gap between completions: got %v, want 700ms", got)
	}
	// Nothing finishes after 100 ms of a 5 s window: a stall of 4.9 s.
	if got := LongestGap([]time.Duration{ms(50), ms(100)}, 5*time.Second); got != ms(4900) {
		t.Errorf("trailing stall: got %v, want 4.9s", got)
	}
	// A slow start counts from the window start.
	if got := LongestGap([]time.Duration{ms(800), ms(900)}, ms(1000)); got != ms(800) {
		t.Errorf("leading gap: got %v, want 800ms", got)
	}
	if got := LongestGap(nil, time.Second); got != time.Second {
		t.Errorf("no completion: got %v, want the whole window", got)
	}
}

func TestSummarize(t *testing.T) {
	// Ten operations over a 1 s window: eight successes of 2 rows, a 422 and a timeout.
	var samples []sample
	for i := range 10 {
		start := ms(float64(i * 100))
		s := sample{start: start, end: start + ms(float64(i+1)), rows: 2}
		switch i {
		case 3:
			s.err, s.rows = "422", 0
		case 7:
			s.err, s.rows = "timeout", 0
		}
		samples = append(samples, s)
	}
	got := summarize(samples, time.Second)
	if got.Requests != 10 || got.OK != 8 || got.ErrorCount() != 2 {
		t.Fatalf("requests/ok/errors = %d/%d/%d, want 10/8/2", got.Requests, got.OK, got.ErrorCount())
	}
	if got.Errors["422"] != 1 || got.Errors["timeout"] != 1 {
		t.Errorf("errors by kind = %v", got.Errors)
	}
	if kinds := got.ErrorKinds(); len(kinds) != 2 || kinds[0] != "422" || kinds[1] != "timeout" {
		t.Errorf("ErrorKinds = %v, want [422 timeout]", kinds)
	}
	if got.Rows != 16 {
		t.Errorf("rows = %d, want 16 (failures carry none)", got.Rows)
	}
	if got.Elapsed != time.Second {
		t.Errorf("elapsed = %v, want the window (last end 910ms is inside it)", got.Elapsed)
	}
	if got.RequestsPerSec != 8 || got.RowsPerSec != 16 {
		t.Errorf("rates = %v req/s, %v rows/s; want 8 and 16 (successes only)", got.RequestsPerSec, got.RowsPerSec)
	}
	// Latencies are 1..10 ms.
	if !near(got.P50, ms(5)) || !near(got.P90, ms(9)) || !near(got.P99, ms(10)) || !near(got.Max, ms(10)) {
		t.Errorf("p50/p90/p99/max = %v/%v/%v/%v, want 5/9/10/10 ms", got.P50, got.P90, got.P99, got.Max)
	}
	if !near(got.Mean, ms(5.5)) {
		t.Errorf("mean = %v, want 5.5ms", got.Mean)
	}
	// Ends at 1, 102, 203, ... 910 ms: 101 ms between consecutive ends, 1 ms before the first
	// and 90 ms after the last.
	if got.LongestGap != ms(101) {
		t.Errorf("longest gap = %v, want 101ms", got.LongestGap)
	}
}

func TestSummarizeExtendsElapsedToLastCompletion(t *testing.T) {
	// An operation started inside a 1 s window that finishes at 3 s: the rate is taken over 3 s.
	samples := []sample{
		{start: 0, end: ms(500), rows: 1},
		{start: ms(900), end: 3 * time.Second, rows: 1},
	}
	got := summarize(samples, time.Second)
	if got.Elapsed != 3*time.Second {
		t.Fatalf("elapsed = %v, want 3s", got.Elapsed)
	}
	if math.Abs(got.RequestsPerSec-2.0/3) > 1e-9 {
		t.Errorf("rate = %v, want 2/3", got.RequestsPerSec)
	}
	if !near(got.Max, ms(2100)) || got.LongestGap != ms(2500) {
		t.Errorf("max = %v, gap = %v; want 2.1s and 2.5s", got.Max, got.LongestGap)
	}
}

func TestSummarizeEmpty(t *testing.T) {
	got := summarize(nil, 2*time.Second)
	if got.Requests != 0 || got.RequestsPerSec != 0 || got.P99 != 0 {
		t.Errorf("empty summary = %+v", got)
	}
	if got.LongestGap != 2*time.Second {
		t.Errorf("empty run: gap = %v, want the whole window (a stall)", got.LongestGap)
	}
}

func TestRatio(t *testing.T) {
	if got := Ratio(50, 200); got != 0.25 {
		t.Errorf("Ratio(50, 200) = %v", got)
	}
	if got := Ratio(1, 0); !math.IsNaN(got) {
		t.Errorf("Ratio over zero = %v, want NaN", got)
	}
}
