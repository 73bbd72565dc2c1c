package repo

import (
	"bytes"
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

// Privacy answers a person's requests about their data (docs/api-contract.md §14): the export
// of everything stored about a subscriber, and its erasure.
//
// An erased subscriber keeps no row (no tombstone): its row is deleted, so every list, lookup,
// total (the counters' triggers count the delete) and get forgets it exactly as if it had
// never been created, and a cursor, which is a position in the order rather than a row,
// stays valid. What outlives it holds no personal data: its events, scrubbed, and the erased
// suppression of its address, a hash. The tags it held or once held that nobody else holds
// leave the tag counts.
type Privacy struct {
	store
}

// NewPrivacy returns the privacy store on db.
func NewPrivacy(db *DB) *Privacy {
	return &Privacy{store: newStore(db)}
}

// Privacy returns the privacy store bound to the transaction.
func (t Tx) Privacy() *Privacy { return &Privacy{store: t.store()} }

// Export returns everything stored about the newsletter's subscriber id, read in one
// transaction that holds the subscriber's row, so that no change of it lands in between; an
// unknown (or erased) subscriber, or another newsletter's, is model.ErrNotFound.
func (p *Privacy) Export(ctx context.Context, nl, id uuid.UUID) (model.Export, error) {
	var out model.Export
	err := p.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		var err error
		out, err = p.exportIn(ctx, tx, nl, id)
		return err
	})
	if err != nil {
		return model.Export{}, translate(err)
	}
	return out, nil
}

// exportIn is Export inside the transaction db.
func (p *Privacy) exportIn(ctx context.Context, db bun.IDB, nl, id uuid.UUID) (model.Export, error) {
	var row subscriberRow
	err := p.db.eng.raw(db, "SELECT * FROM subscribers WHERE newsletter_id = ? AND id = ? FOR SHARE", nl, id).Scan(ctx, &row)
	if errors.Is(err, sql.ErrNoRows) {
		return model.Export{}, fmt.Errorf("%w", model.ErrNotFound)
	}
	if err != nil {
		return model.Export{}, translate(err)
	}
	out := model.Export{Subscriber: row.toModel(), Events: []model.Event{}, Emails: []model.ExportEmail{}}
	sups, err := findSuppressions(ctx, db, nl, []string{row.Email})
	if err != nil {
		return model.Export{}, err
	}
	for _, sup := range sups {
		out.Suppression = &sup
	}
	var events []eventRow
	if err := db.NewSelect().Model(&events).Column("id", "type", "payload", "created_at").
		Where("subscriber_id = ?", id).OrderExpr("id").Scan(ctx); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return model.Export{}, translate(err)
	}
	for _, e := range events {
		out.Events = append(out.Events, model.Event{ID: e.ID, NewsletterID: nl, SubscriberID: id,
			Type: model.EventType(e.Type), Timestamp: e.CreatedAt.UTC(), Payload: []byte(e.Payload)})
	}
	var emails []outboxRow
	if err := db.NewSelect().Model(&emails).Column("kind", "state", "created_at", "sent_at").
		Where("subscriber_id = ?", id).OrderExpr("created_at, id").Scan(ctx); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return model.Export{}, translate(err)
	}
	for _, e := range emails {
		em := model.ExportEmail{Kind: e.Kind, Status: model.ExportEmailStatus(e.State), CreatedAt: e.CreatedAt.UTC()}
		if e.SentAt != nil {
			t := e.SentAt.UTC()
			em.SentAt = &t
		}
		out.Emails = append(out.Emails, em)
	}
	return out, nil
}

// eraseTries is how many times Erase starts again when the subscriber's address changed
// between reading it and locking the row. In a unit of work of the caller's (an
// Idempotency-Key) the attempt is not rolled back first: the earlier address, the person's
// too, stays suppressed by its hash as well.
const eraseTries = 3

// errAddressMoved ends an attempt of Erase whose subscriber changed its address meanwhile.
var errAddressMoved = errors.New("the subscriber's address changed during the erasure")

// Erase erases the newsletter's subscriber id (docs/api-contract.md §14), in one transaction:
// all of it or nothing. An unknown (or erased) subscriber, or another newsletter's, is
// model.ErrNotFound. The event subscriber.erased gets the source ctx carries.
func (p *Privacy) Erase(ctx context.Context, nl, id uuid.UUID) (model.Erasure, error) {
	src := model.SourceFrom(ctx)
	var out model.Erasure
	var delivering bool
	var err error
	for range eraseTries {
		err = p.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
			var err error
			out, delivering, err = p.eraseIn(ctx, tx, nl, id, src, p.now())
			return err
		})
		if !errors.Is(err, errAddressMoved) {
			break
		}
	}
	if err != nil {
		return model.Erasure{}, translate(err)
	}
	p.deliveriesQueued(delivering)
	return out, nil
}

// eraseIn is one attempt of Erase inside the caller's transaction db, at now. It reports
// whether webhook deliveries were queued (see deliveriesQueued).
func (p *Privacy) eraseIn(ctx context.Context, db bun.IDB, nl, id uuid.UUID, src model.EventSource, now time.Time) (model.Erasure, bool, error) {
	// The address is read first and its lock taken (lockEmails) before the row's: the order
	// of every write that subscribes or suppresses an address, which then waits for the
	// erasure and finds the suppression, or comes first and is erased with the rest.
	var email string
	err := db.NewRaw("SELECT email FROM subscribers WHERE newsletter_id = ? AND id = ?", nl, id).Scan(ctx, &email)
	if errors.Is(err, sql.ErrNoRows) {
		return model.Erasure{}, false, fmt.Errorf("%w", model.ErrNotFound)
	}
	if err != nil {
		return model.Erasure{}, false, translate(err)
	}
	// Suppressions.Suppress in this attempt's transaction: the address's lock, then the entry
	// (an existing one becomes an erased one, its hash alone).
	if err := p.lockEmails(ctx, db, nl, []string{email}); err != nil {
		return model.Erasure{}, false, err
	}
	if _, _, err := insertSuppression(ctx, db, nl, model.NewSuppression{Email: email, Reason: model.ReasonErased,
		Source: model.SuppressionSource{Kind: model.SuppressionSourceErase}}, now); err != nil {
		return model.Erasure{}, false, err
	}
	var row subscriberRow
	err = p.db.eng.raw(db, "SELECT * FROM subscribers WHERE newsletter_id = ? AND id = ? FOR UPDATE", nl, id).Scan(ctx, &row)
	switch {
	case errors.Is(err, sql.ErrNoRows): // erased meanwhile
		return model.Erasure{}, false, fmt.Errorf("%w", model.ErrNotFound)
	case err != nil:
		return model.Erasure{}, false, translate(err)
	case row.Email != email:
		return model.Erasure{}, false, errAddressMoved
	}
	held, err := scrubEvents(ctx, db, id)
	if err != nil {
		return model.Erasure{}, false, err
	}
	if err := p.deleteStoredResponses(ctx, db, nl, id, row.Email); err != nil {
		return model.Erasure{}, false, err
	}
	// Every email goes, sent ones too: an outbox row keeps the SMTP server's last reply, which
	// may quote the address. The tokens are hashes, but of links to a subscriber that is gone.
	// In the order every writer of a subscriber locks: subscriber, outbox, tokens.
	for _, q := range []string{
		"DELETE FROM email_outbox WHERE subscriber_id = ?",
		"DELETE FROM confirmation_tokens WHERE subscriber_id = ?",
		"DELETE FROM subscribers WHERE id = ?",
	} {
		if _, err := db.NewRaw(q, id).Exec(ctx); err != nil {
			return model.Erasure{}, false, translate(err)
		}
	}
	// A tag is a label the newsletter chose, and it can name the person (vip-jane-doe): the
	// counters of the tags the subscriber holds or once held (its events record them) that
	// nobody else holds now go with it, in this transaction (after the delete, whose trigger
	// counted it out). The engine deletes only counter rows that sum to 0, so every count
	// stays exact under concurrent tag writers.
	if err := p.db.eng.dropEmptyTagCounts(ctx, db, nl, model.SortTags(append(held, row.Tags...))); err != nil {
		return model.Erasure{}, false, translate(err)
	}
	delivering, err := p.recordEvents(ctx, db, []model.Event{model.NewErasedEvent(nl, id, src, now)}, outbox.Interactive)
	if err != nil {
		return model.Erasure{}, false, err
	}
	return model.Erasure{ID: id, ErasedAt: now}, delivering, nil
}

// scrubEvents removes the personal data from every stored event of the subscriber id
// (model.ScrubEvent). Webhook deliveries not made yet read the event when they are claimed,
// so they carry the scrubbed one. It returns the tags the events record the subscriber held
// (data.subscriber.tags and data.previous.tags), duplicates included.
func scrubEvents(ctx context.Context, db bun.IDB, id uuid.UUID) ([]string, error) {
	var rows []eventRow
	if err := db.NewSelect().Model(&rows).Column("id", "payload").Where("subscriber_id = ?", id).
		Scan(ctx); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, translate(err)
	}
	var held []string
	for _, r := range rows {
		var tags struct {
			Data struct {
				Subscriber, Previous struct {
					Tags []string `json:"tags"`
				}
			} `json:"data"`
		}
		if err := json.Unmarshal([]byte(r.Payload), &tags); err != nil {
			return nil, fmt.Errorf("event %s: %w", r.ID, err)
		}
		held = append(append(held, tags.Data.Subscriber.Tags...), tags.Data.Previous.Tags...)
		scrubbed, err := model.ScrubEvent([]byte(r.Payload))
		if err != nil {
			return nil, fmt.Errorf("event %s: %w", r.ID, err)
		}
		if string(scrubbed) == r.Payload {
			continue
		}
		if _, err := db.NewRaw("UPDATE subscriber_events SET payload = ? WHERE id = ?", string(scrubbed), r.ID).Exec(ctx); err != nil {
			return nil, translate(err)
		}
	}
	return held, nil
}

// deleteStoredResponses deletes nl's stored idempotent responses (docs/api-contract.md §8)
// that contain the subscriber id or its address: a replay would send them again. The address
// is looked for as stored, normalised, and as JSON writes each of them.
func (p *Privacy) deleteStoredResponses(ctx context.Context, db bun.IDB, nl, id uuid.UUID, email string) error {
	needles := [][]byte{[]byte(id.String())}
	for _, e := range []string{email, model.EmailKey(email)} {
		js, _ := json.Marshal(e) // cannot fail: a string
		for _, n := range [][]byte{[]byte(e), js[1 : len(js)-1]} {
			if !containsBytes(needles, n) {
				needles = append(needles, n)
			}
		}
	}
	return translate(p.db.eng.deleteResponsesContaining(ctx, db, nl, needles))
}

func containsBytes(list [][]byte, b []byte) bool {
	for _, x := range list {
		if bytes.Equal(x, b) {
			return true
		}
	}
	return false
}

// SweepTagCounts deletes the counters of up to limit tags that nobody holds any more (their
// rows sum to 0: untagging and deletes only count down), newsletter by newsletter, each in a
// transaction of its own, with the erasure's exact delete (engine.dropEmptyTagCounts: only
// rows that still sum to 0 when locked, so a tag added meanwhile keeps its count). It returns
// how many tags it found.
func (p *Privacy) SweepTagCounts(ctx context.Context, limit int) (int, error) {
	var found []struct {
		NewsletterID uuid.UUID `bun:"newsletter_id"`
		Tag          string    `bun:"tag"`
	}
	if err := p.idb.NewRaw(`SELECT newsletter_id, tag FROM subscriber_tag_counts
GROUP BY newsletter_id, tag HAVING sum(n) = 0 ORDER BY newsletter_id, tag LIMIT ?`, limit).
		Scan(ctx, &found); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, translate(err)
	}
	for i := 0; i < len(found); {
		nl, tags := found[i].NewsletterID, []string{}
		for ; i < len(found) && found[i].NewsletterID == nl; i++ {
			tags = append(tags, found[i].Tag)
		}
		if err := p.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
			return p.db.eng.dropEmptyTagCounts(ctx, tx, nl, tags)
		}); err != nil {
			return 0, translate(err)
		}
	}
	return len(found), nil
}

// SweepTagCountsLoop runs SweepTagCounts, up to 1,000 tags, every interval until ctx ends.
// Errors are passed to logErr and the loop goes on.
func (p *Privacy) SweepTagCountsLoop(ctx context.Context, interval time.Duration, logErr func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := p.SweepTagCounts(ctx, 1000); err != nil && ctx.Err() == nil {
			logErr(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
