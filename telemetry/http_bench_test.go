package telemetry

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// discardExporter drops spans: the benchmark measures making them, not sending them.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// BenchmarkHTTPHandler is the cost of the server span around a handler that does nothing but
// tell the route, as the API's router does, at 100 % sampling with a batching processor.
func BenchmarkHTTPHandler(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	b.Cleanup(func() { tp.Shutdown(context.Background()) })
	h := NewHTTPHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.(RouteSetter).SetRoute("/api/v1/subscribers/{id}")
		w.WriteHeader(http.StatusOK)
	}), "api.example.com:443", tp)
	req := httptest.NewRequest(http.MethodGet, "/api/v1/subscribers/0190a3c4-0000-7000-8000-000000000001", nil)
	req.Header.Set("User-Agent", "bench/1.0")
	w := httptest.NewRecorder()
	b.ReportAllocs()
	for b.Loop() {
		h.ServeHTTP(w, req)
	}
}
