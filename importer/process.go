package importer

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/outbox"
)

// kind is one kind of background job the workers process in batches (imports, bulk actions):
// how to claim one, run its next batch, give it back, renew the leases of claims held, count
// it running, and recognise a batch of a claim that was lost.
type kind[J any] struct {
	name    string // "import", "bulk action": for the log
	article string // "an", "a"
	claim   func(ctx context.Context, lease time.Duration) (J, bool, error)
	batch   func(ctx context.Context, job J) (done bool, err error)
	release func(ctx context.Context, job J) error
	extend  func(ctx context.Context, claims []uuid.UUID, lease time.Duration) error
	running func(delta int)
	lost    error
	id      func(job J) (id, claim uuid.UUID)
}

// process claims one job of k and processes it batch after batch until it completes, is lost
// (cancelled or taken over), a batch fails (the job is given back, to be retried) or ctx ends
// (given back too, after the batch in hand). The claim's lease is renewed by a heartbeat of
// its own (outbox.StartHeartbeat, shared with the outbox workers) however long a batch takes,
// and stopped before the job is given back, so that no renewal follows the release. It
// reports whether another job may be due at once.
func process[J any](ctx context.Context, logger *slog.Logger, lease time.Duration, k kind[J]) bool {
	// A job claimed after a stop is given back at once, below (outbox.ClaimContext).
	cctx, cancel, ok := outbox.ClaimContext(ctx, lease)
	if !ok {
		return false
	}
	job, ok, err := k.claim(cctx, lease)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			logger.WarnContext(ctx, "claiming "+k.article+" "+k.name+" failed", "error", err)
		}
		return false
	}
	if !ok {
		return false
	}
	k.running(1)
	defer k.running(-1)
	id, claim := k.id(job)
	log := logger.With(idKey(k.name), id.String())
	hb := outbox.StartHeartbeat(ctx, lease, func(ctx context.Context, claims []uuid.UUID) error {
		return k.extend(ctx, claims, lease)
	}, func(ctx context.Context, _ int, err error) {
		log.WarnContext(ctx, "renewing "+k.article+" "+k.name+"'s lease failed; the next beat tries again", "error", err)
	}, claim)
	defer hb.Stop()
	log.InfoContext(ctx, k.name+" started")
	release := func() {
		hb.Stop()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := k.release(rctx, job); err != nil {
			log.WarnContext(ctx, "releasing "+k.article+" "+k.name+" failed; it resumes after its lease", "error", err)
		}
	}
	for ctx.Err() == nil {
		done, err := k.batch(ctx, job)
		switch {
		case errors.Is(err, k.lost):
			log.InfoContext(ctx, k.name+" stopped: cancelled or taken over")
			return true
		case err != nil:
			log.WarnContext(ctx, k.article+" "+k.name+" batch failed; it is retried", "error", err)
			release()
			return false
		case done:
			log.InfoContext(ctx, k.name+" completed")
			return true
		}
	}
	release()
	return false
}

// idKey is the log attribute of a job's id: import_id, bulk_action_id.
func idKey(name string) string {
	b := []byte(name)
	for i, c := range b {
		if c == ' ' {
			b[i] = '_'
		}
	}
	return string(b) + "_id"
}
