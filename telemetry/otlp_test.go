package telemetry

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"math"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

// capture is an OTLP receiver that keeps every request (body decompressed).
type capture struct {
	srv *httptest.Server
	mu  sync.Mutex
	req []capturedRequest
	// respond, when set, answers the nth request (from 0) instead of 200 with an empty body.
	respond func(n int, w http.ResponseWriter, r *http.Request)
}

type capturedRequest struct {
	header http.Header
	body   []byte // as received
	plain  []byte // decompressed
}

func newCapture(t testing.TB, respond func(n int, w http.ResponseWriter, r *http.Request)) *capture {
	c := &capture{respond: respond}
	c.srv = httptest.NewServer(http.HandlerFunc(c.serve))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *capture) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	plain := body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err == nil {
			plain, err = io.ReadAll(zr)
		}
		if err != nil {
			http.Error(w, "bad gzip", http.StatusBadRequest)
			return
		}
	}
	c.mu.Lock()
	n := len(c.req)
	c.req = append(c.req, capturedRequest{header: r.Header.Clone(), body: body, plain: plain})
	c.mu.Unlock()
	if c.respond != nil {
		c.respond(n, w, r)
	}
}

func (c *capture) requests() []capturedRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.req)
}

func (c *capture) url() string { return c.srv.URL + "/v1/traces" }

// envOf turns a map into a getenv.
func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// newTestExporter returns our exporter posting to url, with retries that do not sleep.
func newTestExporter(t testing.TB, url string, extra map[string]string) *OTLPExporter {
	t.Helper()
	env := map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url}
	for k, v := range extra {
		env[k] = v
	}
	e, err := NewOTLPExporter(envOf(env))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Shutdown(context.Background()) })
	return e
}

func decodeRequest(t testing.TB, body []byte) *coltracepb.ExportTraceServiceRequest {
	t.Helper()
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &req); err != nil {
		t.Fatalf("the request does not decode as an ExportTraceServiceRequest: %v", err)
	}
	return &req
}

// equivalenceSpans are spans from real tracer providers that use every field the exporters
// send: two resources, several scopes, every kind, local and remote parents, trace states,
// links, events, every attribute type, error and ok status, and dropped counts.
func equivalenceSpans(t testing.TB) []sdktrace.ReadOnlySpan {
	t.Helper()
	ctx := context.Background()
	res, err := resource.New(ctx, resource.WithSchemaURL("https://opentelemetry.io/schemas/1.43.0"),
		resource.WithAttributes(attribute.String("service.name", "subscriberd"), attribute.String("service.version", "1.2.3"),
			attribute.Int("host.cpus", 8), attribute.StringSlice("process.command_args", []string{"subscriberd", "serve"})))
	if err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithSpanProcessor(rec),
		sdktrace.WithRawSpanLimits(sdktrace.SpanLimits{
			AttributeValueLengthLimit: -1, AttributeCountLimit: 24, EventCountLimit: 3, LinkCountLimit: 2,
			AttributePerEventCountLimit: 2, AttributePerLinkCountLimit: 2,
		}))
	defer tp.Shutdown(ctx)

	api := tp.Tracer("github.com/subscriberd/subscriberd/telemetry", trace.WithInstrumentationVersion("1.2.3"),
		trace.WithSchemaURL("https://opentelemetry.io/schemas/1.43.0"),
		trace.WithInstrumentationAttributes(attribute.String("scope.kind", "http"), attribute.Bool("scope.flag", true)))
	db := tp.Tracer("github.com/subscriberd/subscriberd/repo")
	apiV2 := tp.Tracer("github.com/subscriberd/subscriberd/telemetry", trace.WithInstrumentationVersion("2.0.0"))

	remoteTS, err := trace.ParseTraceState("vendor=abc,other=x-1")
	if err != nil {
		t.Fatal(err)
	}
	caller := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0xca, 0x11}, SpanID: trace.SpanID{0xca, 0x11, 0xe4}, TraceFlags: trace.FlagsSampled,
		TraceState: remoteTS, Remote: true,
	})
	unsampledLocal := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}})

	allTypes := []attribute.KeyValue{
		attribute.String("http.request.method", "GET"), attribute.String("empty.string", ""),
		attribute.Bool("flag.true", true), attribute.Bool("flag.false", false),
		attribute.Int64("int.zero", 0), attribute.Int64("int.neg", -42), attribute.Int64("int.max", math.MaxInt64),
		attribute.Float64("float.pi", math.Pi), attribute.Float64("float.zero", 0), attribute.Float64("float.neg", -1.5e-300),
		attribute.BoolSlice("bools", []bool{true, false, true}), attribute.Int64Slice("ints", []int64{1, -2, 0, math.MinInt64}),
		attribute.Float64Slice("floats", []float64{0.5, -0, math.Inf(1)}), attribute.StringSlice("strings", []string{"a", "", "ü"}),
		attribute.StringSlice("strings.empty", []string{}),
		{Key: "bytes", Value: attribute.ByteSliceValue([]byte{0, 1, 2, 0xff})},
		{Key: "slice", Value: attribute.SliceValue(attribute.StringValue("x"), attribute.IntValue(3), attribute.SliceValue(attribute.BoolValue(true)))},
		{Key: "map", Value: attribute.MapValue(attribute.String("k", "v"), attribute.Int("n", 1), attribute.KeyValue{Key: "inner", Value: attribute.MapValue(attribute.Float64("f", 2))})},
		attribute.String("long", strings.Repeat("l", 300)), // a length that needs two varint bytes
	}

	// A server span: the remote caller linked, every attribute type, an event, an error.
	sctx, server := api.Start(ctx, "GET /api/v1/subscribers/{id}", trace.WithSpanKind(trace.SpanKindServer), trace.WithNewRoot(),
		trace.WithAttributes(allTypes...),
		trace.WithLinks(trace.Link{SpanContext: caller, Attributes: []attribute.KeyValue{attribute.String("link.kind", "caller")}},
			trace.Link{SpanContext: unsampledLocal}))
	server.AddEvent("exception", trace.WithAttributes(attribute.String("exception.type", "*errors.errorString"),
		attribute.String("exception.message", "boom")))
	server.AddEvent("no attributes")

	// A client span, child of the server span, with a 300-byte statement and status Ok.
	_, client := db.Start(sctx, "SELECT subscribers", trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("db.system.name", "postgresql"), attribute.String("db.namespace", "subscriberd"),
		attribute.String("db.operation", "SELECT"), attribute.String("db.statement", strings.Repeat("SELECT ? ", 33)+"FROM x")))
	client.SetStatus(codes.Ok, "ignored by the SDK for Ok")
	client.End()
	server.SetStatus(codes.Error, "handler failed")
	server.End()

	// An internal span under a remote parent that carries a trace state.
	rctx := trace.ContextWithRemoteSpanContext(ctx, caller)
	_, internal := apiV2.Start(rctx, "internal work", trace.WithSpanKind(trace.SpanKindInternal))
	internal.End()

	// Producer and consumer, and one span over every limit: 30 attributes (24 kept), 5
	// events (3 kept), 3 links (2 kept), an event and a link with 3 attributes (2 kept).
	_, producer := db.Start(ctx, "publish", trace.WithSpanKind(trace.SpanKindProducer))
	producer.End()
	var many []attribute.KeyValue
	for i := range 30 {
		many = append(many, attribute.Int("attr."+string(rune('a'+i)), i))
	}
	three := trace.WithAttributes(attribute.Int("a", 1), attribute.Int("b", 2), attribute.Int("c", 3))
	_, over := apiV2.Start(ctx, "over the limits", trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(many...),
		trace.WithLinks(trace.Link{SpanContext: caller, Attributes: []attribute.KeyValue{attribute.Int("a", 1), attribute.Int("b", 2), attribute.Int("c", 3)}},
			trace.Link{SpanContext: unsampledLocal}, trace.Link{SpanContext: caller}))
	for i := range 5 {
		over.AddEvent("event "+string(rune('0'+i)), three)
	}
	over.End()

	// A second provider: another resource (no schema URL), a span of unspecified kind.
	res2 := resource.NewSchemaless(attribute.String("service.name", "worker"))
	rec2 := tracetest.NewSpanRecorder()
	tp2 := sdktrace.NewTracerProvider(sdktrace.WithResource(res2), sdktrace.WithSpanProcessor(rec2))
	defer tp2.Shutdown(ctx)
	_, other := tp2.Tracer("github.com/subscriberd/subscriberd/mail").Start(ctx, "send", trace.WithSpanKind(trace.SpanKindUnspecified))
	other.End()

	spans := append(rec.Ended(), rec2.Ended()...)
	// Interleave the providers and scopes, so that grouping has work to do.
	spans = append(spans[len(spans)-1:], spans[:len(spans)-1]...)

	// Stubs for what a provider never produces: no resource, the zero scope, zero times,
	// out-of-range counts, an Ok status with a message, an EMPTY value and an empty key.
	stubs := tracetest.SpanStubs{
		{
			Name:        "stub",
			SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{9}, SpanID: trace.SpanID{9}}),
			Parent:      trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{9}, SpanID: trace.SpanID{8}, Remote: true}),
			SpanKind:    trace.SpanKind(42),
			Attributes:  []attribute.KeyValue{{Key: "empty.value"}, {Key: "", Value: attribute.StringValue("no key")}},
			Status:      sdktrace.Status{Code: codes.Ok, Description: "fine"},
			Events:      []sdktrace.Event{{Name: "", DroppedAttributeCount: -3}},
			Links:       []sdktrace.Link{{SpanContext: unsampledLocal, DroppedAttributeCount: 7}},

			DroppedAttributes: -1, DroppedEvents: math.MaxUint32 + 10, DroppedLinks: 5,
		},
		{
			Name:                 "stub in a scope without a resource",
			SpanContext:          trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{7}, SpanID: trace.SpanID{7}, TraceFlags: trace.FlagsSampled}),
			StartTime:            time.Unix(1, 5),
			EndTime:              time.Unix(2, 0),
			InstrumentationScope: instrumentation.Scope{Name: "stub", SchemaURL: "https://example.com/schema"},
			Status:               sdktrace.Status{Code: codes.Code(99), Description: "unknown code"},
		},
		{
			Name:                 "stub in a scope with a version only",
			SpanContext:          trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{6}, SpanID: trace.SpanID{6}}),
			InstrumentationScope: instrumentation.Scope{Version: "0.1"},
		},
	}
	return append(spans, stubs.Snapshots()...)
}

// normalize puts a request in a canonical order: resources and, within each, scopes sorted by
// their encoding; spans stay in order (both exporters keep the input order).
func normalize(t testing.TB, req *coltracepb.ExportTraceServiceRequest) {
	t.Helper()
	key := func(m proto.Message) string {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, rs := range req.ResourceSpans {
		slices.SortStableFunc(rs.ScopeSpans, func(a, b *tracepb.ScopeSpans) int {
			return cmp.Compare(key(a.Scope)+"|"+a.SchemaUrl, key(b.Scope)+"|"+b.SchemaUrl)
		})
	}
	slices.SortStableFunc(req.ResourceSpans, func(a, b *tracepb.ResourceSpans) int {
		return cmp.Compare(key(a.Resource)+"|"+a.SchemaUrl, key(b.Resource)+"|"+b.SchemaUrl)
	})
}

// ourShapedSpans returns n spans shaped like subscriberd's, in pairs: a SERVER span with ten
// attributes and one event, and its DB CLIENT child with five attributes, one of them a
// 300-byte statement.
func ourShapedSpans(tb testing.TB, n int) []sdktrace.ReadOnlySpan {
	tb.Helper()
	ctx := context.Background()
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", "subscriberd"),
		attribute.String("service.version", "1.4.0")))
	if err != nil {
		tb.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(ctx)
	api := tp.Tracer("github.com/subscriberd/subscriberd/telemetry")
	db := tp.Tracer("github.com/subscriberd/subscriberd/repo")
	stmt := "SELECT " + strings.Repeat(`"s"."column", `, 20) + `"s"."id" FROM "subscribers" AS "s" WHERE ("s"."newsletter_id" = ?) AND ("s"."id" = ?) LIMIT 1`
	stmt = stmt[:300]
	for i := 0; i < n; i += 2 {
		sctx, server := api.Start(ctx, "GET /api/v1/subscribers/{id}", trace.WithSpanKind(trace.SpanKindServer), trace.WithNewRoot(),
			trace.WithAttributes(attribute.String("server.address", "api.example.com"), attribute.Int("server.port", 443),
				attribute.String("http.request.method", "GET"), attribute.String("url.scheme", "https"),
				attribute.String("network.protocol.version", "1.1"), attribute.String("user_agent.original", "Go-http-client/1.1")))
		server.AddEvent("auth", trace.WithAttributes(attribute.String("auth.key_id", "0192e3b4-8f0a-7c3e-9d1b-5a6f7e8d9c0b")))
		if i+1 < n {
			_, client := db.Start(sctx, "query", trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
				attribute.String("db.system.name", "postgresql"), attribute.String("db.namespace", "subscriberd")))
			client.SetName("SELECT subscribers")
			client.SetAttributes(attribute.String("db.operation", "SELECT"), attribute.String("db.statement", stmt),
				attribute.String("db.system", "postgresql"))
			client.End()
		}
		server.SetName("GET /api/v1/subscribers/{id}")
		server.SetAttributes(attribute.String("http.route", "/api/v1/subscribers/{id}"),
			attribute.String("url.path", "/api/v1/subscribers/0192e3b4-8f0a-7c3e-9d1b-5a6f7e8d9c0b"),
			attribute.Int("http.response.status_code", 200), attribute.String("http.response.body.size", "312"))
		server.End()
	}
	return rec.Ended()
}

// exportBoth sends spans through the official exporter and ours, each to its own receiver,
// and returns the decoded requests: official, ours.
func exportBoth(t *testing.T, spans []sdktrace.ReadOnlySpan) (want, got *coltracepb.ExportTraceServiceRequest) {
	t.Helper()
	ctx := context.Background()
	offRecv, ourRecv := newCapture(t, nil), newCapture(t, nil)
	off, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(offRecv.url()))
	if err != nil {
		t.Fatal(err)
	}
	defer off.Shutdown(ctx)
	if err := off.ExportSpans(ctx, spans); err != nil {
		t.Fatalf("official exporter: %v", err)
	}
	ours := newTestExporter(t, ourRecv.url(), nil)
	if err := ours.ExportSpans(ctx, spans); err != nil {
		t.Fatalf("our exporter: %v", err)
	}
	offReqs, ourReqs := offRecv.requests(), ourRecv.requests()
	if len(offReqs) != 1 || len(ourReqs) != 1 {
		t.Fatalf("requests: official %d, ours %d; want 1 each", len(offReqs), len(ourReqs))
	}
	return decodeRequest(t, offReqs[0].plain), decodeRequest(t, ourReqs[0].plain)
}

// takeLinkTraceStates checks that every link in req carries the trace state of the source
// link, then clears them (the official exporter does not send them). It returns how many
// were not empty.
func takeLinkTraceStates(t *testing.T, req *coltracepb.ExportTraceServiceRequest, spans []sdktrace.ReadOnlySpan) int {
	t.Helper()
	bySpanID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		bySpanID[s.SpanContext().SpanID()] = s
	}
	n := 0
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				src := bySpanID[trace.SpanID(sp.SpanId)]
				if src == nil || len(src.Links()) != len(sp.Links) {
					t.Fatalf("span %q: no source span with %d links", sp.Name, len(sp.Links))
				}
				for i, l := range sp.Links {
					if want := src.Links()[i].SpanContext.TraceState().String(); l.TraceState != want {
						t.Errorf("span %q link %d: trace_state %q, want %q", sp.Name, i, l.TraceState, want)
					}
					if l.TraceState != "" {
						n++
					}
					l.TraceState = ""
				}
			}
		}
	}
	return n
}

func countSpans(req *coltracepb.ExportTraceServiceRequest) (resources, scopes, spans int) {
	for _, rs := range req.ResourceSpans {
		resources++
		for _, ss := range rs.ScopeSpans {
			scopes++
			spans += len(ss.Spans)
		}
	}
	return resources, scopes, spans
}

// TestOTLPExporterMatchesOfficial is the proof that the encoder is right: the official
// otlptracehttp exporter and ours, given the same spans, send requests that decode to equal
// messages (link trace states aside: ours sends them, the official one drops them).
func TestOTLPExporterMatchesOfficial(t *testing.T) {
	t.Run("every field", func(t *testing.T) {
		spans := equivalenceSpans(t)
		want, got := exportBoth(t, spans)
		if n := takeLinkTraceStates(t, got, spans); n < 2 {
			t.Errorf("%d links with a trace state were exported, want at least 2 (the test data has them)", n)
		}
		if r, s, n := countSpans(want); r != 3 || s != 7 || n != len(spans) {
			t.Fatalf("official request has %d resources, %d scopes, %d spans; the test data should make 3, 7, %d", r, s, n, len(spans))
		}
		compareRequests(t, want, got)
	})
	t.Run("our spans, 512", func(t *testing.T) {
		spans := ourShapedSpans(t, 512) // scope spans over 16 KiB: a 3-byte length
		want, got := exportBoth(t, spans)
		compareRequests(t, want, got)
	})
	t.Run("one span", func(t *testing.T) {
		spans := ourShapedSpans(t, 1) // every length fits one byte but the span's
		want, got := exportBoth(t, spans)
		compareRequests(t, want, got)
	})
	t.Run("big attributes", func(t *testing.T) {
		// A span over 16 KiB (its length needs 3 bytes, one more than reserved) and a
		// request over 2 MiB (4 bytes).
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		tr := tp.Tracer("big")
		_, s := tr.Start(context.Background(), "huge", trace.WithAttributes(attribute.String("blob", strings.Repeat("x", 20000))))
		s.End()
		for range 300 {
			_, s := tr.Start(context.Background(), "large", trace.WithAttributes(attribute.String("blob", strings.Repeat("y", 8000)),
				attribute.StringSlice("list", []string{strings.Repeat("z", 200)})))
			s.End()
		}
		spans := rec.Ended()
		want, got := exportBoth(t, spans)
		compareRequests(t, want, got)
	})
}

func compareRequests(t *testing.T, want, got *coltracepb.ExportTraceServiceRequest) {
	t.Helper()
	normalize(t, want)
	normalize(t, got)
	if !proto.Equal(want, got) {
		t.Errorf("our request differs from the official one (-official +ours):\n%s", gocmp.Diff(want, got, protocmp.Transform()))
	}
}

// TestOTLPEncodeAllocatesNothing: once its buffers have grown, encoding a batch of spans
// shaped like ours allocates nothing at all.
func TestOTLPEncodeAllocatesNothing(t *testing.T) {
	spans := ourShapedSpans(t, 512)
	var enc spanEncoder
	var src spanSource = readOnlySpans(spans) // boxed once per export, outside the encoder
	enc.encode(src)
	enc.release()
	if allocs := testing.AllocsPerRun(20, func() { enc.encode(src); enc.release() }); allocs != 0 {
		t.Errorf("encoding 512 spans allocates %v times, want 0", allocs)
	}
}

// TestOTLPExportAllocationsDoNotGrowWithSpans: an export's allocations (request, response,
// receiver) do not depend on the number of spans.
func TestOTLPExportAllocationsDoNotGrowWithSpans(t *testing.T) {
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) //nolint:errcheck
	}))
	defer recv.Close()
	e := newTestExporter(t, recv.URL+"/v1/traces", nil)
	ctx := context.Background()
	perExport := func(spans []sdktrace.ReadOnlySpan) float64 {
		for range 3 {
			if err := e.ExportSpans(ctx, spans); err != nil {
				t.Fatal(err)
			}
		}
		return testing.AllocsPerRun(50, func() {
			if err := e.ExportSpans(ctx, spans); err != nil {
				t.Fatal(err)
			}
		})
	}
	few, many := perExport(ourShapedSpans(t, 16)), perExport(ourShapedSpans(t, 512))
	t.Logf("allocations per export: 16 spans %v, 512 spans %v", few, many)
	if many > few+10 {
		t.Errorf("an export of 512 spans allocates %v times, of 16 spans %v: allocations grow with the spans", many, few)
	}
}

func TestOTLPConfigFromEnv(t *testing.T) {
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	certFile, keyFile := writeClientCert(t, dir)
	notPEM := filepath.Join(dir, "not.pem")
	tlsSrv := httptest.NewTLSServer(http.NotFoundHandler())
	tlsSrv.Close()
	writeFile(t, caFile, certPEMOf(t, tlsSrv))
	writeFile(t, notPEM, []byte("not a certificate"))

	type want struct {
		url     string
		headers map[string]string
		timeout time.Duration
		gzip    bool
		tls     bool
		err     string // substring of the error; "" for none
	}
	tests := []struct {
		name string
		env  map[string]string
		want want
	}{
		{"nothing set", nil, want{url: "http://localhost:4318/v1/traces"}},
		{"base endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"},
			want{url: "http://collector:4318/v1/traces"}},
		{"base endpoint, trailing slash", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"},
			want{url: "http://collector:4318/v1/traces"}},
		{"base endpoint with a path", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://gw.example.com/otlp/"},
			want{url: "https://gw.example.com/otlp/v1/traces"}},
		{"base endpoint with a path, no slash", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": " https://gw.example.com/otlp "},
			want{url: "https://gw.example.com/otlp/v1/traces"}},
		{"traces endpoint used as is", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/custom/path"},
			want{url: "http://c:4318/custom/path"}},
		{"traces endpoint without a path", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318"},
			want{url: "http://c:4318"}},
		{"traces endpoint wins", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://a:1/t", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:2"},
			want{url: "http://a:1/t"}},
		{"endpoint without scheme", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"},
			want{err: "OTEL_EXPORTER_OTLP_ENDPOINT: "}},
		{"endpoint with another scheme", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "grpc://c:4317"},
			want{err: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "}},
		{"endpoint that does not parse", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1"},
			want{err: "OTEL_EXPORTER_OTLP_ENDPOINT: not a valid URL"}},
		{"bad generic endpoint ignored when the traces one is set",
			map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://a:1/t", "OTEL_EXPORTER_OTLP_ENDPOINT": "nonsense"},
			want{url: "http://a:1/t"}},

		{"headers", map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "api-key=k1, Authorization=Bearer%20t%3D%3D ,x-empty=,"},
			want{url: "http://localhost:4318/v1/traces", headers: map[string]string{"Api-Key": "k1", "Authorization": "Bearer t==", "X-Empty": ""}}},
		{"traces headers replace generic ones",
			map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "a=1,b=2", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "b=3"},
			want{url: "http://localhost:4318/v1/traces", headers: map[string]string{"B": "3", "A": ""}}},
		{"user agent can be overridden", map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "User-Agent=custom/1"},
			want{url: "http://localhost:4318/v1/traces", headers: map[string]string{"User-Agent": "custom/1"}}},
		{"header without =", map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "a=1,Authorization Bearer s3cr3t"},
			want{err: "OTEL_EXPORTER_OTLP_HEADERS: entry 2 has no '='"}},
		{"header with a bad key", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "Authorization: Bearer s3cr3t=="},
			want{err: "OTEL_EXPORTER_OTLP_TRACES_HEADERS: the key of entry 1"}},
		{"header with a bad escape", map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "token=s3cr3t%zz"},
			want{err: "OTEL_EXPORTER_OTLP_HEADERS: the value of entry 1"}},
		{"header with a line break", map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "a=s3cr3t%0D%0AInjected: 1"},
			want{err: "OTEL_EXPORTER_OTLP_HEADERS: the value of entry 1"}},

		{"timeout", map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "2500"},
			want{url: "http://localhost:4318/v1/traces", timeout: 2500 * time.Millisecond}},
		{"traces timeout wins", map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "2500", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "700"},
			want{url: "http://localhost:4318/v1/traces", timeout: 700 * time.Millisecond}},
		{"timeout in seconds", map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "10s"}, want{err: "OTEL_EXPORTER_OTLP_TIMEOUT: "}},
		{"negative timeout", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "-1"}, want{err: "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT: "}},
		{"zero timeout", map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "0"}, want{err: "OTEL_EXPORTER_OTLP_TIMEOUT: "}},

		{"gzip", map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"},
			want{url: "http://localhost:4318/v1/traces", gzip: true}},
		{"traces compression wins", map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "none"},
			want{url: "http://localhost:4318/v1/traces"}},
		{"unknown compression", map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, want{err: "OTEL_EXPORTER_OTLP_COMPRESSION: "}},

		{"protocol http/protobuf", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
			want{url: "http://localhost:4318/v1/traces"}},
		{"protocol grpc", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, want{err: "OTEL_EXPORTER_OTLP_PROTOCOL: \"grpc\" is not supported"}},
		{"protocol http/json", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
			want{err: "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: \"http/json\" is not supported"}},
		{"traces protocol wins", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"},
			want{url: "http://localhost:4318/v1/traces"}},

		{"certificates", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4318", "OTEL_EXPORTER_OTLP_CERTIFICATE": caFile,
			"OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": certFile, "OTEL_EXPORTER_OTLP_CLIENT_KEY": keyFile},
			want{url: "https://c:4318/v1/traces", tls: true}},
		{"certificate for an http endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_CERTIFICATE": caFile},
			want{err: "is not https"}},
		{"missing certificate file", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4318", "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": filepath.Join(dir, "nope.pem")},
			want{err: "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE: "}},
		{"certificate file without PEM", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4318", "OTEL_EXPORTER_OTLP_CERTIFICATE": notPEM},
			want{err: "OTEL_EXPORTER_OTLP_CERTIFICATE: "}},
		{"client certificate without key", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4318", "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": certFile},
			want{err: "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY must be set together"}},
		{"client key that is not a key", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4318",
			"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": certFile, "OTEL_EXPORTER_OTLP_CLIENT_KEY": caFile},
			want{err: "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE, OTEL_EXPORTER_OTLP_CLIENT_KEY: "}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := otlpConfigFromEnv(envOf(tc.env), os.ReadFile)
			if tc.want.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want.err) {
					t.Fatalf("error = %v, want one containing %q", err, tc.want.err)
				}
				if strings.Contains(err.Error(), "s3cr3t") {
					t.Errorf("error %q quotes a header value", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.url != tc.want.url {
				t.Errorf("url = %q, want %q", cfg.url, tc.want.url)
			}
			for k, v := range tc.want.headers {
				if got := cfg.headers.Get(k); got != v {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
			if tc.want.headers["User-Agent"] == "" && cfg.headers.Get("User-Agent") != otlpUserAgent {
				t.Errorf("User-Agent = %q, want %q", cfg.headers.Get("User-Agent"), otlpUserAgent)
			}
			wantTimeout := cmp.Or(tc.want.timeout, 10*time.Second)
			if cfg.timeout != wantTimeout {
				t.Errorf("timeout = %v, want %v", cfg.timeout, wantTimeout)
			}
			if cfg.gzip != tc.want.gzip {
				t.Errorf("gzip = %v, want %v", cfg.gzip, tc.want.gzip)
			}
			if (cfg.tls != nil) != tc.want.tls {
				t.Errorf("tls config = %v, want one: %v", cfg.tls, tc.want.tls)
			}
			if tc.want.tls && (cfg.tls.RootCAs == nil || len(cfg.tls.Certificates) != 1) {
				t.Errorf("tls config has roots %v and %d client certificates, want roots and 1", cfg.tls.RootCAs, len(cfg.tls.Certificates))
			}
		})
	}
}

func TestOTLPExporterSendsProtobufWithHeaders(t *testing.T) {
	recv := newCapture(t, nil)
	e := newTestExporter(t, recv.url(), map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20tok,X-Tenant=acme"})
	spans := ourShapedSpans(t, 4)
	if err := e.ExportSpans(context.Background(), spans); err != nil {
		t.Fatal(err)
	}
	if err := e.ExportSpans(context.Background(), nil); err != nil { // nothing to send: no request
		t.Fatal(err)
	}
	reqs := recv.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	h := reqs[0].header
	for k, v := range map[string]string{"Content-Type": "application/x-protobuf", "Authorization": "Bearer tok", "X-Tenant": "acme",
		"User-Agent": otlpUserAgent, "Content-Encoding": ""} {
		if got := h.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if _, _, n := countSpans(decodeRequest(t, reqs[0].body)); n != len(spans) {
		t.Errorf("request holds %d spans, want %d", n, len(spans))
	}
}

func TestOTLPExporterGzip(t *testing.T) {
	recv := newCapture(t, nil)
	e := newTestExporter(t, recv.url(), map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"})
	spans := ourShapedSpans(t, 64)
	for range 2 { // the second export reuses the gzip writer
		if err := e.ExportSpans(context.Background(), spans); err != nil {
			t.Fatal(err)
		}
	}
	var enc spanEncoder
	plain := enc.encode(readOnlySpans(spans))
	for i, r := range recv.requests() {
		if r.header.Get("Content-Encoding") != "gzip" {
			t.Fatalf("request %d: Content-Encoding %q, want gzip", i, r.header.Get("Content-Encoding"))
		}
		if len(r.body) >= len(plain) || !bytes.Equal(r.plain, plain) {
			t.Errorf("request %d: %d bytes decompressing to %d, want fewer than %d decompressing to the plain encoding",
				i, len(r.body), len(r.plain), len(plain))
		}
	}
}

// recordSleeps makes e's retries instant and records the delays they asked for.
func recordSleeps(e *OTLPExporter) *[]time.Duration {
	var mu sync.Mutex
	waits := &[]time.Duration{}
	e.backoff = time.Millisecond
	e.sleep = func(ctx context.Context, d time.Duration) error {
		mu.Lock()
		*waits = append(*waits, d)
		mu.Unlock()
		return ctx.Err()
	}
	return waits
}

func TestOTLPExporterRetries(t *testing.T) {
	for _, tc := range []struct {
		name      string
		first     func(w http.ResponseWriter, r *http.Request)
		wantDelay time.Duration // at least
	}{
		{"503 with Retry-After", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusServiceUnavailable)
		}, 2 * time.Second},
		{"429 with an HTTP date", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", time.Now().Add(time.Hour).UTC().Format(http.TimeFormat))
			w.WriteHeader(http.StatusTooManyRequests)
		}, 59 * time.Minute},
		{"502", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusBadGateway) }, 0},
		{"504", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusGatewayTimeout) }, 0},
		{"connection dropped", func(w http.ResponseWriter, _ *http.Request) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recv := newCapture(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if n == 0 {
					tc.first(w, r)
				}
			})
			e := newTestExporter(t, recv.url(), map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "7200000"})
			waits := recordSleeps(e)
			if err := e.ExportSpans(context.Background(), ourShapedSpans(t, 8)); err != nil {
				t.Fatalf("export failed: %v", err)
			}
			reqs := recv.requests()
			if len(reqs) != 2 || !bytes.Equal(reqs[0].body, reqs[1].body) {
				t.Fatalf("%d requests, want 2 with the same body", len(reqs))
			}
			if len(*waits) != 1 || (*waits)[0] < tc.wantDelay || (tc.wantDelay == 0 && (*waits)[0] > 2*time.Millisecond) {
				t.Errorf("waited %v before retrying, want one wait of at least %v (backoff 1ms otherwise)", *waits, tc.wantDelay)
			}
		})
	}
}

func TestOTLPExporterBacksOffExponentially(t *testing.T) {
	recv := newCapture(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n < 5 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	e := newTestExporter(t, recv.url(), map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "7200000"})
	waits := recordSleeps(e)
	e.backoff = time.Second
	if err := e.ExportSpans(context.Background(), ourShapedSpans(t, 2)); err != nil {
		t.Fatal(err)
	}
	if len(*waits) != 5 {
		t.Fatalf("waits %v, want 5", *waits)
	}
	for i, w := range *waits {
		step := time.Second << i
		if w < step/2 || w >= step*3/2 {
			t.Errorf("wait %d = %v, want within [%v, %v)", i, w, step/2, step*3/2)
		}
	}
}

func TestOTLPExporterDoesNotRetryOtherStatuses(t *testing.T) {
	const token = "s3cr3t-t0ken"
	recv := newCapture(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		// A gateway that echoes the request headers in its error page.
		w.WriteHeader(http.StatusBadRequest)
		r.Header.Write(w) //nolint:errcheck
	})
	e := newTestExporter(t, recv.url(), map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20" + token + ",X-Api-Key=" + token + "2"})
	waits := recordSleeps(e)
	err := e.ExportSpans(context.Background(), ourShapedSpans(t, 2))
	if err == nil || !strings.Contains(err.Error(), "400 Bad Request") {
		t.Fatalf("error = %v, want one with the status 400 Bad Request", err)
	}
	if strings.Contains(err.Error(), token) {
		t.Errorf("the error quotes a header value: %v", err)
	}
	if !strings.Contains(err.Error(), "Content-Type") {
		t.Errorf("the error leaves out the response body, which helps: %v", err)
	}
	if n := len(recv.requests()); n != 1 || len(*waits) != 0 {
		t.Errorf("%d requests and waits %v, want 1 request and no retry", n, *waits)
	}
}

func TestOTLPExporterGivesUpAtTheTimeout(t *testing.T) {
	t.Run("backoff", func(t *testing.T) {
		recv := newCapture(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
		e := newTestExporter(t, recv.url(), map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "400"})
		e.backoff = 20 * time.Millisecond
		start := time.Now()
		err := e.ExportSpans(context.Background(), ourShapedSpans(t, 2))
		if el := time.Since(start); el > 2*time.Second {
			t.Errorf("gave up after %v, want about the 400ms timeout", el)
		}
		if err == nil || !strings.Contains(err.Error(), "503") {
			t.Errorf("error = %v, want one with the status 503", err)
		}
		if n := len(recv.requests()); n < 3 {
			t.Errorf("%d attempts in 400ms with a 20ms backoff, want several", n)
		}
	})
	t.Run("Retry-After beyond the timeout", func(t *testing.T) {
		recv := newCapture(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "60")
			w.WriteHeader(http.StatusTooManyRequests)
		})
		e := newTestExporter(t, recv.url(), map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "5000"})
		start := time.Now()
		err := e.ExportSpans(context.Background(), ourShapedSpans(t, 2))
		if el := time.Since(start); el > time.Second {
			t.Errorf("gave up after %v, want at once: the server asked for more than the timeout", el)
		}
		if err == nil || !strings.Contains(err.Error(), "429") || len(recv.requests()) != 1 {
			t.Errorf("error = %v after %d requests, want a 429 after 1", err, len(recv.requests()))
		}
	})
	t.Run("caller's context", func(t *testing.T) {
		recv := newCapture(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
		e := newTestExporter(t, recv.url(), nil)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		if err := e.ExportSpans(ctx, ourShapedSpans(t, 2)); err == nil {
			t.Error("export succeeded against a server that always answers 503")
		}
		if el := time.Since(start); el > 2*time.Second {
			t.Errorf("gave up after %v, want the caller's 300ms", el)
		}
	})
}

func TestOTLPExporterShutdown(t *testing.T) {
	t.Run("idempotent, then exports fail at once", func(t *testing.T) {
		recv := newCapture(t, nil)
		e := newTestExporter(t, recv.url(), nil)
		ctx := context.Background()
		for i := range 2 {
			if err := e.Shutdown(ctx); err != nil {
				t.Fatalf("Shutdown %d: %v", i+1, err)
			}
		}
		start := time.Now()
		err := e.ExportSpans(ctx, ourShapedSpans(t, 2))
		if !errors.Is(err, errExporterShutdown) || time.Since(start) > 100*time.Millisecond {
			t.Errorf("ExportSpans after Shutdown = %v after %v, want %v at once", err, time.Since(start), errExporterShutdown)
		}
		if n := len(recv.requests()); n != 0 {
			t.Errorf("%d requests reached the receiver after Shutdown", n)
		}
	})
	t.Run("cancels the export in flight", func(t *testing.T) {
		arrived := make(chan struct{})
		var once sync.Once
		recv := newCapture(t, func(_ int, _ http.ResponseWriter, r *http.Request) {
			once.Do(func() { close(arrived) })
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		})
		e := newTestExporter(t, recv.url(), nil)
		done := make(chan error, 1)
		go func() { done <- e.ExportSpans(context.Background(), ourShapedSpans(t, 2)) }()
		<-arrived
		if err := e.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err == nil {
				t.Error("the export in flight succeeded after Shutdown")
			}
		case <-time.After(2 * time.Second):
			t.Fatal("the export in flight still runs 2s after Shutdown")
		}
	})
}

func TestOTLPExporterTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := writeClientCert(t, dir)
	clientCert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	clientCAs := x509.NewCertPool()
	clientCAs.AddCert(clientCert.Leaf)
	var peers atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		peers.Add(int32(len(r.TLS.PeerCertificates)))
		io.Copy(io.Discard, r.Body) //nolint:errcheck
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clientCAs}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshakes meant to fail
	srv.StartTLS()
	defer srv.Close()
	caFile := filepath.Join(dir, "server-ca.pem")
	writeFile(t, caFile, certPEMOf(t, srv))

	env := map[string]string{"OTEL_EXPORTER_OTLP_CERTIFICATE": caFile,
		"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": certFile, "OTEL_EXPORTER_OTLP_CLIENT_KEY": keyFile}
	e := newTestExporter(t, srv.URL+"/v1/traces", env)
	if err := e.ExportSpans(context.Background(), ourShapedSpans(t, 2)); err != nil {
		t.Fatalf("export over mutual TLS: %v", err)
	}
	if peers.Load() != 1 {
		t.Errorf("the server saw %d client certificates, want 1", peers.Load())
	}

	// Without the CA, the server's certificate is not trusted; without a client certificate,
	// the server refuses the handshake.
	for name, env := range map[string]map[string]string{
		"no CA":                 {"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": certFile, "OTEL_EXPORTER_OTLP_CLIENT_KEY": keyFile},
		"no client certificate": {"OTEL_EXPORTER_OTLP_CERTIFICATE": caFile, "OTEL_EXPORTER_OTLP_TIMEOUT": "300"},
	} {
		e := newTestExporter(t, srv.URL+"/v1/traces", env)
		recordSleeps(e)
		if err := e.ExportSpans(context.Background(), ourShapedSpans(t, 2)); err == nil {
			t.Errorf("%s: export succeeded", name)
		}
	}
}

func TestOTLPExporterReportsPartialSuccess(t *testing.T) {
	resp, err := proto.Marshal(&coltracepb.ExportTraceServiceResponse{PartialSuccess: &coltracepb.ExportTracePartialSuccess{
		RejectedSpans: 3, ErrorMessage: "spans too old"}})
	if err != nil {
		t.Fatal(err)
	}
	recv := newCapture(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(resp) //nolint:errcheck
	})
	var handled []error
	prev := otel.GetErrorHandler()
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { handled = append(handled, err) }))
	defer otel.SetErrorHandler(prev)

	e := newTestExporter(t, recv.url(), nil)
	if err := e.ExportSpans(context.Background(), ourShapedSpans(t, 4)); err != nil {
		t.Fatalf("a partial success failed the export: %v", err)
	}
	if len(handled) != 1 || !strings.Contains(handled[0].Error(), "3 spans rejected: spans too old") {
		t.Errorf("errors handled: %v, want one reporting 3 spans rejected: spans too old", handled)
	}
}

// keepGlobals restores the global tracer provider and propagator, which SetupTracing sets,
// after the test.
func keepGlobals(t *testing.T) {
	prevTP, prevProp := otel.GetTracerProvider(), otelPropagator()
	t.Cleanup(func() {
		if _, sdk := prevTP.(*sdktrace.TracerProvider); sdk {
			otel.SetTracerProvider(prevTP)
		} else { // the global delegate cannot be set again
			otel.SetTracerProvider(noop.NewTracerProvider())
		}
		setPropagator(prevProp)
	})
}

func TestSetupTracingExportsWithOTLPExporter(t *testing.T) {
	keepGlobals(t)
	recv := newCapture(t, nil)
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": recv.srv.URL, "OTEL_SERVICE_NAME": "setup-test"}
	shutdown, err := SetupTracing(context.Background(), "9.9.9", envOf(env))
	if err != nil {
		t.Fatal(err)
	}
	_, span := otel.Tracer("setup").Start(context.Background(), "op")
	span.End()
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	reqs := recv.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests reached %s, want 1", len(reqs), recv.srv.URL)
	}
	req := decodeRequest(t, reqs[0].body)
	if r, s, n := countSpans(req); r != 1 || s != 1 || n != 1 || req.ResourceSpans[0].ScopeSpans[0].Spans[0].Name != "op" {
		t.Errorf("request = %v, want the one span op", req)
	}
}

func TestSetupTracingRejectsBadOTLPConfig(t *testing.T) {
	keepGlobals(t)
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
	if _, err := SetupTracing(context.Background(), "test", envOf(env)); err == nil || !strings.Contains(err.Error(), "OTEL_EXPORTER_OTLP_PROTOCOL") {
		t.Errorf("SetupTracing error = %v, want one naming OTEL_EXPORTER_OTLP_PROTOCOL", err)
	}
}

// BenchmarkExport compares the official exporter and ours on one batch of 512 spans shaped
// like subscriberd's, posted to a receiver on loopback that discards them.
func BenchmarkExport(b *testing.B) {
	spans := ourShapedSpans(b, 512)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) //nolint:errcheck
	}))
	defer recv.Close()
	ctx := context.Background()
	run := func(b *testing.B, exp sdktrace.SpanExporter) {
		defer exp.Shutdown(ctx)
		b.ReportAllocs()
		for b.Loop() {
			if err := exp.ExportSpans(ctx, spans); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(spans)), "ns/span")
	}
	b.Run("official", func(b *testing.B) {
		exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(recv.URL+"/v1/traces"))
		if err != nil {
			b.Fatal(err)
		}
		run(b, exp)
	})
	b.Run("ours", func(b *testing.B) {
		run(b, newTestExporter(b, recv.URL+"/v1/traces", nil))
	})
	b.Run("ours-gzip", func(b *testing.B) {
		run(b, newTestExporter(b, recv.URL+"/v1/traces", map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}))
	})
}

// BenchmarkEncode is our encoder alone, without HTTP.
func BenchmarkEncode(b *testing.B) {
	spans := ourShapedSpans(b, 512)
	var enc spanEncoder
	b.ReportAllocs()
	for b.Loop() {
		enc.encode(readOnlySpans(spans))
		enc.release()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(spans)), "ns/span")
}

// writeClientCert writes a self-signed client certificate and its key, and returns the files.
func writeClientCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "subscriberd test client"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	writeFile(t, certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	writeFile(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	return certFile, keyFile
}

func certPEMOf(t *testing.T, srv *httptest.Server) []byte {
	t.Helper()
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
}

func writeFile(t *testing.T, name string, b []byte) {
	t.Helper()
	if err := os.WriteFile(name, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
