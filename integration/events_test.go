package integration

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/model"
)

// history is a subscriber's whole history through the API, walking every cursor.
func (e *env) history(id string) []map[string]any {
	e.t.Helper()
	var out []map[string]any
	path := "/subscribers/" + id + "/events"
	for range 100 {
		r := e.do("GET", path, nil).want(e.t, http.StatusOK, "")
		for _, ev := range r.body["data"].([]any) {
			out = append(out, ev.(map[string]any))
		}
		next, _ := r.body["pagination"].(map[string]any)["next_cursor"].(string)
		if next == "" {
			return out
		}
		path = "/subscribers/" + id + "/events?cursor=" + url.QueryEscape(next)
	}
	e.t.Fatal("history does not end")
	return nil
}

// eventSummary is what a test compares of an event: type, previous and source.
type eventSummary struct {
	Type     string
	Previous map[string]any
	Source   map[string]any
}

func summarize(evs []map[string]any) []eventSummary {
	out := make([]eventSummary, len(evs))
	for i, ev := range evs {
		d := ev["data"].(map[string]any)
		out[i] = eventSummary{Type: ev["type"].(string), Previous: d["previous"].(map[string]any), Source: d["source"].(map[string]any)}
	}
	return out
}

// keyPrefix is the display prefix of the env's key, the source of its changes.
func (e *env) keyPrefix() string { return e.key[:7] }

// TestEventsEveryChangeOnce walks §10.1: created, updated only when something changed,
// unsubscribed only when the status changed, each with the key's prefix as source and the
// subscriber after the change.
func TestEventsEveryChangeOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.do("POST", "/subscribers", map[string]any{"email": "ann@example.com", "name": "Ann"}).
		want(t, http.StatusCreated, "").data(t)["id"].(string)
	e.do("PUT", "/subscribers/"+id, map[string]any{"name": "Ann", "email": "ann@example.com"}).want(t, http.StatusOK, "")
	e.do("PUT", "/subscribers/"+id, map[string]any{"status": "active"}).want(t, http.StatusOK, "")
	e.do("PUT", "/subscribers/"+id, map[string]any{"name": "Ann Lee", "email": "Ann@example.com"}).want(t, http.StatusOK, "")
	e.do("DELETE", "/subscribers/"+id, nil).want(t, http.StatusOK, "")
	e.do("DELETE", "/subscribers/"+id, nil).want(t, http.StatusOK, "")
	e.do("PUT", "/subscribers/"+id, map[string]any{"status": "active"}).want(t, http.StatusOK, "")

	evs := e.history(id)
	api := map[string]any{"kind": "api", "api_key": e.keyPrefix()}
	want := []eventSummary{
		{"subscriber.created", map[string]any{}, api},
		{"subscriber.updated", map[string]any{"name": "Ann", "email": "ann@example.com"}, api},
		{"subscriber.unsubscribed", map[string]any{"status": "active"}, api},
		{"subscriber.updated", map[string]any{"status": "unsubscribed"}, api},
	}
	if diff := cmp.Diff(want, summarize(evs)); diff != "" {
		t.Fatalf("events mismatch (-want +got):\n%s", diff)
	}
	last := evs[len(evs)-1]
	sub := last["data"].(map[string]any)["subscriber"].(map[string]any)
	if sub["id"] != id || sub["email"] != "Ann@example.com" || sub["name"] != "Ann Lee" || sub["status"] != "active" {
		t.Errorf("subscriber after the change = %v", sub)
	}
	for _, ev := range evs {
		ts, _ := ev["timestamp"].(string)
		if len(ts) != len("2026-06-11T17:00:00+00:00") || !strings.HasSuffix(ts, "+00:00") {
			t.Errorf("timestamp %q is not the §1 format", ts)
		}
		if len(ev["id"].(string)) != 36 || ev["id"].(string)[14] != '7' {
			t.Errorf("event id %v is not a UUIDv7", ev["id"])
		}
	}
	if strings.Contains(string(e.do("GET", "/subscribers/"+id+"/events", nil).raw), e.key) {
		t.Error("the history contains the API key")
	}
}

// TestEventsBulkOnePerItem: a bulk create records one created event per item, in one
// statement; a failed bulk records none.
func TestEventsBulkOnePerItem(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	created := e.do("POST", "/subscribers/bulk", []any{
		map[string]any{"email": "a@example.com"}, map[string]any{"email": "b@example.com", "status": "pending"},
	}).want(t, http.StatusCreated, "").data(t)["created"].([]any)
	for _, c := range created {
		id := c.(map[string]any)["id"].(string)
		evs := e.history(id)
		if len(evs) != 1 || evs[0]["type"] != "subscriber.created" {
			t.Fatalf("history of %s = %v", id, evs)
		}
		if got := evs[0]["data"].(map[string]any)["subscriber"].(map[string]any)["status"]; got != c.(map[string]any)["status"] {
			t.Errorf("event status %v, subscriber %v", got, c)
		}
	}
	e.do("POST", "/subscribers/bulk", []any{map[string]any{"email": "c@example.com"}, map[string]any{"email": "a@example.com"}}).
		want(t, http.StatusUnprocessableEntity, "validation_error")
	e.do("POST", "/subscribers", map[string]any{"email": "A@example.com"}).want(t, http.StatusUnprocessableEntity, "email_already_subscribed")
	if n := e.count("SELECT count(*) FROM subscriber_events"); n != 2 {
		t.Errorf("%d events stored, want 2", n)
	}
}

// TestEventsConfirmationProof: the email worker records confirmation_sent when SMTP accepted
// the email; the link's POST records confirmed with the client's address (§5: the peer, as no
// proxy is trusted) and the first 512 characters of its User-Agent; a repeated POST records
// nothing.
func TestEventsConfirmationProof(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	id := m.create("ann@example.com", "pending")
	m.drain()
	msgs := m.smtp.Messages()
	if len(msgs) != 1 {
		t.Fatalf("%d emails", len(msgs))
	}
	ua := strings.Repeat("é", 600)
	confirm := func() {
		// A browser without scripts, its box ticked (docs/api-contract.md §12.1).
		req, _ := http.NewRequest(http.MethodPost, msgs[0].Link, strings.NewReader("intent=&consent=yes"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("User-Agent", ua)
		req.Header.Set("X-Forwarded-For", "203.0.113.9") // not believed: no trusted proxy
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("confirm: %d", res.StatusCode)
		}
	}
	confirm()
	confirm()
	evs := m.history(id)
	// seconds_since_sent counts from the server's acceptance: a few seconds at most here.
	src := evs[len(evs)-1]["data"].(map[string]any)["source"].(map[string]any)
	if s, ok := src["seconds_since_sent"].(float64); !ok || s < 0 || s > 60 {
		t.Errorf("seconds_since_sent = %v, want whole seconds since the email was sent", src["seconds_since_sent"])
	}
	src["seconds_since_sent"] = 0.0
	want := []eventSummary{
		{"subscriber.created", map[string]any{}, map[string]any{"kind": "api", "api_key": m.keyPrefix()}},
		{"subscriber.confirmation_sent", map[string]any{}, map[string]any{"kind": "email"}},
		{"subscriber.confirmed", map[string]any{"status": "pending"},
			map[string]any{"kind": "confirmation_link", "ip": "127.0.0.1", "user_agent": strings.Repeat("é", model.MaxUserAgentLength),
				"method": "checkbox", "seconds_since_sent": 0.0, "seconds_on_page": nil}},
	}
	if diff := cmp.Diff(want, summarize(evs)); diff != "" {
		t.Fatalf("events mismatch (-want +got):\n%s", diff)
	}
	if st := evs[2]["data"].(map[string]any)["subscriber"].(map[string]any)["status"]; st != "active" {
		t.Errorf("confirmed event's subscriber status = %v", st)
	}
}

// TestEventsHistoryPaging: oldest first, limit and cursors (§10.2), and every bad input.
func TestEventsHistoryPaging(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.do("POST", "/subscribers", map[string]any{"email": "ann@example.com"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
	other := e.do("POST", "/subscribers", map[string]any{"email": "bob@example.com"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
	for _, name := range []string{"A", "B", "C", "D"} {
		e.do("PUT", "/subscribers/"+id, map[string]any{"name": name}).want(t, http.StatusOK, "")
	}
	var ids []string
	var cursors []string
	path := "/subscribers/" + id + "/events?limit=2"
	for {
		r := e.do("GET", path, nil).want(t, http.StatusOK, "")
		p := r.body["pagination"].(map[string]any)
		if p["limit"] != float64(2) {
			t.Fatalf("pagination %v", p)
		}
		for _, ev := range r.body["data"].([]any) {
			ids = append(ids, ev.(map[string]any)["id"].(string))
		}
		next, ok := p["next_cursor"].(string)
		if !ok {
			if p["next_cursor"] != nil {
				t.Fatalf("next_cursor %v", p["next_cursor"])
			}
			break
		}
		cursors = append(cursors, next)
		path = "/subscribers/" + id + "/events?limit=2&cursor=" + url.QueryEscape(next)
	}
	if len(ids) != 5 || len(cursors) != 2 {
		t.Fatalf("walked %d events with %d cursors, want 5 and 2", len(ids), len(cursors))
	}
	for i := 1; i < len(ids); i++ {
		if ids[i] <= ids[i-1] {
			t.Errorf("not oldest first: %v", ids)
		}
	}
	if got := len(e.do("GET", "/subscribers/"+id+"/events", nil).body["data"].([]any)); got != 5 {
		t.Errorf("default limit returned %d events", got)
	}

	_, otherKey := e.newKey(t, true)
	for _, c := range []struct {
		name, path, key string
		status          int
		msg             string
	}{
		{"limit 0", "/subscribers/" + id + "/events?limit=0", "", 400, "The limit parameter must be an integer between 1 and 100."},
		{"limit 101", "/subscribers/" + id + "/events?limit=101", "", 400, "The limit parameter must be an integer between 1 and 100."},
		{"limit x", "/subscribers/" + id + "/events?limit=x", "", 400, "The limit parameter must be an integer between 1 and 100."},
		{"garbage cursor", "/subscribers/" + id + "/events?cursor=!!!", "", 400, api.MsgCursorInvalid},
		{"tampered cursor", "/subscribers/" + id + "/events?cursor=" + cursors[0][:len(cursors[0])-2], "", 400, api.MsgCursorInvalid},
		{"another subscriber's cursor", "/subscribers/" + other + "/events?cursor=" + url.QueryEscape(cursors[0]), "", 400, api.MsgCursorInvalid},
		{"unknown id", "/subscribers/01900000-0000-7000-8000-000000000001/events", "", 404, "Subscriber not found."},
		{"not a uuid", "/subscribers/x/events", "", 404, "Subscriber not found."},
		{"another newsletter", "/subscribers/" + id + "/events", otherKey, 404, "Subscriber not found."},
	} {
		t.Run(c.name, func(t *testing.T) {
			var headers []string
			if c.key != "" {
				headers = append(headers, "Authorization: Bearer "+c.key)
			}
			r := e.do("GET", c.path, nil, headers...)
			code := "validation_error"
			if c.status == 404 {
				code = "not_found"
			}
			r.want(t, c.status, code)
			if r.body["message"] != c.msg {
				t.Errorf("message %v, want %q", r.body["message"], c.msg)
			}
		})
	}
}

// TestEventsNotWrittenOnFailure: a write that fails records no event.
func TestEventsNotWrittenOnFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.do("POST", "/subscribers", map[string]any{"email": "a@example.com"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
	e.do("POST", "/subscribers", map[string]any{"email": "b@example.com"}).want(t, http.StatusCreated, "")
	e.do("PUT", "/subscribers/"+a, map[string]any{"email": "B@example.com"}).want(t, http.StatusUnprocessableEntity, "email_already_subscribed")
	e.do("PUT", "/subscribers/"+a, map[string]any{"email": "bad"}).want(t, http.StatusUnprocessableEntity, "validation_error")
	if n := e.count("SELECT count(*) FROM subscriber_events WHERE subscriber_id = ?", a); n != 1 {
		t.Errorf("%d events, want 1", n)
	}
}

// TestEventsNotOnReplay: an idempotent replay (docs/api-contract.md §8) records no event and
// queues no delivery.
func TestEventsNotOnReplay(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.hook("https://hooks.example.com/in", nil, nil)
	for range 2 {
		e.do("POST", "/subscribers", map[string]any{"email": "ann@example.com"}, "Idempotency-Key: k1").want(t, http.StatusCreated, "")
		e.do("POST", "/subscribers/bulk", []any{map[string]any{"email": "b@example.com"}}, "Idempotency-Key: k2").want(t, http.StatusCreated, "")
	}
	if n := e.count("SELECT count(*) FROM subscriber_events"); n != 2 {
		t.Errorf("%d events, want 2", n)
	}
	if n := e.count("SELECT count(*) FROM webhook_deliveries"); n != 2 {
		t.Errorf("%d deliveries, want 2", n)
	}
}
