package telemetry

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// BatchProcessor queues ended, sampled spans and hands them to an exporter in batches: when
// MaxExportBatchSize spans are waiting, or ScheduleDelay after the last export. It does what
// the SDK's BatchSpanProcessor does, with the same OTEL_BSP_* settings, but without a channel
// send per span: the SDK's processor passes every span through a channel to its goroutine, which
// wakes for each one — at two spans per request, a goroutine switch and a futex wake-up per
// span were a visible share of the cost of tracing. Here a span is appended to a slice under a
// mutex, and the goroutine wakes once per batch.
//
// With an OTLPExporter, spans are encoded as they end and the queue holds bytes (see
// encodedExporter).
//
// When the queue is full, spans are dropped and counted; the count is reported through
// otel.Handle at the next export.
type BatchProcessor struct {
	exp    sdktrace.SpanExporter
	encExp encodedExporter // exp, when it takes encoded spans
	cfg    BatchConfig

	mu      sync.Mutex
	queue   []sdktrace.ReadOnlySpan
	encoded encodedSpans // the queue, with encExp
	dropped int

	exportMu     sync.Mutex              // one export at a time; guards batch and encodedBatch
	batch        []sdktrace.ReadOnlySpan // the batch being exported, reused
	encodedBatch encodedSpans

	kick     chan struct{} // a full batch is waiting
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
	stopped  atomic.Bool
}

// BatchConfig holds the batching settings, named after their OTEL_BSP_* variables.
type BatchConfig struct {
	ScheduleDelay      time.Duration // OTEL_BSP_SCHEDULE_DELAY, ms; default 5000
	ExportTimeout      time.Duration // OTEL_BSP_EXPORT_TIMEOUT, ms; default 30000
	MaxQueueSize       int           // OTEL_BSP_MAX_QUEUE_SIZE; default 2048
	MaxExportBatchSize int           // OTEL_BSP_MAX_EXPORT_BATCH_SIZE; default 512, at most MaxQueueSize
}

// BatchConfigFromEnv reads the OTEL_BSP_* variables through getenv; an invalid value is an
// error naming its variable.
func BatchConfigFromEnv(getenv func(string) string) (BatchConfig, error) {
	c := BatchConfig{ScheduleDelay: 5 * time.Second, ExportTimeout: 30 * time.Second, MaxQueueSize: 2048, MaxExportBatchSize: 512}
	for _, v := range []struct {
		name string
		ms   *time.Duration
		n    *int
	}{
		{name: "OTEL_BSP_SCHEDULE_DELAY", ms: &c.ScheduleDelay},
		{name: "OTEL_BSP_EXPORT_TIMEOUT", ms: &c.ExportTimeout},
		{name: "OTEL_BSP_MAX_QUEUE_SIZE", n: &c.MaxQueueSize},
		{name: "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", n: &c.MaxExportBatchSize},
	} {
		s := strings.TrimSpace(getenv(v.name))
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			return c, fmt.Errorf("%s: %q is not a positive integer", v.name, s)
		}
		if v.ms != nil {
			*v.ms = time.Duration(n) * time.Millisecond
		} else {
			*v.n = n
		}
	}
	c.MaxExportBatchSize = min(c.MaxExportBatchSize, c.MaxQueueSize)
	return c, nil
}

// NewBatchProcessor starts a processor that exports to exp; Shutdown stops it.
func NewBatchProcessor(exp sdktrace.SpanExporter, cfg BatchConfig) *BatchProcessor {
	p := &BatchProcessor{
		exp:   exp,
		cfg:   cfg,
		queue: make([]sdktrace.ReadOnlySpan, 0, cfg.MaxExportBatchSize),
		batch: make([]sdktrace.ReadOnlySpan, 0, cfg.MaxExportBatchSize),
		kick:  make(chan struct{}, 1),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	p.encExp, _ = exp.(encodedExporter)
	go p.run()
	return p
}

var _ sdktrace.SpanProcessor = (*BatchProcessor)(nil)

// OnStart does nothing: spans are queued when they end.
func (p *BatchProcessor) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd queues a sampled span, or drops it when the queue is full or the processor stopped.
// With an encoding exporter the span is encoded straight into the queue: under the lock, for
// about a microsecond a span, which two cores ending a few thousand spans a second seldom
// contend for, rather than into a pooled buffer first and then copied.
func (p *BatchProcessor) OnEnd(s sdktrace.ReadOnlySpan) {
	var sd *spanData // s's data, when it is encoded here
	var resKey attribute.Distinct
	var sampled bool
	if p.encExp != nil {
		// In place when it can be: each accessor of the SDK's snapshot copies all of it.
		sd = readSpan(s)
		resKey = sd.resource.Equivalent()
		sampled = sd.spanContext.IsSampled()
	} else {
		sampled = s.SpanContext().IsSampled()
	}
	if !sampled || p.stopped.Load() {
		return
	}
	p.mu.Lock()
	if p.queuedLocked() >= p.cfg.MaxQueueSize {
		p.dropped++
		p.mu.Unlock()
		return
	}
	if sd != nil {
		p.encoded.push(p.keyLocked(resKey, sd), sd)
	} else {
		p.queue = append(p.queue, s)
	}
	full := p.queuedLocked() == p.cfg.MaxExportBatchSize
	p.mu.Unlock()
	if full {
		p.kickRun()
	}
}

// keyLocked is the index of sd's resource (whose key is resKey) and scope in the encoded
// queue's table, added if new; p.mu is held.
func (p *BatchProcessor) keyLocked(resKey attribute.Distinct, sd *spanData) int32 {
	for i := range p.encoded.keys { // a handful: one resource, a scope per instrumented package
		if e := &p.encoded.keys[i]; e.resKey == resKey && e.scope == sd.instrumentationScope {
			return int32(i)
		}
	}
	p.encoded.keys = append(p.encoded.keys, spanKey{resKey: resKey, res: sd.resource, scope: sd.instrumentationScope})
	return int32(len(p.encoded.keys) - 1)
}

// queuedLocked is the number of spans waiting; p.mu is held.
func (p *BatchProcessor) queuedLocked() int {
	if p.encExp != nil {
		return len(p.encoded.spans)
	}
	return len(p.queue)
}

// kickRun tells the export goroutine that a full batch is waiting.
func (p *BatchProcessor) kickRun() {
	select {
	case p.kick <- struct{}{}:
	default: // already kicked
	}
}

func (p *BatchProcessor) run() {
	defer close(p.done)
	t := time.NewTimer(p.cfg.ScheduleDelay)
	defer t.Stop()
	for {
		all := false
		select {
		case <-p.stop:
			return
		case <-p.kick: // full batches only: the rest waits for more spans or the delay
		case <-t.C:
			all = true
		}
		if err := p.export(context.Background(), all); err != nil {
			otel.Handle(err)
		}
		if all {
			t.Reset(p.cfg.ScheduleDelay)
		}
	}
}

// export sends what is queued in batches of MaxExportBatchSize, and the last, smaller batch
// too when all is set.
func (p *BatchProcessor) export(ctx context.Context, all bool) error {
	p.exportMu.Lock()
	defer p.exportMu.Unlock()
	var errs []error
	for {
		p.mu.Lock()
		n := min(p.queuedLocked(), p.cfg.MaxExportBatchSize)
		if !all && n < p.cfg.MaxExportBatchSize {
			n = 0
		}
		if p.encExp != nil {
			p.encoded.moveFront(&p.encodedBatch, n)
		} else {
			p.batch = append(p.batch[:0], p.queue[:n]...)
			rest := copy(p.queue, p.queue[n:])
			clear(p.queue[rest:])
			p.queue = p.queue[:rest]
		}
		dropped := p.dropped
		p.dropped = 0
		p.mu.Unlock()
		if dropped > 0 {
			errs = append(errs, fmt.Errorf("trace export: queue full, %d spans dropped (OTEL_BSP_MAX_QUEUE_SIZE=%d)", dropped, p.cfg.MaxQueueSize))
		}
		if n == 0 {
			break
		}
		ectx, cancel := context.WithTimeout(ctx, p.cfg.ExportTimeout)
		var err error
		if p.encExp != nil {
			err = p.encExp.exportEncoded(ectx, &p.encodedBatch)
			p.encodedBatch.release()
		} else {
			err = p.exp.ExportSpans(ectx, p.batch)
			clear(p.batch) // let the spans go
		}
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("trace export: %d spans lost: %w", n, err))
		}
		if ctx.Err() != nil {
			errs = append(errs, ctx.Err())
			break
		}
	}
	return errors.Join(errs...)
}

// ForceFlush exports every queued span now.
func (p *BatchProcessor) ForceFlush(ctx context.Context) error {
	return p.export(ctx, true)
}

// Shutdown stops queueing, exports what is queued and shuts the exporter down. Later calls do
// nothing.
func (p *BatchProcessor) Shutdown(ctx context.Context) error {
	var err error
	p.stopOnce.Do(func() {
		p.stopped.Store(true)
		close(p.stop)
		select {
		case <-p.done:
		case <-ctx.Done():
		}
		err = errors.Join(p.export(ctx, true), p.exp.Shutdown(ctx))
	})
	return err
}
