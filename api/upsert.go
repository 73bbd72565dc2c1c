package api

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/danielgtaylor/huma/v2"

	"github.com/subscriberd/subscriberd/model"
)

// upsertPath is the path of the upsert by email (docs/api-contract.md §16.1); upsertPrefix
// is what comes before the address.
const (
	upsertPrefix = BasePath + "/subscribers/by-email/"
	upsertPath   = upsertPrefix + "{email}"
)

// routeUpsert serves a PUT whose path starts with upsertPrefix: whatever follows it, decoded,
// is the address, for the handler to judge (422 keyed email), even where the mux would not
// route it: empty, with "/" (percent-encoded or not), ".", ".." or "//", which it would clean
// away or redirect. The route and its span name stay the operation's.
func routeUpsert(mux *http.ServeMux, w http.ResponseWriter, r *http.Request) {
	probe := *r
	probe.URL = &url.URL{Path: upsertPrefix + "x"}
	h, pattern := mux.Handler(&probe)
	_, route, _ := strings.Cut(pattern, " ")
	setRoute(w, route)
	r.Pattern = pattern
	r.SetPathValue("email", strings.TrimPrefix(r.URL.Path, upsertPrefix))
	h.ServeHTTP(w, r)
}

// SubscriberUpsert is an upsert body: name and status, both optional; the address is the path's.
type SubscriberUpsert map[string]any

// Schema implements huma.SchemaProvider: the update's name and status, nothing else.
func (SubscriberUpsert) Schema(r huma.Registry) *huma.Schema {
	const name = "SubscriberUpsert"
	if _, ok := r.Map()[name]; !ok {
		inputSchema(r, "SubscriberUpdate", nil)
		upd := r.Map()["SubscriberUpdate"]
		status := *upd.Properties["status"]
		status.Description = "`active` (the default for a new subscriber) activates at once, also re-subscribing; " +
			"`pending` sends a confirmation email. Omitted: a new subscriber is active, an existing one keeps its status."
		r.Map()[name] = &huma.Schema{
			Type:                 huma.TypeObject,
			AdditionalProperties: false,
			Description: "The fields to set. The address is the path's: an `email` property is refused " +
				"(`The email field is prohibited.`).",
			Properties: map[string]*huma.Schema{"name": upd.Properties["name"], "status": &status},
		}
	}
	return &huma.Schema{Ref: "#/components/schemas/" + name}
}

// UnmarshalJSON keeps numbers as json.Number (see SubscriberInput).
func (in *SubscriberUpsert) UnmarshalJSON(b []byte) error {
	return decodeNumbers(b, (*map[string]any)(in))
}

// emailPathParam is the address of the upsert's path, checked by model (422 keyed email).
type emailPathParam string

func (emailPathParam) Schema(huma.Registry) *huma.Schema {
	return &huma.Schema{Type: huma.TypeString, Format: "idn-email", MaxLength: ptr(model.MaxEmailLength),
		Examples: []any{"john@example.com"}}
}

type (
	upsertInput struct {
		Email emailPathParam `path:"email" doc:"The address (§3 rule), percent-encoded or not; matched case-insensitively."`
		Body  SubscriberUpsert
		Keyed
	}
	upsertOutput struct {
		Status   int
		Location string `header:"Location" doc:"Path of the subscriber, when it was created (201)."`
		Body     SubscriberEnvelope
	}
)

// response is the upsert's stored response: 201 with Location, or 200.
func (o *upsertOutput) response() (int, string, any) { return o.Status, o.Location, o.Body }

// registerUpsert adds PUT /subscribers/by-email/{email}.
func (s *Server) registerUpsert(withBody []int) {
	op := answers(s.operation(http.MethodPut, upsertPath, "upsert-subscriber-by-email", "Create or update a subscriber by email",
		"Makes sure the address is a subscriber with the fields given. No subscriber with the address "+
			"(case-insensitively): created as `POST /subscribers` would (default status `active`) → `201` with `Location`. "+
			"One exists: updated as `PUT /subscribers/{id}` would with the fields given (none given: unchanged) → `200`. "+
			"Concurrent upserts of one new address create it once; the others update it. "+
			"An address that is not valid → `422` keyed `email`.",
		http.StatusOK, bodyObject, withBody),
		// As create and update: a suppressed address; and the create's email_already_subscribed,
		// should the address be taken twice between the store's look and its insert.
		http.StatusUnprocessableEntity, CodeEmailTaken, CodeEmailSuppressed)
	registerKeyed(s, op, s.upsert)
	// The created case: the same body, with Location.
	o := s.api.OpenAPI().Paths[upsertPath].Put
	ok := o.Responses[strconv.Itoa(http.StatusOK)]
	ok.Description = "The subscriber existed and was updated with the fields given (or left as it was)."
	created := *ok
	created.Description = "The subscriber was created."
	created.Headers = map[string]*huma.Param{}
	for k, v := range ok.Headers {
		created.Headers[k] = v
	}
	created.Headers["Location"] = &huma.Param{Description: "Path of the new subscriber.", Required: true,
		Schema: &huma.Schema{Type: huma.TypeString}}
	created.Headers[HeaderReplayed] = &huma.Param{
		Description: "`true` when this is the stored response of an earlier request with the same Idempotency-Key.",
		Schema:      &huma.Schema{Type: huma.TypeString, Enum: []any{"true"}}}
	delete(ok.Headers, "Location")
	o.Responses[strconv.Itoa(http.StatusCreated)] = &created
}

// upsert creates the subscriber with the path's address or updates the one that has it, in one
// unit of work of the store under the address's lock (Store.Upsert): as create and update
// would, with their events, emails and webhooks.
func (s *Server) upsert(ctx context.Context, p model.Principal, st Stores, in *upsertInput) (*upsertOutput, error) {
	ns, patch, verr := model.ParseUpsert(string(in.Email), in.Body)
	if verr != nil {
		return nil, verr
	}
	sub, created, err := st.Subscribers.Upsert(withSource(ctx, p), p.NewsletterID, ns, patch)
	if err != nil {
		return nil, err
	}
	body := SubscriberEnvelope{Success: true, Data: toSubscriber(sub)}
	if !created {
		return &upsertOutput{Status: http.StatusOK, Body: body}, nil
	}
	s.metrics.SubscribersCreated("upsert", string(sub.Status), 1)
	return &upsertOutput{Status: http.StatusCreated, Location: subscriberPath(sub.ID), Body: body}, nil
}
