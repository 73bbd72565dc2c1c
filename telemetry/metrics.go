package telemetry

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
)

// RouteUnmatched is the route label of requests that matched no route (404, 405).
const RouteUnmatched = "unmatched"

// DBName is the db_name label of the database pool metrics (go_sql_*).
const DBName = "subscriberd"

// Label values of email_sends_total{outcome}.
const (
	EmailSent      = "sent"      // the relay accepted the message
	EmailLogged    = "logged"    // no SMTP_URL: the message was written to the log instead
	EmailRetry     = "retry"     // a transient failure; the message is due again later
	EmailFailed    = "failed"    // a permanent failure or the last attempt; the message is given up
	EmailCancelled = "cancelled" // the message was no longer needed (subscriber not pending)
)

// Label values of webhook_deliveries_total{outcome}.
const (
	WebhookDelivered = "delivered" // the receiver answered 2xx
	WebhookRetry     = "retry"     // failed; due again after a back-off
	WebhookFailed    = "failed"    // failed for good (the last attempt, or 410)
)

// Label values of rate_limit_decisions_total{scope} (the scope) and lockouts_total{scope}.
const (
	ScopeKey           = "key"            // the per-key rate-limit windows
	ScopeBulk          = "bulk"           // the extra windows of POST /subscribers/bulk
	ScopeClientLockout = "client_lockout" // the per-client-IP lockout after failed authentications
	ScopeKeyLockout    = "key_lockout"    // the per-key lockout after 4xx writes
	ScopeConfirm       = "confirm"        // the per-client-IP windows of the confirmation pages

	LockoutClient = "client" // lockouts_total: a client IP was locked out
	LockoutKey    = "key"    // lockouts_total: an API key was locked out
)

// Label values of rate_limit_decisions_total{outcome}.
const (
	DecisionAllowed = "allowed" // under every limit
	DecisionLimited = "limited" // a window is exhausted: 429
	DecisionLocked  = "locked"  // a lockout is in force: 429
)

// Label values of auth_failures_total{reason}.
const (
	AuthMissing      = "missing"       // no Authorization header, or another scheme
	AuthInvalid      = "invalid"       // unknown key
	AuthRevoked      = "revoked"       // a revoked key
	AuthPlanDisabled = "plan_disabled" // the newsletter's plan has API access disabled (403)
)

// labelOther replaces a label value outside a family's fixed set, so a caller's mistake can
// never create unbounded series.
const labelOther = "other"

var (
	emailOutcomes   = []string{EmailSent, EmailLogged, EmailRetry, EmailFailed, EmailCancelled, EmailSuppressed}
	webhookOutcomes = []string{WebhookDelivered, WebhookRetry, WebhookFailed}
	decisionScopes  = []string{ScopeKey, ScopeBulk, ScopeClientLockout, ScopeKeyLockout, ScopeConfirm}
	decisionResults = []string{DecisionAllowed, DecisionLimited, DecisionLocked}
	authReasons     = []string{AuthMissing, AuthInvalid, AuthRevoked, AuthPlanDisabled}
	lockoutScopes   = []string{LockoutClient, LockoutKey}
)

// bounded returns v when it is one of allowed, else labelOther.
func bounded(v string, allowed []string) string {
	if slices.Contains(allowed, v) {
		return v
	}
	return labelOther
}

// requestBuckets are the HTTP latency buckets. 0.25 s is the latency SLO threshold, so it must
// stay a bucket edge (deploy/prometheus/rules.yml depends on le="0.25").
var requestBuckets = [...]float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// emailBuckets cover an SMTP exchange: a local catcher answers in milliseconds, a remote relay
// with STARTTLS in hundreds of milliseconds, a struggling one in tens of seconds.
var emailBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// Metrics holds the service's Prometheus collectors on their own registry. Labels are bounded:
// methods, route templates, status codes and fixed enumerations — never keys, emails or IPs.
//
// The recording methods are safe for concurrent use. Other packages do not import telemetry:
// each declares the small interface it needs (for example `EmailSend(outcome string, d
// time.Duration)`), and cmd/subscriberd passes a *Metrics.
type Metrics struct {
	reg                *prometheus.Registry
	requestDuration    *prometheus.HistogramVec
	inFlight           prometheus.Gauge
	subscribersCreated *prometheus.CounterVec

	emailSends        *prometheus.CounterVec
	emailSendDuration *prometheus.HistogramVec
	outboxErrors      prometheus.Counter
	webhookDeliveries *prometheus.CounterVec
	webhookDuration   *prometheus.HistogramVec
	webhookErrors     prometheus.Counter
	decisions         *prometheus.CounterVec
	authFailures      *prometheus.CounterVec
	lockouts          *prometheus.CounterVec
	idempotency       *prometheus.CounterVec   // see idempotency.go
	gateWait          *prometheus.HistogramVec // see bulkgate.go
	scopeRefusals     *prometheus.CounterVec   // see scope.go
	gateWaiting       prometheus.Gauge
	consent           consentMetrics         // see consent.go
	importRows        *prometheus.CounterVec // see imports.go
	importsRunning    prometheus.Gauge
	// see bulkactions.go
	bulkActionRows     *prometheus.CounterVec
	bulkActionsRunning prometheus.Gauge
	privacy            *prometheus.CounterVec // see privacy.go

	requestSeries sync.Map // seriesKey → *requestSeries

	redisOnce sync.Once
	redisUp   prometheus.Gauge
}

// NewMetrics creates the collectors, with the Go runtime, process and build-info collectors.
// Every counter with a fixed label set starts at zero for each label value, so rate() and the
// alert ratios work from the first scrape.
func NewMetrics(version string) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		reg: reg,
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:                        "http_server_request_duration_seconds",
			Help:                        "Duration of HTTP requests served, by method, route template and status code.",
			Buckets:                     requestBuckets[:],
			NativeHistogramBucketFactor: 1.1,
		}, []string{"method", "route", "code"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "http_server_active_requests",
			Help: "HTTP requests being served now.",
		}),
		subscribersCreated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "subscribers_created_total",
			Help: "Subscribers created, by initial status and operation (create, bulk, upsert).",
		}, []string{"status", "operation"}),
		emailSends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "email_sends_total",
			Help: "Confirmation email send attempts, by outcome (sent, logged, retry, failed, cancelled, suppressed).",
		}, []string{"outcome"}),
		emailSendDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:                        "email_send_duration_seconds",
			Help:                        "Duration of one confirmation email delivery attempt (token, SMTP, bookkeeping), by outcome.",
			Buckets:                     emailBuckets,
			NativeHistogramBucketFactor: 1.1,
		}, []string{"outcome"}),
		outboxErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "email_outbox_collect_errors_total",
			Help: "Scrapes at which the outbox depth and age could not be read from the database.",
		}),
		webhookDeliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "webhook_deliveries_total",
			Help: "Webhook delivery attempts, by outcome (delivered, retry, failed).",
		}, []string{"outcome"}),
		webhookDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:                        "webhook_delivery_duration_seconds",
			Help:                        "Duration of one webhook delivery attempt (request and answer), by outcome.",
			Buckets:                     emailBuckets,
			NativeHistogramBucketFactor: 1.1,
		}, []string{"outcome"}),
		webhookErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "webhook_queue_collect_errors_total",
			Help: "Scrapes at which the webhook queue depth and age could not be read from the database.",
		}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rate_limit_decisions_total",
			Help: "Rate-limit and lockout decisions, by scope (key, bulk, client_lockout, key_lockout, confirm) and outcome (allowed, limited, locked).",
		}, []string{"scope", "outcome"}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "auth_failures_total",
			Help: "Requests refused by authentication, by reason (missing, invalid, revoked, plan_disabled).",
		}, []string{"reason"}),
		lockouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockouts_total",
			Help: "Temporary lockouts imposed, by scope (client, key).",
		}, []string{"scope"}),
	}
	for _, o := range emailOutcomes {
		m.emailSends.WithLabelValues(o)
	}
	for _, o := range webhookOutcomes {
		m.webhookDeliveries.WithLabelValues(o)
	}
	for _, s := range decisionScopes {
		for _, o := range decisionResults {
			m.decisions.WithLabelValues(s, o)
		}
	}
	for _, r := range authReasons {
		m.authFailures.WithLabelValues(r)
	}
	for _, s := range lockoutScopes {
		m.lockouts.WithLabelValues(s)
	}
	reg.MustRegister(m.requestDuration, m.inFlight, m.subscribersCreated,
		m.emailSends, m.emailSendDuration, m.outboxErrors, m.decisions,
		m.webhookDeliveries, m.webhookDuration, m.webhookErrors, m.authFailures, m.lockouts,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector(),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "subscriberd_build_info",
			Help:        "Build information of the running binary; always 1.",
			ConstLabels: prometheus.Labels{"version": version},
		}, func() float64 { return 1 }),
	)
	m.registerIdempotency()
	m.registerBulkGate()
	m.registerScope()
	m.registerConsent()
	m.registerImports()
	m.registerBulkActions()
	m.registerPrivacy()
	return m
}

// Registry is where further collectors (database pool, email, limits) register.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry, in OpenMetrics when the scraper asks, so exemplars flow.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{EnableOpenMetrics: true, Registry: m.reg})
}

// RequestStarted counts a request in flight; RequestDone ends it.
func (m *Metrics) RequestStarted() { m.inFlight.Inc() }

// RequestDone counts a request no longer in flight.
func (m *Metrics) RequestDone() { m.inFlight.Dec() }

// ObserveRequest records one served request. A sampled span in ctx becomes the exemplar of
// the bucket d falls in, at most once per ExemplarInterval for each series and bucket.
func (m *Metrics) ObserveRequest(ctx context.Context, method, route string, code int, d time.Duration) {
	method = knownMethod(method) // a client's invented method is not a new series
	key := seriesKey{method, route, code}
	s, ok := m.requestSeries.Load(key)
	if !ok {
		s, _ = m.requestSeries.LoadOrStore(key, &requestSeries{
			obs: m.requestDuration.WithLabelValues(method, route, strconv.Itoa(code)),
		})
	}
	rs := s.(*requestSeries)
	if sc := trace.SpanContextFromContext(ctx); sc.IsSampled() && rs.exemplarDue(d) {
		rs.obs.(prometheus.ExemplarObserver).ObserveWithExemplar(d.Seconds(), exemplarLabels(sc))
		return
	}
	rs.obs.Observe(d.Seconds())
}

// ExemplarInterval is how often, at most, a request updates the exemplar of a histogram bucket
// of its series. Prometheus keeps one exemplar per bucket per scrape (15 s or more), so a
// second loses nothing; making an exemplar on every request cost 1 µs and 16 allocations
// (BenchmarkObserveRequest), most of the request histogram's cost at full sampling.
const ExemplarInterval = time.Second

// seriesKey identifies one http_server_request_duration_seconds series.
type seriesKey struct {
	method, route string
	code          int
}

// requestSeries is one series' observer and, per bucket, when its exemplar was last set.
type requestSeries struct {
	obs  prometheus.Observer
	last [len(requestBuckets) + 1]atomic.Int64 // unix nanoseconds
}

// exemplarDue reports whether d's bucket may take a new exemplar now, and claims it if so.
func (s *requestSeries) exemplarDue(d time.Duration) bool {
	last := &s.last[sort.SearchFloat64s(requestBuckets[:], d.Seconds())]
	now, prev := time.Now().UnixNano(), last.Load()
	return now-prev >= int64(ExemplarInterval) && last.CompareAndSwap(prev, now)
}

func exemplarLabels(sc trace.SpanContext) prometheus.Labels {
	return prometheus.Labels{"trace_id": sc.TraceID().String(), "span_id": sc.SpanID().String()}
}

// observe records d on o, with the trace and span ids of a sampled span in ctx as exemplar.
func observe(ctx context.Context, o prometheus.Observer, d time.Duration) {
	if sc := trace.SpanContextFromContext(ctx); sc.IsSampled() {
		o.(prometheus.ExemplarObserver).ObserveWithExemplar(d.Seconds(), exemplarLabels(sc))
		return
	}
	o.Observe(d.Seconds())
}

// SubscribersCreated counts n subscribers created with status by operation ("create", "bulk", "upsert").
func (m *Metrics) SubscribersCreated(operation, status string, n int) {
	m.subscribersCreated.WithLabelValues(status, operation).Add(float64(n))
}

// EmailSend records one email delivery attempt with its outcome (EmailSent, EmailLogged, EmailRetry, EmailFailed,
// EmailCancelled; anything else counts as "other") and how long it took. The trace id of the
// send span in ctx, when sampled, becomes the exemplar of the duration histogram.
func (m *Metrics) EmailSend(ctx context.Context, outcome string, d time.Duration) {
	outcome = bounded(outcome, emailOutcomes)
	m.emailSends.WithLabelValues(outcome).Inc()
	observe(ctx, m.emailSendDuration.WithLabelValues(outcome), d)
}

// QueueLane is what waits in one lane of a queue ("interactive": caused by one API call or
// page; "bulk": by imports and bulk actions, docs/api-contract.md §21): how many (due or
// scheduled for a retry) and how long the oldest due one has been waiting (zero when none is
// due).
type QueueLane struct {
	Lane         string
	Depth        int64
	OldestDueAge time.Duration
}

// OutboxStats reports, per lane, the emails (or webhook deliveries) waiting. It is called at
// every scrape with a context that expires after OutboxStatsTimeout, so it should be one
// cheap query.
type OutboxStats func(ctx context.Context) ([]QueueLane, error)

// OutboxStatsTimeout bounds one OutboxStats call, so a slow database cannot stall a scrape.
const OutboxStatsTimeout = 2 * time.Second

// RegisterOutboxGauges exports email_outbox_depth and email_outbox_oldest_due_age_seconds
// with a lane label, read through stats at each scrape. When stats fails, both gauges are left out of that
// scrape (the rules alert on their absence) and email_outbox_collect_errors_total grows.
// It may be called once.
func (m *Metrics) RegisterOutboxGauges(stats OutboxStats) error {
	return m.registerQueue(stats, m.outboxErrors, "email_outbox", "Emails waiting in the outbox", "email")
}

// RegisterWebhookGauges exports webhook_queue_depth and webhook_queue_oldest_due_age_seconds
// with a lane label, read through stats at each scrape, as RegisterOutboxGauges does for emails. It may be
// called once.
func (m *Metrics) RegisterWebhookGauges(stats OutboxStats) error {
	return m.registerQueue(stats, m.webhookErrors, "webhook_queue", "Webhook deliveries waiting", "webhook delivery")
}

// registerQueue registers the depth and oldest-due-age gauges of one queue, named prefix_….
func (m *Metrics) registerQueue(stats OutboxStats, errs prometheus.Counter, prefix, waiting, item string) error {
	c := &outboxCollector{stats: stats, errors: errs,
		depth: prometheus.NewDesc(prefix+"_depth", waiting+" (due or scheduled for a retry), per lane (interactive, bulk).",
			[]string{"lane"}, nil),
		age: prometheus.NewDesc(prefix+"_oldest_due_age_seconds",
			"How long the oldest due "+item+" of the lane has been waiting; 0 when none is due.", []string{"lane"}, nil)}
	if err := m.reg.Register(c); err != nil {
		return fmt.Errorf("%s gauges: %w", prefix, err)
	}
	return nil
}

// WebhookDelivery records one webhook delivery attempt with its outcome (WebhookDelivered,
// WebhookRetry, WebhookFailed; anything else counts as "other") and duration; the attempt's
// span in ctx becomes the duration's exemplar.
func (m *Metrics) WebhookDelivery(ctx context.Context, outcome string, d time.Duration) {
	outcome = bounded(outcome, webhookOutcomes)
	m.webhookDeliveries.WithLabelValues(outcome).Inc()
	observe(ctx, m.webhookDuration.WithLabelValues(outcome), d)
}

type outboxCollector struct {
	stats      OutboxStats
	errors     prometheus.Counter
	depth, age *prometheus.Desc
}

func (c *outboxCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.depth
	ch <- c.age
}

func (c *outboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), OutboxStatsTimeout)
	defer cancel()
	lanes, err := c.stats(ctx)
	if err != nil {
		c.errors.Inc()
		return
	}
	for _, l := range lanes {
		ch <- prometheus.MustNewConstMetric(c.depth, prometheus.GaugeValue, float64(l.Depth), l.Lane)
		ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, l.OldestDueAge.Seconds(), l.Lane)
	}
}

// Decision counts one rate-limit or lockout decision: scope is ScopeKey, ScopeBulk,
// ScopeClientLockout or ScopeKeyLockout; outcome is DecisionAllowed, DecisionLimited or
// DecisionLocked. Values outside these sets count as "other".
func (m *Metrics) Decision(scope, outcome string) {
	m.decisions.WithLabelValues(bounded(scope, decisionScopes), bounded(outcome, decisionResults)).Inc()
}

// BackendUp sets rate_limit_redis_up to 1 or 0 after each exchange with the shared counter
// store. The gauge appears at the first call, so an instance without Redis does not export it.
func (m *Metrics) BackendUp(up bool) {
	m.redisOnce.Do(func() {
		m.redisUp = prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rate_limit_redis_up",
			Help: "1 if the last exchange with the Redis rate-limit store succeeded, else 0.",
		})
		m.reg.MustRegister(m.redisUp)
	})
	v := 0.0
	if up {
		v = 1
	}
	m.redisUp.Set(v)
}

// AuthFailure counts one refused authentication: AuthMissing, AuthInvalid, AuthRevoked or
// AuthPlanDisabled (anything else counts as "other").
func (m *Metrics) AuthFailure(reason string) {
	m.authFailures.WithLabelValues(bounded(reason, authReasons)).Inc()
}

// Lockout counts one lockout imposed on LockoutClient (an IP) or LockoutKey.
func (m *Metrics) Lockout(scope string) {
	m.lockouts.WithLabelValues(bounded(scope, lockoutScopes)).Inc()
}

// RegisterDB exports the pool statistics of db as go_sql_*{db_name="subscriberd"}. It may be
// called once.
func (m *Metrics) RegisterDB(db *sql.DB) error {
	if err := m.reg.Register(collectors.NewDBStatsCollector(db, DBName)); err != nil {
		return fmt.Errorf("database pool metrics: %w", err)
	}
	return nil
}
