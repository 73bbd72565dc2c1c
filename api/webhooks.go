package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"

	"github.com/danielgtaylor/huma/v2"
	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/model"
)

// WebhookStore stores webhook endpoints (docs/api-contract.md §10.3).
type WebhookStore interface {
	// Create stores an endpoint with a new secret; a newsletter's 21st is a
	// *model.ValidationError.
	Create(ctx context.Context, newsletterID uuid.UUID, in model.NewWebhook) (model.Webhook, error)
	List(ctx context.Context, newsletterID uuid.UUID) ([]model.Webhook, error)
	// Get and Delete answer model.ErrWebhookNotFound for an unknown id.
	Get(ctx context.Context, newsletterID, id uuid.UUID) (model.Webhook, error)
	Delete(ctx context.Context, newsletterID, id uuid.UUID) (model.Webhook, error)
}

// URLChecker applies the SSRF rule to a new endpoint's URL: an error refuses it.
type URLChecker interface {
	CheckURL(ctx context.Context, rawURL string) error
}

// Webhook is the public shape of a webhook endpoint.
type Webhook struct {
	ID        string   `json:"id" format:"uuid" doc:"Identifier of the endpoint (UUIDv7)."`
	URL       string   `json:"url" format:"uri" doc:"Where events are POSTed."`
	Events    []string `json:"events" doc:"The event types delivered to it."`
	Status    string   `json:"status" enum:"enabled,disabled" doc:"disabled after a 410 answer or 5 days of failed deliveries; nothing more is sent."`
	CreatedAt string   `json:"created_at" format:"date-time" example:"2026-06-11T17:00:00+00:00"`
}

// CreatedWebhook is a new endpoint with its signing secret, shown only in the create answer.
type CreatedWebhook struct {
	Webhook
	Secret string `json:"secret" doc:"whsec_ and the base64 of 32 random bytes: the key of the webhook-signature HMAC. Shown only here."`
}

func toWebhook(m model.Webhook) Webhook {
	events := make([]string, len(m.Events))
	for i, t := range m.Events {
		events[i] = string(t)
	}
	return Webhook{ID: m.ID.String(), URL: m.URL, Events: events, Status: m.Status, CreatedAt: model.FormatTime(m.CreatedAt)}
}

// WebhookInput is a create body (docs/api-contract.md §10.3). Its fields and tags are the
// published schema, TransformSchema adds the limits model enforces, from model's own values,
// and model.ParseWebhook applies the rules with the contract's messages.
type WebhookInput struct {
	URL    *string  `json:"url" format:"uri" nullable:"false" doc:"An absolute http or https URL without user or password, on a public address."`
	Events []string `json:"events,omitempty" uniqueItems:"true" doc:"The event types to deliver; absent or null means every type, [] none."`

	// What UnmarshalJSON could not put in the fields, for model to report in the contract's
	// words rather than as a decoding error.
	urlNotString, eventsNotArray bool
	unknown                      []string
}

// TransformSchema implements huma.SchemaTransformer: the URL's length limit and the event
// types are model's.
func (WebhookInput) TransformSchema(_ huma.Registry, s *huma.Schema) *huma.Schema {
	s.Properties["url"].MaxLength = ptr(model.MaxWebhookURLLen)
	types := make([]any, len(model.EventTypes))
	for i, t := range model.EventTypes {
		types[i] = string(t)
	}
	s.Properties["events"].Items.Enum = types
	// null is taken as absent (docs/api-contract.md §10.3): the document allows it, or a
	// validating proxy refuses a request the service accepts.
	s.Properties["events"].Nullable = true
	return s
}

// UnmarshalJSON decodes a create body, which preflight has checked is one JSON object, without
// failing: a value of the wrong JSON type and a property the schema does not have are kept for
// model.ParseWebhook to report. null is taken as absent, and an event that is not a string as
// "" (an unknown type).
func (in *WebhookInput) UnmarshalJSON(b []byte) error {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil {
		return err
	}
	*in = WebhookInput{}
	for k, raw := range obj {
		switch k {
		case "url":
			if isNull(raw) {
				continue
			}
			var u string
			if json.Unmarshal(raw, &u) != nil {
				in.urlNotString = true
				continue
			}
			in.URL = &u
		case "events":
			if isNull(raw) {
				continue
			}
			var items []json.RawMessage
			if json.Unmarshal(raw, &items) != nil {
				in.eventsNotArray = true
				continue
			}
			in.Events = make([]string, len(items))
			for i, item := range items {
				json.Unmarshal(item, &in.Events[i]) //nolint:errcheck // not a string: "", an unknown type
			}
		default:
			in.unknown = append(in.unknown, k)
		}
	}
	return nil
}

// isNull reports whether raw is the JSON null.
func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// toWebhookBody returns the body as model.ParseWebhook takes it.
func (in *WebhookInput) toWebhookBody() model.WebhookBody {
	return model.WebhookBody{URL: in.URL, Events: in.Events, URLNotString: in.urlNotString,
		EventsNotArray: in.eventsNotArray, Unknown: in.unknown}
}

type (
	createWebhookInput struct {
		Body WebhookInput
		Keyed
	}
	webhookIDInput struct {
		ID string `path:"id" format:"uuid" doc:"The endpoint's id."`
	}
	deleteWebhookInput struct {
		ID string `path:"id" format:"uuid" doc:"The endpoint's id."`
		Keyed
	}
	createdWebhookOutput struct {
		Location string `header:"Location" doc:"Path of the new endpoint."`
		Body     CreatedWebhookEnvelope
	}
	webhookOutput struct {
		Body WebhookEnvelope
	}
	webhookListOutput struct {
		Body WebhookListEnvelope
	}
)

// The responses of the idempotent writes (docs/api-contract.md §8).
func (o *createdWebhookOutput) response() (int, string, any) { return 0, o.Location, o.Body }
func (o *webhookOutput) response() (int, string, any)        { return 0, "", o.Body }

// CreatedWebhookEnvelope is the success body of a create: the endpoint with its secret.
type CreatedWebhookEnvelope struct {
	Success bool           `json:"success" doc:"Always true."`
	Data    CreatedWebhook `json:"data"`
}

// WebhookEnvelope is the success body carrying one endpoint.
type WebhookEnvelope struct {
	Success bool    `json:"success" doc:"Always true."`
	Data    Webhook `json:"data"`
}

// WebhookListEnvelope is the success body of the endpoint list.
type WebhookListEnvelope struct {
	Success bool      `json:"success" doc:"Always true."`
	Data    []Webhook `json:"data"`
}

// registerWebhooks adds the four endpoint operations; create and delete take Idempotency-Key
// (docs/api-contract.md §8). Every one may answer 400: the edge
// refuses a query over its bounds on every route.
func (s *Server) registerWebhooks(common, withBody []int) {
	const (
		coll = BasePath + "/webhooks"
		item = coll + "/{id}"
	)
	tag := func(op huma.Operation) huma.Operation {
		op.Tags = []string{"Webhooks"}
		return op
	}
	registerKeyed(s, tag(s.operation(http.MethodPost, coll, "create-webhook", "Create a webhook endpoint",
		"Events of the chosen types are POSTed to `url`, signed with the returned `secret` (Standard Webhooks). "+
			"The secret is shown only in this answer. At most 20 endpoints per newsletter.",
		http.StatusCreated, bodyObject, withBody)), s.createWebhook)
	huma.Register(s.api, tag(s.operation(http.MethodGet, coll, "list-webhooks", "List webhook endpoints",
		"Oldest first, without secrets.", http.StatusOK, "", append([]int{http.StatusBadRequest}, common...))), handle(s, s.listWebhooks))
	huma.Register(s.api, tag(s.operation(http.MethodGet, item, "get-webhook", "Get a webhook endpoint",
		"The endpoint with this id, without its secret. An unknown id gives 404 `not_found`.",
		http.StatusOK, "", append([]int{http.StatusBadRequest, http.StatusNotFound}, common...))), handle(s, s.getWebhook))
	registerKeyed(s, tag(s.operation(http.MethodDelete, item, "delete-webhook", "Delete a webhook endpoint",
		"Its undelivered events are dropped. Answers the endpoint as it was.",
		http.StatusOK, "", append([]int{http.StatusBadRequest, http.StatusNotFound}, common...))), s.deleteWebhook)
}

func (s *Server) createWebhook(ctx context.Context, p model.Principal, st Stores, in *createWebhookInput) (*createdWebhookOutput, error) {
	nw, verr := model.ParseWebhook(in.Body.toWebhookBody())
	if nw.URL != "" && s.cfg.WebhookGuard != nil {
		if err := s.cfg.WebhookGuard.CheckURL(ctx, nw.URL); err != nil {
			verr = verr.Add("url", model.MsgWebhookPublicURL)
		}
	}
	if verr != nil {
		return nil, verr
	}
	wh, err := st.Webhooks.Create(ctx, p.NewsletterID, nw)
	if err != nil {
		return nil, err
	}
	out := &createdWebhookOutput{Location: BasePath + "/webhooks/" + wh.ID.String()}
	out.Body.Success = true
	out.Body.Data = CreatedWebhook{Webhook: toWebhook(wh), Secret: wh.Secret}
	return out, nil
}

func (s *Server) listWebhooks(ctx context.Context, p model.Principal, st Stores, _ *struct{}) (*webhookListOutput, error) {
	list, err := st.Webhooks.List(ctx, p.NewsletterID)
	if err != nil {
		return nil, err
	}
	out := &webhookListOutput{}
	out.Body.Success = true
	out.Body.Data = make([]Webhook, len(list))
	for i, wh := range list {
		out.Body.Data[i] = toWebhook(wh)
	}
	return out, nil
}

func (s *Server) getWebhook(ctx context.Context, p model.Principal, st Stores, in *webhookIDInput) (*webhookOutput, error) {
	return s.webhookOp(ctx, p, in.ID, st.Webhooks.Get)
}

func (s *Server) deleteWebhook(ctx context.Context, p model.Principal, st Stores, in *deleteWebhookInput) (*webhookOutput, error) {
	return s.webhookOp(ctx, p, in.ID, st.Webhooks.Delete)
}

func (s *Server) webhookOp(ctx context.Context, p model.Principal, rawID string,
	op func(context.Context, uuid.UUID, uuid.UUID) (model.Webhook, error)) (*webhookOutput, error) {
	id, err := parseID(rawID)
	if err != nil {
		return nil, model.ErrWebhookNotFound
	}
	wh, err := op(ctx, p.NewsletterID, id)
	if err != nil {
		return nil, err
	}
	out := &webhookOutput{}
	out.Body.Success = true
	out.Body.Data = toWebhook(wh)
	return out, nil
}
