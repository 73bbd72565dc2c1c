package main

import (
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/subscriberd/subscriberd/internal/logbuf"
	"github.com/subscriberd/subscriberd/internal/smtptest"
	"github.com/subscriberd/subscriberd/mail"
	"github.com/subscriberd/subscriberd/repo"
)

// TestServeSendsConfirmationEmails runs serve as configured by its environment against a real
// SMTP server: a pending subscriber gets the email, its link confirms, the metrics count it,
// and the logs hold neither the token nor the address.
func TestServeSendsConfirmationEmails(t *testing.T) {
	t.Parallel()
	catcher := smtptest.Start(t)
	env := map[string]string{
		"DATABASE_URL":    pg.Empty(t),
		"LISTEN_ADDR":     "127.0.0.1:0",
		"ADMIN_ADDR":      "127.0.0.1:0",
		"SMTP_URL":        catcher.URL(),
		"MAIL_FROM":       "Serve Test <serve@example.net>",
		"PUBLIC_BASE_URL": "https://news.example.net/",
	}
	cli(t, env, "migrate")
	nl := cli(t, env, "newsletter", "create", "--name", "Serve Weekly")
	key := cli(t, env, "apikey", "create", "--newsletter", nl["id"].(string))["key"].(string)

	s := startServe(t, env)
	public, admin, logs := s.api, s.admin, s.logs

	req, _ := http.NewRequest("POST", public+"/api/v1/subscribers", strings.NewReader(`{"email":"reader@example.com","status":"pending"}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("create = %d", res.StatusCode)
	}
	waitUntil(t, "the email", func() bool { return len(catcher.Messages()) == 1 })
	msg := catcher.Messages()[0]
	if msg.To != "reader@example.com" || msg.Header.Get("From") != `"Serve Test" <serve@example.net>` ||
		!strings.HasPrefix(msg.Link, "https://news.example.net/confirm/") {
		t.Errorf("email to %s from %s with link %s", msg.To, msg.Header.Get("From"), msg.Link)
	}

	// A browser without scripts, its box ticked (docs/api-contract.md §12.1).
	res, err = http.Post(public+"/confirm/"+msg.Token(), "application/x-www-form-urlencoded", strings.NewReader("intent=&consent=yes"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(body), "subscribed") {
		t.Errorf("POST link = %d:\n%s", res.StatusCode, body)
	}
	// The worker counts the send once the SMTP server has answered the message, which can be
	// after the catcher holds it: wait for the count rather than race it.
	var metrics []byte
	scrape := func() []byte {
		res, err := http.Get(admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return b
	}
	waitUntil(t, "the send to be counted", func() bool {
		metrics = scrape()
		return strings.Contains(string(metrics), `email_sends_total{outcome="sent"} 1`)
	})
	for _, want := range []string{`email_sends_total{outcome="sent"} 1`, `email_outbox_depth{lane="interactive"} 0`, `email_outbox_depth{lane="bulk"} 0`,
		// The page is labelled by its route: the token stays out of metrics.
		`http_server_request_duration_seconds_count{code="200",method="POST",route="/confirm/{token}"} 1`} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("metrics lack %q", want)
		}
	}

	s.stop(t)
	if strings.Contains(logs.String(), "disagree on the port") {
		t.Error("a public PUBLIC_BASE_URL without a port (behind a proxy) drew the port warning")
	}
	for _, secret := range []string{msg.Token(), "reader@example.com"} {
		if strings.Contains(logs.String(), secret) {
			t.Errorf("logs contain %q", secret)
		}
	}
}

// TestServeWithoutSMTPWarnsAndLogsEmails checks serve without SMTP_URL: a warning at start, the
// email in the log at info with its link but not the full address, counted as logged, not sent;
// and a warning that PUBLIC_BASE_URL (the default, localhost:8080) is not where the API listens.
func TestServeWithoutSMTPWarnsAndLogsEmails(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": pg.Empty(t), "LISTEN_ADDR": "127.0.0.1:0", "ADMIN_ADDR": "127.0.0.1:0"}
	cli(t, env, "migrate")
	nl := cli(t, env, "newsletter", "create", "--name", "Dev Weekly")
	key := cli(t, env, "apikey", "create", "--newsletter", nl["id"].(string))["key"].(string)
	s := startServe(t, env)
	logs := s.logs
	if !strings.Contains(logs.String(), `"level":"WARN","msg":"SMTP_URL is not set`) {
		t.Errorf("no warning about SMTP_URL at start:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), `"level":"WARN","msg":"PUBLIC_BASE_URL and LISTEN_ADDR disagree on the port`) {
		t.Errorf("no warning that PUBLIC_BASE_URL's port is not LISTEN_ADDR's:\n%s", logs.String())
	}
	req, _ := http.NewRequest("POST", s.api+"/api/v1/subscribers", strings.NewReader(`{"email":"dev@example.com","status":"pending"}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	waitUntil(t, "the logged email", func() bool {
		return strings.Contains(logs.String(), `"msg":"email logged"`)
	})
	metrics := get(t, s.admin+"/metrics")
	for _, want := range []string{`email_sends_total{outcome="logged"} 1`, `email_sends_total{outcome="sent"} 0`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	s.stop(t)
	out := logs.String()
	if !regexp.MustCompile(`"msg":"email logged, not sent: SMTP_URL is not set".*"link":"http://localhost:8080/confirm/[A-Za-z0-9_-]{43,}"`).MatchString(out) {
		t.Errorf("at info the log must show the email's link:\n%s", out)
	}
	if strings.Contains(out, "dev@example.com") || !strings.Contains(out, "Confirm your subscription to Dev Weekly") {
		t.Errorf("at info the log must show the email's subject without the full address:\n%s", out)
	}
}

// get returns the body of a GET that must answer 200.
func get(t *testing.T, url string) string {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d %s", url, res.StatusCode, b)
	}
	return string(b)
}

// waitUntil polls cond until it holds, failing after a generous bound.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// TestDevShowsEmailsAndTheirLinks runs dev as a newcomer would, without SMTP and on another
// port: the banner says lockouts are off and the rate limits as set, the confirmation link is printed on stdout pointing at
// the port dev listens on, opening it (GET, then the form's POST) confirms, the email counts as
// logged, and wrong keys never lock the developer out.
func TestDevShowsEmailsAndTheirLinks(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATA_DIR": filepath.Join(t.TempDir(), "data"), "LISTEN_ADDR": "127.0.0.1:0", "ADMIN_ADDR": "127.0.0.1:0",
		"RATE_LIMITS": "off"}
	stdout := &logbuf.Buffer{}
	s := startRun(t, env, stdout, "dev")
	var key string
	waitUntil(t, "the banner", func() bool {
		m := regexp.MustCompile(`(?m)^  (sk_\w+)$`).FindStringSubmatch(stdout.String())
		if m != nil && strings.Contains(stdout.String(), "Emails: ") {
			key = m[1]
		}
		return key != ""
	})
	for _, want := range []string{
		"Lockouts: AUTH_LOCKOUT=off, WRITE_LOCKOUT=off",
		"Rate limits: RATE_LIMITS=off.", // as set, never "they stay on"
		"Emails: not sent (SMTP_URL is unset); each confirmation link is printed here.",
		"API reference: " + s.api + "/api/v1/docs",
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("the banner lacks %q:\n%s", want, stdout.String())
		}
	}
	if want := `"PUBLIC_BASE_URL":"` + s.api + `"`; !strings.Contains(s.logs.String(), want) {
		t.Errorf("the logged configuration lacks %s", want)
	}
	for range 12 { // AUTH_LOCKOUT's default would lock after 10
		if status, _ := call(t, "GET", s.api+"/api/v1/subscribers", "sk_wrong", ""); status != http.StatusUnauthorized {
			t.Fatalf("a wrong key got %d, want 401 every time (lockouts off)", status)
		}
	}
	status, created := call(t, "POST", s.api+"/api/v1/subscribers", key, `{"email":"new@example.com","status":"pending"}`)
	if status != http.StatusCreated {
		t.Fatalf("create = %d %v", status, created)
	}
	var link string
	waitUntil(t, "the link on stdout", func() bool {
		m := regexp.MustCompile(`Email to new@example.com \(not sent: SMTP_URL is unset\)\. Confirm with:\n  (\S+)\n`).FindStringSubmatch(stdout.String())
		if m != nil {
			link = m[1]
		}
		return link != ""
	})
	if !strings.HasPrefix(link, s.api+"/confirm/") {
		t.Errorf("link %s does not point at the API dev listens on (%s)", link, s.api)
	}
	if page := get(t, link); !strings.Contains(page, `method="post"`) && !strings.Contains(page, `method="POST"`) {
		t.Errorf("GET %s is not the confirmation form:\n%s", link, page)
	}
	res, err := http.Post(link, "application/x-www-form-urlencoded", strings.NewReader("intent=&consent=yes"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(body), "subscribed") {
		t.Errorf("POST %s = %d:\n%s", link, res.StatusCode, body)
	}
	// A logged email was not sent: the history proves what happened, so it has no
	// confirmation_sent (docs/api-contract.md §10.1), only the create and the confirmation.
	id, _ := created["data"].(map[string]any)["id"].(string)
	_, history := call(t, "GET", s.api+"/api/v1/subscribers/"+id+"/events", key, "")
	var types []string
	events, _ := history["data"].([]any)
	for _, e := range events {
		types = append(types, e.(map[string]any)["type"].(string))
	}
	if got := strings.Join(types, ","); got != "subscriber.created,subscriber.confirmed" {
		t.Errorf("history = %s, want subscriber.created,subscriber.confirmed (a logged email is not sent)", got)
	}
	if m := get(t, s.admin+"/metrics"); !strings.Contains(m, `email_sends_total{outcome="logged"} 1`) || !strings.Contains(m, `email_sends_total{outcome="sent"} 0`) {
		t.Error(`metrics: want email_sends_total{outcome="logged"} 1 and sent 0`)
	}
	s.stop(t)
}

// The worker holds a subscriber's row lock while it waits for the SMTP server's reply to the
// end of DATA; an unsubscribe or an update waiting for that lock must get it before its
// statement times out, or it would answer 503 with the database fine.
func TestFinalReplyWaitFitsInTheStatementTimeout(t *testing.T) {
	if margin := repo.DefaultStatementTimeout - mail.DefaultFinalReplyTimeout; margin < 5*time.Second {
		t.Errorf("the final reply may take %v and a statement %v: keep 5 s or more between them",
			mail.DefaultFinalReplyTimeout, repo.DefaultStatementTimeout)
	}
}

// TestServeWithoutEmailWorkers: an instance with EMAIL_WORKERS=0 queues confirmation emails but
// sends none, says so in its log, and shows them waiting on its /metrics; an instance with the
// default worker on the same database sends them.
func TestServeWithoutEmailWorkers(t *testing.T) {
	t.Parallel()
	catcher := smtptest.Start(t)
	env := map[string]string{
		"DATABASE_URL": pg.Empty(t),
		"LISTEN_ADDR":  "127.0.0.1:0",
		"ADMIN_ADDR":   "127.0.0.1:0",
		"LOG_FORMAT":   "json",
		"SMTP_URL":     catcher.URL(),
	}
	cli(t, env, "migrate")
	nl := cli(t, env, "newsletter", "create", "--name", "Quiet")
	key := cli(t, env, "apikey", "create", "--newsletter", nl["id"].(string), "--label", "ci")["key"].(string)

	apiOnly := map[string]string{"EMAIL_WORKERS": "0"}
	for k, v := range env {
		apiOnly[k] = v
	}
	a := startServe(t, apiOnly)
	if code, body := call(t, "POST", a.api+"/api/v1/subscribers", key, `{"email":"ann@example.com","status":"pending"}`); code != http.StatusCreated {
		t.Fatalf("create subscriber = %d %v", code, body)
	}
	depth := func(n string) func() bool {
		return func() bool {
			return strings.Contains(get(t, a.admin+"/metrics"), "\nemail_outbox_depth{lane=\"interactive\"} "+n+"\n")
		}
	}
	waitUntil(t, "the queued email on /metrics", depth("1"))
	time.Sleep(2 * time.Second) // four of a worker's poll intervals
	if n := len(catcher.Messages()); n != 0 {
		t.Fatalf("the instance with EMAIL_WORKERS=0 sent %d emails", n)
	}
	if !strings.Contains(a.logs.String(), "EMAIL_WORKERS=0") {
		t.Errorf("the log does not say that this instance sends no emails:\n%s", a.logs.String())
	}

	b := startServe(t, env)
	waitUntil(t, "the instance with the default worker to send the waiting email", func() bool { return len(catcher.Messages()) > 0 })
	waitUntil(t, "the sent email off the queue on /metrics", depth("0"))
	b.stop(t)
	a.stop(t)
	if msgs := catcher.Messages(); len(msgs) != 1 || msgs[0].To != "ann@example.com" {
		t.Errorf("%d emails sent, want 1 to ann@example.com", len(msgs))
	}
}
