package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"

	"github.com/danielgtaylor/huma/v2"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/subscriberd/subscriberd/model"
)

// PrivacyStore answers a person's requests about their data (docs/api-contract.md §14);
// *repo.Privacy is the implementation. An unknown or erased subscriber, or another
// newsletter's, is model.ErrNotFound.
type PrivacyStore interface {
	// Export returns everything stored about the subscriber.
	Export(ctx context.Context, newsletterID, id uuid.UUID) (model.Export, error)
	// Erase erases the subscriber, in one transaction; the subscriber.erased event gets the
	// source ctx carries.
	Erase(ctx context.Context, newsletterID, id uuid.UUID) (model.Erasure, error)
}

// Operations and outcomes of privacy requests, as the span's app.privacy.* attributes and
// the PrivacyRequest metric.
const (
	PrivacyExport   = "export"
	PrivacyErase    = "erase"
	PrivacyDone     = "done"      // exported, or erased
	PrivacyNotFound = "not_found" // no such subscriber: unknown, erased, or another newsletter's
	PrivacyFailed   = "failed"    // anything else: the store failed, the client left
)

// ExportSubscriber is the subscriber as an export shows it: the public fields and the stored
// first and last name.
type ExportSubscriber struct {
	Subscriber
	FirstName string `json:"first_name" doc:"The stored first name: the name up to its first space."`
	LastName  string `json:"last_name" doc:"The stored last name: the rest of the name."`
}

// ExportEmail is one email queued for the subscriber.
type ExportEmail struct {
	Kind      string  `json:"kind" enum:"confirmation" doc:"What the email is: a double opt-in confirmation."`
	Status    string  `json:"status" enum:"queued,sent,failed,cancelled" doc:"queued: not sent yet; sent: the SMTP server accepted it; failed: given up; cancelled: no longer wanted."`
	CreatedAt string  `json:"created_at" format:"date-time" doc:"When it was queued." example:"2026-06-11T17:00:00+00:00"`
	SentAt    *string `json:"sent_at" format:"date-time" nullable:"true" doc:"When the SMTP server accepted it; null until then."`
}

// ExportData is everything stored about a subscriber (docs/api-contract.md §14).
type ExportData struct {
	Subscriber  ExportSubscriber `json:"subscriber"`
	Events      []rawEvent       `json:"events" doc:"Every event of the subscriber, oldest first, as the history returns them."`
	Suppression maybeSuppression `json:"suppression" doc:"The suppression list's entry for the address; null when it has none."`
	Emails      []ExportEmail    `json:"emails" doc:"Every email queued for the subscriber, oldest first."`
}

// maybeSuppression is a suppression entry or null. Huma refuses a nullable reference to an
// object, and a "oneOf" with the null type does not survive the OpenAPI 3.0 rendering that
// 3.0 generators read; so the schema is the Suppression's own, inline, with null allowed
// (type ["object", "null"], which 3.0 renders as nullable).
type maybeSuppression struct{ entry *Suppression }

// MarshalJSON implements json.Marshaler.
func (m maybeSuppression) MarshalJSON() ([]byte, error) { return json.Marshal(m.entry) }

// Schema implements huma.SchemaProvider.
func (maybeSuppression) Schema(r huma.Registry) *huma.Schema {
	inline := *r.SchemaFromRef(r.Schema(reflect.TypeFor[Suppression](), true, "").Ref)
	inline.Nullable = true
	return &inline
}

// ExportEnvelope is the success body of an export.
type ExportEnvelope struct {
	Success bool       `json:"success" doc:"Always true."`
	Data    ExportData `json:"data"`
}

// Erased is the outcome of an erasure.
type Erased struct {
	ID       string `json:"id" format:"uuid" doc:"The id of the subscriber erased."`
	ErasedAt string `json:"erased_at" format:"date-time" doc:"When it was erased." example:"2026-06-11T17:00:00+00:00"`
}

// ErasedEnvelope is the success body of an erasure.
type ErasedEnvelope struct {
	Success bool   `json:"success" doc:"Always true."`
	Data    Erased `json:"data"`
}

type (
	exportOutput struct {
		Body ExportEnvelope
	}
	eraseInput struct {
		ID string `path:"id" format:"uuid" doc:"The subscriber's id."`
		Keyed
	}
	erasedOutput struct {
		Body ErasedEnvelope
	}
)

// response is the erasure's stored response (docs/api-contract.md §8).
func (o *erasedOutput) response() (int, string, any) { return 0, "", o.Body }

// registerPrivacy adds export and erase (docs/api-contract.md §14); erase takes
// Idempotency-Key (§8).
func (s *Server) registerPrivacy(common []int) {
	const item = BasePath + "/subscribers/{id}"
	errs := append([]int{http.StatusBadRequest, http.StatusNotFound}, common...)
	huma.Register(s.api, s.operation(http.MethodGet, item+"/export", "export-subscriber", "Export a subscriber's data",
		"Everything stored about the person (GDPR art. 15): the subscriber with its stored first and last name, "+
			"every event oldest first, the suppression of its address, and the confirmation emails with their states.",
		http.StatusOK, "", errs), handle(s, s.export))
	registerKeyed(s, s.operation(http.MethodPost, item+"/erase", "erase-subscriber", "Erase a subscriber",
		"Erases the person (GDPR art. 17), irreversibly, in one transaction: the address is suppressed by its hash "+
			"only (reason `erased`), so it is never emailed or subscribed again; the subscriber's email and names are "+
			"deleted with its unsent emails; its events lose the email, name, IP and user agent they held, and so do "+
			"webhook deliveries not made yet; stored Idempotency-Key responses that contain it are deleted; the event "+
			"`subscriber.erased` is recorded and delivered. Afterwards the id answers 404 everywhere and no list or "+
			"total counts it. No body is read.",
		http.StatusOK, "", errs), s.erase)
}

func (s *Server) export(ctx context.Context, p model.Principal, st Stores, in *idInput) (out *exportOutput, err error) {
	ctx, done := s.privacySpan(ctx, PrivacyExport)
	defer func() { done(err) }()
	id, err := parseID(in.ID)
	if err != nil {
		return nil, err
	}
	ex, err := st.Privacy.Export(ctx, p.NewsletterID, id)
	if err != nil {
		return nil, err
	}
	trace.SpanFromContext(ctx).SetAttributes(attribute.Int("app.privacy.events", len(ex.Events)),
		attribute.Int("app.privacy.emails", len(ex.Emails)))
	data := ExportData{
		Subscriber: ExportSubscriber{Subscriber: toSubscriber(ex.Subscriber), FirstName: ex.Subscriber.FirstName,
			LastName: ex.Subscriber.LastName},
		Events: make([]rawEvent, len(ex.Events)),
		Emails: make([]ExportEmail, len(ex.Emails)),
	}
	for i, e := range ex.Events {
		data.Events[i] = rawEvent(e.Payload)
	}
	if ex.Suppression != nil {
		data.Suppression = maybeSuppression{ptr(toSuppression(*ex.Suppression))}
	}
	for i, e := range ex.Emails {
		data.Emails[i] = ExportEmail{Kind: e.Kind, Status: e.Status, CreatedAt: model.FormatTime(e.CreatedAt)}
		if e.SentAt != nil {
			data.Emails[i].SentAt = ptr(model.FormatTime(*e.SentAt))
		}
	}
	return &exportOutput{Body: ExportEnvelope{Success: true, Data: data}}, nil
}

func (s *Server) erase(ctx context.Context, p model.Principal, st Stores, in *eraseInput) (out *erasedOutput, err error) {
	ctx, done := s.privacySpan(ctx, PrivacyErase)
	defer func() { done(err) }()
	id, err := parseID(in.ID)
	if err != nil {
		return nil, err
	}
	er, err := st.Privacy.Erase(withSource(ctx, p), p.NewsletterID, id)
	if err != nil {
		return nil, err
	}
	return &erasedOutput{Body: ErasedEnvelope{Success: true,
		Data: Erased{ID: er.ID.String(), ErasedAt: model.FormatTime(er.ErasedAt)}}}, nil
}

// privacySpan starts the span of a privacy request, "privacy.export" or "privacy.erase", and
// returns the function that ends it with the request's error, counting the request. Neither
// carries the address: the span has the operation and the outcome, the metric the same.
func (s *Server) privacySpan(ctx context.Context, operation string) (context.Context, func(error)) {
	ctx, span := otel.Tracer("github.com/subscriberd/subscriberd/api").Start(ctx, "privacy."+operation,
		trace.WithAttributes(attribute.String("app.privacy.operation", operation)))
	return ctx, func(err error) {
		outcome := PrivacyDone
		switch {
		case errors.Is(err, model.ErrNotFound):
			outcome = PrivacyNotFound
		case err != nil:
			outcome = PrivacyFailed
			span.SetStatus(codes.Error, "")
		}
		span.SetAttributes(attribute.String("app.privacy.outcome", outcome))
		span.End()
		s.metrics.PrivacyRequest(operation, outcome)
	}
}
