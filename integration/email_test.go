package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/http/httptest"
	netmail "net/mail"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/internal/smtptest"
	"github.com/subscriberd/subscriberd/internal/testdb"
	"github.com/subscriberd/subscriberd/mail"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/outbox"
	"github.com/subscriberd/subscriberd/repo"
	"github.com/subscriberd/subscriberd/webhook"
)

var discardLog = slog.New(slog.DiscardHandler)

// mailEnv is env plus confirmation pages on its public server, an SMTP catcher and the
// pieces of an email worker.
type mailEnv struct {
	*env
	smtp     *smtptest.Server
	outbox   *repo.Outbox
	composer *mail.Composer
	public   string // the public server's URL, base of links
}

const testFrom = "Test News <news@example.org>"

func newMailEnv(t *testing.T, opts ...func(*envOptions)) *mailEnv {
	t.Helper()
	e := newEnv(t, opts...)
	srv := api.New(api.Config{Store: repo.NewSubscribers(e.db), Auth: e.accounts, Events: repo.NewEvents(e.db),
		Webhooks: repo.NewWebhooks(e.db), WebhookGuard: webhook.Guard{AllowPrivate: true}, Suppressions: repo.NewSuppressions(e.db)})
	srv.HandleConfirmations(repo.NewConfirmations(e.db))
	hs := httptest.NewServer(recordTraffic(srv))
	t.Cleanup(hs.Close)
	e.base = hs.URL + api.BasePath // API calls go to the server with the pages
	composer, err := mail.NewComposer(testFrom, hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	return &mailEnv{env: e, smtp: smtptest.Start(t), outbox: repo.NewOutbox(e.db), composer: composer, public: hs.URL}
}

// testWorkerConfig retries at once, so tests drive retries without waiting.
func testWorkerConfig() mail.WorkerConfig {
	return mail.WorkerConfig{RetryBase: time.Nanosecond, RetryMax: time.Nanosecond, MaxAttempts: 4, BatchSize: 10,
		Logger: discardLog}
}

func (m *mailEnv) worker(cfg mail.WorkerConfig) *mail.Worker {
	m.t.Helper()
	tr, err := mail.NewSMTP(m.smtp.URL(), 5*time.Second)
	if err != nil {
		m.t.Fatal(err)
	}
	return mail.NewWorker(m.outbox, tr, m.composer, cfg)
}

// drain runs one worker batch after another until no email is due.
func (m *mailEnv) drain() {
	m.t.Helper()
	w := m.worker(testWorkerConfig())
	for range 100 {
		n, err := w.RunOnce(context.Background())
		if err != nil {
			m.t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
	m.t.Fatal("the outbox did not drain in 100 batches")
}

func (m *mailEnv) create(email, status string) string {
	m.t.Helper()
	d := m.do("POST", "/subscribers", map[string]any{"email": email, "name": "Ann <b>O'Neil</b>", "status": status}).
		want(m.t, http.StatusCreated, "").data(m.t)
	return d["id"].(string)
}

func (m *mailEnv) status(id string) string {
	m.t.Helper()
	return m.do("GET", "/subscribers/"+id, nil).want(m.t, http.StatusOK, "").data(m.t)["status"].(string)
}

// page fetches a confirmation page with method, as a browser would (no API key). A POST
// carries the form of a browser without scripts whose person ticked the box (consent=yes,
// docs/api-contract.md §12.1); pagePost sends any other form.
func (m *mailEnv) page(method, link string) (int, http.Header, string) {
	m.t.Helper()
	if method == http.MethodPost {
		return m.pagePost(link, "intent=&consent=yes")
	}
	return m.pagePost2(method, link, "")
}

// pagePost POSTs form to a confirmation page.
func (m *mailEnv) pagePost(link, form string) (int, http.Header, string) {
	m.t.Helper()
	return m.pagePost2(http.MethodPost, link, form)
}

func (m *mailEnv) pagePost2(method, link, form string) (int, http.Header, string) {
	m.t.Helper()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader(form)
	}
	req, err := http.NewRequest(method, link, body)
	if err != nil {
		m.t.Fatal(err)
	}
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		m.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, string(b)
}

// wantPage fails unless the page answers with status and contains text.
func (m *mailEnv) wantPage(method, link string, status int, text string) {
	m.t.Helper()
	code, h, body := m.page(method, link)
	if code != status || !strings.Contains(body, text) {
		m.t.Fatalf("%s %s: %d, want %d with %q:\n%s", method, link, code, status, text, body)
	}
	if h.Get("Cache-Control") != "no-store" || !strings.HasPrefix(h.Get("Content-Type"), "text/html") ||
		!strings.Contains(h.Get("Content-Security-Policy"), "default-src 'none'") {
		m.t.Errorf("%s %s: headers %v", method, link, h)
	}
}

const (
	subscribedText = "You’re subscribed"
	invalidText    = "no longer valid"
	confirmText    = `<form id="consent" method="post">`
)

func TestEmailPendingCreateSendsOneConfirmation(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	id := m.create("Ann@Example.com", "pending")
	m.drain()
	msgs := m.smtp.Messages()
	if len(msgs) != 1 {
		t.Fatalf("%d messages, want 1", len(msgs))
	}
	got := msgs[0]
	var outboxID string
	if err := m.db.NewRaw("SELECT CAST(id AS TEXT) FROM email_outbox WHERE subscriber_id = ?", id).Scan(context.Background(), &outboxID); err != nil {
		t.Fatal(err)
	}
	subject, _ := new(mime.WordDecoder).DecodeHeader(got.Header.Get("Subject"))
	to, err := got.Header.AddressList("To")
	if err != nil || len(to) != 1 {
		t.Fatalf("To %q: %v", got.Header.Get("To"), err)
	}
	for _, c := range []struct{ name, got, want string }{
		{"envelope recipient", got.To, "Ann@Example.com"},
		{"To", to[0].String(), (&netmail.Address{Name: "Ann <b>O'Neil</b>", Address: "Ann@Example.com"}).String()},
		{"From", got.Header.Get("From"), `"Test News" <news@example.org>`},
		{"Subject", subject, "Confirm your subscription to Newsletter " + t.Name()},
		{"Message-ID", got.MessageID, "<" + outboxID + "@example.org>"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}
	if !strings.HasPrefix(got.Link, m.public+"/confirm/") || !strings.Contains(got.HTML, `href="`+got.Link+`"`) {
		t.Errorf("link %q not in both parts:\ntext %s\nhtml %s", got.Link, got.Text, got.HTML)
	}
	if strings.Contains(got.HTML, "<b>O'Neil") || !strings.Contains(got.HTML, "&lt;b&gt;O&#39;Neil") {
		t.Errorf("the name is not escaped in the HTML part:\n%s", got.HTML)
	}
	// Only the token's hash is stored.
	token := got.Link[strings.LastIndex(got.Link, "/")+1:]
	if n := m.count("SELECT count(*) FROM confirmation_tokens WHERE hash = ? AND subscriber_id = ? AND expires_at > ?",
		mail.HashToken(token), id, time.Now().UTC().Add(6*24*time.Hour+23*time.Hour)); n != 1 {
		t.Errorf("stored token rows for the link's hash = %d, want 1", n)
	}
	var hashes [][]byte
	if err := m.db.NewRaw("SELECT hash FROM confirmation_tokens").Scan(context.Background(), &hashes); err != nil {
		t.Fatal(err)
	}
	for _, h := range hashes {
		if bytes.Contains(h, []byte(token)) {
			t.Errorf("the plain token is stored")
		}
	}
	if n := m.count("SELECT count(*) FROM email_outbox WHERE state = 'sent' AND attempts = 1 AND sent_at IS NOT NULL"); n != 1 {
		t.Errorf("sent outbox rows = %d, want 1", n)
	}
}

func TestEmailActiveCreateSendsNothing(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	m.create("active@example.com", "active")
	m.do("POST", "/subscribers", map[string]any{"email": "default@example.com"}).want(t, http.StatusCreated, "")
	m.drain()
	if n := len(m.smtp.Messages()); n != 0 {
		t.Errorf("%d messages, want none", n)
	}
}

func TestEmailBulkSendsOnePerPendingItem(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	var items []map[string]any
	want := map[string]bool{}
	for i := range 7 {
		status := "pending"
		if i%3 == 0 {
			status = "active"
		} else {
			want[fmt.Sprintf("b%d@example.com", i)] = true
		}
		items = append(items, map[string]any{"email": fmt.Sprintf("b%d@example.com", i), "status": status})
	}
	m.do("POST", "/subscribers/bulk", items).want(t, http.StatusCreated, "")
	m.drain()
	got := map[string]int{}
	for _, msg := range m.smtp.Messages() {
		got[msg.To]++
	}
	if len(got) != len(want) {
		t.Errorf("recipients %v, want one message each to %v", got, want)
	}
	for to, n := range got {
		if !want[to] || n != 1 {
			t.Errorf("%s got %d messages, want %v", to, n, want[to])
		}
	}
}

func TestEmailPutPendingSendsNewLinkAndKillsOld(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	id := m.create("put@example.com", "pending")
	m.drain()
	m.do("PUT", "/subscribers/"+id, map[string]any{"status": "pending"}).want(t, http.StatusOK, "")
	m.drain()
	msgs := m.smtp.Messages()
	if len(msgs) != 2 || msgs[0].Link == msgs[1].Link || msgs[0].MessageID == msgs[1].MessageID {
		t.Fatalf("%d messages (links %q), want 2 with different links and ids", len(msgs), links(msgs))
	}
	m.wantPage("GET", msgs[0].Link, http.StatusNotFound, invalidText)
	m.wantPage("POST", msgs[0].Link, http.StatusNotFound, invalidText)
	if s := m.status(id); s != "pending" {
		t.Fatalf("status %s after the old link, want pending", s)
	}
	m.wantPage("POST", msgs[1].Link, http.StatusOK, subscribedText)
	if s := m.status(id); s != "active" {
		t.Errorf("status %s after the new link, want active", s)
	}
}

// A pending subscriber whose email changes is asked again at the new address, and the link
// sent to the old address can no longer confirm it.
func TestEmailNewAddressWhilePendingIsConfirmedAgain(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	id := m.create("old@example.com", "pending")
	m.drain()
	m.do("PUT", "/subscribers/"+id, map[string]any{"email": "new@example.com"}).want(t, http.StatusOK, "")
	m.drain()
	msgs := m.smtp.Messages()
	if len(msgs) != 2 || msgs[0].To != "old@example.com" || msgs[1].To != "new@example.com" {
		t.Fatalf("messages to %v, want one to the old address then one to the new", recipients(msgs))
	}
	m.wantPage("POST", msgs[0].Link, http.StatusNotFound, invalidText)
	m.wantPage("POST", msgs[1].Link, http.StatusOK, subscribedText)
	// A change of case is the same address: nothing is sent again.
	m.do("PUT", "/subscribers/"+id, map[string]any{"email": "NEW@example.com"}).want(t, http.StatusOK, "")
	m.drain()
	if n := len(m.smtp.Messages()); n != 2 {
		t.Errorf("%d messages after a change of case, want still 2", n)
	}
}

func recipients(msgs []smtptest.Message) []string {
	var to []string
	for _, msg := range msgs {
		to = append(to, msg.To)
	}
	return to
}

func TestEmailPutPendingBeforeDeliverySendsOnlyTheNewOne(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	id := m.create("twice@example.com", "pending")
	m.do("PUT", "/subscribers/"+id, map[string]any{"status": "pending"}).want(t, http.StatusOK, "")
	m.drain()
	if msgs := m.smtp.Messages(); len(msgs) != 1 {
		t.Errorf("%d messages, want 1: the first email was superseded before it went out", len(msgs))
	}
}

func TestEmailUnsubscribeBeforeDeliverySendsNothing(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	id := m.create("gone@example.com", "pending")
	m.do("DELETE", "/subscribers/"+id, nil).want(t, http.StatusOK, "")
	m.drain()
	if n := len(m.smtp.Messages()); n != 0 {
		t.Errorf("%d messages, want none", n)
	}
	if n := m.count("SELECT count(*) FROM email_outbox WHERE state = 'cancelled'"); n != 1 {
		t.Errorf("cancelled rows = %d, want 1", n)
	}
}

func TestEmailActivatedBeforeDeliveryIsCancelled(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	id := m.create("quick@example.com", "pending")
	// The row stays pending (an operator's race, or a change that cancels nothing): the
	// worker must still see that the subscriber is no longer pending.
	if _, err := m.db.ExecContext(context.Background(), "UPDATE subscribers SET status = 'active' WHERE id = ?", id); err != nil {
		t.Fatal(err)
	}
	m.drain()
	if n := len(m.smtp.Messages()); n != 0 {
		t.Errorf("%d messages, want none", n)
	}
	if n := m.count("SELECT count(*) FROM email_outbox WHERE state = 'cancelled'"); n != 1 {
		t.Errorf("cancelled rows = %d, want 1", n)
	}
}

func TestEmailSMTPDownThenUp(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	m.smtp.Stop()
	for i := range 5 {
		m.create(fmt.Sprintf("d%d@example.com", i), "pending")
	}
	// One pass while the server is down: every email fails once and stays queued.
	w := m.worker(testWorkerConfig())
	if n, err := w.RunOnce(context.Background()); n != 5 || err != nil {
		t.Fatalf("RunOnce = %d, %v", n, err)
	}
	if n := m.count("SELECT count(*) FROM email_outbox WHERE state = 'pending' AND attempts = 1 AND last_error <> ''"); n != 5 {
		t.Fatalf("pending rows with one failed attempt = %d, want 5", n)
	}
	m.smtp.Restart()
	m.drain()
	got := map[string]int{}
	for _, msg := range m.smtp.Messages() {
		got[msg.To]++
	}
	for i := range 5 {
		if to := fmt.Sprintf("d%d@example.com", i); got[to] != 1 {
			t.Errorf("%s got %d messages, want 1", to, got[to])
		}
	}
	if n := m.count("SELECT count(*) FROM email_outbox WHERE state = 'sent' AND attempts = 2"); n != 5 {
		t.Errorf("rows sent at the second attempt = %d, want 5", n)
	}
}

func TestEmailPermanentRejectionFailsWithoutRetry(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	m.smtp.Refuse(func(to string, _ int) *smtp.SMTPError {
		if to == "nobody@example.com" {
			return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user"}
		}
		return nil
	})
	m.create("nobody@example.com", "pending")
	m.create("somebody@example.com", "pending")
	m.drain()
	if msgs := m.smtp.Messages(); len(msgs) != 1 || msgs[0].To != "somebody@example.com" {
		t.Errorf("messages to %v, want somebody@example.com only", links(msgs))
	}
	if n := m.smtp.Offered("nobody@example.com"); n != 1 {
		t.Errorf("the rejected address was tried %d times, want 1", n)
	}
	if n := m.count("SELECT count(*) FROM email_outbox WHERE state = 'failed' AND attempts = 1 AND last_error LIKE '%550%'"); n != 1 {
		t.Errorf("failed rows with the 550 = %d, want 1", n)
	}
}

func TestEmailTemporaryRejectionIsRetried(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	m.smtp.Refuse(func(_ string, before int) *smtp.SMTPError {
		if before < 2 {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try again later"}
		}
		return nil
	})
	m.create("later@example.com", "pending")
	m.drain()
	if n := len(m.smtp.Messages()); n != 1 {
		t.Errorf("%d messages, want 1 after two refusals", n)
	}
	if n := m.count("SELECT count(*) FROM email_outbox WHERE state = 'sent' AND attempts = 3 AND last_error = ''"); n != 1 {
		t.Errorf("rows sent at the third attempt = %d, want 1", n)
	}
	// Each attempt had its own token; only the last one's link works.
	if n := m.count("SELECT count(*) FROM confirmation_tokens WHERE retired_at IS NULL"); n != 1 {
		t.Errorf("live tokens = %d, want 1", n)
	}
	m.wantPage("POST", m.smtp.Messages()[0].Link, http.StatusOK, subscribedText)
}

func TestEmailTemporaryRejectionGivesUpAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	m.smtp.Refuse(func(string, int) *smtp.SMTPError {
		return &smtp.SMTPError{Code: 452, EnhancedCode: smtp.EnhancedCode{4, 2, 2}, Message: "mailbox full"}
	})
	m.create("full@example.com", "pending")
	m.drain()
	if n := m.count("SELECT count(*) FROM email_outbox WHERE state = 'failed' AND attempts = 4 AND last_error LIKE '%452%'"); n != 1 {
		t.Errorf("rows failed after 4 attempts = %d, want 1", n)
	}
}

func TestEmailPageFlow(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	id := m.create("flow@example.com", "pending")
	m.drain()
	link := m.smtp.Messages()[0].Link

	// GET changes nothing (mail scanners fetch links) and offers the confirming form.
	m.wantPage("GET", link, http.StatusOK, confirmText)
	m.wantPage("HEAD", link, http.StatusOK, "")
	if s := m.status(id); s != "pending" {
		t.Fatalf("status after GET = %s, want pending", s)
	}
	m.wantPage("POST", link, http.StatusOK, subscribedText)
	if s := m.status(id); s != "active" {
		t.Fatalf("status after POST = %s, want active", s)
	}
	// Replays with the confirming token show success again.
	m.wantPage("POST", link, http.StatusOK, subscribedText)
	m.wantPage("GET", link, http.StatusOK, subscribedText)

	// Once the subscriber changes through the API, the old link is dead and changes nothing.
	m.do("DELETE", "/subscribers/"+id, nil).want(t, http.StatusOK, "")
	m.wantPage("POST", link, http.StatusNotFound, invalidText)
	if s := m.status(id); s != "unsubscribed" {
		t.Errorf("status after the old link = %s, want unsubscribed", s)
	}
}

func TestEmailPageBadTokens(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	unknown, _ := mail.NewToken()
	for _, tok := range []string{unknown, "short", strings.Repeat("A", 43) + "=", "%00"} {
		for _, method := range []string{"GET", "POST"} {
			m.wantPage(method, m.public+"/confirm/"+tok, http.StatusNotFound, invalidText)
		}
	}
}

func TestEmailPageExpiredToken(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	id := m.create("late@example.com", "pending")
	m.drain()
	if _, err := m.db.ExecContext(context.Background(), "UPDATE confirmation_tokens SET expires_at = ?",
		time.Now().UTC().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	link := m.smtp.Messages()[0].Link
	m.wantPage("GET", link, http.StatusNotFound, invalidText)
	m.wantPage("POST", link, http.StatusNotFound, invalidText)
	if s := m.status(id); s != "pending" {
		t.Errorf("status = %s, want pending", s)
	}
}

func TestEmailOldLinkCannotChangeOtherStates(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	for _, tc := range []struct {
		name, email string
		change      func(id string)
		want        string
	}{
		{"activated through the API", "api-active@example.com", func(id string) {
			m.do("PUT", "/subscribers/"+id, map[string]any{"status": "active"}).want(t, http.StatusOK, "")
		}, "active"},
		{"unsubscribed", "unsub@example.com", func(id string) {
			m.do("DELETE", "/subscribers/"+id, nil).want(t, http.StatusOK, "")
		}, "unsubscribed"},
		{"activated, then unsubscribed, then active again", "back@example.com", func(id string) {
			m.do("DELETE", "/subscribers/"+id, nil).want(t, http.StatusOK, "")
			m.do("PUT", "/subscribers/"+id, map[string]any{"status": "active"}).want(t, http.StatusOK, "")
		}, "active"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := m.create(tc.email, "pending")
			m.drain()
			var link string
			for _, msg := range m.smtp.Messages() {
				if msg.To == tc.email {
					link = msg.Link
				}
			}
			tc.change(id)
			m.wantPage("GET", link, http.StatusNotFound, invalidText)
			m.wantPage("POST", link, http.StatusNotFound, invalidText)
			if s := m.status(id); s != tc.want {
				t.Errorf("status = %s, want %s", s, tc.want)
			}
		})
	}
}

func TestEmailConfirmedThenPendingAgain(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	id := m.create("again@example.com", "pending")
	m.drain()
	first := m.smtp.Messages()[0].Link
	m.wantPage("POST", first, http.StatusOK, subscribedText)
	m.do("PUT", "/subscribers/"+id, map[string]any{"status": "pending"}).want(t, http.StatusOK, "")
	// The link that confirmed before must not confirm (or claim success) for the new request.
	m.wantPage("POST", first, http.StatusNotFound, invalidText)
	if s := m.status(id); s != "pending" {
		t.Fatalf("status = %s, want pending", s)
	}
	m.drain()
	second := m.smtp.Messages()[1].Link
	m.wantPage("POST", second, http.StatusOK, subscribedText)
	if s := m.status(id); s != "active" {
		t.Errorf("status = %s, want active", s)
	}
}

// TestEmailWorkerWakesOnQueue runs the worker as serve does on SQLite, polling only once an
// hour: the email can only arrive through the in-process wake-up. On PostgreSQL the workers
// poll (Listen returns nil), which every other email test exercises.
func TestEmailWorkerWakesOnQueue(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	wake := m.outbox.Listen(ctx)
	if testdb.Store() == testdb.Postgres {
		cancel()
		if wake != nil {
			t.Fatal("Listen on PostgreSQL returned a channel: nothing signals it")
		}
		t.Skip("on PostgreSQL the workers poll")
	}
	cfg := testWorkerConfig()
	cfg.PollInterval = time.Hour
	cfg.Wake = wake
	done := make(chan struct{})
	tr, err := mail.NewSMTP(m.smtp.URL(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	counted := &claimCounter{Outbox: m.outbox}
	w := mail.NewWorker(counted, tr, m.composer, cfg)
	go func() { defer close(done); w.Run(ctx) }() //nolint:errcheck
	t.Cleanup(func() { cancel(); <-done })
	// Run's first look at start is over before the email is queued, so only the wake-up can
	// bring it.
	waitFor(t, "the worker's first look", func() bool { return counted.claims.Load() > 0 })
	m.create("wake@example.com", "pending")
	waitFor(t, "the email", func() bool { return len(m.smtp.Messages()) == 1 })
}

// claimCounter counts the worker's claims.
type claimCounter struct {
	mail.Outbox
	claims atomic.Int64
}

func (c *claimCounter) Claim(ctx context.Context, limit int, lease time.Duration) ([]model.OutboxEmail, error) {
	defer c.claims.Add(1)
	return c.Outbox.Claim(ctx, limit, lease)
}

// TestEmailTwoWorkersDeliverEachOnce runs two workers, each with its own pool as two instances
// would have, against 200 queued emails.
func TestEmailTwoWorkersDeliverEachOnce(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	for b := range 2 {
		items := make([]map[string]any, 100)
		for i := range items {
			items[i] = map[string]any{"email": fmt.Sprintf("w%d-%d@example.com", b, i), "status": "pending"}
		}
		m.do("POST", "/subscribers/bulk", items).want(t, http.StatusCreated, "")
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		db, err := repo.Open(m.dsn, repo.Options{MaxConns: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		tr, _ := mail.NewSMTP(m.smtp.URL(), 5*time.Second)
		cfg := testWorkerConfig()
		cfg.BatchSize, cfg.PollInterval = 5, 20*time.Millisecond
		w := mail.NewWorker(repo.NewOutbox(db), tr, m.composer, cfg)
		wg.Go(func() { w.Run(ctx) }) //nolint:errcheck
	}
	waitFor(t, "200 sent rows", func() bool {
		return m.count("SELECT count(*) FROM email_outbox WHERE state = 'sent'") == 200
	})
	cancel()
	wg.Wait()
	seen := map[string]int{}
	for _, msg := range m.smtp.Messages() {
		seen[msg.MessageID]++
	}
	if len(seen) != 200 {
		t.Errorf("%d distinct emails, want 200", len(seen))
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s delivered %d times", id, n)
		}
	}
	if n := m.count("SELECT count(*) FROM email_outbox WHERE state = 'sent' AND attempts = 1"); n != 200 {
		t.Errorf("rows sent at the first attempt = %d, want 200", n)
	}
}

// waitFor polls cond until it holds, failing after a generous bound: the tests wait for
// events, they do not measure time.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func links(msgs []smtptest.Message) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, m.To+" "+m.Link)
	}
	return out
}

// stopDuring is a transport that begins the shutdown while it sends its first email.
type stopDuring struct {
	mail.Transport
	stop func()
}

func (s stopDuring) Send(ctx context.Context, m *mail.Message) error {
	s.stop()
	return s.Transport.Send(ctx, m)
}

// TestEmailShutdownFinishesTheEmailInHand stops a worker in the middle of a batch: the email
// being sent goes out and is recorded, the rest of the batch is handed back at once (not held
// for the lease) and goes out with the next worker.
func TestEmailShutdownFinishesTheEmailInHand(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	for i := range 3 {
		m.create(fmt.Sprintf("s%d@example.com", i), "pending")
	}
	tr, err := mail.NewSMTP(m.smtp.URL(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := mail.NewWorker(m.outbox, stopDuring{tr, cancel}, m.composer, testWorkerConfig())
	if n, err := w.RunOnce(ctx); n != 3 || err != nil {
		t.Fatalf("RunOnce = %d, %v; want a batch of 3", n, err)
	}
	if n := len(m.smtp.Messages()); n != 1 {
		t.Fatalf("%d messages before the shutdown completed, want 1", n)
	}
	if n := m.count("SELECT count(*) FROM email_outbox WHERE state = 'sent'"); n != 1 {
		t.Errorf("sent rows = %d, want 1", n)
	}
	if n := m.count("SELECT count(*) FROM email_outbox WHERE state = 'pending' AND attempts = 0 AND next_attempt_at <= ?",
		time.Now().UTC()); n != 2 {
		t.Errorf("released rows due now = %d, want 2", n)
	}
	m.drain()
	if n := len(m.smtp.Messages()); n != 3 {
		t.Errorf("%d messages in all, want 3", n)
	}
}

// settle runs worker batches until one claims nothing, letting the pool get past connections
// that died with an outage.
func (m *mailEnv) settle(w *mail.Worker) {
	m.t.Helper()
	for range 20 {
		if n, err := w.RunOnce(context.Background()); err == nil && n == 0 {
			return
		}
	}
	m.t.Fatal("the outbox did not settle")
}

func TestEmailDatabaseOutage(t *testing.T) {
	t.Parallel()
	postgresOnly(t, noOutageOnSQLite)
	proxy, opt := viaProxy(t)
	m := newMailEnv(t, opt)
	id := m.create("outage@example.com", "pending")
	m.drain()
	link := m.smtp.Messages()[0].Link

	proxy.cut()
	for _, method := range []string{"GET", "POST"} {
		code, h, body := m.page(method, link)
		if code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" || !strings.Contains(body, "try again") {
			t.Errorf("%s during the outage: %d, Retry-After %q:\n%s", method, code, h.Get("Retry-After"), body)
		}
	}
	if _, err := m.worker(testWorkerConfig()).RunOnce(context.Background()); err == nil {
		t.Error("a claim during the outage reported no error")
	}

	proxy.restore()
	var code int
	for range 3 {
		if code, _, _ = m.page("POST", link); code == http.StatusOK {
			break
		}
	}
	if code != http.StatusOK {
		t.Fatalf("POST after the outage = %d, want 200: the link must survive an outage", code)
	}
	if s := m.status(id); s != "active" {
		t.Errorf("status %s, want active", s)
	}
}

// cutAfterSend loses the database right after the SMTP server accepted an email, as a crash
// between the send and its bookkeeping would.
type cutAfterSend struct {
	mail.Transport
	cut func()
}

func (c cutAfterSend) Send(ctx context.Context, m *mail.Message) error {
	err := c.Transport.Send(ctx, m)
	if err == nil {
		c.cut()
	}
	return err
}

// TestEmailLostBookkeepingResendsOnce: when the outcome of a delivered email cannot be recorded,
// the email goes out once more when its lease ends — with the same Message-ID, so receivers can
// drop it — and is never lost. Only the last copy's link works.
func TestEmailLostBookkeepingResendsOnce(t *testing.T) {
	t.Parallel()
	postgresOnly(t, noOutageOnSQLite)
	proxy, opt := viaProxy(t)
	m := newMailEnv(t, opt)
	m.create("crash@example.com", "pending")
	tr, err := mail.NewSMTP(m.smtp.URL(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// The "crashed" worker's lease is short, not zero: a lease of a millisecond renewed its
	// claim every 333 µs with as short a timeout, and each timed-out renewal cost a new
	// connection, until the server refused any more clients.
	cfg := testWorkerConfig()
	cfg.Lease = 200 * time.Millisecond
	if n, _ := mail.NewWorker(m.outbox, cutAfterSend{tr, proxy.cut}, m.composer, cfg).RunOnce(context.Background()); n != 1 {
		t.Fatalf("claimed %d, want 1", n)
	}
	proxy.restore()
	time.Sleep(cfg.Lease) // the lease the crash left behind ends
	m.settle(m.worker(testWorkerConfig()))

	msgs := m.smtp.Messages()
	if len(msgs) != 2 || msgs[0].MessageID != msgs[1].MessageID || msgs[0].Link == msgs[1].Link {
		t.Fatalf("%d messages %v, want the same email twice with the same Message-ID and new links", len(msgs), links(msgs))
	}
	if n := m.count("SELECT count(*) FROM email_outbox WHERE state = 'sent'"); n != 1 {
		t.Errorf("sent rows = %d, want 1", n)
	}
	m.wantPage("POST", msgs[0].Link, http.StatusNotFound, invalidText)
	m.wantPage("POST", msgs[1].Link, http.StatusOK, subscribedText)
}

// TestOutboxStats reads the outbox gauges' source on the store under test: how many emails
// wait in each lane, and how long the longest-waiting due one has been due (none due: 0).
func TestOutboxStats(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	ctx := context.Background()
	m.create("stats1@example.com", "pending")
	m.create("stats2@example.com", "pending")
	if _, err := m.db.ExecContext(ctx, "UPDATE email_outbox SET created_at = ?0, next_attempt_at = ?0", time.Now().UTC().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	pending, oldest, err := laneStat(m.outbox.Stats(ctx))
	if err != nil || pending != 2 || oldest < time.Hour || oldest > 2*time.Hour {
		t.Fatalf("Stats = %d, %v, %v; want 2 emails, due for about an hour", pending, oldest, err)
	}
	if got, err := m.outbox.Claim(ctx, 10, 24*time.Hour); err != nil || len(got) != 2 {
		t.Fatalf("Claim = %d emails, %v; want 2", len(got), err)
	}
	if pending, oldest, err = laneStat(m.outbox.Stats(ctx)); err != nil || pending != 2 || oldest != 0 {
		t.Fatalf("Stats while leased = %d, %v, %v; want 2 waiting, none due", pending, oldest, err)
	}
	// The worker died: its lease ran out. The email has waited since it was queued.
	if _, err := m.db.ExecContext(ctx, "UPDATE email_outbox SET created_at = ?, next_attempt_at = ?",
		time.Now().UTC().Add(-20*time.Minute), time.Now().UTC().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if pending, oldest, err = laneStat(m.outbox.Stats(ctx)); err != nil || pending != 2 || oldest < 19*time.Minute || oldest > 21*time.Minute {
		t.Fatalf("Stats after the lease ran out = %d, %v, %v; want 2, waiting for 20 minutes", pending, oldest, err)
	}
	// The SMTP server is down: every email waits for a retry, none is due now.
	if _, err := m.db.ExecContext(ctx, "UPDATE email_outbox SET attempts = 3, next_attempt_at = ?",
		time.Now().UTC().Add(10*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if pending, oldest, err = laneStat(m.outbox.Stats(ctx)); err != nil || pending != 2 || oldest < 19*time.Minute || oldest > 21*time.Minute {
		t.Fatalf("Stats while retrying = %d, %v, %v; want 2, waiting for 20 minutes", pending, oldest, err)
	}
	// An import's emails wait in the bulk lane, counted apart.
	if _, err := m.db.ExecContext(ctx, "UPDATE email_outbox SET lane = 1 WHERE id = (SELECT id FROM email_outbox ORDER BY id LIMIT 1)"); err != nil {
		t.Fatal(err)
	}
	lanes, err := m.outbox.Stats(ctx)
	if err != nil || len(lanes) != 2 || lanes[0].Lane != outbox.Interactive || lanes[0].Depth != 1 ||
		lanes[1].Lane != outbox.Bulk || lanes[1].Depth != 1 || lanes[1].OldestDue < 19*time.Minute {
		t.Fatalf("Stats with one bulk email = %+v, %v; want one email in each lane", lanes, err)
	}
}

// laneStat is the interactive lane's figures of a queue's Stats, failing when another lane
// holds anything.
func laneStat(lanes []outbox.LaneStats, err error) (int64, time.Duration, error) {
	if err != nil {
		return 0, 0, err
	}
	var depth int64
	var oldest time.Duration
	for _, l := range lanes {
		if l.Lane != outbox.Interactive {
			if l.Depth != 0 {
				return 0, 0, fmt.Errorf("lane %s holds %d", l.Lane, l.Depth)
			}
			continue
		}
		depth, oldest = l.Depth, l.OldestDue
	}
	return depth, oldest, nil
}

// The outbox counts the attempts whose end of DATA went unanswered, whatever failures come
// between, and the claim returns the count: the worker counts the second as sent.
func TestOutboxCountsUnansweredAttempts(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	ctx := context.Background()
	m.create("unanswered@example.com", "pending")
	claim := func() model.OutboxEmail {
		t.Helper()
		got, err := m.outbox.Claim(ctx, 10, time.Minute)
		if err != nil || len(got) != 1 {
			t.Fatalf("Claim = %v, %v; want the email", got, err)
		}
		return got[0]
	}
	e := claim()
	for i, unanswered := range []bool{true, false, false} {
		if e.Unanswered != min(i, 1) {
			t.Fatalf("after %d retries, unanswered = %d", i, e.Unanswered)
		}
		if err := m.outbox.Retry(ctx, e.ID, 0, "x", unanswered); err != nil {
			t.Fatal(err)
		}
		e = claim()
	}
	if e.Unanswered != 1 || e.Attempts != 3 {
		t.Errorf("after an unanswered attempt and two other failures: unanswered %d, attempts %d; want 1, 3", e.Unanswered, e.Attempts)
	}
}
