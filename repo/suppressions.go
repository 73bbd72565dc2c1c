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
	"github.com/uptrace/bun/dialect"
	"github.com/uptrace/bun/dialect/pgdialect"

	"github.com/subscriberd/subscriberd/model"
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
		email, key := strings.TrimSpace(in.Email), model.NormalizeEmail(in.Email)
		row.Email, row.EmailKey = &email, &key
	}
	return row
}

// Suppressions stores the suppression lists of the newsletters. Its methods run their own
// transactions; the package functions Suppress, FindSuppressions and CheckNotSuppressed run
// inside a caller's.
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
		if err := lockEmails(ctx, tx, nl, emails); err != nil {
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
	err := s.db.NewSelect().Model(&row).Where("newsletter_id = ? AND id = ?", nl, id).Scan(ctx)
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
	err := retry(ctx, func(ctx context.Context) error {
		rows = nil
		return s.db.NewDelete().Model(&rows).Where("newsletter_id = ? AND id = ?", nl, id).Returning("*").Scan(ctx)
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
	sel := s.db.NewSelect().Model(&rows).Where("newsletter_id = ?", nl)
	if q.Email != "" {
		sel = sel.Where("email_hash = ?", model.EmailHash(q.Email))
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

// Lookup returns the entry of email in nl's list (an erased one found by its hash), or
// model.ErrSuppressionNotFound.
func (s *Suppressions) Lookup(ctx context.Context, nl uuid.UUID, email string) (model.Suppression, error) {
	return s.LookupHash(ctx, nl, model.EmailHash(email))
}

// LookupHash returns the entry whose address has the SHA-256 hash (model.EmailHash), or
// model.ErrSuppressionNotFound.
func (s *Suppressions) LookupHash(ctx context.Context, nl uuid.UUID, hash []byte) (model.Suppression, error) {
	found, err := findByHashes(ctx, s.db, nl, [][]byte{hash})
	if err != nil {
		return model.Suppression{}, err
	}
	for _, sup := range found {
		return sup, nil
	}
	return model.Suppression{}, fmt.Errorf("%w", model.ErrSuppressionNotFound)
}

// Suppress adds one entry to nl's list inside the caller's transaction db, after taking the
// lock of the address (see CheckNotSuppressed), and reports whether it is new; an address
// already suppressed returns the stored entry unchanged, except that an erasure
// (model.ReasonErased) turns an existing entry into an erased one, keeping only the hash. It
// does not change subscribers: see UnsubscribeSuppressed.
func Suppress(ctx context.Context, db bun.IDB, nl uuid.UUID, in model.NewSuppression, now time.Time) (model.Suppression, bool, error) {
	if err := lockEmails(ctx, db, nl, []string{in.Email}); err != nil {
		return model.Suppression{}, false, err
	}
	return insertSuppression(ctx, db, nl, in, now)
}

// FindSuppressions returns, inside the caller's transaction db (or on the pool), the entries
// of nl's list matching emails, keyed by model.NormalizeEmail of the given address.
func FindSuppressions(ctx context.Context, db bun.IDB, nl uuid.UUID, emails []string) (map[string]model.Suppression, error) {
	hashes := make([][]byte, len(emails))
	byHash := make(map[string]string, len(emails))
	for i, e := range emails {
		hashes[i] = model.EmailHash(e)
		byHash[string(hashes[i])] = model.NormalizeEmail(e)
	}
	found, err := findByHashes(ctx, db, nl, hashes)
	if err != nil {
		return nil, err
	}
	out := make(map[string]model.Suppression, len(found))
	for h, sup := range found {
		out[byHash[h]] = sup
	}
	return out, nil
}

// CheckNotSuppressed is the check every write that would subscribe an address makes inside its
// transaction db, before the uniqueness rule (docs/api-contract.md §13): it takes the lock of
// each address (on PostgreSQL a transaction-scoped advisory lock, which Suppress takes too, so
// that a suppression and a subscribe of the same address are ordered and the later one sees
// the earlier; SQLite's immediate transaction holds the write lock already) and returns a
// *model.SuppressedError naming the positions of emails that are suppressed, or nil.
func CheckNotSuppressed(ctx context.Context, db bun.IDB, nl uuid.UUID, emails ...string) error {
	if err := lockEmails(ctx, db, nl, emails); err != nil {
		return err
	}
	found, err := FindSuppressions(ctx, db, nl, emails)
	if err != nil || len(found) == 0 {
		return err
	}
	reasons := map[int]model.SuppressionReason{}
	for i, e := range emails {
		if sup, ok := found[model.NormalizeEmail(e)]; ok {
			reasons[i] = sup.Reason
		}
	}
	return &model.SuppressedError{Reasons: reasons}
}

// insertSuppression stores in unless its address is on nl's list already, and returns the
// entry that is there afterwards.
func insertSuppression(ctx context.Context, db bun.IDB, nl uuid.UUID, in model.NewSuppression, now time.Time) (model.Suppression, bool, error) {
	row := newSuppressionRow(nl, in, now)
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

// lockEmails takes, on PostgreSQL, the transaction-scoped advisory locks of nl's addresses
// emails, in one order (sorted keys), the keys lockForEmailChange uses. SQLite's immediate
// transaction holds the database's write lock already.
func lockEmails(ctx context.Context, db bun.IDB, nl uuid.UUID, emails []string) error {
	if onSQLite(db) || len(emails) == 0 {
		return nil
	}
	keys := make([]string, len(emails))
	for i, e := range emails {
		keys[i] = nl.String() + "/" + model.NormalizeEmail(e)
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	_, err := db.NewRaw(`SELECT count(pg_advisory_xact_lock(hashtextextended(k, 0)))
FROM (SELECT unnest(?::text[]) AS k ORDER BY 1) AS keys`, pgdialect.Array(keys)).Exec(ctx)
	return translate(err)
}

// unsubscribeSuppressed makes the active or pending subscriber of nl with email (if any)
// unsubscribed, inside the caller's transaction db: the event subscriber.unsubscribed with src
// (docs/api-contract.md §13), unsent confirmation emails cancelled and links retired. It
// reports whether webhook deliveries were queued (see deliveriesQueued).
func (s *store) unsubscribeSuppressed(ctx context.Context, db bun.IDB, nl uuid.UUID, email string, src model.EventSource, now time.Time) (bool, error) {
	var row subscriberRow
	err := db.NewRaw("SELECT * FROM subscribers WHERE newsletter_id = ? AND email_key = ? AND status IN ('active', 'pending')"+
		s.db.eng.forUpdate(), nl, model.NormalizeEmail(email)).Scan(ctx, &row)
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
		map[string]string{"status": before}, src, now)})
	if err != nil {
		return false, err
	}
	return delivering, retireConfirmations(ctx, db, row.ID, now)
}

// onSQLite tells whether db, a transaction of a caller's, is SQLite's, whose immediate
// transactions hold the database's write lock already. The package functions here run inside
// another store's transaction and have no engine of their own to ask.
func onSQLite(db bun.IDB) bool { return db.Dialect().Name() == dialect.SQLite }
