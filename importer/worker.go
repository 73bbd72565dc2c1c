// Package importer holds the workers of subscriberd's background jobs: imports
// (docs/api-contract.md §15, Worker) and bulk actions (§20.2, BulkWorker). Both claim a job,
// one running per newsletter, keep it with a heartbeat lease and process it in batches, each
// batch one transaction with the job's progress, so that a stop or a crash resumes after the
// last committed batch: one loop for both (process.go). The loop, back-off, leases and span
// links are package outbox's, shared with the email and webhook workers.
package importer

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/outbox"
)

// Store is the import storage the workers need (repo.Imports implements it).
type Store interface {
	// Claim takes the oldest due import for lease; ok is false when none is due.
	Claim(ctx context.Context, lease time.Duration) (job model.ImportJob, ok bool, err error)
	// Batch processes the next up to size rows of job in one transaction and extends the
	// lease; done reports the import completed. A lost claim is model.ErrImportLost.
	Batch(ctx context.Context, job model.ImportJob, size int, lease time.Duration) (counts model.ImportCounts, done bool, err error)
	// Release gives the claim up so that the import is taken up again at once.
	Release(ctx context.Context, job model.ImportJob) error
	// Extend renews, for lease, the leases of the imports whose claims the worker holds (its
	// heartbeat).
	Extend(ctx context.Context, claims []uuid.UUID, lease time.Duration) error
	// SweepUploads drops uploads that stopped arriving more than age ago.
	SweepUploads(ctx context.Context, age time.Duration) error
}

// Recorder receives the workers' measurements (telemetry.Metrics implements it).
type Recorder interface {
	ImportRows(outcome string, n int64)
	ImportsRunning(delta int)
}

// Config tunes the workers; zero fields take the defaults.
type Config struct {
	// Workers is how many imports this instance processes at once (IMPORT_WORKERS, default 1).
	Workers int
	// BatchSize is the rows of one batch, one transaction (default 1000).
	BatchSize int
	// Lease is how long a claim holds unless the worker renews it (default
	// outbox.DefaultLease, 10 s): the worker's heartbeat renews it every third of it, however
	// long a batch takes, and a worker that crashed is replaced after it, within 15 s.
	Lease time.Duration
	// Interval is how often an idle worker looks for an import (default 1 s), and the pause
	// after a failed batch.
	Interval time.Duration
	// BatchTimeout bounds one batch's transaction (default 1 min).
	BatchTimeout time.Duration
	// UploadAge is when an upload that stopped arriving is dropped (default 10 min).
	UploadAge      time.Duration
	Recorder       Recorder
	Logger         *slog.Logger
	TracerProvider trace.TracerProvider
}

func (c *Config) defaults() {
	outbox.SetDefault(&c.Workers, 1)
	outbox.SetDefault(&c.BatchSize, 1000)
	outbox.SetDefault(&c.Lease, outbox.DefaultLease)
	outbox.SetDefault(&c.Interval, time.Second)
	outbox.SetDefault(&c.BatchTimeout, time.Minute)
	outbox.SetDefault(&c.UploadAge, 10*time.Minute)
	if c.Recorder == nil {
		c.Recorder = nopRecorder{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
}

type nopRecorder struct{}

func (nopRecorder) ImportRows(string, int64) {}
func (nopRecorder) ImportsRunning(int)       {}

// Worker processes imports.
type Worker struct {
	store  Store
	cfg    Config
	tracer trace.Tracer

	mu        sync.Mutex
	lastSweep time.Time
}

// NewWorker returns the workers on store.
func NewWorker(store Store, cfg Config) *Worker {
	cfg.defaults()
	return &Worker{store: store, cfg: cfg, tracer: cfg.TracerProvider.Tracer("github.com/subscriberd/subscriberd/importer")}
}

// Run runs cfg.Workers workers until ctx ends; each finishes the batch in hand first and
// gives its import back. It returns nil.
func (w *Worker) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for range w.cfg.Workers {
		wg.Go(func() { outbox.Loop(ctx, nil, w.cfg.Interval, func() bool { return w.round(ctx) }) })
	}
	wg.Wait()
	return nil
}

// round claims one import and processes it until it completes, is lost, fails or ctx ends
// (process); it reports whether another may be due at once.
func (w *Worker) round(ctx context.Context) bool {
	w.sweep(ctx)
	return process(ctx, w.cfg.Logger, w.cfg.Lease, kind[model.ImportJob]{
		name:    "import",
		article: "an",
		claim:   w.store.Claim,
		batch:   w.batch,
		release: w.store.Release,
		extend:  w.store.Extend,
		running: w.cfg.Recorder.ImportsRunning,
		lost:    model.ErrImportLost,
		id:      func(j model.ImportJob) (uuid.UUID, uuid.UUID) { return j.ID, j.Claim },
	})
}

// batch runs one batch in its span, linked to the upload's trace. The batch is not cut by
// ctx's end: it commits or rolls back within BatchTimeout.
func (w *Worker) batch(ctx context.Context, job model.ImportJob) (bool, error) {
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.BatchTimeout)
	defer cancel()
	opts := append([]trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("import.id", job.ID.String()))}, outbox.Link(job.Traceparent)...)
	bctx, span := w.tracer.Start(bctx, "import batch", opts...)
	defer span.End()
	counts, done, err := w.store.Batch(bctx, job, w.cfg.BatchSize, w.cfg.Lease)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "batch failed")
		return false, err
	}
	span.SetAttributes(attribute.Int64("import.rows", counts.Processed), attribute.Int64("import.created", counts.Created),
		attribute.Int64("import.existing", counts.Existing), attribute.Int64("import.suppressed", counts.Suppressed),
		attribute.Int64("import.invalid", counts.Invalid), attribute.Bool("import.completed", done))
	r := w.cfg.Recorder
	r.ImportRows(model.RowCreated, counts.Created)
	r.ImportRows(model.RowExisting, counts.Existing)
	r.ImportRows(model.RowSuppressed, counts.Suppressed)
	r.ImportRows(model.RowInvalid, counts.Invalid)
	return done, nil
}

// sweep drops abandoned uploads, at most once a minute per instance.
func (w *Worker) sweep(ctx context.Context) {
	w.mu.Lock()
	due := time.Since(w.lastSweep) > time.Minute
	if due {
		w.lastSweep = time.Now()
	}
	w.mu.Unlock()
	if !due {
		return
	}
	if err := w.store.SweepUploads(ctx, w.cfg.UploadAge); err != nil && ctx.Err() == nil {
		w.cfg.Logger.WarnContext(ctx, "dropping abandoned uploads failed", "error", err)
	}
}
