package telemetry

import (
	"context"
	"io"
	"log/slog"
	"os"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// BenchmarkAccessLine is the cost of one access line written to a pipe (stderr under a
// supervisor) straight and through a LogBuffer: what keeps logwriter.go.
func BenchmarkAccessLine(b *testing.B) {
	for _, buffered := range []bool{false, true} {
		name := "direct"
		if buffered {
			name = "LogBuffer"
		}
		b.Run(name, func(b *testing.B) {
			r, w, err := os.Pipe()
			if err != nil {
				b.Fatal(err)
			}
			done := make(chan struct{})
			go func() { io.Copy(io.Discard, r); close(done) }() //nolint:errcheck
			var out io.Writer = w
			if buffered {
				lb := NewLogBuffer(w)
				out = lb
			}
			log, _ := NewLogger(out, "info", "json")
			// A request's line is logged inside its span: the line carries its ids.
			ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
				TraceID: trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
				SpanID:  trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8}, TraceFlags: trace.FlagsSampled}))
			b.ReportAllocs()
			cpu0 := cpuTime(b)
			for b.Loop() {
				{
					log.LogAttrs(ctx, slog.LevelInfo, "request", slog.String("method", "GET"), slog.String("route", "/api/v1/subscribers/{id}"),
						slog.Int("status", 200), slog.Float64("duration_ms", 1.234), slog.Int("bytes", 312), slog.String("request_id", "0123456789abcdef0123456789abcdef"))
				}
			}
			b.StopTimer()
			if buffered {
				out.(*LogBuffer).Close()
			}
			w.Close()
			<-done
			// The CPU of the process (writer and reader) per line: the wall time of a pipe
			// is mostly the scheduler's on a shared machine.
			b.ReportMetric(float64((cpuTime(b)-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
