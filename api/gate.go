package api

import (
	"time"

	"github.com/danielgtaylor/huma/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// The bulk gate: at most a few bulk creates of an instance run at once; the others wait for a
// slot before anything reads their bodies, so that a waiting request holds no parsed rows, no
// sorted copy and no INSERT text, and no database connection. Without it, 256 concurrent bulk
// creates held 20–30 MiB live, mostly in requests waiting for one of the pool's connections,
// and under the default soft memory limit the collector ran almost constantly
// (docs/operating.md "Memory").
//
// Waiters are admitted in arrival order, as Go's channels wake blocked senders. A request
// whose context ends while it waits (its client went away) answers 499 and changes nothing;
// one that waits longer than the server's BulkWait answers 503 with Retry-After and changes
// nothing: its body is still to be read within the server's read timeout, counted from the
// request's start, and a queue that long is an overload to push back on, not to hide.

// metaGated marks an operation whose requests pass the bulk gate.
const metaGated = "gated"

// Outcomes of a wait at the bulk gate, as the bulk_gate event's app.bulk_gate.outcome and the
// BulkGateWait metric.
const (
	GateAdmitted  = "admitted"  // a slot was free, at once or after a wait
	GateAbandoned = "abandoned" // the request's context ended while it waited
	GateTimedOut  = "timed_out" // no slot came free within BulkWait: 503
)

// BulkConcurrency is the bulk gate's size for a database pool of poolConns connections: half
// of them, at least one. Each bulk create holds one connection for its transaction; the other
// half stays for reads, single writes and the outbox workers, so that a flood of imports does
// not starve them, and more bulk creates at once would only wait for connections while
// holding their rows.
func BulkConcurrency(poolConns int) int { return max(1, poolConns/2) }

// DefaultBulkWait is Config.BulkWait's zero value: a third of the HTTP server's 30 s read
// timeout, leaving the rest for reading the body.
const DefaultBulkWait = 10 * time.Second

// DefaultBulkConcurrency is Config.BulkConcurrency's zero value: BulkConcurrency of the
// PostgreSQL pool's default size (16 connections, repo.Options).
const DefaultBulkConcurrency = 8

// newGate returns the slots of a gate of n, or nil (no gate) when n is negative.
func newGate(n int) chan struct{} {
	switch {
	case n < 0:
		return nil
	case n == 0:
		n = DefaultBulkConcurrency
	}
	return make(chan struct{}, n)
}

// gate admits the requests of gated operations when one of the bulk slots is free, and holds
// the slot until the rest of the chain has answered.
func (s *Server) gate(ctx huma.Context, next func(huma.Context)) {
	if s.bulkSlots == nil || ctx.Operation().Metadata[metaGated] != true {
		next(ctx)
		return
	}
	select {
	case s.bulkSlots <- struct{}{}:
		// A free slot: no wait, nothing to record but a zero wait.
		s.metrics.BulkGateWait(GateAdmitted, 0)
	default:
		if !s.waitAtGate(ctx) {
			return
		}
	}
	defer func() { <-s.bulkSlots }()
	next(ctx)
}

// waitAtGate waits for a bulk slot or for the request's end, records the wait on the span and
// in the metrics, answers when the request ended, and reports whether it took a slot.
func (s *Server) waitAtGate(ctx huma.Context) bool {
	s.metrics.BulkGateWaiting(1)
	defer s.metrics.BulkGateWaiting(-1)
	start := time.Now()
	outcome := GateAdmitted
	timeout := time.NewTimer(s.bulkWait)
	defer timeout.Stop()
	select {
	case s.bulkSlots <- struct{}{}:
	case <-ctx.Context().Done():
		outcome = GateAbandoned
	case <-timeout.C:
		outcome = GateTimedOut
	}
	d := time.Since(start)
	if span := trace.SpanFromContext(ctx.Context()); span.IsRecording() {
		span.AddEvent("bulk_gate", trace.WithAttributes(attribute.String("app.bulk_gate.outcome", outcome),
			attribute.Float64("app.bulk_gate.wait_seconds", d.Seconds())))
	}
	s.metrics.BulkGateWait(outcome, d)
	if outcome == GateAdmitted {
		return true
	}
	// The client went away (net/http cancels the context then): 499, as for a client gone
	// anywhere else. A wait past BulkWait, or another end of the context (a deadline set by a
	// caller's middleware), is the service not serving in time: 503 with Retry-After, as when
	// the database cannot.
	if outcome == GateAbandoned && clientGone(ctx.Context()) {
		s.writeErr(ctx, clientClosed())
	} else {
		s.writeErr(ctx, unavailable())
	}
	return false
}
