package repo

import (
	"context"
	"crypto/subtle"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	"github.com/subscriberd/subscriberd/model"
)

type newsletterRow struct {
	bun.BaseModel `bun:"table:newsletters"`

	ID        uuid.UUID `bun:"id,pk,type:uuid"`
	Name      string    `bun:"name"`
	APIAccess bool      `bun:"api_access"`
	CreatedAt time.Time `bun:"created_at"`
	UpdatedAt time.Time `bun:"updated_at"`
}

func (r *newsletterRow) toModel() model.Newsletter {
	return model.Newsletter{ID: r.ID, Name: r.Name, APIAccess: r.APIAccess, CreatedAt: r.CreatedAt.UTC()}
}

type apiKeyRow struct {
	bun.BaseModel `bun:"table:api_keys"`

	ID           uuid.UUID  `bun:"id,pk,type:uuid"`
	NewsletterID uuid.UUID  `bun:"newsletter_id,type:uuid"`
	Prefix       string     `bun:"prefix"`
	Hash         []byte     `bun:"hash"`
	Label        string     `bun:"label"`
	CreatedAt    time.Time  `bun:"created_at"`
	RevokedAt    *time.Time `bun:"revoked_at"`
	Scope        string     `bun:"scope"`
	ExpiresAt    *time.Time `bun:"expires_at"`
	LastUsedAt   *time.Time `bun:"last_used_at"`
}

func (r *apiKeyRow) toModel() model.APIKey {
	k := model.APIKey{ID: r.ID, NewsletterID: r.NewsletterID, Prefix: r.Prefix, Label: r.Label,
		CreatedAt: r.CreatedAt.UTC(), Scope: model.Scope(r.Scope)}
	for _, t := range []struct{ from, to **time.Time }{{&r.RevokedAt, &k.RevokedAt}, {&r.ExpiresAt, &k.ExpiresAt}, {&r.LastUsedAt, &k.LastUsedAt}} {
		if *t.from != nil {
			*t.to = new((*t.from).UTC())
		}
	}
	return k
}

// Accounts stores newsletters and their API keys.
type Accounts struct{ store }

// NewAccounts returns the newsletter and key store on db.
func NewAccounts(db *DB) *Accounts { return &Accounts{store: newStore(db)} }

// CreateNewsletter stores a new newsletter.
func (a *Accounts) CreateNewsletter(ctx context.Context, name string, apiAccess bool) (model.Newsletter, error) {
	now := time.Now().UTC()
	row := newsletterRow{ID: uuid.Must(uuid.NewV7()), Name: name, APIAccess: apiAccess, CreatedAt: now, UpdatedAt: now}
	if _, err := a.idb.NewInsert().Model(&row).Exec(ctx); err != nil {
		return model.Newsletter{}, translate(err)
	}
	return row.toModel(), nil
}

// FirstNewsletter returns the oldest newsletter, and false when there is none.
func (a *Accounts) FirstNewsletter(ctx context.Context) (model.Newsletter, bool, error) {
	var row newsletterRow
	err := a.idb.NewSelect().Model(&row).OrderExpr("created_at, id").Limit(1).Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return model.Newsletter{}, false, nil
	}
	if err != nil {
		return model.Newsletter{}, false, translate(err)
	}
	return row.toModel(), true, nil
}

// UpdateNewsletter sets, when apiAccess is not nil, whether the newsletter's plan has API
// access and, when name is not nil, renames it.
func (a *Accounts) UpdateNewsletter(ctx context.Context, id uuid.UUID, apiAccess *bool, name *string) (model.Newsletter, error) {
	var row newsletterRow
	q := a.idb.NewUpdate().Model(&row).Set("updated_at = ?", time.Now().UTC())
	if apiAccess != nil {
		q = q.Set("api_access = ?", *apiAccess)
	}
	if name != nil {
		q = q.Set("name = ?", *name)
	}
	err := q.Where("id = ?", id).Returning("*").Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return model.Newsletter{}, fmt.Errorf("%w", model.ErrNewsletterNotFound)
	}
	if err != nil {
		return model.Newsletter{}, translate(err)
	}
	return row.toModel(), nil
}

// Newsletters returns every newsletter, oldest first.
func (a *Accounts) Newsletters(ctx context.Context) ([]model.Newsletter, error) {
	var rows []newsletterRow
	if err := a.idb.NewSelect().Model(&rows).OrderExpr("created_at, id").Scan(ctx); err != nil {
		return nil, translate(err)
	}
	out := make([]model.Newsletter, len(rows))
	for i := range rows {
		out[i] = rows[i].toModel()
	}
	return out, nil
}

// Keys returns the newsletter's API keys, revoked ones included, oldest first; a rotated key
// whose grace has ended is revoked at its end (model.APIKey.RevokedAsOf). An unknown newsletter
// gives model.ErrNewsletterNotFound.
func (a *Accounts) Keys(ctx context.Context, newsletterID uuid.UUID) ([]model.APIKey, error) {
	if _, err := a.Newsletter(ctx, newsletterID); err != nil {
		return nil, err
	}
	var rows []apiKeyRow
	err := a.idb.NewSelect().Model(&rows).Where("newsletter_id = ?", newsletterID).OrderExpr("created_at, id").Scan(ctx)
	if err != nil {
		return nil, translate(err)
	}
	out := make([]model.APIKey, len(rows))
	now := a.now()
	for i := range rows {
		out[i] = rows[i].toModel()
		out[i].RevokedAt = out[i].RevokedAsOf(now)
	}
	return out, nil
}

// Newsletter returns one newsletter.
func (a *Accounts) Newsletter(ctx context.Context, id uuid.UUID) (model.Newsletter, error) {
	var row newsletterRow
	err := a.idb.NewSelect().Model(&row).Where("id = ?", id).Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return model.Newsletter{}, fmt.Errorf("%w", model.ErrNewsletterNotFound)
	}
	if err != nil {
		return model.Newsletter{}, translate(err)
	}
	return row.toModel(), nil
}

// CreateKey makes a write key for the newsletter and returns it with the only copy of the
// secret.
func (a *Accounts) CreateKey(ctx context.Context, newsletterID uuid.UUID, label string) (model.APIKey, string, error) {
	return a.CreateScopedKey(ctx, newsletterID, label, model.ScopeWrite)
}

// CreateScopedKey is CreateKey for a key of the given scope (docs/api-contract.md §16.2).
func (a *Accounts) CreateScopedKey(ctx context.Context, newsletterID uuid.UUID, label string, scope model.Scope) (model.APIKey, string, error) {
	if _, err := a.Newsletter(ctx, newsletterID); err != nil {
		return model.APIKey{}, "", err
	}
	return insertKey(ctx, a.idb, newsletterID, label, scope, a.now())
}

// insertKey stores a new key and returns it with the only copy of its secret.
func insertKey(ctx context.Context, db bun.IDB, newsletterID uuid.UUID, label string, scope model.Scope, now time.Time) (model.APIKey, string, error) {
	secret, prefix, hash := model.NewKeySecret()
	row := apiKeyRow{
		ID: uuid.Must(uuid.NewV7()), NewsletterID: newsletterID, Prefix: prefix, Hash: hash,
		Label: label, CreatedAt: now, Scope: string(scope),
	}
	if _, err := db.NewInsert().Model(&row).Exec(ctx); err != nil {
		return model.APIKey{}, "", translate(err)
	}
	k := row.toModel()
	k.Hash = hash
	return k, secret, nil
}

// RotateKey makes the successor of the key id — a new key with the same newsletter, label and
// scope — and sets the old key to expire grace from now (or keeps an earlier expiry it has),
// in one transaction (docs/api-contract.md §16.2). It returns the new key with the only copy
// of its secret, and the old key as it now is. An unknown id gives model.ErrKeyNotFound; a
// revoked or expired key, model.ErrKeyRevoked.
func (a *Accounts) RotateKey(ctx context.Context, id uuid.UUID, grace time.Duration) (next model.APIKey, secret string, old model.APIKey, err error) {
	err = a.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		var err error
		next, secret, old, err = rotateKey(ctx, tx, id, grace, a.now())
		return err
	})
	if err != nil {
		return model.APIKey{}, "", model.APIKey{}, err
	}
	return next, secret, old, nil
}

// rotateKey is RotateKey's unit of work on db, a transaction: one statement sets the old
// key's expiry while it is live (and locks it until the successor is stored), then the
// successor is inserted.
func rotateKey(ctx context.Context, db bun.IDB, id uuid.UUID, grace time.Duration, now time.Time) (model.APIKey, string, model.APIKey, error) {
	expires := now.Add(grace)
	var row apiKeyRow
	// A key rotated already keeps its earlier expiry: a second successor shortens nothing's life.
	err := db.NewUpdate().Model(&row).
		Set("expires_at = CASE WHEN expires_at IS NOT NULL AND expires_at < ? THEN expires_at ELSE ? END", expires, expires).
		Where("id = ? AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > ?)", id, now).
		Returning("*").Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		exists, err := db.NewSelect().Model((*apiKeyRow)(nil)).Where("id = ?", id).Exists(ctx)
		switch {
		case err != nil:
			return model.APIKey{}, "", model.APIKey{}, translate(err)
		case exists:
			return model.APIKey{}, "", model.APIKey{}, fmt.Errorf("%w", model.ErrKeyRevoked)
		}
		return model.APIKey{}, "", model.APIKey{}, fmt.Errorf("%w", model.ErrKeyNotFound)
	}
	if err != nil {
		return model.APIKey{}, "", model.APIKey{}, translate(err)
	}
	next, secret, err := insertKey(ctx, db, row.NewsletterID, row.Label, model.Scope(row.Scope), now)
	if err != nil {
		return model.APIKey{}, "", model.APIKey{}, err
	}
	return next, secret, row.toModel(), nil
}

// TouchKeys records when keys were last used: each key's last_used_at becomes its time in
// used, unless it holds a later one already (another instance's). Times are kept to the
// minute (docs/api-contract.md §16.2).
func (a *Accounts) TouchKeys(ctx context.Context, used map[uuid.UUID]time.Time) error {
	for id, at := range used {
		at = at.UTC().Truncate(time.Minute)
		if _, err := a.idb.NewUpdate().Model((*apiKeyRow)(nil)).Set("last_used_at = ?", at).
			Where("id = ? AND (last_used_at IS NULL OR last_used_at < ?)", id, at).Exec(ctx); err != nil {
			return translate(err)
		}
	}
	return nil
}

// RevokeKey revokes a key; revoking it again changes nothing. An unknown id gives
// model.ErrKeyNotFound.
func (a *Accounts) RevokeKey(ctx context.Context, id uuid.UUID) error {
	res, err := a.idb.NewUpdate().Model((*apiKeyRow)(nil)).
		Set("revoked_at = coalesce(revoked_at, ?)", time.Now().UTC()).Where("id = ?", id).Exec(ctx)
	if err != nil {
		return translate(err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w", model.ErrKeyNotFound)
	}
	return nil
}

// authenticateStmt is Authenticate's statement, prepared on PostgreSQL (see statement); its
// span is named "SELECT", as bun named the raw statement.
var authenticateStmt = newStatement("SELECT", "", `SELECT k.id, k.prefix, k.newsletter_id, k.hash, k.revoked_at, k.scope,
    k.expires_at, n.api_access
FROM api_keys AS k JOIN newsletters AS n ON n.id = k.newsletter_id WHERE k.hash = $1`)

// Authenticate finds the live key with this hash and what it grants. An unknown key gives
// model.ErrKeyNotFound; a revoked or expired one model.ErrKeyRevoked (an ErrKeyNotFound too) with the
// key's id, prefix and newsletter, for telemetry.
func (a *Accounts) Authenticate(ctx context.Context, hash []byte) (model.Principal, error) {
	var row struct {
		ID           uuid.UUID  `bun:"id"`
		Prefix       string     `bun:"prefix"`
		NewsletterID uuid.UUID  `bun:"newsletter_id"`
		Hash         []byte     `bun:"hash"`
		RevokedAt    *time.Time `bun:"revoked_at"`
		Scope        string     `bun:"scope"`
		ExpiresAt    *time.Time `bun:"expires_at"`
		APIAccess    bool       `bun:"api_access"`
	}
	err := a.db.eng.queryRow(ctx, a.idb, authenticateStmt, &row, hash)
	if errors.Is(err, sql.ErrNoRows) {
		return model.Principal{}, fmt.Errorf("%w", model.ErrKeyNotFound)
	}
	if err != nil {
		return model.Principal{}, translate(err)
	}
	// The index lookup already matched the hash; compare again in constant time so no code
	// path depends on how much of it matched.
	if subtle.ConstantTimeCompare(row.Hash, hash) != 1 {
		return model.Principal{}, fmt.Errorf("%w", model.ErrKeyNotFound)
	}
	p := model.Principal{KeyID: row.ID, KeyPrefix: row.Prefix, NewsletterID: row.NewsletterID, APIAccess: row.APIAccess,
		Scope: model.Scope(row.Scope)}
	if row.ExpiresAt != nil {
		p.ExpiresAt = row.ExpiresAt.UTC()
	}
	// An expired key (a rotated key whose grace is over) is a revoked one (§16.2).
	if row.RevokedAt != nil || model.Expired(p.ExpiresAt, a.now()) {
		return model.Principal{KeyID: p.KeyID, KeyPrefix: p.KeyPrefix, NewsletterID: p.NewsletterID}, fmt.Errorf("%w", model.ErrKeyRevoked)
	}
	return p, nil
}
