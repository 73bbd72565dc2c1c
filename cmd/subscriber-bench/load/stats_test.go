package load

import (
	"math"
	"testing"
	"time"
)

func ms(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

func TestPercentileNearestRank(t *testing.T) {
	// 1..100 ms: the p-th percentile by nearest rank is exactly p ms.
	var sorted []time.Duration
	for i := 1; i <= 100; i++ {
		sorted = append(sorted, ms(float64(i)))
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{50, ms(50)}, {90, ms(90)}, {99, ms(99)}, {100, ms(100)}, {0.1, ms(1)}, {1, ms(1)}, {99.5, ms(100)}} {
		if got := Percentile(sorted, tc.p); got != tc.want {
			t.Errorf("Percentile(1..100ms, %v) = %v, want %v", tc.p, got, tc.want)
		}
	}
}

func TestPercentileSmallSets(t *testing.T) {
	if got := Percentile(nil, 50); got != 0 {
		t.Errorf("empty: got %v, want 0", got)
	}
	one := []time.Duration{ms(7)}
	for _, p := range []float64{1, 50, 99, 100} {
		if got := Percentile(one, p); got != ms(7) {
			t.Errorf("one value, p%v: got %v, want 7ms", p, got)
		}
	}
	// Four values: p50 is the 2nd (ceil(2)), p90 and p99 the 4th.
	four := []time.Duration{ms(1), ms(2), ms(3), ms(40)}
	if got := Percentile(four, 50); got != ms(2) {
		t.Errorf("p50 of 1,2,3,40 = %v, want 2ms", got)
	}
	if got := Percentile(four, 51); got != ms(3) {
		t.Errorf("p51 of 1,2,3,40 = %v, want 3ms", got)
	}
	if got := Percentile(four, 90); got != ms(40) {
		t.Errorf("p90 of 1,2,3,40 = %v, want 40ms", got)
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
	var samples []Sample
	for i := range 10 {
		start := ms(float64(i * 100))
		s := Sample{Start: start, End: start + ms(float64(i+1)), Rows: 2}
		switch i {
		case 3:
			s.Err, s.Rows = "422", 0
		case 7:
			s.Err, s.Rows = "timeout", 0
		}
		samples = append(samples, s)
	}
	got := Summarize(samples, time.Second)
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
	if got.P50 != ms(5) || got.P90 != ms(9) || got.P99 != ms(10) || got.Max != ms(10) {
		t.Errorf("p50/p90/p99/max = %v/%v/%v/%v, want 5/9/10/10 ms", got.P50, got.P90, got.P99, got.Max)
	}
	if got.Mean != ms(5.5) {
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
	samples := []Sample{
		{Start: 0, End: ms(500), Rows: 1},
		{Start: ms(900), End: 3 * time.Second, Rows: 1},
	}
	got := Summarize(samples, time.Second)
	if got.Elapsed != 3*time.Second {
		t.Fatalf("elapsed = %v, want 3s", got.Elapsed)
	}
	if math.Abs(got.RequestsPerSec-2.0/3) > 1e-9 {
		t.Errorf("rate = %v, want 2/3", got.RequestsPerSec)
	}
	if got.Max != ms(2100) || got.LongestGap != ms(2500) {
		t.Errorf("max = %v, gap = %v; want 2.1s and 2.5s", got.Max, got.LongestGap)
	}
}

func TestSummarizeEmpty(t *testing.T) {
	got := Summarize(nil, 2*time.Second)
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
