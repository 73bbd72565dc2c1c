package repo

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/outbox"
)

// Outbox states besides those in subscribers.go.
const (
	StateSent   = "sent"
	StateFailed = "failed"
)

// Outbox is the transactional outbox of confirmation emails as the email worker uses it: it
// implements mail.Outbox. Claims are leases, committed at once; the email is sent outside any
// transaction, and its outcome recorded afterwards. Times come from the service's clock, like
// every timestamp of the schema.
type Outbox struct {
	store
}

// NewOutbox returns the outbox on db.
func NewOutbox(db *DB) *Outbox {
	return &Outbox{store: newStore(db)}
}

// Claim leases up to limit due pending emails: their next attempt moves to now+lease, which
// hides them from every other claim until then. Rows another transaction holds are skipped,
// not waited for. The interactive lane is served first, oldest due first, whatever the bulk
// lane holds (docs/api-contract.md §21); what is left of limit goes to the bulk lane, where the
// newsletters take turns: each newsletter's oldest due email, then each one's second, and so
// on, so that one newsletter's import of 100,000 emails does not hold up another's.
func (o *Outbox) Claim(ctx context.Context, limit int, lease time.Duration) ([]model.OutboxEmail, error) {
	now := o.now()
	rows, err := o.db.eng.claimEmails(ctx, o.idb, now, outbox.Interactive, limit, lease)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, translate(err)
	}
	if len(rows) < limit {
		bulk, err := o.db.eng.claimEmails(ctx, o.idb, now, outbox.Bulk, limit-len(rows), lease)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			if len(rows) == 0 {
				return nil, translate(err)
			}
			// The interactive emails are leased already: send them; the bulk ones wait for
			// the next claim.
		}
		rows = append(rows, bulk...)
	}
	out := make([]model.OutboxEmail, len(rows))
	for i, r := range rows {
		out[i] = model.OutboxEmail{
			ID: r.ID, NewsletterID: r.NewsletterID, NewsletterName: r.NewsletterName,
			SubscriberID: r.SubscriberID, Email: r.Email, FirstName: r.FirstName, LastName: r.LastName,
			Kind: r.Kind, Attempts: r.Attempts, Unanswered: r.Unanswered, Traceparent: r.Traceparent, CreatedAt: r.CreatedAt.UTC(),
		}
	}
	return out, nil
}

// IssueToken stores the hash of a new confirmation token for e, valid for ttl, and retires
// every other token of the subscriber, in one transaction that holds the subscriber's row so it
// cannot change meanwhile. It fails with model.ErrEmailObsolete when the subscriber is no longer
// pending or the email is no longer pending (cancelled by a later change).
func (o *Outbox) IssueToken(ctx context.Context, e model.OutboxEmail, hash []byte, ttl time.Duration) error {
	now := o.now()
	err := o.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		// Locks in the order every writer of a subscriber uses: subscriber, outbox, tokens.
		if err := o.stillWanted(ctx, tx, e); err != nil {
			return err
		}
		if _, err := tx.NewRaw(`UPDATE confirmation_tokens SET retired_at = ?
WHERE subscriber_id = ? AND retired_at IS NULL`, now, e.SubscriberID).Exec(ctx); err != nil {
			return translate(err)
		}
		_, err := tx.NewRaw(`INSERT INTO confirmation_tokens (hash, subscriber_id, outbox_id, created_at, expires_at)
VALUES (?, ?, ?, ?, ?)`, hash, e.SubscriberID, e.ID, now, now.Add(ttl)).Exec(ctx)
		return translate(err)
	})
	if err != nil && !errors.Is(err, model.ErrEmailObsolete) {
		return translate(err)
	}
	return err
}

// CommitSend is the step that commits to sending e: in one transaction it locks e's
// subscriber (FOR UPDATE, the first lock of every writer of a subscriber), checks that the
// subscriber and e are still pending, calls accept — the SMTP server's acceptance of the
// message, the end of its DATA — and records e as sent. An unsubscribe, a change or a
// confirmation that races the send therefore commits either before this step (e is found no
// longer wanted: model.ErrEmailObsolete, accept is not called, nothing is sent) or after the
// server accepted the email, never in between. The subscriber's row is held only while the
// server answers the end of DATA, bounded by the SMTP timeout; on SQLite the transaction holds
// the database's write lock as long. An error from accept is returned as is and nothing is
// recorded. accept is called at most once, even when the transaction runs again after a
// deadlock. When mailed is set (a server, not the log of a service without SMTP, takes the
// email) the same transaction records the subscriber.confirmation_sent event
// (docs/api-contract.md §10.1).
func (o *Outbox) CommitSend(ctx context.Context, e model.OutboxEmail, mailed bool, accept func() error) error {
	var called, delivering bool
	var acceptErr error
	once := func() error {
		if !called {
			called, acceptErr = true, accept()
		}
		return acceptErr
	}
	err := o.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		if err := o.stillWanted(ctx, tx, e); err != nil {
			return err
		}
		// The confirmation_sent event (docs/api-contract.md §10.1), with the subscriber as it is
		// (its row is held since stillWanted). It is written before the server is asked, so
		// that after the server accepts only the outbox update and the commit remain, as
		// without it; a refusal rolls it back.
		if mailed {
			var sub subscriberRow
			if err := tx.NewSelect().Model(&sub).Where("id = ?", e.SubscriberID).Scan(ctx); err != nil {
				return translate(err)
			}
			var err error
			if delivering, err = o.recordEvents(ctx, tx, []model.Event{model.NewEvent(model.EventConfirmationSent, sub.toModel(),
				nil, model.EventSource{Kind: model.SourceEmail}, o.now())}, outbox.Interactive); err != nil {
				return err
			}
		}
		if err := once(); err != nil {
			return err
		}
		_, err := tx.NewRaw(`UPDATE email_outbox
SET state = 'sent', attempts = attempts + 1, sent_at = ?0, updated_at = ?0, last_error = ''
WHERE id = ?1`, o.now(), e.ID).Exec(ctx)
		return translate(err)
	})
	if err != nil && !errors.Is(err, model.ErrEmailObsolete) && (!called || acceptErr == nil) {
		return translate(err)
	}
	if err == nil {
		o.deliveriesQueued(delivering)
	}
	return err
}

// stillWanted locks e's subscriber and fails with model.ErrEmailObsolete unless the subscriber
// and e are both still pending.
func (o *Outbox) stillWanted(ctx context.Context, tx bun.IDB, e model.OutboxEmail) error {
	var status, state, email string
	err := o.db.eng.raw(tx, "SELECT status, email FROM subscribers WHERE id = ? FOR UPDATE", e.SubscriberID).Scan(ctx, &status, &email)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("subscriber gone: %w", model.ErrEmailObsolete)
	}
	if err != nil {
		return translate(err)
	}
	err = tx.NewRaw("SELECT state FROM email_outbox WHERE id = ?", e.ID).Scan(ctx, &state)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("email gone: %w", model.ErrEmailObsolete)
	}
	if err != nil {
		return translate(err)
	}
	if status != string(model.StatusPending) || state != StatePending {
		return fmt.Errorf("subscriber %s, email %s: %w", status, state, model.ErrEmailObsolete)
	}
	// The last check (docs/api-contract.md §13): nothing is sent to a suppressed address,
	// whatever raced with the suppression. A suppression that unsubscribes this subscriber
	// waits for the row lock held here, so it commits after this send or is seen above.
	found, err := findByHashes(ctx, tx, e.NewsletterID, model.EmailHashes(email))
	if err != nil {
		return err
	}
	if len(found) > 0 {
		return fmt.Errorf("%w: %w", model.ErrEmailObsolete, model.ErrEmailSuppressed)
	}
	return nil
}

// Bounce records a hard bounce of e (docs/api-contract.md §13): the SMTP server refused its
// recipient for good with reply. In one transaction the email fails, the address is suppressed
// with reason hard_bounce, and the subscriber, if still active or pending with that address,
// becomes unsubscribed with its event. It reports whether the suppression is new.
func (o *Outbox) Bounce(ctx context.Context, e model.OutboxEmail, reply string) (bool, error) {
	var created, delivering bool
	err := o.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		created, delivering = false, false
		now := o.now()
		if _, err := tx.NewRaw(`UPDATE email_outbox
SET state = 'failed', attempts = attempts + 1, last_error = ?0, updated_at = ?1
WHERE id = ?2 AND state = 'pending'`, "hard bounce: "+reply, now, e.ID).Exec(ctx); err != nil {
			return translate(err)
		}
		if err := o.lockEmails(ctx, tx, e.NewsletterID, []string{e.Email}); err != nil {
			return err
		}
		_, isNew, err := insertSuppression(ctx, tx, e.NewsletterID, model.NewSuppression{Email: e.Email,
			Reason: model.ReasonHardBounce, Source: model.SMTPSuppressionSource(reply)}, now)
		if err != nil {
			return err
		}
		created = isNew
		delivering, err = o.unsubscribeSuppressed(ctx, tx, e.NewsletterID, e.Email,
			model.EventSource{Kind: model.SourceSuppression, Reason: string(model.ReasonHardBounce)}, now)
		return err
	})
	if err != nil {
		return false, translate(err)
	}
	o.deliveriesQueued(delivering)
	return created, nil
}

// Extend renews the lease of claimed emails the worker still holds (its heartbeat): their
// next attempt moves to now+lease. Emails no longer pending are left alone.
func (o *Outbox) Extend(ctx context.Context, ids []uuid.UUID, lease time.Duration) error {
	if len(ids) == 0 {
		return nil
	}
	now := o.now()
	_, err := o.idb.NewRaw(`UPDATE email_outbox SET next_attempt_at = ?0, stale_at = ?2
WHERE id IN (?1) AND state = 'pending'`, now.Add(lease), bun.List(ids), now.Add(outbox.StaleAfter(lease))).Exec(ctx)
	return translate(err)
}

// Retry counts a failed attempt (unanswered: its end of DATA got no reply) and makes the email
// due again after delay.
func (o *Outbox) Retry(ctx context.Context, id uuid.UUID, delay time.Duration, reason string, unanswered bool) error {
	now := o.now()
	n := 0
	if unanswered {
		n = 1
	}
	_, err := o.idb.NewRaw(`UPDATE email_outbox
SET attempts = attempts + 1, unanswered = unanswered + ?4, next_attempt_at = ?0, stale_at = NULL, last_error = ?1, updated_at = ?2
WHERE id = ?3 AND state = 'pending'`, now.Add(delay), reason, now, id, n).Exec(ctx)
	return translate(err)
}

// Fail counts a failed attempt and gives up on the email, which stays for inspection.
func (o *Outbox) Fail(ctx context.Context, id uuid.UUID, reason string) error {
	_, err := o.idb.NewRaw(`UPDATE email_outbox
SET state = 'failed', attempts = attempts + 1, last_error = ?0, updated_at = ?1
WHERE id = ?2 AND state = 'pending'`, reason, o.now(), id).Exec(ctx)
	return translate(err)
}

// Cancel gives up on an email nobody wants any more.
func (o *Outbox) Cancel(ctx context.Context, id uuid.UUID, reason string) error {
	_, err := o.idb.NewRaw(`UPDATE email_outbox SET state = 'cancelled', last_error = ?0, updated_at = ?1
WHERE id = ?2 AND state = 'pending'`, reason, o.now(), id).Exec(ctx)
	return translate(err)
}

// Release makes claimed, untried emails due again at once.
func (o *Outbox) Release(ctx context.Context, ids []uuid.UUID) error {
	if len(ids) == 0 {
		return nil
	}
	now := o.now()
	_, err := o.idb.NewRaw(`UPDATE email_outbox SET next_attempt_at = ?0, stale_at = NULL, updated_at = ?0
WHERE id IN (?1) AND state = 'pending'`, now, bun.List(ids)).Exec(ctx)
	return translate(err)
}

// Stats reads, for metrics, per lane (every lane, in outbox.Lanes order), how many emails wait
// to be sent (due, in a worker's hands, or scheduled for a retry) and how long the
// longest-waiting stalled one has waited since it was queued (0 when none is). An email is
// stalled when it is due and nobody holds it (never claimed, or claimed by a worker whose
// lease ran out: it crashed) or when an attempt at it failed and it waits for a retry (the
// SMTP server is down or refusing). Only an email in a live worker's hands, never tried yet,
// is not: that worker keeps its lease alive while it sends. So the age grows in both a worker
// crash and an SMTP outage, and the stall alert (deploy/prometheus/rules.yml) fires in both.
func (o *Outbox) Stats(ctx context.Context) ([]outbox.LaneStats, error) {
	return o.laneStats(ctx, `SELECT lane, count(*) AS pending,
    min(created_at) FILTER (WHERE next_attempt_at <= ?0 OR attempts > 0) AS oldest
FROM email_outbox WHERE state = 'pending' GROUP BY lane`)
}

// HeldPastHeartbeat reads, for metrics, how long the pending email held longest past its
// heartbeat has been so (0 when none is): claimed by a worker that stopped renewing its lease
// two beats ago (outbox.StaleAfter), and not taken over yet. A live worker renews every beat;
// a dead one's emails show here until another worker claims them, within the lease.
func (o *Outbox) HeldPastHeartbeat(ctx context.Context) (time.Duration, error) {
	return o.heldPast(ctx, `SELECT min(stale_at) FROM email_outbox WHERE state = 'pending' AND stale_at <= ?0`)
}

// heldPast runs query, the earliest stale_at of a queue's held work that is past it (NULL when
// none is), with the store's now as ?0, and returns how long ago that was (0 when none is).
func (s store) heldPast(ctx context.Context, query string) (time.Duration, error) {
	now := s.now()
	var oldest *time.Time
	if err := s.idb.NewRaw(query, now).Scan(ctx, &oldest); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, translate(err)
	}
	if oldest == nil {
		return 0, nil
	}
	return max(now.Sub(*oldest), 0), nil
}

// laneStats runs query, per lane a count of a queue's waiting rows as pending and the time its
// oldest due row became due as oldest (NULL when none is), with the store's now as ?0, and
// returns every lane's count and how long ago that was (0 when none is due), in
// outbox.Lanes order; a lane without rows has zeros.
func (s store) laneStats(ctx context.Context, query string) ([]outbox.LaneStats, error) {
	now := s.now()
	var rows []struct {
		Lane    outbox.Lane `bun:"lane"`
		Pending int64       `bun:"pending"`
		Oldest  *time.Time  `bun:"oldest"`
	}
	if err := s.idb.NewRaw(query, now).Scan(ctx, &rows); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, translate(err)
	}
	out := make([]outbox.LaneStats, len(outbox.Lanes))
	for i, l := range outbox.Lanes {
		out[i].Lane = l
		for _, r := range rows {
			if r.Lane != l {
				continue
			}
			out[i].Depth = r.Pending
			if r.Oldest != nil {
				out[i].OldestDue = max(now.Sub(*r.Oldest), 0)
			}
		}
	}
	return out, nil
}

// Listen signals on the returned channel when this process queued emails (SQLite), until ctx
// ends; on PostgreSQL it returns nil and the workers poll (see engine.listen and the
// email_outbox_poll migration).
func (o *Outbox) Listen(ctx context.Context) <-chan struct{} {
	return o.db.eng.listen(ctx, emailQueue)
}
