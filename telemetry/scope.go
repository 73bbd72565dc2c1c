package telemetry

import "github.com/prometheus/client_golang/prometheus"

func (m *Metrics) registerScope() {
	m.scopeRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "api_key_scope_refusals_total",
		Help: "Requests refused with 403 insufficient_scope (a write with a read-only key), by the key's display prefix.",
	}, []string{"key_prefix"})
	m.reg.MustRegister(m.scopeRefusals)
}

// ScopeRefused counts a request refused because its key may only read (docs/api-contract.md
// §16.2). keyPrefix is the key's display prefix (sk_ and 4 characters), never the key: the
// label's values are bounded by the read keys that exist.
func (m *Metrics) ScopeRefused(keyPrefix string) {
	m.scopeRefusals.WithLabelValues(keyPrefix).Inc()
}
