// Package metricnames lists every series subscriberd can export, for the tests that check
// dashboards, alert rules and the metrics' lint against the service's real registry.
package metricnames

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"slices"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/subscriberd/subscriberd/telemetry"
)

// Names returns the name of every series subscriberd can export, sorted: counters and
// gauges by their name, histograms as name_bucket, name_sum and name_count, summaries as name,
// name_sum and name_count. It is derived from a registry built exactly like the service's, with
// every family touched once, so dashboards and alert rules can be checked against it.
func Names() []string {
	m := telemetry.NewMetrics("")
	TouchAll(m)
	mfs, err := m.Registry().Gather()
	if err != nil {
		panic("metricnames: gathering a fresh registry: " + err.Error())
	}
	var names []string
	for _, mf := range mfs {
		n := mf.GetName()
		switch mf.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			names = append(names, n+"_bucket", n+"_sum", n+"_count")
		case dto.MetricType_SUMMARY:
			names = append(names, n, n+"_sum", n+"_count")
		default:
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// TouchAll makes every family of m appear in a Gather: the label vectors without fixed label
// sets get one sample, and the collectors registered on demand are registered.
func TouchAll(m *telemetry.Metrics) {
	m.ObserveRequest(context.Background(), "GET", telemetry.RouteUnmatched, 404, time.Millisecond)
	m.SubscribersCreated("create", "pending", 1)
	m.ScopeRefused("sk_0000")
	m.EmailSend(context.Background(), telemetry.EmailSent, time.Millisecond)
	m.BackendUp(true)
	_ = m.RegisterOutboxGauges(func(context.Context) ([]telemetry.QueueLane, error) {
		return []telemetry.QueueLane{{Lane: "interactive"}}, nil
	})
	m.WebhookDelivery(context.Background(), telemetry.WebhookDelivered, time.Millisecond)
	_ = m.RegisterWebhookGauges(func(context.Context) ([]telemetry.QueueLane, error) {
		return []telemetry.QueueLane{{Lane: "interactive"}}, nil
	})
	_ = m.RegisterOutboxHeldGauge(func(context.Context) (time.Duration, error) { return 0, nil })
	_ = m.RegisterWebhookHeldGauge(func(context.Context) (time.Duration, error) { return 0, nil })
	_ = m.RegisterDB(sql.OpenDB(nopConnector{}))
}

// nopConnector lets sql.OpenDB build a pool that never connects; DB.Stats works on it.
type nopConnector struct{}

func (nopConnector) Connect(context.Context) (driver.Conn, error) {
	return nil, errors.New("no database")
}
func (nopConnector) Driver() driver.Driver { return nopDriver{} }

type nopDriver struct{}

func (nopDriver) Open(string) (driver.Conn, error) { return nil, errors.New("no database") }
