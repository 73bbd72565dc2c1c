package telemetry

import (
	"context"
	"reflect"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// spanData is what the encoder reads of an ended span: the fields of the SDK's span snapshot
// (go.opentelemetry.io/otel/sdk/trace.snapshot), with the same names, types and order.
//
// Each accessor of the snapshot has a value receiver, so every call through the
// ReadOnlySpan interface copies the whole snapshot (408 bytes): the fifteen calls that
// encoding a span takes copied 6 KB a span, more than the span allocates. When the SDK's
// snapshot has exactly this layout — checked field by field, with reflect, once
// (snapshotLayout) — readSpan reads it in place; otherwise it fills a spanData through the
// accessors, as before.
type spanData struct {
	name                  string
	spanContext           trace.SpanContext
	parent                trace.SpanContext
	spanKind              trace.SpanKind
	startTime             time.Time
	endTime               time.Time
	attributes            []attribute.KeyValue
	events                []sdktrace.Event
	links                 []sdktrace.Link
	status                sdktrace.Status
	childSpanCount        int
	droppedAttributeCount int
	droppedEventCount     int
	droppedLinkCount      int
	resource              *resource.Resource
	instrumentationScope  instrumentation.Scope
}

// readSpan is s's data: s's own snapshot, read in place, when its layout is spanData's, else
// a copy filled through s's accessors (an allocation: the SDK's spans are read in place, which
// TestSnapshotLayout checks, so only other ReadOnlySpans such as tracetest stubs pay for it).
// The result must not be modified.
func readSpan(s sdktrace.ReadOnlySpan) *spanData {
	if t := snapshotType(); t != nil && reflect.TypeOf(s) == t {
		return (*spanData)(reflect.ValueOf(s).UnsafePointer())
	}
	return &spanData{
		name:                  s.Name(),
		spanContext:           s.SpanContext(),
		parent:                s.Parent(),
		spanKind:              s.SpanKind(),
		startTime:             s.StartTime(),
		endTime:               s.EndTime(),
		attributes:            s.Attributes(),
		events:                s.Events(),
		links:                 s.Links(),
		status:                s.Status(),
		childSpanCount:        s.ChildSpanCount(),
		droppedAttributeCount: s.DroppedAttributes(),
		droppedEventCount:     s.DroppedEvents(),
		droppedLinkCount:      s.DroppedLinks(),
		resource:              s.Resource(),
		instrumentationScope:  s.InstrumentationScope(),
	}
}

// snapshotType is the type of the SDK's ended spans when it is a pointer to a struct laid
// out exactly as spanData, else nil.
var snapshotType = sync.OnceValue(func() reflect.Type { return snapshotLayout(endedSpanType()) })

// endedSpanType is the dynamic type of the ReadOnlySpan the SDK hands span processors.
func endedSpanType() reflect.Type {
	rec := tracetest.NewSpanRecorder() // the SDK's own: it keeps the spans as they end
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	_, span := tp.Tracer("github.com/subscriberd/subscriberd/telemetry").Start(context.Background(), "layout")
	span.End()
	_ = tp.Shutdown(context.Background())
	ended := rec.Ended()
	if len(ended) == 0 {
		return nil
	}
	return reflect.TypeOf(ended[0])
}

// snapshotLayout is t when it is a pointer to a struct with spanData's fields: the same
// names and types at the same offsets, and the same size.
func snapshotLayout(t reflect.Type) reflect.Type {
	want := reflect.TypeFor[spanData]()
	if t == nil || t.Kind() != reflect.Pointer {
		return nil
	}
	st := t.Elem()
	if st.Kind() != reflect.Struct || st.NumField() != want.NumField() || st.Size() != want.Size() || st.Align() != want.Align() {
		return nil
	}
	for i := range st.NumField() {
		got, exp := st.Field(i), want.Field(i)
		if got.Name != exp.Name || got.Type != exp.Type || got.Offset != exp.Offset {
			return nil
		}
	}
	return t
}
