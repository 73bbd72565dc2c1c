package telemetry

import "github.com/prometheus/client_golang/prometheus"

// Label values of idempotency_requests_total{outcome} (docs/api-contract.md §8).
const (
	IdempotencyReplayed = "replayed" // a stored response was sent again
	IdempotencyInUse    = "in_use"   // 409: the key's first request was still running
	IdempotencyReused   = "reused"   // 422: the key was used with another request
)

var idempotencyOutcomes = []string{IdempotencyReplayed, IdempotencyInUse, IdempotencyReused}

func (m *Metrics) registerIdempotency() {
	m.idempotency = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idempotency_requests_total",
		Help: "Requests with an Idempotency-Key that did not run, by outcome (replayed, in_use, reused).",
	}, []string{"outcome"})
	for _, o := range idempotencyOutcomes {
		m.idempotency.WithLabelValues(o)
	}
	m.reg.MustRegister(m.idempotency)
}

// IdempotencyOutcome counts one request with an Idempotency-Key that was answered without
// running: IdempotencyReplayed, IdempotencyInUse or IdempotencyReused.
func (m *Metrics) IdempotencyOutcome(outcome string) {
	m.idempotency.WithLabelValues(bounded(outcome, idempotencyOutcomes)).Inc()
}
