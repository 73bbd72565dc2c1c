package telemetry

import "github.com/prometheus/client_golang/prometheus"

// Label values of privacy_requests_total (docs/api-contract.md §14): the operation and its
// outcome.
const (
	PrivacyExport   = "export"
	PrivacyErase    = "erase"
	PrivacyDone     = "done"      // exported, or erased
	PrivacyNotFound = "not_found" // no such subscriber: unknown, erased, or another newsletter's
	PrivacyFailed   = "failed"    // the store failed or the client left
)

var (
	privacyOperations = []string{PrivacyExport, PrivacyErase}
	privacyOutcomes   = []string{PrivacyDone, PrivacyNotFound, PrivacyFailed}
)

func (m *Metrics) registerPrivacy() {
	m.privacy = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "privacy_requests_total",
		Help: "Subscriber data exports and erasures, by operation (export, erase) and outcome (done, not_found, failed).",
	}, []string{"operation", "outcome"})
	for _, op := range privacyOperations {
		for _, o := range privacyOutcomes {
			m.privacy.WithLabelValues(op, o)
		}
	}
	m.reg.MustRegister(m.privacy)
}

// PrivacyRequest counts one export or erasure with its outcome; values outside the sets above
// count as "other".
func (m *Metrics) PrivacyRequest(operation, outcome string) {
	m.privacy.WithLabelValues(bounded(operation, privacyOperations), bounded(outcome, privacyOutcomes)).Inc()
}
