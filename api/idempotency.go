package api

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"reflect"
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
// To make a write operation idempotent, wrap its operation in idempotent when registering it:
//
//	huma.Register(s.api, idempotent(s.operation(http.MethodPost, ...)), handle(s, s.createWebhook))
//
// That is all: idempotent declares the Idempotency-Key header and the 400, 408, 409, 413 and
// 422 responses and their codes in the document (codes.go) and marks the operation; the
// idempotency middleware (after authentication and limits, before the body is read by
// preflight) then answers replays and 422. Once Huma has decoded and validated the request,
// handle runs the handler inside IdempotencyStore.Run's unit of work, with the Stores that
// unit hands out, so the change and the stored response commit together; a key whose request
// still runs answers 409. The handler itself needs no change: it uses the Stores it is given.

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
// bound to it and stores fn's response there (cmd/subscriberd adapts *repo.Idempotency).
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

// IdempotencyOf is the IdempotencyStore of u, whose unit of work gives a request the Stores
// stores returns for it.
func IdempotencyOf[T any](u UnitOfWork[T], stores func(tx T) Stores) IdempotencyStore {
	return unitStore[T]{u: u, stores: stores}
}

type unitStore[T any] struct {
	u      UnitOfWork[T]
	stores func(T) Stores
}

func (s unitStore[T]) Lookup(ctx context.Context, nl uuid.UUID, key string) (model.StoredResponse, bool, error) {
	return s.u.Lookup(ctx, nl, key)
}

func (s unitStore[T]) Run(ctx context.Context, nl uuid.UUID, key string, fp []byte,
	fn func(st Stores) (*model.StoredResponse, error)) (model.IdempotencyResult, error) {
	return s.u.Run(ctx, nl, key, fp, func(tx T) (*model.StoredResponse, error) { return fn(s.stores(tx)) })
}

// metaIdempotent marks an operation that accepts Idempotency-Key.
const metaIdempotent = "idempotent"

// idempotent declares that op accepts Idempotency-Key (see the top of this file).
func idempotent(op huma.Operation) huma.Operation {
	op.Metadata[metaIdempotent] = true
	op.Parameters = append(op.Parameters, &huma.Param{
		Name: HeaderIdempotencyKey, In: "header",
		Description: "Makes the write safe to retry: a second request with the same key and the same method, path " +
			"and body within the retention time (24 h by default) gets the first one's response again, with " +
			"`Idempotent-Replayed: true`, and changes nothing. 1 to 255 visible ASCII characters; a UUID is a good choice.",
		Schema: &huma.Schema{Type: huma.TypeString, MinLength: ptr(1), MaxLength: ptr(model.MaxIdempotencyKeyLength),
			Pattern: "^[!-~]+$"},
		Example: "5f1c7a9e-3b1d-4c55-9d0e-2a6f4b8c1d2e",
	})
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
// header, answers a replay, 409 or 422, or runs the rest of the chain inside the store's
// transaction, holding the response until it is stored and committed.
func (s *Server) idempotency(ctx huma.Context, next func(huma.Context)) {
	r, key, ok := s.keyed(ctx, next, true)
	if !ok {
		return
	}
	body, ok := s.readBody(ctx, r)
	if !ok {
		return
	}
	nl := principalFrom(ctx.Context()).NewsletterID
	fp := model.Fingerprint(r.Method, r.URL.Path, body)
	stored, found, err := s.cfg.Idempotency.Lookup(ctx.Context(), nl, key)
	if err != nil {
		s.writeErr(ctx, err)
		return
	}
	if found {
		s.answerStored(ctx, stored, fp)
		return
	}
	status := ctx.Operation().DefaultStatus
	if status == 0 {
		status = http.StatusOK
	}
	req := &keyedRequest{nl: nl, key: key, fp: fp, status: status}
	rec := &bufferedResponse{headerRecorder: headerRecorder{header: http.Header{}}}
	r2 := r.WithContext(context.WithValue(ctx.Context(), keyedRequestKey{}, req))
	r2.Body = newBufferedBody(body)
	next(humago.NewContext(ctx.Operation(), r2, rec))
	switch {
	case req.inUse:
		s.idemOutcome(ctx, IdempotencyInUse)
		e := newError(http.StatusConflict, model.MsgIdempotencyKeyInUse)
		e.Code = CodeIdempotencyKeyInUse
		e.headers = http.Header{"Retry-After": {"1"}}
		s.writeErr(ctx, e)
	case req.stored != nil:
		s.answerStored(ctx, *req.stored, fp)
	default:
		// Ran, or refused before it could (a body Huma found invalid): the answer held in rec.
		s.idemOutcome(ctx, IdempotencyRan)
		rec.flush(ctx)
	}
}

// keyedRequest is what the idempotency middleware tells handle about a request with an
// Idempotency-Key, and what handle tells it back: that another request with the key is still
// running, or the stored response of one that finished first.
type keyedRequest struct {
	nl     uuid.UUID
	key    string
	fp     []byte
	status int // the operation's success status, stored with the response

	inUse  bool
	stored *model.StoredResponse
}

type keyedRequestKey struct{}

// errAnswered ends a handler whose answer the idempotency middleware gives instead.
var errAnswered = errors.New("answered by the idempotency middleware")

// runKeyed runs fn, the handler, in the unit of work of req's key (IdempotencyStore.Run) with
// the stores bound to it, and stores its output, encoded as Huma sends it, as the response.
func runKeyed[O any](s *Server, ctx context.Context, req *keyedRequest, fn func(Stores) (*O, error)) (*O, error) {
	var out *O
	res, err := s.cfg.Idempotency.Run(ctx, req.nl, req.key, req.fp, func(st Stores) (*model.StoredResponse, error) {
		o, err := fn(st)
		if err != nil {
			return nil, err
		}
		out = o
		location, body, status := outputParts(o)
		var buf bytes.Buffer
		if err := s.api.Marshal(&buf, "application/json", body); err != nil {
			return nil, err
		}
		if status == 0 {
			status = req.status
		}
		return &model.StoredResponse{Fingerprint: req.fp, Status: status, Location: location, Body: buf.Bytes()}, nil
	})
	switch {
	case errors.Is(err, model.ErrIdempotencyInUse):
		req.inUse = true
		return nil, errAnswered
	case err != nil:
		return nil, err
	case res.Stored != nil:
		req.stored = res.Stored
		return nil, errAnswered
	}
	return out, nil
}

// outputParts are the Location header, the body and the status of an operation's output, a
// pointer to a struct with a Body field and, for a create, a Location field tagged
// header:"Location"; an operation whose success status varies (the upsert's 201 or 200) sets
// it in a Status field, else status is 0.
func outputParts(out any) (location string, body any, status int) {
	v := reflect.ValueOf(out).Elem()
	t := v.Type()
	for i := range t.NumField() {
		switch f := t.Field(i); {
		case f.Name == "Body":
			body = v.Field(i).Interface()
		case f.Name == "Status" && f.Type.Kind() == reflect.Int:
			status = int(v.Field(i).Int())
		case f.Tag.Get("header") == "Location":
			location = v.Field(i).String()
		}
	}
	return location, body, status
}

// keyed returns the request and its Idempotency-Key when the middleware applies to it (when
// applies is set and the operation takes the header) and it has a valid one. Otherwise it
// reports false, having passed the request on (it has no key, or the middleware does not
// apply) or answered 400 (the header is there but not one valid key).
func (s *Server) keyed(ctx huma.Context, next func(huma.Context), applies bool) (*http.Request, string, bool) {
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
	r, key, ok := s.keyed(ctx, next, s.bulkSlots != nil && ctx.Operation().Metadata[metaGated] == true)
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

// answerStored answers a request whose key has a stored response: the replay when the
// fingerprints agree, else 422 idempotency_key_reused.
func (s *Server) answerStored(ctx huma.Context, stored model.StoredResponse, fp []byte) {
	if !bytes.Equal(stored.Fingerprint, fp) {
		s.idemOutcome(ctx, IdempotencyReused)
		e := newError(http.StatusUnprocessableEntity, model.MsgIdempotencyKeyReused)
		e.Code = CodeIdempotencyKeyReused
		e.Errors = map[string][]string{"idempotency_key": {model.MsgIdempotencyKeyReused}}
		s.writeErr(ctx, e)
		return
	}
	s.idemOutcome(ctx, IdempotencyReplayed)
	ctx.SetHeader("Content-Type", "application/json")
	if stored.Location != "" {
		ctx.SetHeader("Location", stored.Location)
	}
	ctx.SetHeader(HeaderReplayed, "true")
	ctx.SetStatus(stored.Status)
	ctx.BodyWriter().Write(stored.Body) //nolint:errcheck // the client may be gone
}

// idemOutcome records the outcome on the request's span (an "idempotency" event) and, but for
// ran, in the metrics.
func (s *Server) idemOutcome(ctx huma.Context, outcome string) {
	if span := trace.SpanFromContext(ctx.Context()); span.IsRecording() {
		span.AddEvent("idempotency", trace.WithAttributes(attribute.String("app.idempotency.outcome", outcome)))
		if outcome == IdempotencyReplayed {
			span.SetAttributes(attribute.Bool("app.idempotency.replayed", true))
		}
	}
	if outcome != IdempotencyRan {
		s.metrics.IdempotencyOutcome(outcome)
	}
}

// bufferedResponse holds a response until its record is committed: the status and headers
// as headerRecorder keeps them, and the body.
type bufferedResponse struct {
	headerRecorder
	body bytes.Buffer
}

func (b *bufferedResponse) Write(p []byte) (int, error) {
	b.headerRecorder.Write(p) //nolint:errcheck // records the status only
	return b.body.Write(p)
}

// flush sends the held response through ctx.
func (b *bufferedResponse) flush(ctx huma.Context) {
	for k, vs := range b.header {
		for i, v := range vs {
			if i == 0 {
				ctx.SetHeader(k, v)
			} else {
				ctx.AppendHeader(k, v)
			}
		}
	}
	if b.status == 0 {
		b.status = http.StatusOK
	}
	ctx.SetStatus(b.status)
	ctx.BodyWriter().Write(b.body.Bytes()) //nolint:errcheck // the client may be gone
}
