package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/subscriberd/subscriberd/internal/otlptest"
)

func otelPropagator() propagation.TextMapPropagator { return otel.GetTextMapPropagator() }
func setPropagator(p propagation.TextMapPropagator) { otel.SetTextMapPropagator(p) }

func TestLoggerAddsTraceIDs(t *testing.T) {
	var buf bytes.Buffer
	log, err := NewLogger(&buf, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("test").Start(context.Background(), "op")
	log.With("component", "test").InfoContext(ctx, "inside")
	span.End()
	log.InfoContext(context.Background(), "outside")
	log.DebugContext(ctx, "below level")

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2:\n%s", len(lines), buf.String())
	}
	var in, out map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &in); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &out); err != nil {
		t.Fatal(err)
	}
	sc := span.SpanContext()
	if in["trace_id"] != sc.TraceID().String() || in["span_id"] != sc.SpanID().String() || in["component"] != "test" {
		t.Errorf("line inside the span = %v, want trace_id %s span_id %s", in, sc.TraceID(), sc.SpanID())
	}
	if _, ok := out["trace_id"]; ok {
		t.Errorf("line outside any span has a trace_id: %v", out)
	}
}

func TestLoggerConfigErrors(t *testing.T) {
	for _, c := range []struct{ level, format, want string }{
		{"loud", "json", "LOG_LEVEL"},
		{"info", "xml", "LOG_FORMAT"},
	} {
		if _, err := NewLogger(&bytes.Buffer{}, c.level, c.format); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewLogger(%q, %q) error = %v, want one naming %s", c.level, c.format, err, c.want)
		}
	}
}

func TestSamplerFromEnv(t *testing.T) {
	tests := []struct {
		sampler, arg string
		want         string // Sampler.Description, or "error: VAR"
	}{
		{"", "", "ParentBased{root:AlwaysOnSampler,"},
		{"always_off", "", "AlwaysOffSampler"},
		{"parentbased_traceidratio", "0.25", "ParentBased{root:TraceIDRatioBased{0.25},"},
		{"traceidratio", "", "TraceIDRatioBased{1}"},
		{"traceidratio", "2", "error: OTEL_TRACES_SAMPLER_ARG"},
		{"jaeger_remote", "", "error: OTEL_TRACES_SAMPLER"},
	}
	for _, tc := range tests {
		env := map[string]string{"OTEL_TRACES_SAMPLER": tc.sampler, "OTEL_TRACES_SAMPLER_ARG": tc.arg}
		s, err := samplerFromEnv(func(k string) string { return env[k] })
		got := ""
		if err != nil {
			got = "error: " + strings.SplitN(err.Error(), ":", 2)[0]
		} else {
			got = s.Description()
		}
		if !strings.HasPrefix(got, tc.want) {
			t.Errorf("sampler %q arg %q: got %q, want %q…", tc.sampler, tc.arg, got, tc.want)
		}
	}
}

// A bad value of a variable stops the start, with the variable named.
func TestSetupTracingRejectsBadConfig(t *testing.T) {
	keepGlobals(t)
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER"},
		{map[string]string{"OTEL_PROPAGATORS": "tracecontext,smoke-signals"}, "OTEL_PROPAGATORS"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "carrier-pigeon"}, "OTEL_TRACES_EXPORTER"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/xml"}, "OTEL_EXPORTER_OTLP_PROTOCOL"},
		// What the SDK would ignore with a line on stderr, or silently, and then use its default.
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "::not a url"}, `OTEL_EXPORTER_OTLP_ENDPOINT: "::not a url" is not an http:// or https:// URL`},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "127.0.0.1:4317"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_TIMEOUT": "abc"}, `OTEL_EXPORTER_OTLP_TIMEOUT: "abc" is not a whole number of at least 0`},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_HEADERS": "bad"}, "OTEL_EXPORTER_OTLP_HEADERS"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_HEADERS": "a=%zz"}, "OTEL_EXPORTER_OTLP_HEADERS"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent.pem"}, "OTEL_EXPORTER_OTLP_CERTIFICATE"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, `OTEL_EXPORTER_OTLP_COMPRESSION: "zstd" is not one of gzip, none`},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_COMPRESSION": "GZIP"}, "OTEL_EXPORTER_OTLP_COMPRESSION"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_CERTIFICATE": "otlpenv.go"}, `OTEL_EXPORTER_OTLP_CERTIFICATE: "otlpenv.go" holds no PEM data`},
		{map[string]string{"OTEL_BSP_SCHEDULE_DELAY": "abc"}, "OTEL_BSP_SCHEDULE_DELAY"},
		{map[string]string{"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "0"}, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"},
	} {
		for k, v := range c.env {
			t.Setenv(k, v)
		}
		if _, err := SetupTracing(context.Background(), "test"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one naming %s", c.env, err, c.want)
		}
		for k := range c.env {
			t.Setenv(k, "")
		}
	}
}

// The exporter's variables in their valid forms still start.
func TestSetupTracingAcceptsGoodExportConfig(t *testing.T) {
	keepGlobals(t)
	for k, v := range map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_TIMEOUT": "5000",
		"OTEL_EXPORTER_OTLP_HEADERS": "api-key=abc%20def,tenant=a", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
		"OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_BSP_SCHEDULE_DELAY": "1000", "OTEL_BSP_MAX_QUEUE_SIZE": "4096",
	} {
		t.Setenv(k, v)
	}
	shutdown, err := SetupTracing(context.Background(), "test")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	shutdown(ctx) //nolint:errcheck // nothing listens at the endpoint; nothing was exported
}

// The SDK's own log lines go to the service's logger, in its format (its warnings at a debug
// level: the SDK logs them at logr verbosity 1).
func TestLogErrorsTakesTheSDKsLogLines(t *testing.T) {
	keepGlobals(t)
	t.Cleanup(func() { otel.SetLogger(logr.Discard()) })
	var buf bytes.Buffer
	log, err := NewLogger(&buf, "debug", "json")
	if err != nil {
		t.Fatal(err)
	}
	LogErrors(log)
	sdktrace.NewSimpleSpanProcessor(tracetest.NewInMemoryExporter()).Shutdown(context.Background()) //nolint:errcheck // a test
	if got := buf.String(); !strings.Contains(got, `"msg":"SimpleSpanProcessor is not recommended`) ||
		!strings.Contains(got, `"component":"opentelemetry"`) {
		t.Errorf("log = %s, want the SDK's warning as a JSON line", got)
	}
}

// keepGlobals restores the global tracer provider and propagator SetupTracing replaces.
func keepGlobals(t *testing.T) {
	tp, prop := otel.GetTracerProvider(), otelPropagator()
	t.Cleanup(func() {
		otel.SetTracerProvider(tp)
		setPropagator(prop)
	})
}

// Spans go to a real receiver over each OTLP protocol the variables choose, with the resource
// of the environment over the defaults; OTEL_TRACES_EXPORTER=none sends nothing, and so does
// no exporter with no endpoint, while spans keep their ids.
func TestSetupTracingExports(t *testing.T) {
	keepGlobals(t)
	rcv := otlptest.Start(t)
	for _, c := range []struct {
		name string
		env  map[string]string
		want map[string]string // resource attributes; nil = nothing received
	}{
		{"http/protobuf", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.HTTPURL, "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=test"},
			map[string]string{"service.name": ServiceName, "service.version": "v9", "deployment.environment.name": "test"}},
		{"grpc", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.GRPCURL, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_SERVICE_NAME": "mine"},
			map[string]string{"service.name": "mine", "service.version": "v9", "telemetry.sdk.language": "go"}},
		{"grpc by the traces variables", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": rcv.GRPCURL, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
			"OTEL_RESOURCE_ATTRIBUTES": "service.name=theirs"}, map[string]string{"service.name": "theirs"}},
		{"none", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.HTTPURL, "OTEL_TRACES_EXPORTER": "none"}, nil},
		{"no endpoint", map[string]string{}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
				"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_TRACES_EXPORTER", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"} {
				t.Setenv(k, c.env[k])
			}
			shutdown, err := SetupTracing(context.Background(), "v9")
			if err != nil {
				t.Fatal(err)
			}
			_, span := otel.Tracer("test").Start(context.Background(), "op "+c.name)
			if !span.SpanContext().IsValid() || !span.IsRecording() {
				t.Errorf("span %v not recorded", span.SpanContext())
			}
			span.End()
			if err := shutdown(context.Background()); err != nil { // flushes
				t.Fatal(err)
			}
			var got *otlptest.Span
			for _, s := range rcv.Spans() {
				if s.Name == "op "+c.name {
					got = &s
				}
			}
			switch {
			case c.want == nil && got != nil:
				t.Errorf("exported over %s, want nothing", got.Protocol)
			case c.want != nil && got == nil:
				t.Fatalf("nothing received")
			case c.want != nil:
				if want := strings.Split(c.name, " ")[0]; got.Protocol != want {
					t.Errorf("received over %s, want %s", got.Protocol, want)
				}
				for k, v := range c.want {
					if got.Resource[k] != v {
						t.Errorf("resource %s = %q, want %q (resource %v)", k, got.Resource[k], v, got.Resource)
					}
				}
			}
		})
	}
}

// OTEL_PROPAGATORS picks the propagators: with b3 among them, a caller's B3 header is read (and
// linked by the server span) and B3 is written.
func TestSetupTracingPropagators(t *testing.T) {
	keepGlobals(t)
	t.Setenv("OTEL_PROPAGATORS", "tracecontext,baggage,b3")
	if _, err := SetupTracing(context.Background(), "test"); err != nil {
		t.Fatal(err)
	}
	if f := otelPropagator().Fields(); !slices.Contains(f, "traceparent") || !slices.Contains(f, "baggage") || !slices.Contains(f, "b3") {
		t.Fatalf("propagator fields %v, want traceparent, baggage and b3", f)
	}
	req := httptest.NewRequest("GET", "/api/v1/subscribers", nil)
	req.Header.Set("b3", "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1")
	spans := serveTraced(t, sdktrace.AlwaysSample(), testMux(t), req)
	if len(spans) != 1 || len(spans[0].Links()) != 1 || spans[0].Links()[0].SpanContext.TraceID().String() != "80f198ee56343ba864fe8b2a57d3eff7" {
		t.Errorf("the caller's B3 span was not linked: %v", spans)
	}

	t.Setenv("OTEL_PROPAGATORS", "none")
	t.Setenv("OTEL_SDK_DISABLED", "true")
	if _, err := SetupTracing(context.Background(), "test"); err != nil {
		t.Fatal(err)
	}
	if f := otelPropagator().Fields(); len(f) != 0 {
		t.Errorf("OTEL_PROPAGATORS=none: fields %v", f)
	}
}

// Durations are written as time.Duration's String, in both formats.
func TestLoggerDurations(t *testing.T) {
	for _, format := range []string{"json", "text"} {
		var buf bytes.Buffer
		log, err := NewLogger(&buf, "info", format)
		if err != nil {
			t.Fatal(err)
		}
		log.With("timeout", 1500*time.Millisecond).Info("shutting down", "grace", 25700*time.Millisecond,
			slog.Group("retry", slog.Duration("delay", 2*time.Minute)), "n", 3)
		out := buf.String()
		for _, want := range []string{"25.7s", "2m0s", "1.5s"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: no %s in %s", format, want, out)
			}
		}
		if strings.Contains(out, "25700000000") || strings.Contains(out, "120000000000") || !strings.Contains(out, "3") {
			t.Errorf("%s: %s", format, out)
		}
	}
}
