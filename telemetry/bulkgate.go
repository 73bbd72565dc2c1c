package telemetry

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Label values of bulk_gate_wait_seconds{outcome}.
const (
	GateAdmitted  = "admitted"  // a slot was free, at once or after a wait
	GateAbandoned = "abandoned" // the request ended (its client went away) while it waited
	GateTimedOut  = "timed_out" // no slot came free in time: 503
)

var gateOutcomes = []string{GateAdmitted, GateAbandoned, GateTimedOut}

func (m *Metrics) registerBulkGate() {
	m.gateWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "bulk_gate_wait_seconds",
		Help: "Time bulk creates waited for one of the instance's bulk slots before their body was read, " +
			"by outcome (admitted, abandoned, timed_out); 0 when a slot was free.",
		Buckets: requestBuckets[:], NativeHistogramBucketFactor: 1.1,
	}, []string{"outcome"})
	m.gateWaiting = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "bulk_gate_waiting", Help: "Bulk creates waiting now for a bulk slot."})
	for _, o := range gateOutcomes {
		m.gateWait.WithLabelValues(o)
	}
	m.reg.MustRegister(m.gateWait, m.gateWaiting)
}

// BulkGateWait records how long a bulk create waited at the gate and how the wait ended:
// GateAdmitted, GateAbandoned or GateTimedOut (anything else counts as "other").
func (m *Metrics) BulkGateWait(outcome string, d time.Duration) {
	m.gateWait.WithLabelValues(bounded(outcome, gateOutcomes)).Observe(d.Seconds())
}

// BulkGateWaiting adds delta (+1 when a wait starts, -1 when it ends) to bulk_gate_waiting.
func (m *Metrics) BulkGateWaiting(delta int) { m.gateWaiting.Add(float64(delta)) }
