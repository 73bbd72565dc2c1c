package telemetry

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// recordingExporter keeps the size of every batch it is given.
type recordingExporter struct {
	mu       sync.Mutex
	batches  []int
	names    []string
	shutdown bool
	block    chan struct{} // when set, ExportSpans waits for it
}

func (e *recordingExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	if e.block != nil {
		<-e.block
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.batches = append(e.batches, len(spans))
	for _, s := range spans {
		e.names = append(e.names, s.Name())
	}
	return nil
}

func (e *recordingExporter) Shutdown(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.shutdown = true
	return nil
}

// encodedRecorder is a recordingExporter that takes encoded spans, as OTLPExporter does.
type encodedRecorder struct{ *recordingExporter }

func (e encodedRecorder) exportEncoded(_ context.Context, spans *encodedSpans) error {
	if e.block != nil {
		<-e.block
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.batches = append(e.batches, spans.len())
	for i := range spans.len() {
		e.names = append(e.names, string(spans.appendSpan(nil, i))) // bytes stand in for the name
	}
	return nil
}

// as returns e as an exporter of spans or, when encoded, of encoded spans: BatchProcessor
// queues differently for each.
func (e *recordingExporter) as(encoded bool) sdktrace.SpanExporter {
	if encoded {
		return encodedRecorder{e}
	}
	return e
}

// bothQueues runs test once per way BatchProcessor queues.
func bothQueues(t *testing.T, test func(t *testing.T, encoded bool)) {
	for _, encoded := range []bool{false, true} {
		t.Run(map[bool]string{false: "spans", true: "encoded"}[encoded], func(t *testing.T) { test(t, encoded) })
	}
}

func (e *recordingExporter) got() ([]int, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]int(nil), e.batches...), len(e.names)
}

func batchProvider(t *testing.T, exp sdktrace.SpanExporter, cfg BatchConfig, sampler sdktrace.Sampler) (*sdktrace.TracerProvider, *BatchProcessor) {
	t.Helper()
	p := NewBatchProcessor(exp, cfg)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(p), sdktrace.WithSampler(sampler))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp, p
}

func endSpans(tp *sdktrace.TracerProvider, n int) {
	for range n {
		_, s := tp.Tracer("test").Start(context.Background(), "span")
		s.End()
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 5 s: %s", what)
		}
	}
}

func TestBatchProcessorExportsFullBatchesThenTheRest(t *testing.T) {
	bothQueues(t, func(t *testing.T, encoded bool) {
		exp := &recordingExporter{}
		tp, p := batchProvider(t, exp.as(encoded), BatchConfig{ScheduleDelay: time.Hour, ExportTimeout: time.Second, MaxQueueSize: 2048, MaxExportBatchSize: 100}, sdktrace.AlwaysSample())
		endSpans(tp, 250)
		waitFor(t, "two full batches exported", func() bool { b, _ := exp.got(); return len(b) == 2 })
		time.Sleep(20 * time.Millisecond) // a partial batch must wait for the delay, not go now
		if b, n := exp.got(); len(b) != 2 || b[0] != 100 || b[1] != 100 || n != 200 {
			t.Fatalf("batches %v (%d spans), want [100 100] while 50 wait", b, n)
		}
		if err := p.ForceFlush(context.Background()); err != nil {
			t.Fatal(err)
		}
		if b, n := exp.got(); len(b) != 3 || b[2] != 50 || n != 250 {
			t.Fatalf("after ForceFlush: batches %v (%d spans), want the last 50 too", b, n)
		}
	})
}

func TestBatchProcessorExportsAfterTheDelay(t *testing.T) {
	bothQueues(t, func(t *testing.T, encoded bool) {
		exp := &recordingExporter{}
		tp, _ := batchProvider(t, exp.as(encoded), BatchConfig{ScheduleDelay: 20 * time.Millisecond, ExportTimeout: time.Second, MaxQueueSize: 2048, MaxExportBatchSize: 512}, sdktrace.AlwaysSample())
		endSpans(tp, 3)
		waitFor(t, "the 3 spans exported after the schedule delay", func() bool { _, n := exp.got(); return n == 3 })
	})
}

func TestBatchProcessorDropsWhenFullAndSaysSo(t *testing.T) {
	bothQueues(t, func(t *testing.T, encoded bool) {
		var mu sync.Mutex
		var handled []error
		prev := otel.GetErrorHandler()
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { mu.Lock(); handled = append(handled, err); mu.Unlock() }))
		t.Cleanup(func() { otel.SetErrorHandler(prev) })

		exp := &recordingExporter{block: make(chan struct{})}
		tp, p := batchProvider(t, exp.as(encoded), BatchConfig{ScheduleDelay: time.Hour, ExportTimeout: time.Second, MaxQueueSize: 20, MaxExportBatchSize: 10}, sdktrace.AlwaysSample())
		endSpans(tp, 10) // a full batch: the exporter takes it and blocks
		waitFor(t, "the first batch taken", func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.queuedLocked() == 0 })
		endSpans(tp, 25) // 20 fit, 5 are dropped
		close(exp.block)
		waitFor(t, "three batches exported", func() bool { b, _ := exp.got(); return len(b) == 3 })
		if _, n := exp.got(); n != 30 {
			t.Fatalf("%d spans exported, want 30 (10 + a full queue of 20)", n)
		}
		waitFor(t, "the drop reported", func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, err := range handled {
				if strings.Contains(err.Error(), "5 spans dropped") {
					return true
				}
			}
			return false
		})
	})
}

func TestBatchProcessorSkipsUnsampledAndShutsDown(t *testing.T) {
	bothQueues(t, func(t *testing.T, encoded bool) {
		exp := &recordingExporter{}
		p := NewBatchProcessor(exp.as(encoded), BatchConfig{ScheduleDelay: time.Hour, ExportTimeout: time.Second, MaxQueueSize: 100, MaxExportBatchSize: 50})
		recording := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(p), sdktrace.WithSampler(sdktrace.AlwaysSample()))
		unsampled := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(p),
			sdktrace.WithSampler(recordOnly{}))
		endSpans(unsampled, 5)
		endSpans(recording, 7)
		if err := p.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if b, n := exp.got(); n != 7 || len(b) != 1 || !exp.shutdown {
			t.Fatalf("Shutdown: batches %v (%d spans), exporter shut down %v; want the 7 sampled spans and a shut-down exporter", b, n, exp.shutdown)
		}
		endSpans(recording, 3)
		if err := p.Shutdown(context.Background()); err != nil {
			t.Fatalf("second Shutdown: %v", err)
		}
		if _, n := exp.got(); n != 7 {
			t.Fatalf("spans ended after Shutdown were exported (%d)", n)
		}
	})
}

// recordOnly records spans without sampling them: the processor must not export them.
type recordOnly struct{}

func (recordOnly) ShouldSample(sdktrace.SamplingParameters) sdktrace.SamplingResult {
	return sdktrace.SamplingResult{Decision: sdktrace.RecordOnly}
}
func (recordOnly) Description() string { return "record only" }

func TestBatchConfigFromEnv(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	c, err := BatchConfigFromEnv(env())
	if err != nil || c != (BatchConfig{ScheduleDelay: 5 * time.Second, ExportTimeout: 30 * time.Second, MaxQueueSize: 2048, MaxExportBatchSize: 512}) {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
	c, err = BatchConfigFromEnv(env("OTEL_BSP_SCHEDULE_DELAY", "200", "OTEL_BSP_EXPORT_TIMEOUT", "1500",
		"OTEL_BSP_MAX_QUEUE_SIZE", "100", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512"))
	if err != nil || c != (BatchConfig{ScheduleDelay: 200 * time.Millisecond, ExportTimeout: 1500 * time.Millisecond, MaxQueueSize: 100, MaxExportBatchSize: 100}) {
		t.Fatalf("set: %+v, %v (the batch is capped at the queue size)", c, err)
	}
	for _, bad := range []string{"0", "-5", "1s", "x"} {
		if _, err := BatchConfigFromEnv(env("OTEL_BSP_MAX_QUEUE_SIZE", bad)); err == nil || !strings.Contains(err.Error(), "OTEL_BSP_MAX_QUEUE_SIZE") {
			t.Errorf("OTEL_BSP_MAX_QUEUE_SIZE=%q: error %v, want one naming the variable", bad, err)
		}
	}
}

func TestBatchProcessorReportsExportErrors(t *testing.T) {
	p := NewBatchProcessor(failingExporter{}, BatchConfig{ScheduleDelay: time.Hour, ExportTimeout: time.Second, MaxQueueSize: 10, MaxExportBatchSize: 10})
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(p))
	defer tp.Shutdown(context.Background())
	endSpans(tp, 2)
	if err := p.ForceFlush(context.Background()); err == nil || !strings.Contains(err.Error(), "2 spans lost") {
		t.Fatalf("ForceFlush = %v, want the export error with the count", err)
	}
}

type failingExporter struct{}

func (failingExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error {
	return errors.New("collector down")
}
func (failingExporter) Shutdown(context.Context) error { return nil }

func TestLogErrorsWritesSDKErrorsAsWarnings(t *testing.T) {
	prev := otel.GetErrorHandler()
	t.Cleanup(func() { otel.SetErrorHandler(prev) })
	var out syncBuffer
	log, _ := NewLogger(&out, "info", "json")
	LogErrors(log)
	otel.Handle(errors.New("trace export: 3 spans lost: collector down"))
	if got := out.String(); !strings.Contains(got, `"level":"WARN"`) || !strings.Contains(got, "3 spans lost") {
		t.Fatalf("log = %q, want a JSON warning with the error", got)
	}
}

// Many goroutines ending spans while exports run lose nothing that fits the queue.
func TestBatchProcessorConcurrentEnds(t *testing.T) {
	bothQueues(t, func(t *testing.T, encoded bool) {
		exp := &recordingExporter{}
		tp, p := batchProvider(t, exp.as(encoded), BatchConfig{ScheduleDelay: 5 * time.Millisecond, ExportTimeout: time.Second, MaxQueueSize: 100000, MaxExportBatchSize: 64}, sdktrace.AlwaysSample())
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() { endSpans(tp, 1000) })
		}
		wg.Go(func() {
			for range 20 {
				p.ForceFlush(context.Background())
			}
		})
		wg.Wait()
		if err := p.ForceFlush(context.Background()); err != nil {
			t.Fatal(err)
		}
		batches, n := exp.got()
		if n != 8000 {
			t.Fatalf("%d spans exported, want 8000", n)
		}
		for _, b := range batches {
			if b > 64 {
				t.Fatalf("a batch of %d spans, above MaxExportBatchSize 64", b)
			}
		}
	})
}

// TestEncodedQueueSendsWhatExportSpansSends: spans encoded as they end and exported from the
// queue make, batch by batch, the very bytes OTLPExporter.ExportSpans makes of the same spans
// (which TestOTLPExporterMatchesOfficial holds against the official exporter): three
// resources and seven scopes interleaved, and our own span shapes.
func TestEncodedQueueSendsWhatExportSpansSends(t *testing.T) {
	for name, spans := range map[string][]sdktrace.ReadOnlySpan{
		"every field": equivalenceSpans(t),
		"our spans":   ourShapedSpans(t, 700),
	} {
		t.Run(name, func(t *testing.T) {
			var sampled []sdktrace.ReadOnlySpan
			for _, s := range spans {
				if s.SpanContext().IsSampled() {
					sampled = append(sampled, s)
				}
			}
			const batch = 300
			recv := newCapture(t, nil)
			p := NewBatchProcessor(newTestExporter(t, recv.url(), nil),
				BatchConfig{ScheduleDelay: time.Hour, ExportTimeout: 10 * time.Second, MaxQueueSize: 4096, MaxExportBatchSize: batch})
			for _, s := range sampled {
				p.OnEnd(s)
			}
			if err := p.ForceFlush(context.Background()); err != nil {
				t.Fatal(err)
			}
			reqs := recv.requests()
			if want := (len(sampled) + batch - 1) / batch; len(reqs) != want {
				t.Fatalf("%d requests for %d spans, want %d", len(reqs), len(sampled), want)
			}
			var enc spanEncoder
			for i, req := range reqs {
				want := enc.encode(readOnlySpans(sampled[i*batch : min((i+1)*batch, len(sampled))]))
				if !bytes.Equal(req.plain, want) {
					t.Errorf("request %d: %d bytes differ from ExportSpans' %d", i, len(req.plain), len(want))
				}
			}
		})
	}
}

// moveFront hands the first n encoded spans to the export and keeps the rest, in order; with
// nothing to hand over (how every export ends) it leaves the queue as it is, uncopied.
func TestEncodedQueueMoveFront(t *testing.T) {
	spans := ourShapedSpans(t, 5)
	var q, dst encodedSpans
	for _, s := range spans {
		q.push(0, readSpan(s))
	}
	holds := func(name string, got *encodedSpans, from int) {
		t.Helper()
		for i := range got.len() {
			if want := appendSpan(nil, spans[from+i]); !bytes.Equal(got.appendSpan(nil, i), want) {
				t.Errorf("%s: span %d is not span %d", name, i, from+i)
			}
		}
	}
	first := &q.data[0]
	q.moveFront(&dst, 0)
	if dst.len() != 0 || q.len() != 5 || &q.data[0] != first {
		t.Fatalf("moving 0: export %d spans, queue %d, queue copied %v; want 0, 5, false", dst.len(), q.len(), &q.data[0] != first)
	}
	q.moveFront(&dst, 2)
	if dst.len() != 2 || q.len() != 3 {
		t.Fatalf("moving 2: export %d spans, queue %d; want 2 and 3", dst.len(), q.len())
	}
	holds("export", &dst, 0)
	holds("queue", &q, 2)
	q.moveFront(&dst, 3)
	if dst.len() != 3 || q.len() != 0 {
		t.Fatalf("moving the rest: export %d spans, queue %d; want 3 and 0", dst.len(), q.len())
	}
	holds("export", &dst, 2)
}
