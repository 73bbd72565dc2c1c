package telemetry

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
)

// RouteUnmatched is the route label of requests that matched no route (404, 405).
const RouteUnmatched = "unmatched"

// Metrics holds the service's Prometheus collectors on their own registry. Labels are bounded:
// methods, route templates, status codes and fixed enumerations — never keys, emails or IPs.
type Metrics struct {
	reg                *prometheus.Registry
	requestDuration    *prometheus.HistogramVec
	inFlight           prometheus.Gauge
	subscribersCreated *prometheus.CounterVec
}

// NewMetrics creates the collectors, with the Go runtime, process and build-info collectors.
func NewMetrics(version string) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		reg: reg,
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:                        "http_server_request_duration_seconds",
			Help:                        "Duration of HTTP requests served, by method, route template and status code.",
			Buckets:                     []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
			NativeHistogramBucketFactor: 1.1,
		}, []string{"method", "route", "code"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "http_server_active_requests",
			Help: "HTTP requests being served now.",
		}),
		subscribersCreated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "subscribers_created_total",
			Help: "Subscribers created, by initial status and operation (create, bulk).",
		}, []string{"status", "operation"}),
	}
	reg.MustRegister(m.requestDuration, m.inFlight, m.subscribersCreated,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "subscriberd_build_info",
			Help:        "Build information of the running binary; always 1.",
			ConstLabels: prometheus.Labels{"version": version},
		}, func() float64 { return 1 }),
	)
	return m
}

// Registry is where further collectors (database pool, email, limits) register.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry, in OpenMetrics when the scraper asks, so exemplars flow.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{EnableOpenMetrics: true, Registry: m.reg})
}

// RequestStarted counts a request in flight; call the returned function when it ends.
func (m *Metrics) RequestStarted() func() {
	m.inFlight.Inc()
	return m.inFlight.Dec
}

// ObserveRequest records one served request. A sampled span in ctx becomes the exemplar.
func (m *Metrics) ObserveRequest(ctx context.Context, method, route string, code int, d time.Duration) {
	obs := m.requestDuration.WithLabelValues(method, route, strconv.Itoa(code))
	if sc := trace.SpanContextFromContext(ctx); sc.IsSampled() {
		obs.(prometheus.ExemplarObserver).ObserveWithExemplar(d.Seconds(),
			prometheus.Labels{"trace_id": sc.TraceID().String(), "span_id": sc.SpanID().String()})
		return
	}
	obs.Observe(d.Seconds())
}

// SubscribersCreated counts n subscribers created with status by operation ("create", "bulk").
func (m *Metrics) SubscribersCreated(operation, status string, n int) {
	m.subscribersCreated.WithLabelValues(status, operation).Add(float64(n))
}
