package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/internal/testdb"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
)

// Tests of docs/api-contract.md §8 (Idempotency-Key), on the store TEST_STORE names.

const (
	msgKeyInvalid = "The Idempotency-Key header must be 1 to 255 visible ASCII characters."
	msgKeyInUse   = "A request with this Idempotency-Key is still being processed."
	msgKeyReused  = "This Idempotency-Key was already used with a different request."
)

// secondInstance is another service object graph (its own pool, stores and API) on e's
// database, as a second process would be.
func (e *env) secondInstance(t *testing.T) string {
	t.Helper()
	db, err := repo.Open(e.dsn, repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	key, err := repo.Secret(context.Background(), db, "cursor")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(recordTraffic(api.New(api.Config{Store: repo.NewSubscribers(db), Auth: repo.NewAccounts(db),
		Idempotency: api.IdempotencyOf(repo.NewIdempotency(db, 24*time.Hour)), CursorKey: key})))
	t.Cleanup(srv.Close)
	return srv.URL + api.BasePath
}

func idem(key string) string { return "Idempotency-Key: " + key }

// wantReplay checks that r is first replayed byte for byte, with Idempotent-Replayed and the
// same Location.
func wantReplay(t *testing.T, first, r response) {
	t.Helper()
	if r.status != first.status || !bytes.Equal(r.raw, first.raw) {
		t.Fatalf("replay = %d %s; want %d %s", r.status, r.raw, first.status, first.raw)
	}
	if got := r.header.Get("Idempotent-Replayed"); got != "true" {
		t.Fatalf("replay Idempotent-Replayed = %q; want true", got)
	}
	if got, want := r.header.Get("Location"), first.header.Get("Location"); got != want {
		t.Fatalf("replay Location = %q; want %q", got, want)
	}
	if ct := r.header.Get("Content-Type"); ct != first.header.Get("Content-Type") {
		t.Fatalf("replay Content-Type = %q; want %q", ct, first.header.Get("Content-Type"))
	}
}

func TestIdempotencyReplaysEveryWrite(t *testing.T) {
	e := newEnv(t)
	target := e.do("POST", "/subscribers", map[string]any{"email": "target@example.com", "status": "pending"}).
		want(t, http.StatusCreated, "").data(t)["id"].(string)
	bulk := make([]map[string]any, 3)
	for i := range bulk {
		bulk[i] = map[string]any{"email": fmt.Sprintf("b%d@example.com", i), "status": "pending"}
	}
	tests := []struct {
		name, method, path string
		body               any
		status             int
		location           bool
	}{
		{"create", "POST", "/subscribers", map[string]any{"email": "new@example.com", "status": "pending"}, http.StatusCreated, true},
		{"bulk", "POST", "/subscribers/bulk", bulk, http.StatusCreated, false},
		{"update", "PUT", "/subscribers/" + target, map[string]any{"status": "pending"}, http.StatusOK, false},
		{"unsubscribe", "DELETE", "/subscribers/" + target, nil, http.StatusOK, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "key-" + tt.name
			first := e.do(tt.method, tt.path, tt.body, idem(key)).want(t, tt.status, "")
			if first.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("first response has Idempotent-Replayed")
			}
			if (first.header.Get("Location") != "") != tt.location {
				t.Fatalf("first Location = %q", first.header.Get("Location"))
			}
			subs, outbox := e.count("SELECT count(*) FROM subscribers"), e.count("SELECT count(*) FROM email_outbox")
			updated := e.count("SELECT count(*) FROM subscribers WHERE updated_at = (SELECT max(updated_at) FROM subscribers)")
			for range 2 {
				wantReplay(t, first, e.do(tt.method, tt.path, tt.body, idem(key)))
			}
			// Nothing ran again: no subscriber, no email, no update.
			if n := e.count("SELECT count(*) FROM subscribers"); n != subs {
				t.Errorf("subscribers %d after replays; want %d", n, subs)
			}
			if n := e.count("SELECT count(*) FROM email_outbox"); n != outbox {
				t.Errorf("outbox %d after replays; want %d", n, outbox)
			}
			if n := e.count("SELECT count(*) FROM subscribers WHERE updated_at = (SELECT max(updated_at) FROM subscribers)"); n != updated {
				t.Errorf("replay touched subscribers")
			}
		})
	}
	// The replay of the update is what it answered then, though the subscriber changed since.
	if n := e.count("SELECT count(*) FROM idempotency_keys WHERE newsletter_id = ?", e.nl); n != 4 {
		t.Errorf("stored %d responses; want 4", n)
	}
}

func TestIdempotencyOptionalAndIgnoredOnReads(t *testing.T) {
	e := newEnv(t)
	e.do("POST", "/subscribers", map[string]any{"email": "a@example.com"}).want(t, http.StatusCreated, "")
	e.do("POST", "/subscribers", map[string]any{"email": "a@example.com"}).want(t, http.StatusUnprocessableEntity, "email_already_subscribed")
	// A read ignores the header, even an invalid one.
	r := e.do("GET", "/subscribers", nil, idem("bad key"))
	r.want(t, http.StatusOK, "")
	if r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("a read was replayed")
	}
	if n := e.count("SELECT count(*) FROM idempotency_keys"); n != 0 {
		t.Fatalf("%d records without a header", n)
	}
}

func TestIdempotencyKeyValidation(t *testing.T) {
	e := newEnv(t)
	target := e.do("POST", "/subscribers", map[string]any{"email": "t@example.com"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
	bad := []string{"", "has space", "tab\tkey", "é", strings.Repeat("k", 256)} // control characters: the fuzz test (clients refuse to send them)
	for _, method := range []string{"POST", "PUT", "DELETE"} {
		for _, key := range bad {
			path, body := "/subscribers", any(map[string]any{"email": "x@example.com"})
			switch method {
			case "PUT":
				path, body = "/subscribers/"+target, map[string]any{"name": "X"}
			case "DELETE":
				path, body = "/subscribers/"+target, nil
			}
			req, _ := http.NewRequest(method, e.base+path, nil)
			if body != nil {
				req, _ = http.NewRequest(method, e.base+path, strings.NewReader(mustJSON(t, body)))
			}
			req.Header.Set("Authorization", "Bearer "+e.key)
			req.Header["Idempotency-Key"] = []string{key}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			buf.ReadFrom(res.Body)
			res.Body.Close()
			want := `{"success":false,"code":"validation_error","message":"` + msgKeyInvalid + `"}`
			if res.StatusCode != http.StatusBadRequest || strings.TrimSpace(buf.String()) != want {
				t.Errorf("%s key %q: %d %s; want 400 %s", method, key, res.StatusCode, buf.String(), want)
			}
		}
	}
	// Two header lines are not one key.
	req, _ := http.NewRequest("POST", e.base+"/subscribers", strings.NewReader(`{"email":"y@example.com"}`))
	req.Header.Set("Authorization", "Bearer "+e.key)
	req.Header["Idempotency-Key"] = []string{"a", "b"}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest {
		t.Errorf("two keys: %d; want 400", res.StatusCode)
	}
	// Nothing changed; the longest and the widest keys are fine.
	if n := e.count("SELECT count(*) FROM subscribers WHERE first_name = 'X' OR email <> 't@example.com'"); n != 0 {
		t.Fatalf("a rejected request changed %d subscribers", n)
	}
	e.do("POST", "/subscribers", map[string]any{"email": "long@example.com"}, idem(strings.Repeat("k", 255))).want(t, http.StatusCreated, "")
	e.do("POST", "/subscribers", map[string]any{"email": "wide@example.com"}, idem("!~azAZ09{}")).want(t, http.StatusCreated, "")
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestIdempotencyKeyReused(t *testing.T) {
	e := newEnv(t)
	first := e.do("POST", "/subscribers", map[string]any{"email": "a@example.com"}, idem("k")).want(t, http.StatusCreated, "")
	id := first.data(t)["id"].(string)
	reused := []struct {
		name, method, path string
		body               any
	}{
		{"other body", "POST", "/subscribers", map[string]any{"email": "b@example.com"}},
		{"same body, other bytes", "POST", "/subscribers", `{"email": "a@example.com"}`},
		{"other path", "POST", "/subscribers/bulk", []any{map[string]any{"email": "a@example.com"}}},
		{"other method", "PUT", "/subscribers/" + id, map[string]any{"name": "N"}},
		{"delete", "DELETE", "/subscribers/" + id, nil},
		// Checked before the body: a malformed body with a used key is the key's 422.
		{"malformed body", "POST", "/subscribers", `{"email":`},
	}
	for _, tt := range reused {
		t.Run(tt.name, func(t *testing.T) {
			r := e.do(tt.method, tt.path, tt.body, idem("k")).want(t, http.StatusUnprocessableEntity, "idempotency_key_reused")
			want := `{"success":false,"code":"idempotency_key_reused","message":"` + msgKeyReused +
				`","errors":{"idempotency_key":["` + msgKeyReused + `"]}}`
			if got := strings.TrimSpace(string(r.raw)); got != want {
				t.Fatalf("body %s; want %s", got, want)
			}
		})
	}
	if n := e.count("SELECT count(*) FROM subscribers WHERE status = 'active' AND first_name = ''"); n != 1 {
		t.Fatalf("%d subscribers; want the first one only, unchanged", n)
	}
	// The key belongs to the newsletter: another newsletter's request with it runs.
	other := newEnvOn(t, e)
	other.do("POST", "/subscribers", map[string]any{"email": "b@example.com"}, idem("k")).want(t, http.StatusCreated, "")
}

// newEnvOn is a second newsletter and key on e's service.
func newEnvOn(t *testing.T, e *env) *env {
	t.Helper()
	o := *e
	o.t = t
	o.nl, o.key = e.newKey(t, true)
	return &o
}

func TestIdempotencyOrderAndFailures(t *testing.T) {
	e := newEnv(t)
	// Authentication comes first.
	r := e.do("POST", "/subscribers", map[string]any{"email": "a@example.com"}, idem("bad key"), "Authorization: Bearer sk_nope")
	r.want(t, http.StatusUnauthorized, "unauthorized")
	// The header before the body: a bad key with a malformed body is the key's 400.
	r = e.do("POST", "/subscribers", `{"email":`, idem("bad key")).want(t, http.StatusBadRequest, "validation_error")
	if r.body["message"] != msgKeyInvalid {
		t.Fatalf("message %v; want the header's", r.body["message"])
	}
	// A failed request stores nothing: the same key runs afresh, with this body or another.
	e.do("POST", "/subscribers", map[string]any{"email": "bad"}, idem("k")).want(t, http.StatusUnprocessableEntity, "validation_error")
	e.do("POST", "/subscribers", map[string]any{"email": "bad"}, idem("k")).want(t, http.StatusUnprocessableEntity, "validation_error")
	e.do("POST", "/subscribers", map[string]any{"email": "a@example.com"}).want(t, http.StatusCreated, "")
	e.do("POST", "/subscribers", map[string]any{"email": "a@example.com"}, idem("k")).want(t, http.StatusUnprocessableEntity, "email_already_subscribed")
	e.do("PUT", "/subscribers/01900000-0000-7000-8000-000000000000", map[string]any{"name": "N"}, idem("k")).want(t, http.StatusNotFound, "not_found")
	first := e.do("POST", "/subscribers", map[string]any{"email": "b@example.com"}, idem("k")).want(t, http.StatusCreated, "")
	wantReplay(t, first, e.do("POST", "/subscribers", map[string]any{"email": "b@example.com"}, idem("k")))
	if n := e.count("SELECT count(*) FROM idempotency_keys"); n != 1 {
		t.Fatalf("%d records; want the 201's only", n)
	}
}

// TestIdempotencyCrashBetweenChangeAndRecord makes the record's insert fail after the change
// was made in the same transaction (a trigger raises, as a crash at that point would end the
// transaction): neither may remain, and a retry with the key runs once.
func TestIdempotencyCrashBetweenChangeAndRecord(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var create, drop string
	if testdb.Store() == testdb.SQLite {
		create = `CREATE TRIGGER crash BEFORE INSERT ON idempotency_keys BEGIN SELECT RAISE(ABORT, 'simulated crash'); END`
		drop = `DROP TRIGGER crash`
	} else {
		create = `CREATE FUNCTION crash() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'simulated crash'; END $$;
CREATE TRIGGER crash BEFORE INSERT ON idempotency_keys FOR EACH ROW EXECUTE FUNCTION crash()`
		drop = `DROP TRIGGER crash ON idempotency_keys; DROP FUNCTION crash()`
	}
	for _, stmt := range strings.Split(create, ";\n") {
		if _, err := e.db.ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	bulk := []any{map[string]any{"email": "a@example.com", "status": "pending"}, map[string]any{"email": "b@example.com"}}
	e.do("POST", "/subscribers/bulk", bulk, idem("k")).want(t, http.StatusInternalServerError, "internal_error")
	e.do("POST", "/subscribers", map[string]any{"email": "c@example.com"}, idem("k2")).want(t, http.StatusInternalServerError, "internal_error")
	for _, table := range []string{"subscribers", "email_outbox", "idempotency_keys"} {
		if n := e.count("SELECT count(*) FROM " + table); n != 0 {
			t.Fatalf("%s has %d rows after the crash; want 0", table, n)
		}
	}
	for _, stmt := range strings.Split(drop, "; ") {
		if _, err := e.db.ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	first := e.do("POST", "/subscribers/bulk", bulk, idem("k")).want(t, http.StatusCreated, "")
	wantReplay(t, first, e.do("POST", "/subscribers/bulk", bulk, idem("k")))
	if n := e.count("SELECT count(*) FROM subscribers"); n != 2 {
		t.Fatalf("%d subscribers; want 2", n)
	}
	if n := e.count("SELECT count(*) FROM email_outbox"); n != 1 {
		t.Fatalf("%d emails; want 1", n)
	}
}

// TestIdempotencyConcurrentAcrossInstances: 20 identical bulk creates of 100 with one key,
// sent at once to two instances on one database, create the 100 subscribers once; every other
// answer is the replay or 409.
func TestIdempotencyConcurrentAcrossInstances(t *testing.T) {
	e := newEnv(t)
	bases := []string{e.base, e.secondInstance(t)}
	items := make([]any, 100)
	for i := range items {
		items[i] = map[string]any{"email": fmt.Sprintf("c%d@example.com", i), "status": "pending"}
	}
	const n = 20
	results := make([]response, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			results[i] = e.do("POST", bases[i%2]+"/subscribers/bulk", items, idem("bulk-once"))
		})
	}
	close(start)
	wg.Wait()
	var ran, replayed, inUse int
	var body []byte
	for _, r := range results {
		switch {
		case r.status == http.StatusCreated && r.header.Get("Idempotent-Replayed") == "":
			ran++
			body = r.raw
		case r.status == http.StatusCreated:
			replayed++
		case r.status == http.StatusConflict:
			inUse++
			r.want(t, http.StatusConflict, "idempotency_key_in_use")
			if r.header.Get("Retry-After") != "1" || r.body["message"] != msgKeyInUse || r.body["errors"] != nil {
				t.Fatalf("409 = %v %s", r.header, r.raw)
			}
		default:
			t.Fatalf("unexpected answer %d %s", r.status, r.raw)
		}
	}
	if ran != 1 {
		t.Fatalf("%d requests ran; want exactly 1 (replayed %d, 409 %d)", ran, replayed, inUse)
	}
	for _, r := range results {
		if r.status == http.StatusCreated && !bytes.Equal(r.raw, body) {
			t.Fatalf("a replay differs from the response")
		}
	}
	if got := e.count("SELECT count(*) FROM subscribers"); got != 100 {
		t.Fatalf("%d subscribers; want 100", got)
	}
	if got := e.count("SELECT count(*) FROM email_outbox"); got != 100 {
		t.Fatalf("%d emails; want 100", got)
	}
	t.Logf("ran 1, replayed %d, 409 %d", replayed, inUse)
}

// TestIdempotencyInUse holds a request with the key in its transaction (a trigger makes its
// insert slow): a second request with the key meanwhile gets 409, and the replay after.
func TestIdempotencyInUse(t *testing.T) {
	postgresOnly(t, "SQLite serialises writers: a second request with the key waits for the first and gets the replay")
	e := newEnv(t)
	ctx := context.Background()
	for _, stmt := range []string{
		`CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(3); RETURN NEW; END $$`,
		`CREATE TRIGGER slow BEFORE INSERT ON subscribers FOR EACH ROW WHEN (NEW.email = 'slow@example.com') EXECUTE FUNCTION slow()`,
	} {
		if _, err := e.db.ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	body := map[string]any{"email": "slow@example.com"}
	done := make(chan response)
	go func() { done <- e.do("POST", "/subscribers", body, idem("k")) }()
	waitFor(t, "the first request to hold its key in the slow insert", func() bool {
		return e.count("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'PgSleep'") == 1
	})
	r := e.do("POST", "/subscribers", body, idem("k")).want(t, http.StatusConflict, "idempotency_key_in_use")
	if want := `{"success":false,"code":"idempotency_key_in_use","message":"` + msgKeyInUse + `"}`; strings.TrimSpace(string(r.raw)) != want {
		t.Fatalf("409 body %s; want %s", r.raw, want)
	}
	if r.header.Get("Retry-After") != "1" {
		t.Fatalf("Retry-After = %q; want 1", r.header.Get("Retry-After"))
	}
	// Even with another body: the key is busy.
	e.do("POST", "/subscribers", map[string]any{"email": "other@example.com"}, idem("k")).want(t, http.StatusConflict, "idempotency_key_in_use")
	first := (<-done).want(t, http.StatusCreated, "")
	wantReplay(t, first, e.do("POST", "/subscribers", body, idem("k")))
}

// TestIdempotencyExpiry: after IDEMPOTENCY_TTL a key is free again, and the purge removes
// its record.
func TestIdempotencyExpiry(t *testing.T) {
	e := newEnv(t, func(o *envOptions) { o.idempotencyTTL = time.Second })
	e.do("POST", "/subscribers", map[string]any{"email": "a@example.com"}, idem("k")).want(t, http.StatusCreated, "")
	e.do("POST", "/subscribers", map[string]any{"email": "b@example.com"}, idem("k")).want(t, http.StatusUnprocessableEntity, "idempotency_key_reused")
	time.Sleep(1100 * time.Millisecond)
	n, err := e.idem.Purge(context.Background(), 1000)
	if err != nil || n != 1 {
		t.Fatalf("purged %d, %v; want 1", n, err)
	}
	first := e.do("POST", "/subscribers", map[string]any{"email": "b@example.com"}, idem("k")).want(t, http.StatusCreated, "")
	wantReplay(t, first, e.do("POST", "/subscribers", map[string]any{"email": "b@example.com"}, idem("k")))
	// An expired record that the purge has not reached yet is replaced too.
	time.Sleep(1100 * time.Millisecond)
	e.do("POST", "/subscribers", map[string]any{"email": "c@example.com"}, idem("k")).want(t, http.StatusCreated, "")
}

// TestIdempotencyAndLimits: a replay counts against the rate limits like any request, and is
// not a failed write.
func TestIdempotencyAndLimits(t *testing.T) {
	e := newEnv(t, withLimits(limitsConfig(t, "3/1m", "off", "off", "2/10m:10m")))
	first := e.do("POST", "/subscribers", map[string]any{"email": "a@example.com"}, idem("k")).want(t, http.StatusCreated, "")
	wantReplay(t, first, e.do("POST", "/subscribers", map[string]any{"email": "a@example.com"}, idem("k")))
	r := e.do("POST", "/subscribers", map[string]any{"email": "a@example.com"}, idem("k"))
	wantReplay(t, first, r)
	if r.header.Get("RateLimit-Remaining") != "0" {
		t.Fatalf("RateLimit-Remaining = %q after 3 requests of 3; want 0", r.header.Get("RateLimit-Remaining"))
	}
	want429(t, e.do("POST", "/subscribers", map[string]any{"email": "a@example.com"}, idem("k")), 60)
}

// TestTraceIdempotency: a replay is visible on its request's span (an "idempotency" event and
// app.idempotency.replayed) and counted, as is a reused key.
func TestTraceIdempotency(t *testing.T) {
	o := newObserved(t)
	body := map[string]any{"email": "ann@example.com"}
	_, tr := o.traced("POST", "/subscribers", body, idem("k"))
	if ev := idempotencyEvent(serverSpan(t, tr)); ev != "ran" {
		t.Fatalf("first request's idempotency outcome = %q; want ran", ev)
	}
	r, tr := o.traced("POST", "/subscribers", body, idem("k"))
	r.want(t, http.StatusCreated, "")
	srv := serverSpan(t, tr)
	if ev := idempotencyEvent(srv); ev != "replayed" {
		t.Fatalf("replay's idempotency outcome = %q; want replayed", ev)
	}
	if v, ok := attrMap(srv)["app.idempotency.replayed"]; !ok || !v.AsBool() {
		t.Fatalf("replay's server span lacks app.idempotency.replayed=true")
	}
	checkDBSpans(t, tr, "SELECT idempotency_keys")
	o.do("POST", "/subscribers", map[string]any{"email": "bob@example.com"}, idem("k")).want(t, http.StatusUnprocessableEntity, "idempotency_key_reused")
	for outcome, want := range map[string]float64{"replayed": 1, "reused": 1, "in_use": 0} {
		if got := counterSum(t, o.metrics, "idempotency_requests_total", "outcome", outcome); got != want {
			t.Errorf("idempotency_requests_total{outcome=%q} = %v; want %v", outcome, got, want)
		}
	}
}

// idempotencyEvent is the outcome of the span's "idempotency" event, or "".
func idempotencyEvent(s sdktrace.ReadOnlySpan) string {
	for _, ev := range s.Events() {
		if ev.Name != "idempotency" {
			continue
		}
		for _, kv := range ev.Attributes {
			if kv.Key == "app.idempotency.outcome" {
				return kv.Value.AsString()
			}
		}
	}
	return ""
}

// TestIdempotencyRunLosesTheRace: a request that finished between another's look-up and its
// lock (simulated by calling Run without the look-up) makes the latecomer's change roll back,
// and the latecomer gets the stored response.
func TestIdempotencyRunLosesTheRace(t *testing.T) {
	e := newEnv(t)
	first := e.do("POST", "/subscribers", map[string]any{"email": "a@example.com"}, idem("k")).want(t, http.StatusCreated, "")
	ctx := context.Background()
	for _, email := range []string{"b@example.com", "a@example.com"} { // a change that succeeds, one that fails
		res, err := e.idem.Run(ctx, e.nl, "k", []byte("fp"), func(tx repo.Tx) (*model.StoredResponse, error) {
			if _, err := tx.Subscribers().Create(ctx, e.nl, model.NewSubscriber{Email: email, Status: model.StatusActive}); err != nil {
				return nil, nil // the handler answered a 4xx
			}
			return &model.StoredResponse{Fingerprint: []byte("fp"), Status: 201, Body: []byte("late")}, nil
		})
		if err != nil || res.Stored == nil || !bytes.Equal(res.Stored.Body, first.raw) {
			t.Fatalf("%s: Run = %+v, %v; want the first response stored", email, res, err)
		}
	}
	if n := e.count("SELECT count(*) FROM subscribers"); n != 1 {
		t.Fatalf("%d subscribers; want the first request's only", n)
	}
}
