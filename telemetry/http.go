package telemetry

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// SensitivePathParams are the route parameters whose values are secrets (the confirmation
// token): they are replaced by their template, {name}, in the url.path span attribute.
var SensitivePathParams = []string{"token"}

// redactedSegment replaces a path segment that looks like personal data or a secret.
const redactedSegment = "{redacted}"

// NewHTTPHandler wraps next so that every request gets one SERVER span shaped for a public API:
//   - a new root trace per request, with the caller's traceparent only linked, so a caller
//     cannot force sampling or join our traces;
//   - named "METHOD /route" with http.route once the route is known: told by the
//     application after routing through the response writer's SetRoute (a RouteSetter the
//     application finds by unwrapping its writers), or else taken from the Go ServeMux
//     pattern when next is the mux itself; "METHOD" for unmatched requests;
//   - the caller's context read with the global propagator (OTEL_PROPAGATORS), for the link;
//   - server.address fixed to serverAddress (never the client's Host header; include the port,
//     as in "api.example.com:443", to fix server.port as well);
//   - status Error and error.type = the status code for 5xx; 4xx leave the status unset;
//   - no client or peer IP attributes, and url.path with the confirmation token, email-like
//     and key-like segments replaced.
//
// tp nil means the global tracer provider. It is written here rather than with otelhttp:
// otelhttp computed a dozen request attributes (peer and forwarded addresses among them, which
// then had to be hidden from it) and OTel metrics nobody exports, about a third of the
// per-request cost of tracing.
func NewHTTPHandler(next http.Handler, serverAddress string, tp trace.TracerProvider) http.Handler {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	tracer := tp.Tracer("github.com/subscriberd/subscriberd/telemetry")
	host, port := serverAddress, 0
	if h, p, err := net.SplitHostPort(serverAddress); err == nil {
		host = h
		port, _ = strconv.Atoi(p)
	}
	fixed := []attribute.KeyValue{semconv.ServerAddress(host)}
	if port > 0 {
		fixed = append(fixed, semconv.ServerPort(port))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		opts := serverStart
		// A public endpoint: the caller's span, if any, is linked, never continued.
		if len(r.Header) > 0 {
			if sc := trace.SpanContextFromContext(otel.GetTextMapPropagator().Extract(context.Background(), propagation.HeaderCarrier(r.Header))); sc.IsValid() {
				// Without the caller's tracestate: free text of up to 512 bytes we do not need.
				opts = append(opts[:len(opts):len(opts)], trace.WithLinks(trace.Link{SpanContext: sc.WithTraceState(trace.TraceState{})}))
			}
		}
		ctx := r.Context()
		if trace.SpanContextFromContext(ctx).IsValid() {
			// Something outside put a span in the request's context: start a new trace all
			// the same. Only then, as the option costs the SDK a context and a span wrapper.
			opts = append(opts[:len(opts):len(opts)], trace.WithNewRoot())
		}
		ctx, span := tracer.Start(ctx, spanMethod(r.Method), opts...)
		if !span.IsRecording() { // not sampled: nothing to describe
			defer span.End()
			next.ServeHTTP(w, r.WithContext(ctx))
			return
		}
		sw := &statusRecorder{ResponseWriter: w}
		r = r.WithContext(ctx)
		// The attributes are set once, at the end, in one call: they are all known by then
		// (the route, the status), the samplers this service offers do not read them, and
		// one call is one allocation in the SDK instead of a growing slice.
		defer func() {
			status := sw.status
			if status == 0 {
				status = http.StatusOK
			}
			route := patternRoute(r.Pattern)
			if route == "" {
				route = sw.route
			}
			if route != "" {
				span.SetName(spanMethod(r.Method) + " " + route)
			}
			buf := attrPool.Get().(*[]attribute.KeyValue)
			attrs := append((*buf)[:0], fixed...)
			method := knownMethod(r.Method)
			if method == MethodOther {
				attrs = append(attrs, semconv.HTTPRequestMethodOriginal(r.Method))
			}
			// Not network.protocol.version: only recommended, "1.1" on every request this
			// server answers, and a ninth attribute makes the SDK's de-duplication at End
			// allocate its map instead of using the inline group of eight.
			attrs = append(attrs, semconv.HTTPRequestMethodKey.String(method), semconv.URLScheme(scheme(r)),
				semconv.URLPath(redactPath(r.URL.Path, route)), semconv.HTTPResponseStatusCode(status))
			if ua := r.Header["User-Agent"]; len(ua) > 0 && ua[0] != "" { // r.UserAgent() without canonicalising the name
				attrs = append(attrs, semconv.UserAgentOriginal(ua[0]))
			}
			if route != "" {
				attrs = append(attrs, semconv.HTTPRoute(route))
			}
			if status >= 500 {
				span.SetStatus(codes.Error, "")
				attrs = append(attrs, semconv.ErrorTypeKey.String(strconv.Itoa(status)))
			}
			span.SetAttributes(attrs...) // copied: the slice can be reused
			clear(attrs)
			*buf = attrs[:0]
			attrPool.Put(buf)
			span.End()
		}()
		next.ServeHTTP(sw, r)
	})
}

// serverStart are the start options of every server span, made once rather than per request
// (the SDK only reads them). The span is a new root without trace.WithNewRoot: the request's
// context carries no span unless something outside this handler put one there, and then the
// option is added.
var serverStart = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}

// attrPool holds the attribute slices of ending server spans.
var attrPool = sync.Pool{New: func() any { s := make([]attribute.KeyValue, 0, 12); return &s }}

// RouteSetter is what NewHTTPHandler's response writer offers the application: SetRoute
// gives the route template that matched the request ("/confirm/{token}"), for the span's name,
// http.route and the redaction of url.path. An application whose router sees the request as a
// copy (so r.Pattern is not visible outside) finds it by unwrapping its response writers.
type RouteSetter interface{ SetRoute(route string) }

// statusRecorder remembers the status a handler answered with, and the route it was told.
type statusRecorder struct {
	http.ResponseWriter
	status int
	route  string
}

// SetRoute implements RouteSetter.
func (w *statusRecorder) SetRoute(route string) { w.route = route }

func (w *statusRecorder) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusRecorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (deadlines, flushing).
func (w *statusRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func scheme(r *http.Request) string {
	if r.TLS != nil {
		return "https"
	}
	return "http"
}

// MethodOther stands for any method outside the standard ones, in the method attribute and
// the method label, as the HTTP semantic conventions ask: a client's invented methods must
// not become new label values.
const MethodOther = "_OTHER"

// knownMethod is m when it is a standard method, else MethodOther.
func knownMethod(m string) string {
	if spanMethod(m) == "HTTP" {
		return MethodOther
	}
	return m
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
// It returns path itself, without allocating, when nothing needs redacting.
//
// Most paths have nothing to redact, and checking each segment (secretSegment) tells so at a
// fraction of the cost of rebuilding the path segment by segment.
func redactPath(path, route string) string {
	if !sensitiveRoute(route) && !anySecretSegment(path) {
		return path
	}
	return redactSegments(path, route)
}

// anySecretSegment reports whether a segment of path is one secretSegment redacts. An email
// cannot span segments, so the path is searched for one whole.
func anySecretSegment(path string) bool {
	if hasEmail(path) {
		return true
	}
	for more := true; more; {
		var seg string
		seg, path, more = strings.Cut(path, "/")
		if keyOrToken(seg) {
			return true
		}
	}
	return false
}

// secretSegment reports whether a path segment looks like personal data or a secret.
func secretSegment(seg string) bool { return keyOrToken(seg) || hasEmail(seg) }

// keyOrToken: a segment that starts like an API key ("sk_…") or is longer than a UUID (a
// confirmation token is 43 characters).
func keyOrToken(seg string) bool { return len(seg) > 36 || strings.HasPrefix(seg, "sk_") }

// hasEmail: text with an email's "@", escaped or not.
func hasEmail(s string) bool { return strings.IndexByte(s, '@') >= 0 || strings.Contains(s, "%40") }

// sensitiveRoute reports whether a segment of route is a SensitivePathParams parameter.
func sensitiveRoute(route string) bool {
	for {
		i := strings.IndexByte(route, '{')
		if i < 0 {
			return false
		}
		route = route[i:]
		seg := route
		if j := strings.IndexByte(route, '/'); j >= 0 {
			seg, route = route[:j], route[j:]
		} else {
			route = ""
		}
		if isSensitiveParam(seg) {
			return true
		}
	}
}

// redactSegments is redactPath segment by segment.
func redactSegments(path, route string) string {
	matchRoute := route != "" && strings.Count(path, "/") == strings.Count(route, "/")
	var out strings.Builder // written from the first segment that changes
	changed := false
	tmpl := route
	for start := 0; ; {
		end := strings.IndexByte(path[start:], '/')
		last := end < 0
		if last {
			end = len(path)
		} else {
			end += start
		}
		seg, repl, redact := path[start:end], "", false
		var t string
		if matchRoute {
			t, tmpl, _ = strings.Cut(tmpl, "/")
		}
		switch {
		case matchRoute && isSensitiveParam(t):
			repl, redact = t, true
		case secretSegment(seg):
			repl, redact = redactedSegment, true
		}
		if redact && !changed {
			changed = true
			out.Grow(len(path))
			out.WriteString(path[:start])
		}
		if changed {
			if redact {
				seg = repl
			}
			out.WriteString(seg)
			if !last {
				out.WriteByte('/')
			}
		}
		if last {
			break
		}
		start = end + 1
	}
	if !changed {
		return path
	}
	return out.String()
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
