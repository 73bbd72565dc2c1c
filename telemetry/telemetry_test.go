package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
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

func TestSetupTracingRejectsBadSampler(t *testing.T) {
	env := map[string]string{"OTEL_TRACES_SAMPLER": "sometimes"}
	if _, err := SetupTracing(context.Background(), "test", func(k string) string { return env[k] }); err == nil {
		t.Error("SetupTracing accepted OTEL_TRACES_SAMPLER=sometimes")
	}
}
