package telemetry

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

func TestCountersStartAtZeroWithFixedLabels(t *testing.T) {
	m := NewMetrics("test")
	for name, want := range map[string]int{
		"email_sends_total":             6,
		"rate_limit_decisions_total":    15,
		"suppressions_total":            5,
		"confirmation_page_posts_total": 10,
		"auth_failures_total":           4,
		"lockouts_total":                2,
	} {
		if got, err := testutil.GatherAndCount(m.Registry(), name); err != nil || got != want {
			t.Errorf("%s: got %d series (err %v), want %d", name, got, err, want)
		}
	}
	// Families that appear only when their source exists.
	for _, name := range []string{"rate_limit_redis_up", "email_outbox_depth", "go_sql_max_open_connections"} {
		if got, _ := testutil.GatherAndCount(m.Registry(), name); got != 0 {
			t.Errorf("%s: got %d series before registration, want 0", name, got)
		}
	}
}

func TestRecordingMethods(t *testing.T) {
	m := NewMetrics("test")
	m.EmailSend(context.Background(), EmailSent, 40*time.Millisecond)
	m.EmailSend(context.Background(), EmailRetry, 3*time.Second)
	m.EmailSend(context.Background(), "smtp said 550 for bob@example.com", time.Second) // unbounded value: becomes "other"
	m.Decision(ScopeKey, DecisionAllowed)
	m.Decision(ScopeBulk, DecisionLimited)
	m.Decision(ScopeClientLockout, DecisionLocked)
	m.AuthFailure(AuthInvalid)
	m.AuthFailure(AuthInvalid)
	m.AuthFailure(AuthPlanDisabled)
	m.Lockout(LockoutClient)
	m.BackendUp(true)
	m.BackendUp(false)
	m.SubscribersCreated("bulk", "pending", 3)
	m.SuppressionsCreated("declined", 2)
	m.SuppressionsCreated("bob@example.com", 1) // unbounded value: becomes "other"
	m.PagePost(PageConfirm, PageRefused)
	m.ScopeRefused("sk_AbCd")
	m.ScopeRefused("sk_AbCd")

	expected := `
# HELP api_key_scope_refusals_total Requests refused with 403 insufficient_scope (a write with a read-only key), by the key's display prefix.
# TYPE api_key_scope_refusals_total counter
api_key_scope_refusals_total{key_prefix="sk_AbCd"} 2
# HELP auth_failures_total Requests refused by authentication, by reason (missing, invalid, revoked, plan_disabled).
# TYPE auth_failures_total counter
auth_failures_total{reason="invalid"} 2
auth_failures_total{reason="missing"} 0
auth_failures_total{reason="plan_disabled"} 1
auth_failures_total{reason="revoked"} 0
# HELP email_sends_total Confirmation email send attempts, by outcome (sent, logged, retry, failed, cancelled, suppressed).
# TYPE email_sends_total counter
email_sends_total{outcome="cancelled"} 0
email_sends_total{outcome="failed"} 0
email_sends_total{outcome="logged"} 0
email_sends_total{outcome="other"} 1
email_sends_total{outcome="retry"} 1
email_sends_total{outcome="sent"} 1
email_sends_total{outcome="suppressed"} 0
# HELP lockouts_total Temporary lockouts imposed, by scope (client, key).
# TYPE lockouts_total counter
lockouts_total{scope="client"} 1
lockouts_total{scope="key"} 0
# HELP rate_limit_redis_up 1 if the last exchange with the Redis rate-limit store succeeded, else 0.
# TYPE rate_limit_redis_up gauge
rate_limit_redis_up 0
# HELP subscribers_created_total Subscribers created, by initial status and operation (create, bulk, upsert).
# TYPE subscribers_created_total counter
subscribers_created_total{operation="bulk",status="pending"} 3
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(expected), "api_key_scope_refusals_total",
		"auth_failures_total", "email_sends_total", "lockouts_total", "rate_limit_redis_up",
		"subscribers_created_total"); err != nil {
		t.Error(err)
	}
	for _, c := range []struct {
		c    prometheus.Collector
		want float64
	}{
		{m.consent.suppressions.WithLabelValues("declined"), 2},
		{m.consent.suppressions.WithLabelValues("other"), 1},
		{m.consent.suppressions.WithLabelValues("manual"), 0},
		{m.consent.pagePosts.WithLabelValues(PageConfirm, PageRefused), 1},
	} {
		if got := testutil.ToFloat64(c.c); got != c.want {
			t.Errorf("consent counter = %v, want %v", got, c.want)
		}
	}
	for _, c := range []struct {
		scope, outcome string
		want           float64
	}{
		{ScopeKey, DecisionAllowed, 1},
		{ScopeBulk, DecisionLimited, 1},
		{ScopeClientLockout, DecisionLocked, 1},
		{ScopeKeyLockout, DecisionLocked, 0},
	} {
		if got := testutil.ToFloat64(m.decisions.WithLabelValues(c.scope, c.outcome)); got != c.want {
			t.Errorf("rate_limit_decisions_total{scope=%q,outcome=%q} = %v, want %v", c.scope, c.outcome, got, c.want)
		}
	}
	if got := testutil.CollectAndCount(m.emailSendDuration); got != 3 {
		t.Errorf("email_send_duration_seconds: %d series, want one per outcome seen (3)", got)
	}
	scrape := scrapeText(t, m, "")
	for _, want := range []string{
		`email_send_duration_seconds_count{outcome="sent"} 1`,
		`email_send_duration_seconds_bucket{outcome="sent",le="0.05"} 1`,
		`email_send_duration_seconds_bucket{outcome="retry",le="2.5"} 0`,
		`email_send_duration_seconds_bucket{outcome="retry",le="5"} 1`,
		`email_send_duration_seconds_count{outcome="other"} 1`,
	} {
		if !strings.Contains(scrape, want+"\n") {
			t.Errorf("scrape lacks %q", want)
		}
	}
}

func TestOutboxGauges(t *testing.T) {
	m := NewMetrics("test")
	var fail error
	err := m.RegisterOutboxGauges(func(ctx context.Context) ([]QueueLane, error) {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("outbox stats called without a deadline")
		}
		return []QueueLane{{Lane: "interactive", Depth: 7, OldestDueAge: 90 * time.Second}, {Lane: "bulk", Depth: 100000, OldestDueAge: 600 * time.Second}}, fail
	})
	if err != nil {
		t.Fatal(err)
	}
	expected := `
# HELP email_outbox_depth Emails waiting in the outbox (due or scheduled for a retry), per lane (interactive, bulk).
# TYPE email_outbox_depth gauge
email_outbox_depth{lane="bulk"} 100000
email_outbox_depth{lane="interactive"} 7
# HELP email_outbox_oldest_due_age_seconds How long the oldest due email of the lane has been waiting; 0 when none is due.
# TYPE email_outbox_oldest_due_age_seconds gauge
email_outbox_oldest_due_age_seconds{lane="bulk"} 600
email_outbox_oldest_due_age_seconds{lane="interactive"} 90
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(expected),
		"email_outbox_depth", "email_outbox_oldest_due_age_seconds"); err != nil {
		t.Error(err)
	}

	fail = errors.New("database down")
	n, err := testutil.GatherAndCount(m.Registry(), "email_outbox_depth", "email_outbox_oldest_due_age_seconds")
	if err != nil || n != 0 {
		t.Errorf("with a failing query: %d outbox series (err %v), want 0 and a successful scrape", n, err)
	}
	if got := testutil.ToFloat64(m.outboxErrors); got != 1 {
		t.Errorf("email_outbox_collect_errors_total = %v, want 1", got)
	}
	if err := m.RegisterOutboxGauges(func(context.Context) ([]QueueLane, error) { return nil, nil }); err == nil {
		t.Error("second RegisterOutboxGauges: got nil error")
	}
}

func TestRegisterDB(t *testing.T) {
	m := NewMetrics("test")
	db := sql.OpenDB(nopConnector{})
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(12)
	if err := m.RegisterDB(db); err != nil {
		t.Fatal(err)
	}
	expected := `
# HELP go_sql_max_open_connections Maximum number of open connections to the database.
# TYPE go_sql_max_open_connections gauge
go_sql_max_open_connections{db_name="subscriberd"} 12
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(expected), "go_sql_max_open_connections"); err != nil {
		t.Error(err)
	}
	for _, name := range []string{"go_sql_in_use_connections", "go_sql_wait_count_total", "go_sql_wait_duration_seconds_total"} {
		if n, _ := testutil.GatherAndCount(m.Registry(), name); n != 1 {
			t.Errorf("%s: %d series, want 1", name, n)
		}
	}
	if err := m.RegisterDB(db); err == nil {
		t.Error("second RegisterDB: got nil error")
	}
}

const openMetrics = "application/openmetrics-text; version=1.0.0; charset=utf-8"

// scrapeText GETs the metrics handler over HTTP with the given Accept header.
func scrapeText(t *testing.T, m *Metrics, accept string) string {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: status %d, err %v", resp.StatusCode, err)
	}
	return string(body)
}

func TestExemplarCarriesTraceID(t *testing.T) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("test").Start(context.Background(), "POST /api/v1/subscribers")
	sc := span.SpanContext()
	span.End()

	m := NewMetrics("test")
	m.ObserveRequest(ctx, "POST", "/api/v1/subscribers", 201, 20*time.Millisecond)
	m.EmailSend(ctx, EmailSent, 300*time.Millisecond)
	m.ObserveRequest(context.Background(), "GET", "/api/v1/subscribers", 200, 20*time.Millisecond)

	om := scrapeText(t, m, openMetrics)
	for _, bucket := range []string{
		`http_server_request_duration_seconds_bucket{code="201",method="POST",route="/api/v1/subscribers",le="0.025"} 1 `,
		`email_send_duration_seconds_bucket{outcome="sent",le="0.5"} 1 `,
	} {
		if !hasExemplar(om, bucket, sc.TraceID().String(), sc.SpanID().String()) {
			t.Errorf("OpenMetrics scrape lacks the exemplar on %s", bucket)
		}
	}
	if strings.Contains(om, `code="200",method="GET",route="/api/v1/subscribers",le="0.025"} 1 #`) {
		t.Error("a request without a sampled span got an exemplar")
	}
	if plain := scrapeText(t, m, ""); strings.Contains(plain, "trace_id") {
		t.Error("the classic text format carries exemplars; Prometheus would reject it")
	}
}

// hasExemplar reports whether scrape has the line starting with series followed by an exemplar
// with exactly these ids (client_golang writes exemplar labels in map order).
func hasExemplar(scrape, series, traceID, spanID string) bool {
	for line := range strings.Lines(scrape) {
		rest, ok := strings.CutPrefix(line, series)
		if !ok {
			continue
		}
		labels, ok := strings.CutPrefix(rest, "# {")
		labels, _, _ = strings.Cut(labels, "}")
		want := []string{`trace_id="` + traceID + `"`, `span_id="` + spanID + `"`}
		got := strings.Split(labels, ",")
		slices.Sort(want)
		slices.Sort(got)
		return ok && slices.Equal(got, want)
	}
	return false
}

// TestExemplarThinning: within ExemplarInterval a bucket keeps its exemplar; a request in
// another bucket of the same series still gets one.
func TestExemplarThinning(t *testing.T) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	spanCtx := func() (context.Context, trace.SpanContext) {
		ctx, span := tp.Tracer("test").Start(context.Background(), "GET /x")
		span.End()
		return ctx, span.SpanContext()
	}
	m := NewMetrics("test")
	ctxA, a := spanCtx()
	ctxB, b := spanCtx()
	ctxC, c := spanCtx()
	m.ObserveRequest(ctxA, "GET", "/x", 200, 3*time.Millisecond)
	m.ObserveRequest(ctxB, "GET", "/x", 200, 4*time.Millisecond) // same bucket (le 0.005), same second
	m.ObserveRequest(ctxC, "GET", "/x", 200, 300*time.Millisecond)

	om := scrapeText(t, m, openMetrics)
	fast := `http_server_request_duration_seconds_bucket{code="200",method="GET",route="/x",le="0.005"} 2 `
	slow := `http_server_request_duration_seconds_bucket{code="200",method="GET",route="/x",le="0.5"} 3 `
	if !hasExemplar(om, fast, a.TraceID().String(), a.SpanID().String()) || hasExemplar(om, fast, b.TraceID().String(), b.SpanID().String()) {
		t.Errorf("le=0.005 should keep the first request's exemplar:\n%s", om)
	}
	if !hasExemplar(om, slow, c.TraceID().String(), c.SpanID().String()) {
		t.Errorf("le=0.5 lacks the slow request's exemplar:\n%s", om)
	}
}

func TestUnsampledSpanGivesNoExemplar(t *testing.T) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	ctx, span := tp.Tracer("test").Start(context.Background(), "x")
	span.End()
	m := NewMetrics("test")
	m.ObserveRequest(ctx, "GET", "/x", 200, time.Millisecond)
	if om := scrapeText(t, m, openMetrics); strings.Contains(om, "trace_id") {
		t.Error("an unsampled span became an exemplar: it would point at a trace that was never exported")
	}
}

func BenchmarkObserveRequest(b *testing.B) {
	m := NewMetrics("bench")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
	for name, ctx := range map[string]context.Context{"sampled": trace.ContextWithSpanContext(context.Background(), sc), "unsampled": context.Background()} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m.ObserveRequest(ctx, "GET", "/api/v1/subscribers/{id}", 200, 3*time.Millisecond)
			}
		})
	}
}

func TestIdempotencyOutcome(t *testing.T) {
	m := NewMetrics("test")
	m.IdempotencyOutcome(IdempotencyReplayed)
	m.IdempotencyOutcome(IdempotencyReplayed)
	m.IdempotencyOutcome(IdempotencyInUse)
	m.IdempotencyOutcome("bogus")
	for outcome, want := range map[string]float64{IdempotencyReplayed: 2, IdempotencyInUse: 1, IdempotencyReused: 0, labelOther: 1} {
		if got := testutil.ToFloat64(m.idempotency.WithLabelValues(outcome)); got != want {
			t.Errorf("idempotency_requests_total{outcome=%q} = %v; want %v", outcome, got, want)
		}
	}
}

// nopConnector lets sql.OpenDB build a pool that never connects; DB.Stats works on it.
type nopConnector struct{}

func (nopConnector) Connect(context.Context) (driver.Conn, error) {
	return nil, errors.New("no database")
}
func (nopConnector) Driver() driver.Driver { return nopDriver{} }

type nopDriver struct{}

func (nopDriver) Open(string) (driver.Conn, error) { return nil, errors.New("no database") }

func TestBulkGate(t *testing.T) {
	m := NewMetrics("test")
	if got, err := testutil.GatherAndCount(m.Registry(), "bulk_gate_wait_seconds"); err != nil || got != len(gateOutcomes) {
		t.Errorf("bulk_gate_wait_seconds: got %d series (err %v) before any wait, want %d", got, err, len(gateOutcomes))
	}
	m.BulkGateWaiting(1)
	m.BulkGateWaiting(1)
	m.BulkGateWaiting(-1)
	m.BulkGateWait(GateAdmitted, 0)
	m.BulkGateWait(GateAdmitted, 300*time.Millisecond)
	m.BulkGateWait(GateAbandoned, 2*time.Second)
	m.BulkGateWait("bogus", time.Second)
	if got := testutil.ToFloat64(m.gateWaiting); got != 1 {
		t.Errorf("bulk_gate_waiting = %v; want 1", got)
	}
	want := `
# HELP bulk_gate_waiting Bulk creates waiting now for a bulk slot.
# TYPE bulk_gate_waiting gauge
bulk_gate_waiting 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "bulk_gate_waiting"); err != nil {
		t.Error(err)
	}
	for outcome, want := range map[string]uint64{GateAdmitted: 2, GateAbandoned: 1, labelOther: 1} {
		h := &dto.Metric{}
		if err := m.gateWait.WithLabelValues(outcome).(prometheus.Histogram).Write(h); err != nil {
			t.Fatal(err)
		}
		if got := h.GetHistogram().GetSampleCount(); got != want {
			t.Errorf("bulk_gate_wait_seconds_count{outcome=%q} = %d; want %d", outcome, got, want)
		}
	}
	if problems, err := testutil.GatherAndLint(m.Registry(), "bulk_gate_wait_seconds", "bulk_gate_waiting"); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}
