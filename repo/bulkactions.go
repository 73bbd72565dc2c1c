package repo

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	"github.com/subscriberd/subscriberd/model"
)

// bulkActionRow is one bulk action (docs/api-contract.md §20.2).
type bulkActionRow struct {
	bun.BaseModel `bun:"table:bulk_actions"`

	ID           uuid.UUID  `bun:"id,pk,type:uuid"`
	NewsletterID uuid.UUID  `bun:"newsletter_id,type:uuid"`
	Action       string     `bun:"action"`
	Tags         string     `bun:"tags"`       // JSON array
	Attributes   string     `bun:"attributes"` // JSON object, the merge patch
	Target       string     `bun:"target"`     // JSON model.BulkTarget
	State        string     `bun:"state"`
	KeyPrefix    string     `bun:"key_prefix"`
	Traceparent  string     `bun:"traceparent"`
	Staged       bool       `bun:"staged"`
	Matched      int64      `bun:"matched"`
	Processed    int64      `bun:"processed"`
	Changed      int64      `bun:"changed"`
	Unchanged    int64      `bun:"unchanged"`
	Claim        *uuid.UUID `bun:"claim,type:uuid"`
	LeaseUntil   *time.Time `bun:"lease_until"`
	CreatedAt    time.Time  `bun:"created_at"`
	UpdatedAt    time.Time  `bun:"updated_at"`
	StartedAt    *time.Time `bun:"started_at"`
	FinishedAt   *time.Time `bun:"finished_at"`
}

func (r *bulkActionRow) toModel() model.BulkAction {
	return model.BulkAction{ID: r.ID, NewsletterID: r.NewsletterID, Action: r.Action, State: r.State,
		Counts:    model.BulkCounts{Matched: r.Matched, Processed: r.Processed, Changed: r.Changed, Unchanged: r.Unchanged},
		CreatedAt: r.CreatedAt.UTC(), StartedAt: utcPtr(r.StartedAt), FinishedAt: utcPtr(r.FinishedAt)}
}

// change is the row's change, as the request gave it.
func (r *bulkActionRow) change() (model.BulkChange, error) {
	c := model.BulkChange{Action: r.Action}
	if err := json.Unmarshal([]byte(r.Tags), &c.Tags); err != nil {
		return c, fmt.Errorf("the tags of bulk action %s: %w", r.ID, err)
	}
	attrs, err := model.DecodeAttributes([]byte(r.Attributes))
	if err != nil {
		return c, fmt.Errorf("the attributes of bulk action %s: %w", r.ID, err)
	}
	if len(attrs) > 0 {
		c.Attributes = model.AttributesPatch(attrs)
	}
	return c, nil
}

// BulkActions stores bulk actions: the actions, their targets once started, their progress.
type BulkActions struct {
	store
}

// NewBulkActions returns the bulk action store on db.
func NewBulkActions(db *DB) *BulkActions {
	return &BulkActions{store: newStore(db)}
}

// BulkActions returns the bulk action store bound to the unit of work.
func (t Tx) BulkActions() *BulkActions { return &BulkActions{store: t.store()} }

// Create stores a new queued bulk action. Its targets are chosen when a worker starts it.
func (s *BulkActions) Create(ctx context.Context, in model.NewBulkAction) (model.BulkAction, error) {
	now := s.now()
	tags := in.Tags
	if tags == nil {
		tags = []string{}
	}
	tagsJSON, _ := json.Marshal(tags) // strings
	attrs := patchJSON(in.Attributes)
	target, err := json.Marshal(in.Target)
	if err != nil {
		return model.BulkAction{}, fmt.Errorf("bulk action target: %w", err)
	}
	row := bulkActionRow{ID: uuid.Must(uuid.NewV7()), NewsletterID: in.NewsletterID, Action: in.Action,
		Tags: string(tagsJSON), Attributes: attrs, Target: string(target), State: model.BulkQueued,
		KeyPrefix: in.KeyPrefix, Traceparent: in.Traceparent, CreatedAt: now, UpdatedAt: now}
	if _, err := s.idb.NewInsert().Model(&row).Exec(ctx); err != nil {
		return model.BulkAction{}, translate(err)
	}
	return row.toModel(), nil
}

// patchJSON writes a merge patch as a JSON object, its removals as null.
func patchJSON(p model.AttributesPatch) string {
	if p == nil {
		return "{}"
	}
	b, _ := json.Marshal(map[string]any(p)) // strings, json.Numbers, booleans and nils
	return string(b)
}

// Get returns the newsletter's bulk action id; an unknown one is model.ErrBulkActionNotFound.
func (s *BulkActions) Get(ctx context.Context, nl, id uuid.UUID) (model.BulkAction, error) {
	var row bulkActionRow
	err := s.idb.NewSelect().Model(&row).Where("id = ? AND newsletter_id = ?", id, nl).Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return model.BulkAction{}, fmt.Errorf("%w", model.ErrBulkActionNotFound)
	}
	if err != nil {
		return model.BulkAction{}, translate(err)
	}
	return row.toModel(), nil
}

// List returns up to limit+1 of the newsletter's bulk actions, newest first, after the
// position after (nil: from the newest).
func (s *BulkActions) List(ctx context.Context, nl uuid.UUID, limit int, after *model.Position) ([]model.BulkAction, error) {
	var rows []bulkActionRow
	q := s.idb.NewSelect().Model(&rows).Where("newsletter_id = ?", nl).
		OrderExpr("created_at DESC, id DESC").Limit(limit + 1)
	if after != nil {
		q = q.Where("(created_at < ? OR (created_at = ? AND id < ?))", after.CreatedAt.UTC(), after.CreatedAt.UTC(), after.ID)
	}
	if err := q.Scan(ctx); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, translate(err)
	}
	out := make([]model.BulkAction, len(rows))
	for i := range rows {
		out[i] = rows[i].toModel()
	}
	return out, nil
}

// Cancel cancels the newsletter's queued or running bulk action id: changes already made
// stay, the targets not yet handled are dropped. A finished one is
// model.ErrBulkActionFinished.
func (s *BulkActions) Cancel(ctx context.Context, nl, id uuid.UUID) (model.BulkAction, error) {
	var row bulkActionRow
	if err := cancelJob(ctx, &s.store, bulkJobs, "bulk_action_targets", "action_id", "", nl, id, &row,
		model.ErrBulkActionNotFound, model.ErrBulkActionFinished); err != nil {
		return model.BulkAction{}, translate(err)
	}
	return row.toModel(), nil
}

// Claim takes the oldest bulk action that is due for a worker, for lease, as Imports.Claim
// takes imports (claimJob).
func (s *BulkActions) Claim(ctx context.Context, lease time.Duration) (model.BulkJob, bool, error) {
	var r bulkActionRow
	claim, ok, err := claimJob(ctx, &s.store, bulkJobs, lease, &r)
	if !ok {
		return model.BulkJob{}, false, err
	}
	return model.BulkJob{BulkAction: r.toModel(), Claim: claim, Traceparent: r.Traceparent}, true, nil
}

// Release gives up job's claim, so that the action is taken up again at once.
func (s *BulkActions) Release(ctx context.Context, job model.BulkJob) error {
	return bulkJobs.release(ctx, &s.store, job.ID, job.Claim)
}

// Extend renews the lease of the running actions whose claims a worker holds (its heartbeat;
// jobTable.extend).
func (s *BulkActions) Extend(ctx context.Context, claims []uuid.UUID, lease time.Duration) error {
	return bulkJobs.extend(ctx, &s.store, claims, lease)
}

// Batch runs the next step of job in one transaction with the action's progress, extending
// the lease. The first stages the targets (engine.stageBulk: the subscribers matching the
// target now, which fixes matched); each later one changes the next up to size of them as the
// single operation would (engine.bulkBatch), with their events and webhook deliveries in the
// bulk lane. It returns what this batch counted and whether the action is finished. A worker
// that no longer holds the action gets model.ErrBulkActionLost, and nothing is stored.
func (s *BulkActions) Batch(ctx context.Context, job model.BulkJob, size int, lease time.Duration) (model.BulkCounts, bool, error) {
	var (
		counts     model.BulkCounts
		done       bool
		delivering bool
	)
	err := s.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		counts, done, delivering = model.BulkCounts{}, false, false
		var cur bulkActionRow
		err := s.db.eng.raw(tx, "SELECT * FROM bulk_actions WHERE id = ? FOR NO KEY UPDATE", job.ID).Scan(ctx, &cur)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w", model.ErrBulkActionLost)
		}
		if err != nil {
			return err
		}
		if cur.State != model.BulkRunning || cur.Claim == nil || *cur.Claim != job.Claim {
			return fmt.Errorf("%w", model.ErrBulkActionLost)
		}
		now := s.now()
		cur.UpdatedAt = now
		leaseUntil := now.Add(lease)
		cur.LeaseUntil = &leaseUntil
		if !cur.Staged {
			var target model.BulkTarget
			if err := json.Unmarshal([]byte(cur.Target), &target); err != nil {
				return fmt.Errorf("the target of bulk action %s: %w", cur.ID, err)
			}
			n, err := s.db.eng.stageBulk(ctx, tx, cur.ID, cur.NewsletterID, target)
			if err != nil {
				return err
			}
			cur.Staged, cur.Matched = true, n
			counts.Matched = n
		} else {
			change, err := cur.change()
			if err != nil {
				return err
			}
			src := model.APISource(cur.KeyPrefix)
			c, d, err := s.db.eng.bulkBatch(ctx, tx, bulkBatch{Action: cur.ID, Newsletter: cur.NewsletterID,
				After: cur.Processed, Last: cur.Processed + int64(size), Now: now, Traceparent: traceparent(ctx),
				Source: src, SourceJSON: eventSourceJSON(src), Change: change})
			if err != nil {
				return err
			}
			delivering = d
			counts = model.BulkCounts{Processed: c.Processed, Changed: c.Changed, Unchanged: c.Processed - c.Changed}
			cur.Processed += counts.Processed
			cur.Changed += counts.Changed
			cur.Unchanged += counts.Unchanged
		}
		if cur.Processed >= cur.Matched {
			done = true
			cur.State, cur.FinishedAt, cur.Claim, cur.LeaseUntil = model.BulkCompleted, &now, nil, nil
		}
		if _, err := tx.NewUpdate().Model(&cur).
			Column("state", "staged", "matched", "processed", "changed", "unchanged", "claim", "lease_until", "updated_at", "finished_at").
			WherePK().Exec(ctx); err != nil {
			return err
		}
		if done {
			_, err := tx.NewDelete().Table("bulk_action_targets").Where("action_id = ?", cur.ID).Exec(ctx)
			return err
		}
		return nil
	})
	if err != nil {
		return model.BulkCounts{}, false, translate(err)
	}
	s.deliveriesQueued(delivering)
	return counts, done, nil
}
