package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// encodedExporter is an exporter that takes spans already encoded by appendSpan
// (OTLPExporter). With one, BatchProcessor encodes each span when it ends, on the goroutine
// that ends it, and queues bytes instead of the span:
//   - the span's data is still in that core's cache, where the export goroutine, milliseconds
//     later, read it from memory (the encoder's loads were most of its time under load);
//   - the queue holds no pointers, so the garbage collector neither scans a full queue nor
//     keeps the SDK's span snapshots alive until the export.
type encodedExporter interface {
	sdktrace.SpanExporter
	exportEncoded(ctx context.Context, spans *encodedSpans) error
}

var _ encodedExporter = (*OTLPExporter)(nil)

func (e *OTLPExporter) exportEncoded(ctx context.Context, spans *encodedSpans) error {
	return e.export(ctx, spans)
}

// spanKey is a span's resource and instrumentation scope, by which the export groups spans.
type spanKey struct {
	resKey attribute.Distinct
	res    *resource.Resource
	scope  instrumentation.Scope
}

// encodedSpans is a queue of encoded spans: their ScopeSpans.spans fields back to back in
// data, and for each its key (an index into keys) and place.
type encodedSpans struct {
	keys  []spanKey // shared with the processor's table, which only grows
	spans []encodedSpan
	data  []byte
}

type encodedSpan struct {
	key        int32
	start, end int32 // in data
}

var _ spanSource = (*encodedSpans)(nil)

func (q *encodedSpans) len() int { return len(q.spans) }

func (q *encodedSpans) key(i int) (*resource.Resource, instrumentation.Scope, bool) {
	k := &q.keys[q.spans[i].key]
	return k.res, k.scope, true
}

func (q *encodedSpans) appendSpan(b []byte, i int) []byte {
	s := q.spans[i]
	return append(b, q.data[s.start:s.end]...)
}

// push appends the span sd of key k, encoded by appendSpanData.
func (q *encodedSpans) push(k int32, sd *spanData) {
	start := len(q.data)
	q.data = appendSpanData(q.data, sd)
	q.spans = append(q.spans, encodedSpan{key: k, start: int32(start), end: int32(len(q.data))})
}

// moveFront moves the first n spans of q to dst (replacing what dst held) and keeps the rest.
// The two swap buffers, and only the rest is copied: the few spans that ended between the
// kick of a full batch and its export.
func (q *encodedSpans) moveFront(dst *encodedSpans, n int) {
	dst.keys = q.keys
	if n == 0 { // how every export ends: nothing to move, and nothing to copy
		dst.spans, dst.data = dst.spans[:0], dst.data[:0]
		return
	}
	cut := int(q.spans[n-1].end)
	restSpans := append(dst.spans[:0], q.spans[n:]...)
	restData := append(dst.data[:0], q.data[cut:]...)
	for i := range restSpans {
		restSpans[i].start -= int32(cut)
		restSpans[i].end -= int32(cut)
	}
	dst.spans, dst.data = q.spans[:n], q.data[:cut]
	q.spans, q.data = restSpans, restData
}

// release drops buffers that a burst made unusually large.
func (q *encodedSpans) release() {
	if cap(q.data) > maxRetainedBuffer {
		q.data = nil
	}
	if cap(q.spans) > 1<<16 {
		q.spans = nil
	}
}
