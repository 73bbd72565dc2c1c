// Package outbox holds what the workers of subscriberd's transactional outboxes share — the
// confirmation emails (package mail) and the webhook deliveries (package webhook): the loop
// that looks for due work and stops with its context, the lease of claimed work and the
// heartbeat that renews it (lease.go; the import workers keep their imports with it too), the
// lanes that put what one request caused before bulk work (lane.go), the jitter of retry
// delays, the link from an attempt's span to the request that queued the row, and the
// defaulting of their configurations. Claiming and sending stay with each worker. It imports
// no project package.
package outbox

import (
	"context"
	"math/rand/v2"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Loop calls round at once, whenever wake is signalled and every interval, until ctx ends.
// round reports whether more work may be due right away (a full batch); Loop then calls it
// again at once instead of waiting. Loop returns when ctx ends; round is never interrupted.
func Loop(ctx context.Context, wake <-chan struct{}, interval time.Duration, round func() (more bool)) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-timer.C:
		}
		for round() && ctx.Err() == nil {
		}
		timer.Reset(interval)
	}
}

// Jitter is d less a random part of up to a quarter of it, so that rows that failed together
// do not all come back together, and no retry comes later than its schedule says.
func Jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d - rand.N(d/4+1)
}

// Link is the span start option that links an attempt's span to the request that queued the
// row, from the W3C traceparent stored with it; none for an empty or invalid one.
func Link(traceparent string) []trace.SpanStartOption {
	if traceparent == "" {
		return nil
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent})
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return nil
	}
	return []trace.SpanStartOption{trace.WithLinks(trace.Link{SpanContext: sc})}
}

// Truncate cuts s to at most n bytes on a character boundary, so that an error text stored
// for a failed attempt stays valid UTF-8.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && n < len(s) && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}

// SetDefault sets *v to d when it is zero or negative: a worker configuration's unset
// field.
func SetDefault[T int | int64 | time.Duration](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}
