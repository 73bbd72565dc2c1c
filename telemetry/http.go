package telemetry

import (
	"context"
	"net/http"
	"strconv"
	"strings"

	"github.com/felixge/httpsnoop"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// SensitivePathParams are the route parameters whose values are secrets (the confirmation
// token): they are replaced by their template, {name}, in the url.path span attribute.
var SensitivePathParams = []string{"token"}

// redactedSegment replaces a path segment that looks like personal data or a secret.
const redactedSegment = "{redacted}"

type requestInfoKey struct{}

// requestInfo carries what the outer half of NewHTTPHandler hid from otelhttp to the inner half.
type requestInfo struct {
	remoteAddr string
	header     http.Header
}

// NewHTTPHandler wraps next so that every request gets one SERVER span (otelhttp) shaped for a
// public API:
//   - a new root trace per request, with the caller's traceparent only linked
//     (otelhttp.WithPublicEndpointFn), so a caller cannot force sampling or join our traces;
//   - named "METHOD /route" with http.route once the route is known: set by the application
//     after routing (trace.SpanFromContext(ctx).SetName / SetAttributes(http.route), as a Huma
//     middleware can), or else taken from the Go ServeMux pattern when the mux received the
//     request unchanged; "METHOD" for unmatched requests;
//   - server.address fixed to serverAddress (never the client's Host header; include the port,
//     as in "api.example.com:443", to fix server.port as well);
//   - status Error and error.type = the status code for 5xx; 4xx leave the status unset;
//   - no client or peer IP attributes, and url.path with the confirmation token, email-like
//     and key-like segments replaced.
//
// tp nil means the global tracer provider. otelhttp's own metrics are switched off: the
// Prometheus request metrics come from Metrics.ObserveRequest.
func NewHTTPHandler(next http.Handler, serverAddress string, tp trace.TracerProvider) http.Handler {
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, _ := r.Context().Value(requestInfoKey{}).(*requestInfo)
		if info == nil { // cannot happen: outer always sets it
			next.ServeHTTP(w, r)
			return
		}
		// Give the application the real peer address and headers that were hidden from otelhttp.
		r.RemoteAddr, r.Header = info.remoteAddr, info.header
		span := trace.SpanFromContext(r.Context())
		if !span.IsRecording() { // sampled out: nothing below would be kept
			next.ServeHTTP(w, r)
			return
		}
		status := 0
		w = httpsnoop.Wrap(w, httpsnoop.Hooks{
			WriteHeader: func(f httpsnoop.WriteHeaderFunc) httpsnoop.WriteHeaderFunc {
				return func(code int) {
					if status == 0 && code >= 200 {
						status = code
					}
					f(code)
				}
			},
			Write: func(f httpsnoop.WriteFunc) httpsnoop.WriteFunc {
				return func(b []byte) (int, error) {
					if status == 0 {
						status = http.StatusOK
					}
					return f(b)
				}
			},
		})
		next.ServeHTTP(w, r)

		// The route is known here only when next is the ServeMux itself; otherwise the
		// application names the span, and url.path relies on the generic redaction (tokens are
		// longer than any identifier, so they are caught either way).
		route := patternRoute(r.Pattern)
		if route != "" {
			nameSpan(span, r.Method, route)
		}
		if p := redactPath(r.URL.Path, route); p != r.URL.Path {
			span.SetAttributes(semconv.URLPath(p))
		}
		if status >= 500 {
			span.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(status)))
		}
	})
	var opts = []otelhttp.Option{
		// WithPublicEndpoint() is gone from otelhttp v0.72; this is its replacement.
		otelhttp.WithPublicEndpointFn(func(*http.Request) bool { return true }),
		otelhttp.WithServerName(serverAddress),
		otelhttp.WithMeterProvider(metricnoop.NewMeterProvider()),
	}
	// A provider given here is asked for its tracer once; without one otelhttp asks the global
	// provider on every request. The installed global provider is the one to use.
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	// Only W3C trace context is read, for the link to the caller's span; baggage is never used.
	opts = append(opts, otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(propagation.TraceContext{}))
	traced := otelhttp.NewHandler(inner, "", opts...)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info := &requestInfo{remoteAddr: r.RemoteAddr, header: r.Header}
		r2 := r.WithContext(context.WithValue(r.Context(), requestInfoKey{}, info))
		// otelhttp would record the peer address and X-Forwarded-For as client.address and
		// network.peer.address; raw IPs are personal data and stay out of traces.
		r2.RemoteAddr = ""
		if _, ok := r.Header["X-Forwarded-For"]; ok {
			r2.Header = r.Header.Clone()
			r2.Header.Del("X-Forwarded-For")
		}
		traced.ServeHTTP(w, r2)
	})
}

func nameSpan(span trace.Span, method, route string) {
	span.SetName(spanMethod(method) + " " + route)
	span.SetAttributes(semconv.HTTPRoute(route))
}

// spanMethod is the method as it may appear in a span name: a standard one, else "HTTP".
func spanMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return m
	}
	return "HTTP"
}

// patternRoute is the path part of a ServeMux pattern ("POST /api/v1/subscribers" →
// "/api/v1/subscribers"), or "" for no pattern.
func patternRoute(pattern string) string {
	if i := strings.IndexByte(pattern, '/'); i >= 0 {
		return pattern[i:]
	}
	return ""
}

// redactPath returns path with secrets and personal data removed: segments bound to a
// SensitivePathParams parameter of route become "{name}"; any segment that contains "@",
// starts with "sk_" or is longer than a UUID (tokens are 43 characters) becomes "{redacted}".
// It returns path itself when nothing needed redacting.
func redactPath(path, route string) string {
	segs := strings.Split(path, "/")
	tmpl := strings.Split(route, "/")
	changed := false
	for i, s := range segs {
		if i < len(tmpl) && len(tmpl) == len(segs) && isSensitiveParam(tmpl[i]) {
			segs[i], changed = tmpl[i], true
			continue
		}
		if strings.Contains(s, "@") || strings.Contains(s, "%40") || strings.HasPrefix(s, "sk_") || len(s) > 36 {
			segs[i], changed = redactedSegment, true
		}
	}
	if !changed {
		return path
	}
	return strings.Join(segs, "/")
}

func isSensitiveParam(tmplSeg string) bool {
	name, ok := strings.CutPrefix(tmplSeg, "{")
	if !ok {
		return false
	}
	name = strings.TrimSuffix(strings.TrimSuffix(name, "}"), "...")
	for _, p := range SensitivePathParams {
		if name == p {
			return true
		}
	}
	return false
}
