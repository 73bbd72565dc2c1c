package integration

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
)

// Read-only keys and rotation (docs/api-contract.md §16.2), on the store under test.

// readKey makes a read key for the env's newsletter.
func (e *env) readKey(t *testing.T) (model.APIKey, string) {
	t.Helper()
	k, secret, err := e.accounts.CreateScopedKey(context.Background(), e.nl, "reports", model.ScopeRead)
	if err != nil {
		t.Fatal(err)
	}
	if k.Scope != model.ScopeRead {
		t.Fatalf("scope = %q, want read", k.Scope)
	}
	return k, secret
}

// TestReadKeyCanOnlyRead: a read key may call the GET operations; any other gets 403
// insufficient_scope with the contract's message, changes nothing, and — as every 403 — counts
// neither toward the key lockout nor the rate limits.
func TestReadKeyCanOnlyRead(t *testing.T) {
	t.Parallel()
	o := newObservedLimited(t, new(limitsConfig(t, "5/1m", "off", "off", "2/10m:10m")))
	id := o.do("POST", "/subscribers", map[string]any{"email": "ann@example.com"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
	whID := uuid.Must(uuid.NewV7()).String() // refused before the handler looks it up
	k, secret := o.readKey(t)
	auth := "Authorization: Bearer " + secret

	writes := []struct {
		method, path string
		body         any
	}{
		{"POST", "/subscribers", map[string]any{"email": "new@example.com"}},
		{"POST", "/subscribers/bulk", []any{map[string]any{"email": "new@example.com"}}},
		{"PUT", "/subscribers/" + id, map[string]any{"name": "X"}},
		{"PUT", upsertPath("new@example.com"), map[string]any{}},
		{"DELETE", "/subscribers/" + id, nil},
		{"POST", "/subscribers/" + id + "/tags", map[string]any{"add": []any{"x"}}},
		{"POST", "/webhooks", map[string]any{"url": "http://127.0.0.1:9/other"}},
		{"DELETE", "/webhooks/" + whID, nil},
		// Refused before the body is looked at: an invalid one is no 422.
		{"POST", "/subscribers", map[string]any{"email": "x"}},
	}
	for _, w := range writes {
		r := o.do(w.method, w.path, w.body, auth).want(t, http.StatusForbidden, api.CodeInsufficientScope)
		if r.body["message"] != "This API key can only read." {
			t.Errorf("%s %s: message = %v", w.method, w.path, r.body["message"])
		}
		if _, ok := r.body["errors"]; ok {
			t.Errorf("%s %s: a 403 with errors: %s", w.method, w.path, r.raw)
		}
		if r.header.Get("RateLimit-Remaining") != "" {
			t.Errorf("%s %s: a refused write was counted by the rate limits (RateLimit-Remaining %s)",
				w.method, w.path, r.header.Get("RateLimit-Remaining"))
		}
	}
	if n := o.count("SELECT count(*) FROM subscribers"); n != 1 {
		t.Errorf("subscribers = %d, want 1: a read key changed something", n)
	}
	if n := o.count("SELECT count(*) FROM webhook_endpoints"); n != 0 {
		t.Errorf("webhook endpoints = %d, want 0", n)
	}
	// 8 refusals, over the lockout's 2 and the rate limit's 5: neither counted them.
	for _, path := range []string{"/subscribers", "/subscribers/" + id, "/subscribers?page=2", "/subscribers?email=ann@example.com", "/subscribers?status=active"} {
		r := o.do("GET", path, nil, auth).want(t, http.StatusOK, "")
		if path == "/subscribers" && r.header.Get("RateLimit-Remaining") != "4" {
			t.Errorf("RateLimit-Remaining after the refused writes = %q, want 4", r.header.Get("RateLimit-Remaining"))
		}
	}
	if got := counterSum(t, o.metrics, "api_key_scope_refusals_total", "key_prefix", k.Prefix); got != float64(len(writes)) {
		t.Errorf("api_key_scope_refusals_total{key_prefix=%q} = %v, want %d", k.Prefix, got, len(writes))
	}
	// The write key is a write key, as every key made before scopes.
	o.do("PUT", "/subscribers/"+id, map[string]any{"name": "Ann"}).want(t, http.StatusOK, "")
}

// TestExistingKeysAreWriteKeys: a key stored without a scope (as every key before the
// migration) is a write key.
func TestExistingKeysAreWriteKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	secret, prefix, hash := model.NewKeySecret()
	if _, err := e.db.NewRaw(`INSERT INTO api_keys (id, newsletter_id, prefix, hash, label, created_at) VALUES (?, ?, ?, ?, 'old', ?)`,
		uuid.Must(uuid.NewV7()), e.nl, prefix, hash, time.Now().UTC()).Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	keys, err := e.accounts.Keys(context.Background(), e.nl)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if k.Scope != model.ScopeWrite {
			t.Errorf("key %s scope = %q, want write", k.Label, k.Scope)
		}
	}
	e.do("POST", "/subscribers", map[string]any{"email": "w@example.com"}, "Authorization: Bearer "+secret).want(t, http.StatusCreated, "")
}

// TestRotatedKeyExpires: rotation makes a successor with the same newsletter, label and scope;
// the old key works until the grace ends, then answers 401 like a revoked key, within the key
// cache's bound (here 2 s) even when the cache verified it just before.
func TestRotatedKeyExpires(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	e := newEnv(t, func(o *envOptions) { o.keyCacheTTL = ttl })
	ctx := context.Background()
	old, oldSecret := e.readKey(t)
	oldAuth := "Authorization: Bearer " + oldSecret
	e.do("GET", "/subscribers", nil, oldAuth).want(t, http.StatusOK, "") // now in the key cache

	const grace = 1500 * time.Millisecond
	next, secret, before, err := e.accounts.RotateKey(ctx, old.ID, grace)
	if err != nil {
		t.Fatal(err)
	}
	rotatedAt := time.Now()
	if next.NewsletterID != e.nl || next.Label != "reports" || next.Scope != model.ScopeRead || next.ID == old.ID {
		t.Errorf("successor = %+v, want a new read key of the newsletter labelled reports", next)
	}
	if before.ExpiresAt == nil {
		t.Fatal("the old key has no expiry after rotation")
	}
	// Rotating it again within its grace makes another successor and never extends its life.
	if _, _, again, err := e.accounts.RotateKey(ctx, old.ID, time.Hour); err != nil || again.ExpiresAt == nil ||
		!again.ExpiresAt.Equal(*before.ExpiresAt) {
		t.Errorf("second rotation: %v, old key expires at %v; want %v kept", err, again.ExpiresAt, before.ExpiresAt)
	}
	newAuth := "Authorization: Bearer " + secret
	e.do("GET", "/subscribers", nil, newAuth).want(t, http.StatusOK, "")
	e.do("POST", "/subscribers", map[string]any{"email": "x@example.com"}, newAuth).want(t, http.StatusForbidden, api.CodeInsufficientScope)
	e.do("GET", "/subscribers", nil, oldAuth).want(t, http.StatusOK, "") // within the grace

	time.Sleep(time.Until(rotatedAt.Add(grace)))
	var r response
	for {
		r = e.do("GET", "/subscribers", nil, oldAuth)
		if r.status != http.StatusOK || time.Since(rotatedAt) > grace+ttl+time.Second {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.want(t, http.StatusUnauthorized, "unauthorized")
	if r.body["message"] != "Invalid API key." || r.header.Get("WWW-Authenticate") != "Bearer" {
		t.Errorf("expired key's 401 = %s (WWW-Authenticate %q), want a revoked key's", r.raw, r.header.Get("WWW-Authenticate"))
	}
	e.do("GET", "/subscribers", nil, newAuth).want(t, http.StatusOK, "")

	// An expired key, a revoked one and an unknown id cannot be rotated.
	if _, _, _, err := e.accounts.RotateKey(ctx, old.ID, time.Hour); !errors.Is(err, model.ErrKeyRevoked) {
		t.Errorf("rotating an expired key: %v, want ErrKeyRevoked", err)
	}
	if err := e.accounts.RevokeKey(ctx, next.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := e.accounts.RotateKey(ctx, next.ID, time.Hour); !errors.Is(err, model.ErrKeyRevoked) {
		t.Errorf("rotating a revoked key: %v, want ErrKeyRevoked", err)
	}
	if _, _, _, err := e.accounts.RotateKey(ctx, uuid.Must(uuid.NewV7()), time.Hour); !errors.Is(err, model.ErrKeyNotFound) || errors.Is(err, model.ErrKeyRevoked) {
		t.Errorf("rotating an unknown key: %v, want ErrKeyNotFound", err)
	}
}

// TestKeyLastUsed: a key's last use is recorded to the minute, by the flush and not by the
// request, once per minute per key however many requests it made.
func TestKeyLastUsed(t *testing.T) {
	t.Parallel()
	var touches lastUsedWrites
	e := newEnv(t, withHook(&touches))
	srv := api.New(api.Config{Store: repo.NewSubscribers(e.db), Auth: e.accounts, KeyUsage: e.accounts})
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	e.base = hs.URL + api.BasePath
	for range 3 {
		e.do("GET", "/subscribers", nil).want(t, http.StatusOK, "")
	}
	if n := touches.n.Load(); n != 0 {
		t.Fatalf("%d writes of last_used_at during the requests, want none", n)
	}
	keys, err := e.accounts.Keys(context.Background(), e.nl)
	if err != nil {
		t.Fatal(err)
	}
	if keys[0].LastUsedAt != nil {
		t.Errorf("last_used_at = %v before any flush, want none", keys[0].LastUsedAt)
	}
	start := time.Now().UTC().Truncate(time.Minute)
	if err := srv.FlushKeyUsage(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.do("GET", "/subscribers", nil).want(t, http.StatusOK, "")
	if err := srv.FlushKeyUsage(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := touches.n.Load(); n != 1 && time.Now().UTC().Truncate(time.Minute).Equal(start) {
		t.Errorf("%d writes of last_used_at within one minute, want 1", n)
	}
	keys, err = e.accounts.Keys(context.Background(), e.nl)
	if err != nil {
		t.Fatal(err)
	}
	got := keys[0].LastUsedAt
	if got == nil || got.Before(start) || got.After(time.Now()) || !got.Equal(got.Truncate(time.Minute)) {
		t.Errorf("last_used_at = %v, want this minute (%v), to the minute", got, start)
	}
}

// lastUsedWrites counts the statements that write api_keys.last_used_at.
type lastUsedWrites struct{ n atomic.Int64 }

func (h *lastUsedWrites) BeforeQuery(ctx context.Context, _ *bun.QueryEvent) context.Context {
	return ctx
}

func (h *lastUsedWrites) AfterQuery(_ context.Context, ev *bun.QueryEvent) {
	if strings.Contains(ev.Query, "last_used_at =") {
		h.n.Add(1)
	}
}
