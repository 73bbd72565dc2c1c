package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/subscriberd/subscriberd/internal/testdb"
	"github.com/subscriberd/subscriberd/mail"
)

// TestOutagesReconcile streams creates (pending) and unsubscribes at the service, with a worker
// sending all along, through an SMTP outage and, on PostgreSQL, a database outage (the TCP
// proxy cut) in the middle. Afterwards the books must balance: every 201 is stored; every
// subscriber still pending got exactly one email; nobody got an email after their unsubscribe
// committed; and nothing but 201, 200 and 503 (during the database outage) was answered. An
// email cut off from its bookkeeping by the outage may arrive twice, as the same email (one
// Message-ID); docs/operating.md says so.
func TestOutagesReconcile(t *testing.T) {
	t.Parallel()
	var opts []func(*envOptions)
	var proxy *tcpProxy
	if testdb.Store() == testdb.Postgres {
		var via func(*envOptions)
		proxy, via = viaProxy(t)
		opts = append(opts, via)
	}
	m := newMailEnv(t, opts...)
	var late sync.Map // recipients accepted while their subscriber was unsubscribed
	m.smtp.OnData(func(to string) error {
		var status string
		if err := m.db.NewRaw("SELECT status FROM subscribers WHERE email = ?", to).Scan(context.Background(), &status); err != nil {
			return &smtp.SMTPError{Code: 451, Message: "lookup failed"}
		}
		if status == "unsubscribed" {
			late.Store(to, true)
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	cfg := testWorkerConfig()
	cfg.RetryBase, cfg.RetryMax, cfg.MaxAttempts, cfg.PollInterval = 100*time.Millisecond, 300*time.Millisecond, 1000, 100*time.Millisecond
	// An email whose retry could not be recorded during the database outage comes back when
	// its lease ends (a minute by default); 2 s keeps the test short.
	cfg.Lease = 2 * time.Second
	cfg.Wake = m.outbox.Listen(ctx)
	tr, err := mail.NewSMTP(m.smtp.URL(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	w := mail.NewWorker(m.outbox, tr, m.composer, cfg)
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }() //nolint:errcheck
	t.Cleanup(func() { cancel(); <-done })

	// The faults, on a schedule, while the stream runs for 5 s.
	go func() {
		time.Sleep(time.Second)
		m.smtp.Stop()
		if proxy != nil {
			time.Sleep(time.Second)
			proxy.cut()
			time.Sleep(time.Second)
			proxy.restore()
		} else {
			time.Sleep(2 * time.Second)
		}
		time.Sleep(500 * time.Millisecond)
		m.smtp.Restart()
	}()

	var c statusCounter
	created := map[string]string{} // id → email
	var unsubscribed []string
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		email := fmt.Sprintf("stream%d@example.com", i)
		status, raw, err := m.send("POST", "/subscribers", map[string]any{"email": email, "status": "pending"})
		if status != http.StatusServiceUnavailable {
			c.add(status, raw, err)
		}
		if status != http.StatusCreated {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		id := jsonField(t, raw, "id")
		created[id] = email
		if i%4 == 0 { // a quarter change their mind at once
			for {
				status, raw, err := m.send("DELETE", "/subscribers/"+id, nil)
				if status == http.StatusOK {
					unsubscribed = append(unsubscribed, id)
					break
				}
				if status != http.StatusServiceUnavailable {
					c.add(status, raw, err)
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	c.check(t, http.StatusCreated, http.StatusOK)
	streamEnd := time.Now()
	waitFor(t, "the outbox to drain", func() bool {
		return m.count("SELECT count(*) FROM email_outbox WHERE state = 'pending'") == 0
	})
	t.Logf("outbox drained %v after the stream ended", time.Since(streamEnd).Round(10*time.Millisecond))

	for id := range created {
		if n := m.count("SELECT count(*) FROM subscribers WHERE id = ?", id); n != 1 {
			t.Errorf("created %s: %d rows", id, n)
		}
	}
	gone := map[string]bool{}
	for _, id := range unsubscribed {
		gone[created[id]] = true
	}
	// An email counts once per Message-ID: when an outage cuts the connection between the
	// server's acceptance and its bookkeeping (the server's "250" lost, or the row not marked
	// sent), the email goes again when its lease ends, with the same Message-ID, so that
	// receivers drop the copy (docs/email.md). Anything else is a second email.
	got := map[string]map[string]bool{}
	copies := 0
	for _, msg := range m.smtp.Messages() {
		if got[msg.To] == nil {
			got[msg.To] = map[string]bool{}
		}
		if got[msg.To][msg.MessageID] {
			copies++
		}
		got[msg.To][msg.MessageID] = true
	}
	for _, email := range created {
		switch {
		case !gone[email] && len(got[email]) != 1:
			t.Errorf("%s (pending) got %d distinct emails, want 1", email, len(got[email]))
		case gone[email] && len(got[email]) > 1:
			t.Errorf("%s (unsubscribed) got %d distinct emails, want at most 1 (before the unsubscribe)", email, len(got[email]))
		}
	}
	t.Logf("%d copies with a Message-ID already delivered (the outage cut a send's bookkeeping)", copies)
	late.Range(func(k, _ any) bool {
		t.Errorf("%s: email accepted after the unsubscribe committed", k)
		return true
	})
	if n := m.count("SELECT count(*) FROM email_outbox WHERE state = 'failed'"); n != 0 {
		t.Errorf("%d emails failed for good", n)
	}
	t.Logf("%d created (%d unsubscribed at once), %d emails sent; statuses %v", len(created), len(unsubscribed), len(m.smtp.Messages()), c.counts)
}

// jsonField is data.<name> of a response body.
func jsonField(t *testing.T, raw []byte, name string) string {
	t.Helper()
	r := response{raw: raw}
	if err := json.Unmarshal(raw, &r.body); err != nil {
		t.Fatalf("body %s: %v", raw, err)
	}
	return r.data(t)[name].(string)
}
