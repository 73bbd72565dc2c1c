package repo

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/uptrace/bun"
	"go.opentelemetry.io/otel/propagation"

	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/outbox"
)

// recordEvents appends evs to the event log and queues their webhook deliveries, in the
// caller's transaction (docs/api-contract.md §10.1, §10.4), with the caller's trace context so
// that deliveries link to the request that caused them. It reports whether any delivery was
// queued, where the engine knows (the caller then wakes the workers after its commit; where
// it does not, they poll). The deliveries wait in lane: outbox.Interactive for what one API
// call or page caused, outbox.Bulk for imports and bulk actions (docs/api-contract.md §21).
func (s *store) recordEvents(ctx context.Context, db bun.IDB, evs []model.Event, lane outbox.Lane) (bool, error) {
	if len(evs) == 0 {
		return false, nil
	}
	queued, err := s.db.eng.insertEvents(ctx, db, eventRows(ctx, evs), lane)
	return queued, translate(err)
}

// eventRows are the rows of evs, carrying ctx's trace context so that their deliveries link to
// the request that caused them.
func eventRows(ctx context.Context, evs []model.Event) []eventRow {
	tp := traceparent(ctx)
	rows := make([]eventRow, len(evs))
	for i, e := range evs {
		rows[i] = eventRow{ID: e.ID, NewsletterID: e.NewsletterID, SubscriberID: e.SubscriberID,
			Type: string(e.Type), Payload: string(e.Payload), Traceparent: tp, CreatedAt: e.Timestamp}
	}
	return rows
}

// Events reads subscribers' histories.
type Events struct {
	store
}

// NewEvents returns the event log on db.
func NewEvents(db *DB) *Events {
	return &Events{store: newStore(db)}
}

// History returns up to p.Limit events of the newsletter's subscriber id after the event
// p.After, oldest first, and whether more follow. An unknown subscriber, or another
// newsletter's, is model.ErrNotFound.
func (e *Events) History(ctx context.Context, nl, id uuid.UUID, p model.EventPage) ([]model.Event, bool, error) {
	var exists bool
	if err := e.idb.NewRaw("SELECT EXISTS (SELECT 1 FROM subscribers WHERE newsletter_id = ? AND id = ?)", nl, id).
		Scan(ctx, &exists); err != nil {
		return nil, false, translate(err)
	}
	if !exists {
		return nil, false, fmt.Errorf("%w", model.ErrNotFound)
	}
	var rows []eventRow
	q := e.idb.NewSelect().Model(&rows).Column("id", "type", "payload", "created_at").
		Where("subscriber_id = ?", id).OrderExpr("id").Limit(p.Limit + 1)
	if p.After != uuid.Nil {
		q = q.Where("id > ?", p.After)
	}
	if err := q.Scan(ctx); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, false, translate(err)
	}
	more := len(rows) > p.Limit
	if more {
		rows = rows[:p.Limit]
	}
	out := make([]model.Event, len(rows))
	for i, r := range rows {
		out[i] = model.Event{ID: r.ID, NewsletterID: nl, SubscriberID: id, Type: model.EventType(r.Type),
			Timestamp: r.CreatedAt.UTC(), Payload: []byte(r.Payload)}
	}
	return out, more, nil
}

// traceparent is ctx's trace context as a W3C traceparent, or "".
func traceparent(ctx context.Context) string {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	return carrier.Get("traceparent")
}
