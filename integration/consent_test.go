package integration

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/subscriberd/subscriberd/mail"
	"github.com/subscriberd/subscriberd/repo"
)

var nonceRE = regexp.MustCompile(`data-nonce="([^"]+)"`)

// nonceOf is the nonce a page's button carries.
func nonceOf(t *testing.T, page string) string {
	t.Helper()
	m := nonceRE.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no nonce on the page:\n%s", page)
	}
	return m[1]
}

// pendingWithLink creates a pending subscriber and returns its id and its email's links.
func (m *mailEnv) pendingWithLink(email string) (id, link string) {
	m.t.Helper()
	id = m.create(email, "pending")
	m.drain()
	for _, msg := range m.smtp.Messages() {
		if msg.To == email {
			link = msg.Link
		}
	}
	if link == "" {
		m.t.Fatalf("no email to %s", email)
	}
	return id, link
}

// serverNonces are the nonces as every instance on the env's database makes them.
func (m *mailEnv) serverNonces() *mail.Nonces {
	m.t.Helper()
	key, err := repo.Secret(context.Background(), m.db, "page_nonce")
	if err != nil {
		m.t.Fatal(err)
	}
	return mail.NewNonces(key)
}

// TestConsentNeedsIntent: docs/api-contract.md §12.1. GET changes nothing; the form submitted
// as it is, a forged, stale or foreign nonce, or a consent other than "yes" change nothing
// and show the page again with the line; the page's own nonce confirms, with method button
// and the seconds on the page in the event.
func TestConsentNeedsIntent(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	id, link := m.pendingWithLink("ann@example.com")
	_, otherLink := m.pendingWithLink("bob@example.com")
	token := link[strings.LastIndex(link, "/")+1:]

	code, h, page := m.page("GET", link)
	if code != http.StatusOK || !strings.Contains(page, "ann@example.com") || !strings.Contains(page, "Confirm my subscription") ||
		!strings.Contains(page, token+"/decline") || !strings.Contains(h.Get("Content-Security-Policy"), "script-src 'self'") {
		t.Fatalf("GET: %d %v\n%s", code, h, page)
	}
	nonce := nonceOf(t, page)
	_, _, otherPage := m.page("GET", otherLink)
	_, _, declinePage := m.page("GET", link+"/decline")
	stale := m.serverNonces().Make("confirm", mail.HashToken(token), time.Now().Add(-61*time.Minute))
	for name, form := range map[string]string{
		"the form as it is":     "intent=",
		"no body":               "",
		"forged nonce":          "intent=" + url.QueryEscape(nonce[:len(nonce)-2]+"AA"),
		"another token's nonce": "intent=" + url.QueryEscape(nonceOf(t, otherPage)),
		"the decline's nonce":   "intent=" + url.QueryEscape(nonceOf(t, declinePage)),
		"a stale nonce":         "intent=" + url.QueryEscape(stale),
		"consent not yes":       "intent=&consent=on",
	} {
		code, _, body := m.pagePost(link, form)
		if code != http.StatusOK || !strings.Contains(body, "Press the button to confirm your subscription.") ||
			!strings.Contains(body, `<form id="consent" method="post">`) {
			t.Errorf("%s: %d\n%s", name, code, body)
		}
		if got := m.status(id); got != "pending" {
			t.Fatalf("%s: the subscriber is %s", name, got)
		}
	}
	if n := m.count("SELECT count(*) FROM subscriber_events WHERE type = 'subscriber.confirmed'"); n != 0 {
		t.Fatalf("%d confirmed events after refused POSTs", n)
	}

	m.wantPage("POST", link, http.StatusOK, subscribedText) // sanity of the helper: consent=yes…
	if got := m.status(id); got != "active" {
		t.Fatalf("consent=yes: the subscriber is %s", got)
	}
	// …and a fresh subscriber confirmed with the page's own nonce.
	id2, link2 := m.pendingWithLink("cy@example.com")
	_, _, page2 := m.page("GET", link2)
	code, _, body := m.pagePost(link2, "intent="+url.QueryEscape(nonceOf(t, page2)))
	if code != http.StatusOK || !strings.Contains(body, subscribedText) || m.status(id2) != "active" {
		t.Fatalf("the page's nonce: %d, subscriber %s\n%s", code, m.status(id2), body)
	}
	evs := m.history(id2)
	src := evs[len(evs)-1]["data"].(map[string]any)["source"].(map[string]any)
	if src["method"] != "button" {
		t.Errorf("source %v: want method button", src)
	}
	if s, ok := src["seconds_on_page"].(float64); !ok || s < 0 || s > 60 {
		t.Errorf("seconds_on_page = %v", src["seconds_on_page"])
	}
	// A repeat shows the success page again.
	code, _, body = m.pagePost(link2, "intent=")
	if code != http.StatusOK || !strings.Contains(body, subscribedText) {
		t.Errorf("repeat after confirming: %d\n%s", code, body)
	}
	// The page's script is the service's own.
	res, err := http.Get(m.public + "/confirm.js")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/javascript") {
		t.Errorf("GET /confirm.js: %d %v", res.StatusCode, res.Header)
	}
}

// TestDecline: docs/api-contract.md §12.2. The email links to the decline page and names it in
// List-Unsubscribe with List-Unsubscribe-Post; GET and a bare POST change nothing; the
// one-click POST (or the page's nonce) unsubscribes, cancels, kills the links and suppresses
// with reason declined; a repeat shows the page again; the address cannot be subscribed.
func TestDecline(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	id, link := m.pendingWithLink("dee@example.com")
	msg := m.smtp.Messages()[0]
	decline := link + "/decline"
	if got := msg.Header.Get("List-Unsubscribe"); got != "<"+decline+">" {
		t.Errorf("List-Unsubscribe = %q, want <%s>", got, decline)
	}
	if got := msg.Header.Get("List-Unsubscribe-Post"); got != "List-Unsubscribe=One-Click" {
		t.Errorf("List-Unsubscribe-Post = %q", got)
	}
	if !strings.Contains(msg.Text, decline) || !strings.Contains(msg.HTML, decline) {
		t.Errorf("the email's parts lack the decline link")
	}
	m.wantPage("GET", decline, http.StatusOK, "I did not sign up — never email me again")
	code, _, body := m.pagePost(decline, "intent=")
	if code != http.StatusOK || !strings.Contains(body, "Press the button") || m.status(id) != "pending" {
		t.Fatalf("bare POST: %d, %s\n%s", code, m.status(id), body)
	}
	code, _, body = m.pagePost(decline, "List-Unsubscribe=One-Click")
	if code != http.StatusOK || !strings.Contains(body, "You will not receive any more email from Newsletter TestDecline.") {
		t.Fatalf("one-click: %d\n%s", code, body)
	}
	if got := m.status(id); got != "unsubscribed" {
		t.Fatalf("after declining the subscriber is %s", got)
	}
	m.wantPage("POST", decline, http.StatusOK, "You will not receive any more email") // a repeat
	m.wantPage("GET", link, http.StatusNotFound, invalidText)
	m.wantPage("POST", link, http.StatusNotFound, invalidText)
	r := m.do("GET", "/suppressions?email=dee@example.com", nil).want(t, http.StatusOK, "")
	items := r.body["data"].([]any)
	if len(items) != 1 || items[0].(map[string]any)["reason"] != "declined" ||
		items[0].(map[string]any)["source"].(map[string]any)["kind"] != "decline_link" {
		t.Fatalf("suppression: %s", r.raw)
	}
	evs := m.history(id)
	last := evs[len(evs)-1]
	src := last["data"].(map[string]any)["source"].(map[string]any)
	if last["type"] != "subscriber.unsubscribed" || src["kind"] != "decline_link" || src["ip"] != "127.0.0.1" {
		t.Fatalf("last event %v", last)
	}
	m.do("PUT", "/subscribers/"+id, map[string]any{"status": "pending"}).want(t, http.StatusUnprocessableEntity, "email_suppressed")
	m.do("POST", "/subscribers", map[string]any{"email": "DEE@example.com"}).want(t, http.StatusUnprocessableEntity, "email_suppressed")

	// The page's own nonce declines too; a confirmed subscriber's link cannot decline.
	id2, link2 := m.pendingWithLink("eve@example.com")
	_, _, page := m.page("GET", link2+"/decline")
	code, _, body = m.pagePost(link2+"/decline", "intent="+url.QueryEscape(nonceOf(t, page)))
	if code != http.StatusOK || m.status(id2) != "unsubscribed" {
		t.Fatalf("nonce decline: %d %s\n%s", code, m.status(id2), body)
	}
	_, link3 := m.pendingWithLink("fay@example.com")
	m.wantPage("POST", link3, http.StatusOK, subscribedText)
	m.wantPage("GET", link3+"/decline", http.StatusNotFound, invalidText)
	m.wantPage("POST", link3+"/decline", http.StatusNotFound, invalidText)
}

// TestResendLimit: docs/api-contract.md §12.3. The create's email and two PUT status:
// pending are three; a fourth within 24 hours → 429 with the message, errors.retry_after and
// Retry-After up to the oldest's end of window, and nothing changes.
func TestResendLimit(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	id := m.create("res@example.com", "pending")
	for range 2 {
		m.do("PUT", "/subscribers/"+id, map[string]any{"status": "pending"}).want(t, http.StatusOK, "")
	}
	before := m.count("SELECT count(*) FROM email_outbox")
	r := m.do("PUT", "/subscribers/"+id, map[string]any{"status": "pending"}).want(t, http.StatusTooManyRequests, "rate_limit_exceeded")
	if r.body["message"] != "Too many confirmation emails to this address. Please try again later." {
		t.Errorf("message %v", r.body["message"])
	}
	ra, _ := r.body["errors"].(map[string]any)["retry_after"].(float64)
	if ra < 24*3600-120 || ra > 24*3600 || r.header.Get("Retry-After") != strconv.Itoa(int(ra)) {
		t.Errorf("retry_after %v, Retry-After %q: want about 24 h, equal", ra, r.header.Get("Retry-After"))
	}
	if n := m.count("SELECT count(*) FROM email_outbox"); n != before {
		t.Errorf("emails queued by the refused PUT: %d", n-before)
	}
	// Out of the window (the oldest moved back 24 h), a fourth goes.
	if _, err := m.db.NewRaw(`UPDATE email_outbox SET created_at = ? WHERE created_at = (SELECT min(created_at) FROM email_outbox)`,
		time.Now().Add(-25*time.Hour).UTC()).Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	m.do("PUT", "/subscribers/"+id, map[string]any{"status": "pending"}).want(t, http.StatusOK, "")
	// Activating is not a re-send.
	m.do("PUT", "/subscribers/"+id, map[string]any{"status": "active"}).want(t, http.StatusOK, "")
}
