package repo

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/outbox"
)

// The re-key of docs/api-contract.md §18. Keys written by 1.2 (trimmed, lower-cased) differ
// from model.EmailKey only for an address that is not plain ASCII or whose domain has an
// "xn--" label: those rows alone are read (a scan with a predicate both engines evaluate, no
// IDNA in SQL), their keys computed in Go, and only the rows whose key changes are written,
// each in a transaction of its own that takes the address's lock as every write of it does.
// Rows keyed by 1.3 come out unchanged, so the re-key can run again at any time: Migrate runs
// it after the migrations, and running `subscriberd migrate` again after the last 1.2 instance
// stopped re-keys what those wrote meanwhile (docs/operating.md).

// rekeyPage is how many candidate rows one read returns.
const rekeyPage = 1000

// duplicateKeyPrefix starts the key of a subscriber that lost its address to an older one
// (see duplicateKey).
const duplicateKeyPrefix = "duplicate:"

// duplicateKey is the key of subscriber id once an older subscriber of its newsletter keeps
// its address: unique, and no address's key (it has no "@"), so no lookup finds it and no
// create collides with it. Its email stays as given.
func duplicateKey(id uuid.UUID) string { return duplicateKeyPrefix + id.String() }

// candidatesWhere selects the rows whose 1.2 key may differ from model.EmailKey: an address
// with a character outside ASCII (more bytes than characters, on both engines), or an A-label.
const candidatesWhere = `(octet_length(email) <> length(email) OR email_key LIKE '%xn--%')`

// RekeyResult counts what a re-key changed.
type RekeyResult struct {
	Subscribers  int // subscribers given their address's key
	Duplicates   int // subscribers that lost their address to an older one and were unsubscribed
	Suppressions int // suppression entries given their address's key and hash
	Merged       int // suppression entries deleted: an older entry holds their address
}

// Rekey recomputes the keys of subscribers and suppression entries (docs/api-contract.md
// §18). Where two subscribers of a newsletter now hold the same address, the older (created
// first; the smaller id on a tie) keeps it and the newer becomes unsubscribed, as a DELETE
// would make it (its unsent confirmation emails cancelled, its links retired), with the event
// subscriber.unsubscribed of source duplicate_address naming the older; its email stays as
// given, under a key of its own (duplicateKey). Where two entries of a suppression list now
// match the same address, the older stays (its reason first, as for any repeat) and the newer
// is deleted. Erased entries keep their hashes: the list matches an address by the hash of
// its 1.2 key too (model.EmailHashes). Running it again changes nothing.
func Rekey(ctx context.Context, db *DB) (RekeyResult, error) {
	s := newStore(db)
	var res RekeyResult
	var after uuid.UUID
	for {
		var rows []subscriberRow
		err := db.NewRaw(`SELECT id, newsletter_id, email, email_key FROM subscribers
WHERE `+candidatesWhere+` AND email_key NOT LIKE '`+duplicateKeyPrefix+`%' AND id > ?
ORDER BY id LIMIT ?`, after, rekeyPage).Scan(ctx, &rows)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return res, fmt.Errorf("rekey subscribers: %w", translate(err))
		}
		for _, r := range rows {
			if model.EmailKey(r.Email) == r.EmailKey {
				continue
			}
			dup, err := s.rekeySubscriber(ctx, r.NewsletterID, r.ID)
			if err != nil {
				return res, fmt.Errorf("rekey subscriber %s: %w", r.ID, err)
			}
			res.Subscribers++
			if dup {
				res.Duplicates++
			}
		}
		if len(rows) < rekeyPage {
			break
		}
		after = rows[len(rows)-1].ID
	}
	after = uuid.Nil
	for {
		var rows []suppressionRow
		err := db.NewRaw(`SELECT id, newsletter_id, email, email_key, email_hash FROM suppressions
WHERE email IS NOT NULL AND `+candidatesWhere+` AND id > ?
ORDER BY id LIMIT ?`, after, rekeyPage).Scan(ctx, &rows)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return res, fmt.Errorf("rekey suppressions: %w", translate(err))
		}
		for _, r := range rows {
			if r.Email == nil || string(model.EmailHash(*r.Email)) == string(r.EmailHash) &&
				r.EmailKey != nil && *r.EmailKey == model.EmailKey(*r.Email) {
				continue
			}
			merged, err := s.rekeySuppression(ctx, r.NewsletterID, r.ID)
			if err != nil {
				return res, fmt.Errorf("rekey suppression %s: %w", r.ID, err)
			}
			res.Suppressions++
			if merged {
				res.Merged++
			}
		}
		if len(rows) < rekeyPage {
			break
		}
		after = rows[len(rows)-1].ID
	}
	return res, nil
}

// suppressionColumns are suppressionRow's columns.
const suppressionColumns = `id, newsletter_id, email, email_key, email_hash, reason, source, created_at`

// older reports whether a was created before b (the smaller id on a tie).
func older(aAt time.Time, aID uuid.UUID, bAt time.Time, bID uuid.UUID) bool {
	if !aAt.Equal(bAt) {
		return aAt.Before(bAt)
	}
	return bytes.Compare(aID[:], bID[:]) < 0
}

// rekeySubscriber gives subscriber id of nl its address's key, in a transaction that holds the
// locks of the old and the new key (a create or an email change of either waits) and the rows
// of the subscriber and of whoever holds the new key. It reports whether a subscriber lost its
// address to an older one.
func (s *store) rekeySubscriber(ctx context.Context, nl, id uuid.UUID) (bool, error) {
	var dup, delivering bool
	err := s.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		dup, delivering = false, false
		var cur subscriberRow
		if err := tx.NewRaw("SELECT "+subscriberColumns+" FROM subscribers WHERE id = ?", id).Scan(ctx, &cur); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return nil // erased meanwhile
			}
			return translate(err)
		}
		key := model.EmailKey(cur.Email)
		if key == cur.EmailKey {
			return nil
		}
		keys := []string{key, cur.EmailKey}
		slices.Sort(keys)
		if err := s.db.eng.lockEmailKeys(ctx, tx, nl, keys); err != nil {
			return translate(err)
		}
		var rows []subscriberRow
		err := s.db.eng.raw(tx, `SELECT `+subscriberColumns+` FROM subscribers WHERE newsletter_id = ? AND (id = ? OR email_key = ?)
ORDER BY id FOR UPDATE`, nl, id, key).Scan(ctx, &rows)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return translate(err)
		}
		var self, holder *subscriberRow
		for i := range rows {
			if rows[i].ID == id {
				self = &rows[i]
			} else {
				holder = &rows[i]
			}
		}
		if self == nil || model.EmailKey(self.Email) != key {
			return nil // gone, or its email changed meanwhile (by an email change, keyed as it wrote it)
		}
		now := s.now()
		if holder != nil {
			kept, lost := holder, self
			if older(self.CreatedAt, self.ID, holder.CreatedAt, holder.ID) {
				kept, lost = self, holder
			}
			dup = true
			var err error
			if delivering, err = s.unsubscribeDuplicate(ctx, tx, lost, kept.ID, now); err != nil {
				return err
			}
			if kept == holder {
				return nil
			}
		}
		_, err = tx.NewRaw("UPDATE subscribers SET email_key = ? WHERE id = ?", key, id).Exec(ctx)
		return translate(err)
	})
	if err == nil {
		s.deliveriesQueued(delivering)
	}
	return dup, err
}

// unsubscribeDuplicate moves row off its address (duplicateKey) and, unless it is
// unsubscribed already, unsubscribes it as a DELETE would, with the event of source
// duplicate_address naming kept. It reports whether webhook deliveries were queued.
func (s *store) unsubscribeDuplicate(ctx context.Context, tx bun.IDB, row *subscriberRow, kept uuid.UUID, now time.Time) (bool, error) {
	before := row.Status
	row.EmailKey = duplicateKey(row.ID)
	if before == string(model.StatusUnsubscribed) {
		_, err := tx.NewRaw("UPDATE subscribers SET email_key = ? WHERE id = ?", row.EmailKey, row.ID).Exec(ctx)
		return false, translate(err)
	}
	row.Status, row.UpdatedAt = string(model.StatusUnsubscribed), now
	if _, err := tx.NewRaw("UPDATE subscribers SET email_key = ?, status = ?, updated_at = ? WHERE id = ?",
		row.EmailKey, row.Status, row.UpdatedAt, row.ID).Exec(ctx); err != nil {
		return false, translate(err)
	}
	src := model.EventSource{Kind: model.SourceDuplicateAddress, Kept: kept.String()}
	// The re-key is bulk work, not a person's request: its deliveries wait in the bulk lane.
	delivering, err := s.recordEvents(ctx, tx, []model.Event{model.NewEvent(model.EventUnsubscribed, row.toModel(),
		map[string]string{"status": before}, src, now)}, outbox.Bulk)
	if err != nil {
		return false, err
	}
	return delivering, retireConfirmations(ctx, tx, row.ID, now)
}

// rekeySuppression gives entry id of nl's suppression list its address's key and hash, under
// the address's locks; where an entry already holds the new hash the older of the two stays
// and the newer is deleted (if the newer was an erased one, the older becomes erased). It
// reports whether one was deleted.
func (s *store) rekeySuppression(ctx context.Context, nl, id uuid.UUID) (bool, error) {
	var merged bool
	err := s.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		merged = false
		var cur suppressionRow
		if err := tx.NewRaw("SELECT "+suppressionColumns+" FROM suppressions WHERE id = ?", id).Scan(ctx, &cur); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return nil
			}
			return translate(err)
		}
		if cur.Email == nil {
			return nil // erased meanwhile: only its hash is left, matched as it is
		}
		key, hash := model.EmailKey(*cur.Email), model.EmailHash(*cur.Email)
		keys := []string{key, model.LegacyEmailKey(*cur.Email)}
		slices.Sort(keys)
		if err := s.db.eng.lockEmailKeys(ctx, tx, nl, slices.Compact(keys)); err != nil {
			return translate(err)
		}
		var rows []suppressionRow
		err := s.db.eng.raw(tx, `SELECT `+suppressionColumns+` FROM suppressions WHERE newsletter_id = ? AND (id = ? OR email_hash = ?)
ORDER BY id FOR UPDATE`, nl, id, hash).Scan(ctx, &rows)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return translate(err)
		}
		var self, holder *suppressionRow
		for i := range rows {
			if rows[i].ID == id {
				self = &rows[i]
			} else {
				holder = &rows[i]
			}
		}
		if self == nil || self.Email == nil {
			return nil
		}
		if holder == nil {
			_, err = tx.NewRaw("UPDATE suppressions SET email_key = ?, email_hash = ? WHERE id = ?", key, hash, id).Exec(ctx)
			return translate(err)
		}
		merged = true
		kept, lost := holder, self
		if older(self.CreatedAt, self.ID, holder.CreatedAt, holder.ID) {
			kept, lost = self, holder
		}
		if _, err := tx.NewRaw("DELETE FROM suppressions WHERE id = ?", lost.ID).Exec(ctx); err != nil {
			return translate(err)
		}
		if lost.Reason == string(model.ReasonErased) && kept.Reason != string(model.ReasonErased) {
			// The address was erased (§14): the entry that stays keeps no address either, as
			// an erasure makes of an existing entry.
			_, err = tx.NewRaw("UPDATE suppressions SET email = NULL, email_key = NULL, email_hash = ?, reason = ?, source = ? WHERE id = ?",
				hash, lost.Reason, lost.Source, kept.ID).Exec(ctx)
			return translate(err)
		}
		if kept == self {
			_, err = tx.NewRaw("UPDATE suppressions SET email_key = ?, email_hash = ? WHERE id = ?", key, hash, id).Exec(ctx)
		}
		return translate(err)
	})
	return merged, err
}
