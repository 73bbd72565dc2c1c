// Package telemetry sets up what makes subscriberd observable: the OpenTelemetry tracer
// provider, the Prometheus collectors and the structured logger. It imports no project package.
package telemetry

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// ServiceName is the default OpenTelemetry service name (OTEL_SERVICE_NAME overrides it).
const ServiceName = "subscriberd"

// SetupTracing installs the global tracer provider and W3C propagators, configured by the
// standard OTEL_* variables. Spans are always recorded in process (so logs and exemplars get
// ids); they are exported over OTLP only when an OTLP endpoint variable is set. The returned
// function flushes and stops the provider.
func SetupTracing(ctx context.Context, version string, getenv func(string) string) (func(context.Context) error, error) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return func(context.Context) error { return nil }, nil
	}
	res, err := resource.Merge(resource.Default(), resource.NewWithAttributes(semconv.SchemaURL,
		semconv.ServiceVersion(version)))
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}
	if getenv("OTEL_SERVICE_NAME") == "" && !strings.Contains(getenv("OTEL_RESOURCE_ATTRIBUTES"), "service.name=") {
		res, _ = resource.Merge(res, resource.NewSchemaless(semconv.ServiceName(ServiceName)))
	}
	sampler, err := samplerFromEnv(getenv)
	if err != nil {
		return nil, err
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res), sdktrace.WithSampler(sampler)}
	if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
		exp, err := NewOTLPExporter(getenv) // errors name their variable
		if err != nil {
			return nil, err
		}
		batch, err := BatchConfigFromEnv(getenv)
		if err != nil {
			return nil, err
		}
		opts = append(opts, sdktrace.WithSpanProcessor(NewBatchProcessor(exp, batch)))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

// LogErrors sends the errors the OpenTelemetry SDK reports (a failed or dropped export, a bad
// propagation header) to log at warn level, instead of the standard library's plain logger.
func LogErrors(log *slog.Logger) {
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("opentelemetry", "error", err)
	}))
}

// samplerFromEnv builds the sampler named by OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG
// (the SDK's own variables, read through getenv so configuration stays testable and is
// validated at start). The default is parentbased_always_on. With NewHTTPHandler's
// public-endpoint behaviour every request starts a new root, so only the root sampler decides:
// a caller's sampled flag cannot force sampling.
func samplerFromEnv(getenv func(string) string) (sdktrace.Sampler, error) {
	name := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER")))
	arg := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER_ARG"))
	ratio := 1.0
	if strings.HasSuffix(name, "traceidratio") && arg != "" {
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return nil, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG: %q is not a ratio between 0 and 1", arg)
		}
		ratio = r
	}
	switch name {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "parentbased_traceidratio":
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio)), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "traceidratio":
		return sdktrace.TraceIDRatioBased(ratio), nil
	}
	return nil, fmt.Errorf("OTEL_TRACES_SAMPLER: %q is not one of always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio", name)
}

// The logging defaults of docs/api-contract.md §7 (LOG_LEVEL, LOG_FORMAT).
const (
	DefaultLogLevel  = "info"
	DefaultLogFormat = "json"
)

// NewLogger returns a slog logger writing to w in format "json" or "text" at level
// ("debug", "info", "warn", "error"). Records logged with a context that carries a span get
// trace_id and span_id. When w buffers (a LogBuffer), records at warn and above are flushed
// at once.
func NewLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("LOG_LEVEL: %q is not one of debug, info, warn, error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler
	switch format {
	case "json":
		h = slog.NewJSONHandler(w, opts)
	case "text":
		h = slog.NewTextHandler(w, opts)
	default:
		return nil, fmt.Errorf("LOG_FORMAT: %q is not one of json, text", format)
	}
	th := traceHandler{Handler: h}
	th.flusher, _ = w.(flusher)
	if lb, ok := w.(*LogBuffer); ok && format == "json" {
		// A LogBuffer takes each Write whole under its own lock, so lines formatted here
		// cannot interleave with the JSON handler's.
		th.direct = lb
	}
	return slog.New(th), nil
}

// flusher is a buffered writer, such as LogBuffer.
type flusher interface{ Flush() error }

// traceHandler adds the trace and span ids of the record's context, and flushes a buffered
// writer after records at warn level and above.
type traceHandler struct {
	slog.Handler
	flusher flusher
	// direct, when set, is the LogBuffer the JSON handler writes to: the records
	// appendJSONRecord can format are written to it here, the same bytes for less work.
	direct *LogBuffer
}

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	sc := trace.SpanContextFromContext(ctx)
	if h.direct != nil {
		if ok, err := h.writeDirect(func(b []byte) ([]byte, bool) { return appendJSONRecord(b, r, sc) }); ok {
			return h.flushed(r, err)
		}
	}
	if sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.flushed(r, h.Handler.Handle(ctx, r))
}

// flushed flushes a buffered writer after a record at warn level or above; err is the
// record's write error.
func (h traceHandler) flushed(r slog.Record, err error) error {
	if h.flusher != nil && r.Level >= slog.LevelWarn {
		if ferr := h.flusher.Flush(); err == nil {
			err = ferr
		}
	}
	return err
}

// WithAttrs and WithGroup leave the records of the handlers they return to slog, which
// writes the attributes and groups given here.
func (h traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return traceHandler{Handler: h.Handler.WithAttrs(as), flusher: h.flusher}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{Handler: h.Handler.WithGroup(name), flusher: h.flusher}
}

// Discard is a logger that writes nothing, for tests and tools.
var Discard = slog.New(slog.NewTextHandler(io.Discard, nil))
