package telemetry

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// slogLine is what slog's JSON handler writes for r, with the ids traceHandler adds.
func slogLine(t testing.TB, r slog.Record, sc trace.SpanContext) string {
	t.Helper()
	var out bytes.Buffer
	if sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	if err := slog.NewJSONHandler(&out, nil).Handle(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

var testSpan = trace.NewSpanContext(trace.SpanContextConfig{
	TraceID: trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
	SpanID:  trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
})

func TestJSONRecordMatchesSlog(t *testing.T) {
	at := time.Date(2026, 11, 22, 21, 7, 50, 123456000, time.UTC)
	access := slog.NewRecord(at, slog.LevelInfo, "request", 0)
	access.AddAttrs(slog.String("method", "GET"), slog.String("route", "/api/v1/subscribers/{id}"),
		slog.Int("status", 200), slog.Float64("duration_ms", 1.234), slog.Int("bytes", 312),
		slog.String("request_id", "0f9a8b7c6d5e4f30"))
	warn := slog.NewRecord(at.In(time.FixedZone("X", 5*3600+1800)), slog.LevelWarn+2, "email send failed", 0)
	warn.AddAttrs(slog.Bool("retry", true), slog.Uint64("attempt", math.MaxUint64), slog.Int64("n", math.MinInt64),
		slog.Float64("zero", 0), slog.Float64("neg", -0.5), slog.Float64("small", 1e-6), slog.Float64("big", 9.99e20))
	tests := []struct {
		name string
		r    slog.Record
		sc   trace.SpanContext
	}{
		{"access line in a request", access, testSpan},
		{"access line outside one", access, trace.SpanContext{}},
		{"warn with every kind", warn, testSpan},
		{"no time", slog.NewRecord(time.Time{}, slog.LevelDebug, "", 0), trace.SpanContext{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := appendJSONRecord(nil, tt.r, tt.sc)
			if !ok {
				t.Fatal("not handled")
			}
			if want := slogLine(t, tt.r, tt.sc); string(got) != want {
				t.Errorf("got  %s\nwant %s", got, want)
			}
		})
	}
}

// TestJSONRecordLeavesTheRestToSlog: what appendJSONRecord does not write exactly as slog
// would, it refuses.
func TestJSONRecordLeavesTheRestToSlog(t *testing.T) {
	at := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	for name, a := range map[string]slog.Attr{
		"escaped string": slog.String("q", `say "hi"`),
		"non-ASCII":      slog.String("name", "Zoë"),
		"newline":        slog.String("s", "a\nb"),
		"escaped key":    slog.Int("k\"", 1),
		"empty key":      slog.Int("", 1),
		"error":          slog.Any("err", context.Canceled),
		"duration":       slog.Duration("d", time.Second),
		"time":           slog.Time("t", at),
		"group":          slog.Group("g", slog.Int("a", 1)),
		"NaN":            slog.Float64("f", math.NaN()),
		"tiny float":     slog.Float64("f", 1e-7),
		"huge float":     slog.Float64("f", 1e21),
	} {
		r := slog.NewRecord(at, slog.LevelInfo, "m", 0)
		r.AddAttrs(a)
		if _, ok := appendJSONRecord(nil, r, testSpan); ok {
			t.Errorf("%s: handled, want it left to slog", name)
		}
	}
	if _, ok := appendJSONRecord(nil, slog.NewRecord(at, slog.LevelInfo, "tab\there", 0), testSpan); ok {
		t.Error("a message that needs escaping was handled")
	}
	if _, ok := appendJSONRecord(nil, slog.NewRecord(at.AddDate(10000, 0, 0), slog.LevelInfo, "m", 0), testSpan); ok {
		t.Error("a year past 9999 was handled")
	}
}

// FuzzJSONRecord: whenever appendJSONRecord writes a record, it writes what slog writes.
func FuzzJSONRecord(f *testing.F) {
	f.Add("request", "method", "GET", "status", int64(200), 1.234, true, int64(1700000000123456789))
	f.Add("m", "k", "a\"b", "n", int64(-1), 1e-7, false, int64(0))
	f.Add("é", "ключ", "\u2028", "", int64(0), math.Inf(1), true, int64(-1))
	f.Fuzz(func(t *testing.T, msg, k1, s, k2 string, n int64, fl float64, valid bool, nanos int64) {
		r := slog.NewRecord(time.Unix(0, nanos).UTC(), slog.Level(n%16), msg, 0)
		r.AddAttrs(slog.String(k1, s), slog.Int64(k2, n), slog.Float64(k1+k2, fl), slog.Bool(s, valid),
			slog.Uint64(msg, uint64(n)))
		sc := trace.SpanContext{}
		if valid {
			sc = testSpan
		}
		got, ok := appendJSONRecord(nil, r, sc)
		if !ok {
			return
		}
		if want := slogLine(t, r, sc); string(got) != want {
			t.Errorf("got  %s\nwant %s", got, want)
		}
	})
}

// TestLoggerWritesDirectLinesWhole: records written by the fast path and by slog (one that
// carries an error) land as whole lines, in order, with the ids; a logger derived with
// WithAttrs keeps its attributes.
func TestLoggerWritesDirectLinesWhole(t *testing.T) {
	var out bytes.Buffer
	lb := NewLogBuffer(&out)
	log, err := NewLogger(lb, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	ctx := trace.ContextWithSpanContext(context.Background(), testSpan)
	log.InfoContext(ctx, "request", "status", 200)
	log.WarnContext(ctx, "failed", "err", context.Canceled)
	log.With("component", "mail").InfoContext(ctx, "sent")
	log.DebugContext(ctx, "hidden")
	if err := lb.Close(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("got %d lines:\n%s", len(lines), out.String())
	}
	ids := `"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","span_id":"00f067aa0ba902b7"}`
	for i, want := range []string{`"msg":"request","status":200,` + ids, `"msg":"failed","err":"context canceled",` + ids,
		`"msg":"sent","component":"mail",` + ids} {
		if !strings.Contains(lines[i], want) {
			t.Errorf("line %d = %s\nwant it to contain %s", i, lines[i], want)
		}
	}
}

// BenchmarkAccessLine: the access line through NewLogger's handler, formatted here
// ("direct", the writer is a LogBuffer) and by slog (any other writer).
func BenchmarkAccessLine(b *testing.B) {
	lb := NewLogBuffer(discard{})
	defer lb.Close()
	for name, w := range map[string]io.Writer{"direct": lb, "slog": discard{}} {
		b.Run(name, func(b *testing.B) {
			log, err := NewLogger(w, "info", "json")
			if err != nil {
				b.Fatal(err)
			}
			h := log.Handler()
			ctx := trace.ContextWithSpanContext(context.Background(), testSpan)
			b.ReportAllocs()
			for b.Loop() {
				r := slog.NewRecord(time.Now(), slog.LevelInfo, "request", 0)
				r.AddAttrs(slog.String("method", "GET"), slog.String("route", "/api/v1/subscribers/{id}"),
					slog.Int("status", 200), slog.Float64("duration_ms", 1.234), slog.Int("bytes", 312),
					slog.String("request_id", "0f9a8b7c6d5e4f30"))
				if err := h.Handle(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// appendRFC3339Nano and appendFloat write what the time and strconv packages write, for
// times in several zones within one second and around its edges (the kept second is reused
// and replaced), and for the durations the access line logs.
func TestAppendTimeAndFloatMatchTheStandardLibrary(t *testing.T) {
	base := time.Date(2026, 11, 23, 3, 4, 5, 0, time.UTC)
	zones := []*time.Location{time.UTC, time.FixedZone("X", -7*3600-30*60), time.FixedZone("Y", 3600), time.Local}
	for _, ns := range []int{0, 1, 10, 123456789, 999999999, 100000000, 500, 1000000000, 1999999999, -1} {
		for _, loc := range zones {
			tm := base.Add(time.Duration(ns)).In(loc)
			if got, want := string(appendRFC3339Nano(nil, tm)), tm.Format(time.RFC3339Nano); got != want {
				t.Errorf("appendRFC3339Nano(%v) = %s, want %s", tm, got, want)
			}
		}
	}
	for _, f := range []float64{0, math.Copysign(0, -1), 0.001, 1.234, 1.5, 2, 10.01, 12345.678, -3.25, 0.1 + 0.2, 1e14 + 0.5, 1e15, 1e-7, 123456.0001} {
		if got, want := string(appendFloat(nil, f)), strconv.FormatFloat(f, 'f', -1, 64); got != want {
			t.Errorf("appendFloat(%v) = %s, want %s", f, got, want)
		}
	}
	for us := int64(0); us < 200000; us += 7 {
		f := float64(us) / 1000
		if got, want := string(appendFloat(nil, f)), strconv.FormatFloat(f, 'f', -1, 64); got != want {
			t.Fatalf("appendFloat(%v) = %s, want %s", f, got, want)
		}
	}
}

// LogAccess writes the access line itself only for a logger on a LogBuffer, and only values
// it writes as slog would; otherwise it writes nothing and says so, for the caller to log a
// record instead.
func TestLogAccessWritesOnlyWhatItCan(t *testing.T) {
	var out bytes.Buffer
	lb := NewLogBuffer(&out)
	defer lb.Close()
	direct, err := NewLogger(lb, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewLogger(&bytes.Buffer{}, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	h, hOther := direct.Handler().(traceHandler), other.Handler().(traceHandler)
	ctx := trace.ContextWithSpanContext(context.Background(), testSpan)
	at := time.Date(2026, 11, 23, 3, 4, 5, 120000000, time.UTC)
	if !h.LogAccess(ctx, at, "GET", "/api/v1/subscribers/{id}", 200, 1234*time.Microsecond, 312, "req-1") {
		t.Fatal("LogAccess on a LogBuffer did not write the line")
	}
	for name, wrote := range map[string]bool{
		"another writer":        hOther.LogAccess(ctx, at, "GET", "/", 200, time.Millisecond, 1, "r"),
		"a quote in the method": h.LogAccess(ctx, at, `G"T`, "/", 200, time.Millisecond, 1, "r"),
		"a year past 9999":      h.LogAccess(ctx, at.AddDate(8000, 0, 0), "GET", "/", 200, time.Millisecond, 1, "r"),
		"a duration of 1e15 µs": h.LogAccess(ctx, at, "GET", "/", 200, 1e15*time.Microsecond, 1, "r"),
	} {
		if wrote {
			t.Errorf("%s: LogAccess says it wrote the line", name)
		}
	}
	lb.Flush()
	want := `{"time":"2026-11-23T03:04:05.12Z","level":"INFO","msg":"request","method":"GET","route":"/api/v1/subscribers/{id}",` +
		`"status":200,"duration_ms":1.234,"bytes":312,"request_id":"req-1",` +
		`"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","span_id":"00f067aa0ba902b7"}` + "\n"
	if out.String() != want {
		t.Errorf("written:\n%s\nwant exactly:\n%s", out.String(), want)
	}
}
