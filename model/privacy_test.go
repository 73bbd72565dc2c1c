package model_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/model"
)

func TestScrubEvent(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 6, 11, 17, 0, 0, 0, time.UTC)
	sub := model.Subscriber{ID: uuid.MustParse("01a21363-a43b-7cde-b444-4915076b1130"), Email: "Ann.Lee@Example.com",
		FirstName: "Ann", LastName: "Lee", Status: model.StatusActive, CreatedAt: now}
	tests := []struct {
		name string
		ev   model.Event
		want string // the payload after scrubbing, but for the event's id
	}{
		{"created", model.NewEvent(model.EventCreated, sub, nil, model.APISource("sk_abcd"), now),
			`{"id":"ID","type":"subscriber.created","timestamp":"2026-06-11T17:00:00+00:00","data":{"subscriber":{"id":"01a21363-a43b-7cde-b444-4915076b1130","status":"active","created_at":"2026-06-11T17:00:00+00:00"},"previous":{},"source":{"kind":"api","api_key":"sk_abcd"}}}`},
		{"updated email, name and status",
			model.NewEvent(model.EventUpdated, sub, map[string]string{"email": "old@example.com", "name": "Old Name", "status": "pending"},
				model.APISource("sk_abcd"), now),
			`{"id":"ID","type":"subscriber.updated","timestamp":"2026-06-11T17:00:00+00:00","data":{"subscriber":{"id":"01a21363-a43b-7cde-b444-4915076b1130","status":"active","created_at":"2026-06-11T17:00:00+00:00"},"previous":{"status":"pending"},"source":{"kind":"api","api_key":"sk_abcd"}}}`},
		{"confirmed through the link",
			model.NewEvent(model.EventConfirmed, sub, map[string]string{"status": "pending"}, model.LinkSource("203.0.113.9", "Browser/1"), now),
			`{"id":"ID","type":"subscriber.confirmed","timestamp":"2026-06-11T17:00:00+00:00","data":{"subscriber":{"id":"01a21363-a43b-7cde-b444-4915076b1130","status":"active","created_at":"2026-06-11T17:00:00+00:00"},"previous":{"status":"pending"},"source":{"kind":"confirmation_link","method":"","seconds_since_sent":null,"seconds_on_page":null}}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := model.ScrubEvent(tt.ev.Payload)
			if err != nil {
				t.Fatal(err)
			}
			if want := strings.Replace(tt.want, `"ID"`, `"`+tt.ev.ID.String()+`"`, 1); string(got) != want {
				t.Errorf("ScrubEvent =\n%s\nwant\n%s", got, want)
			}
			again, err := model.ScrubEvent(got)
			if err != nil || string(again) != string(got) {
				t.Errorf("scrubbing again = %s, %v; want it unchanged", again, err)
			}
		})
	}
}

func TestScrubEventRefusesWhatIsNoEvent(t *testing.T) {
	t.Parallel()
	for _, in := range []string{``, `[]`, `{"id":"x"}`, `{"data":5}`, `{"data":{"subscriber":"x"}}`, `{"data":{}`} {
		if got, err := model.ScrubEvent([]byte(in)); err == nil {
			t.Errorf("ScrubEvent(%q) = %s, want an error", in, got)
		}
	}
}

func TestNewErasedEvent(t *testing.T) {
	t.Parallel()
	nl, id := uuid.New(), uuid.MustParse("01a21363-a43b-7cde-b444-4915076b1130")
	now := time.Date(2026, 6, 11, 17, 0, 0, 0, time.UTC)
	ev := model.NewErasedEvent(nl, id, model.APISource("sk_abcd"), now)
	want := `{"id":"` + ev.ID.String() + `","type":"subscriber.erased","timestamp":"2026-06-11T17:00:00+00:00","data":{"subscriber":{"id":"01a21363-a43b-7cde-b444-4915076b1130"},"previous":{},"source":{"kind":"api","api_key":"sk_abcd"}}}`
	if string(ev.Payload) != want {
		t.Errorf("payload =\n%s\nwant\n%s", ev.Payload, want)
	}
	if !json.Valid(ev.Payload) || ev.NewsletterID != nl || ev.SubscriberID != id || ev.Type != model.EventErased || !ev.Timestamp.Equal(now) {
		t.Errorf("event = %+v", ev)
	}
}

func TestExportEmailStatus(t *testing.T) {
	t.Parallel()
	for state, want := range map[string]string{model.EmailPending: "queued", model.EmailSent: "sent",
		model.EmailFailed: "failed", model.EmailCancelled: "cancelled"} {
		if got := model.ExportEmailStatus(state); got != want {
			t.Errorf("ExportEmailStatus(%q) = %q, want %q", state, got, want)
		}
	}
}
