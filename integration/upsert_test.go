package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/subscriberd/subscriberd/api"
)

// The upsert by email (docs/api-contract.md §16.1), sentence by sentence, on the store under
// test (TEST_STORE).

// upsertPath is the upsert's path for addr, percent-encoded as a path segment.
func upsertPath(addr string) string { return "/subscribers/by-email/" + url.PathEscape(addr) }

// TestUpsertCreatesANewAddress: no subscriber with the address → created as POST /subscribers
// would (default status active, its event, its webhook deliveries) → 201 with Location.
func TestUpsertCreatesANewAddress(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.do("POST", "/webhooks", map[string]any{"url": "http://127.0.0.1:9/hook"}).want(t, http.StatusCreated, "")

	r := e.do("PUT", upsertPath("Ann@Example.com"), map[string]any{"name": "Ann Lee"}).want(t, http.StatusCreated, "")
	d := r.data(t)
	id := d["id"].(string)
	if got, want := r.header.Get("Location"), "/api/v1/subscribers/"+id; got != want {
		t.Errorf("Location = %q, want %q", got, want)
	}
	want := map[string]any{"id": id, "email": "Ann@Example.com", "name": "Ann Lee", "status": "active", "created_at": d["created_at"]}
	if diff := cmp.Diff(want, d); diff != "" {
		t.Errorf("data (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(d, e.do("GET", "/subscribers/"+id, nil).want(t, http.StatusOK, "").data(t)); diff != "" {
		t.Errorf("GET Location differs (-upsert +get):\n%s", diff)
	}
	wantEvents := []eventSummary{{Type: "subscriber.created", Previous: map[string]any{},
		Source: map[string]any{"kind": "api", "api_key": e.keyPrefix()}}}
	if diff := cmp.Diff(wantEvents, summarize(e.history(id))); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if n := e.count("SELECT count(*) FROM webhook_deliveries"); n != 1 {
		t.Errorf("webhook deliveries = %d, want 1 (the created event's)", n)
	}
	if n := e.count("SELECT count(*) FROM email_outbox"); n != 0 {
		t.Errorf("emails queued for an active subscriber = %d, want 0", n)
	}

	// pending: a confirmation email, as on create.
	p := e.do("PUT", upsertPath("pat@example.com"), map[string]any{"status": "pending"}).want(t, http.StatusCreated, "").data(t)
	if p["status"] != "pending" || p["name"] != "" {
		t.Errorf("pending upsert data = %v, want status pending and no name", p)
	}
	if n := e.count("SELECT count(*) FROM email_outbox WHERE subscriber_id = ?", p["id"]); n != 1 {
		t.Errorf("confirmation emails queued = %d, want 1", n)
	}
}

// TestUpsertUpdatesTheExistingSubscriber: one exists (case-insensitively, whatever its
// status) → updated as PUT /subscribers/{id} would with the fields given → 200; none given:
// unchanged, and no event.
func TestUpsertUpdatesTheExistingSubscriber(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.do("POST", "/subscribers", map[string]any{"email": "bo@example.com", "name": "Bo"}).
		want(t, http.StatusCreated, "").data(t)["id"].(string)
	src := map[string]any{"kind": "api", "api_key": e.keyPrefix()}

	// Another case, percent-encoded or not: the same subscriber.
	for _, path := range []string{upsertPath("BO@EXAMPLE.COM"), "/subscribers/by-email/bo%40example.com", "/subscribers/by-email/bo@example.com"} {
		r := e.do("PUT", path, map[string]any{}).want(t, http.StatusOK, "")
		if r.header.Get("Location") != "" {
			t.Errorf("%s: an update has Location %q", path, r.header.Get("Location"))
		}
		if d := r.data(t); d["id"] != id || d["email"] != "bo@example.com" || d["name"] != "Bo" || d["status"] != "active" {
			t.Errorf("%s: data = %v, want the subscriber unchanged", path, d)
		}
	}
	// What a path would clean away is part of the address: "/" percent-encoded or not, "//".
	for _, tc := range []struct{ path, email string }{
		{"/subscribers/by-email/a%2Fb@example.com", "a/b@example.com"},
		{"/subscribers/by-email/a/b@example.com", "a/b@example.com"},
		{"/subscribers/by-email/a%2F%2Fb@example.com", "a//b@example.com"},
		{"/subscribers/by-email/jos%C3%A9@ex%C3%A4mple.com", "josé@exämple.com"},
	} {
		r := e.do("PUT", tc.path, map[string]any{})
		if r.status != http.StatusCreated && r.status != http.StatusOK {
			t.Fatalf("%s: status %d %s, want 201 or 200", tc.path, r.status, r.raw)
		}
		if got := r.data(t)["email"]; got != tc.email {
			t.Errorf("%s: email = %v, want %s", tc.path, got, tc.email)
		}
	}
	if n := e.count("SELECT count(*) FROM subscribers"); n != 4 {
		t.Errorf("subscribers = %d, want 4 (bo, a/b, a//b, josé)", n)
	}
	r := e.do("PUT", upsertPath("bo@example.com"), map[string]any{"name": "Bo Diddley"}).want(t, http.StatusOK, "")
	if d := r.data(t); d["id"] != id || d["name"] != "Bo Diddley" || d["status"] != "active" {
		t.Errorf("data = %v, want the new name, status kept", d)
	}
	// Unsubscribed, then upserted active: re-subscribed, as PUT does.
	e.do("DELETE", "/subscribers/"+id, nil).want(t, http.StatusOK, "")
	d := e.do("PUT", upsertPath("bo@example.com"), map[string]any{"status": "active"}).want(t, http.StatusOK, "").data(t)
	if d["status"] != "active" {
		t.Errorf("status after upsert active = %v, want active", d["status"])
	}
	// pending: a confirmation email, as PUT status pending sends.
	e.do("PUT", upsertPath("bo@example.com"), map[string]any{"status": "pending"}).want(t, http.StatusOK, "")
	if n := e.count("SELECT count(*) FROM email_outbox WHERE subscriber_id = ?", id); n != 1 {
		t.Errorf("confirmation emails queued = %d, want 1", n)
	}
	want := []eventSummary{
		{Type: "subscriber.created", Previous: map[string]any{}, Source: src},
		{Type: "subscriber.updated", Previous: map[string]any{"name": "Bo"}, Source: src},
		{Type: "subscriber.unsubscribed", Previous: map[string]any{"status": "active"}, Source: src},
		{Type: "subscriber.updated", Previous: map[string]any{"status": "unsubscribed"}, Source: src},
		{Type: "subscriber.updated", Previous: map[string]any{"status": "active"}, Source: src},
	}
	if diff := cmp.Diff(want, summarize(e.history(id))); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if n := e.count("SELECT count(*) FROM subscribers"); n != 4 {
		t.Errorf("subscribers = %d, want 4", n)
	}
}

// TestUpsertRefusesBadInput: an address that is not valid → 422 keyed email, never 404 or
// 500, whatever the path decodes to; an email property → prohibited; the §3 rules for the
// rest. Nothing is created.
func TestUpsertRefusesBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	invalid := []string{"The email field must be a valid email address."}
	for _, tc := range []struct {
		name, path string
		body       any
		want       map[string][]string
	}{
		{"not an address", "/subscribers/by-email/not-an-address", map[string]any{}, map[string][]string{"email": invalid}},
		{"space inside", "/subscribers/by-email/a%20b@example.com", map[string]any{}, map[string][]string{"email": invalid}},
		{"NUL", "/subscribers/by-email/%00", map[string]any{}, map[string][]string{"email": invalid}},
		{"no domain", "/subscribers/by-email/ann@", map[string]any{}, map[string][]string{"email": invalid}},
		{"display name", "/subscribers/by-email/" + url.PathEscape("Ann <ann@example.com>"), map[string]any{}, map[string][]string{"email": invalid}},
		{"encoded slash", "/subscribers/by-email/ann%2Fexample.com", map[string]any{}, map[string][]string{"email": invalid}},
		{"empty", "/subscribers/by-email/", map[string]any{}, map[string][]string{"email": {"The email field is required."}}},
		{"dot", "/subscribers/by-email/.", map[string]any{}, map[string][]string{"email": invalid}},
		{"dot dot", "/subscribers/by-email/..", map[string]any{}, map[string][]string{"email": invalid}},
		{"encoded dot dot", "/subscribers/by-email/%2e%2e", map[string]any{}, map[string][]string{"email": invalid}},
		{"dot dot inside", "/subscribers/by-email/a%2F..%2Fb@example.com", map[string]any{}, map[string][]string{"email": invalid}},
		{"percent", "/subscribers/by-email/%25", map[string]any{}, map[string][]string{"email": invalid}},
		{"only spaces", "/subscribers/by-email/%20%20", map[string]any{}, map[string][]string{"email": {"The email field is required."}}},
		{"too long", upsertPath(strings.Repeat("a", 64) + "@" + strings.Repeat("b", 200) + ".com"), map[string]any{},
			map[string][]string{"email": {"The email field must not be greater than 254 characters."}}},
		{"email in the body", upsertPath("ann@example.com"), map[string]any{"email": "ann@example.com"},
			map[string][]string{"email": {"The email field is prohibited."}}},
		{"bad address and email in the body", "/subscribers/by-email/x", map[string]any{"email": "x@example.com"},
			map[string][]string{"email": {invalid[0], "The email field is prohibited."}}},
		{"unsubscribed", upsertPath("ann@example.com"), map[string]any{"status": "unsubscribed"},
			map[string][]string{"status": {"The selected status is invalid; it must be active or pending. To unsubscribe, send DELETE /api/v1/subscribers/{id}."}}},
		{"other fields", upsertPath("ann@example.com"), map[string]any{"name": 5, "id": "x"},
			map[string][]string{"name": {"The name field must be a string."}, "id": {"The id field is prohibited."}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do("PUT", tc.path, tc.body).want(t, http.StatusUnprocessableEntity, api.CodeValidation)
			if diff := cmp.Diff(tc.want, r.fieldErrors(t)); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
	// A body that is not an object is malformed, as on PUT.
	e.do("PUT", upsertPath("ann@example.com"), "[]").want(t, http.StatusBadRequest, api.CodeValidation)
	if n := e.count("SELECT count(*) FROM subscribers"); n != 0 {
		t.Errorf("subscribers = %d after refused upserts, want 0", n)
	}
}

// TestUpsertIdempotencyKey: Idempotency-Key works as on the other writes: the 201 is replayed
// byte for byte and nothing runs again; another body with the key → 422 idempotency_key_reused.
func TestUpsertIdempotencyKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	body := map[string]any{"name": "Cy", "status": "pending"}
	first := e.do("PUT", upsertPath("cy@example.com"), body, idem("u-1")).want(t, http.StatusCreated, "")
	wantReplay(t, first, e.do("PUT", upsertPath("cy@example.com"), body, idem("u-1")))
	e.do("PUT", upsertPath("cy@example.com"), map[string]any{"name": "Other"}, idem("u-1")).
		want(t, http.StatusUnprocessableEntity, api.CodeIdempotencyKeyReused)
	// The same upsert with a new key updates (nothing to change: 200, no event).
	e.do("PUT", upsertPath("cy@example.com"), body, idem("u-2")).want(t, http.StatusOK, "")
	id := first.data(t)["id"].(string)
	if n := len(e.history(id)); n != 1 {
		t.Errorf("events = %d, want 1 (the create's)", n)
	}
	if n := e.count("SELECT count(*) FROM email_outbox"); n != 2 {
		// The create's email and the second upsert's: status pending sends one, as on PUT.
		t.Errorf("emails queued = %d, want 2", n)
	}
	if n := e.count("SELECT count(*) FROM subscribers"); n != 1 {
		t.Errorf("subscribers = %d, want 1", n)
	}
}

// TestUpsertConcurrentNewAddress: 20 concurrent upserts of one new address create it once;
// the others update it; none gets a 5xx or a 422. Half carry an Idempotency-Key each.
func TestUpsertConcurrentNewAddress(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const n = 20
	var (
		wg     sync.WaitGroup
		counts statusCounter
	)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			var hdr []string
			if i%2 == 0 {
				hdr = []string{idem("race-" + string(rune('a'+i)))}
			}
			status, raw, err := e.sendWith("PUT", upsertPath("race@example.com"), map[string]any{"name": "Race"}, hdr...)
			counts.add(status, raw, err)
		})
	}
	close(start)
	wg.Wait()
	counts.check(t, http.StatusCreated, http.StatusOK)
	if counts.counts[http.StatusCreated] != 1 || counts.counts[http.StatusOK] != n-1 {
		t.Errorf("statuses = %v, want one 201 and %d × 200", counts.counts, n-1)
	}
	if got := e.count("SELECT count(*) FROM subscribers"); got != 1 {
		t.Errorf("subscribers = %d, want 1", got)
	}
	if got := e.count("SELECT count(*) FROM subscriber_events"); got != 1 {
		t.Errorf("events = %d, want 1 (created; the updates changed nothing)", got)
	}
}

// TestUpsertCountsAsAWrite: the write lockout counts the upsert's refusals, as any write's.
func TestUpsertCountsAsAWrite(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withLimits(limitsConfig(t, "100/1m", "off", "off", "2/10m:10m")))
	for range 2 {
		e.do("PUT", "/subscribers/by-email/x", map[string]any{}).want(t, http.StatusUnprocessableEntity, api.CodeValidation)
	}
	want429(t, e.do("PUT", upsertPath("ok@example.com"), map[string]any{}), 600, api.MsgKeyLocked)
}

// sendWith is send with extra "Name: value" headers.
func (e *env) sendWith(method, path string, body any, headers ...string) (int, []byte, error) {
	js, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequest(method, e.base+path, bytes.NewReader(js))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+e.key)
	req.Header.Set("Content-Type", "application/json")
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(k, strings.TrimSpace(v))
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	return res.StatusCode, raw, err
}

// TestUpsertSuppressedAddress: a suppressed address → 422 email_suppressed, whether the upsert
// would create it or set its status active or pending; nothing changes (docs/api-contract.md
// §13, §16.1). With no field that subscribes, the upsert of an existing suppressed
// subscriber updates it as PUT would.
func TestUpsertSuppressedAddress(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	msg := []string{"This address is suppressed (manual) and cannot be subscribed."}
	e.do("POST", "/suppressions", map[string]any{"email": "gone@example.com"}).want(t, http.StatusCreated, "")
	for _, body := range []map[string]any{{}, {"name": "Gone"}, {"status": "pending"}} {
		r := e.do("PUT", upsertPath("GONE@example.com"), body).want(t, http.StatusUnprocessableEntity, api.CodeEmailSuppressed)
		if diff := cmp.Diff(map[string][]string{"email": msg}, r.fieldErrors(t)); diff != "" {
			t.Errorf("new address, body %v: errors (-want +got):\n%s", body, diff)
		}
	}
	if n := e.count("SELECT count(*) FROM subscribers"); n != 0 {
		t.Errorf("subscribers = %d, want 0", n)
	}

	// An existing subscriber, unsubscribed by its suppression.
	id := e.do("POST", "/subscribers", map[string]any{"email": "later@example.com"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
	e.do("POST", "/suppressions", map[string]any{"email": "later@example.com"}).want(t, http.StatusCreated, "")
	for _, st := range []string{"active", "pending"} {
		r := e.do("PUT", upsertPath("later@example.com"), map[string]any{"status": st}).want(t, http.StatusUnprocessableEntity, api.CodeEmailSuppressed)
		if diff := cmp.Diff(map[string][]string{"email": msg}, r.fieldErrors(t)); diff != "" {
			t.Errorf("status %s: errors (-want +got):\n%s", st, diff)
		}
	}
	d := e.do("PUT", upsertPath("later@example.com"), map[string]any{"name": "Later"}).want(t, http.StatusOK, "").data(t)
	if d["id"] != id || d["status"] != "unsubscribed" || d["name"] != "Later" {
		t.Errorf("rename of a suppressed subscriber = %v, want it renamed and still unsubscribed", d)
	}
	if n := e.count("SELECT count(*) FROM email_outbox WHERE state = 'pending'"); n != 0 {
		t.Errorf("confirmation emails queued = %d, want 0", n)
	}
}

// TestUpsertRaceWithoutKeys: 50 concurrent upserts of one new address without Idempotency-Key,
// with mixed names and statuses, run each in one unit of work under the address's lock: one
// creates the subscriber, every other one updates what those before it committed. One row
// remains, and its history is one chain: a single created event, then updates whose previous
// values are what the event before left, ending at the row as it is.
func TestUpsertRaceWithoutKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const n = 50
	var (
		wg     sync.WaitGroup
		counts statusCounter
	)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			body := map[string]any{"name": fmt.Sprintf("Name %d", i%4)}
			switch i % 3 {
			case 0:
				body["status"] = "active"
			case 1:
				body["status"] = "pending"
			}
			status, raw, err := e.sendWith("PUT", upsertPath("Race@Example.com"), body)
			counts.add(status, raw, err)
		})
	}
	close(start)
	wg.Wait()
	// A pending upsert of a subscriber that was sent its confirmations already may meet the
	// re-send limit (§12.3): 429, nothing changed.
	counts.check(t, http.StatusCreated, http.StatusOK, http.StatusTooManyRequests)
	if counts.counts[http.StatusCreated] != 1 {
		t.Errorf("statuses = %v, want exactly one 201", counts.counts)
	}
	if got := e.count("SELECT count(*) FROM subscribers"); got != 1 {
		t.Fatalf("subscribers = %d, want 1", got)
	}
	var payloads []string
	if err := e.db.NewRaw(`SELECT payload FROM subscriber_events WHERE type IN ('subscriber.created', 'subscriber.updated')
ORDER BY id`).Scan(context.Background(), &payloads); err != nil {
		t.Fatal(err)
	}
	type event struct {
		Type string `json:"type"`
		Data struct {
			Subscriber map[string]any    `json:"subscriber"`
			Previous   map[string]string `json:"previous"`
		} `json:"data"`
	}
	var state map[string]any
	for i, p := range payloads {
		var ev event
		if err := json.Unmarshal([]byte(p), &ev); err != nil {
			t.Fatal(err)
		}
		if (i == 0) != (ev.Type == "subscriber.created") {
			t.Fatalf("event %d is %s; want one subscriber.created, first", i, ev.Type)
		}
		if i > 0 {
			for field, before := range ev.Data.Previous {
				if state[field] != before {
					t.Fatalf("event %d says %s was %q; the event before left %q", i, field, before, state[field])
				}
			}
			for field, v := range ev.Data.Subscriber {
				if _, changed := ev.Data.Previous[field]; !changed && state[field] != v {
					t.Fatalf("event %d changed %s (%v → %v) without saying so", i, field, state[field], v)
				}
			}
		}
		state = ev.Data.Subscriber
	}
	row := e.do("GET", "/subscribers/"+state["id"].(string), nil).want(t, http.StatusOK, "").data(t)
	for _, field := range []string{"email", "name", "status"} {
		if row[field] != state[field] {
			t.Errorf("the row's %s is %v; the last event left %v", field, row[field], state[field])
		}
	}
	t.Logf("statuses %v, %d events", counts.counts, len(payloads))
}
