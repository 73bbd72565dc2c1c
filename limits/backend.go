package limits

import (
	"context"
	"time"
)

// Backend stores the counters behind decisions. Memory keeps them in the process; Redis shares
// them between instances. Both run the same algorithms and give identical answers for the
// same sequence of calls at the same instants. Keys are opaque to a backend.
type Backend interface {
	// Take answers a request subject to the lock at lockKey and to every bucket. When the lock
	// is on, nothing else is looked at. Otherwise one request is taken from every bucket if
	// all of them have room, and from none of them if any is empty (all or nothing).
	Take(ctx context.Context, lockKey string, buckets []Bucket) (Outcome, error)
	// LockedFor reports how long the lock at lockKey still holds (0 when it does not).
	LockedFor(ctx context.Context, lockKey string) (time.Duration, error)
	// Fail records one failure in the log at logKey; when rule.Failures failures fall within
	// rule.Window, it clears the log, sets the lock at lockKey for rule.Lock and reports
	// started. While the lock holds it records nothing and reports how long the lock still
	// holds: a failure that raced the one that started the lock neither counts toward the
	// next lock nor starts it again.
	Fail(ctx context.Context, logKey, lockKey string, rule Lockout) (started bool, held time.Duration, err error)
	// Ping reports whether the backend is reachable.
	Ping(ctx context.Context) error
	// Name is a fixed name for telemetry: "memory" or "redis".
	Name() string
}

// Bucket is one window of one subject, stored under Key.
type Bucket struct {
	Key    string
	Window Window
}

// Outcome is a backend's answer to Take.
type Outcome struct {
	Locked  time.Duration // > 0: the lock holds for this long and Windows is empty
	Allowed bool          // the request was taken from every bucket
	Windows []WindowState // one per bucket, in order
	Backend string        // the Name of the backend that answered
}

// WindowState is one bucket's part of an Outcome. When the outcome is not allowed, the
// states of the buckets that had room describe what would have happened; nothing was taken.
type WindowState struct {
	Allowed    bool
	Remaining  int           // requests left after this one
	ResetAfter time.Duration // until the bucket is full again
	RetryAfter time.Duration // until a request fits (0 when allowed)
}

// gcra answers one bucket whose theoretical arrival time is tat (µs, 0 when unknown) at now (µs),
// returning the new tat to store when the request is taken. The Redis scripts hold the same
// arithmetic in Lua; keep them in step.
func gcra(now, tat int64, w Window) (int64, WindowState) {
	em := w.emission()
	burst := em * int64(w.Limit)
	if tat < now {
		tat = now
	}
	next := tat + em
	diff := now - (next - burst)
	if diff < 0 {
		return tat, WindowState{ResetAfter: us(tat - now), RetryAfter: us(-diff)}
	}
	return next, WindowState{Allowed: true, Remaining: int(diff / em), ResetAfter: us(next - now)}
}

// lockoutTrips reports whether the failure log (newest first, already holding the failure at
// now) fills rule: rule.Failures entries, the oldest within rule.Window of now.
func lockoutTrips(now int64, log []int64, rule Lockout) bool {
	return len(log) >= rule.Failures && now-log[rule.Failures-1] < rule.Window.Microseconds()
}

func us(n int64) time.Duration { return time.Duration(n) * time.Microsecond }
