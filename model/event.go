package model

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/google/uuid"
)

// EventType names what happened to a subscriber (docs/api-contract.md §10.1).
type EventType string

// The event types.
const (
	EventCreated          EventType = "subscriber.created"
	EventUpdated          EventType = "subscriber.updated"
	EventConfirmationSent EventType = "subscriber.confirmation_sent"
	EventConfirmed        EventType = "subscriber.confirmed"
	EventUnsubscribed     EventType = "subscriber.unsubscribed"
	// EventErased is the last event of an erased subscriber (docs/api-contract.md §14): its
	// subscriber has only an id.
	EventErased EventType = "subscriber.erased"
)

// EventTypes lists every event type, in the order the contract names them.
var EventTypes = []EventType{EventCreated, EventUpdated, EventConfirmationSent, EventConfirmed, EventUnsubscribed,
	EventErased}

// ParseEventType returns the EventType named s, or false when s names none.
func ParseEventType(s string) (EventType, bool) {
	for _, t := range EventTypes {
		if string(t) == s {
			return t, true
		}
	}
	return "", false
}

// Kinds of event source.
const (
	SourceAPI              = "api"
	SourceEmail            = "email"
	SourceConfirmationLink = "confirmation_link"
	// SourceSuppression is a subscriber unsubscribed because its address was suppressed
	// (docs/api-contract.md §13); Reason is the suppression's, APIKey the key that made it.
	SourceSuppression = "suppression"
	// SourceDeclineLink is a subscriber who said "I did not sign up" (§12.2).
	SourceDeclineLink = "decline_link"
	// SourceDuplicateAddress is a subscriber unsubscribed by the 1.3 upgrade because an older
	// subscriber of its newsletter holds the same address (docs/api-contract.md §18); Kept is
	// the older one's id.
	SourceDuplicateAddress = "duplicate_address"
)

// MaxUserAgentLength is how much of a confirming browser's User-Agent an event keeps, in
// characters (code points).
const MaxUserAgentLength = 512

// EventSource is who or what made a change: an API key (by its display prefix, never the
// key), the email worker, or a confirmation link (with the client's address and browser).
type EventSource struct {
	Kind      string
	APIKey    string // SourceAPI: the key's display prefix
	IP        string // SourceConfirmationLink
	UserAgent string // SourceConfirmationLink, at most MaxUserAgentLength characters
	Reason    string // SourceSuppression
	Kept      string // SourceDuplicateAddress: the id of the subscriber that kept the address
	// The proof of a confirmation through the link (docs/api-contract.md §12.1): Method is
	// "button" or "checkbox"; the durations are whole seconds, nil when not known.
	Method           string
	SecondsSinceSent *int64
	SecondsOnPage    *int64
}

// Confirmation methods of docs/api-contract.md §12.1.
const (
	MethodButton   = "button"
	MethodCheckbox = "checkbox"
)

// APISource is the source of a change made through the API with the key of prefix.
func APISource(keyPrefix string) EventSource {
	return EventSource{Kind: SourceAPI, APIKey: keyPrefix}
}

// LinkSource is the source of a confirmation through the link, from ip with userAgent
// (cut to MaxUserAgentLength characters).
func LinkSource(ip, userAgent string) EventSource {
	n := 0
	for i := range userAgent {
		if n == MaxUserAgentLength {
			userAgent = userAgent[:i]
			break
		}
		n++
	}
	return EventSource{Kind: SourceConfirmationLink, IP: ip, UserAgent: userAgent}
}

type sourceKey struct{}

// WithSource returns ctx carrying the source of the changes made under it. The source is
// request metadata, like the trace context: it travels with the request's context into the
// store, which records it in the change's transaction.
func WithSource(ctx context.Context, src EventSource) context.Context {
	return context.WithValue(ctx, sourceKey{}, src)
}

// SourceFrom returns the source carried by ctx; without one it is an API source with no key
// (a change made by the service itself).
func SourceFrom(ctx context.Context) EventSource {
	if src, ok := ctx.Value(sourceKey{}).(EventSource); ok {
		return src
	}
	return EventSource{Kind: SourceAPI}
}

// Event is one recorded change of a subscriber. Payload is its public JSON object, written
// once when the change is made and never changed: the history returns it and the webhooks
// deliver it byte for byte.
type Event struct {
	ID           uuid.UUID
	NewsletterID uuid.UUID
	SubscriberID uuid.UUID
	Type         EventType
	Timestamp    time.Time
	Payload      []byte
}

// NewEvent makes the event of type t for sub after a change, with the values the change
// replaced (field name → value before; nil for none) and the change's source, at now.
func NewEvent(t EventType, sub Subscriber, previous map[string]string, src EventSource, now time.Time) Event {
	prev := make(map[string]any, len(previous))
	for k, v := range previous {
		prev[k] = v
	}
	return NewEventOf(t, sub, prev, src, now)
}

// NewEventOf is NewEvent with previous values of any JSON type: a subscriber.updated event's
// previous attributes (each changed key with its value before, or nil) and tags (the whole set
// before), docs/api-contract.md §19.2.
func NewEventOf(t EventType, sub Subscriber, previous map[string]any, src EventSource, now time.Time) Event {
	id := uuid.Must(uuid.NewV7())
	if previous == nil {
		previous = map[string]any{}
	}
	var source any
	switch src.Kind {
	case SourceEmail:
		source = struct {
			Kind string `json:"kind"`
		}{src.Kind}
	case SourceSuppression:
		source = struct {
			Kind   string `json:"kind"`
			Reason string `json:"reason"`
			APIKey string `json:"api_key,omitempty"`
		}{src.Kind, src.Reason, src.APIKey}
	case SourceConfirmationLink:
		source = struct {
			Kind             string `json:"kind"`
			IP               string `json:"ip"`
			UserAgent        string `json:"user_agent"`
			Method           string `json:"method"`
			SecondsSinceSent *int64 `json:"seconds_since_sent"`
			SecondsOnPage    *int64 `json:"seconds_on_page"`
		}{src.Kind, src.IP, src.UserAgent, src.Method, src.SecondsSinceSent, src.SecondsOnPage}
	case SourceDuplicateAddress:
		source = struct {
			Kind string `json:"kind"`
			Kept string `json:"kept"`
		}{src.Kind, src.Kept}
	case SourceDeclineLink:
		source = struct {
			Kind      string `json:"kind"`
			IP        string `json:"ip"`
			UserAgent string `json:"user_agent"`
		}{src.Kind, src.IP, src.UserAgent}
	default:
		source = struct {
			Kind   string `json:"kind"`
			APIKey string `json:"api_key"`
		}{SourceAPI, src.APIKey}
	}
	// The wire form of docs/api-contract.md §10.1.
	w := wireEvent{ID: id.String(), Type: t, Timestamp: FormatTime(now)}
	w.Data.Subscriber = wireSubscriber{sub.ID.String(), sub.Email, sub.Name(), sub.Status, FormatTime(sub.CreatedAt),
		sub.Attributes, sub.Tags}
	if w.Data.Subscriber.Attributes == nil {
		w.Data.Subscriber.Attributes = Attributes{}
	}
	if w.Data.Subscriber.Tags == nil {
		w.Data.Subscriber.Tags = []string{}
	}
	w.Data.Previous, w.Data.Source = previous, source
	payload, _ := json.Marshal(w) // cannot fail: strings, and attribute values (string, bool, json.Number)
	return Event{ID: id, NewsletterID: sub.NewsletterID, SubscriberID: sub.ID, Type: t, Timestamp: now, Payload: payload}
}

// wireEvent and wireSubscriber are the JSON of an event, fields in the contract's order.
type wireEvent struct {
	ID        string    `json:"id"`
	Type      EventType `json:"type"`
	Timestamp string    `json:"timestamp"`
	Data      struct {
		Subscriber wireSubscriber `json:"subscriber"`
		Previous   map[string]any `json:"previous"`
		Source     any            `json:"source"`
	} `json:"data"`
}

type wireSubscriber struct {
	ID         string     `json:"id"`
	Email      string     `json:"email"`
	Name       string     `json:"name"`
	Status     Status     `json:"status"`
	CreatedAt  string     `json:"created_at"`
	Attributes Attributes `json:"attributes"`
	Tags       []string   `json:"tags"`
}

// TimeLayout is the contract's timestamp: RFC 3339, UTC, whole seconds, numeric offset
// (2026-06-11T17:00:00+00:00).
const TimeLayout = "2006-01-02T15:04:05-07:00"

// FormatTime writes t in TimeLayout, in UTC.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeLayout) }

// Changes compares a subscriber before and after an update and returns the public fields
// that changed, each with its value before (docs/api-contract.md §10.1 "previous"); empty
// when nothing changed.
func Changes(before, after Subscriber) map[string]string {
	prev := map[string]string{}
	if before.Email != after.Email {
		prev["email"] = before.Email
	}
	if before.Name() != after.Name() {
		prev["name"] = before.Name()
	}
	if before.Status != after.Status {
		prev["status"] = string(before.Status)
	}
	return prev
}

// EventPage selects a page of one subscriber's history: up to Limit events after the event
// After (oldest first; uuid.Nil for the first page).
type EventPage struct {
	Limit int
	After uuid.UUID
}

// Default and largest page size of the history (docs/api-contract.md §10.2).
const (
	DefaultEventLimit = 100
	MaxEventLimit     = 100
)

// ParseEventLimit validates the history's limit parameter; "" means the default. An invalid
// value is a *QueryError (400).
func ParseEventLimit(limit string) (int, error) {
	if limit == "" {
		return DefaultEventLimit, nil
	}
	n, ok := parseBoundedInt(limit, 1, MaxEventLimit)
	if !ok {
		return 0, &QueryError{msgQueryLimit}
	}
	return n, nil
}

// Webhook endpoint errors and rules (docs/api-contract.md §10.3).
var (
	// ErrWebhookNotFound is an unknown webhook endpoint id, or another newsletter's.
	ErrWebhookNotFound = errors.New("webhook not found")
)

// SubscriberExtrasJSON is the JSON object {"attributes": …, "tags": …} holding the two fields
// exactly as NewEvent writes them in an event's subscriber (nil as none). An import's batch,
// which builds its events in SQL, splices it into them (repo; pinned to NewEvent by a test).
func SubscriberExtrasJSON(attrs Attributes, tags []string) []byte {
	w := struct {
		Attributes Attributes `json:"attributes"`
		Tags       []string   `json:"tags"`
	}{attrs, tags}
	if w.Attributes == nil {
		w.Attributes = Attributes{}
	}
	if w.Tags == nil {
		w.Tags = []string{}
	}
	b, _ := json.Marshal(w) // cannot fail, as NewEvent's
	return b
}
