package telemetry

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestPrivacyRequests(t *testing.T) {
	m := NewMetrics("test")
	if got, err := testutil.GatherAndCount(m.Registry(), "privacy_requests_total"); err != nil ||
		got != len(privacyOperations)*len(privacyOutcomes) {
		t.Errorf("privacy_requests_total: %d series (err %v) before any request, want %d", got, err,
			len(privacyOperations)*len(privacyOutcomes))
	}
	m.PrivacyRequest(PrivacyErase, PrivacyDone)
	m.PrivacyRequest(PrivacyErase, PrivacyDone)
	m.PrivacyRequest(PrivacyExport, PrivacyNotFound)
	m.PrivacyRequest("someone@example.com", "x") // never a new series of its own
	for _, c := range []struct {
		op, outcome string
		want        float64
	}{
		{PrivacyErase, PrivacyDone, 2}, {PrivacyExport, PrivacyNotFound, 1}, {PrivacyExport, PrivacyDone, 0},
		{labelOther, labelOther, 1},
	} {
		if got := testutil.ToFloat64(m.privacy.WithLabelValues(c.op, c.outcome)); got != c.want {
			t.Errorf("privacy_requests_total{operation=%q,outcome=%q} = %v; want %v", c.op, c.outcome, got, c.want)
		}
	}
}
