package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/uptrace/bun/migrate"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/internal/smtptest"
	"github.com/subscriberd/subscriberd/internal/testdb"
	"github.com/subscriberd/subscriberd/mail"
	"github.com/subscriberd/subscriberd/migrations"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
	"github.com/subscriberd/subscriberd/webhook"
)

// Tests of docs/api-contract.md §14 (export and erasure), on the store TEST_STORE names.

// The person of these tests: two addresses (the first replaced by a PUT), a name, and the
// client address and browser that confirmed. Every one is ASCII and appears nowhere else, so
// that a scan of the database for it finds only what is stored about the person.
const (
	personFirstEmail = "quill.first@example.org"
	personEmail      = "Zora.Quill@Example.ORG"
	personFirst      = "Zebediah"
	personLast       = "Quackenbush"
	personIP         = "198.51.100.77"
	personUA         = "QuillBrowser/7.3 (erasure-test)"
	// Attributes may hold personal data (docs/api-contract.md §19.2): the first is replaced by
	// the second, so that a stored event's previous holds it.
	personCompanyOld = "Quillworks Ltd"
	personCompany    = "Quackenbush Holdings"
	personTag        = "quill-tag"
)

// personalData is every piece of the person's data a scan looks for.
var personalData = []string{personFirstEmail, personEmail, personFirst, personLast, personIP, personUA,
	personCompanyOld, personCompany, personTag}

// newPrivacyEnv is a mailEnv whose API server also exports and erases, takes Idempotency-Key
// and believes the loopback proxy's X-Forwarded-For, so that the confirming client's address
// is one the test chose.
func newPrivacyEnv(t *testing.T) *mailEnv {
	t.Helper()
	loopback := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	e := newEnv(t)
	srv := api.New(api.Config{Store: repo.NewSubscribers(e.db), Auth: e.accounts, Events: repo.NewEvents(e.db),
		Privacy: repo.NewPrivacy(e.db), Webhooks: repo.NewWebhooks(e.db), WebhookGuard: webhook.Guard{AllowPrivate: true},
		Idempotency: api.IdempotencyOf(e.idem), TrustedProxies: loopback})
	srv.HandleConfirmations(repo.NewConfirmations(e.db))
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	e.base = hs.URL + api.BasePath
	composer, err := mail.NewComposer(testFrom, hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	return &mailEnv{env: e, smtp: smtptest.Start(t), outbox: repo.NewOutbox(e.db), composer: composer, public: hs.URL}
}

// person makes the person's subscriber through every path that stores something about it:
// created pending with Idempotency-Key, its address changed (a new confirmation email, the
// first cancelled), confirmed through the link, then pending again with a confirmation email
// that the SMTP server refuses quoting the address, and unsubscribed. It returns the id and
// every subscriber object the API answered about it, in order.
func (m *mailEnv) person(t *testing.T) (string, []map[string]any) {
	t.Helper()
	var seen []map[string]any
	d := m.do("POST", "/subscribers", map[string]any{"email": personFirstEmail, "name": personFirst + " " + personLast,
		"status": "pending", "attributes": map[string]any{"company": personCompanyOld}, "tags": []any{personTag}},
		idem("create-person")).want(t, http.StatusCreated, "").data(t)
	id := d["id"].(string)
	seen = append(seen, d)
	seen = append(seen, m.do("PUT", "/subscribers/"+id, map[string]any{"email": personEmail,
		"attributes": map[string]any{"company": personCompany}, "tags": []any{}}, idem("move-person")).
		want(t, http.StatusOK, "").data(t))
	m.drain()
	msgs := m.smtp.Messages()
	if len(msgs) != 1 {
		t.Fatalf("%d emails sent, want 1 (the first was cancelled by the new address)", len(msgs))
	}
	// A browser without scripts, its box ticked (docs/api-contract.md §12.1).
	req, _ := http.NewRequest(http.MethodPost, msgs[0].Link, strings.NewReader("intent=&consent=yes"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("User-Agent", personUA)
	req.Header.Set("X-Forwarded-For", personIP)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("confirm: %d", res.StatusCode)
	}
	m.smtp.OnData(func(to string) error {
		return &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCode{5, 7, 1}, Message: "message to <" + to + "> refused"}
	})
	seen = append(seen, m.do("PUT", "/subscribers/"+id, map[string]any{"status": "pending"}).want(t, http.StatusOK, "").data(t))
	m.drain()
	m.smtp.OnData(nil)
	seen = append(seen, m.do("DELETE", "/subscribers/"+id, nil).want(t, http.StatusOK, "").data(t))
	seen = append(seen, m.do("GET", "/subscribers/"+id, nil).want(t, http.StatusOK, "").data(t))
	list := m.do("GET", "/subscribers?email="+url.QueryEscape(personEmail), nil).want(t, http.StatusOK, "")
	for _, s := range list.body["data"].([]any) {
		seen = append(seen, s.(map[string]any))
	}
	return id, seen
}

// scan returns, for each of needles, the "table.column" of every text or binary column of
// every table of the env's database that holds it somewhere, compared case-insensitively.
// Needles are ASCII.
func (e *env) scan(needles ...string) map[string][]string {
	e.t.Helper()
	ctx := context.Background()
	type column struct {
		Table string `bun:"table_name"`
		Name  string `bun:"column_name"`
		Type  string `bun:"data_type"`
	}
	var cols []column
	var err error
	if testdb.Store() == testdb.SQLite {
		// SQLite stores any value in any column: every column of every table is scanned.
		err = e.db.NewRaw(`SELECT t.name AS table_name, c.name AS column_name, c.type AS data_type
FROM sqlite_master AS t, pragma_table_info(t.name) AS c
WHERE t.type = 'table' AND t.name NOT LIKE 'sqlite_%'`).Scan(ctx, &cols)
	} else {
		err = e.db.NewRaw(`SELECT table_name, column_name, data_type FROM information_schema.columns
WHERE table_schema = current_schema() AND data_type IN ('text', 'character varying', 'bytea', 'json', 'jsonb', 'ARRAY')`).Scan(ctx, &cols)
	}
	if err != nil || len(cols) < 10 {
		e.t.Fatalf("listing the columns: %d columns, %v", len(cols), err)
	}
	found := map[string][]string{}
	for _, c := range cols {
		expr := `lower(CAST("` + c.Name + `" AS TEXT))`
		cond := "instr(" + expr + ", ?) > 0"
		if testdb.Store() != testdb.SQLite {
			if c.Type == "bytea" { // its bytes, with anything outside ASCII escaped
				expr = `lower(encode("` + c.Name + `", 'escape'))`
			}
			cond = "strpos(" + expr + ", ?) > 0"
		}
		for _, n := range needles {
			if e.count(`SELECT count(*) FROM "`+c.Table+`" WHERE `+cond, strings.ToLower(n)) > 0 {
				found[n] = append(found[n], c.Table+"."+c.Name)
			}
		}
	}
	return found
}

// TestEraseLeavesNothingBehind: after an erasure no text or binary column of any table holds
// the person's addresses, name, IP or user agent (before it, the same scan finds each of
// them); only the erased suppression's hash of the address stays.
func TestEraseLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	m := newPrivacyEnv(t)
	id, _ := m.person(t)
	before := m.scan(personalData...)
	for _, n := range personalData {
		if len(before[n]) == 0 {
			t.Fatalf("before the erasure the scan finds no %q: it proves nothing (found %v)", n, before)
		}
	}
	if !strings.Contains(fmt.Sprint(before[personEmail]), "email_outbox.last_error") {
		t.Fatalf("the refused email's reply does not quote the address: %v", before[personEmail])
	}
	r := m.do("POST", "/subscribers/"+id+"/erase", nil).want(t, http.StatusOK, "")
	if d := r.data(t); d["id"] != id || len(d) != 2 || d["erased_at"] == nil {
		t.Errorf("erase data = %v; want id and erased_at", d)
	}
	left := m.scan(personalData...) // the tag too: nobody else held it, its counters went with it
	if len(left) > 0 {
		t.Errorf("personal data left after the erasure: %v", left)
	}
	if n := m.count("SELECT count(*) FROM suppressions WHERE newsletter_id = ? AND reason = 'erased' AND email IS NULL AND email_hash = ?",
		m.nl, model.EmailHash(personEmail)); n != 1 {
		t.Errorf("erased suppressions of the address = %d, want 1", n)
	}
	// The events stay, scrubbed: ids, types, timestamps and statuses.
	var types []string
	if err := m.db.NewRaw("SELECT type FROM subscriber_events WHERE subscriber_id = ? ORDER BY id", id).
		Scan(context.Background(), &types); err != nil {
		t.Fatal(err)
	}
	want := []string{"subscriber.created", "subscriber.updated", "subscriber.confirmation_sent", "subscriber.confirmed",
		"subscriber.updated", "subscriber.unsubscribed", "subscriber.erased"}
	if diff := cmp.Diff(want, types); diff != "" {
		t.Errorf("stored events (-want +got):\n%s", diff)
	}
	for _, table := range []string{"email_outbox", "confirmation_tokens", "subscribers"} {
		if n := m.count("SELECT count(*) FROM "+table+" WHERE "+map[bool]string{true: "id", false: "subscriber_id"}[table == "subscribers"]+" = ?", id); n != 0 {
			t.Errorf("%d rows of the subscriber left in %s", n, table)
		}
	}
}

// TestEraseForgetsTheID: afterwards the id answers 404 to every operation, lists, lookups and
// totals no longer count it, a cursor taken before stays valid, and other subscribers are
// untouched.
func TestEraseForgetsTheID(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	other := e.do("POST", "/subscribers", map[string]any{"email": "other@example.net", "status": "pending"}).
		want(t, http.StatusCreated, "").data(t)
	id := e.do("POST", "/subscribers", map[string]any{"email": personEmail, "name": personFirst}).
		want(t, http.StatusCreated, "").data(t)["id"].(string)
	page := e.do("GET", "/subscribers?limit=1", nil).want(t, http.StatusOK, "")
	if got := page.list(t)[0]["id"]; got != id {
		t.Fatalf("first of the list = %v, want the newest, %s", got, id)
	}
	next := page.pagination(t)["next_cursor"].(string)

	first := e.do("POST", "/subscribers/"+id+"/erase", nil, idem("erase-1")).want(t, http.StatusOK, "")
	wantReplay(t, first, e.do("POST", "/subscribers/"+id+"/erase", nil, idem("erase-1")))

	for _, c := range []struct{ method, path string }{
		{"GET", "/subscribers/" + id}, {"PUT", "/subscribers/" + id}, {"DELETE", "/subscribers/" + id},
		{"GET", "/subscribers/" + id + "/events"}, {"GET", "/subscribers/" + id + "/export"},
		{"POST", "/subscribers/" + id + "/erase"},
	} {
		var body any
		if c.method == "PUT" {
			body = map[string]any{"name": "Back Again"}
		}
		r := e.do(c.method, c.path, body).want(t, http.StatusNotFound, "not_found")
		if r.body["message"] != "Subscriber not found." {
			t.Errorf("%s %s: message %v", c.method, c.path, r.body["message"])
		}
	}
	for query, total := range map[string]float64{"": 1, "?status=active": 0, "?status=pending": 1,
		"?email=" + url.QueryEscape(personEmail): 0} {
		r := e.do("GET", "/subscribers"+query, nil).want(t, http.StatusOK, "")
		if got := r.pagination(t)["total"]; got != total {
			t.Errorf("GET /subscribers%s: total %v, want %v", query, got, total)
		}
		for _, s := range r.list(t) {
			if s["id"] == id {
				t.Errorf("GET /subscribers%s lists the erased subscriber", query)
			}
		}
	}
	after := e.do("GET", "/subscribers?limit=1&cursor="+url.QueryEscape(next), nil).want(t, http.StatusOK, "")
	if got := after.list(t); len(got) != 1 || got[0]["id"] != other["id"] {
		t.Errorf("the cursor taken before the erasure gives %v, want the other subscriber", got)
	}
	if diff := cmp.Diff(other, e.do("GET", "/subscribers/"+other["id"].(string), nil).want(t, http.StatusOK, "").data(t)); diff != "" {
		t.Errorf("the other subscriber changed (-before +after):\n%s", diff)
	}
	// Another newsletter's key cannot export or erase it either (it is gone for everyone), nor
	// anything of this newsletter.
	otherID := other["id"].(string)
	_, key := e.newKey(t, true)
	for _, path := range []string{"/subscribers/" + otherID + "/export", "/subscribers/" + otherID + "/erase",
		"/subscribers/not-a-uuid/export", "/subscribers/not-a-uuid/erase"} {
		method := "GET"
		if strings.HasSuffix(path, "erase") {
			method = "POST"
		}
		e.do(method, path, nil, "Authorization: Bearer "+key).want(t, http.StatusNotFound, "not_found")
	}
	e.do("GET", "/subscribers/"+otherID, nil).want(t, http.StatusOK, "")
}

// TestEraseReplaysNoAddress: stored idempotent responses that contain the subscriber are
// deleted, so a replay of them no longer sends its address; the erasure's own response replays.
func TestEraseReplaysNoAddress(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	created := e.do("POST", "/subscribers", map[string]any{"email": personEmail, "name": personFirst}, idem("k-create")).
		want(t, http.StatusCreated, "")
	id := created.data(t)["id"].(string)
	put := e.do("PUT", "/subscribers/"+id, map[string]any{"name": personLast}, idem("k-put")).want(t, http.StatusOK, "")
	wantReplay(t, put, e.do("PUT", "/subscribers/"+id, map[string]any{"name": personLast}, idem("k-put")))
	// A response of another subscriber stays.
	kept := e.do("POST", "/subscribers", map[string]any{"email": "kept@example.net"}, idem("k-other")).
		want(t, http.StatusCreated, "")

	e.do("POST", "/subscribers/"+id+"/erase", nil).want(t, http.StatusOK, "")
	for _, c := range []struct {
		method, path, key string
		body              any
		status            int
		code              string
	}{
		// Run again: the address is suppressed, and the subscriber gone.
		{"POST", "/subscribers", "k-create", map[string]any{"email": personEmail, "name": personFirst},
			http.StatusUnprocessableEntity, "email_suppressed"},
		{"PUT", "/subscribers/" + id, "k-put", map[string]any{"name": personLast}, http.StatusNotFound, "not_found"},
	} {
		r := e.do(c.method, c.path, c.body, idem(c.key)).want(t, c.status, c.code)
		if r.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("%s %s with its key after the erasure is a replay: %s", c.method, c.path, r.raw)
		}
		for _, n := range []string{personEmail, strings.ToLower(personEmail), personFirst, personLast, id} {
			if bytes.Contains(bytes.ToLower(r.raw), bytes.ToLower([]byte(n))) {
				t.Errorf("%s %s with its key after the erasure sends %q: %s", c.method, c.path, n, r.raw)
			}
		}
	}
	wantReplay(t, kept, e.do("POST", "/subscribers", map[string]any{"email": "kept@example.net"}, idem("k-other")))
}

// TestExportRoundTrips: the export holds everything the API ever answered about the
// subscriber (each subscriber object it returned is the subscriber of one of its events, the
// last one is the export's subscriber), the history as it is, the stored names, and the
// emails with their states.
func TestExportRoundTrips(t *testing.T) {
	t.Parallel()
	m := newPrivacyEnv(t)
	id, seen := m.person(t)
	r := m.do("GET", "/subscribers/"+id+"/export", nil).want(t, http.StatusOK, "")
	d := r.data(t)
	sub := d["subscriber"].(map[string]any)
	want := map[string]any{}
	for k, v := range seen[len(seen)-1] {
		want[k] = v
	}
	want["first_name"], want["last_name"] = personFirst, personLast
	if diff := cmp.Diff(want, sub); diff != "" {
		t.Errorf("export subscriber (-want +got):\n%s", diff)
	}
	events := d["events"].([]any)
	history := m.history(id)
	if diff := cmp.Diff(toAny(history), events); diff != "" {
		t.Errorf("export events differ from the history (-history +export):\n%s", diff)
	}
	for i, s := range seen {
		var found bool
		for _, ev := range events {
			if cmp.Equal(s, ev.(map[string]any)["data"].(map[string]any)["subscriber"]) {
				found = true
			}
		}
		if !found {
			t.Errorf("answer %d of the API, %v, is in no event of the export", i, s)
		}
	}
	emails := d["emails"].([]any)
	var states []string
	for _, em := range emails {
		em := em.(map[string]any)
		states = append(states, em["status"].(string))
		if em["kind"] != "confirmation" || em["created_at"] == nil || (em["sent_at"] != nil) != (em["status"] == "sent") {
			t.Errorf("email %v", em)
		}
	}
	if diff := cmp.Diff([]string{"cancelled", "sent", "failed"}, states); diff != "" {
		t.Errorf("email states (-want +got):\n%s", diff)
	}
	if s, ok := d["suppression"]; !ok || s != nil {
		t.Errorf("suppression = %v (present %v); want null", s, ok)
	}
	if len(d) != 4 {
		t.Errorf("export data has %d members, want subscriber, events, suppression, emails: %s", len(d), r.raw)
	}
	// A suppressed address shows its entry.
	if _, _, err := repo.NewSuppressions(m.db).Create(context.Background(), m.nl, model.NewSuppression{Email: personEmail,
		Reason: model.ReasonComplaint, Source: model.SuppressionSource{Kind: model.SuppressionSourceAPI, APIKey: m.keyPrefix()}}); err != nil {
		t.Fatal(err)
	}
	sup, _ := m.do("GET", "/subscribers/"+id+"/export", nil).want(t, http.StatusOK, "").data(t)["suppression"].(map[string]any)
	if sup["reason"] != "complaint" || sup["email"] != personEmail {
		t.Errorf("suppression = %v; want the complaint entry of the address", sup)
	}
}

func toAny(evs []map[string]any) []any {
	out := make([]any, len(evs))
	for i, ev := range evs {
		out[i] = ev
	}
	return out
}

// TestEraseWebhook: a receiver gets subscriber.erased, and every delivery made after the
// erasure, of events queued before it included, carries nothing personal.
func TestEraseWebhook(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	e.hook(rc.srv.URL, nil, rc) // every type
	rc.setAnswer(func(w http.ResponseWriter, _ *http.Request) bool {
		w.WriteHeader(http.StatusServiceUnavailable) // down: the deliveries wait
		return true
	})
	id := e.do("POST", "/subscribers", map[string]any{"email": personEmail, "name": personFirst + " " + personLast}).
		want(t, http.StatusCreated, "").data(t)["id"].(string)
	e.do("PUT", "/subscribers/"+id, map[string]any{"email": personFirstEmail}).want(t, http.StatusOK, "")
	w := e.hookWorker(testHookConfig())
	if _, err := w.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	rc.mu.Lock()
	calls := rc.calls
	rc.mu.Unlock()
	if calls == 0 {
		t.Fatal("the receiver was not called before the erasure")
	}
	e.do("POST", "/subscribers/"+id+"/erase", nil).want(t, http.StatusOK, "")
	rc.setAnswer(nil)
	e.deliverAll(w)

	got := rc.deliveries()
	var types []string
	for _, d := range got {
		for _, n := range []string{personEmail, personFirstEmail, personFirst, personLast} {
			if bytes.Contains(bytes.ToLower(d.body), bytes.ToLower([]byte(n))) {
				t.Errorf("a delivery after the erasure carries %q: %s", n, d.body)
			}
		}
		var ev map[string]any
		if err := json.Unmarshal(d.body, &ev); err != nil {
			t.Fatal(err)
		}
		types = append(types, ev["type"].(string))
		if ev["type"] == "subscriber.erased" {
			wantData := map[string]any{"subscriber": map[string]any{"id": id}, "previous": map[string]any{},
				"source": map[string]any{"kind": "api", "api_key": e.keyPrefix()}}
			if diff := cmp.Diff(wantData, ev["data"]); diff != "" {
				t.Errorf("subscriber.erased data (-want +got):\n%s", diff)
			}
		}
	}
	if diff := cmp.Diff([]string{"subscriber.created", "subscriber.erased", "subscriber.updated"}, sorted(types)); diff != "" {
		t.Errorf("delivered types (-want +got):\n%s", diff)
	}
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// TestEraseAllOrNothing: an erasure that fails at its last statement (the subscriber.erased
// event refused by a trigger the test adds) changes nothing: the subscriber, its events,
// emails and stored responses are as they were, and the address is not suppressed.
func TestEraseAllOrNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.do("POST", "/subscribers", map[string]any{"email": personEmail, "name": personFirst, "status": "pending"},
		idem("k-create")).want(t, http.StatusCreated, "").data(t)["id"].(string)
	ctx := context.Background()
	refuse := []string{
		`CREATE FUNCTION refuse_erased() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'refused'; END $$`,
		`CREATE TRIGGER refuse_erased BEFORE INSERT ON subscriber_events FOR EACH ROW
WHEN (NEW.type = 'subscriber.erased') EXECUTE FUNCTION refuse_erased()`,
	}
	if testdb.Store() == testdb.SQLite {
		refuse = []string{`CREATE TRIGGER refuse_erased BEFORE INSERT ON subscriber_events
WHEN NEW.type = 'subscriber.erased' BEGIN SELECT RAISE(ABORT, 'refused'); END`}
	}
	for _, q := range refuse {
		if _, err := e.db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	before := e.scan(personEmail, personFirst)
	history := e.history(id)
	e.do("POST", "/subscribers/"+id+"/erase", nil).want(t, http.StatusInternalServerError, "internal_error")

	if diff := cmp.Diff(before, e.scan(personEmail, personFirst)); diff != "" {
		t.Errorf("where the person's data is (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(history, e.history(id)); diff != "" {
		t.Errorf("history (-before +after):\n%s", diff)
	}
	e.do("GET", "/subscribers/"+id, nil).want(t, http.StatusOK, "")
	if n := e.count("SELECT count(*) FROM suppressions"); n != 0 {
		t.Errorf("%d suppressions after a failed erasure", n)
	}
	if n := e.count("SELECT count(*) FROM email_outbox WHERE subscriber_id = ? AND state = 'pending'", id); n != 1 {
		t.Errorf("%d pending emails after a failed erasure, want 1", n)
	}
	if n := e.count("SELECT count(*) FROM idempotency_keys"); n != 1 {
		t.Errorf("%d stored responses after a failed erasure, want 1", n)
	}
}

// TestTracePrivacy: each export and erasure is a span under the request's (privacy.export,
// privacy.erase) with its outcome, and counts in privacy_requests_total; neither the spans nor
// the metric carry the address or the name.
func TestTracePrivacy(t *testing.T) {
	o := newObserved(t)
	id := o.do("POST", "/subscribers", map[string]any{"email": personEmail, "name": personFirst}).
		want(t, http.StatusCreated, "").data(t)["id"].(string)
	for _, c := range []struct {
		method, op, outcome string
		status              int
	}{
		{"GET", "export", "done", http.StatusOK},
		{"POST", "erase", "done", http.StatusOK},
		{"GET", "export", "not_found", http.StatusNotFound},
		{"POST", "erase", "not_found", http.StatusNotFound},
	} {
		r, tr := o.traced(c.method, "/subscribers/"+id+"/"+c.op, nil)
		r.want(t, c.status, "")
		serverSpan(t, tr)
		spans := spansNamed(tr, "privacy."+c.op)
		if len(spans) != 1 {
			t.Fatalf("%s %s: %d privacy.%s spans", c.method, c.op, len(spans), c.op)
		}
		if got := attrMap(spans[0])["app.privacy.outcome"].AsString(); got != c.outcome {
			t.Errorf("privacy.%s outcome = %q, want %q", c.op, got, c.outcome)
		}
		assertNoSecrets(t, tr, o.key, personFirst, strings.ToLower(personEmail))
	}
	for _, c := range []struct {
		label, value string
		want         float64
	}{{"operation", "export", 2}, {"operation", "erase", 2}, {"outcome", "done", 2}, {"outcome", "not_found", 2}} {
		if got := counterSum(t, o.metrics, "privacy_requests_total", c.label, c.value); got != c.want {
			t.Errorf("privacy_requests_total{%s=%q} = %v, want %v", c.label, c.value, got, c.want)
		}
	}
	if strings.Contains(strings.ToLower(scrapeOpenMetrics(t, o.metrics)), strings.ToLower(personEmail)) {
		t.Error("the metrics carry the address")
	}
}

// TestEraseRaces: an erasure racing the confirmation of the same subscriber, a create of its
// address (as an import row or an upsert would make it) and a webhook delivery leaves no
// personal data behind and no subscriber with the address: the suppression wins, whatever
// commits first.
func TestEraseRaces(t *testing.T) {
	t.Parallel()
	m := newPrivacyEnv(t)
	rc := newReceiver(t)
	m.hook(rc.srv.URL, nil, rc)
	w := m.hookWorker(testHookConfig())
	const rounds = 8
	var needles []string
	for i := range rounds {
		addr := fmt.Sprintf("racer%d.quill@example.org", i)
		ua := fmt.Sprintf("RaceBrowser/%d", i)
		needles = append(needles, addr, ua)
		id := m.do("POST", "/subscribers", map[string]any{"email": addr, "status": "pending"}).
			want(t, http.StatusCreated, "").data(t)["id"].(string)
		m.drain()
		msgs := m.smtp.Messages()
		link := msgs[len(msgs)-1].Link
		var wg sync.WaitGroup
		results := make([]string, 3)
		wg.Go(func() {
			results[0] = fmt.Sprint(m.send("POST", "/subscribers/"+id+"/erase", nil))
		})
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, link, strings.NewReader("intent=&consent=yes"))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("User-Agent", ua)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			res.Body.Close()
			results[1] = fmt.Sprint(res.StatusCode)
		})
		wg.Go(func() {
			status, raw, err := m.send("POST", "/subscribers", map[string]any{"email": addr})
			if err != nil || status != http.StatusUnprocessableEntity {
				t.Errorf("round %d: create of the address during its erasure: %d %s %v; want 422", i, status, raw, err)
			}
		})
		wg.Go(func() {
			if _, err := w.RunOnce(context.Background()); err != nil {
				t.Error(err)
			}
		})
		wg.Wait()
		if !strings.HasPrefix(results[0], "200") {
			t.Errorf("round %d: erase answered %s", i, results[0])
		}
		m.do("GET", "/subscribers/"+id, nil).want(t, http.StatusNotFound, "not_found")
		if got := m.do("GET", "/subscribers?email="+url.QueryEscape(addr), nil).want(t, http.StatusOK, "").
			pagination(t)["total"]; got != 0.0 {
			t.Errorf("round %d: %v subscribers with the address after the race", i, got)
		}
	}
	m.deliverAll(w)
	if left := m.scan(needles...); len(left) > 0 {
		t.Errorf("personal data left after the races: %v", left)
	}
}

// TestMigrationGivesEveryTypeEndpointsErased: the erasure migration subscribes the endpoints
// that had every 1.1 type (as an endpoint made without events got them) to subscriber.erased,
// and leaves the others as they were.
func TestMigrationGivesEveryTypeEndpointsErased(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pg.Empty(t)
	if _, err := repo.EnsureDatabase(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	db, err := repo.Open(dsn, repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	all, err := migrations.Postgres()
	if testdb.Store() == testdb.SQLite {
		all, err = migrations.SQLite()
	}
	if err != nil {
		t.Fatal(err)
	}
	const erasure = "20261128000500"
	before := migrate.NewMigrations()
	for _, m := range all.Sorted() {
		if m.Name < erasure {
			before.Add(m)
		}
	}
	m := migrate.NewMigrator(db.DB, before)
	if err := m.Init(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	nl := uuid.Must(uuid.NewV7())
	now := time.Now().UTC()
	if _, err := db.NewRaw("INSERT INTO newsletters (id, name, api_access, created_at, updated_at) VALUES (?, 'n', true, ?, ?)",
		nl, now, now).Exec(ctx); err != nil {
		t.Fatal(err)
	}
	five := `["subscriber.created","subscriber.updated","subscriber.confirmation_sent","subscriber.confirmed","subscriber.unsubscribed"]`
	endpoints := map[string]string{ // events before → after
		five: `["subscriber.created","subscriber.updated","subscriber.confirmation_sent","subscriber.confirmed","subscriber.unsubscribed","subscriber.erased"]`,
		`["subscriber.unsubscribed","subscriber.confirmed","subscriber.confirmation_sent","subscriber.updated","subscriber.created"]`: `["subscriber.unsubscribed","subscriber.confirmed","subscriber.confirmation_sent","subscriber.updated","subscriber.created","subscriber.erased"]`,
		`["subscriber.created","subscriber.confirmed"]`: `["subscriber.created","subscriber.confirmed"]`,
		`[]`: `[]`,
	}
	ids := map[string]uuid.UUID{}
	for events := range endpoints {
		ids[events] = uuid.Must(uuid.NewV7())
		if _, err := db.NewRaw(`INSERT INTO webhook_endpoints (id, newsletter_id, url, events, secret, status, busy_until,
    last_claimed_at, created_at, updated_at) VALUES (?, ?, 'https://hooks.example.com/', ?, 'whsec_x', 'enabled', ?, ?, ?, ?)`,
			ids[events], nl, events, now, now, now, now).Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if names, err := repo.Migrate(ctx, db); err != nil || len(names) == 0 || names[0] != erasure {
		t.Fatalf("the rest of the migrations: %v, %v", names, err)
	}
	for events, want := range endpoints {
		var got string
		if err := db.NewRaw("SELECT events FROM webhook_endpoints WHERE id = ?", ids[events]).Scan(ctx, &got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("endpoint of %s: events %s after the migration, want %s", events, got, want)
		}
	}
}
