package repo

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/outbox"
)

// suppressionRow is one entry of a newsletter's suppression list (docs/api-contract.md §13).
// Email and EmailKey are nil for an erased entry; EmailHash is set for every entry.
type suppressionRow struct {
	bun.BaseModel `bun:"table:suppressions"`

	ID           uuid.UUID `bun:"id,pk,type:uuid"`
	NewsletterID uuid.UUID `bun:"newsletter_id,type:uuid"`
	Email        *string   `bun:"email"`
	EmailKey     *string   `bun:"email_key"`
	EmailHash    []byte    `bun:"email_hash"`
	Reason       string    `bun:"reason"`
	Source       string    `bun:"source"`
	CreatedAt    time.Time `bun:"created_at"`
}

func (r *suppressionRow) toModel() model.Suppression {
	s := model.Suppression{ID: r.ID, NewsletterID: r.NewsletterID, Reason: model.SuppressionReason(r.Reason),
		CreatedAt: r.CreatedAt.UTC()}
	if r.Email != nil {
		s.Email = *r.Email
	}
	_ = json.Unmarshal([]byte(r.Source), &s.Source) // written by newSuppressionRow
	return s
}

func newSuppressionRow(nl uuid.UUID, in model.NewSuppression, now time.Time) suppressionRow {
	src, _ := json.Marshal(in.Source) // cannot fail: strings
	row := suppressionRow{ID: uuid.Must(uuid.NewV7()), NewsletterID: nl, EmailHash: model.EmailHash(in.Email),
		// Kept to the microsecond, as both engines store it, so the entry returned on create
		// is the one read back later and a cursor's position matches the stored time.
		Reason: string(in.Reason), Source: string(src), CreatedAt: now.UTC().Truncate(time.Microsecond)}
	if in.Reason != model.ReasonErased {
		email, key := strings.TrimSpace(in.Email), model.EmailKey(in.Email)
		row.Email, row.EmailKey = &email, &key
	}
	return row
}

// Suppressions stores the suppression lists of the newsletters. A store from Tx.Suppressions
// runs in that unit of work: Check, Suppress and Find are what other writes (an upsert, an
// import's batch) call inside theirs.
type Suppressions struct {
	store
}

// NewSuppressions returns the suppression store on db.
func NewSuppressions(db *DB) *Suppressions {
	return &Suppressions{store: newStore(db)}
}

// Create suppresses one address (docs/api-contract.md §13) and reports whether the entry is
// new; an address already suppressed returns its entry as stored (its first reason stays). An
// active or pending subscriber with the address becomes unsubscribed in the same transaction,
// with its event (source from ctx: model.SourceFrom with the reason) and its unsent
// confirmation emails cancelled.
func (s *Suppressions) Create(ctx context.Context, nl uuid.UUID, in model.NewSuppression) (model.Suppression, bool, error) {
	out, created, err := s.CreateMany(ctx, nl, []model.NewSuppression{in})
	if err != nil {
		return model.Suppression{}, false, err
	}
	return out[0], created[0], nil
}

// CreateMany suppresses the addresses of in, all in one transaction, and returns their entries
// in input order with whether each was new, as Create does for one. An address given twice
// gets the same entry twice.
func (s *Suppressions) CreateMany(ctx context.Context, nl uuid.UUID, in []model.NewSuppression) ([]model.Suppression, []bool, error) {
	var out []model.Suppression
	var created []bool
	var delivering bool
	src := model.SourceFrom(ctx)
	err := s.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		out, created, delivering = make([]model.Suppression, len(in)), make([]bool, len(in)), false
		emails := make([]string, len(in))
		for i := range in {
			emails[i] = in[i].Email
		}
		if err := s.lockEmails(ctx, tx, nl, emails); err != nil {
			return err
		}
		now := s.now()
		for i := range in {
			sup, isNew, err := insertSuppression(ctx, tx, nl, in[i], now)
			if err != nil {
				return err
			}
			out[i], created[i] = sup, isNew
			if !isNew {
				continue
			}
			evSrc := src
			evSrc.Kind, evSrc.Reason = model.SourceSuppression, string(in[i].Reason)
			d, err := s.unsubscribeSuppressed(ctx, tx, nl, in[i].Email, evSrc, now)
			if err != nil {
				return err
			}
			delivering = delivering || d
		}
		return nil
	})
	if err != nil {
		return nil, nil, translate(err)
	}
	s.deliveriesQueued(delivering)
	return out, created, nil
}

// Get returns one entry of nl's list.
func (s *Suppressions) Get(ctx context.Context, nl, id uuid.UUID) (model.Suppression, error) {
	var row suppressionRow
	err := s.idb.NewSelect().Model(&row).Where("newsletter_id = ? AND id = ?", nl, id).Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return model.Suppression{}, fmt.Errorf("%w", model.ErrSuppressionNotFound)
	}
	if err != nil {
		return model.Suppression{}, translate(err)
	}
	return row.toModel(), nil
}

// Delete removes one entry of nl's list and returns it as it was. The address may be
// subscribed again; subscribers it unsubscribed stay unsubscribed.
func (s *Suppressions) Delete(ctx context.Context, nl, id uuid.UUID) (model.Suppression, error) {
	var rows []suppressionRow
	err := s.atomic(ctx, func(ctx context.Context) error {
		rows = nil
		return s.idb.NewDelete().Model(&rows).Where("newsletter_id = ? AND id = ?", nl, id).Returning("*").Scan(ctx)
	})
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return model.Suppression{}, translate(err)
	}
	if len(rows) == 0 {
		return model.Suppression{}, fmt.Errorf("%w", model.ErrSuppressionNotFound)
	}
	return rows[0].toModel(), nil
}

// List returns up to q.Limit entries of nl's list, newest first (id breaking ties), and
// whether more follow. With q.Email it is a lookup: the address's entry, erased or not.
func (s *Suppressions) List(ctx context.Context, nl uuid.UUID, q model.SuppressionQuery) ([]model.Suppression, bool, error) {
	var rows []suppressionRow
	sel := s.idb.NewSelect().Model(&rows).Where("newsletter_id = ?", nl)
	if q.Email != "" {
		sel = sel.Where("email_hash IN (?)", bun.List(model.EmailHashes(q.Email)))
	}
	if q.Reason != "" {
		sel = sel.Where("reason = ?", string(q.Reason))
	}
	if q.After != nil {
		sel = sel.Where("(created_at < ? OR (created_at = ? AND id < ?))", q.After.CreatedAt, q.After.CreatedAt, q.After.ID)
	}
	limit := q.Limit
	if limit <= 0 {
		limit = model.DefaultLimit
	}
	err := sel.OrderExpr("created_at DESC, id DESC").Limit(limit + 1).Scan(ctx)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, false, translate(err)
	}
	more := len(rows) > limit
	if more {
		rows = rows[:limit]
	}
	out := make([]model.Suppression, len(rows))
	for i := range rows {
		out[i] = rows[i].toModel()
	}
	return out, more, nil
}

// Lookup returns the entry of email in nl's list (an erased one found by its hash, see
// model.EmailHashes), or model.ErrSuppressionNotFound.
func (s *Suppressions) Lookup(ctx context.Context, nl uuid.UUID, email string) (model.Suppression, error) {
	found, err := findSuppressions(ctx, s.idb, nl, []string{email})
	if err != nil {
		return model.Suppression{}, err
	}
	for _, sup := range found {
		return sup, nil
	}
	return model.Suppression{}, fmt.Errorf("%w", model.ErrSuppressionNotFound)
}

// LookupHash returns the entry whose address has the SHA-256 hash (model.EmailHash), or
// model.ErrSuppressionNotFound.
func (s *Suppressions) LookupHash(ctx context.Context, nl uuid.UUID, hash []byte) (model.Suppression, error) {
	found, err := findByHashes(ctx, s.idb, nl, [][]byte{hash})
	if err != nil {
		return model.Suppression{}, err
	}
	for _, sup := range found {
		return sup, nil
	}
	return model.Suppression{}, fmt.Errorf("%w", model.ErrSuppressionNotFound)
}

// Suppress adds one entry to nl's list, in the store's unit of work (or a transaction of its
// own), after taking the lock of the address (see Check), and reports whether it is new; an
// address already suppressed returns the stored entry unchanged, except that an erasure
// (model.ReasonErased) turns an existing entry into an erased one, keeping only the hash. It
// does not change subscribers: see UnsubscribeSuppressed.
func (s *Suppressions) Suppress(ctx context.Context, nl uuid.UUID, in model.NewSuppression) (model.Suppression, bool, error) {
	var out model.Suppression
	var created bool
	err := s.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		if err := s.lockEmails(ctx, tx, nl, []string{in.Email}); err != nil {
			return err
		}
		var err error
		out, created, err = insertSuppression(ctx, tx, nl, in, s.now())
		return err
	})
	return out, created, err
}

// UnsubscribeSuppressed makes the active or pending subscriber of nl with email (if any)
// unsubscribed, in the store's unit of work: the event subscriber.unsubscribed with src
// (docs/api-contract.md §13), unsent confirmation emails cancelled and links retired.
func (s *Suppressions) UnsubscribeSuppressed(ctx context.Context, nl uuid.UUID, email string, src model.EventSource) error {
	var delivering bool
	err := s.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		var err error
		delivering, err = s.unsubscribeSuppressed(ctx, tx, nl, email, src, s.now())
		return err
	})
	if err == nil {
		s.deliveriesQueued(delivering)
	}
	return err
}

// Find returns the entries of nl's list matching emails, keyed by model.EmailKey of the given
// address.
func (s *Suppressions) Find(ctx context.Context, nl uuid.UUID, emails []string) (map[string]model.Suppression, error) {
	return findSuppressions(ctx, s.idb, nl, emails)
}

// Check is the check every write that would subscribe an address makes inside its unit of
// work (a store from Tx.Suppressions), before the uniqueness rule (docs/api-contract.md §13):
// see store.checkNotSuppressed.
func (s *Suppressions) Check(ctx context.Context, nl uuid.UUID, emails ...string) error {
	return s.checkNotSuppressed(ctx, s.idb, nl, emails...)
}

// findSuppressions finds the entries of emails by model.EmailHashes (an erased entry made
// before 1.3 by the hash of the 1.2 key), keyed by model.EmailKey of the given address; an
// address with entries under both hashes gets the one under its own key's hash.
func findSuppressions(ctx context.Context, db bun.IDB, nl uuid.UUID, emails []string) (map[string]model.Suppression, error) {
	hashes := make([][]byte, 0, len(emails))
	keys := make([]string, len(emails))
	for i, e := range emails {
		keys[i] = model.EmailKey(e)
		hashes = append(hashes, model.EmailHashes(e)...)
	}
	found, err := findByHashes(ctx, db, nl, hashes)
	if err != nil || len(found) == 0 {
		return nil, err
	}
	out := make(map[string]model.Suppression, len(found))
	for i, e := range emails {
		if _, done := out[keys[i]]; done {
			continue
		}
		for _, h := range model.EmailHashes(e) {
			if sup, ok := found[string(h)]; ok {
				out[keys[i]] = sup
				break
			}
		}
	}
	return out, nil
}

// checkNotSuppressed takes, in the transaction tx, the lock of each address (see lockEmails:
// a suppression and a subscribe of the same address are ordered, and the later one sees the
// earlier) and returns a *model.SuppressedError naming the positions of emails that are
// suppressed, or nil.
func (s *store) checkNotSuppressed(ctx context.Context, tx bun.IDB, nl uuid.UUID, emails ...string) error {
	if err := s.lockEmails(ctx, tx, nl, emails); err != nil {
		return err
	}
	found, err := findSuppressions(ctx, tx, nl, emails)
	if err != nil || len(found) == 0 {
		return err
	}
	reasons := map[int]model.SuppressionReason{}
	for i, e := range emails {
		if sup, ok := found[model.EmailKey(e)]; ok {
			reasons[i] = sup.Reason
		}
	}
	return &model.SuppressedError{Reasons: reasons}
}

// insertSuppression stores in unless its address is on nl's list already, and returns the
// entry that is there afterwards.
func insertSuppression(ctx context.Context, db bun.IDB, nl uuid.UUID, in model.NewSuppression, now time.Time) (model.Suppression, bool, error) {
	row := newSuppressionRow(nl, in, now)
	if hashes := model.EmailHashes(in.Email); len(hashes) > 1 {
		// An entry made before 1.3 under the 1.2 key's hash is this address's entry too
		// (docs/api-contract.md §18): one per address. It is an erased one, or one a 1.2
		// instance made during a roll-out, before the re-key (see Rekey) re-hashed it; an
		// erasure still leaves no address in it (§14).
		var old suppressionRow
		err := db.NewSelect().Model(&old).Where("newsletter_id = ? AND email_hash = ?", nl, hashes[1]).Scan(ctx)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return model.Suppression{}, false, translate(err)
		case in.Reason == model.ReasonErased && old.Reason != string(model.ReasonErased):
			old.Email, old.EmailKey, old.Reason, old.Source = nil, nil, row.Reason, row.Source
			if _, err := db.NewUpdate().Model(&old).WherePK().Column("email", "email_key", "reason", "source").Exec(ctx); err != nil {
				return model.Suppression{}, false, translate(err)
			}
			return old.toModel(), false, nil
		default:
			return old.toModel(), false, nil
		}
	}
	q := db.NewInsert().Model(&row)
	if in.Reason == model.ReasonErased {
		// Erasure leaves no address behind (§14): an existing entry keeps its id and time
		// but becomes an erased one.
		q = q.On("CONFLICT (newsletter_id, email_hash) DO UPDATE").
			Set("email = NULL, email_key = NULL, reason = EXCLUDED.reason, source = EXCLUDED.source")
	} else {
		q = q.On("CONFLICT (newsletter_id, email_hash) DO NOTHING")
	}
	res, err := q.Exec(ctx)
	if err != nil {
		return model.Suppression{}, false, translate(err)
	}
	if n, _ := res.RowsAffected(); n == 1 && in.Reason != model.ReasonErased {
		return row.toModel(), true, nil
	}
	var stored suppressionRow
	if err := db.NewSelect().Model(&stored).Where("newsletter_id = ? AND email_hash = ?", nl, row.EmailHash).Scan(ctx); err != nil {
		return model.Suppression{}, false, translate(err)
	}
	return stored.toModel(), stored.ID == row.ID, nil
}

func findByHashes(ctx context.Context, db bun.IDB, nl uuid.UUID, hashes [][]byte) (map[string]model.Suppression, error) {
	if len(hashes) == 0 {
		return nil, nil
	}
	var rows []suppressionRow
	err := db.NewSelect().Model(&rows).Where("newsletter_id = ? AND email_hash IN (?)", nl, bun.List(hashes)).Scan(ctx)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, translate(err)
	}
	out := make(map[string]model.Suppression, len(rows))
	for i := range rows {
		out[string(rows[i].EmailHash)] = rows[i].toModel()
	}
	return out, nil
}

// lockEmails makes writes of the same addresses of nl wait for each other until commit (see
// lockKeys).
func (s *store) lockEmails(ctx context.Context, tx bun.IDB, nl uuid.UUID, emails []string) error {
	if len(emails) == 0 {
		return nil
	}
	keys := make([]string, len(emails))
	for i, e := range emails {
		keys[i] = model.EmailKey(e)
	}
	return s.lockKeys(ctx, tx, nl, keys)
}

// lockKeys makes writes of the same address keys (model.EmailKey) of nl wait for each
// other until commit: the engine's lockEmailKeys, the keys lockForEmailChange takes, in one
// order. Every lock of an address is taken here.
func (s *store) lockKeys(ctx context.Context, tx bun.IDB, nl uuid.UUID, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	slices.Sort(keys)
	return translate(s.db.eng.lockEmailKeys(ctx, tx, nl, slices.Compact(keys)))
}

// unsubscribeSuppressed is UnsubscribeSuppressed in the transaction db, reporting whether
// webhook deliveries were queued.
func (s *store) unsubscribeSuppressed(ctx context.Context, db bun.IDB, nl uuid.UUID, email string, src model.EventSource, now time.Time) (bool, error) {
	var row subscriberRow
	err := s.db.eng.raw(db, "SELECT * FROM subscribers WHERE newsletter_id = ? AND email_key = ? AND status IN ('active', 'pending')"+
		" FOR UPDATE", nl, model.EmailKey(email)).Scan(ctx, &row)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, translate(err)
	}
	before := row.Status
	row.Status, row.UpdatedAt = string(model.StatusUnsubscribed), now
	if _, err := db.NewUpdate().Model(&row).WherePK().Column("status", "updated_at").Exec(ctx); err != nil {
		return false, translate(err)
	}
	delivering, err := s.recordEvents(ctx, db, []model.Event{model.NewEvent(model.EventUnsubscribed, row.toModel(),
		map[string]string{"status": before}, src, now)}, outbox.Interactive)
	if err != nil {
		return false, err
	}
	return delivering, retireConfirmations(ctx, db, row.ID, now)
}
