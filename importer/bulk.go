package importer

import (
	"context"
	"sync"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/outbox"
)

// BulkStore is the bulk action storage the workers need (repo.BulkActions implements it),
// the counterpart of Store.
type BulkStore interface {
	// Claim takes the oldest due bulk action for lease; ok is false when none is due.
	Claim(ctx context.Context, lease time.Duration) (job model.BulkJob, ok bool, err error)
	// Batch runs the next step of job in one transaction (the first stages its targets, each
	// later one changes up to size subscribers) and extends the lease; done reports the
	// action completed. A lost claim is model.ErrBulkActionLost.
	Batch(ctx context.Context, job model.BulkJob, size int, lease time.Duration) (counts model.BulkCounts, done bool, err error)
	// Release gives the claim up so that the action is taken up again at once.
	Release(ctx context.Context, job model.BulkJob) error
	// Extend renews the leases of the actions whose claims the worker holds (its heartbeat).
	Extend(ctx context.Context, claims []uuid.UUID, lease time.Duration) error
}

// BulkRecorder receives the bulk workers' measurements (telemetry.Metrics implements it).
type BulkRecorder interface {
	BulkActionRows(action, outcome string, n int64)
	BulkActionsRunning(delta int)
}

// BulkConfig tunes the bulk action workers; zero fields take the defaults of Config.
type BulkConfig struct {
	// Workers is how many bulk actions this instance processes at once (BULK_ACTION_WORKERS,
	// default 1): actions of different newsletters run side by side up to it.
	Workers int
	// BatchSize is the subscribers of one batch, one transaction (default 5000).
	BatchSize    int
	Lease        time.Duration
	Interval     time.Duration
	BatchTimeout time.Duration
	Recorder     BulkRecorder
	// The logger and tracer provider are Config's.
	Config
}

type nopBulkRecorder struct{}

func (nopBulkRecorder) BulkActionRows(string, string, int64) {}
func (nopBulkRecorder) BulkActionsRunning(int)               {}

// BulkWorker processes bulk actions (docs/api-contract.md §20.2) on the loop, claims, leases
// and heartbeats the import workers use (process).
type BulkWorker struct {
	store  BulkStore
	cfg    BulkConfig
	tracer trace.Tracer
}

// NewBulkWorker returns the bulk action workers on store.
func NewBulkWorker(store BulkStore, cfg BulkConfig) *BulkWorker {
	cfg.Config.defaults()
	outbox.SetDefault(&cfg.Workers, 1)
	outbox.SetDefault(&cfg.BatchSize, 5000)
	outbox.SetDefault(&cfg.Lease, cfg.Config.Lease)
	outbox.SetDefault(&cfg.Interval, cfg.Config.Interval)
	outbox.SetDefault(&cfg.BatchTimeout, cfg.Config.BatchTimeout)
	if cfg.Recorder == nil {
		cfg.Recorder = nopBulkRecorder{}
	}
	return &BulkWorker{store: store, cfg: cfg, tracer: cfg.TracerProvider.Tracer("github.com/subscriberd/subscriberd/importer")}
}

// Run runs cfg.Workers workers until ctx ends; each finishes the batch in hand first and
// gives its action back. It returns nil.
func (w *BulkWorker) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for range w.cfg.Workers {
		wg.Go(func() {
			outbox.Loop(ctx, nil, w.cfg.Interval, func() bool {
				return process(ctx, w.cfg.Logger, w.cfg.Lease, kind[model.BulkJob]{
					name:    "bulk action",
					article: "a",
					claim:   w.store.Claim,
					batch:   w.batch,
					release: w.store.Release,
					extend:  w.store.Extend,
					running: w.cfg.Recorder.BulkActionsRunning,
					lost:    model.ErrBulkActionLost,
					id:      func(j model.BulkJob) (uuid.UUID, uuid.UUID) { return j.ID, j.Claim },
				})
			})
		})
	}
	wg.Wait()
	return nil
}

// batch runs one batch in its span, linked to the request's trace. The batch is not cut by
// ctx's end: it commits or rolls back within BatchTimeout.
func (w *BulkWorker) batch(ctx context.Context, job model.BulkJob) (bool, error) {
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.BatchTimeout)
	defer cancel()
	opts := append([]trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("bulk_action.id", job.ID.String()),
			attribute.String("bulk_action.action", job.Action))}, outbox.Link(job.Traceparent)...)
	bctx, span := w.tracer.Start(bctx, "bulk action batch", opts...)
	defer span.End()
	counts, done, err := w.store.Batch(bctx, job, w.cfg.BatchSize, w.cfg.Lease)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "batch failed")
		return false, err
	}
	span.SetAttributes(attribute.Int64("bulk_action.matched", counts.Matched),
		attribute.Int64("bulk_action.processed", counts.Processed), attribute.Int64("bulk_action.changed", counts.Changed),
		attribute.Int64("bulk_action.unchanged", counts.Unchanged), attribute.Bool("bulk_action.completed", done))
	w.cfg.Recorder.BulkActionRows(job.Action, model.BulkChanged, counts.Changed)
	w.cfg.Recorder.BulkActionRows(job.Action, model.BulkUnchanged, counts.Unchanged)
	return done, nil
}
