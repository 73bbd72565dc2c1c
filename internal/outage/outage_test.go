package outage_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/subscriberd/subscriberd/internal/logbuf"
	"github.com/subscriberd/subscriberd/internal/outage"
)

var msgs = outage.Messages{Start: "dep down", Summary: "dep still down", End: "dep back"}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// TestOutageLogsStartSummaryEnd: a thousand failures over 72 s are three warnings (the start
// and two summaries with their counts) and the recovery one info line; successes without an
// outage log nothing.
func TestOutageLogsStartSummaryEnd(t *testing.T) {
	buf := &logbuf.Buffer{}
	c := &clock{t: time.Date(2026, 6, 11, 17, 0, 0, 0, time.UTC)}
	o := outage.New(slog.New(slog.NewTextHandler(buf, nil)), msgs, 30*time.Second, c.now)
	ctx := context.Background()
	o.OK(ctx)
	if buf.String() != "" || o.Down() {
		t.Fatalf("a success without an outage logged %q", buf)
	}
	boom := errors.New("connection refused")
	for i := range 1000 {
		if i > 0 && i%100 == 0 {
			c.advance(8 * time.Second) // 1000 failures over 72 s
		}
		o.Failed(ctx, boom)
	}
	if !o.Down() {
		t.Fatal("Down() = false during the outage")
	}
	c.advance(8 * time.Second)
	o.OK(ctx)
	o.OK(ctx)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{
		`level=WARN msg="dep down" error="connection refused"`,
		`level=WARN msg="dep still down" failures=400 down_for=32s error="connection refused"`,
		`level=WARN msg="dep still down" failures=400 down_for=1m4s error="connection refused"`,
		`level=INFO msg="dep back" down_for=1m20s failures=1000`,
	}
	if len(lines) != len(want) {
		t.Fatalf("logged %d lines, want %d:\n%s", len(lines), len(want), buf)
	}
	for i, w := range want {
		if _, rest, _ := strings.Cut(lines[i], " "); rest != w { // drop time=
			t.Errorf("line %d = %q, want %q", i, rest, w)
		}
	}
	// A new outage starts over.
	buf.Reset()
	o.Failed(ctx, boom)
	if !strings.Contains(buf.String(), `msg="dep down"`) {
		t.Errorf("second outage: %q; want a new start line", buf)
	}
}

func TestOutageConcurrent(t *testing.T) {
	buf := &logbuf.Buffer{}
	o := outage.New(slog.New(slog.NewTextHandler(buf, nil)), msgs, time.Hour, nil)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				o.Failed(context.Background(), errors.New("x"))
			}
		})
	}
	wg.Wait()
	o.OK(context.Background())
	if n := strings.Count(buf.String(), "\n"); n != 2 {
		t.Errorf("logged %d lines for 8000 concurrent failures, want 2:\n%s", n, buf)
	}
	if !strings.Contains(buf.String(), "failures=8000") {
		t.Errorf("end line lacks the count: %s", buf)
	}
}

// TestRecordIgnoresFailuresOfTheShutdown: Record is OK for nil and Failed for an error, but an
// error once the attempt's context has ended is the shutdown's, not an outage.
func TestRecordIgnoresFailuresOfTheShutdown(t *testing.T) {
	buf := &logbuf.Buffer{}
	o := outage.New(slog.New(slog.NewTextHandler(buf, nil)), msgs, 0, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	o.Record(ctx, context.Canceled)
	if o.Down() || buf.String() != "" {
		t.Fatalf("a failure after the context ended started an outage: %q", buf)
	}
	o.Record(context.Background(), errors.New("refused"))
	o.Record(context.Background(), nil)
	if got := buf.String(); o.Down() || !strings.Contains(got, "dep down") || !strings.Contains(got, "dep back") {
		t.Errorf("Record(err) then Record(nil) logged %q", got)
	}
}
