// Package outage logs a dependency's outage in a few lines rather than one per failure: one
// when it starts, a summary at most every interval while it lasts, and one when it ends. The
// limiter's Redis failover and the API's database errors share it, so every outage reads the
// same in the logs. It imports no project package.
package outage

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultEvery is how often, at most, a summary is logged while an outage lasts.
const DefaultEvery = 30 * time.Second

// Messages are the three lines of an outage.
type Messages struct {
	// Start is logged at warn level with the first failure's error.
	Start string
	// Summary is logged at warn level, at most every interval while failures go on, with the
	// failures since the previous line ("failures") and the time since the start ("down_for").
	Summary string
	// End is logged at info level, with the outage's length ("down_for") and all its failures
	// ("failures").
	End string
}

// Log follows one dependency's state. It is safe for concurrent use; OK costs an atomic load
// while there is no outage.
type Log struct {
	log   *slog.Logger
	msgs  Messages
	every time.Duration
	now   func() time.Time

	down atomic.Bool
	mu   sync.Mutex
	// Guarded by mu, meaningful while down.
	since, lastLine   time.Time
	failures, pending int // in the whole outage; since the last line
}

// New returns a Log writing msgs to log, summarising at most every every (DefaultEvery when
// ≤ 0), reading time from now (time.Now when nil).
func New(log *slog.Logger, msgs Messages, every time.Duration, now func() time.Time) *Log {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if every <= 0 {
		every = DefaultEvery
	}
	if now == nil {
		now = time.Now
	}
	return &Log{log: log, msgs: msgs, every: every, now: now}
}

// Down reports whether an outage is going on.
func (o *Log) Down() bool { return o.down.Load() }

// Failed records one failure: the first starts the outage (Start is logged with err), the
// others are counted and summarised.
func (o *Log) Failed(ctx context.Context, err error) {
	now := o.now()
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.down.Load() {
		o.down.Store(true)
		o.since, o.lastLine, o.failures, o.pending = now, now, 1, 0
		o.log.WarnContext(ctx, o.msgs.Start, slog.String("error", errString(err)))
		return
	}
	o.failures++
	o.pending++
	if now.Sub(o.lastLine) < o.every {
		return
	}
	o.log.WarnContext(ctx, o.msgs.Summary, slog.Int("failures", o.pending),
		slog.Duration("down_for", now.Sub(o.since)), slog.String("error", errString(err)))
	o.lastLine, o.pending = now, 0
}

// Record records the result of one attempt made with ctx: OK for nil, Failed for an error,
// and nothing for an error once ctx has ended (the shutdown's, not the dependency's).
func (o *Log) Record(ctx context.Context, err error) {
	switch {
	case err == nil:
		o.OK(ctx)
	case ctx.Err() == nil:
		o.Failed(ctx, err)
	}
}

// OK records a success: it ends an outage, if one is going on, logging End.
func (o *Log) OK(ctx context.Context) {
	if !o.down.Load() {
		return
	}
	now := o.now()
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.down.Load() {
		return
	}
	o.down.Store(false)
	o.log.InfoContext(ctx, o.msgs.End, slog.Duration("down_for", now.Sub(o.since)), slog.Int("failures", o.failures))
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
