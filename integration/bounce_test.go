package integration

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/subscriberd/subscriberd/model"
)

// TestBounceRecipientRefusedSuppresses: a 5xx reply to RCPT TO fails the email without a retry,
// suppresses the address with reason hard_bounce (source: the server's reply) and unsubscribes
// the subscriber with the event of docs/api-contract.md §13; the address cannot be subscribed
// again.
func TestBounceRecipientRefusedSuppresses(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	m.smtp.Refuse(func(to string, _ int) *smtp.SMTPError {
		if to == "gone@example.com" {
			return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user"}
		}
		return nil
	})
	id := m.create("gone@example.com", "pending")
	m.drain()
	if n := m.smtp.Offered("gone@example.com"); n != 1 {
		t.Errorf("the refused address was tried %d times, want 1", n)
	}
	if got := m.status(id); got != "unsubscribed" {
		t.Fatalf("subscriber is %s after a hard bounce, want unsubscribed", got)
	}
	if n := m.count("SELECT count(*) FROM email_outbox WHERE state = 'failed' AND attempts = 1"); n != 1 {
		t.Errorf("failed emails = %d, want 1", n)
	}
	r := m.do("GET", "/suppressions?email=GONE@Example.com", nil).want(t, http.StatusOK, "")
	items := r.body["data"].([]any)
	if len(items) != 1 {
		t.Fatalf("suppressions for the address: %s", r.raw)
	}
	entry := items[0].(map[string]any)
	src := entry["source"].(map[string]any)
	if entry["reason"] != "hard_bounce" || src["kind"] != "smtp" || !strings.HasPrefix(src["reply"].(string), "550 ") {
		t.Fatalf("entry %v", entry)
	}
	ev := m.do("GET", "/subscribers/"+id+"/events", nil).want(t, http.StatusOK, "")
	if !strings.Contains(string(ev.raw), `"source":{"kind":"suppression","reason":"hard_bounce"}`) {
		t.Fatalf("events %s: want the unsubscribe with source suppression/hard_bounce", ev.raw)
	}
	m.do("POST", "/subscribers", map[string]any{"email": "gone@example.com"}).want(t, http.StatusUnprocessableEntity, "email_suppressed")
}

// TestBounceAfterDataFailsWithoutSuppressing: a 5xx after DATA (the message refused, not the
// address) fails that email and suppresses nothing; the subscriber stays pending.
func TestBounceAfterDataFailsWithoutSuppressing(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	m.smtp.OnData(func(string) error {
		return &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCode{5, 7, 1}, Message: "message content rejected"}
	})
	id := m.create("content@example.com", "pending")
	m.drain()
	if n := m.count("SELECT count(*) FROM email_outbox WHERE state = 'failed' AND attempts = 1 AND last_error LIKE '%554%'"); n != 1 {
		t.Errorf("failed emails with the 554 = %d, want 1", n)
	}
	if n := m.count("SELECT count(*) FROM suppressions"); n != 0 {
		t.Errorf("%d suppressions after a refused message, want 0", n)
	}
	if got := m.status(id); got != "pending" {
		t.Errorf("subscriber is %s, want pending", got)
	}
}

// TestBounceTemporaryIsRetriedNotSuppressed: a 4xx to RCPT TO is retried as before and
// suppresses nothing.
func TestBounceTemporaryIsRetriedNotSuppressed(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	m.smtp.Refuse(func(_ string, before int) *smtp.SMTPError {
		if before == 0 {
			return &smtp.SMTPError{Code: 450, EnhancedCode: smtp.EnhancedCode{4, 2, 1}, Message: "mailbox busy"}
		}
		return nil
	})
	m.create("busy@example.com", "pending")
	m.drain()
	if n := len(m.smtp.Messages()); n != 1 {
		t.Errorf("%d messages, want 1 after one temporary refusal", n)
	}
	if n := m.count("SELECT count(*) FROM suppressions"); n != 0 {
		t.Errorf("%d suppressions after a temporary refusal, want 0", n)
	}
}

// TestSuppressedWhileQueuedSendsNothing: an email queued before its address is suppressed is
// never sent (the suppression cancels it), and the worker's last check drops an email whose
// address was suppressed behind the subscriber's back (here, an entry written straight into
// the table, as a race would leave it).
func TestSuppressedWhileQueuedSendsNothing(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	m.create("queued@example.com", "pending")
	m.do("POST", "/suppressions", map[string]any{"email": "queued@example.com"}).want(t, http.StatusCreated, "")

	m.create("raced@example.com", "pending")
	// The suppression the API would refuse to make while a pending subscriber holds the
	// address without unsubscribing it: only the last check stands between it and a send.
	sup := m.do("POST", "/suppressions", map[string]any{"email": "other@example.com"}).want(t, http.StatusCreated, "").data(t)
	if _, err := m.db.NewRaw(`UPDATE suppressions SET email = 'raced@example.com', email_key = 'raced@example.com', email_hash = ? WHERE id = ?`,
		hashOf("raced@example.com"), sup["id"]).Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	m.drain()
	if msgs := m.smtp.Messages(); len(msgs) != 0 {
		t.Fatalf("%d messages sent to suppressed addresses", len(msgs))
	}
	if n := m.count("SELECT count(*) FROM email_outbox WHERE state = 'cancelled'"); n != 2 {
		t.Errorf("cancelled emails = %d, want 2", n)
	}
	var errs []string
	if err := m.db.NewRaw("SELECT state || ': ' || last_error FROM email_outbox").Scan(context.Background(), &errs); err != nil {
		t.Fatal(err)
	}
	t.Logf("outbox: %q", errs)
	if n := m.count("SELECT count(*) FROM email_outbox WHERE state = 'cancelled' AND last_error = 'address suppressed'"); n != 1 {
		t.Errorf("emails dropped at the last check = %d, want 1", n)
	}
}

func hashOf(email string) []byte { return model.EmailHash(email) }

// TestSuppressedWhileSendingWaitsForTheSend: a suppression made while the SMTP server holds the
// end of DATA of the subscriber's confirmation waits for that send to be recorded (the worker
// holds the subscriber's lock), then unsubscribes: the email went out before the suppression
// committed, and nothing goes out after it.
func TestSuppressedWhileSendingWaitsForTheSend(t *testing.T) {
	m := newMailEnv(t)
	inData, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	m.smtp.OnData(func(string) error {
		once.Do(func() { close(inData) })
		<-release
		return nil
	})
	id := m.create("mid@example.com", "pending")
	drained := make(chan struct{})
	go func() { defer close(drained); m.drain() }()
	<-inData
	answered := make(chan int, 1)
	go func() {
		answered <- m.do("POST", "/suppressions", map[string]any{"email": "mid@example.com"}).status
	}()
	select {
	case code := <-answered:
		t.Fatalf("the suppression answered %d while the email was being sent", code)
	case <-time.After(500 * time.Millisecond):
	}
	close(release)
	<-drained
	if code := <-answered; code != http.StatusCreated {
		t.Fatalf("suppression: %d", code)
	}
	if n := len(m.smtp.Messages()); n != 1 {
		t.Fatalf("%d messages, want the one sent before the suppression", n)
	}
	if n := m.count("SELECT count(*) FROM email_outbox WHERE state = 'sent'"); n != 1 {
		t.Errorf("sent rows = %d, want 1", n)
	}
	if got := m.status(id); got != "unsubscribed" {
		t.Errorf("subscriber %s after the suppression", got)
	}
	m.drain()
	if n := len(m.smtp.Messages()); n != 1 {
		t.Errorf("%d messages after the suppression, want still 1", n)
	}
}
