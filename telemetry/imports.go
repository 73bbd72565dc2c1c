package telemetry

import "github.com/prometheus/client_golang/prometheus"

// Label values of import_rows_total{outcome}: what became of each row of an import
// (docs/api-contract.md §15).
const (
	ImportCreated    = "created"
	ImportExisting   = "existing"
	ImportSuppressed = "suppressed"
	ImportInvalid    = "invalid"
)

var importOutcomes = []string{ImportCreated, ImportExisting, ImportSuppressed, ImportInvalid}

func (m *Metrics) registerImports() {
	m.importRows = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "import_rows_total",
		Help: "Rows of imports processed, by outcome (created, existing, suppressed, invalid), counted when their batch commits.",
	}, []string{"outcome"})
	m.importsRunning = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "imports_running", Help: "Imports this instance's workers are processing now."})
	for _, o := range importOutcomes {
		m.importRows.WithLabelValues(o)
	}
	m.reg.MustRegister(m.importRows, m.importsRunning)
}

// ImportRows adds n rows of outcome (ImportCreated, ImportExisting, ImportSuppressed,
// ImportInvalid; anything else counts as "other") to import_rows_total.
func (m *Metrics) ImportRows(outcome string, n int64) {
	if n > 0 {
		m.importRows.WithLabelValues(bounded(outcome, importOutcomes)).Add(float64(n))
	}
}

// ImportsRunning adds delta (+1 when a worker takes an import up, -1 when it stops) to
// imports_running.
func (m *Metrics) ImportsRunning(delta int) { m.importsRunning.Add(float64(delta)) }
