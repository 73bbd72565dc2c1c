package telemetry

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// EmailMetrics are the confirmation email worker's metrics: sends by outcome and their
// duration, and, read from the database at each scrape, the outbox depth and the age of its
// oldest due email.
type EmailMetrics struct {
	sends    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewEmailMetrics registers the email collectors on reg.
func NewEmailMetrics(reg prometheus.Registerer) *EmailMetrics {
	m := &EmailMetrics{
		sends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "email_sends_total",
			Help: "Confirmation email delivery attempts, by outcome (sent, retry, failed, cancelled).",
		}, []string{"outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:                        "email_send_duration_seconds",
			Help:                        "Duration of confirmation email delivery attempts (token, SMTP, bookkeeping), by outcome.",
			Buckets:                     []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
			NativeHistogramBucketFactor: 1.1,
		}, []string{"outcome"}),
	}
	for _, o := range []string{"sent", "retry", "failed", "cancelled"} {
		m.sends.WithLabelValues(o) // every series exists from the start, at 0
	}
	reg.MustRegister(m.sends, m.duration)
	return m
}

// EmailSend records one delivery attempt; it implements mail.Recorder.
func (m *EmailMetrics) EmailSend(outcome string, d time.Duration) {
	m.sends.WithLabelValues(outcome).Inc()
	m.duration.WithLabelValues(outcome).Observe(d.Seconds())
}

// OutboxStatsFunc reads the number of emails waiting to be sent and how long the oldest due one
// has been due.
type OutboxStatsFunc func(ctx context.Context) (pending int64, oldestDue time.Duration, err error)

// RegisterOutbox exposes the outbox depth and oldest-due age, read with stats at each scrape
// (bounded by a 2 s timeout; a failed read leaves the series out of that scrape).
func RegisterOutbox(reg prometheus.Registerer, stats OutboxStatsFunc) {
	reg.MustRegister(&outboxCollector{stats: stats,
		pending: prometheus.NewDesc("email_outbox_pending",
			"Confirmation emails waiting to be sent (due or scheduled for a retry).", nil, nil),
		oldest: prometheus.NewDesc("email_outbox_oldest_due_seconds",
			"How long the longest-waiting due confirmation email has been due; 0 when none is.", nil, nil),
	})
}

type outboxCollector struct {
	stats           OutboxStatsFunc
	pending, oldest *prometheus.Desc
}

func (c *outboxCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.pending; ch <- c.oldest }

func (c *outboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	n, age, err := c.stats(ctx)
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, age.Seconds())
}
