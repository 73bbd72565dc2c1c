// Package otlptest is an in-process OTLP trace receiver for tests, a small stand-in for an
// OpenTelemetry collector: it serves OTLP/HTTP (protobuf, gzip or not) and OTLP/gRPC, decodes
// every export with the official protobuf types and keeps its spans.
package otlptest

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Span is one span received, flattened: attribute values are shown as strings.
type Span struct {
	Protocol string // "http/protobuf" or "grpc": how it arrived
	Name     string
	Kind     tracepb.Span_SpanKind
	TraceID  string
	SpanID   string
	Parent   string
	Attrs    map[string]string
	Resource map[string]string
	Links    []string // the linked spans' trace ids
	Events   []string // the events' names
}

// Receiver receives trace exports over OTLP/HTTP at HTTPURL (the value of
// OTEL_EXPORTER_OTLP_ENDPOINT) and over OTLP/gRPC at GRPCURL.
type Receiver struct {
	HTTPURL string
	GRPCURL string

	mu      sync.Mutex
	spans   []Span
	exports int
}

// Start serves both protocols on loopback until the test ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	r := &Receiver{}
	hs := httptest.NewServer(http.HandlerFunc(r.serveHTTP))
	t.Cleanup(hs.Close)
	r.HTTPURL = hs.URL
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(gs, grpcService{r: r})
	go gs.Serve(ln) //nolint:errcheck // ends with Stop
	t.Cleanup(gs.Stop)
	r.GRPCURL = "http://" + ln.Addr().String()
	return r
}

func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		http.NotFound(w, req)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var export coltracepb.ExportTraceServiceRequest
	if req.Header.Get("Content-Type") != "application/x-protobuf" || proto.Unmarshal(raw, &export) != nil {
		http.Error(w, "not an OTLP protobuf export", http.StatusBadRequest)
		return
	}
	r.add("http/protobuf", &export)
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out) //nolint:errcheck // the exporter reads it or not
}

type grpcService struct {
	coltracepb.UnimplementedTraceServiceServer
	r *Receiver
}

func (s grpcService) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	s.r.add("grpc", req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (r *Receiver) add(protocol string, export *coltracepb.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exports++
	for _, rs := range export.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{Protocol: protocol, Name: s.GetName(), Kind: s.GetKind(), TraceID: hex.EncodeToString(s.GetTraceId()),
					SpanID: hex.EncodeToString(s.GetSpanId()), Parent: hex.EncodeToString(s.GetParentSpanId()),
					Attrs: attrs(s.GetAttributes()), Resource: res}
				for _, l := range s.GetLinks() {
					sp.Links = append(sp.Links, hex.EncodeToString(l.GetTraceId()))
				}
				for _, e := range s.GetEvents() {
					sp.Events = append(sp.Events, e.GetName())
				}
				r.spans = append(r.spans, sp)
			}
		}
	}
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = value(kv.GetValue())
	}
	return m
}

func value(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_BoolValue:
		return strconv.FormatBool(x.BoolValue)
	case *commonpb.AnyValue_DoubleValue:
		return strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
	case *commonpb.AnyValue_BytesValue:
		return string(bytes.Clone(x.BytesValue))
	}
	return v.String()
}

// Spans are the spans received so far; Exports counts the exports.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

func (r *Receiver) Exports() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.exports
}

// WaitSpan waits up to timeout for a span named name and returns it, or fails the test.
func (r *Receiver) WaitSpan(t testing.TB, name string, timeout time.Duration) Span {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(20 * time.Millisecond) {
		for _, s := range r.Spans() {
			if s.Name == name {
				return s
			}
		}
		if time.Now().After(deadline) {
			var names []string
			for _, s := range r.Spans() {
				names = append(names, s.Name)
			}
			t.Fatalf("no span %q received in %v; received %q", name, timeout, names)
		}
	}
}
