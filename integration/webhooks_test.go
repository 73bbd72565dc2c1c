package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
	"github.com/subscriberd/subscriberd/telemetry"
	"github.com/subscriberd/subscriberd/webhook"
)

// receiver is a webhook receiver on a real HTTP server. It verifies every delivery with the
// Standard Webhooks reference library (never with our own signer) and records it; answer, when
// set, answers instead of 204.
type receiver struct {
	t      *testing.T
	srv    *httptest.Server
	mu     sync.Mutex
	secret string
	got    []delivered
	calls  int
	answer func(w http.ResponseWriter, r *http.Request) bool // true: answered
}

type delivered struct {
	id, timestamp string
	header        http.Header
	body          []byte
}

func newReceiver(t *testing.T) *receiver {
	rc := &receiver{t: t}
	rc.srv = httptest.NewServer(http.HandlerFunc(rc.serve))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	rc.calls++
	answer, secret := rc.answer, rc.secret
	rc.mu.Unlock()
	if answer != nil && answer(w, r) {
		return
	}
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		rc.t.Errorf("receiver: secret %v", err)
		w.WriteHeader(500)
		return
	}
	if err := wh.Verify(body, r.Header); err != nil {
		rc.t.Errorf("receiver: signature does not verify: %v", err)
		w.WriteHeader(400)
		return
	}
	rc.mu.Lock()
	rc.got = append(rc.got, delivered{id: r.Header.Get("webhook-id"), timestamp: r.Header.Get("webhook-timestamp"),
		header: r.Header.Clone(), body: body})
	rc.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (rc *receiver) deliveries() []delivered {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]delivered(nil), rc.got...)
}

func (rc *receiver) setAnswer(f func(w http.ResponseWriter, r *http.Request) bool) {
	rc.mu.Lock()
	rc.answer = f
	rc.mu.Unlock()
}

// hook creates an endpoint for url subscribed to events (nil: all) and returns its id; the
// secret goes to rc when given.
func (e *env) hook(url string, events []string, rc *receiver) string {
	e.t.Helper()
	body := map[string]any{"url": url}
	if events != nil {
		body["events"] = events
	}
	d := e.do("POST", "/webhooks", body).want(e.t, http.StatusCreated, "").data(e.t)
	if rc != nil {
		rc.mu.Lock()
		rc.secret = d["secret"].(string)
		rc.mu.Unlock()
	}
	return d["id"].(string)
}

func testHookConfig() webhook.Config {
	return webhook.Config{Timeout: 2 * time.Second, Guard: webhook.Guard{AllowPrivate: true}, Logger: discardLog,
		Backoff: []time.Duration{time.Millisecond, time.Millisecond, time.Millisecond}}
}

// deliverAll runs worker rounds until nothing is due.
func (e *env) deliverAll(w *webhook.Worker) {
	e.t.Helper()
	for range 50 {
		n, err := w.RunOnce(context.Background())
		if err != nil {
			e.t.Fatal(err)
		}
		if n == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond) // let millisecond back-offs come due
	}
	e.t.Fatal("deliveries do not end")
}

func (e *env) hookWorker(cfg webhook.Config) *webhook.Worker {
	return webhook.NewWorker(repo.NewDeliveries(e.db), cfg)
}

// TestWebhookEndpointsCRUD: the four operations of §10.3.
func TestWebhookEndpointsCRUD(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.do("POST", "/webhooks", map[string]any{"url": "https://hooks.example.com/in", "events": []string{"subscriber.confirmed"}}).
		want(t, http.StatusCreated, "")
	d := r.data(t)
	id := d["id"].(string)
	if loc := r.header.Get("Location"); loc != "/api/v1/webhooks/"+id {
		t.Errorf("Location %q", loc)
	}
	secret, _ := d["secret"].(string)
	if !strings.HasPrefix(secret, "whsec_") || len(secret) != len("whsec_")+44 {
		t.Errorf("secret %q", secret)
	}
	if d["status"] != "enabled" || d["url"] != "https://hooks.example.com/in" || fmt.Sprint(d["events"]) != "[subscriber.confirmed]" {
		t.Errorf("created %v", d)
	}
	second := e.hook("https://hooks.example.com/all", nil, nil)
	list := e.do("GET", "/webhooks", nil).want(t, http.StatusOK, "")
	items := list.body["data"].([]any)
	if len(items) != 2 || items[0].(map[string]any)["id"] != id || items[1].(map[string]any)["id"] != second {
		t.Fatalf("list %s", list.raw)
	}
	if all := items[1].(map[string]any)["events"].([]any); len(all) != 5 {
		t.Errorf("absent events = %v, want all five", all)
	}
	got := e.do("GET", "/webhooks/"+id, nil).want(t, http.StatusOK, "")
	for _, raw := range [][]byte{list.raw, got.raw} {
		if bytes.Contains(raw, []byte("secret")) || bytes.Contains(raw, []byte(secret)) {
			t.Errorf("a read shows the secret: %s", raw)
		}
	}
	_, otherKey := e.newKey(t, true)
	for _, path := range []string{"/webhooks/" + id, "/webhooks/x", "/webhooks/01900000-0000-7000-8000-000000000001"} {
		for _, key := range []string{e.key, otherKey} {
			if path != "/webhooks/"+id || key == otherKey {
				r := e.do("GET", path, nil, "Authorization: Bearer "+key).want(t, http.StatusNotFound, "not_found")
				if r.body["message"] != "Webhook not found." {
					t.Errorf("GET %s: %s", path, r.raw)
				}
			}
		}
	}
	del := e.do("DELETE", "/webhooks/"+id, nil).want(t, http.StatusOK, "")
	if del.data(t)["id"] != id || bytes.Contains(del.raw, []byte(secret)) {
		t.Errorf("delete answered %s", del.raw)
	}
	e.do("DELETE", "/webhooks/"+id, nil).want(t, http.StatusNotFound, "not_found")
	e.do("GET", "/webhooks/"+id, nil).want(t, http.StatusNotFound, "not_found")
}

// TestWebhookEventsNullOrEmpty: events null is events absent (every type); an empty list is
// an endpoint of no type, not every type.
func TestWebhookEventsNullOrEmpty(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, c := range []struct {
		name   string
		events any
		want   string
	}{
		{"null", nil, fmt.Sprint(model.EventTypes)},
		{"empty", []any{}, "[]"},
	} {
		d := e.do("POST", "/webhooks", map[string]any{"url": "https://hooks.example.com/" + c.name, "events": c.events}).
			want(t, http.StatusCreated, "").data(t)
		if got := fmt.Sprint(d["events"]); got != c.want {
			t.Errorf("events %s: created with %s, want %s", c.name, got, c.want)
		}
	}
}

// TestWebhookValidation: every rule of §10.3 answers its 422 and stores nothing.
func TestWebhookValidation(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, c := range []struct {
		name string
		body any
		want map[string][]string
	}{
		{"no url", map[string]any{}, map[string][]string{"url": {"The url field is required."}}},
		{"null url", map[string]any{"url": nil}, map[string][]string{"url": {"The url field is required."}}},
		{"url not a string", map[string]any{"url": 5}, map[string][]string{"url": {"The url field must be a string."}}},
		{"relative", map[string]any{"url": "/hook"}, map[string][]string{"url": {"The url field must be a valid URL."}}},
		{"not a url", map[string]any{"url": "hooks example"}, map[string][]string{"url": {"The url field must be a valid URL."}}},
		{"a space in the path", map[string]any{"url": "https://example.com/o k"}, map[string][]string{"url": {"The url field must be a valid URL."}}},
		{"a space in the query", map[string]any{"url": "https://example.com/hook?a=b c"}, map[string][]string{"url": {"The url field must be a valid URL."}}},
		{"ftp", map[string]any{"url": "ftp://example.com/x"}, map[string][]string{"url": {"The url field must be an http or https URL."}}},
		{"user", map[string]any{"url": "https://u:p@example.com/x"}, map[string][]string{"url": {"The url field must not contain a user name or password."}}},
		{"too long", map[string]any{"url": "https://example.com/" + strings.Repeat("a", 2029)}, map[string][]string{"url": {"The url field must not be greater than 2048 characters."}}},
		{"events not a list", map[string]any{"url": "https://example.com", "events": "subscriber.created"}, map[string][]string{"events": {"The events field must be an array."}}},
		{"unknown event", map[string]any{"url": "https://example.com", "events": []any{"subscriber.deleted", 3}},
			map[string][]string{"events.0": {"The selected events.0 is invalid."}, "events.1": {"The selected events.1 is invalid."}}},
		{"repeated event", map[string]any{"url": "https://example.com", "events": []any{"subscriber.created", "subscriber.created"}},
			map[string][]string{"events.1": {"The events.1 field has a duplicate value."}}},
		{"other property", map[string]any{"url": "https://example.com", "secret": "x"}, map[string][]string{"secret": {"The secret field is prohibited."}}},
		{"url an object", map[string]any{"url": map[string]any{"href": "https://example.com"}}, map[string][]string{"url": {"The url field must be a string."}}},
		{"events an object", map[string]any{"url": "https://example.com", "events": map[string]any{"0": "subscriber.created"}},
			map[string][]string{"events": {"The events field must be an array."}}},
		{"every problem at once", map[string]any{"url": []any{"https://example.com"}, "events": true, "id": "x", "secret": nil},
			map[string][]string{"events": {"The events field must be an array."}, "id": {"The id field is prohibited."},
				"secret": {"The secret field is prohibited."}, "url": {"The url field must be a string."}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := e.do("POST", "/webhooks", c.body).want(t, http.StatusUnprocessableEntity, "validation_error")
			if got := r.fieldErrors(t); fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("errors %v, want %v", got, c.want)
			}
		})
	}
	if n := e.count("SELECT count(*) FROM webhook_endpoints"); n != 0 {
		t.Errorf("%d endpoints stored", n)
	}
	// A 2048-character URL is fine.
	e.do("POST", "/webhooks", map[string]any{"url": "https://example.com/" + strings.Repeat("a", 2028)}).want(t, http.StatusCreated, "")
	for range model.MaxWebhooks - 1 {
		e.hook("https://example.com/x", nil, nil)
	}
	r := e.do("POST", "/webhooks", map[string]any{"url": "https://example.com/21"}).want(t, http.StatusUnprocessableEntity, "validation_error")
	if got := r.fieldErrors(t); fmt.Sprint(got) != fmt.Sprint(map[string][]string{"body": {"A newsletter can have at most 20 webhook endpoints."}}) {
		t.Errorf("21st: %v", got)
	}
	if n := e.count("SELECT count(*) FROM webhook_endpoints"); n != model.MaxWebhooks {
		t.Errorf("%d endpoints stored", n)
	}
	// Another newsletter has its own 20.
	e.key = func() string { _, k := e.newKey(t, true); return k }()
	e.hook("https://example.com/x", nil, nil)
}

// TestWebhookPrivateURLsRefused: the SSRF rule at creation (WEBHOOK_ALLOW_PRIVATE unset).
func TestWebhookPrivateURLsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(o *envOptions) { o.guardPrivate = true })
	for _, u := range []string{"http://127.0.0.1/x", "http://localhost:8080/x", "https://10.1.2.3/", "http://192.168.0.1",
		"http://172.16.0.1", "http://169.254.169.254/latest/meta-data", "http://[::1]/", "http://0.0.0.0/", "http://[fe80::1]/",
		"http://[::ffff:127.0.0.1]/", "http://[fd00::1]/"} {
		r := e.do("POST", "/webhooks", map[string]any{"url": u}).want(t, http.StatusUnprocessableEntity, "validation_error")
		if got := r.fieldErrors(t)["url"]; fmt.Sprint(got) != "[The url must be a public http or https address.]" {
			t.Errorf("%s: %v", u, got)
		}
	}
	e.do("POST", "/webhooks", map[string]any{"url": "https://93.184.215.14/in"}).want(t, http.StatusCreated, "")
}

// TestWebhookDeliverySigned: an event reaches a real receiver with the Standard Webhooks
// headers, a signature the reference library verifies, and the history's object as body.
func TestWebhookDeliverySigned(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	e.hook(rc.srv.URL+"/all", nil, rc)
	other := newReceiver(t)
	e.hook(other.srv.URL+"/confirmed-only", []string{"subscriber.confirmed"}, other)
	id := e.do("POST", "/subscribers", map[string]any{"email": "ann@example.com"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
	e.do("PUT", "/subscribers/"+id, map[string]any{"name": "Ann"}).want(t, http.StatusOK, "")
	e.deliverAll(e.hookWorker(testHookConfig()))

	got := rc.deliveries()
	hist := e.history(id)
	if len(got) != 2 || len(hist) != 2 {
		t.Fatalf("%d deliveries, %d events", len(got), len(hist))
	}
	if n := len(other.deliveries()); n != 0 {
		t.Errorf("an endpoint not subscribed to these types got %d", n)
	}
	byID := map[string]delivered{}
	for _, d := range got {
		byID[d.id] = d
	}
	for _, ev := range hist {
		d, ok := byID[ev["id"].(string)]
		if !ok {
			t.Fatalf("event %v not delivered", ev["id"])
		}
		var body map[string]any
		if err := json.Unmarshal(d.body, &body); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(body) != fmt.Sprint(ev) {
			t.Errorf("body %s is not the history's event %v", d.body, ev)
		}
		for k, want := range map[string]string{"Content-Type": "application/json", "User-Agent": "subscriberd-webhooks/1"} {
			if d.header.Get(k) != want {
				t.Errorf("%s = %q", k, d.header.Get(k))
			}
		}
		if !strings.HasPrefix(d.header.Get("webhook-signature"), "v1,") {
			t.Errorf("signature %q", d.header.Get("webhook-signature"))
		}
	}
	if n := e.count("SELECT count(*) FROM webhook_deliveries"); n != 0 {
		t.Errorf("%d deliveries left in the outbox", n)
	}
}

// outboxRow reads one delivery's bookkeeping.
func (e *env) delivery(eventID string) (state string, attempts int, due time.Time, lastErr string) {
	e.t.Helper()
	var row struct {
		State    string    `bun:"state"`
		Attempts int       `bun:"attempts"`
		Next     time.Time `bun:"next_attempt_at"`
		Err      string    `bun:"last_error"`
	}
	if err := e.db.NewRaw("SELECT state, attempts, next_attempt_at, last_error FROM webhook_deliveries WHERE event_id = ?", eventID).
		Scan(context.Background(), &row); err != nil {
		e.t.Fatal(err)
	}
	return row.State, row.Attempts, row.Next, row.Err
}

func (e *env) endpointStatus(id string) string {
	e.t.Helper()
	return e.do("GET", "/webhooks/"+id, nil).want(e.t, http.StatusOK, "").data(e.t)["status"].(string)
}

// TestWebhookFaults: each misbehaving receiver gets the behaviour of §10.4, quickly.
func TestWebhookFaults(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		answer  func(w http.ResponseWriter, r *http.Request) bool
		outcome string // state after one attempt: pending (retry), failed, gone
		minWait time.Duration
		maxWait time.Duration
		errText string
	}{
		{"500", func(w http.ResponseWriter, r *http.Request) bool { w.WriteHeader(500); return true },
			"pending", 4 * time.Second, 6 * time.Second, "HTTP 500"},
		{"503 with Retry-After", func(w http.ResponseWriter, r *http.Request) bool {
			w.Header().Set("Retry-After", "120")
			w.WriteHeader(503)
			return true
		}, "pending", 119 * time.Second, 121 * time.Second, "HTTP 503"},
		{"410", func(w http.ResponseWriter, r *http.Request) bool { w.WriteHeader(410); return true },
			"failed", 0, 0, "HTTP 410"},
		{"redirect", func(w http.ResponseWriter, r *http.Request) bool {
			if r.URL.Path == "/elsewhere" {
				t.Error("the redirect was followed")
				return false
			}
			http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
			return true
		}, "pending", 4 * time.Second, 6 * time.Second, "HTTP 307"},
		{"hang", func(w http.ResponseWriter, r *http.Request) bool {
			select {
			case <-r.Context().Done():
			case <-time.After(30 * time.Second):
			}
			return true
		}, "pending", 4 * time.Second, 6 * time.Second, "timeout"},
		{"closes mid-answer", func(w http.ResponseWriter, r *http.Request) bool {
			conn, buf, err := w.(http.Hijacker).Hijack()
			if err != nil {
				t.Error(err)
				return true
			}
			buf.WriteString("HTTP/1.1 200 OK\r\nContent-Le")
			buf.Flush()
			conn.Close()
			return true
		}, "pending", 4 * time.Second, 6 * time.Second, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			rc := newReceiver(t)
			rc.setAnswer(c.answer)
			hook := e.hook(rc.srv.URL+"/in", nil, rc)
			id := e.do("POST", "/subscribers", map[string]any{"email": "ann@example.com"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
			ev := e.history(id)[0]["id"].(string)
			cfg := testHookConfig()
			cfg.Timeout, cfg.Backoff = 300*time.Millisecond, model.WebhookBackoff
			start := time.Now()
			if _, err := e.hookWorker(cfg).RunOnce(context.Background()); err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("the attempt took %v", took)
			}
			state, attempts, due, lastErr := e.delivery(ev)
			if attempts != 1 || !strings.Contains(lastErr, c.errText) {
				t.Errorf("attempts %d, last error %q", attempts, lastErr)
			}
			switch c.outcome {
			case "pending":
				if wait := time.Until(due); state != "pending" || wait < c.minWait-time.Second || wait > c.maxWait {
					t.Errorf("state %s, due in %v; want pending in [%v, %v]", state, wait, c.minWait, c.maxWait)
				}
				if st := e.endpointStatus(hook); st != "enabled" {
					t.Errorf("endpoint %s", st)
				}
			case "failed":
				if state != "failed" {
					t.Errorf("state %s", state)
				}
				if st := e.endpointStatus(hook); st != "disabled" {
					t.Errorf("endpoint %s after 410", st)
				}
				// Nothing more is sent to it, and no more deliveries are queued for it.
				e.do("PUT", "/subscribers/"+id, map[string]any{"name": "X"}).want(t, http.StatusOK, "")
				if n := e.count("SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'"); n != 0 {
					t.Errorf("%d deliveries queued for a disabled endpoint", n)
				}
			}
		})
	}
}

// TestWebhookHugeAnswer: a 100 MB answer is read only so far; the delivery counts.
func TestWebhookHugeAnswer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	rc.setAnswer(func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Length", fmt.Sprint(100<<20))
		w.WriteHeader(200)
		chunk := bytes.Repeat([]byte("x"), 1<<20)
		for range 100 {
			if _, err := w.Write(chunk); err != nil {
				return true
			}
		}
		return true
	})
	e.hook(rc.srv.URL, nil, rc)
	e.do("POST", "/subscribers", map[string]any{"email": "ann@example.com"}).want(t, http.StatusCreated, "")
	start := time.Now()
	e.deliverAll(e.hookWorker(testHookConfig()))
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("took %v", took)
	}
	if n := e.count("SELECT count(*) FROM webhook_deliveries"); n != 0 {
		t.Errorf("%d deliveries left", n)
	}
}

// TestWebhookLastAttemptFails: after the last back-off step the delivery fails for good.
func TestWebhookLastAttemptFails(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	rc.setAnswer(func(w http.ResponseWriter, r *http.Request) bool { w.WriteHeader(500); return true })
	e.hook(rc.srv.URL, nil, rc)
	id := e.do("POST", "/subscribers", map[string]any{"email": "ann@example.com"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
	e.deliverAll(e.hookWorker(testHookConfig())) // three 1 ms steps: four attempts
	state, attempts, _, _ := e.delivery(e.history(id)[0]["id"].(string))
	if state != "failed" || attempts != 4 {
		t.Errorf("state %s after %d attempts, want failed after 4", state, attempts)
	}
	if rc.calls != 4 {
		t.Errorf("receiver called %d times", rc.calls)
	}
}

// TestWebhookFailingFiveDaysDisables: an endpoint whose deliveries have all failed for 5 days
// is disabled at the next failure; a success before that resets the clock.
func TestWebhookFailingFiveDaysDisables(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	rc.setAnswer(func(w http.ResponseWriter, r *http.Request) bool { w.WriteHeader(502); return true })
	hook := e.hook(rc.srv.URL, nil, rc)
	e.do("POST", "/subscribers", map[string]any{"email": "ann@example.com"}).want(t, http.StatusCreated, "")
	cfg := testHookConfig()
	cfg.Backoff = []time.Duration{time.Millisecond, time.Millisecond, time.Millisecond, time.Millisecond, time.Millisecond}
	w := e.hookWorker(cfg)
	if _, err := w.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := e.endpointStatus(hook); st != "enabled" {
		t.Fatalf("endpoint %s after one failure", st)
	}
	if _, err := e.db.NewRaw("UPDATE webhook_endpoints SET failing_since = ?", time.Now().UTC().Add(-model.WebhookFailingLimit-time.Minute)).
		Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	if _, err := w.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := e.endpointStatus(hook); st != "disabled" {
		t.Errorf("endpoint %s after 5 days of failures", st)
	}
}

// TestWebhookPrivateAddressAtDelivery: with private addresses refused, the address actually
// dialled is checked at delivery: a URL stored while allowed (or a name that now resolves to a
// private address) is not delivered to.
func TestWebhookPrivateAddressAtDelivery(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	e.hook(strings.Replace(rc.srv.URL, "127.0.0.1", "localhost", 1), nil, rc)
	id := e.do("POST", "/subscribers", map[string]any{"email": "ann@example.com"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
	cfg := testHookConfig()
	cfg.Guard = webhook.Guard{}
	if _, err := e.hookWorker(cfg).RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if rc.calls != 0 {
		t.Errorf("a private address was dialled")
	}
	if _, attempts, _, lastErr := e.delivery(e.history(id)[0]["id"].(string)); attempts != 1 || !strings.Contains(lastErr, "not public") {
		t.Errorf("attempts %d, error %q", attempts, lastErr)
	}
}

// TestWebhookDeleteDropsUndelivered: deleting an endpoint drops its undelivered events.
func TestWebhookDeleteDropsUndelivered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	hook := e.hook(rc.srv.URL, nil, rc)
	e.do("POST", "/subscribers", map[string]any{"email": "ann@example.com"}).want(t, http.StatusCreated, "")
	if n := e.count("SELECT count(*) FROM webhook_deliveries"); n != 1 {
		t.Fatalf("%d queued", n)
	}
	e.do("DELETE", "/webhooks/"+hook, nil).want(t, http.StatusOK, "")
	if n := e.count("SELECT count(*) FROM webhook_deliveries"); n != 0 {
		t.Errorf("%d deliveries left", n)
	}
	e.deliverAll(e.hookWorker(testHookConfig()))
	if rc.calls != 0 {
		t.Errorf("deleted endpoint called")
	}
}

// TestWebhookSlowEndpointDoesNotBlockOthers: a receiver that hangs holds one worker; the
// others' deliveries go on meanwhile.
func TestWebhookSlowEndpointDoesNotBlockOthers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	slow, fast := newReceiver(t), newReceiver(t)
	release := make(chan struct{})
	slow.setAnswer(func(w http.ResponseWriter, r *http.Request) bool {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		return true
	})
	e.hook(slow.srv.URL, nil, slow)
	e.hook(fast.srv.URL, nil, fast)
	cfg := testHookConfig()
	cfg.Timeout, cfg.Workers, cfg.PollInterval = 20*time.Second, 2, 20*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		e.hookWorker(cfg).Run(ctx) //nolint:errcheck
		close(done)
	}()
	for i := range 20 {
		e.do("POST", "/subscribers", map[string]any{"email": fmt.Sprintf("s%d@example.com", i)}).want(t, http.StatusCreated, "")
	}
	waitFor(t, "the fast endpoint's 20 deliveries", func() bool { return len(fast.deliveries()) == 20 })
	close(release)
	cancel()
	<-done
}

// TestWebhookRestartLosesNothing: a worker stopped in the middle of deliveries, and a new one
// started on the same database, deliver every event at least once.
func TestWebhookRestartLosesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	var once sync.Once
	stop := make(chan struct{})
	rc.setAnswer(func(w http.ResponseWriter, r *http.Request) bool {
		rc.mu.Lock()
		n := rc.calls
		rc.mu.Unlock()
		if n == 10 {
			once.Do(func() { close(stop) })
		}
		return false
	})
	e.hook(rc.srv.URL, nil, rc)
	items := make([]any, 60)
	for i := range items {
		items[i] = map[string]any{"email": fmt.Sprintf("s%d@example.com", i)}
	}
	e.do("POST", "/subscribers/bulk", items).want(t, http.StatusCreated, "")
	cfg := testHookConfig()
	cfg.PerEndpoint, cfg.PollInterval = 5, 10*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		e.hookWorker(cfg).Run(ctx) //nolint:errcheck
		close(done)
	}()
	<-stop
	cancel()
	<-done
	if n := len(rc.deliveries()); n >= 60 {
		t.Fatalf("all %d delivered before the stop", n)
	}
	// A new process: its own pool on the same database.
	db2, err := repo.Open(e.dsn, repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	w2 := webhook.NewWorker(repo.NewDeliveries(db2), cfg)
	e.deliverAll(w2)
	seen := map[string]int{}
	for _, d := range rc.deliveries() {
		seen[d.id]++
	}
	if len(seen) != 60 {
		t.Errorf("%d distinct events delivered, want 60", len(seen))
	}
}

// TestWebhookTwoInstancesDeliverOnce: two instances delivering from one database deliver each
// event exactly once in normal operation.
func TestWebhookTwoInstancesDeliverOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	receivers := []*receiver{newReceiver(t), newReceiver(t), newReceiver(t)}
	for _, rc := range receivers {
		e.hook(rc.srv.URL, nil, rc)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		db, err := repo.Open(e.dsn, repo.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		q := repo.NewDeliveries(db)
		cfg := testHookConfig()
		cfg.PerEndpoint, cfg.Workers, cfg.PollInterval, cfg.Wake = 7, 2, 10*time.Millisecond, q.Listen(ctx)
		w := webhook.NewWorker(q, cfg)
		wg.Go(func() { w.Run(ctx) }) //nolint:errcheck
	}
	for i := range 5 {
		items := make([]any, 20)
		for j := range items {
			items[j] = map[string]any{"email": fmt.Sprintf("s%d-%d@example.com", i, j)}
		}
		e.do("POST", "/subscribers/bulk", items).want(t, http.StatusCreated, "")
	}
	waitFor(t, "100 deliveries to each receiver", func() bool {
		for _, rc := range receivers {
			if len(rc.deliveries()) < 100 {
				return false
			}
		}
		return true
	})
	time.Sleep(100 * time.Millisecond)
	cancel()
	wg.Wait()
	for i, rc := range receivers {
		seen := map[string]int{}
		for _, d := range rc.deliveries() {
			seen[d.id]++
			if seen[d.id] > 1 {
				t.Errorf("receiver %d got %s twice", i, d.id)
			}
		}
	}
}

// TestWebhookSecretStaysSecret: the secret appears in the create answer and nowhere else: not
// in reads, logs of the API or the worker, nor in delivery bookkeeping.
func TestWebhookSecretStaysSecret(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewJSONHandler(lockedWriter{&mu, &logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e := newEnv(t)
	rc := newReceiver(t)
	rc.setAnswer(func(w http.ResponseWriter, r *http.Request) bool { w.WriteHeader(500); return true })
	hook := e.hook(rc.srv.URL, nil, rc)
	e.do("POST", "/subscribers", map[string]any{"email": "ann@example.com"}).want(t, http.StatusCreated, "")
	cfg := testHookConfig()
	cfg.Logger = log
	metrics := telemetry.NewMetrics("test")
	cfg.Recorder = metrics
	e.deliverAll(e.hookWorker(cfg))
	scrape := httptest.NewRecorder()
	metrics.Handler().ServeHTTP(scrape, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(scrape.Body.String(), `webhook_deliveries_total{outcome="retry"} 3`) {
		t.Errorf("metrics do not count the attempts:\n%s", scrape.Body.String())
	}
	secret := rc.secret
	mu.Lock()
	defer mu.Unlock()
	key := strings.TrimPrefix(secret, "whsec_")
	for name, text := range map[string]string{
		"logs":    logs.String(),
		"metrics": scrape.Body.String(),
		"get":     string(e.do("GET", "/webhooks/"+hook, nil).raw),
		"list":    string(e.do("GET", "/webhooks", nil).raw),
		"errors":  fmt.Sprint(e.count("SELECT count(*) FROM webhook_deliveries WHERE last_error LIKE ?", "%"+key[:10]+"%")),
	} {
		if strings.Contains(text, key) {
			t.Errorf("the secret is in the %s", name)
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestWebhookIdempotencyKey: POST /webhooks and DELETE /webhooks/{id} take Idempotency-Key
// (docs/api-contract.md §8): a retry gets the first answer again, secret included, and makes no
// second endpoint; a delete's retry answers 200 again, not 404.
func TestWebhookIdempotencyKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	body := map[string]any{"url": "https://hooks.example.com/in"}
	first := e.do("POST", "/webhooks", body, "Idempotency-Key: hook-1").want(t, http.StatusCreated, "")
	again := e.do("POST", "/webhooks", body, "Idempotency-Key: hook-1").want(t, http.StatusCreated, "")
	if !bytes.Equal(first.raw, again.raw) || again.header.Get("Idempotent-Replayed") != "true" ||
		again.header.Get("Location") != first.header.Get("Location") {
		t.Errorf("replay %s (%v), first %s", again.raw, again.header, first.raw)
	}
	if n := e.count("SELECT count(*) FROM webhook_endpoints"); n != 1 {
		t.Errorf("%d endpoints", n)
	}
	e.do("POST", "/webhooks", map[string]any{"url": "https://hooks.example.com/other"}, "Idempotency-Key: hook-1").
		want(t, http.StatusUnprocessableEntity, "idempotency_key_reused")
	id := first.data(t)["id"].(string)
	del := e.do("DELETE", "/webhooks/"+id, nil, "Idempotency-Key: del-1").want(t, http.StatusOK, "")
	delAgain := e.do("DELETE", "/webhooks/"+id, nil, "Idempotency-Key: del-1").want(t, http.StatusOK, "")
	if !bytes.Equal(del.raw, delAgain.raw) {
		t.Errorf("delete replay %s, first %s", delAgain.raw, del.raw)
	}
	e.do("DELETE", "/webhooks/"+id, nil, "Idempotency-Key: del-2").want(t, http.StatusNotFound, "not_found")
}
