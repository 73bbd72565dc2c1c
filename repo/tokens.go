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

// Confirmations resolves confirmation tokens, stored only as hashes, for the double-opt-in
// pages.
type Confirmations struct {
	store
}

// NewConfirmations returns the token store on db.
func NewConfirmations(db *DB) *Confirmations {
	return &Confirmations{store: newStore(db)}
}

type tokenRow struct {
	SubscriberID   uuid.UUID  `bun:"subscriber_id,type:uuid"`
	NewsletterID   uuid.UUID  `bun:"newsletter_id,type:uuid"`
	ExpiresAt      time.Time  `bun:"expires_at"`
	RetiredAt      *time.Time `bun:"retired_at"`
	ConfirmedAt    *time.Time `bun:"confirmed_at"`
	DeclinedAt     *time.Time `bun:"declined_at"`
	SentAt         *time.Time `bun:"sent_at"`
	Status         string     `bun:"status"`
	Email          string     `bun:"email"`
	NewsletterName string     `bun:"newsletter_name"`
}

// declined tells whether this token declined its subscription ("I did not sign up",
// docs/api-contract.md §12.2) and the subscriber is still as the decline left it.
func (t *tokenRow) declined() bool {
	return t.DeclinedAt != nil && t.Status == string(model.StatusUnsubscribed)
}

func (t *tokenRow) confirmation(confirmed, declined bool) model.Confirmation {
	return model.Confirmation{SubscriberID: t.SubscriberID, NewsletterName: t.NewsletterName, Email: t.Email,
		Confirmed: confirmed, Declined: declined}
}

// usable tells what a token may do now: confirm its pending subscriber, or show again that
// it did (the token that confirmed, while the subscriber stays active and nothing retired it).
// Anything else — expired, retired, superseded, or a subscriber that changed for another
// reason — is invalid.
func (t *tokenRow) usable(now time.Time) (confirm, replay bool) {
	if !now.Before(t.ExpiresAt) || t.RetiredAt != nil {
		return false, false
	}
	if t.ConfirmedAt != nil {
		return false, t.Status == string(model.StatusActive)
	}
	return t.Status == string(model.StatusPending), false
}

const tokenQuery = `SELECT t.subscriber_id, s.newsletter_id, t.expires_at, t.retired_at, t.confirmed_at, t.declined_at,
    o.sent_at, s.status, s.email, n.name AS newsletter_name
FROM confirmation_tokens AS t
JOIN subscribers AS s ON s.id = t.subscriber_id
JOIN newsletters AS n ON n.id = s.newsletter_id
LEFT JOIN email_outbox AS o ON o.id = t.outbox_id
WHERE t.hash = ?`

// Lookup tells whether the token with this hash can confirm (or has confirmed) its
// subscription, changing nothing. An unusable token is model.ErrTokenInvalid.
func (c *Confirmations) Lookup(ctx context.Context, hash []byte) (model.Confirmation, error) {
	var t tokenRow
	err := c.idb.NewRaw(tokenQuery, hash).Scan(ctx, &t)
	if errors.Is(err, sql.ErrNoRows) {
		return model.Confirmation{}, fmt.Errorf("%w", model.ErrTokenInvalid)
	}
	if err != nil {
		return model.Confirmation{}, translate(err)
	}
	if t.declined() {
		return t.confirmation(false, true), nil
	}
	confirm, replay := t.usable(c.now())
	if !confirm && !replay {
		return model.Confirmation{}, fmt.Errorf("%w", model.ErrTokenInvalid)
	}
	return t.confirmation(replay, false), nil
}

// Confirm makes the token's pending subscriber active, records the confirmed event with the
// source ctx carries (model.WithSource: the link's client address and browser), marks the token as the one that
// confirmed, retires the subscriber's other tokens and cancels its unsent confirmation emails,
// in one transaction. Confirming again with the same token succeeds and changes nothing; any
// other unusable token is model.ErrTokenInvalid.
func (c *Confirmations) Confirm(ctx context.Context, hash []byte) (model.Confirmation, error) {
	var out model.Confirmation
	var delivering bool
	err := c.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		delivering = false
		now := c.now()
		t, err := c.lockToken(ctx, tx, hash)
		if err != nil {
			return err
		}
		subscriberID := t.SubscriberID
		out = t.confirmation(true, false)
		confirm, replay := t.usable(now)
		switch {
		case replay:
			return nil
		case !confirm:
			return fmt.Errorf("%w", model.ErrTokenInvalid)
		}
		var sub subscriberRow
		if err := tx.NewRaw(`UPDATE subscribers SET status = 'active', updated_at = ? WHERE id = ? RETURNING *`,
			now, subscriberID).Scan(ctx, &sub); err != nil {
			return translate(err)
		}
		// The consent proof (docs/api-contract.md §10.1, §12.1): when, from which client, how,
		// and how long after the server accepted the email.
		src := model.SourceFrom(ctx)
		if t.SentAt != nil {
			since := max(int64(now.Sub(*t.SentAt)/time.Second), 0)
			src.SecondsSinceSent = &since
		}
		if delivering, err = c.recordEvents(ctx, tx, []model.Event{model.NewEvent(model.EventConfirmed, sub.toModel(),
			map[string]string{"status": string(model.StatusPending)}, src, now)}, outbox.Interactive); err != nil {
			return err
		}
		if _, err := tx.NewRaw(`UPDATE email_outbox SET state = 'cancelled', last_error = 'confirmed', updated_at = ?
WHERE subscriber_id = ? AND state = 'pending'`, now, subscriberID).Exec(ctx); err != nil {
			return translate(err)
		}
		if _, err := tx.NewRaw(`UPDATE confirmation_tokens SET retired_at = ?
WHERE subscriber_id = ? AND retired_at IS NULL AND hash <> ?`, now, subscriberID, hash).Exec(ctx); err != nil {
			return translate(err)
		}
		_, err = tx.NewRaw(`UPDATE confirmation_tokens SET confirmed_at = ? WHERE hash = ?`, now, hash).Exec(ctx)
		return translate(err)
	})
	if err != nil {
		return model.Confirmation{}, translate(err) // a failed commit is the driver's error
	}
	c.deliveriesQueued(delivering)
	return out, nil
}

// lockToken finds the token hash's subscriber, locks the subscriber first, as every other
// writer does, then reads the token as it stands under that lock: a concurrent change,
// confirmation or decline has finished by then. An unknown token is model.ErrTokenInvalid.
func (c *Confirmations) lockToken(ctx context.Context, tx bun.IDB, hash []byte) (tokenRow, error) {
	var t tokenRow
	var subscriberID uuid.UUID
	err := tx.NewRaw("SELECT subscriber_id FROM confirmation_tokens WHERE hash = ?", hash).Scan(ctx, &subscriberID)
	if err == nil {
		_, err = c.db.eng.raw(tx, "SELECT 1 FROM subscribers WHERE id = ? FOR UPDATE", subscriberID).Exec(ctx)
	}
	if err == nil {
		err = tx.NewRaw(tokenQuery, hash).Scan(ctx, &t)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return t, fmt.Errorf("%w", model.ErrTokenInvalid)
	}
	return t, translate(err)
}

// Decline is "I did not sign up" (docs/api-contract.md §12.2): in one transaction the token's
// pending subscriber becomes unsubscribed with the event subscriber.unsubscribed (source
// decline_link with the client ctx carries), its unsent confirmation emails are cancelled and
// its links retired, and the address is suppressed with reason declined. Declining again with
// the same token succeeds and changes nothing; any other unusable token is
// model.ErrTokenInvalid. It reports whether the suppression is new.
func (c *Confirmations) Decline(ctx context.Context, hash []byte) (model.Confirmation, bool, error) {
	var out model.Confirmation
	var delivering, created bool
	err := c.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		delivering, created = false, false
		now := c.now()
		t, err := c.lockToken(ctx, tx, hash)
		if err != nil {
			return err
		}
		subscriberID := t.SubscriberID
		out = t.confirmation(false, true)
		if t.declined() {
			return nil // a repeat: the same page again
		}
		if confirm, _ := t.usable(now); !confirm {
			return fmt.Errorf("%w", model.ErrTokenInvalid)
		}
		var sub subscriberRow
		if err := tx.NewRaw(`UPDATE subscribers SET status = 'unsubscribed', updated_at = ? WHERE id = ? RETURNING *`,
			now, subscriberID).Scan(ctx, &sub); err != nil {
			return translate(err)
		}
		src := model.SourceFrom(ctx)
		src.Kind = model.SourceDeclineLink
		if delivering, err = c.recordEvents(ctx, tx, []model.Event{model.NewEvent(model.EventUnsubscribed, sub.toModel(),
			map[string]string{"status": string(model.StatusPending)}, src, now)}, outbox.Interactive); err != nil {
			return err
		}
		if err := retireConfirmations(ctx, tx, subscriberID, now); err != nil {
			return err
		}
		if _, err := tx.NewRaw(`UPDATE confirmation_tokens SET declined_at = ? WHERE hash = ?`, now, hash).Exec(ctx); err != nil {
			return translate(err)
		}
		if err := c.lockEmails(ctx, tx, sub.NewsletterID, []string{sub.Email}); err != nil {
			return err
		}
		_, created, err = insertSuppression(ctx, tx, sub.NewsletterID, model.NewSuppression{Email: sub.Email, Reason: model.ReasonDeclined,
			Source: model.SuppressionSource{Kind: model.SuppressionSourceDeclineLink}}, now)
		return err
	})
	if err != nil {
		return model.Confirmation{}, false, translate(err)
	}
	c.deliveriesQueued(delivering)
	return out, created, nil
}
