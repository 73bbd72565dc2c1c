package telemetry

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestLimitMetrics(t *testing.T) {
	m := NewMetrics("test")
	lm := m.LimitMetrics(true)
	lm.Decision("key", "allowed")
	lm.Decision("key", "allowed")
	lm.Decision("client_lockout", "locked")
	lm.BackendUp(false)
	want := `
# HELP rate_limit_decisions_total Rate-limit and lockout decisions, by scope (key, bulk, client_lockout, key_lockout) and outcome (allowed, limited, locked).
# TYPE rate_limit_decisions_total counter
rate_limit_decisions_total{outcome="allowed",scope="key"} 2
rate_limit_decisions_total{outcome="locked",scope="client_lockout"} 1
# HELP rate_limit_redis_up 1 while the shared Redis limiter backend is in use, 0 while decisions fall back to the process.
# TYPE rate_limit_redis_up gauge
rate_limit_redis_up 0
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "rate_limit_decisions_total", "rate_limit_redis_up"); err != nil {
		t.Error(err)
	}
	lm.BackendUp(true)
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(`
# HELP rate_limit_redis_up 1 while the shared Redis limiter backend is in use, 0 while decisions fall back to the process.
# TYPE rate_limit_redis_up gauge
rate_limit_redis_up 1
`), "rate_limit_redis_up"); err != nil {
		t.Error(err)
	}

	// Without Redis there is no gauge to mislead.
	m2 := NewMetrics("test")
	m2.LimitMetrics(false).Decision("key", "limited")
	if n, err := testutil.GatherAndCount(m2.Registry(), "rate_limit_redis_up"); err != nil || n != 0 {
		t.Errorf("rate_limit_redis_up series without Redis = %d, %v; want none", n, err)
	}
}
