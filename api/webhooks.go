package api

import (
	"context"
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

// WebhookInput is a create body, decoded as any JSON object so that model reports every problem
// in the contract's words; Schema publishes the rules.
type WebhookInput map[string]any

// Schema implements huma.SchemaProvider.
func (WebhookInput) Schema(r huma.Registry) *huma.Schema {
	if _, ok := r.Map()["WebhookInput"]; !ok {
		types := make([]any, len(model.EventTypes))
		for i, t := range model.EventTypes {
			types[i] = string(t)
		}
		r.Map()["WebhookInput"] = &huma.Schema{
			Type:                 huma.TypeObject,
			AdditionalProperties: false,
			Required:             []string{"url"},
			Properties: map[string]*huma.Schema{
				"url": {Type: huma.TypeString, Format: "uri", MaxLength: ptr(model.MaxWebhookURLLen),
					Description: "An absolute http or https URL without user or password, on a public address."},
				"events": {Type: huma.TypeArray, UniqueItems: true, Items: &huma.Schema{Type: huma.TypeString, Enum: types},
					Description: "The event types to deliver; absent means every type."},
			},
		}
	}
	return &huma.Schema{Ref: "#/components/schemas/WebhookInput"}
}

// UnmarshalJSON keeps numbers as json.Number (see SubscriberInput).
func (in *WebhookInput) UnmarshalJSON(b []byte) error {
	return decodeNumbers(b, (*map[string]any)(in))
}

type (
	createWebhookInput struct {
		Body WebhookInput
	}
	webhookIDInput struct {
		ID string `path:"id" format:"uuid" doc:"The endpoint's id."`
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
	huma.Register(s.api, idempotent(tag(s.operation(http.MethodPost, coll, "create-webhook", "Create a webhook endpoint",
		"Events of the chosen types are POSTed to `url`, signed with the returned `secret` (Standard Webhooks). "+
			"The secret is shown only in this answer. At most 20 endpoints per newsletter.",
		http.StatusCreated, bodyObject, withBody))), handle(s, s.createWebhook))
	huma.Register(s.api, tag(s.operation(http.MethodGet, coll, "list-webhooks", "List webhook endpoints",
		"Oldest first, without secrets.", http.StatusOK, "", append([]int{http.StatusBadRequest}, common...))), handle(s, s.listWebhooks))
	huma.Register(s.api, tag(s.operation(http.MethodGet, item, "get-webhook", "Get a webhook endpoint",
		"The endpoint with this id, without its secret. An unknown id gives 404 `not_found`.",
		http.StatusOK, "", append([]int{http.StatusBadRequest, http.StatusNotFound}, common...))), handle(s, s.getWebhook))
	huma.Register(s.api, idempotent(tag(s.operation(http.MethodDelete, item, "delete-webhook", "Delete a webhook endpoint",
		"Its undelivered events are dropped. Answers the endpoint as it was.",
		http.StatusOK, "", append([]int{http.StatusBadRequest, http.StatusNotFound}, common...)))), handle(s, s.deleteWebhook))
}

func (s *Server) createWebhook(ctx context.Context, p model.Principal, in *createWebhookInput) (*createdWebhookOutput, error) {
	nw, verr := model.ParseWebhook(in.Body)
	if nw.URL != "" && s.cfg.WebhookGuard != nil {
		if err := s.cfg.WebhookGuard.CheckURL(ctx, nw.URL); err != nil {
			verr = verr.Add("url", model.MsgWebhookPublicURL)
		}
	}
	if verr != nil {
		return nil, verr
	}
	wh, err := s.cfg.Webhooks.Create(ctx, p.NewsletterID, nw)
	if err != nil {
		return nil, err
	}
	out := &createdWebhookOutput{Location: BasePath + "/webhooks/" + wh.ID.String()}
	out.Body.Success = true
	out.Body.Data = CreatedWebhook{Webhook: toWebhook(wh), Secret: wh.Secret}
	return out, nil
}

func (s *Server) listWebhooks(ctx context.Context, p model.Principal, _ *struct{}) (*webhookListOutput, error) {
	list, err := s.cfg.Webhooks.List(ctx, p.NewsletterID)
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

func (s *Server) getWebhook(ctx context.Context, p model.Principal, in *webhookIDInput) (*webhookOutput, error) {
	return s.webhookOp(ctx, p, in, s.cfg.Webhooks.Get)
}

func (s *Server) deleteWebhook(ctx context.Context, p model.Principal, in *webhookIDInput) (*webhookOutput, error) {
	return s.webhookOp(ctx, p, in, s.cfg.Webhooks.Delete)
}

func (s *Server) webhookOp(ctx context.Context, p model.Principal, in *webhookIDInput,
	op func(context.Context, uuid.UUID, uuid.UUID) (model.Webhook, error)) (*webhookOutput, error) {
	id, err := parseID(in.ID)
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
