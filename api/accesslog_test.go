package api_test

import (
	"bytes"
	"context"
	"io"
	"regexp"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/internal/logbuf"
	"github.com/subscriberd/subscriberd/telemetry"
)

// The access line telemetry's logger writes itself on a LogBuffer (serve's case) is the line
// the record observe makes comes out as through slog: same keys, order and values; only the
// time and the duration differ between two requests, and their formatting is compared with
// the standard library's in telemetry's tests.
func TestAccessLineWrittenDirectlyMatchesTheRecord(t *testing.T) {
	var direct bytes.Buffer
	lb := telemetry.NewLogBuffer(&direct)
	defer lb.Close()
	viaRecord := &logbuf.Buffer{}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5}, TraceFlags: trace.FlagsSampled})
	for _, w := range []io.Writer{lb, viaRecord} {
		log, err := telemetry.NewLogger(w, "info", "json")
		if err != nil {
			t.Fatal(err)
		}
		e := newEnv(t, func(c *api.Config) { c.Logger = log })
		for _, r := range []req{
			{method: "GET", path: api.BasePath + "/subscribers", headers: []string{"X-Request-Id: req-1"}},
			{method: "GET", path: api.BasePath + "/subscribers", headers: []string{"X-Request-Id: req-2", "Authorization: Bearer " + keyA}},
			{method: "BREW", path: "/nowhere"},
		} {
			e.srv.ServeHTTP(newRecorder(), newRequest(r).WithContext(trace.ContextWithSpanContext(context.Background(), sc)))
		}
	}
	lb.Flush()
	varying := regexp.MustCompile(`"time":"[^"]*"|"duration_ms":[0-9.]+|"request_id":"[0-9a-f]{32}"`)
	got, want := varying.ReplaceAllString(direct.String(), "…"), varying.ReplaceAllString(viaRecord.String(), "…")
	if got != want || strings.Count(want, "\n") != 3 {
		t.Errorf("direct lines:\n%s\nwant, as through the record:\n%s", got, want)
	}
	if !strings.Contains(got, `"trace_id":"01020300000000000000000000000000","span_id":"0405000000000000"`) {
		t.Errorf("direct lines lack the span's ids:\n%s", got)
	}
}
