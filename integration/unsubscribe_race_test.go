package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/subscriberd/subscriberd/internal/testdb"
	"github.com/subscriberd/subscriberd/mail"
)

// TestEmailUnsubscribeRaceSendsNothingAfter hammers the race between the worker sending a
// confirmation and the subscriber's unsubscribe: create pending, unsubscribe 0-40 ms later,
// hundreds of times, with a worker running all along. At the moment the SMTP server accepts a
// message (the end of DATA) it reads the subscriber's committed status: it must never be
// unsubscribed. Before the worker re-checked under the subscriber's lock in the step that
// commits to sending, about one round in ten sent the email after the unsubscribe committed.
func TestEmailUnsubscribeRaceSendsNothingAfter(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	rounds := 300
	if testing.Short() {
		rounds = 60
	}
	var late, accepted atomic.Int64
	var lateMu sync.Mutex
	var lateTo []string
	m.smtp.OnData(func(to string) error {
		accepted.Add(1)
		var status string
		if err := m.db.NewRaw("SELECT status FROM subscribers WHERE email = ?", to).Scan(context.Background(), &status); err != nil {
			return &smtp.SMTPError{Code: 451, Message: err.Error()}
		}
		if status == "unsubscribed" {
			late.Add(1)
			lateMu.Lock()
			lateTo = append(lateTo, to)
			lateMu.Unlock()
		}
		return nil
	})
	// A few milliseconds per RCPT widen the window between the worker's first check (the
	// token) and the end of DATA, as a remote server would.
	m.smtp.Refuse(func(string, int) *smtp.SMTPError {
		time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
		return nil
	})

	ctx, cancel := context.WithCancel(context.Background())
	cfg := testWorkerConfig()
	cfg.PollInterval = 20 * time.Millisecond
	cfg.Wake = m.outbox.Listen(ctx)
	tr, err := mail.NewSMTP(m.smtp.URL(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 2 { // two workers, as two instances
		w := mail.NewWorker(m.outbox, tr, m.composer, cfg)
		wg.Go(func() { w.Run(ctx) }) //nolint:errcheck
	}
	t.Cleanup(func() { cancel(); wg.Wait() })

	for i := range rounds {
		id := m.create(fmt.Sprintf("race%d@example.com", i), "pending")
		time.Sleep(time.Duration(rand.IntN(40)) * time.Millisecond)
		m.do("DELETE", "/subscribers/"+id, nil).want(t, http.StatusOK, "")
	}
	waitFor(t, "the outbox to settle", func() bool {
		return m.count("SELECT count(*) FROM email_outbox WHERE state = 'pending'") == 0
	})
	if n := late.Load(); n > 0 {
		t.Errorf("%d of %d emails were accepted after their subscriber's unsubscribe committed: %v", n, accepted.Load(), lateTo)
	}
	if n := m.count("SELECT count(*) FROM email_outbox WHERE state = 'sent'"); int64(n) != accepted.Load() {
		t.Errorf("outbox says %d sent, the server accepted %d", n, accepted.Load())
	}
	t.Logf("%d rounds: %d emails sent before the unsubscribe, the rest cancelled", rounds, accepted.Load())
}

// TestEmailUnsubscribeWaitsOnlyForTheServersLastReply: an unsubscribe that arrives while the
// SMTP server is answering the end of DATA waits for that reply — the worker holds the
// subscriber's row across it — and no longer; the email went out before the unsubscribe.
func TestEmailUnsubscribeWaitsOnlyForTheServersLastReply(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	id := m.create("slow@example.com", "pending")
	const reply = 700 * time.Millisecond
	inData := make(chan struct{})
	m.smtp.OnData(func(string) error {
		close(inData)
		time.Sleep(reply) // a slow server's last reply
		return nil
	})
	done := make(chan struct{})
	go func() { defer close(done); m.worker(testWorkerConfig()).RunOnce(context.Background()) }() //nolint:errcheck
	<-inData
	start := time.Now()
	m.do("DELETE", "/subscribers/"+id, nil).want(t, http.StatusOK, "")
	waited := time.Since(start)
	<-done
	if waited > reply+2*time.Second {
		t.Errorf("the unsubscribe waited %v, want about the server's reply (%v)", waited, reply)
	}
	if testdb.Store() == testdb.Postgres && waited < reply/2 {
		t.Errorf("the unsubscribe waited %v: it did not wait for the send it raced", waited)
	}
	if n := len(m.smtp.Messages()); n != 1 {
		t.Errorf("%d messages, want the one accepted before the unsubscribe", n)
	}
	if n := m.count("SELECT count(*) FROM email_outbox WHERE state = 'sent'"); n != 1 {
		t.Errorf("sent rows = %d, want 1", n)
	}
	t.Logf("the unsubscribe waited %v for a %v reply", waited.Round(time.Millisecond), reply)
}
