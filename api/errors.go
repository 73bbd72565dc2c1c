package api

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/danielgtaylor/huma/v2"

	"github.com/subscriberd/subscriberd/model"
)

// Error codes of the contract.
const (
	CodeValidation         = "validation_error"
	CodeUnauthorized       = "unauthorized"
	CodeAPIAccessDisabled  = "api_access_disabled"
	CodeInsufficientScope  = "insufficient_scope"
	CodeNotFound           = "not_found"
	CodeMethodNotAllowed   = "method_not_allowed"
	CodePayloadTooLarge    = "payload_too_large"
	CodeUnsupportedMedia   = "unsupported_media_type"
	CodeEmailTaken         = "email_already_subscribed"
	CodeEmailSuppressed    = "email_suppressed"
	CodeRateLimitExceeded  = "rate_limit_exceeded"
	CodeInternal           = "internal_error"
	CodeServiceUnavailable = "service_unavailable"
	CodeRequestTimeout     = "request_timeout"
	// CodeClientClosed is the code of StatusClientClosed. The client is gone and never reads
	// it; it names the request's end in logs and metrics.
	CodeClientClosed = "client_closed"
)

// StatusClientClosed is the status a request ends with when its client went away before the
// answer (nginx's 499): not the service's failure, so not a 5xx, and left out of the
// availability SLO (deploy/prometheus/rules.yml).
const StatusClientClosed = 499

// Messages of the contract for errors that are not about a field.
const (
	MsgInvalidKey      = "Invalid API key."
	MsgAccessDisabled  = "API access is not enabled."
	MsgNotFound        = "Subscriber not found."
	MsgWebhookNotFound = "Webhook not found."
	// MsgSuppressionNotFound is docs/api-contract.md §13's 404.
	MsgSuppressionNotFound = "Suppression not found."
	MsgRouteNotFound       = "The requested resource was not found."
	MsgMethod              = "The method is not allowed for this resource."
	MsgTooLarge            = "The request body must not be larger than 1 MiB."
	MsgMediaType           = "The request body must be sent as application/json."
	MsgInvalidData         = "The given data was invalid."
	MsgRateLimited         = "Too many requests. Please try again later."
	MsgClientLocked        = "Too many failed authentication attempts from this address. Please try again later."
	MsgKeyLocked           = "Too many rejected requests with this API key. Please try again later."
	MsgInternal            = "An unexpected error occurred."
	MsgUnavailable         = "The service is temporarily unavailable. Please try again later."
	MsgRequestTimeout      = "The request body took too long to arrive."
	unavailableRetryIn     = 5 // seconds, sent as Retry-After with 503
)

// codeByStatus is the code an error of a status gets unless its builder names another.
var codeByStatus = map[int]string{
	http.StatusBadRequest:            CodeValidation,
	http.StatusUnauthorized:          CodeUnauthorized,
	http.StatusForbidden:             CodeAPIAccessDisabled,
	http.StatusNotFound:              CodeNotFound,
	http.StatusMethodNotAllowed:      CodeMethodNotAllowed,
	http.StatusRequestEntityTooLarge: CodePayloadTooLarge,
	http.StatusUnsupportedMediaType:  CodeUnsupportedMedia,
	http.StatusUnprocessableEntity:   CodeValidation,
	http.StatusTooManyRequests:       CodeRateLimitExceeded,
	http.StatusInternalServerError:   CodeInternal,
	http.StatusServiceUnavailable:    CodeServiceUnavailable,
	http.StatusRequestTimeout:        CodeRequestTimeout,
}

// Error is the contract's error envelope. It is the only error body the service sends.
type Error struct {
	status  int
	headers http.Header

	Success bool   `json:"success" doc:"Always false." example:"false"`
	Code    string `json:"code" doc:"Machine-readable error code (the full list is written by documentErrors)."`
	Message string `json:"message" doc:"Human-readable description."`
	// Errors is FieldErrors on 422 and RetryAfter on 429, absent otherwise. Those two
	// responses are documented with their own schemas (ValidationError, RateLimitError), so
	// that a generated client gets typed fields rather than an untyped value.
	Errors any `json:"errors,omitempty" hidden:"true"`
}

// ValidationError documents the 422 body: the envelope with the messages of each failing field.
type ValidationError struct {
	Success bool        `json:"success" doc:"Always false." example:"false"`
	Code    string      `json:"code" doc:"Machine-readable error code."`
	Message string      `json:"message" doc:"Human-readable description." example:"The given data was invalid."`
	Errors  FieldErrors `json:"errors"`
}

// FieldErrors are the messages of a 422 keyed by field: email, name, status, another property
// that is not allowed, <index>.<field> in bulk, or body for the body as a whole.
type FieldErrors map[string][]string

// Schema implements huma.SchemaProvider.
func (FieldErrors) Schema(huma.Registry) *huma.Schema {
	return &huma.Schema{Type: huma.TypeObject,
		Description: "Messages keyed by field (`email`, `name`, `status`, `<index>.<field>` in bulk, or `body`), " +
			"each an array of one or more strings.",
		AdditionalProperties: &huma.Schema{Type: huma.TypeArray, MinItems: ptr(1), Items: &huma.Schema{Type: huma.TypeString}},
		Examples:             []any{map[string][]string{"email": {"The email field must be a valid email address."}}},
	}
}

// RateLimitError documents the 429 body: the envelope with the wait before a retry can succeed.
type RateLimitError struct {
	Success bool       `json:"success" doc:"Always false." example:"false"`
	Code    string     `json:"code" enum:"rate_limit_exceeded" doc:"Machine-readable error code."`
	Message string     `json:"message" doc:"Says which applies: a rate limit, the client's lockout or the key's." example:"Too many requests. Please try again later."`
	Errors  RetryAfter `json:"errors"`
}

// RetryAfter is the errors member of a 429.
type RetryAfter struct {
	RetryAfter int `json:"retry_after" minimum:"1" doc:"Whole seconds until a retry can succeed; equal to the Retry-After header."`
}

// Error implements error.
func (e *Error) Error() string { return e.Code + ": " + e.Message }

// GetStatus implements huma.StatusError.
func (e *Error) GetStatus() int { return e.status }

// GetHeaders implements huma.HeadersError.
func (e *Error) GetHeaders() http.Header { return e.headers }

// newError builds the envelope for status with message msg.
func newError(status int, msg string) *Error {
	code, ok := codeByStatus[status]
	if !ok {
		code = CodeInternal
		if status < 500 {
			code = CodeValidation
		}
	}
	return &Error{status: status, Code: code, Message: msg}
}

// humaError is installed as huma.NewError: Huma's own errors (unparsable parameters and
// bodies, missing bodies) become the envelope. It builds; it maps nothing.
func humaError(status int, msg string, errs ...error) huma.StatusError {
	if status == 0 { // Huma calls NewError(0, "") to learn the schema.
		return &Error{}
	}
	if status == http.StatusUnprocessableEntity && len(errs) > 0 {
		fields := map[string][]string{}
		for _, err := range errs {
			var d huma.ErrorDetailer
			if errors.As(err, &d) {
				det := d.ErrorDetail()
				fields[laravelKey(det.Location)] = append(fields[laravelKey(det.Location)], det.Message)
			}
		}
		e := newError(status, MsgInvalidData)
		e.Errors = fields
		return e
	}
	if msg == "" || msg == "validation failed" {
		msg = http.StatusText(status)
	}
	return newError(status, msg)
}

// laravelKey turns a Huma location (body[2].email, query.limit) into a Laravel key (2.email).
func laravelKey(loc string) string {
	for _, p := range []string{"body", "query.", "path.", "header."} {
		if strings.HasPrefix(loc, p) {
			loc = loc[len(p):]
			break
		}
	}
	loc = strings.NewReplacer("[", ".", "]", "").Replace(loc)
	loc = strings.TrimPrefix(loc, ".")
	if loc == "" {
		return "body"
	}
	return loc
}

// validationError is the 422 for failed field rules.
func validationError(v *model.ValidationError) *Error {
	e := newError(http.StatusUnprocessableEntity, MsgInvalidData)
	e.Errors = v.Fields
	return e
}

// suppressedError is the 422 email_suppressed of docs/api-contract.md §13: for one address its
// message is the field's; a bulk's is the general one.
func suppressedError(se *model.SuppressedError) *Error {
	msg := MsgInvalidData
	if !se.Bulk && len(se.Reasons) == 1 {
		msg = model.SuppressedMessage(se.Reasons[0])
	}
	e := newError(http.StatusUnprocessableEntity, msg)
	e.Code = CodeEmailSuppressed
	e.Errors = se.Fields()
	return e
}

func unauthorized() *Error {
	e := newError(http.StatusUnauthorized, MsgInvalidKey)
	e.headers = http.Header{"Www-Authenticate": {"Bearer"}}
	return e
}

func unavailable() *Error {
	e := newError(http.StatusServiceUnavailable, MsgUnavailable)
	e.headers = http.Header{"Retry-After": {strconv.Itoa(unavailableRetryIn)}}
	return e
}

// clientGone reports whether the request of ctx ended because its client went away: net/http
// cancels a request's context when its connection closes.
func clientGone(ctx context.Context) bool { return errors.Is(ctx.Err(), context.Canceled) }

// requestTimeout is the answer to a request whose body was still arriving when the server's
// read timeout ended (docs/api-contract.md §17). The connection cannot carry another request
// (its body was not read to the end), so net/http closes it after this answer.
func requestTimeout() *Error {
	e := newError(http.StatusRequestTimeout, MsgRequestTimeout)
	e.headers = http.Header{"Connection": {"close"}}
	return e
}

// clientClosed is the answer of a request whose client went away (StatusClientClosed).
func clientClosed() *Error {
	e := newError(StatusClientClosed, "The client closed the request.")
	e.Code = CodeClientClosed
	return e
}

// mapError is the one place where domain errors become HTTP errors. Anything unknown is a
// generic 500 whose cause goes to the log, never to the client.
func mapError(ctx context.Context, log *slog.Logger, err error) error {
	var (
		apiErr  *Error
		verr    *model.ValidationError
		qerr    *model.QueryError
		taken   *model.EmailTakenError
		supp    *model.SuppressedError
		resend  *model.ResendLimitError
		fileErr *model.ImportFileError
		bigErr  *model.ImportTooLargeError
	)
	switch {
	case errors.As(err, &apiErr):
		return apiErr
	case errors.As(err, &verr):
		return validationError(verr)
	case errors.As(err, &qerr):
		return newError(http.StatusBadRequest, qerr.Message)
	case errors.As(err, &supp):
		return suppressedError(supp)
	case errors.As(err, &resend):
		// docs/api-contract.md §12.3.
		e := newError(http.StatusTooManyRequests, model.ResendLimitMessage)
		e.Errors = RetryAfter{RetryAfter: resend.RetryAfter}
		e.headers = http.Header{"Retry-After": {strconv.Itoa(resend.RetryAfter)}}
		return e
	case errors.As(err, &taken):
		return validationError(model.BulkEmailTaken(taken.Indexes))
	case errors.Is(err, model.ErrEmailTaken):
		e := newError(http.StatusUnprocessableEntity, model.EmailTakenMessage)
		e.Code = CodeEmailTaken
		e.Errors = map[string][]string{"email": {model.EmailTakenMessage}}
		return e
	case errors.Is(err, model.ErrSegmentNotFound): // before ErrNotFound, which it is too
		return newError(http.StatusNotFound, MsgSegmentNotFound)
	case errors.Is(err, model.ErrNotFound):
		return newError(http.StatusNotFound, MsgNotFound)
	case errors.Is(err, model.ErrWebhookNotFound):
		return newError(http.StatusNotFound, MsgWebhookNotFound)
	case errors.Is(err, model.ErrSuppressionNotFound):
		return newError(http.StatusNotFound, MsgSuppressionNotFound)
	case errors.As(err, &fileErr): // docs/api-contract.md §15
		return newError(http.StatusBadRequest, fileErr.Message)
	case errors.As(err, &bigErr):
		return newError(http.StatusRequestEntityTooLarge, bigErr.Message)
	case errors.Is(err, model.ErrImportNotFound):
		return newError(http.StatusNotFound, MsgImportNotFound)
	case errors.Is(err, model.ErrImportFinished):
		e := newError(http.StatusConflict, MsgImportFinished)
		e.Code = CodeImportFinished
		return e
	case errors.Is(err, model.ErrBulkActionNotFound):
		return newError(http.StatusNotFound, MsgBulkActionNotFound)
	case errors.Is(err, model.ErrBulkActionFinished):
		e := newError(http.StatusConflict, MsgBulkActionFinished)
		e.Code = CodeBulkActionFinished
		return e
	case clientGone(ctx):
		// Whatever failed (a statement cancelled with the request, a transaction rolled back
		// under it, a body cut short), it failed because the client went away: not a 5xx.
		log.DebugContext(ctx, "client closed the request", "error", err)
		return clientClosed()
	case errors.Is(err, model.ErrUnavailable):
		// Logged by the caller's outage log (Server.mapError): once, not once a request.
		return unavailable()
	}
	log.ErrorContext(ctx, "unexpected error", "error", err)
	return newError(http.StatusInternalServerError, MsgInternal)
}

// mapError is mapError with the database's outages logged by s.dbOutage, so that an outage
// is a few lines in the log (docs/operating.md) rather than one per failed request.
func (s *Server) mapError(ctx context.Context, err error) error {
	if errors.Is(err, model.ErrUnavailable) && !clientGone(ctx) {
		s.dbOutage.Failed(ctx, err)
	}
	return mapError(ctx, s.log, err)
}

// writeError writes e outside Huma (routing, panics).
func writeError(w http.ResponseWriter, e *Error) {
	for k, vs := range e.headers {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.status)
	json.NewEncoder(w).Encode(e) //nolint:errcheck // the client may be gone; nothing to do
}
