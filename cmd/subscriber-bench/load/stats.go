package load

// This file turns the raw samples of a run into the figures subscriber-bench reports:
// throughput, latency percentiles, errors by kind and the longest stretch without progress.
// It is pure computation, with no clock of its own, so every figure it gives is testable.

import (
	"math"
	"slices"
	"sort"
	"time"
)

// Sample is one finished operation of a run.
type Sample struct {
	// Start and End are offsets from the start of the measured window.
	Start, End time.Duration
	// Rows is how many rows a successful operation wrote or read (1 for single-row
	// operations, 100 for a bulk create of 100); 0 for a failed one.
	Rows int
	// Err is empty for a success, else the error's kind: an HTTP status ("422") or a
	// transport class ("timeout", "transport", "db").
	Err string
}

// Latency is the time the operation took.
func (s Sample) Latency() time.Duration { return s.End - s.Start }

// Summary is what a run reports.
type Summary struct {
	Requests int64            `json:"requests"`         // operations finished in the window
	OK       int64            `json:"ok"`               // of which succeeded
	Errors   map[string]int64 `json:"errors,omitempty"` // failures by kind
	Rows     int64            `json:"rows"`             // rows of the successful operations

	Elapsed time.Duration `json:"elapsed_ns"` // window length, up to the last completion

	RequestsPerSec float64 `json:"requests_per_sec"` // successful operations per second
	RowsPerSec     float64 `json:"rows_per_sec"`     // rows of successful operations per second

	// Latency of every finished operation, successful or not.
	Mean time.Duration `json:"mean_ns"`
	P50  time.Duration `json:"p50_ns"`
	P90  time.Duration `json:"p90_ns"`
	P99  time.Duration `json:"p99_ns"`
	Max  time.Duration `json:"max_ns"`

	// LongestGap is the longest interval of the window in which no operation finished:
	// from the window start to the first completion, between completions, or from the last
	// completion to the window end. A stalled service shows a gap close to the whole window
	// or the request timeout.
	LongestGap time.Duration `json:"longest_gap_ns"`
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
	kinds := make([]string, 0, len(s.Errors))
	for k := range s.Errors {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	return kinds
}

// Summarize computes the figures of samples measured in a window of length window (from
// offset 0). Operations may finish after the window; the elapsed time then extends to the last
// completion, so a rate never counts work done outside the time it is divided by.
func Summarize(samples []Sample, window time.Duration) Summary {
	s := Summary{Elapsed: window}
	if len(samples) == 0 {
		s.LongestGap = window
		return s
	}
	lat := make([]time.Duration, len(samples))
	ends := make([]time.Duration, len(samples))
	var sum time.Duration
	for i, x := range samples {
		lat[i] = x.Latency()
		ends[i] = x.End
		sum += lat[i]
		s.Requests++
		if x.Err == "" {
			s.OK++
			s.Rows += int64(x.Rows)
		} else {
			if s.Errors == nil {
				s.Errors = map[string]int64{}
			}
			s.Errors[x.Err]++
		}
	}
	slices.Sort(lat)
	slices.Sort(ends)
	if last := ends[len(ends)-1]; last > s.Elapsed {
		s.Elapsed = last
	}
	s.Mean = sum / time.Duration(len(lat))
	s.P50 = Percentile(lat, 50)
	s.P90 = Percentile(lat, 90)
	s.P99 = Percentile(lat, 99)
	s.Max = lat[len(lat)-1]
	s.RequestsPerSec = Rate(s.OK, s.Elapsed)
	s.RowsPerSec = Rate(s.Rows, s.Elapsed)
	s.LongestGap = LongestGap(ends, s.Elapsed)
	return s
}

// Percentile returns the p-th percentile (0 < p ≤ 100) of sorted by the nearest-rank method:
// the smallest value such that at least p % of the values are less than or equal to it.
// It returns 0 for an empty slice.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	if rank < 1 {
		rank = 1
	}
	if rank > n {
		rank = n
	}
	return sorted[rank-1]
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
		if e < prev {
			e = prev
		}
		gap = max(gap, e-prev)
		prev = e
	}
	if window > prev {
		gap = max(gap, window-prev)
	}
	return gap
}

// Ratio is a/b, or NaN when b is zero (no baseline to compare with).
func Ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}
