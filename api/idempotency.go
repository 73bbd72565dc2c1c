package api

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/adapters/humago"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/subscriberd/subscriberd/model"
)

// Idempotency-Key (docs/api-contract.md §8)
//
// A write becomes idempotent in two places, both typed: its input struct embeds Keyed (the
// header, decoded by Huma), and it is registered through registerKeyed instead of
// huma.Register:
//
//	registerKeyed(s, s.operation(http.MethodPost, ...), s.createWebhook)
//
// registerKeyed declares the header and the 400, 408, 409, 413 and 422 responses and their
// codes in the document (codes.go) and marks the operation. The idempotency middleware (after
// authentication and limits, before the body is read by preflight) checks the header and
// answers a replay or 422 from the stored response. Otherwise Huma decodes and validates the
// request, and runKeyed runs the handler inside IdempotencyStore.Run's unit of work with the
// Stores that unit hands out, so the change and the stored response commit together. Run says
// what happened: the handler ran, or another request with the key finished first (its stored
// response is sent byte for byte, or 422), or one still runs (409). The handler needs no
// change: it uses the Stores it is given, and its output says what is stored (response).

// HeaderIdempotencyKey and HeaderReplayed are the request and replay headers of §8.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderReplayed       = "Idempotent-Replayed"
)

// Error codes of §8.
const (
	CodeIdempotencyKeyInUse  = "idempotency_key_in_use"
	CodeIdempotencyKeyReused = "idempotency_key_reused"
)

// Outcomes of an idempotent request, as the idempotency event's app.idempotency.outcome and
// the IdempotencyOutcome metric.
const (
	IdempotencyRan      = "ran"      // the request ran under its key
	IdempotencyReplayed = "replayed" // a stored response was sent again
	IdempotencyInUse    = "in_use"   // 409: the key's first request is still running
	IdempotencyReused   = "reused"   // 422: the key was stored for another request
)

// IdempotencyStore keeps idempotent responses: Run runs fn in one unit of work with the stores
// bound to it and stores fn's response there (cmd/subscriberd passes IdempotencyOf of a
// *repo.Idempotency).
type IdempotencyStore interface {
	Lookup(ctx context.Context, nl uuid.UUID, key string) (model.StoredResponse, bool, error)
	Run(ctx context.Context, nl uuid.UUID, key string, fp []byte,
		fn func(st Stores) (*model.StoredResponse, error)) (model.IdempotencyResult, error)
}

// UnitOfWork is a store of idempotent responses whose Run hands fn its own unit of work, a T
// (*repo.Idempotency, with repo.Tx).
type UnitOfWork[T any] interface {
	Lookup(ctx context.Context, nl uuid.UUID, key string) (model.StoredResponse, bool, error)
	Run(ctx context.Context, nl uuid.UUID, key string, fp []byte,
		fn func(tx T) (*model.StoredResponse, error)) (model.IdempotencyResult, error)
}

// UnitStores is a unit of work that hands out the stores bound to it (repo.Tx): each of its
// methods returns one of the Stores.
type UnitStores[S Store, E EventStore, W WebhookStore, Q SuppressionStore, P PrivacyStore, G SegmentStore, B BulkActionStore] interface {
	Subscribers() S
	Events() E
	Webhooks() W
	Suppressions() Q
	Privacy() P
	Segments() G
	BulkActions() B
}

// IdempotencyOf is the IdempotencyStore of u, whose unit of work gives a request the Stores it
// hands out. The type arguments are inferred: IdempotencyOf(repo.NewIdempotency(db, ttl)).
func IdempotencyOf[T UnitStores[S, E, W, Q, P, G, B], S Store, E EventStore, W WebhookStore, Q SuppressionStore, P PrivacyStore, G SegmentStore, B BulkActionStore](
	u UnitOfWork[T]) IdempotencyStore {
	return unitStore[T, S, E, W, Q, P, G, B]{u: u}
}

type unitStore[T UnitStores[S, E, W, Q, P, G, B], S Store, E EventStore, W WebhookStore, Q SuppressionStore, P PrivacyStore, G SegmentStore, B BulkActionStore] struct {
	u UnitOfWork[T]
}

func (s unitStore[T, S, E, W, Q, P, G, B]) Lookup(ctx context.Context, nl uuid.UUID, key string) (model.StoredResponse, bool, error) {
	return s.u.Lookup(ctx, nl, key)
}

func (s unitStore[T, S, E, W, Q, P, G, B]) Run(ctx context.Context, nl uuid.UUID, key string, fp []byte,
	fn func(st Stores) (*model.StoredResponse, error)) (model.IdempotencyResult, error) {
	return s.u.Run(ctx, nl, key, fp, func(tx T) (*model.StoredResponse, error) {
		return fn(Stores{Subscribers: tx.Subscribers(), Events: tx.Events(), Webhooks: tx.Webhooks(),
			Suppressions: tx.Suppressions(), Privacy: tx.Privacy(), Segments: tx.Segments(), BulkActions: tx.BulkActions()})
	})
}

// metaIdempotent marks an operation that accepts Idempotency-Key.
const metaIdempotent = "idempotent"

// Keyed is the Idempotency-Key of a write's input: an input struct that embeds it takes the
// header, and its handler, registered through registerKeyed, runs under the key.
type Keyed struct {
	// Key is the header as sent; the idempotency middleware has refused it (400) unless it is
	// absent or one valid key.
	Key string `header:"Idempotency-Key"`
	// fp is the request's fingerprint (model.Fingerprint), set by Resolve when Key is.
	fp []byte
}

// keyed is how registerKeyed reaches the Keyed of an input that embeds it.
func (k *Keyed) keyed() *Keyed { return k }

// keyedInput is an input struct that embeds Keyed.
type keyedInput interface{ keyed() *Keyed }

// Resolve implements huma.Resolver: it takes the fingerprint of a request with a key, from its
// method, its path and its body as the idempotency middleware read and kept it (bufferedBody),
// which Huma has decoded since.
func (k *Keyed) Resolve(ctx huma.Context) []error {
	if k.Key == "" {
		return nil
	}
	r, _ := humago.Unwrap(ctx)
	var body []byte
	if b, ok := r.Body.(*bufferedBody); ok {
		body = b.all
	}
	k.fp = model.Fingerprint(r.Method, r.URL.Path, body)
	return nil
}

// response is the output of an idempotent write: what its stored response holds (docs/api-
// contract.md §8). status 0 is the operation's status; location "" sends no Location.
type response interface {
	response() (status int, location string, body any)
}

// handler is an operation's work: the caller, the stores to use (the pool's, or those of a
// key's unit of work), and the decoded input.
type handler[I, O any] func(ctx context.Context, p model.Principal, st Stores, in *I) (*O, error)

// registerKeyed registers op as a write that accepts Idempotency-Key, answered by fn (see the
// top of this file): fn's input embeds Keyed, and its output is a response.
func registerKeyed[I, O any, PI interface {
	*I
	keyedInput
}, PO interface {
	*O
	response
}](s *Server, op huma.Operation, fn handler[I, O]) {
	op = idempotent(op)
	status := cmp.Or(op.DefaultStatus, http.StatusOK)
	huma.Register(s.api, op, func(ctx context.Context, in *I) (*O, error) {
		k := PI(in).keyed()
		if k.Key == "" || s.cfg.Idempotency == nil {
			return run(s, ctx, fn, in)
		}
		return runKeyed(s, ctx, k, status, fn, in, func(o *O) (int, string, any) { return PO(o).response() })
	})
	// Huma declared the header from Keyed; the document says what it does, first among the
	// operation's parameters.
	item := s.api.OpenAPI().Paths[op.Path]
	for _, o := range []*huma.Operation{item.Post, item.Put, item.Patch, item.Delete} {
		if o == nil || o.OperationID != op.OperationID {
			continue
		}
		o.Parameters = slices.DeleteFunc(o.Parameters, func(p *huma.Param) bool {
			return p.In == "header" && p.Name == HeaderIdempotencyKey
		})
		o.Parameters = slices.Insert(o.Parameters, 0, idempotencyKeyParam())
	}
}

// idempotencyKeyParam is the document's Idempotency-Key parameter.
func idempotencyKeyParam() *huma.Param {
	return &huma.Param{
		Name: HeaderIdempotencyKey, In: "header",
		Description: "Makes the write safe to retry: a second request with the same key and the same method, path " +
			"and body within the retention time (24 h by default) gets the first one's response again, with " +
			"`Idempotent-Replayed: true`, and changes nothing. 1 to 255 visible ASCII characters; a UUID is a good choice.",
		Schema: &huma.Schema{Type: huma.TypeString, MinLength: ptr(1), MaxLength: ptr(model.MaxIdempotencyKeyLength),
			Pattern: "^[!-~]+$"},
		Example: "5f1c7a9e-3b1d-4c55-9d0e-2a6f4b8c1d2e",
	}
}

// idempotent declares that op accepts Idempotency-Key: its own answers and the mark the
// idempotency middleware applies to.
func idempotent(op huma.Operation) huma.Operation {
	op.Metadata[metaIdempotent] = true
	// The key's own answers; and the check reads the body (to fingerprint it), so a body too
	// slow or too large is answered there, on a write without a body too.
	op = answersUsual(op, http.StatusBadRequest, http.StatusRequestTimeout, http.StatusRequestEntityTooLarge)
	op = answers(op, http.StatusConflict, CodeIdempotencyKeyInUse)
	return answers(op, http.StatusUnprocessableEntity, CodeIdempotencyKeyReused)
}

// documentIdempotency describes, on every idempotent operation, the 409 response and its
// Retry-After, and the Idempotent-Replayed header of the success response.
func (s *Server) documentIdempotency() {
	for _, p := range s.api.OpenAPI().Paths {
		for _, op := range []*huma.Operation{p.Post, p.Put, p.Patch, p.Delete} {
			if op == nil || op.Metadata[metaIdempotent] != true {
				continue
			}
			if resp := op.Responses[strconv.Itoa(http.StatusConflict)]; resp != nil {
				resp.Description = "A request with the same Idempotency-Key is still being processed: retry after " +
					"Retry-After seconds to get its response."
				if resp.Headers == nil {
					resp.Headers = map[string]*huma.Param{}
				}
				resp.Headers["Retry-After"] = &huma.Param{Description: "Seconds to wait before retrying: 1.",
					Required: true, Schema: &huma.Schema{Type: huma.TypeInteger, Minimum: ptr(1.0)}}
			}
			for code, resp := range op.Responses {
				if !strings.HasPrefix(code, "2") {
					continue
				}
				if resp.Headers == nil {
					resp.Headers = map[string]*huma.Param{}
				}
				resp.Headers[HeaderReplayed] = &huma.Param{
					Description: "`true` when this is the stored response of an earlier request with the same Idempotency-Key.",
					Schema:      &huma.Schema{Type: huma.TypeString, Enum: []any{"true"}}}
			}
		}
	}
}

// idempotency applies Idempotency-Key to the operations marked idempotent: it checks the
// header and answers, from the stored response of an earlier request with the key, the
// replay or 422. Any other request with a key goes on with its body kept (bufferedBody), to
// run under the key (runKeyed).
func (s *Server) idempotency(ctx huma.Context, next func(huma.Context)) {
	r, key, ok := s.requestKey(ctx, next, true)
	if !ok {
		return
	}
	body, ok := s.readBody(ctx, r)
	if !ok {
		return
	}
	stored, found, err := s.cfg.Idempotency.Lookup(ctx.Context(), principalFrom(ctx.Context()).NewsletterID, key)
	switch {
	case err != nil:
		s.writeErr(ctx, err)
	case found:
		s.answerStored(ctx, stored, model.Fingerprint(r.Method, r.URL.Path, body))
	default:
		r.Body = newBufferedBody(body)
		next(ctx)
	}
}

// runKeyed runs fn, the handler, in the unit of work of k's key (IdempotencyStore.Run) with the
// stores bound to it, and stores there its output's response, encoded as Huma sends it (status
// 0: the operation's status). It answers fn's output, or, as Run reports, the stored response
// of a request with the key that finished first (replay, or 422), or 409 while one still runs.
func runKeyed[I, O any](s *Server, ctx context.Context, k *Keyed, status int, fn handler[I, O], in *I,
	parts func(*O) (int, string, any)) (*O, error) {
	p := principalFrom(ctx)
	var out *O
	res, err := s.cfg.Idempotency.Run(ctx, p.NewsletterID, k.Key, k.fp, func(st Stores) (*model.StoredResponse, error) {
		o, err := fn(ctx, p, st, in)
		if err != nil {
			return nil, err
		}
		out = o
		code, location, body := parts(o)
		var buf bytes.Buffer
		if err := s.api.Marshal(&buf, "application/json", body); err != nil {
			return nil, err
		}
		return &model.StoredResponse{Fingerprint: k.fp, Status: cmp.Or(code, status), Location: location, Body: buf.Bytes()}, nil
	})
	switch {
	case errors.Is(err, model.ErrIdempotencyInUse):
		s.idemOutcome(ctx, IdempotencyInUse)
		e := newError(http.StatusConflict, model.MsgIdempotencyKeyInUse)
		e.Code = CodeIdempotencyKeyInUse
		e.headers = http.Header{"Retry-After": {"1"}}
		return nil, e
	case err == nil && res.Stored != nil:
		return nil, s.storedAnswer(ctx, *res.Stored, k.fp)
	}
	s.idemOutcome(ctx, IdempotencyRan)
	if err != nil {
		return nil, s.mapError(ctx, err)
	}
	s.dbOutage.OK(ctx)
	return out, nil
}

// replay is a stored response sent again from a handler (runKeyed), as Huma sends an error:
// with its status, Location and Idempotent-Replayed, and its body byte for byte. The body was
// encoded by the API's JSON format, whose encoder compacts what MarshalJSON returns and ends it
// with a newline: it comes out as it was stored.
type replay struct{ stored model.StoredResponse }

func (r replay) Error() string { return "the stored response of an earlier request with the key" }

// GetStatus implements huma.StatusError.
func (r replay) GetStatus() int { return r.stored.Status }

// GetHeaders implements huma.HeadersError.
func (r replay) GetHeaders() http.Header {
	h := http.Header{HeaderReplayed: {"true"}}
	if r.stored.Location != "" {
		h.Set("Location", r.stored.Location)
	}
	return h
}

// MarshalJSON is the stored body.
func (r replay) MarshalJSON() ([]byte, error) { return r.stored.Body, nil }

// storedAnswer is the answer to a request whose key has a stored response, as a handler returns
// it: the replay when the fingerprints agree, else 422 idempotency_key_reused.
func (s *Server) storedAnswer(ctx context.Context, stored model.StoredResponse, fp []byte) error {
	if !bytes.Equal(stored.Fingerprint, fp) {
		s.idemOutcome(ctx, IdempotencyReused)
		e := newError(http.StatusUnprocessableEntity, model.MsgIdempotencyKeyReused)
		e.Code = CodeIdempotencyKeyReused
		e.Errors = map[string][]string{"idempotency_key": {model.MsgIdempotencyKeyReused}}
		return e
	}
	s.idemOutcome(ctx, IdempotencyReplayed)
	return replay{stored}
}

// requestKey returns the request and its Idempotency-Key when the middleware applies to it (when
// applies is set and the operation takes the header) and it has a valid one. Otherwise it
// reports false, having passed the request on (it has no key, or the middleware does not
// apply) or answered 400 (the header is there but not one valid key).
func (s *Server) requestKey(ctx huma.Context, next func(huma.Context), applies bool) (*http.Request, string, bool) {
	if !applies || s.cfg.Idempotency == nil || ctx.Operation().Metadata[metaIdempotent] != true {
		next(ctx)
		return nil, "", false
	}
	r, _ := humago.Unwrap(ctx)
	vals, present := r.Header[HeaderIdempotencyKey]
	switch {
	case !present:
		next(ctx)
		return nil, "", false
	case len(vals) != 1 || !model.ValidIdempotencyKey(vals[0]):
		s.writeErr(ctx, newError(http.StatusBadRequest, model.MsgIdempotencyKeyInvalid))
		return nil, "", false
	}
	return r, vals[0], true
}

// replayUngated answers, before the bulk gate, the requests of gated operations whose
// Idempotency-Key has a stored response: a replay, or a 422, needs no bulk slot. A client
// that retries a bulk create after a timeout, when the gate is most likely full, then gets its
// answer at once instead of queueing behind the imports that are running. The body is hashed
// as it is read and not kept, as no request before the gate keeps one; a bad key answers 400
// here too, since a refused request never waits. Every other request goes on to the gate, and
// idempotency, after it, looks the key up again: the first request with the key may finish
// while this one waits.
func (s *Server) replayUngated(ctx huma.Context, next func(huma.Context)) {
	r, key, ok := s.requestKey(ctx, next, s.bulkSlots != nil && ctx.Operation().Metadata[metaGated] == true)
	if !ok {
		return
	}
	stored, found, err := s.cfg.Idempotency.Lookup(ctx.Context(), principalFrom(ctx.Context()).NewsletterID, key)
	switch {
	case err != nil:
		s.writeErr(ctx, err)
	case !found:
		next(ctx)
	default:
		if sum, ok := s.hashBody(ctx, r); ok {
			s.answerStored(ctx, stored, model.FingerprintSum(r.Method, r.URL.Path, sum))
		}
	}
}

// answerStored answers, from a middleware, a request whose key has a stored response: the
// replay when the fingerprints agree, else 422 idempotency_key_reused (storedAnswer).
func (s *Server) answerStored(ctx huma.Context, stored model.StoredResponse, fp []byte) {
	var r replay
	if err := s.storedAnswer(ctx.Context(), stored, fp); !errors.As(err, &r) {
		s.writeErr(ctx, err)
		return
	}
	ctx.SetHeader("Content-Type", "application/json")
	for k, v := range r.GetHeaders() {
		ctx.SetHeader(k, v[0])
	}
	ctx.SetStatus(stored.Status)
	ctx.BodyWriter().Write(stored.Body) //nolint:errcheck // the client may be gone
}

// idemOutcome records the outcome on the request's span (an "idempotency" event) and, but for
// ran, in the metrics.
func (s *Server) idemOutcome(ctx context.Context, outcome string) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent("idempotency", trace.WithAttributes(attribute.String("app.idempotency.outcome", outcome)))
		if outcome == IdempotencyReplayed {
			span.SetAttributes(attribute.Bool("app.idempotency.replayed", true))
		}
	}
	if outcome != IdempotencyRan {
		s.metrics.IdempotencyOutcome(outcome)
	}
}
