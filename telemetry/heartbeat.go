package telemetry

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// HeldStats reports how long the work of a queue held longest past its heartbeat has been so:
// claimed by a worker that stopped renewing its lease (it died), and not yet taken over by
// another; zero when there is none. It is called at every scrape with a context that expires
// after OutboxStatsTimeout, so it should be one cheap query.
type HeldStats func(ctx context.Context) (time.Duration, error)

// RegisterOutboxHeldGauge exports email_outbox_held_past_heartbeat_seconds, read through
// stats at each scrape; when stats fails the gauge is left out of that scrape and
// email_outbox_collect_errors_total grows. It may be called once.
func (m *Metrics) RegisterOutboxHeldGauge(stats HeldStats) error {
	return m.registerHeld(stats, m.outboxErrors, "email_outbox", "email")
}

// RegisterWebhookHeldGauge exports webhook_queue_held_past_heartbeat_seconds, read through
// stats at each scrape, as RegisterOutboxHeldGauge does for emails. It may be called once.
func (m *Metrics) RegisterWebhookHeldGauge(stats HeldStats) error {
	return m.registerHeld(stats, m.webhookErrors, "webhook_queue", "webhook endpoint")
}

func (m *Metrics) registerHeld(stats HeldStats, errs prometheus.Counter, prefix, item string) error {
	c := &heldCollector{stats: stats, errors: errs, desc: prometheus.NewDesc(prefix+"_held_past_heartbeat_seconds",
		"How long the "+item+" held longest by a worker that stopped renewing its lease has been so; 0 when none is.", nil, nil)}
	if err := m.reg.Register(c); err != nil {
		return fmt.Errorf("%s held gauge: %w", prefix, err)
	}
	return nil
}

type heldCollector struct {
	stats  HeldStats
	errors prometheus.Counter
	desc   *prometheus.Desc
}

func (c *heldCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *heldCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), OutboxStatsTimeout)
	defer cancel()
	age, err := c.stats(ctx)
	if err != nil {
		c.errors.Inc()
		return
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, age.Seconds())
}
