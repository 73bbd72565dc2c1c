package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
)

// Export is everything stored about one subscriber (docs/api-contract.md §14): the
// subscriber, its events oldest first, the suppression of its address (nil when there is
// none) and its emails.
type Export struct {
	Subscriber  Subscriber
	Events      []Event
	Suppression *Suppression
	Emails      []ExportEmail
}

// ExportEmail is one email queued for a subscriber, as the export shows it. Status is
// EmailQueued, EmailSent, EmailFailed or EmailCancelled.
type ExportEmail struct {
	Kind      string
	Status    string
	CreatedAt time.Time
	SentAt    *time.Time
}

// EmailQueued is the export's status of an email not sent yet (the outbox's EmailPending).
const EmailQueued = "queued"

// ExportEmailStatus is the export's name of an outbox state: EmailPending reads EmailQueued,
// the others keep their names.
func ExportEmailStatus(state string) string {
	if state == EmailPending {
		return EmailQueued
	}
	return state
}

// Erasure is the outcome of an erasure (docs/api-contract.md §14): the id of the subscriber
// erased and when.
type Erasure struct {
	ID       uuid.UUID
	ErasedAt time.Time
}

// NewErasedEvent is the subscriber.erased event of the subscriber id of newsletter nl, erased
// at now by src: its subscriber is the id alone and previous is empty (docs/api-contract.md §14).
func NewErasedEvent(nl, id uuid.UUID, src EventSource, now time.Time) Event {
	ev := NewEvent(EventErased, Subscriber{ID: id, NewsletterID: nl}, nil, src, now)
	w, _ := parseObject(ev.Payload) // NewEvent wrote it: an object of objects
	raw, _ := w.get("data")
	data, _ := parseObject(raw)
	sub, _ := json.Marshal(struct {
		ID string `json:"id"`
	}{id.String()})
	data.set("subscriber", sub)
	w.set("data", data.marshal())
	ev.Payload = w.marshal()
	return ev
}

// Personal data an erasure removes from an event (docs/api-contract.md §14, §19.2: attributes
// may hold personal data): these members of
// data.subscriber and data.previous, and of data.source.
var (
	personalSubscriberFields = []string{"email", "name", "first_name", "last_name", "attributes", "tags"}
	personalSourceFields     = []string{"ip", "user_agent"}
)

// ScrubEvent returns payload, an event's JSON object (docs/api-contract.md §10.1), without the
// personal data an erasure removes (§14): email and name in data.subscriber and data.previous,
// ip and user_agent in data.source. Everything else stays as it was, in its order: ids, type,
// timestamps, statuses, the source's kind. Scrubbing a scrubbed event changes nothing.
func ScrubEvent(payload []byte) ([]byte, error) {
	ev, err := parseObject(payload)
	if err != nil {
		return nil, fmt.Errorf("event: %w", err)
	}
	raw, ok := ev.get("data")
	if !ok {
		return nil, errors.New("event: no data")
	}
	data, err := parseObject(raw)
	if err != nil {
		return nil, fmt.Errorf("event data: %w", err)
	}
	for _, m := range []struct {
		name   string
		fields []string
	}{{"subscriber", personalSubscriberFields}, {"previous", personalSubscriberFields}, {"source", personalSourceFields}} {
		raw, ok := data.get(m.name)
		if !ok {
			continue
		}
		obj, err := parseObject(raw)
		if err != nil {
			return nil, fmt.Errorf("event data.%s: %w", m.name, err)
		}
		data.set(m.name, obj.without(m.fields...).marshal())
	}
	ev.set("data", data.marshal())
	return ev.marshal(), nil
}

// object is a JSON object whose members keep their order and their values' bytes.
type object []member

type member struct {
	key string
	val json.RawMessage
}

// parseObject reads one JSON object.
func parseObject(b []byte) (object, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("not a JSON object")
	}
	var o object
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := tok.(string) // a member's name is a string in valid JSON
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return nil, err
		}
		o = append(o, member{key, val})
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, err
	}
	return o, nil
}

func (o object) get(key string) (json.RawMessage, bool) {
	for _, m := range o {
		if m.key == key {
			return m.val, true
		}
	}
	return nil, false
}

func (o object) set(key string, val json.RawMessage) {
	for i := range o {
		if o[i].key == key {
			o[i].val = val
		}
	}
}

func (o object) without(keys ...string) object {
	return slices.DeleteFunc(slices.Clone(o), func(m member) bool { return slices.Contains(keys, m.key) })
}

// marshal writes o compactly, as encoding/json writes a struct.
func (o object) marshal() json.RawMessage {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(m.key) // cannot fail: a string
		b.Write(k)
		b.WriteByte(':')
		b.Write(m.val)
	}
	b.WriteByte('}')
	return b.Bytes()
}
