package api_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/subscriberd/subscriberd/model"
)

// TestDatabaseOutageLogsOnce: a database outage is one warning when it starts and one line
// when a request succeeds again, with the count of failed requests, not one warning per
// failed request (the 503s themselves are unchanged). Summaries while it lasts are
// internal/outage's tests.
func TestDatabaseOutageLogsOnce(t *testing.T) {
	e := newEnv(t)
	e.store.err = fmt.Errorf("dial tcp 127.0.0.1:5432: connection refused: %w", model.ErrUnavailable)
	for i := range 200 {
		method, path, body := "GET", subs, ""
		if i%2 == 1 {
			method, body = "POST", `{"email":"a@example.com"}`
		}
		if rec := e.call(t, method, path, body); rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("request %d during the outage: status %d; want 503", i, rec.Code)
		}
	}
	e.store.err = nil
	if rec := e.call(t, "GET", subs, ""); rec.Code != http.StatusOK {
		t.Fatalf("after the outage: status %d; want 200", rec.Code)
	}
	logs := e.logs.String()
	if n := strings.Count(logs, `"msg":"database unavailable"`); n != 1 {
		t.Errorf("the outage's start logged %d times; want once:\n%s", n, logs)
	}
	if n := strings.Count(logs, `"level":"WARN"`); n != 1 {
		t.Errorf("%d warnings for one outage; want 1", n)
	}
	if !strings.Contains(logs, `"msg":"database available again"`) || !strings.Contains(logs, `"failures":200`) {
		t.Errorf("no end line with the 200 failed requests:\n%s", logs)
	}
}
