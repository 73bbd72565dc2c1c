// Package telemetry sets up what makes subscriberd observable: the OpenTelemetry tracer
// provider, the Prometheus collectors and the structured logger. It imports no project package.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/contrib/propagators/autoprop"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// ServiceName is the default OpenTelemetry service name (OTEL_SERVICE_NAME overrides it).
const ServiceName = "subscriberd"

// SetupTracing installs the global tracer provider and propagators from the standard OTEL_*
// variables of the process environment, on the official components (docs/api-contract.md §7):
//   - OTEL_PROPAGATORS through autoprop (default tracecontext,baggage);
//   - OTEL_TRACES_EXPORTER (otlp, console, none) and OTEL_EXPORTER_OTLP_* (grpc or
//     http/protobuf) through autoexport, behind the SDK's batch processor (OTEL_BSP_*);
//   - OTEL_TRACES_SAMPLER and _ARG, checked here so that a bad value stops the start;
//   - the resource from OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES over the standard
//     detectors, with service.name subscriberd and service.version version by default;
//   - OTEL_SDK_DISABLED=true: no tracing at all.
//
// The one deviation from the specification: with neither OTEL_TRACES_EXPORTER nor an OTLP
// endpoint variable set, nothing is exported (the specification's default would send to
// localhost:4318). Spans are still made in process, so logs and exemplars get ids. The
// returned function flushes and stops the provider.
func SetupTracing(ctx context.Context, version string) (func(context.Context) error, error) {
	prop, err := propagatorFromEnv()
	if err != nil {
		return nil, err
	}
	otel.SetTextMapPropagator(prop)
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return func(context.Context) error { return nil }, nil
	}
	sampler, err := samplerFromEnv(os.Getenv)
	if err != nil {
		return nil, err
	}
	if err := checkExportEnv(os.Getenv); err != nil {
		return nil, err
	}
	res, err := newResource(ctx, version)
	if err != nil {
		return nil, err
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res), sdktrace.WithSampler(sampler)}
	if exporting(os.Getenv) {
		exp, err := autoexport.NewSpanExporter(ctx)
		if err != nil {
			return nil, fmt.Errorf("OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_PROTOCOL: %w", err)
		}
		if !autoexport.IsNoneSpanExporter(exp) {
			opts = append(opts, sdktrace.WithBatcher(exp))
		}
	}
	tp := sdktrace.NewTracerProvider(opts...)
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

// exporting tells whether spans are to be exported: OTEL_TRACES_EXPORTER or an OTLP endpoint
// is set (the deviation of docs/api-contract.md §7).
func exporting(getenv func(string) string) bool {
	for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		if strings.TrimSpace(getenv(k)) != "" {
			return true
		}
	}
	return false
}

// propagatorFromEnv is autoprop's propagator for OTEL_PROPAGATORS, with an unknown name an
// error at start rather than a warning and the default.
func propagatorFromEnv() (propagation.TextMapPropagator, error) {
	if v := strings.TrimSpace(os.Getenv("OTEL_PROPAGATORS")); v != "" {
		names := strings.Split(v, ",")
		for i := range names {
			names[i] = strings.TrimSpace(names[i])
		}
		p, err := autoprop.TextMapPropagator(names...)
		if err != nil {
			return nil, fmt.Errorf("OTEL_PROPAGATORS: %w", err)
		}
		return p, nil
	}
	return autoprop.NewTextMapPropagator(), nil
}

// newResource describes this process: service.name (default subscriberd) and service.version,
// the SDK, host, OS, container and Go runtime detectors, and last the environment, which wins.
// The process detectors that read the command line are left out: a flag can carry a secret.
func newResource(ctx context.Context, version string) (*resource.Resource, error) {
	res, err := resource.New(ctx,
		resource.WithSchemaURL(semconv.SchemaURL),
		resource.WithAttributes(semconv.ServiceName(ServiceName), semconv.ServiceVersion(version)),
		resource.WithTelemetrySDK(), resource.WithHost(), resource.WithOS(), resource.WithContainer(),
		resource.WithProcessRuntimeName(), resource.WithProcessRuntimeVersion(),
		resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	return res, nil // a detector that found nothing (no container) leaves a partial resource
}

// LogErrors sends the errors the OpenTelemetry SDK reports (a failed or dropped export, a bad
// propagation header) to log at warn level, and the SDK's own log lines to log too (its errors
// at error level; its warnings and info, which it logs at logr verbosity 1 and 4, at debug
// levels below), instead of the standard library's plain logger on stderr, so that every line
// is in LOG_FORMAT.
func LogErrors(log *slog.Logger) {
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("opentelemetry", "error", err)
	}))
	otel.SetLogger(logr.FromSlogHandler(log.With("component", "opentelemetry").Handler()))
}

// samplerFromEnv builds the sampler named by OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG,
// the SDK's own variables, so that a bad value stops the start with the variable named
// instead of falling back to the default with a warning. The default is
// parentbased_always_on. With NewHTTPHandler's public-endpoint behaviour every request starts
// a new root, so only the root sampler decides: a caller's sampled flag cannot force sampling.
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
// ("debug", "info", "warn", "error"), through the standard library's handlers. Records logged
// with a context that carries a span get trace_id and span_id; durations are written as
// time.Duration's String ("25.7s"), not integer nanoseconds. When w buffers (a LogBuffer),
// records at warn and above are flushed at once.
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
	return slog.New(th), nil
}

// durationStrings returns as with each duration, in groups too, as its String ("25.7s"):
// slog's handlers write integer nanoseconds. It is done here rather than with
// HandlerOptions.ReplaceAttr, which slog calls for every attribute of every record, the
// built-in ones included, and which made the access line about 1.7 times as costly.
func durationStrings(as []slog.Attr) []slog.Attr {
	if !slices.ContainsFunc(as, mayHoldDuration) {
		return as
	}
	out := make([]slog.Attr, len(as))
	for i, a := range as {
		out[i] = durationString(a)
	}
	return out
}

func mayHoldDuration(a slog.Attr) bool {
	switch a.Value.Kind() {
	case slog.KindDuration, slog.KindGroup, slog.KindLogValuer:
		return true
	}
	return false
}

func durationString(a slog.Attr) slog.Attr {
	if !mayHoldDuration(a) {
		return a
	}
	a.Value = a.Value.Resolve()
	switch a.Value.Kind() {
	case slog.KindDuration:
		a.Value = slog.StringValue(a.Value.Duration().String())
	case slog.KindGroup:
		a.Value = slog.GroupValue(durationStrings(a.Value.Group())...)
	}
	return a
}

// flusher is a buffered writer, such as LogBuffer.
type flusher interface{ Flush() error }

// traceHandler adds the trace and span ids of the record's context, and flushes a buffered
// writer after records at warn level and above.
type traceHandler struct {
	slog.Handler
	flusher flusher
}

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	var durations bool
	r.Attrs(func(a slog.Attr) bool {
		durations = mayHoldDuration(a)
		return !durations
	})
	if durations {
		nr := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
		r.Attrs(func(a slog.Attr) bool {
			nr.AddAttrs(durationString(a))
			return true
		})
		r = nr
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	err := h.Handler.Handle(ctx, r)
	if h.flusher != nil && r.Level >= slog.LevelWarn {
		if ferr := h.flusher.Flush(); err == nil {
			err = ferr
		}
	}
	return err
}

func (h traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return traceHandler{Handler: h.Handler.WithAttrs(durationStrings(as)), flusher: h.flusher}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{Handler: h.Handler.WithGroup(name), flusher: h.flusher}
}

// Discard is a logger that writes nothing, for tests and tools.
var Discard = slog.New(slog.NewTextHandler(io.Discard, nil))
