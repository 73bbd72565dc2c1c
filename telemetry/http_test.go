package telemetry

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

const (
	testToken = "Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4"
	testKey   = "sk_abcdefghijklmnopqrstuvwxyz0123456789"
	testEmail = "ann@example.com"
	testIP    = "203.0.113.7"
)

// serveTraced runs one request through NewHTTPHandler(next) and returns its ended spans.
func serveTraced(t *testing.T, sampler sdktrace.Sampler, next http.Handler, req *http.Request) []sdktrace.ReadOnlySpan {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr), sdktrace.WithSampler(sampler))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	h := NewHTTPHandler(next, "subscriberd.test:8080", tp)
	req.RemoteAddr = testIP + ":51234"
	h.ServeHTTP(httptest.NewRecorder(), req)
	return sr.Ended()
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// assertClean fails when any attribute of any span holds a secret, an email or the client IP.
func assertClean(t *testing.T, spans []sdktrace.ReadOnlySpan) {
	t.Helper()
	for _, s := range spans {
		for _, kv := range s.Attributes() {
			v := kv.Value.String()
			for _, bad := range []string{"@", "sk_", testToken, testIP} {
				if strings.Contains(v, bad) {
					t.Errorf("span %q attribute %s=%q contains %q", s.Name(), kv.Key, v, bad)
				}
			}
		}
	}
}

func testMux(t *testing.T) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v1/subscribers", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})
	mux.HandleFunc("GET /api/v1/subscribers/{id}", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "not found", http.StatusNotFound)
	})
	mux.HandleFunc("GET /confirm/{token}", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("<html>confirm</html>"))
	})
	mux.HandleFunc("POST /api/v1/boom", func(w http.ResponseWriter, r *http.Request) {
		// The application still sees the real peer and forwarded-for: lockouts depend on them.
		if r.RemoteAddr != testIP+":51234" || r.Header.Get("X-Forwarded-For") != "198.51.100.1" {
			t.Errorf("handler got RemoteAddr %q, X-Forwarded-For %q", r.RemoteAddr, r.Header.Get("X-Forwarded-For"))
		}
		http.Error(w, "boom", http.StatusServiceUnavailable)
	})
	return mux
}

func TestServerSpanShape(t *testing.T) {
	tests := []struct {
		name      string
		method    string
		target    string
		wantName  string
		wantRoute string
		wantCode  int64
		wantErr   bool
		wantPath  string
	}{
		{"create", "POST", "/api/v1/subscribers", "POST /api/v1/subscribers", "/api/v1/subscribers", 201, false, "/api/v1/subscribers"},
		{"404 is not an error", "GET", "/api/v1/subscribers/0190c6a4-7e3e-7cc2-a4f4-bd8d1c3c9a11", "GET /api/v1/subscribers/{id}", "/api/v1/subscribers/{id}", 404, false, "/api/v1/subscribers/0190c6a4-7e3e-7cc2-a4f4-bd8d1c3c9a11"},
		{"email in path is redacted", "GET", "/api/v1/subscribers/" + testEmail, "GET /api/v1/subscribers/{id}", "/api/v1/subscribers/{id}", 404, false, "/api/v1/subscribers/{redacted}"},
		{"token in path is redacted", "GET", "/confirm/" + testToken, "GET /confirm/{token}", "/confirm/{token}", 200, false, "/confirm/{token}"},
		{"5xx is an error", "POST", "/api/v1/boom", "POST /api/v1/boom", "/api/v1/boom", 503, true, "/api/v1/boom"},
		{"unmatched", "GET", "/nowhere/" + testKey, "GET", "", 404, false, "/nowhere/{redacted}"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, tc.target, nil)
			req.Host = "evil.example:6666" // a client-chosen Host must not reach server.address
			req.Header.Set("X-Forwarded-For", "198.51.100.1")
			req.Header.Set("User-Agent", "integration/1.0")
			spans := serveTraced(t, sdktrace.AlwaysSample(), testMux(t), req)
			if len(spans) != 1 {
				t.Fatalf("got %d spans, want 1", len(spans))
			}
			s := spans[0]
			a := attrs(s)
			if s.Name() != tc.wantName || s.SpanKind() != trace.SpanKindServer {
				t.Errorf("span %q kind %v, want %q server", s.Name(), s.SpanKind(), tc.wantName)
			}
			if got := a["http.route"].AsString(); got != tc.wantRoute {
				t.Errorf("http.route = %q, want %q", got, tc.wantRoute)
			}
			if got := a["http.response.status_code"].AsInt64(); got != tc.wantCode {
				t.Errorf("http.response.status_code = %d, want %d", got, tc.wantCode)
			}
			if got := a["server.address"].AsString(); got != "subscriberd.test" {
				t.Errorf("server.address = %q, want the fixed name", got)
			}
			if got := a["url.path"].AsString(); got != tc.wantPath {
				t.Errorf("url.path = %q, want %q", got, tc.wantPath)
			}
			// Eight at most without an error: a ninth makes the SDK's de-duplication at End
			// allocate a map, which is why network.protocol.version is left out.
			if n := len(s.Attributes()); n > 8 && !tc.wantErr {
				t.Errorf("%d attributes %v; want at most 8", n, s.Attributes())
			}
			for _, k := range []attribute.Key{"client.address", "network.peer.address"} {
				if v, ok := a[k]; ok {
					t.Errorf("%s = %q: raw IPs must not be recorded", k, v.String())
				}
			}
			errType, hasErrType := a["error.type"]
			if tc.wantErr {
				if s.Status().Code != codes.Error || errType.AsString() != "503" {
					t.Errorf("5xx: status %v, error.type %q; want Error and \"503\"", s.Status().Code, errType.AsString())
				}
			} else if s.Status().Code != codes.Unset || hasErrType {
				t.Errorf("status %v, error.type %q; want Unset and none", s.Status().Code, errType.AsString())
			}
			assertClean(t, spans)
		})
	}
}

type copyKey struct{}

// A route the application tells the response writer (as the API's router does) names the
// span and becomes http.route, even when the request reaches the mux as a copy, so the
// pattern is not visible to the wrappers; the token is cut from url.path by its route
// parameter.
func TestRouteSetByApplication(t *testing.T) {
	mux := testMux(t)
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = r.WithContext(context.WithValue(r.Context(), copyKey{}, 1))
		w.(RouteSetter).SetRoute("/confirm/{token}")
		mux.ServeHTTP(w, r)
	})
	spans := serveTraced(t, sdktrace.AlwaysSample(), next, httptest.NewRequest("GET", "/confirm/"+testToken, nil))
	if len(spans) != 1 {
		t.Fatalf("got %d spans", len(spans))
	}
	if spans[0].Name() != "GET /confirm/{token}" || attrs(spans[0])["http.route"].AsString() != "/confirm/{token}" {
		t.Errorf("span %q route %q: the application's route was lost", spans[0].Name(), attrs(spans[0])["http.route"].AsString())
	}
	if got := attrs(spans[0])["url.path"].AsString(); got != "/confirm/{token}" {
		t.Errorf("url.path = %q", got)
	}
	assertClean(t, spans)
}

// A public endpoint starts its own trace: the caller's traceparent is linked, not continued,
// its sampled flag does not force sampling, and its tracestate is not kept.
func TestPublicEndpoint(t *testing.T) {
	state, err := trace.ParseTraceState("vendor=caller-chosen-text")
	if err != nil {
		t.Fatal(err)
	}
	remote := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 1},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 2},
		TraceFlags: trace.FlagsSampled,
		TraceState: state,
		Remote:     true,
	})
	newReq := func() *http.Request {
		req := httptest.NewRequest("POST", "/api/v1/subscribers", nil)
		propagation.TraceContext{}.Inject(trace.ContextWithRemoteSpanContext(context.Background(), remote),
			propagation.HeaderCarrier(req.Header))
		return req
	}
	// NewHTTPHandler uses the global propagator, which SetupTracing installs.
	prev := otelPropagator()
	setPropagator(propagation.TraceContext{})
	t.Cleanup(func() { setPropagator(prev) })

	spans := serveTraced(t, sdktrace.ParentBased(sdktrace.AlwaysSample()), testMux(t), newReq())
	if len(spans) != 1 {
		t.Fatalf("got %d spans", len(spans))
	}
	s := spans[0]
	if s.SpanContext().TraceID() == remote.TraceID() || s.Parent().IsValid() {
		t.Errorf("span continued the caller's trace (parent %v)", s.Parent())
	}
	if l := s.Links(); len(l) != 1 || !l[0].SpanContext.Equal(remote.WithTraceState(trace.TraceState{})) {
		t.Errorf("links = %v, want one to the caller's span, without its tracestate", l)
	}

	if spans := serveTraced(t, sdktrace.ParentBased(sdktrace.NeverSample()), testMux(t), newReq()); len(spans) != 0 {
		t.Errorf("a caller's sampled flag forced sampling: %d spans recorded", len(spans))
	}

	// Nor is a span that something outside the handler put in the request's context (a
	// propagating middleware, a server's base context).
	req := httptest.NewRequest("POST", "/api/v1/subscribers", nil)
	req = req.WithContext(trace.ContextWithRemoteSpanContext(req.Context(), remote))
	spans = serveTraced(t, sdktrace.ParentBased(sdktrace.AlwaysSample()), testMux(t), req)
	if len(spans) != 1 {
		t.Fatalf("with a span in the request's context: got %d spans", len(spans))
	}
	if s := spans[0]; s.SpanContext().TraceID() == remote.TraceID() || s.Parent().IsValid() {
		t.Errorf("span continued the trace in the request's context (parent %v)", s.Parent())
	}
	if spans := serveTraced(t, sdktrace.ParentBased(sdktrace.NeverSample()), testMux(t),
		req.WithContext(trace.ContextWithRemoteSpanContext(context.Background(), remote))); len(spans) != 0 {
		t.Errorf("the sampled flag of a span in the request's context forced sampling: %d spans recorded", len(spans))
	}
}

// A sampled-out request still reaches the application with its real peer address and headers.
func TestUnsampledRequestKeepsPeer(t *testing.T) {
	req := httptest.NewRequest("POST", "/api/v1/boom", nil)
	req.Header.Set("X-Forwarded-For", "198.51.100.1")
	called := false
	mux := testMux(t)
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		called = true
		mux.ServeHTTP(w, r)
	})
	if spans := serveTraced(t, sdktrace.NeverSample(), next, req); len(spans) != 0 || !called {
		t.Errorf("%d spans recorded, handler called %v; want 0 and true", len(spans), called)
	}
}

func TestRedactPath(t *testing.T) {
	long := strings.Repeat("a", 37)
	for _, c := range []struct{ path, route, want string }{
		{"/api/v1/subscribers/0190a3c4-0000-7000-8000-000000000001", "/api/v1/subscribers/{id}", "/api/v1/subscribers/0190a3c4-0000-7000-8000-000000000001"},
		{"/confirm/" + long, "/confirm/{token}", "/confirm/{token}"},
		{"/confirm/abc", "/confirm/{token}", "/confirm/{token}"},
		{"/confirm/abc/extra", "/confirm/{token}", "/confirm/abc/extra"},
		{"/api/v1/subscribers/ann@example.com", "/api/v1/subscribers/{id}", "/api/v1/subscribers/{redacted}"},
		{"/x/ann%40example.com/y/sk_live_1/" + long + "/", "", "/x/{redacted}/y/{redacted}/{redacted}/"},
		{"/", "", "/"},
		{"", "", ""},
	} {
		if got := redactPath(c.path, c.route); got != c.want {
			t.Errorf("redactPath(%q, %q) = %q, want %q", c.path, c.route, got, c.want)
		}
	}
	clean := "/api/v1/subscribers/0190a3c4-0000-7000-8000-000000000001"
	if n := testing.AllocsPerRun(100, func() { redactPath(clean, "/api/v1/subscribers/{id}") }); n != 0 {
		t.Errorf("a clean path cost %v allocations, want none", n)
	}
}

// An invented method is _OTHER in the span's method attribute (with the original beside it)
// and in the request histogram's label, so a client cannot mint series.
func TestUnknownMethodIsOther(t *testing.T) {
	req := httptest.NewRequest("BREW", "/api/v1/subscribers", nil)
	spans := serveTraced(t, sdktrace.AlwaysSample(), testMux(t), req)
	if len(spans) != 1 {
		t.Fatalf("got %d spans", len(spans))
	}
	a := attrs(spans[0])
	if a["http.request.method"].AsString() != MethodOther || a["http.request.method_original"].AsString() != "BREW" || spans[0].Name() != "HTTP" {
		t.Errorf("span %q: method %q, original %q", spans[0].Name(), a["http.request.method"].AsString(), a["http.request.method_original"].AsString())
	}

	m := NewMetrics("test")
	m.ObserveRequest(context.Background(), "BREW", "unmatched", 405, time.Millisecond)
	m.ObserveRequest(context.Background(), "GET", "unmatched", 404, time.Millisecond)
	om := scrapeText(t, m, "")
	if strings.Contains(om, "BREW") || !strings.Contains(om, `method="_OTHER"`) || !strings.Contains(om, `method="GET"`) {
		t.Errorf("request histogram labels:\n%s", om)
	}
}

// FuzzRedactPath: redactPath's shortcut for clean paths answers as the segment-by-segment
// redaction does.
func FuzzRedactPath(f *testing.F) {
	for _, c := range [][2]string{
		{"/api/v1/subscribers/0190a3c4-0000-7000-8000-000000000001", "/api/v1/subscribers/{id}"},
		{"/confirm/abc", "/confirm/{token}"}, {"/x/a%40b/sk_1/", ""}, {"/a/sk/sk_", "/a/{b}/{token...}"},
		{"/" + strings.Repeat("a", 36) + "/" + strings.Repeat("b", 37), ""}, {"%4", "{"}, {"", ""},
	} {
		f.Add(c[0], c[1])
	}
	f.Fuzz(func(t *testing.T, path, route string) {
		if got, want := redactPath(path, route), redactSegments(path, route); got != want {
			t.Fatalf("redactPath(%q, %q) = %q, want %q", path, route, got, want)
		}
	})
}
