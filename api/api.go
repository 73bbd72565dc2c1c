// Package api is subscriberd's HTTP edge: the Huma operations of the subscriber API, their
// input and output shapes, the error envelope, authentication and the middleware around them.
// It reaches storage only through the small interfaces it declares here.
//
// A request passes, in order: edge.go's bounds (before routing), middleware.go's observe and
// route, then the Huma middleware of New (client lockout, key, scope, limits, the bulk gate,
// Idempotency-Key, the body's preflight), then its operation's handler, which gets the caller,
// the Stores to use and its decoded input as parameters; nothing a handler needs travels in the
// context but deadlines, spans and the caller's identity.
//
// One job per file:
//   - api.go: Server and Config, the storage interfaces (Store, Stores, …), New and the order
//     of the middleware.
//   - subscribers.go: the subscriber operations (create, bulk create, list, get, update,
//     unsubscribe), their shapes, and handle and run, through which an operation without
//     Idempotency-Key is registered; upsert.go: the upsert by email (§16.1) and its route.
//   - idempotency.go: Idempotency-Key (§8): Keyed, registerKeyed and runKeyed, through which a
//     write runs in its key's unit of work, and the middleware that answers replays.
//   - events.go: a subscriber's history (§10.2) and the Event schema; webhooks.go: the webhook
//     endpoints (§10.3); suppressions.go: the suppression list (§13); privacy.go: export and
//     erasure (§14); imports.go: imports (§15), whose file importfile.go reads as it arrives;
//     segments.go: segments, saved filters (§20.1); bulkactions.go: bulk actions (§20.2).
//   - confirm.go: the confirm and decline pages (§12), without an API key.
//   - errors.go: the error envelope and mapError, the one place errors become HTTP; codes.go:
//     the codes each operation declares, and the error responses of the document.
//   - middleware.go: observe (access log, metrics), route (404, 405), authentication,
//     preflight (media type, body) and the body helpers; edge.go: bounds checked before
//     routing; keycache.go and keyusage.go: verified keys and when they were last used.
//   - limits.go: rate limits and lockouts (§5); scope.go: read-only keys (§16.2); each with
//     what it adds to the document; gate.go: the bulk gate; cursorparam.go: an empty cursor
//     parameter.
//   - docs.go: the reference page (/api/v1/docs) served from the binary.
package api

import (
	"cmp"
	"context"
	"log/slog"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/adapters/humago"
	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/api/cursor"
	"github.com/subscriberd/subscriberd/internal/outage"
	"github.com/subscriberd/subscriberd/mail"
	"github.com/subscriberd/subscriberd/model"
)

// BasePath is the versioned base of every API path.
const BasePath = "/api/v1"

// DatabaseOutage is how a database outage reads in the log (docs/operating.md).
var DatabaseOutage = outage.Messages{
	Start:   "database unavailable",
	Summary: "database still unavailable",
	End:     "database available again",
}

// Store is the subscriber storage the API needs.
type Store interface {
	Create(ctx context.Context, newsletterID uuid.UUID, in model.NewSubscriber) (model.Subscriber, error)
	CreateMany(ctx context.Context, newsletterID uuid.UUID, in []model.NewSubscriber) ([]model.Subscriber, error)
	// TakenEmails tells which of emails the newsletter already has, keyed by model.EmailKey.
	TakenEmails(ctx context.Context, newsletterID uuid.UUID, emails []string) (map[string]bool, error)
	List(ctx context.Context, newsletterID uuid.UUID, q model.ListQuery) ([]model.Subscriber, int64, error)
	Get(ctx context.Context, newsletterID, id uuid.UUID) (model.Subscriber, error)
	Update(ctx context.Context, newsletterID, id uuid.UUID, p model.SubscriberPatch) (model.Subscriber, error)
	Unsubscribe(ctx context.Context, newsletterID, id uuid.UUID) (model.Subscriber, error)
	// Upsert creates the subscriber with in.Email (created true) or applies p to the one that
	// has it, in one unit of work under the address's lock (docs/api-contract.md §16.1).
	Upsert(ctx context.Context, newsletterID uuid.UUID, in model.NewSubscriber, p model.SubscriberPatch) (sub model.Subscriber, created bool, err error)
	// ChangeTags adds and removes tags atomically (docs/api-contract.md §19.2).
	ChangeTags(ctx context.Context, newsletterID, id uuid.UUID, c model.TagsChange) (model.Subscriber, error)
	// ListTags returns up to limit of the newsletter's held tags after after, sorted, with
	// exact counts (docs/api-contract.md §19.3).
	ListTags(ctx context.Context, newsletterID uuid.UUID, after string, limit int) ([]model.TagCount, error)
}

// Stores are the stores a handler uses: the pool's (Config's), or, for a request with an
// Idempotency-Key, those bound to its unit of work (IdempotencyStore.Run), so that its reads and
// writes run on that unit's connection and commit with its stored response.
type Stores struct {
	Subscribers Store
	Events      EventStore
	Webhooks    WebhookStore
	// Suppressions is the suppression list (docs/api-contract.md §13).
	Suppressions SuppressionStore
	// Privacy exports and erases a subscriber (docs/api-contract.md §14).
	Privacy PrivacyStore
	// Segments stores segments, saved filters (docs/api-contract.md §20.1).
	Segments SegmentStore
	// BulkActions stores bulk actions (docs/api-contract.md §20.2).
	BulkActions BulkActionStore
}

// Authenticator finds what a key hash grants; an unknown key is model.ErrKeyNotFound, a revoked
// one model.ErrKeyRevoked with the key's id.
type Authenticator interface {
	Authenticate(ctx context.Context, keyHash []byte) (model.Principal, error)
}

// Metrics records what the edge observes. Every method is part of the interface, so that an
// implementation that misses or renames one fails to compile instead of going silent.
type Metrics interface {
	RequestStarted()
	RequestDone()
	ObserveRequest(ctx context.Context, method, route string, code int, d time.Duration)
	SubscribersCreated(operation, status string, n int)
	// AuthFailure counts a refused authentication by reason: missing, invalid, plan_disabled.
	AuthFailure(reason string)
	// IdempotencyOutcome counts an idempotent request answered without running
	// (IdempotencyReplayed, IdempotencyInUse, IdempotencyReused).
	IdempotencyOutcome(outcome string)
	// BulkGateWaiting counts a request starting (+1) or ending (-1) a wait at the bulk gate.
	BulkGateWaiting(delta int)
	// BulkGateWait records how long a request stood at the bulk gate, and how that ended
	// (GateAdmitted, GateAbandoned, GateTimedOut).
	BulkGateWait(outcome string, d time.Duration)
	// ScopeRefused counts a request refused because its key may only read, by the key's
	// display prefix, never the key (docs/api-contract.md §16.2).
	ScopeRefused(keyPrefix string)
	// SuppressionsCreated counts n new suppression list entries with reason
	// (docs/api-contract.md §13).
	SuppressionsCreated(reason string, n int)
	// PagePost counts a POST to the confirm or decline page (page "confirm", "decline") with
	// its outcome: confirmed, declined, repeated, refused, invalid (§12).
	PagePost(page, outcome string)
	// PrivacyRequest counts an export or an erasure (PrivacyExport, PrivacyErase) with its
	// outcome (PrivacyDone, PrivacyNotFound, PrivacyFailed).
	PrivacyRequest(operation, outcome string)
}

// Config holds the API's dependencies.
type Config struct {
	Store  Store
	Auth   Authenticator
	Logger *slog.Logger
	// Metrics may be nil.
	Metrics Metrics
	// Limiter applies the client lockout, the key lockout and the rate limits (docs/api-contract.md §5);
	// nil applies none.
	Limiter Limiter
	// TrustedProxies are the proxies whose X-Forwarded-For names the client (TRUSTED_PROXIES).
	TrustedProxies []netip.Prefix
	// Events reads subscribers' histories (docs/api-contract.md §10.2).
	Events EventStore
	// Privacy exports and erases subscribers (docs/api-contract.md §14).
	Privacy PrivacyStore
	// Webhooks stores webhook endpoints (§10.3); WebhookGuard, when set, refuses URLs on
	// addresses that are not public.
	Webhooks     WebhookStore
	WebhookGuard URLChecker
	// Suppressions stores the suppression list (docs/api-contract.md §13).
	Suppressions SuppressionStore
	// Segments stores segments (docs/api-contract.md §20.1).
	Segments SegmentStore
	// KeyCacheTTL is how long a verified key is trusted without a lookup; revocation and plan
	// changes take effect within it. Zero means 5 s; negative disables the cache.
	KeyCacheTTL time.Duration
	// DisableDocs turns off the reference page at /api/v1/docs (DOCS_UI=off); the OpenAPI
	// document is served regardless.
	DisableDocs bool
	// Idempotency stores idempotent responses (docs/api-contract.md §8); nil ignores
	// Idempotency-Key.
	Idempotency IdempotencyStore
	// BulkConcurrency is how many bulk creates run at once in this instance; the others wait,
	// before their bodies are read, until one ends or their client goes away. cmd/subscriberd
	// sets BulkConcurrency(the database pool's size). Zero means DefaultBulkConcurrency;
	// negative, no limit.
	BulkConcurrency int
	// BulkWait is how long a bulk create waits at most for a slot before it answers 503 with
	// Retry-After; zero means DefaultBulkWait.
	BulkWait time.Duration
	// WriteConcurrency is how many writes hold or wait for database connections at once in
	// this instance (writegate.go), below the pool's size so that reads keep connections;
	// cmd/subscriberd sets WriteConcurrency(the database pool's size). Zero means
	// DefaultWriteConcurrency; negative, no limit.
	WriteConcurrency int
	// WriteWait is how long a write waits for a write slot while none comes free before it
	// answers 503 with Retry-After (at most five WriteWaits in all); zero means
	// DefaultWriteWait.
	WriteWait time.Duration
	// Imports stores imports (docs/api-contract.md §15); ImportMaxRows and ImportMaxBytes
	// bound one upload (IMPORT_MAX_ROWS, IMPORT_MAX_BYTES; zero means the defaults).
	Imports        ImportStore
	ImportMaxRows  int64
	ImportMaxBytes int64
	// BulkActions stores bulk actions (docs/api-contract.md §20.2).
	BulkActions BulkActionStore
	// CursorKey signs list cursors (docs/api-contract.md §9.2). Every instance must have the
	// same one (cmd/subscriberd reads it from the database); nil makes a random one, good for
	// this process only.
	CursorKey []byte
	// KeyUsage, when set, records when each key was last used (docs/api-contract.md §16.2),
	// written by RunKeyUsage or FlushKeyUsage, never by the request.
	KeyUsage KeyUsageStore
	// PageNonceKey signs the nonces of the confirm and decline pages (docs/api-contract.md
	// §12.1). Every instance must have the same one (cmd/subscriberd reads it from the
	// database); nil makes a random one, good for this process only.
	PageNonceKey []byte
}

var installErrorOnce sync.Once

// Server is the public HTTP handler of the API.
type Server struct {
	cfg     Config
	stores  Stores // Config's
	log     *slog.Logger
	metrics Metrics
	keys    *keyCache
	usage   *keyUsage
	limiter Limiter
	// dbOutage logs the database's outages: a line when requests start failing with
	// model.ErrUnavailable, a summary every 30 s while they do, a line when one succeeds.
	dbOutage *outage.Log
	mux      *http.ServeMux
	cursors  *cursor.Codec
	nonces   *mail.Nonces
	// bulkSlots is the bulk gate (gate.go): a slot per bulk create running; nil, no gate.
	bulkSlots chan struct{}
	bulkWait  time.Duration
	// writeSlots is the write gate (writegate.go): a slot per write running; nil, no gate.
	writeSlots chan struct{}
	writeWait  time.Duration
	writesDone atomic.Int64 // writes that left the gate's slots, so that waiters see it move
	api        huma.API
	handler    http.Handler
}

// New builds the API: operations, OpenAPI document and docs, and the middleware around them.
func New(cfg Config) *Server {
	installErrorOnce.Do(func() {
		huma.NewError = humaError
		// Lists are never null in what the service sends; the document says so.
		huma.DefaultArrayNullable = false
	})
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = noMetrics{}
	}
	ttl := cfg.KeyCacheTTL
	if ttl == 0 {
		ttl = 5 * time.Second
	}
	s := &Server{cfg: cfg, stores: Stores{Subscribers: cfg.Store, Events: cfg.Events, Webhooks: cfg.Webhooks, Suppressions: cfg.Suppressions, Privacy: cfg.Privacy, Segments: cfg.Segments, BulkActions: cfg.BulkActions}, log: cfg.Logger, metrics: cfg.Metrics, keys: newKeyCache(ttl), usage: newKeyUsage(), mux: http.NewServeMux(),
		limiter: cfg.Limiter, dbOutage: outage.New(cfg.Logger, DatabaseOutage, 0, nil),
		cursors: cursor.New(cfg.CursorKey), nonces: mail.NewNonces(cfg.PageNonceKey), bulkSlots: newGate(cfg.BulkConcurrency), bulkWait: cmp.Or(cfg.BulkWait, DefaultBulkWait),
		writeSlots: newWriteGate(cfg.WriteConcurrency), writeWait: cmp.Or(cfg.WriteWait, DefaultWriteWait)}
	s.api = humago.New(s.mux, humaConfig())
	// The order of docs/api-contract.md §5: client lockout, key, plan, the key's scope
	// (§16.2), key lockout and rate limits, then Idempotency-Key (docs/api-contract.md §8), then the body. The bulk gate
	// comes after the limits, so that a refused request never waits, and before the
	// Idempotency-Key check, whose transaction holds a connection and which reads the body;
	// only a bulk create whose key has a stored response is answered before it. The write
	// gate comes after the bulk gate (a bulk create waiting for a bulk slot holds no write
	// slot) and before the Idempotency-Key check, whose transaction holds a connection.
	s.api.UseMiddleware(s.clientLockout, s.authenticate, s.scope, s.limit, s.replayUngated, s.gate, s.writeGate, s.idempotency, s.preflight, s.emptyCursor)
	s.register()
	s.documentErrors()
	s.documentLimits()
	s.documentScope()
	// Paths in the document are absolute (/api/v1/...): the server is the origin that serves
	// it, whatever name it is reached by, which keeps the docs page's requests same-origin.
	s.api.OpenAPI().Servers = []*huma.Server{{URL: "/",
		Description: "The service serving this document (paths include /api/v1)."}}
	if !cfg.DisableDocs {
		s.registerDocs()
	}
	s.documentIdempotency()
	// recoverer sits inside observe so that a panic's 500 is logged and counted like any answer;
	// bound refuses oversized queries and bodies before anything parses them.
	s.handler = s.envelope(s.observe(s.recoverer(s.bound(s.route(s.mux)))))
	return s
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// Handle mounts an extra handler (for example the confirmation pages) on the public mux.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// OpenAPI returns the generated OpenAPI document.
func (s *Server) OpenAPI() *huma.OpenAPI { return s.api.OpenAPI() }

func humaConfig() huma.Config {
	cfg := huma.DefaultConfig("Subscriber Management API", "1.2.0")
	// No $schema fields or Link headers: bodies carry exactly the contract's fields.
	cfg.CreateHooks = nil
	cfg.OpenAPIPath = BasePath + "/openapi"
	cfg.DocsPath = "" // served by registerDocs from the binary, not from a CDN
	cfg.SchemasPath = BasePath + "/schemas"
	cfg.Formats = map[string]huma.Format{
		"application/json": huma.DefaultJSONFormat,
		"json":             huma.DefaultJSONFormat,
	}
	cfg.Info.Description = "Create, list, read, update and unsubscribe the subscribers of a newsletter. " +
		"Every response carries a boolean `success`; errors use one envelope with a machine-readable `code`."
	// Who answers for the API and under which terms it is published: the project, whose
	// repository has no licence file, so no licence is granted beyond calling the API; the URL
	// is where its terms are written, the contract.
	cfg.Info.Contact = &huma.Contact{Name: "subscriberd", URL: "https://github.com/subscriberd/subscriberd"}
	cfg.Info.License = &huma.License{Name: "Proprietary",
		URL: "https://github.com/subscriberd/subscriberd/blob/main/docs/api-contract.md"}
	// Every tag an operation uses, described (the linters of api.TestOpenAPILint ask for it).
	cfg.Tags = []*huma.Tag{
		{Name: "Subscribers", Description: "The subscribers of the key's newsletter: create, bulk create, list, look up, " +
			"update, create or update by email (upsert), unsubscribe, each one's history of events, and the export and " +
			"erasure of a person's data."},
		{Name: "Webhooks", Description: "Endpoints that receive the newsletter's subscriber events, signed as Standard Webhooks."},
		{Name: "Suppressions", Description: "Addresses the newsletter never emails and the API cannot subscribe: declined, bounced, complained, erased or added by hand."},
		{Name: "Imports", Description: "Files of subscribers uploaded as CSV or NDJSON and added in the background, with their progress and row errors."},
		{Name: "Segments", Description: "Saved filters of the newsletter's subscribers, evaluated anew each time they are used."},
		{Name: "Bulk actions", Description: "Tags, attributes or unsubscribes applied in the background to the subscribers a filter, a segment or a list of ids selects."},
	}
	cfg.Components.SecuritySchemes = map[string]*huma.SecurityScheme{
		"bearer": {Type: "http", Scheme: "bearer", BearerFormat: "sk_…",
			Description: "An API key `sk_…` in `Authorization: Bearer <API_KEY>`."},
	}
	return cfg
}

type noMetrics struct{}

func (noMetrics) RequestStarted()                                                    {}
func (noMetrics) RequestDone()                                                       {}
func (noMetrics) ObserveRequest(context.Context, string, string, int, time.Duration) {}
func (noMetrics) SubscribersCreated(string, string, int)                             {}
func (noMetrics) AuthFailure(string)                                                 {}
func (noMetrics) IdempotencyOutcome(string)                                          {}
func (noMetrics) BulkGateWaiting(int)                                                {}
func (noMetrics) SuppressionsCreated(string, int)                                    {}
func (noMetrics) PagePost(string, string)                                            {}
func (noMetrics) BulkGateWait(string, time.Duration)                                 {}
func (noMetrics) PrivacyRequest(string, string)                                      {}
func (noMetrics) ScopeRefused(string)                                                {}
