package api

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"

	"github.com/danielgtaylor/huma/v2"
	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/api/cursor"
	"github.com/subscriberd/subscriberd/model"
)

// EventStore reads subscribers' histories (docs/api-contract.md §10.2).
type EventStore interface {
	// History returns up to p.Limit events of the newsletter's subscriber after p.After,
	// oldest first, and whether more follow; an unknown subscriber is model.ErrNotFound.
	History(ctx context.Context, newsletterID, id uuid.UUID, p model.EventPage) ([]model.Event, bool, error)
}

// rawEvent is one event as the history returns it and the webhooks deliver it: the JSON object
// written when the change was made, sent as it was stored. Its schema is Event's.
type rawEvent json.RawMessage

// MarshalJSON implements json.Marshaler.
func (e rawEvent) MarshalJSON() ([]byte, error) { return e, nil }

// Schema implements huma.SchemaProvider.
func (rawEvent) Schema(r huma.Registry) *huma.Schema {
	return r.Schema(reflect.TypeFor[Event](), true, "Event")
}

// Event documents the event object of docs/api-contract.md §10.1 (the service sends the stored
// object itself).
type Event struct {
	ID        string    `json:"id" format:"uuid" doc:"Identifier of the event (UUIDv7); the webhook-id of its deliveries."`
	Type      string    `json:"type" enum:"subscriber.created,subscriber.updated,subscriber.confirmation_sent,subscriber.confirmed,subscriber.unsubscribed,subscriber.erased"`
	Timestamp string    `json:"timestamp" format:"date-time" doc:"When the change was made." example:"2026-06-11T17:00:00+00:00"`
	Data      EventData `json:"data"`
}

// EventData is the data of an event: subscriber is the subscriber after the change. (The
// field has no doc of its own: beside a $ref, a description is invalid in OpenAPI 3.0.)
type EventData struct {
	Subscriber EventSubscriber   `json:"subscriber"`
	Previous   map[string]string `json:"previous" doc:"Each changed field (email, name, status) with its value before the change; an erasure removed email and name."`
	Source     EventSource       `json:"source"`
}

// EventSubscriber is the subscriber of an event: a Subscriber, but for the fields an erasure
// removed (docs/api-contract.md §14). The subscriber.erased event has the id alone.
type EventSubscriber struct {
	ID        string `json:"id" format:"uuid" doc:"Identifier of the subscriber (UUIDv7)." example:"01a21363-a43b-7cde-b444-4915076b1130"`
	Email     string `json:"email,omitempty" format:"idn-email" doc:"Absent once the subscriber is erased." example:"john@example.com"`
	Name      string `json:"name,omitempty" doc:"Absent once the subscriber is erased." example:"John Doe"`
	Status    string `json:"status,omitempty" enum:"active,pending,unsubscribed" doc:"Absent in subscriber.erased."`
	CreatedAt string `json:"created_at,omitempty" format:"date-time" doc:"Absent in subscriber.erased." example:"2026-06-11T17:00:00+00:00"`
}

// EventSource says who or what made a change (docs/api-contract.md §10.1, §12, §13, §18): one
// object per kind, told apart by kind. It only documents: the service sends the stored event.
type EventSource struct{}

// Schema implements huma.SchemaProvider: a oneOf of the kinds the service sends, with a
// discriminator on kind. An erasure (§14) removes ip and user_agent from the sources that
// have them, so neither is required.
func (EventSource) Schema(r huma.Registry) *huma.Schema {
	const name = "EventSource"
	if _, ok := r.Map()[name]; !ok {
		str := func(desc string) *huma.Schema { return &huma.Schema{Type: huma.TypeString, Description: desc} }
		seconds := func(desc string) *huma.Schema {
			return &huma.Schema{Type: huma.TypeInteger, Minimum: ptr(0.0), Nullable: true, Description: desc}
		}
		reasons := make([]any, len(model.InputSuppressionReasons))
		for i, rs := range model.InputSuppressionReasons {
			reasons[i] = string(rs)
		}
		ip := str("The client's address (§5); absent once the subscriber is erased.")
		ua := str("The browser's User-Agent, its first 512 characters; absent once the subscriber is erased.")
		kinds := []struct {
			kind, schema, desc string
			props              map[string]*huma.Schema
			required           []string
		}{
			{model.SourceAPI, "EventSourceAPI", "A change made with an API key (an import's rows: the key that uploaded it).",
				map[string]*huma.Schema{"api_key": str("The display prefix of the key; \"\" for a change the service made itself.")},
				[]string{"api_key"}},
			{model.SourceEmail, "EventSourceEmail", "The SMTP server accepted a confirmation email.", nil, nil},
			{model.SourceConfirmationLink, "EventSourceConfirmationLink", "The person confirmed through the link (§12.1): the consent proof.",
				map[string]*huma.Schema{"ip": ip, "user_agent": ua,
					"method": {Type: huma.TypeString, Enum: []any{model.MethodButton, model.MethodCheckbox},
						Description: "How the person confirmed: the button (with the page's script) or the checkbox (without)."},
					"seconds_since_sent": seconds("Whole seconds since the SMTP server accepted the email; null when not known."),
					"seconds_on_page":    seconds("Whole seconds since the page was served; null for checkbox."),
				}, nil},
			{model.SourceDeclineLink, "EventSourceDeclineLink", "The person said \"I did not sign up\" (§12.2).",
				map[string]*huma.Schema{"ip": ip, "user_agent": ua}, nil},
			{model.SourceSuppression, "EventSourceSuppression", "The address was suppressed (§13): by the service (a hard bounce) or with an API key.",
				map[string]*huma.Schema{"reason": {Type: huma.TypeString, Enum: reasons, Description: "The suppression's reason."},
					"api_key": str("The display prefix of the key that suppressed the address; absent when the service did.")},
				[]string{"reason"}},
			{model.SourceDuplicateAddress, "EventSourceDuplicateAddress", "The 1.3 upgrade unsubscribed this subscriber: an older subscriber of the newsletter holds the same address (§18).",
				map[string]*huma.Schema{"kept": {Type: huma.TypeString, Format: "uuid", Description: "The id of the older subscriber, which kept the address."}},
				[]string{"kept"}},
		}
		src := &huma.Schema{Description: "Who or what made the change, by kind.",
			Discriminator: &huma.Discriminator{PropertyName: "kind", Mapping: map[string]string{}}}
		for _, k := range kinds {
			props := map[string]*huma.Schema{"kind": {Type: huma.TypeString, Enum: []any{k.kind}}}
			for p, s := range k.props {
				props[p] = s
			}
			r.Map()[k.schema] = &huma.Schema{Type: huma.TypeObject, Description: k.desc, Properties: props,
				Required: append([]string{"kind"}, k.required...), AdditionalProperties: false}
			ref := "#/components/schemas/" + k.schema
			src.OneOf = append(src.OneOf, &huma.Schema{Ref: ref})
			src.Discriminator.Mapping[k.kind] = ref
		}
		r.Map()[name] = src
	}
	return &huma.Schema{Ref: "#/components/schemas/" + name}
}

// EventPagination describes a page of a history.
type EventPagination struct {
	Limit      int     `json:"limit" minimum:"1" maximum:"100"`
	NextCursor *string `json:"next_cursor" doc:"Fetches the next page; null when no event follows."`
}

// EventsEnvelope is the success body of a history.
type EventsEnvelope struct {
	Success    bool            `json:"success" doc:"Always true."`
	Data       []rawEvent      `json:"data"`
	Pagination EventPagination `json:"pagination"`
}

type eventLimitParam string

func (eventLimitParam) Schema(huma.Registry) *huma.Schema {
	return &huma.Schema{Type: huma.TypeInteger, Minimum: ptr(1.0), Maximum: ptr(float64(model.MaxEventLimit)),
		Default: model.DefaultEventLimit}
}

type (
	historyInput struct {
		ID     string          `path:"id" format:"uuid" doc:"The subscriber's id."`
		Limit  eventLimitParam `query:"limit" doc:"Events per page, 1 to 100."`
		Cursor string          `query:"cursor" doc:"The next_cursor of the previous page."`
	}
	historyOutput struct {
		Body EventsEnvelope
	}
)

// registerEvents adds the history operation.
func (s *Server) registerEvents(common []int) {
	huma.Register(s.api, s.operation(http.MethodGet, BasePath+"/subscribers/{id}/events", "list-subscriber-events",
		"List a subscriber's events",
		"The subscriber's history, oldest first: created, updated, confirmation_sent, confirmed, unsubscribed, "+
			"each with its source. Page with `next_cursor`.",
		http.StatusOK, "", append([]int{http.StatusBadRequest, http.StatusNotFound}, common...)), handle(s, s.history))
}

// historyBinding binds a cursor to a subscriber's history: a cursor of another subscriber's
// history, or of a list, does not decode in it.
func historyBinding(nl, id uuid.UUID) string {
	return cursor.Binding("events", nl.String(), id.String())
}

func (s *Server) history(ctx context.Context, p model.Principal, st Stores, in *historyInput) (*historyOutput, error) {
	id, err := parseID(in.ID)
	if err != nil {
		return nil, err
	}
	limit, err := model.ParseEventLimit(string(in.Limit))
	if err != nil {
		return nil, err
	}
	page := model.EventPage{Limit: limit}
	binding := historyBinding(p.NewsletterID, id)
	if in.Cursor != "" {
		pos, err := s.cursors.Decode(binding, in.Cursor)
		if err != nil {
			return nil, newError(http.StatusBadRequest, MsgCursorInvalid)
		}
		page.After = pos.ID
	}
	events, more, err := st.Events.History(ctx, p.NewsletterID, id, page)
	if err != nil {
		return nil, err
	}
	out := &historyOutput{Body: EventsEnvelope{Success: true, Data: make([]rawEvent, len(events)),
		Pagination: EventPagination{Limit: limit}}}
	for i, e := range events {
		out.Body.Data[i] = rawEvent(e.Payload)
	}
	if more {
		last := events[len(events)-1]
		c := s.cursors.Encode(binding, cursor.Position{Time: last.Timestamp, ID: last.ID})
		out.Body.Pagination.NextCursor = &c
	}
	return out, nil
}
