package api

import (
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// The write gate, a bulkhead: at most WriteConcurrency writes of an instance (every operation
// but GET, HEAD and OPTIONS) hold or wait for a database connection at once, a number below
// the pool's size, so that reads always find connections. A write that finds every slot taken
// waits while the writes ahead of it finish; when none has finished for WriteWait (they all
// wait for something: a row another transaction holds), or it has waited 5 × WriteWait in
// all, it answers 503 with Retry-After and changes nothing.
//
// Without it, a transaction left open on a row held up every write of that row for the lock
// timeout, and the writes queued for the pool's connections before that: in the held-lock
// scenario of docs/operating.md, 100 writers answered their 503 after a median of 20 s (the
// lock timeout is 5 s) and reads of other rows took up to 14.5 s. With the gate, a write waits
// at most WriteWait for a slot while the slots are stuck, and then at most the lock timeout for
// its row; a burst of writes that each take milliseconds (many changes of the same rows) still
// queues and succeeds.
//
// Waiters are admitted in arrival order, as Go's channels wake blocked senders. A request
// whose client goes away while it waits answers 499, as anywhere else.

// WriteConcurrency is the write gate's size for a database pool of poolConns connections:
// three quarters of them, at least one, so that a quarter (at least one connection) stays for
// reads and the workers whatever the writes wait for.
func WriteConcurrency(poolConns int) int { return max(1, poolConns-max(1, poolConns/4)) }

// DefaultWriteConcurrency is Config.WriteConcurrency's zero value: WriteConcurrency of the
// PostgreSQL pool's default size (16 connections, repo.Options).
const DefaultWriteConcurrency = 12

// DefaultWriteWait is Config.WriteWait's zero value. When the writes holding the slots are
// stuck on a row, a waiting write gives up after it, and one admitted waits at most the
// database's lock timeout (5 s) for its row: every write answers within the lock timeout and a
// second.
const DefaultWriteWait = time.Second

// writeWaitRounds bounds a write's whole wait at the gate, in WriteWaits, however steadily the
// writes ahead of it finish.
const writeWaitRounds = 5

// Outcomes of a wait at the write gate, as the write_gate span event's app.write_gate.outcome.
const (
	WriteGateAdmitted  = "admitted"
	WriteGateAbandoned = "abandoned"
	WriteGateTimedOut  = "timed_out"
)

// newWriteGate returns the slots of a write gate of n, or nil (no gate) when n is negative.
func newWriteGate(n int) chan struct{} {
	switch {
	case n < 0:
		return nil
	case n == 0:
		n = DefaultWriteConcurrency
	}
	return make(chan struct{}, n)
}

// isWrite tells whether an operation's method may change what the database holds.
func isWrite(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return true
}

// writeGate admits the requests of write operations when one of the write slots is free, and
// holds the slot until the rest of the chain has answered.
func (s *Server) writeGate(ctx huma.Context, next func(huma.Context)) {
	if s.writeSlots == nil || !isWrite(ctx.Operation().Method) {
		next(ctx)
		return
	}
	select {
	case s.writeSlots <- struct{}{}:
	default:
		if !s.waitForWrite(ctx) {
			return
		}
	}
	defer func() {
		<-s.writeSlots
		s.writesDone.Add(1)
	}()
	next(ctx)
}

// waitForWrite waits for a write slot, or for the request's end, while the writes holding the
// slots finish (one at least every WriteWait) and at most writeWaitRounds WriteWaits; it
// records the wait on the span, answers when it took no slot, and reports whether it took one.
func (s *Server) waitForWrite(ctx huma.Context) bool {
	start := time.Now()
	deadline := start.Add(writeWaitRounds * s.writeWait)
	outcome := WriteGateAdmitted
	done := s.writesDone.Load()
	timeout := time.NewTimer(s.writeWait)
	defer timeout.Stop()
wait:
	for {
		select {
		case s.writeSlots <- struct{}{}:
			break wait
		case <-ctx.Context().Done():
			outcome = WriteGateAbandoned
			break wait
		case <-timeout.C:
			now := s.writesDone.Load()
			left := time.Until(deadline)
			if now == done || left <= 0 {
				outcome = WriteGateTimedOut
				break wait
			}
			done = now // the slots move: wait on, while they keep moving
			timeout.Reset(min(s.writeWait, left))
		}
	}
	if span := trace.SpanFromContext(ctx.Context()); span.IsRecording() {
		span.AddEvent("write_gate", trace.WithAttributes(attribute.String("app.write_gate.outcome", outcome),
			attribute.Float64("app.write_gate.wait_seconds", time.Since(start).Seconds())))
	}
	switch {
	case outcome == WriteGateAdmitted:
		return true
	case outcome == WriteGateAbandoned && clientGone(ctx.Context()):
		s.writeErr(ctx, clientClosed())
	default:
		s.writeErr(ctx, unavailable())
	}
	return false
}
