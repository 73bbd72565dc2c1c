package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/adapters/humago"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/subscriberd/subscriberd/model"
)

// MaxBodyBytes is the largest request body accepted (docs/api-contract.md §4.7).
const MaxBodyBytes = 1 << 20

// bulkPath is the path of the bulk create, whose only method is POST.
const bulkPath = BasePath + "/subscribers/bulk"

// RouteUnmatched is the route of requests that matched no operation.
const RouteUnmatched = "unmatched"

type ctxKey int

// principalKey carries the authenticated caller (model.Principal), read-only.
const principalKey ctxKey = 0

// statusWriter remembers the status and size of a response, and the route that answered it,
// for the access log and the metrics.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int
	route  string
}

// SetRoute implements routeSetter: route tells it the route it matched, and it tells the
// writers it wraps (the server span's).
func (w *statusWriter) SetRoute(route string) {
	w.route = route
	setRoute(w.ResponseWriter, route)
}

// WriteHeader sends the status once. A later call is not passed on (net/http would log
// "superfluous response.WriteHeader call"), except that StatusClientClosed is remembered:
// Huma sets it when the client went away while the body was being written.
func (w *statusWriter) WriteHeader(code int) {
	if code < 200 { // informational: any number may precede the status
		w.ResponseWriter.WriteHeader(code)
		return
	}
	if w.status != 0 {
		if code == StatusClientClosed {
			w.status = code
		}
		return
	}
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += n
	return n, err
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// recoverer turns a panic into a generic 500; the stack goes to the log only.
func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// observe, just outside, already tracks what was written; wrap only when used alone.
		sw, ok := w.(*statusWriter)
		if !ok {
			sw = &statusWriter{ResponseWriter: w}
		}
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.ErrorContext(r.Context(), "panic serving request", "panic", v, "stack", string(debug.Stack()))
				if sw.status == 0 {
					writeError(sw, newError(http.StatusInternalServerError, MsgInternal))
				}
			}
		}()
		next.ServeHTTP(sw, r)
	})
}

// envelope sets the headers every response carries (docs/api-contract.md §1).
func (s *Server) envelope(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h["Cache-Control"] = noStore
		h["X-Content-Type-Options"] = noSniff
		h.Set("X-Request-Id", requestID(r.Header.Get("X-Request-Id")))
		next.ServeHTTP(w, r)
	})
}

// The values of the constant headers, shared by every response: Header.Set would allocate a
// one-element slice for each, on every request. Nothing changes a header value in place, and
// Header.Add appends to a full slice, which copies it.
var (
	noStore = []string{"no-store"}
	noSniff = []string{"nosniff"}
)

// requestID keeps the caller's id when it is 1–128 characters of [A-Za-z0-9._-], else makes one.
func requestID(given string) string {
	if given != "" && len(given) <= 128 && strings.Trim(given,
		"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") == "" {
		return given
	}
	var b [16]byte
	rand.Read(b[:]) //nolint:errcheck // never fails
	return hex.EncodeToString(b[:])
}

// observe writes the access log line and the request metrics.
func (s *Server) observe(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		s.metrics.RequestStarted()
		sw := &statusWriter{ResponseWriter: w, route: RouteUnmatched}
		ctx := r.Context()
		defer s.metrics.RequestDone()
		next.ServeHTTP(sw, r)
		end := time.Now()
		d := end.Sub(start)
		switch {
		case sw.status == 0 && clientGone(r.Context()):
			// Nothing was answered: nobody was left to read it. The status still goes out (to
			// a closed connection) so that the tracing handler outside records it too.
			sw.WriteHeader(StatusClientClosed)
		case sw.status == 0:
			sw.status = http.StatusOK
		}
		s.metrics.ObserveRequest(ctx, r.Method, sw.route, sw.status, d)
		if s.log.Enabled(ctx, slog.LevelInfo) {
			var reqID string // set by envelope; read without canonicalising the name
			if v := w.Header()["X-Request-Id"]; len(v) > 0 {
				reqID = v[0]
			}
			s.log.LogAttrs(ctx, slog.LevelInfo, "request", slog.String("method", r.Method), slog.String("route", sw.route),
				slog.Int("status", sw.status), slog.Float64("duration_ms", float64(d.Microseconds())/1000),
				slog.Int("bytes", sw.bytes), slog.String("request_id", reqID))
		}
	})
}

// route answers requests that match no route with the envelope: 404, or 405 with Allow. The
// decision is the mux's own, made before authentication.
func (s *Server) route(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, upsertPrefix) {
			routeUpsert(mux, w, r) // the address may hold what the mux would clean away
			return
		}
		if !cleanPath(r.URL.Path) {
			writeError(w, newError(http.StatusNotFound, MsgRouteNotFound))
			return
		}
		// GET /subscribers/{id} would take /subscribers/bulk as an id and answer 404; the path
		// is known, so another method than POST is 405 (docs/api-contract.md §4.7).
		if r.URL.Path == bulkPath && r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeError(w, newError(http.StatusMethodNotAllowed, MsgMethod))
			return
		}
		if _, pattern := mux.Handler(r); pattern != "" {
			// "POST /api/v1/subscribers" → "/api/v1/subscribers": the template, never the path.
			_, route, _ := strings.Cut(pattern, " ")
			setRoute(w, route)
			mux.ServeHTTP(w, r)
			return
		}
		rec := &headerRecorder{header: http.Header{}}
		mux.ServeHTTP(rec, r)
		switch rec.status {
		case http.StatusNotFound:
			writeError(w, newError(http.StatusNotFound, MsgRouteNotFound))
		case http.StatusMethodNotAllowed:
			w.Header().Set("Allow", rec.header.Get("Allow"))
			writeError(w, newError(http.StatusMethodNotAllowed, MsgMethod))
		default:
			writeError(w, newError(http.StatusNotFound, MsgRouteNotFound))
		}
	})
}

// routeSetter is a response writer that wants the route the request matched: observe's (for
// the access log and the metrics) and the server span's outside (telemetry.NewHTTPHandler's),
// which names the span "METHOD /route" and sets http.route, as the HTTP semantic conventions
// ask. It cannot see the route itself, as the middleware here hands the mux a copy of the
// request. The route travels with the response, not in the request's context.
type routeSetter interface{ SetRoute(route string) }

// setRoute tells route to the first routeSetter among w and the writers it wraps.
func setRoute(w http.ResponseWriter, route string) {
	for {
		if rs, ok := w.(routeSetter); ok {
			rs.SetRoute(route)
			return
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return
		}
		w = u.Unwrap()
	}
}

// headerRecorder captures a response's status and headers and drops its body: what the mux
// would answer an unrouted request, and the head of a held idempotent response.
type headerRecorder struct {
	header http.Header
	status int
}

func (r *headerRecorder) Header() http.Header { return r.header }
func (r *headerRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}
func (r *headerRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return len(b), nil
}

// authenticate checks the bearer key and the plan (docs/api-contract.md §5 steps 2–3). Every 401 counts
// toward the client's lockout.
func (s *Server) authenticate(ctx huma.Context, next func(huma.Context)) {
	if len(ctx.Operation().Security) == 0 {
		next(ctx)
		return
	}
	// An "auth" event on the server span (cheaper than a span of its own, and most lookups
	// hit the key cache): the outcome and the key's public id, never the key.
	header := ctx.Header("Authorization")
	p, event, err := s.principal(ctx.Context(), header)
	outcome := authOK
	// AsType rather than As, whose target escapes: an allocation on every request.
	apiErr, isAPIErr := errors.AsType[*Error](err)
	refused := isAPIErr && apiErr.status == http.StatusUnauthorized
	switch {
	case refused:
		outcome = authFailure(header, p)
	case err != nil:
		outcome = authError
	case !p.APIAccess:
		outcome = authPlanDisabled
	}
	if span := trace.SpanFromContext(ctx.Context()); span.IsRecording() {
		if err != nil { // a verified key's event comes with it (kept in the key cache)
			event = authEvent(outcome, p.KeyID)
		}
		span.AddEvent("auth", event...)
	}
	if outcome != authOK && outcome != authError {
		s.metrics.AuthFailure(outcome)
	}
	if err != nil {
		if s.limiter != nil && refused {
			if d := s.limiter.AuthFailed(ctx.Context(), s.clientIP(ctx)); !d.Allowed {
				err = tooManyRequests(d, MsgClientLocked) // a failure that raced the one that locked
			}
		}
		s.writeErr(ctx, err)
		return
	}
	if !p.APIAccess {
		s.writeErr(ctx, newError(http.StatusForbidden, MsgAccessDisabled))
		return
	}
	if s.cfg.KeyUsage != nil {
		s.usage.used(p.KeyID, time.Now())
	}
	next(huma.WithValue(ctx, principalKey, p))
}

// Authentication outcomes, as the auth event's app.auth.outcome and the AuthFailure reason.
const (
	authOK           = "ok"
	authMissing      = "missing"       // no Authorization header, or another scheme
	authInvalid      = "invalid"       // malformed or unknown key
	authRevoked      = "revoked"       // a revoked key (answered as an unknown one)
	authPlanDisabled = "plan_disabled" // the newsletter's plan has API access disabled
	authError        = "error"         // the key could not be checked (the database failed)
)

// authEvent is the options of the "auth" event of outcome: the outcome and, for a verified
// key, its public id. Those of outcomes without a key are made once (nothing of a request is
// in them), and a verified key's are kept beside it in the key cache, so that a request
// allocates none of them; the SDK copies the attributes out.
func authEvent(outcome string, keyID uuid.UUID) []trace.EventOption {
	if keyID == uuid.Nil {
		if ev, ok := keylessAuthEvents[outcome]; ok {
			return ev
		}
		return []trace.EventOption{trace.WithAttributes(attribute.String("app.auth.outcome", outcome))}
	}
	return []trace.EventOption{trace.WithAttributes(attribute.String("app.auth.outcome", outcome),
		attribute.String("app.api_key.id", keyID.String()))}
}

// keylessAuthEvents are the auth event options of the outcomes that name no key.
var keylessAuthEvents = func() map[string][]trace.EventOption {
	m := map[string][]trace.EventOption{}
	for _, o := range []string{authOK, authMissing, authInvalid, authRevoked, authPlanDisabled, authError} {
		m[o] = []trace.EventOption{trace.WithAttributes(attribute.String("app.auth.outcome", o))}
	}
	return m
}()

// verifiedEvent is the auth event options of a verified key: ok, or plan_disabled when its
// newsletter's plan has API access off.
func verifiedEvent(p model.Principal) []trace.EventOption {
	if !p.APIAccess {
		return authEvent(authPlanDisabled, p.KeyID)
	}
	return authEvent(authOK, p.KeyID)
}

// authFailure classifies a request refused with 401 by its header and what principal found:
// the id of a revoked key, or nothing.
func authFailure(header string, p model.Principal) string {
	if scheme, _, ok := strings.Cut(header, " "); !ok || !strings.EqualFold(scheme, "Bearer") {
		return authMissing
	}
	if p.KeyID != uuid.Nil {
		return authRevoked
	}
	return authInvalid
}

// principal verifies an Authorization header value. With the principal of a verified key
// come the options of its auth event (authEvent); they are nil when err is not. A revoked key
// is refused as an unknown one, but its id comes back for the auth event and the metric.
func (s *Server) principal(ctx context.Context, header string) (model.Principal, []trace.EventOption, error) {
	scheme, key, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return model.Principal{}, nil, unauthorized()
	}
	key = strings.TrimSpace(key)
	if !model.WellFormedKey(key) {
		return model.Principal{}, nil, unauthorized()
	}
	hash := model.HashKey(key)
	if e, ok := s.keys.get(hash); ok {
		return e.p, e.event, nil
	}
	p, err := s.cfg.Auth.Authenticate(ctx, hash)
	switch {
	case errors.Is(err, model.ErrKeyRevoked):
		return model.Principal{KeyID: p.KeyID}, nil, unauthorized()
	case errors.Is(err, model.ErrKeyNotFound):
		return model.Principal{}, nil, unauthorized()
	case err != nil:
		return model.Principal{}, nil, s.mapError(ctx, err)
	}
	s.dbOutage.OK(ctx)
	event := verifiedEvent(p)
	s.keys.put(hash, p, event)
	return p, event, nil
}

// Operation metadata: what top-level JSON type an operation's body must be.
const (
	metaBody   = "body"
	bodyObject = "object"
	bodyArray  = "array"
)

// metaBulkPath is operation metadata set on create: the bulk path an array body was meant for.
const metaBulkPath = "bulk_path"

// preflight answers malformed bodies before Huma parses them: 415 for another media type,
// 413 above MaxBodyBytes, 400 for a body that is empty, not UTF-8, not one JSON value or of
// the wrong top-level type. What passes is valid JSON of the right shape.
func (s *Server) preflight(ctx huma.Context, next func(huma.Context)) {
	want, _ := ctx.Operation().Metadata[metaBody].(string)
	if want == "" {
		next(ctx)
		return
	}
	if ct := ctx.Header("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			s.writeErr(ctx, newError(http.StatusUnsupportedMediaType, MsgMediaType))
			return
		}
	}
	r, _ := humago.Unwrap(ctx)
	// Media types are case-insensitive; Huma looks its formats up by exact string.
	r.Header.Set("Content-Type", "application/json")
	body, ok := s.readBody(ctx, r)
	if !ok {
		return
	}
	bulkPath, _ := ctx.Operation().Metadata[metaBulkPath].(string)
	if msg := malformed(body, want, bulkPath); msg != "" {
		s.writeErr(ctx, newError(http.StatusBadRequest, msg))
		return
	}
	r.Body = newBufferedBody(body)
	next(ctx)
}

// malformed says what is wrong with a body that must be one JSON value of kind want, or "".
// bulkPath, when set, is where an array sent to this operation belongs.
func malformed(body []byte, want, bulkPath string) string {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	switch {
	case len(trimmed) == 0:
		return "The request body is required."
	case !utf8.Valid(body):
		return "The request body is not valid UTF-8."
	case !json.Valid(body):
		return invalidJSON(body)
	case want == bodyObject && trimmed[0] == '[' && bulkPath != "":
		return "The request body must be a JSON object. To create several subscribers at once, send the array to POST " + bulkPath + "."
	case want == bodyObject && trimmed[0] != '{':
		return "The request body must be a JSON object."
	case want == bodyArray && trimmed[0] != '[':
		return "The request body must be a JSON array."
	}
	return ""
}

// invalidJSON is the 400 message for a body that is not valid JSON: where the parser stopped,
// as a line and a column (characters, from 1), and why (docs/api-contract.md §3).
func invalidJSON(body []byte) string {
	var v any
	err := json.Unmarshal(body, &v)
	var syn *json.SyntaxError
	if !errors.As(err, &syn) {
		return "The request body is not valid JSON."
	}
	// Offset counts the bytes read, the offending one included; at the end of input there is
	// none, and the position is just past the last byte.
	pos := int(syn.Offset)
	if pos > 0 && pos <= len(body) && !strings.HasPrefix(syn.Error(), "unexpected end") {
		pos--
	}
	pos = min(pos, len(body))
	line := 1 + bytes.Count(body[:pos], []byte{'\n'})
	col := 1 + utf8.RuneCount(body[bytes.LastIndexByte(body[:pos], '\n')+1:pos])
	why := syn.Error()
	if pos < len(body) && body[pos] >= utf8.RuneSelf {
		// encoding/json names the character by its first byte alone ('ï' for a byte order
		// mark): name the character the body has there.
		r, _ := utf8.DecodeRune(body[pos:])
		why = strings.Replace(why, fmt.Sprintf("%q", rune(body[pos])), fmt.Sprintf("%q", r), 1)
	}
	return fmt.Sprintf("The request body is not valid JSON: %s at line %d, column %d.", why, line, col)
}

// writeErr writes an error from a Huma middleware in the envelope.
func (s *Server) writeErr(ctx huma.Context, err error) {
	var e *Error
	if !errors.As(err, &e) {
		e = s.mapError(ctx.Context(), err).(*Error)
	}
	for k, vs := range e.headers {
		for _, v := range vs {
			ctx.AppendHeader(k, v)
		}
	}
	ctx.SetHeader("Content-Type", "application/json")
	ctx.SetStatus(e.status)
	json.NewEncoder(ctx.BodyWriter()).Encode(e) //nolint:errcheck // client may be gone
}

// principalFrom returns the verified principal of the request.
func principalFrom(ctx context.Context) model.Principal {
	p, _ := ctx.Value(principalKey).(model.Principal)
	return p
}

// bufferedBody is a request body read whole into memory by readBody, handed on to the handler (and
// to a later readBody, which takes it as it is instead of copying it again).
type bufferedBody struct {
	*bytes.Reader
	all []byte
}

func newBufferedBody(b []byte) *bufferedBody {
	return &bufferedBody{Reader: bytes.NewReader(b), all: b}
}

// Close implements io.Closer: there is nothing to release.
func (*bufferedBody) Close() error { return nil }

// readBody reads r's body, at most MaxBodyBytes of it. When that fails it answers — 408 when
// the server's read timeout ended before the body did, 499 when the client hung up in the
// middle of its body, 400 when the body cannot be read, 413 when it is too large — and
// reports false.
func (s *Server) readBody(ctx huma.Context, r *http.Request) ([]byte, bool) {
	if b, ok := r.Body.(*bufferedBody); ok && b.Len() == len(b.all) {
		return b.all, true // read and checked by an earlier middleware (idempotency), unread since
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	return body, s.bodyRead(ctx, err, int64(len(body)))
}

// hashBody is readBody for a request whose body only needs its SHA-256: it hashes the body as
// it reads it and keeps none of it.
func (s *Server) hashBody(ctx huma.Context, r *http.Request) ([sha256.Size]byte, bool) {
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(r.Body, MaxBodyBytes+1))
	return [sha256.Size]byte(h.Sum(nil)), s.bodyRead(ctx, err, n)
}

// bodyRead answers a body read that ended with err after n bytes, as readBody says, and
// reports whether the read succeeded.
func (s *Server) bodyRead(ctx huma.Context, err error, n int64) bool {
	switch {
	case err != nil && errors.Is(err, os.ErrDeadlineExceeded):
		// The server's read timeout ended while the body was still arriving. net/http cancels
		// the request's context then, as when a client leaves, but this client is still
		// sending: it is the server's timeout, answered 408 (docs/api-contract.md §17).
		s.writeErr(ctx, requestTimeout())
		return false
	case err != nil && (clientGone(ctx.Context()) || errors.Is(err, io.ErrUnexpectedEOF)):
		s.writeErr(ctx, clientClosed())
		return false
	case err != nil:
		s.writeErr(ctx, newError(http.StatusBadRequest, "The request body could not be read."))
		return false
	case n > MaxBodyBytes:
		s.writeErr(ctx, errBodyTooLarge)
		return false
	}
	return true
}
