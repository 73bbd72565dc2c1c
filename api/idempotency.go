package api

import (
	"bytes"
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
// To make a write operation idempotent, wrap its operation in idempotent when registering it:
//
//	huma.Register(s.api, idempotent(s.operation(http.MethodPost, ...)), handle(s, s.createWebhook))
//
// That is all: idempotent declares the Idempotency-Key header and the 400, 409 and 422
// responses in the document and marks the operation; the idempotency middleware (after
// authentication and limits, before the body is read by preflight) then answers replays,
// 409 and 422, and runs the handler inside IdempotencyStore.Run's transaction. The handler's
// store calls join that transaction when they open theirs with repo's runInTx, so the change
// and the stored response commit together. The handler itself needs no change.

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

// IdempotencyStore keeps idempotent responses; *repo.Idempotency is the implementation.
type IdempotencyStore interface {
	Lookup(ctx context.Context, nl uuid.UUID, key string) (model.StoredResponse, bool, error)
	Run(ctx context.Context, nl uuid.UUID, key string, fp []byte,
		fn func(ctx context.Context) (*model.StoredResponse, error)) (model.IdempotencyResult, error)
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
	for _, code := range []int{http.StatusBadRequest, http.StatusConflict, http.StatusUnprocessableEntity} {
		if !slices.Contains(op.Errors, code) {
			op.Errors = append(op.Errors, code)
		}
	}
	return op
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
	var rec *bufferedResponse
	res, err := s.cfg.Idempotency.Run(ctx.Context(), nl, key, fp, func(txCtx context.Context) (*model.StoredResponse, error) {
		rec = &bufferedResponse{headerRecorder: headerRecorder{header: http.Header{}}}
		r2 := r.WithContext(txCtx)
		r2.Body = newBufferedBody(body)
		next(humago.NewContext(ctx.Operation(), r2, rec))
		if rec.status < 200 || rec.status > 299 {
			return nil, nil // not stored: a failed request changed nothing
		}
		return &model.StoredResponse{Fingerprint: fp, Status: rec.status, Location: rec.header.Get("Location"),
			Body: rec.body.Bytes()}, nil
	})
	switch {
	case errors.Is(err, model.ErrIdempotencyInUse):
		s.idemOutcome(ctx, IdempotencyInUse)
		e := newError(http.StatusConflict, model.MsgIdempotencyKeyInUse)
		e.Code = CodeIdempotencyKeyInUse
		e.headers = http.Header{"Retry-After": {"1"}}
		s.writeErr(ctx, e)
	case err != nil:
		// The change, if any, rolled back: whatever the handler answered is not true.
		s.writeErr(ctx, err)
	case res.Stored != nil:
		s.answerStored(ctx, *res.Stored, fp)
	default:
		s.idemOutcome(ctx, IdempotencyRan)
		rec.flush(ctx)
	}
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
