package telemetry

import "github.com/prometheus/client_golang/prometheus"

// Label values of bulk_action_rows_total: the actions, and what became of each subscriber
// (docs/api-contract.md §20.2).
var (
	bulkActionNames    = []string{"add_tags", "remove_tags", "set_attributes", "unsubscribe"}
	bulkActionOutcomes = []string{"changed", "unchanged"}
)

func (m *Metrics) registerBulkActions() {
	m.bulkActionRows = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "bulk_action_rows_total",
		Help: "Subscribers handled by bulk actions, by action and outcome (changed, unchanged), counted when their batch commits.",
	}, []string{"action", "outcome"})
	m.bulkActionsRunning = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "bulk_actions_running", Help: "Bulk actions this instance's workers are processing now."})
	for _, a := range bulkActionNames {
		for _, o := range bulkActionOutcomes {
			m.bulkActionRows.WithLabelValues(a, o)
		}
	}
	m.reg.MustRegister(m.bulkActionRows, m.bulkActionsRunning)
}

// BulkActionRows adds n subscribers of action with outcome ("changed", "unchanged"; anything
// else counts as "other") to bulk_action_rows_total.
func (m *Metrics) BulkActionRows(action, outcome string, n int64) {
	if n > 0 {
		m.bulkActionRows.WithLabelValues(bounded(action, bulkActionNames), bounded(outcome, bulkActionOutcomes)).Add(float64(n))
	}
}

// BulkActionsRunning adds delta (+1 when a worker takes an action up, -1 when it stops) to
// bulk_actions_running.
func (m *Metrics) BulkActionsRunning(delta int) { m.bulkActionsRunning.Add(float64(delta)) }
