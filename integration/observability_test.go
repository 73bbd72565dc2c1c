package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/internal/logbuf"
	"github.com/subscriberd/subscriberd/internal/smtptest"
	"github.com/subscriberd/subscriberd/internal/testdb"
	"github.com/subscriberd/subscriberd/limits"
	"github.com/subscriberd/subscriberd/mail"
	"github.com/subscriberd/subscriberd/repo"
	"github.com/subscriberd/subscriberd/telemetry"
)

// The service takes its tracer provider from the OpenTelemetry global, as cmd installs it. The
// tests install, once, a provider that forwards to whichever provider is current, so span tests
// can record and benchmarks can switch tracing off or on.
var (
	spans       = tracetest.NewSpanRecorder()
	recordingTP = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	currentTP   atomic.Pointer[trace.TracerProvider]
	installTP   sync.Once
)

// useTracerProvider makes tp the provider behind the global one.
func useTracerProvider(tp trace.TracerProvider) {
	installTP.Do(func() {
		otel.SetTracerProvider(switchTP{})
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	})
	currentTP.Store(&tp)
}

type switchTP struct{ embedded.TracerProvider }

func (switchTP) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return switchTracer{name: name, opts: opts}
}

type switchTracer struct {
	embedded.Tracer
	name string
	opts []trace.TracerOption
}

func (t switchTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	tp := trace.TracerProvider(noop.NewTracerProvider())
	if p := currentTP.Load(); p != nil {
		tp = *p
	}
	return tp.Tracer(t.name, t.opts...).Start(ctx, name, opts...)
}

// observed is an env whose server is wired like cmd/subscriberd serve wires it: the tracing
// handler outside, Prometheus metrics and the JSON logger inside.
type observed struct {
	*env
	metrics *telemetry.Metrics
	logs    *logbuf.Buffer
}

const testServerAddress = "subscriberd.test"

func newObserved(t *testing.T, opts ...func(*envOptions)) *observed {
	t.Helper()
	return newObservedLimited(t, nil, opts...)
}

// newObservedLimited is newObserved with the limiter of lim (nil: no limits).
func newObservedLimited(t *testing.T, lim *limits.Config, opts ...func(*envOptions)) *observed {
	t.Helper()
	useTracerProvider(recordingTP)
	e := newEnv(t, opts...)
	o := &observed{env: e, metrics: telemetry.NewMetrics("test"), logs: &logbuf.Buffer{}}
	log, err := telemetry.NewLogger(o.logs, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	var cfg envOptions
	for _, f := range opts {
		f(&cfg)
	}
	var limiter api.Limiter
	if lim != nil {
		limiter = limits.New(*lim, limits.NewMemory(nil, 0), limits.WithRecorder(o.metrics))
	}
	public := api.New(api.Config{
		Store:       repo.NewSubscribers(e.db),
		Auth:        e.accounts,
		Logger:      log,
		Metrics:     o.metrics,
		KeyCacheTTL: cfg.keyCacheTTL,
		Limiter:     limiter,
		Idempotency: api.IdempotencyOf(e.idem),
		Privacy:     repo.NewPrivacy(e.db),
	})
	public.HandleConfirmations(repo.NewConfirmations(e.db))
	srv := httptest.NewServer(telemetry.NewHTTPHandler(recordTraffic(public), testServerAddress, nil))
	t.Cleanup(srv.Close)
	e.srv, e.base = srv, srv.URL+api.BasePath
	return o
}

// traced sends a request tagged with a unique User-Agent and returns the response and every
// span of its trace.
func (o *observed) traced(method, path string, body any, headers ...string) (response, []sdktrace.ReadOnlySpan) {
	o.t.Helper()
	ua := fmt.Sprintf("obs-test/%d", uaCounter.Add(1))
	r := o.do(method, path, body, append(headers, "User-Agent: "+ua)...)
	var id trace.TraceID
	for _, s := range spans.Ended() {
		for _, kv := range s.Attributes() {
			if kv.Key == "user_agent.original" && kv.Value.AsString() == ua {
				id = s.SpanContext().TraceID()
			}
		}
	}
	if !id.IsValid() {
		o.t.Fatalf("%s %s: no server span recorded", method, path)
	}
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		if s.SpanContext().TraceID() == id {
			out = append(out, s)
		}
	}
	return r, out
}

var uaCounter atomic.Int64

func attrMap(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// serverSpan returns the trace's server span; it fails unless there is exactly one and every
// other span of the trace descends from it.
func serverSpan(t *testing.T, tr []sdktrace.ReadOnlySpan) sdktrace.ReadOnlySpan {
	t.Helper()
	var srv sdktrace.ReadOnlySpan
	for _, s := range tr {
		if s.SpanKind() == trace.SpanKindServer {
			if srv != nil {
				t.Fatalf("two server spans in one trace: %q and %q", srv.Name(), s.Name())
			}
			srv = s
		}
	}
	if srv == nil {
		t.Fatal("no server span")
	}
	ids := map[trace.SpanID]bool{srv.SpanContext().SpanID(): true}
	for changed := true; changed; {
		changed = false
		for _, s := range tr {
			if !ids[s.SpanContext().SpanID()] && ids[s.Parent().SpanID()] {
				ids[s.SpanContext().SpanID()], changed = true, true
			}
		}
	}
	for _, s := range tr {
		if !ids[s.SpanContext().SpanID()] {
			t.Errorf("span %q is not under the server span", s.Name())
		}
	}
	return srv
}

func spansNamed(tr []sdktrace.ReadOnlySpan, prefix string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tr {
		if strings.HasPrefix(s.Name(), prefix) {
			out = append(out, s)
		}
	}
	return out
}

// assertNoSecrets fails when any span attribute, event attribute or status text holds an email,
// an API key or the given secrets.
func assertNoSecrets(t *testing.T, tr []sdktrace.ReadOnlySpan, secrets ...string) {
	t.Helper()
	bad := append([]string{"@", "sk_"}, secrets...)
	check := func(span, where, v string) {
		if where == "db.query.text" { // PostgreSQL's containment operators are no address
			v = strings.NewReplacer("@>", "", "<@", "").Replace(v)
		}
		for _, b := range bad {
			if b != "" && strings.Contains(v, b) {
				t.Errorf("span %q %s = %q contains %q", span, where, v, b)
			}
		}
	}
	for _, s := range tr {
		for _, kv := range s.Attributes() {
			check(s.Name(), string(kv.Key), kv.Value.String())
		}
		for _, ev := range s.Events() {
			for _, kv := range ev.Attributes {
				check(s.Name(), "event "+ev.Name+" "+string(kv.Key), kv.Value.String())
			}
		}
		check(s.Name(), "status", s.Status().Description)
	}
}

func checkServerSpan(t *testing.T, s sdktrace.ReadOnlySpan, name, route string, code int64) {
	t.Helper()
	a := attrMap(s)
	if s.Name() != name || a["http.route"].AsString() != route || a["http.response.status_code"].AsInt64() != code {
		t.Errorf("server span %q route %q code %d, want %q %q %d",
			s.Name(), a["http.route"].AsString(), a["http.response.status_code"].AsInt64(), name, route, code)
	}
	if got := a["server.address"].AsString(); got != testServerAddress {
		t.Errorf("server.address = %q, want %q", got, testServerAddress)
	}
	if code >= 500 {
		if s.Status().Code != codes.Error || a["error.type"].AsString() != fmt.Sprint(code) {
			t.Errorf("%d: status %v, error.type %q; want Error and %q", code, s.Status().Code, a["error.type"].AsString(), fmt.Sprint(code))
		}
	} else if _, has := a["error.type"]; has || s.Status().Code == codes.Error {
		t.Errorf("%d is not a server error, but status %v error.type %q", code, s.Status().Code, a["error.type"].AsString())
	}
}

// checkAuthSpan checks the "auth" event of the server span: the outcome, and the key's id
// when the key was known.
func checkAuthSpan(t *testing.T, _ []sdktrace.ReadOnlySpan, srv sdktrace.ReadOnlySpan, outcome string, withKeyID bool) {
	t.Helper()
	var events []sdktrace.Event
	for _, ev := range srv.Events() {
		if ev.Name == "auth" {
			events = append(events, ev)
		}
	}
	if len(events) != 1 {
		t.Fatalf("%d auth events on the server span, want 1", len(events))
	}
	a := map[attribute.Key]attribute.Value{}
	for _, kv := range events[0].Attributes {
		a[kv.Key] = kv.Value
	}
	if got := a["app.auth.outcome"].AsString(); got != outcome {
		t.Errorf("auth outcome %q, want %q", got, outcome)
	}
	if _, has := a["app.api_key.id"]; has != withKeyID {
		t.Errorf("auth event has app.api_key.id: %v, want %v", has, withKeyID)
	}
}

// checkDBSpans checks the database spans: client spans named "{op} {table}" for the expected
// names, with the store's attributes and statements without bound values.
func checkDBSpans(t *testing.T, tr []sdktrace.ReadOnlySpan, want ...string) {
	t.Helper()
	system := map[string]string{testdb.Postgres: "postgresql", testdb.SQLite: "sqlite"}[testdb.Store()]
	for _, name := range want {
		got := spansNamed(tr, name)
		if len(got) == 0 {
			var names []string
			for _, s := range tr {
				names = append(names, s.Name())
			}
			t.Errorf("no %q span; the trace has %q", name, names)
			continue
		}
		for _, s := range got {
			a := attrMap(s)
			text := a["db.query.text"].AsString()
			if s.SpanKind() != trace.SpanKindClient || a["db.system.name"].AsString() != system || text == "" {
				t.Errorf("span %q: kind %v, db.system.name %q, statement %q", s.Name(), s.SpanKind(), a["db.system.name"].AsString(), text)
			}
			// server.port only when it is not 5432 (repo's TestQueryHookServerAttributes).
			port, hasPort := a["server.port"]
			if system == "postgresql" && (a["server.address"].AsString() == "" || (hasPort && port.AsInt64() <= 0) || a["db.user"].Type() != attribute.EMPTY) {
				t.Errorf("span %q: server.address %q, server.port %d, db.user %v: want the server's address and no old-convention attributes",
					s.Name(), a["server.address"].AsString(), port.AsInt64(), a["db.user"])
			}
			// Every literal is redacted: no quoted value is left in the text.
			if strings.Contains(text, "'") {
				t.Errorf("span %q: db.query.text holds a literal: %s", s.Name(), text)
			}
			if op, table, _ := strings.Cut(name, " "); a["db.operation.name"].AsString() != op || a["db.collection.name"].AsString() != table {
				t.Errorf("span %q: db.operation.name %q, db.collection.name %q", s.Name(), a["db.operation.name"].AsString(), a["db.collection.name"].AsString())
			}
		}
	}
}

func TestTraceCreate(t *testing.T) {
	o := newObserved(t)
	r, tr := o.traced("POST", "/subscribers", map[string]any{"email": "ann@example.com", "name": "Ann Example"})
	r.want(t, http.StatusCreated, "")
	srv := serverSpan(t, tr)
	checkServerSpan(t, srv, "POST /api/v1/subscribers", "/api/v1/subscribers", 201)
	checkAuthSpan(t, tr, srv, "ok", true)
	checkDBSpans(t, tr, "INSERT subscribers")
	assertNoSecrets(t, tr, o.key, "Ann Example")

	// The request's duration carries the trace id as its exemplar.
	om := scrapeOpenMetrics(t, o.metrics)
	id := srv.SpanContext().TraceID().String()
	if !strings.Contains(om, `route="/api/v1/subscribers"`) || !strings.Contains(om, `trace_id="`+id+`"`) {
		t.Errorf("no exemplar with trace_id %s on the request histogram", id)
	}
}

// A HEAD request is served by the GET operation, whose mux pattern names GET: the span is
// still named for the method the client sent.
func TestTraceHeadNamedForItsMethod(t *testing.T) {
	o := newObserved(t)
	for _, method := range []string{"GET", "HEAD"} {
		r, tr := o.traced(method, "/subscribers", nil)
		if r.status != http.StatusOK {
			t.Fatalf("%s: status %d", method, r.status)
		}
		checkServerSpan(t, serverSpan(t, tr), method+" /api/v1/subscribers", "/api/v1/subscribers", 200)
	}
}

func TestTraceBulkCreate(t *testing.T) {
	o := newObserved(t)
	items := []any{
		map[string]any{"email": "b1@example.com"},
		map[string]any{"email": "b2@example.com", "status": "pending"},
		map[string]any{"email": "b3@example.com"},
	}
	r, tr := o.traced("POST", "/subscribers/bulk", items)
	r.want(t, http.StatusCreated, "")
	srv := serverSpan(t, tr)
	checkServerSpan(t, srv, "POST /api/v1/subscribers/bulk", "/api/v1/subscribers/bulk", 201)
	checkAuthSpan(t, tr, srv, "ok", true)
	checkDBSpans(t, tr, "INSERT subscribers", "BEGIN", "COMMIT")
	assertNoSecrets(t, tr, o.key)
	if got := counterSum(t, o.metrics, "subscribers_created_total", "operation", "bulk"); got != 3 {
		t.Errorf("subscribers_created_total{operation=bulk} = %v, want 3", got)
	}
}

func TestTraceValidationError(t *testing.T) {
	o := newObserved(t)
	r, tr := o.traced("POST", "/subscribers", map[string]any{"email": "not-an-address@", "status": "sleeping"})
	r.want(t, http.StatusUnprocessableEntity, "validation_error")
	srv := serverSpan(t, tr)
	checkServerSpan(t, srv, "POST /api/v1/subscribers", "/api/v1/subscribers", 422)
	checkAuthSpan(t, tr, srv, "ok", true)
	if db := spansNamed(tr, "INSERT"); len(db) != 0 {
		t.Errorf("a refused body reached the database: %d INSERT spans", len(db))
	}
	assertNoSecrets(t, tr, o.key)
}

func TestTraceUnauthorized(t *testing.T) {
	o := newObserved(t, func(o *envOptions) { o.keyCacheTTL = -1 })
	unknown := "sk_" + strings.Repeat("Q", 40)
	for _, tc := range []struct {
		name, header, reason string
	}{
		{"unknown key", "Authorization: Bearer " + unknown, "invalid"},
		{"other scheme", "Authorization: Basic " + o.key, "missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, tr := o.traced("GET", "/subscribers", nil, tc.header)
			r.want(t, http.StatusUnauthorized, "unauthorized")
			srv := serverSpan(t, tr)
			checkServerSpan(t, srv, "GET /api/v1/subscribers", "/api/v1/subscribers", 401)
			checkAuthSpan(t, tr, srv, tc.reason, false)
			assertNoSecrets(t, tr, o.key, unknown)
			if got := counterSum(t, o.metrics, "auth_failures_total", "reason", tc.reason); got != 1 {
				t.Errorf("auth_failures_total{reason=%q} = %v, want 1", tc.reason, got)
			}
		})
	}
}

func TestTraceDatabaseOutage(t *testing.T) {
	postgresOnly(t, noOutageOnSQLite)
	proxy, throughProxy := viaProxy(t)
	o := newObserved(t, throughProxy)
	o.do("GET", "/subscribers", nil).want(t, http.StatusOK, "") // the key is cached now

	proxy.cut()
	r, tr := o.traced("POST", "/subscribers", map[string]any{"email": "during@example.com"})
	r.want(t, http.StatusServiceUnavailable, "service_unavailable")
	srv := serverSpan(t, tr)
	checkServerSpan(t, srv, "POST /api/v1/subscribers", "/api/v1/subscribers", 503)
	failed := 0
	for _, s := range tr {
		if s.SpanKind() == trace.SpanKindClient && s.Status().Code == codes.Error {
			failed++
		}
	}
	if failed == 0 {
		t.Error("no database span records the failure")
	}
	assertNoSecrets(t, tr, o.key)
}

// After a full scenario, the logs carry trace ids on every request line and no key, token or
// email anywhere.
func TestLogsCarryTraceIDsAndNoSecrets(t *testing.T) {
	o := newObserved(t, func(o *envOptions) { o.keyCacheTTL = -1 })
	emails := []string{"log1@example.com", "log2@example.com", "log3@example.com"}
	created := o.do("POST", "/subscribers", map[string]any{"email": emails[0], "name": "Logged Person"}).want(t, http.StatusCreated, "")
	id, _ := created.data(t)["id"].(string)
	o.do("POST", "/subscribers/bulk", []any{map[string]any{"email": emails[1]}, map[string]any{"email": emails[2]}}).want(t, http.StatusCreated, "")
	o.do("POST", "/subscribers", map[string]any{"email": emails[0]}).want(t, http.StatusUnprocessableEntity, "email_already_subscribed")
	o.do("GET", "/subscribers/"+id, nil).want(t, http.StatusOK, "")
	o.do("PUT", "/subscribers/"+id, map[string]any{"email": "log4@example.com"}).want(t, http.StatusOK, "")
	o.do("GET", "/subscribers?status=active", nil).want(t, http.StatusOK, "")
	o.do("DELETE", "/subscribers/"+id, nil).want(t, http.StatusOK, "")
	o.do("POST", "/subscribers", map[string]any{"email": "bad@"}).want(t, http.StatusUnprocessableEntity, "")
	wrongKey := "sk_" + strings.Repeat("Z", 40)
	o.do("GET", "/subscribers", nil, "Authorization: Bearer "+wrongKey).want(t, http.StatusUnauthorized, "")
	o.do("GET", "/subscribers/"+emails[1], nil).want(t, http.StatusNotFound, "")
	o.do("GET", "/no/such/"+emails[2], nil).want(t, http.StatusNotFound, "")

	logs := o.logs.String()
	for _, secret := range append([]string{o.key, wrongKey, "sk_", "@", "Logged Person"}, emails...) {
		if strings.Contains(logs, secret) {
			t.Errorf("logs contain %q", secret)
		}
	}
	requests := 0
	for line := range strings.Lines(logs) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %v: %s", err, line)
		}
		if rec["msg"] != "request" {
			continue
		}
		requests++
		if tid, _ := rec["trace_id"].(string); len(tid) != 32 {
			t.Errorf("access line without trace_id: %s", line)
		}
		if sid, _ := rec["span_id"].(string); len(sid) != 16 {
			t.Errorf("access line without span_id: %s", line)
		}
	}
	if requests != 11 {
		t.Errorf("%d access lines, want one per request (11)", requests)
	}
}

// exemplarOn reports whether a line of the OpenMetrics scrape om that starts with series
// carries an exemplar with trace id id.
func exemplarOn(om, series, id string) bool {
	for line := range strings.Lines(om) {
		if strings.HasPrefix(line, series) && strings.Contains(line, `# {`) && strings.Contains(line, `trace_id="`+id+`"`) {
			return true
		}
	}
	return false
}

func scrapeOpenMetrics(t *testing.T, m *telemetry.Metrics) string {
	t.Helper()
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, req)
	body, _ := io.ReadAll(rec.Body)
	return string(body)
}

// counterSum is the sum of the counter family's series with label=value.
func counterSum(t *testing.T, m *telemetry.Metrics, family, label, value string) float64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != family {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

// An email send is its own trace (a CLIENT span "email.send") linked to the request that queued
// it; its attributes name the outbox row, never the recipient, even when the SMTP server's
// refusal quotes the address.
func TestTraceEmailSendLinksToRequest(t *testing.T) {
	o := newObserved(t)
	_, reqTrace := o.traced("POST", "/subscribers", map[string]any{"email": "pending@example.com", "status": "pending"})
	reqID := serverSpan(t, reqTrace).SpanContext().TraceID()
	_, rejTrace := o.traced("POST", "/subscribers", map[string]any{"email": "refused@example.com", "status": "pending"})
	rejID := serverSpan(t, rejTrace).SpanContext().TraceID()

	catcher := smtptest.Start(t)
	catcher.Refuse(func(to string, _ int) *smtp.SMTPError {
		if to == "refused@example.com" {
			return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "<" + to + ">: no such user"}
		}
		return nil
	})
	tr, err := mail.NewSMTP(catcher.URL(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	composer, err := mail.NewComposer(testFrom, "http://subscriberd.test")
	if err != nil {
		t.Fatal(err)
	}
	cfg := testWorkerConfig()
	cfg.Recorder = o.metrics
	w := mail.NewWorker(repo.NewOutbox(o.db), tr, composer, cfg)
	if _, err := w.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}

	sends := map[trace.TraceID]sdktrace.ReadOnlySpan{} // request trace → its send span
	for _, s := range spans.Ended() {
		if s.Name() != "email.send" {
			continue
		}
		for _, l := range s.Links() {
			if id := l.SpanContext.TraceID(); id == reqID || id == rejID {
				sends[id] = s
			}
		}
	}
	for id, want := range map[trace.TraceID]codes.Code{reqID: codes.Unset, rejID: codes.Error} {
		s, ok := sends[id]
		if !ok {
			t.Errorf("no email.send span links to request trace %s", id)
			continue
		}
		if s.SpanContext().TraceID() == id || s.Parent().IsValid() || s.SpanKind() != trace.SpanKindClient {
			t.Errorf("email.send: trace %s parent %v kind %v; want a new root CLIENT span linked to the request",
				s.SpanContext().TraceID(), s.Parent(), s.SpanKind())
		}
		if s.Status().Code != want {
			t.Errorf("email.send for trace %s: status %v, want %v", id, s.Status().Code, want)
		}
		assertNoSecrets(t, []sdktrace.ReadOnlySpan{s})
	}
	if got := counterSum(t, o.metrics, "email_sends_total", "outcome", "sent"); got != 1 {
		t.Errorf("email_sends_total{outcome=sent} = %v, want 1", got)
	}
	// The send's duration carries its trace as the exemplar the email latency panel links.
	if s, ok := sends[reqID]; ok {
		om := scrapeOpenMetrics(t, o.metrics)
		if id := s.SpanContext().TraceID().String(); !exemplarOn(om, `email_send_duration_seconds_bucket{outcome="sent"`, id) {
			t.Errorf("no exemplar with the send's trace_id %s on email_send_duration_seconds{outcome=\"sent\"}", id)
		}
	}

	// The link in the email: its token is in the path, never in the span.
	msgs := catcher.Messages()
	if len(msgs) != 1 || msgs[0].Token() == "" {
		t.Fatalf("got %d messages, want one with a link", len(msgs))
	}
	token := msgs[0].Token()
	r, pageTrace := o.traced("GET", o.srv.URL+"/confirm/"+token, nil)
	if r.status != http.StatusOK {
		t.Errorf("GET link = %d", r.status)
	}
	page := serverSpan(t, pageTrace)
	checkServerSpan(t, page, "GET /confirm/{token}", "/confirm/{token}", 200)
	if got := attrMap(page)["url.path"].AsString(); strings.Contains(got, token) || got == "" {
		t.Errorf("url.path = %q: the token must be cut", got)
	}
	assertNoSecrets(t, pageTrace, token)
}

// A 429 is not an error; the decision is a span under the server span with its scope and
// outcome, and the metrics count it. Neither carries the key or the client's address.
func TestTraceRateLimited(t *testing.T) {
	lim := limits.Config{Rate: []limits.Window{{Limit: 2, Period: time.Minute}}}
	o := newObservedLimited(t, &lim)
	for range 2 {
		o.do("GET", "/subscribers", nil).want(t, http.StatusOK, "")
	}
	r, tr := o.traced("GET", "/subscribers", nil)
	r.want(t, http.StatusTooManyRequests, "rate_limit_exceeded")
	srv := serverSpan(t, tr)
	checkServerSpan(t, srv, "GET /api/v1/subscribers", "/api/v1/subscribers", 429)
	decisions := spansNamed(tr, "limits.key")
	if len(decisions) != 1 {
		t.Fatalf("%d limits.key spans, want 1", len(decisions))
	}
	a := attrMap(decisions[0])
	if a["limits.scope"].AsString() != "key" || a["limits.decision"].AsString() != "limited" {
		t.Errorf("decision span: scope %q decision %q, want key/limited", a["limits.scope"].AsString(), a["limits.decision"].AsString())
	}
	assertNoSecrets(t, tr, o.key, "127.0.0.1")
	if got := counterSum(t, o.metrics, "rate_limit_decisions_total", "outcome", "limited"); got != 1 {
		t.Errorf("rate_limit_decisions_total{outcome=limited} = %v, want 1", got)
	}
}

// Repeated 401s lock the client out: the lockout is counted, and the locked request's decision
// span says so without the client's address.
func TestTraceClientLockout(t *testing.T) {
	lim := limits.Config{AuthLockout: limits.Lockout{Failures: 2, Window: time.Minute, Lock: time.Minute}}
	o := newObservedLimited(t, &lim)
	wrong := "Authorization: Bearer sk_" + strings.Repeat("W", 40)
	for range 2 {
		o.do("GET", "/subscribers", nil, wrong).want(t, http.StatusUnauthorized, "")
	}
	r, tr := o.traced("GET", "/subscribers", nil)
	r.want(t, http.StatusTooManyRequests, "rate_limit_exceeded")
	srv := serverSpan(t, tr)
	checkServerSpan(t, srv, "GET /api/v1/subscribers", "/api/v1/subscribers", 429)
	locked := spansNamed(tr, "limits.client_lockout")
	if len(locked) != 1 || attrMap(locked[0])["limits.decision"].AsString() != "locked" {
		t.Errorf("client lockout decision spans: %d, want 1 with decision locked", len(locked))
	}
	assertNoSecrets(t, tr, o.key, "127.0.0.1")
	if got := counterSum(t, o.metrics, "lockouts_total", "scope", "client"); got != 1 {
		t.Errorf("lockouts_total{scope=client} = %v, want 1", got)
	}
	if got := counterSum(t, o.metrics, "auth_failures_total", "reason", "invalid"); got != 2 {
		t.Errorf("auth_failures_total{reason=invalid} = %v, want 2", got)
	}
}
