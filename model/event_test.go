package model

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
)

func TestNewEventWireForm(t *testing.T) {
	at := time.Date(2026, 6, 11, 17, 0, 0, 123, time.UTC)
	sub := Subscriber{ID: uuid.MustParse("01900000-0000-7000-8000-000000000001"), Email: "ann@example.com",
		FirstName: "Ann", LastName: "Lee", Status: StatusActive, CreatedAt: at}
	for _, c := range []struct {
		name string
		src  EventSource
		prev map[string]string
		want string
	}{
		{"api", APISource("sk_AbCd"), nil, `{"kind":"api","api_key":"sk_AbCd"}`},
		{"email", EventSource{Kind: SourceEmail}, nil, `{"kind":"email"}`},
		{"link", LinkSource("203.0.113.9", "Mozilla/5.0"), map[string]string{"status": "pending"},
			`{"kind":"confirmation_link","ip":"203.0.113.9","user_agent":"Mozilla/5.0","method":"","seconds_since_sent":null,"seconds_on_page":null}`},
		{"link, button", EventSource{Kind: SourceConfirmationLink, IP: "203.0.113.9", UserAgent: "UA", Method: MethodButton,
			SecondsSinceSent: ptr(int64(95)), SecondsOnPage: ptr(int64(4))}, nil,
			`{"kind":"confirmation_link","ip":"203.0.113.9","user_agent":"UA","method":"button","seconds_since_sent":95,"seconds_on_page":4}`},
		{"suppression", EventSource{Kind: SourceSuppression, Reason: "hard_bounce"}, nil, `{"kind":"suppression","reason":"hard_bounce"}`},
		{"suppression by key", EventSource{Kind: SourceSuppression, Reason: "manual", APIKey: "sk_AbCd"}, nil,
			`{"kind":"suppression","reason":"manual","api_key":"sk_AbCd"}`},
		{"decline", EventSource{Kind: SourceDeclineLink, IP: "203.0.113.9", UserAgent: "UA", Method: MethodButton}, nil,
			`{"kind":"decline_link","ip":"203.0.113.9","user_agent":"UA"}`},
		{"duplicate address", EventSource{Kind: SourceDuplicateAddress, Kept: "01a21363-a43b-7cde-b444-4915076b1130"},
			map[string]string{"status": "active"},
			`{"kind":"duplicate_address","kept":"01a21363-a43b-7cde-b444-4915076b1130"}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := NewEvent(EventConfirmed, sub, c.prev, c.src, at)
			var got map[string]any
			if err := json.Unmarshal(e.Payload, &got); err != nil {
				t.Fatal(err)
			}
			var src any
			json.Unmarshal([]byte(c.want), &src) //nolint:errcheck
			prev := map[string]any{}
			for k, v := range c.prev {
				prev[k] = v
			}
			want := map[string]any{"id": e.ID.String(), "type": "subscriber.confirmed", "timestamp": "2026-06-11T17:00:00+00:00",
				"data": map[string]any{
					"subscriber": map[string]any{"id": sub.ID.String(), "email": "ann@example.com", "name": "Ann Lee",
						"status": "active", "created_at": "2026-06-11T17:00:00+00:00"},
					"previous": prev, "source": src}}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("payload mismatch (-want +got):\n%s", diff)
			}
			if !strings.HasPrefix(string(e.Payload), `{"id":`) {
				t.Errorf("payload does not start with the id: %s", e.Payload)
			}
		})
	}
}

func TestLinkSourceCutsUserAgentByCharacters(t *testing.T) {
	ua := strings.Repeat("ü", MaxUserAgentLength+10)
	if got := LinkSource("::1", ua).UserAgent; got != strings.Repeat("ü", MaxUserAgentLength) {
		t.Errorf("user agent cut to %d characters", len([]rune(got)))
	}
	if got := LinkSource("::1", "short").UserAgent; got != "short" {
		t.Errorf("short user agent = %q", got)
	}
}

func TestChanges(t *testing.T) {
	a := Subscriber{Email: "a@x.io", FirstName: "A", Status: StatusPending}
	for _, c := range []struct {
		name  string
		after Subscriber
		want  map[string]string
	}{
		{"nothing", a, map[string]string{}},
		{"case of email", Subscriber{Email: "A@x.io", FirstName: "A", Status: StatusPending}, map[string]string{"email": "a@x.io"}},
		{"name and status", Subscriber{Email: "a@x.io", FirstName: "B", Status: StatusActive}, map[string]string{"name": "A", "status": "pending"}},
	} {
		if diff := cmp.Diff(c.want, Changes(a, c.after)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", c.name, diff)
		}
	}
}

func ptr[T any](v T) *T { return &v }
