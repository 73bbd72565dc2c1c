package metricnames

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/subscriberd/subscriberd/telemetry"
)

func TestMetricsLintClean(t *testing.T) {
	m := telemetry.NewMetrics("v1.2.3")
	TouchAll(m)
	problems, err := testutil.GatherAndLint(m.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestNames(t *testing.T) {
	names := Names()
	for _, want := range []string{
		"http_server_request_duration_seconds_bucket", "http_server_request_duration_seconds_count",
		"http_server_active_requests", "subscribers_created_total",
		"email_sends_total", "email_send_duration_seconds_bucket", "email_outbox_depth",
		"email_outbox_oldest_due_age_seconds", "email_outbox_collect_errors_total",
		"rate_limit_decisions_total", "rate_limit_redis_up", "auth_failures_total", "lockouts_total",
		"go_sql_in_use_connections", "go_sql_max_open_connections", "go_sql_wait_duration_seconds_total",
		"go_goroutines", "go_gc_duration_seconds", "go_gc_duration_seconds_count", "process_cpu_seconds_total",
		"process_resident_memory_bytes", "go_build_info", "subscriberd_build_info",
		"webhook_deliveries_total", "webhook_delivery_duration_seconds_bucket", "webhook_queue_depth",
		"webhook_queue_oldest_due_age_seconds", "webhook_queue_collect_errors_total",
		"email_outbox_held_past_heartbeat_seconds", "webhook_queue_held_past_heartbeat_seconds",
	} {
		if _, ok := slices.BinarySearch(names, want); !ok {
			t.Errorf("Names lacks %s", want)
		}
	}
	for _, absent := range []string{"http_server_request_duration_seconds", "email_send_duration_seconds"} {
		if _, ok := slices.BinarySearch(names, absent); ok {
			t.Errorf("Names lists the histogram base name %s, which no series has", absent)
		}
	}
}
