package telemetry

import "github.com/prometheus/client_golang/prometheus"

// LimitMetrics counts rate-limit decisions and reports the state of the shared limiter
// backend. Its methods satisfy the recorder interface the limits package declares. Labels
// are fixed enumerations (scope, outcome) — never a key or an address.
type LimitMetrics struct {
	decisions *prometheus.CounterVec
	redisUp   prometheus.Gauge
}

// LimitMetrics creates and registers the rate-limit collectors. rate_limit_redis_up exists
// only when shared is true (REDIS_URL is set). Call it once.
func (m *Metrics) LimitMetrics(shared bool) *LimitMetrics {
	lm := &LimitMetrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rate_limit_decisions_total",
			Help: "Rate-limit and lockout decisions, by scope (key, bulk, client_lockout, key_lockout) and outcome (allowed, limited, locked).",
		}, []string{"scope", "outcome"}),
		redisUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rate_limit_redis_up",
			Help: "1 while the shared Redis limiter backend is in use, 0 while decisions fall back to the process.",
		}),
	}
	m.reg.MustRegister(lm.decisions)
	if shared {
		m.reg.MustRegister(lm.redisUp)
	}
	return lm
}

// Decision counts one decision.
func (lm *LimitMetrics) Decision(scope, outcome string) {
	lm.decisions.WithLabelValues(scope, outcome).Inc()
}

// BackendUp sets rate_limit_redis_up.
func (lm *LimitMetrics) BackendUp(up bool) {
	if up {
		lm.redisUp.Set(1)
		return
	}
	lm.redisUp.Set(0)
}
