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
	"github.com/subscriberd/subscriberd/outbox"
)

type webhookRow struct {
	bun.BaseModel `bun:"table:webhook_endpoints"`

	ID            uuid.UUID  `bun:"id,pk,type:uuid"`
	NewsletterID  uuid.UUID  `bun:"newsletter_id,type:uuid"`
	URL           string     `bun:"url"`
	Events        string     `bun:"events"`
	Secret        string     `bun:"secret"`
	Status        string     `bun:"status"`
	BusyUntil     time.Time  `bun:"busy_until"`
	LastClaimedAt time.Time  `bun:"last_claimed_at"`
	FailingSince  *time.Time `bun:"failing_since"`
	StaleAt       *time.Time `bun:"stale_at"`
	CreatedAt     time.Time  `bun:"created_at"`
	UpdatedAt     time.Time  `bun:"updated_at"`
}

func (r *webhookRow) toModel() model.Webhook {
	var events []model.EventType
	json.Unmarshal([]byte(r.Events), &events) //nolint:errcheck // written by Create, always a JSON array
	if events == nil {
		events = []model.EventType{}
	}
	return model.Webhook{ID: r.ID, NewsletterID: r.NewsletterID, URL: r.URL, Events: events, Secret: r.Secret,
		Status: r.Status, CreatedAt: r.CreatedAt.UTC()}
}

// Webhooks stores newsletters' webhook endpoints (docs/api-contract.md §10.3).
type Webhooks struct {
	store
}

// NewWebhooks returns the endpoint store on db.
func NewWebhooks(db *DB) *Webhooks {
	return &Webhooks{store: newStore(db)}
}

// Create stores a new enabled endpoint with a new secret. A newsletter that has
// model.MaxWebhooks endpoints already gets a *model.ValidationError (key "body"); the count is
// judged under the newsletter's row lock, so concurrent creates cannot pass it together.
func (w *Webhooks) Create(ctx context.Context, nl uuid.UUID, in model.NewWebhook) (model.Webhook, error) {
	events, err := json.Marshal(in.Events)
	if err != nil {
		return model.Webhook{}, err
	}
	now := w.now()
	row := webhookRow{ID: uuid.Must(uuid.NewV7()), NewsletterID: nl, URL: in.URL, Events: string(events),
		Secret: model.NewWebhookSecret(), Status: model.WebhookEnabled, BusyUntil: now, LastClaimedAt: now,
		CreatedAt: now, UpdatedAt: now}
	err = w.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		if _, err := w.db.eng.raw(tx, "SELECT 1 FROM newsletters WHERE id = ? FOR UPDATE", nl).Exec(ctx); err != nil {
			return translate(err)
		}
		var n int
		if err := tx.NewRaw("SELECT count(*) FROM webhook_endpoints WHERE newsletter_id = ?", nl).Scan(ctx, &n); err != nil {
			return translate(err)
		}
		if n >= model.MaxWebhooks {
			return (*model.ValidationError)(nil).Add("body", model.MsgWebhookLimit)
		}
		_, err := tx.NewInsert().Model(&row).Exec(ctx)
		return translate(err)
	})
	if err != nil {
		return model.Webhook{}, err
	}
	return row.toModel(), nil
}

// List returns the newsletter's endpoints, oldest first.
func (w *Webhooks) List(ctx context.Context, nl uuid.UUID) ([]model.Webhook, error) {
	var rows []webhookRow
	if err := w.idb.NewSelect().Model(&rows).Where("newsletter_id = ?", nl).OrderExpr("created_at, id").
		Scan(ctx); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, translate(err)
	}
	out := make([]model.Webhook, len(rows))
	for i := range rows {
		out[i] = rows[i].toModel()
	}
	return out, nil
}

// Get returns one endpoint of the newsletter, or model.ErrWebhookNotFound.
func (w *Webhooks) Get(ctx context.Context, nl, id uuid.UUID) (model.Webhook, error) {
	var row webhookRow
	err := w.idb.NewSelect().Model(&row).Where("newsletter_id = ? AND id = ?", nl, id).Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return model.Webhook{}, fmt.Errorf("%w", model.ErrWebhookNotFound)
	}
	if err != nil {
		return model.Webhook{}, translate(err)
	}
	return row.toModel(), nil
}

// Delete removes an endpoint of the newsletter and its undelivered events, and returns it as it
// was; an unknown one is model.ErrWebhookNotFound.
func (w *Webhooks) Delete(ctx context.Context, nl, id uuid.UUID) (model.Webhook, error) {
	var row webhookRow
	err := w.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		if err := tx.NewDelete().Model(&row).Where("newsletter_id = ? AND id = ?", nl, id).Returning("*").Scan(ctx); err != nil {
			return err
		}
		// No foreign key cascades (see the migration): the undelivered events go here.
		_, err := tx.NewRaw("DELETE FROM webhook_deliveries WHERE endpoint_id = ?", id).Exec(ctx)
		return err
	})
	if errors.Is(err, sql.ErrNoRows) {
		return model.Webhook{}, fmt.Errorf("%w", model.ErrWebhookNotFound)
	}
	if err != nil {
		return model.Webhook{}, translate(err)
	}
	return row.toModel(), nil
}

// Deliveries is the webhook outbox as the webhook workers use it (docs/api-contract.md
// §10.4). A claim leases endpoints, not rows: one worker at a time delivers to an endpoint,
// so a slow receiver holds one worker, and endpoints are claimed in round-robin order (the
// one claimed longest ago first), so one endpoint's backlog cannot starve the others.
type Deliveries struct {
	store
}

// NewDeliveries returns the webhook outbox on db.
func NewDeliveries(db *DB) *Deliveries {
	return &Deliveries{store: newStore(db)}
}

// Claim leases up to endpoints endpoints with due deliveries for lease, the one claimed longest
// ago first, and returns up to perEndpoint due deliveries of each: its interactive ones first,
// whatever bulk work waits for it (docs/api-contract.md §21), then its bulk ones, each lane
// oldest due first. No
// newsletter gets more than perNewsletter endpoints leased at once (docs/operating.md), so
// one newsletter's hanging receivers cannot hold every worker. Endpoints other claims hold are
// skipped, not waited for (see engine.claimDeliveries).
func (d *Deliveries) Claim(ctx context.Context, endpoints, perEndpoint, perNewsletter int, lease time.Duration) ([]model.DeliveryBatch, error) {
	now := d.now()
	c := deliveryClaim{endpoints: endpoints, perEndpoint: perEndpoint, perNewsletter: max(perNewsletter, 1), lease: lease}
	rows, err := d.db.eng.claimDeliveries(ctx, d.idb, now, c)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, translate(err)
	}
	var out []model.DeliveryBatch
	for _, r := range rows {
		if len(out) == 0 || out[len(out)-1].EndpointID != r.EndpointID {
			out = append(out, model.DeliveryBatch{EndpointID: r.EndpointID, URL: r.URL, Secret: r.Secret})
		}
		b := &out[len(out)-1]
		b.Deliveries = append(b.Deliveries, model.Delivery{EventID: r.EventID, Type: model.EventType(r.Type),
			Payload: []byte(r.Payload), Attempts: r.Attempts, Traceparent: r.Traceparent, Bulk: r.Lane == outbox.Bulk})
	}
	return out, nil
}

// Extend renews the lease of endpoints a worker still delivers to (its heartbeat). Endpoints
// whose batch was finished meanwhile are left alone.
func (d *Deliveries) Extend(ctx context.Context, endpoints []uuid.UUID, lease time.Duration) error {
	if len(endpoints) == 0 {
		return nil
	}
	now := d.now()
	_, err := d.idb.NewRaw(`UPDATE webhook_endpoints SET busy_until = ?0, stale_at = ?1
WHERE id IN (?2) AND stale_at IS NOT NULL`, now.Add(lease), now.Add(outbox.StaleAfter(lease)), bun.List(endpoints)).Exec(ctx)
	return translate(err)
}

// HeldPastHeartbeat reads, for metrics, how long the endpoint held longest past its heartbeat
// has been so (0 when none is): leased by a worker that stopped renewing its lease two beats
// ago (outbox.StaleAfter), and not taken over yet.
func (d *Deliveries) HeldPastHeartbeat(ctx context.Context) (time.Duration, error) {
	return d.heldPast(ctx, `SELECT min(stale_at) FROM webhook_endpoints WHERE stale_at <= ?0`)
}

// Finish records the outcomes of a batch delivered to endpoint and ends the endpoint's lease,
// in one transaction. gone (the receiver answered 410) disables the endpoint; so does a
// failure when every delivery to it has failed for model.WebhookFailingLimit. A disabled
// endpoint's pending deliveries fail with it. Finish reports whether it disabled the endpoint.
// Outcomes for an endpoint deleted meanwhile change nothing.
func (d *Deliveries) Finish(ctx context.Context, endpoint uuid.UUID, results []model.DeliveryResult, gone bool) (bool, error) {
	now := d.now()
	var disabled bool
	err := d.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		disabled = false
		var failingSince *time.Time
		err := d.db.eng.raw(tx, "SELECT failing_since FROM webhook_endpoints WHERE id = ? FOR NO KEY UPDATE", endpoint).
			Scan(ctx, &failingSince)
		if errors.Is(err, sql.ErrNoRows) {
			return nil // deleted: its deliveries went with it
		}
		if err != nil {
			return translate(err)
		}
		var delivered []uuid.UUID
		var failures int
		for _, r := range results {
			switch r.Outcome {
			case model.DeliveryDelivered:
				delivered = append(delivered, r.EventID)
				continue
			case model.DeliveryReleased:
				if r.Delay <= 0 {
					// Due again at once: the row stays as it is, in its place in its lane (the
					// lease was the endpoint's, not the row's), and costs no write.
					continue
				}
				_, err = tx.NewRaw(`UPDATE webhook_deliveries SET next_attempt_at = ?, updated_at = ?
WHERE endpoint_id = ? AND event_id = ? AND state = 'pending'`, now.Add(r.Delay), now, endpoint, r.EventID).Exec(ctx)
			case model.DeliveryRetry:
				failures++
				_, err = tx.NewRaw(`UPDATE webhook_deliveries
SET attempts = attempts + 1, next_attempt_at = ?, last_error = ?, last_status = ?, updated_at = ?
WHERE endpoint_id = ? AND event_id = ? AND state = 'pending'`,
					now.Add(r.Delay), r.Error, r.Status, now, endpoint, r.EventID).Exec(ctx)
			default: // failed
				failures++
				_, err = tx.NewRaw(`UPDATE webhook_deliveries
SET state = 'failed', attempts = attempts + 1, last_error = ?, last_status = ?, updated_at = ?
WHERE endpoint_id = ? AND event_id = ? AND state = 'pending'`, r.Error, r.Status, now, endpoint, r.EventID).Exec(ctx)
			}
			if err != nil {
				return translate(err)
			}
		}
		if len(delivered) > 0 {
			if _, err := tx.NewRaw(`DELETE FROM webhook_deliveries WHERE endpoint_id = ? AND event_id IN (?)`,
				endpoint, bun.List(delivered)).Exec(ctx); err != nil {
				return translate(err)
			}
		}
		if len(delivered) > 0 && failingSince != nil {
			// The receiver answers again after a run of failures: what waits for a back-off
			// step because it was down or erroring is due at once, delivered at the
			// endpoint's usual pace (one worker, PerEndpointParallel at a time). A delivery
			// it refused with another 4xx keeps its back-off.
			if _, err := tx.NewRaw(`UPDATE webhook_deliveries SET next_attempt_at = ?0, updated_at = ?0
WHERE endpoint_id = ?1 AND state = 'pending' AND next_attempt_at > ?0
    AND (last_status = 0 OR last_status >= 500 OR last_status IN (408, 425, 429))`, now, endpoint).Exec(ctx); err != nil {
				return translate(err)
			}
		}
		switch {
		case len(delivered) > 0:
			failingSince = nil
		case failures > 0 && failingSince == nil:
			failingSince = &now
		}
		disabled = gone || (failures > 0 && len(delivered) == 0 && failingSince != nil &&
			!now.Before(failingSince.Add(model.WebhookFailingLimit)))
		status := model.WebhookEnabled
		if disabled {
			status = model.WebhookDisabled
		}
		if _, err := tx.NewRaw(`UPDATE webhook_endpoints SET busy_until = ?0, stale_at = NULL, failing_since = ?1, status = ?2, updated_at = ?0
WHERE id = ?3`, now, failingSince, status, endpoint).Exec(ctx); err != nil {
			return translate(err)
		}
		if !disabled {
			return nil
		}
		_, err = tx.NewRaw(`UPDATE webhook_deliveries SET state = 'failed', last_error = 'endpoint disabled', updated_at = ?
WHERE endpoint_id = ? AND state = 'pending'`, now, endpoint).Exec(ctx)
		return translate(err)
	})
	if err != nil {
		return false, translate(err)
	}
	return disabled, nil
}

// Stats reads, for metrics, per lane (every lane, in outbox.Lanes order), how many deliveries
// wait (due or scheduled for a retry) and how long the longest-waiting due one has been due
// (0 when none is).
func (d *Deliveries) Stats(ctx context.Context) ([]outbox.LaneStats, error) {
	return d.laneStats(ctx, `SELECT lane, count(*) AS pending,
    min(next_attempt_at) FILTER (WHERE next_attempt_at <= ?0) AS oldest
FROM webhook_deliveries WHERE state = 'pending' GROUP BY lane`)
}

// Listen signals on the returned channel when this process queued deliveries (SQLite), until
// ctx ends; on PostgreSQL it returns nil and the workers poll (see engine.listen).
func (d *Deliveries) Listen(ctx context.Context) <-chan struct{} {
	return d.db.eng.listen(ctx, webhookQueue)
}
