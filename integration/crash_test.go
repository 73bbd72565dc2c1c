package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/mail"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
	"github.com/subscriberd/subscriberd/webhook"
)

// workerProcessEnv, set, makes the test binary a worker process (runWorkerProcess): the
// email worker of the service on the database, SMTP server and lease the environment names.
// A process of its own is what kill -9 can take away mid-send, with its connections.
const workerProcessEnv = "SUBSCRIBERD_TEST_WORKER"

func runWorkerProcess() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "worker process:", err); return 2 }
	var lease time.Duration // unset: the worker's default, as the service runs it
	if v := os.Getenv("WORKER_LEASE"); v != "" {
		var err error
		if lease, err = time.ParseDuration(v); err != nil {
			return fail(err)
		}
	}
	db, err := repo.Open(os.Getenv("WORKER_DATABASE_URL"), repo.Options{})
	if err != nil {
		return fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if os.Getenv(workerProcessEnv) == "webhook" {
		// The service's webhook worker, as cmd/subscriberd configures it (defaults but the
		// guard: the receiver is on loopback).
		w := webhook.NewWorker(repo.NewDeliveries(db), webhook.Config{Guard: webhook.Guard{AllowPrivate: true}, Logger: discardLog})
		if err := w.Run(ctx); err != nil {
			return fail(err)
		}
		return 0
	}
	tr, err := mail.NewSMTP(os.Getenv("WORKER_SMTP_URL"), 5*time.Second)
	if err != nil {
		return fail(err)
	}
	composer, err := mail.NewComposer(testFrom, "http://127.0.0.1")
	if err != nil {
		return fail(err)
	}
	outbox := repo.NewOutbox(db)
	w := mail.NewWorker(outbox, tr, composer, mail.WorkerConfig{
		Lease: lease, PollInterval: 100 * time.Millisecond, RetryBase: 100 * time.Millisecond, Logger: discardLog,
	})
	if err := w.Run(ctx); err != nil {
		return fail(err)
	}
	return 0
}

// startWorkerProcess runs a worker process for m with the given lease (0: the default) until t
// ends.
func (m *mailEnv) startWorkerProcess(lease time.Duration) *exec.Cmd {
	m.t.Helper()
	env := []string{workerProcessEnv + "=email", "WORKER_DATABASE_URL=" + m.dsn, "WORKER_SMTP_URL=" + m.smtp.URL()}
	if lease > 0 {
		env = append(env, "WORKER_LEASE="+lease.String())
	}
	return startProcess(m.t, env)
}

// startProcess runs the test binary as a worker process with env until t ends.
func startProcess(t *testing.T, env []string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck
	return cmd
}

// waitHeldPastHeartbeat waits until held (a queue's HeldPastHeartbeat, the source of its
// gauge) shows work held past its heartbeat, within recoveryBound of a crash.
func waitHeldPastHeartbeat(t *testing.T, held func(context.Context) (time.Duration, error)) {
	t.Helper()
	deadline := time.Now().Add(recoveryBound)
	for {
		d, err := held(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if d > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no work held past its heartbeat %v after the crash", recoveryBound)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// recoveryBound is how soon work held by a dead process is taken over (docs/operating.md):
// the lease, renewed by a live worker's heartbeat only, and a poll.
const recoveryBound = 15 * time.Second

// TestCrashedWorkerEmailsGoOutAfterRestart kills a worker process (SIGKILL) while it is in the
// middle of sending a batch, starts a new one at once, and counts how long the crashed
// worker's emails take to go out: one lease (the claim's lease, renewed by a live worker's
// heartbeat and by nobody once it died) and a poll. Both processes run with the service's
// default lease: the crashed worker's emails are out within recoveryBound. Every email goes out
// exactly once.
func TestCrashedWorkerEmailsGoOutAfterRestart(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	const n = 5
	for i := range n {
		m.create(fmt.Sprintf("crash%d@example.com", i), "pending")
	}
	// The first message hangs at the end of DATA until the worker is dead, then is refused:
	// the crash happens mid-send, before the server accepted anything.
	killed := make(chan struct{})
	var once sync.Once
	hung := make(chan struct{})
	m.smtp.OnData(func(string) error {
		first := false
		once.Do(func() { first = true })
		if !first {
			return nil
		}
		close(hung)
		<-killed
		return &smtp.SMTPError{Code: 451, Message: "connection lost"}
	})
	w := m.startWorkerProcess(0)
	select {
	case <-hung:
	case <-time.After(30 * time.Second):
		t.Fatal("the worker never started sending")
	}
	if err := w.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = w.Wait()
	close(killed)
	killedAt := time.Now()
	// The gauge shows the dead worker's emails before anyone takes them over; then a worker
	// starts (a restart, or another instance polling).
	waitHeldPastHeartbeat(t, m.outbox.HeldPastHeartbeat)
	m.startWorkerProcess(0)
	waitFor(t, "every email", func() bool { return len(m.smtp.Messages()) >= n })
	took := time.Since(killedAt)
	t.Logf("the crashed worker's emails were all out %v after the crash (lease %v)", took.Round(10*time.Millisecond), mail.DefaultLease)
	if took > recoveryBound {
		t.Errorf("emails out %v after the crash, want within %v", took, recoveryBound)
	}
	time.Sleep(500 * time.Millisecond) // a duplicate would come now
	seen := map[string]int{}
	for _, msg := range m.smtp.Messages() {
		seen[msg.To]++
	}
	for i := range n {
		if to := fmt.Sprintf("crash%d@example.com", i); seen[to] != 1 {
			t.Errorf("%s got %d emails, want 1", to, seen[to])
		}
	}
	if got := m.count("SELECT count(*) FROM email_outbox WHERE state = 'sent'"); got != n {
		t.Errorf("sent rows = %d, want %d", got, n)
	}
	if r := m.do("GET", "/subscribers?status=pending", nil); r.status != http.StatusOK {
		t.Errorf("service after the crash: %d", r.status)
	}
}

// TestCrashedWebhookWorkerTakenOver kills a webhook worker process (SIGKILL) while a receiver
// holds its attempt, and starts another once the gauge shows the endpoint held past its
// heartbeat: the endpoint's deliveries all arrive within recoveryBound of the crash, with the
// service's default lease (the endpoint's lease is renewed by a live worker's heartbeat, not
// stretched to cover a slow receiver), and the gauge falls back to 0.
func TestCrashedWebhookWorkerTakenOver(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	killed := make(chan struct{})
	hung := make(chan struct{})
	var once sync.Once
	rc.setAnswer(func(w http.ResponseWriter, r *http.Request) bool {
		first := false
		once.Do(func() { first = true })
		if !first {
			return false
		}
		close(hung)
		select { // the worker dies holding this attempt
		case <-killed:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		return true
	})
	e.hook(rc.srv.URL, nil, rc)
	const n = 5
	for i := range n {
		e.do("POST", "/subscribers", map[string]any{"email": fmt.Sprintf("hook%d@example.com", i)}).want(t, http.StatusCreated, "")
	}
	w := startProcess(t, []string{workerProcessEnv + "=webhook", "WORKER_DATABASE_URL=" + e.dsn})
	select {
	case <-hung:
	case <-time.After(30 * time.Second):
		t.Fatal("the worker never started delivering")
	}
	if err := w.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = w.Wait()
	close(killed)
	killedAt := time.Now()
	queue := repo.NewDeliveries(e.db)
	waitHeldPastHeartbeat(t, queue.HeldPastHeartbeat)
	startProcess(t, []string{workerProcessEnv + "=webhook", "WORKER_DATABASE_URL=" + e.dsn})
	distinct := func() int {
		seen := map[string]bool{}
		for _, d := range rc.deliveries() {
			seen[d.id] = true
		}
		return len(seen)
	}
	// Attempts the dead worker made beside the hung one were answered but never recorded:
	// they come again (at least once, docs/webhooks.md).
	waitFor(t, "every event", func() bool { return distinct() == n })
	took := time.Since(killedAt)
	t.Logf("the crashed worker's endpoint was delivered to %v after the crash", took.Round(10*time.Millisecond))
	if took > recoveryBound {
		t.Errorf("deliveries out %v after the crash, want within %v", took, recoveryBound)
	}
	waitFor(t, "the gauge back at 0", func() bool {
		d, err := queue.HeldPastHeartbeat(context.Background())
		return err == nil && d == 0
	})
	waitFor(t, "the outcomes recorded", func() bool { return e.count("SELECT count(*) FROM webhook_deliveries") == 0 })
}

// TestHeldPastHeartbeat reads the source of the held gauges on the store under test: work
// claimed and renewed is not held past its heartbeat; two beats (two thirds of the lease)
// without a renewal, it is, until it is renewed, its outcome recorded, or it is claimed again.
func TestHeldPastHeartbeat(t *testing.T) {
	t.Parallel()
	const lease = 600 * time.Millisecond
	ctx := context.Background()
	m := newMailEnv(t)
	rc := newReceiver(t)
	m.hook(rc.srv.URL, nil, rc)
	m.create("held@example.com", "pending")
	queue := repo.NewDeliveries(m.db)
	held := func(name string, f func(context.Context) (time.Duration, error)) time.Duration {
		t.Helper()
		d, err := f(ctx)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return d
	}
	emails, err := m.outbox.Claim(ctx, 10, lease)
	if err != nil || len(emails) != 1 {
		t.Fatalf("Claim = %v, %v; want the email", emails, err)
	}
	batches, err := queue.Claim(ctx, 8, 100, 4, lease)
	if err != nil || len(batches) != 1 {
		t.Fatalf("Claim = %v, %v; want the endpoint", batches, err)
	}
	if e, w := held("emails", m.outbox.HeldPastHeartbeat), held("endpoints", queue.HeldPastHeartbeat); e != 0 || w != 0 {
		t.Fatalf("just claimed: held past heartbeat %v, %v; want 0", e, w)
	}
	time.Sleep(lease * 3 / 4) // past two beats, within the lease
	if e, w := held("emails", m.outbox.HeldPastHeartbeat), held("endpoints", queue.HeldPastHeartbeat); e <= 0 || w <= 0 {
		t.Fatalf("no heartbeat for 3/4 of the lease: held past heartbeat %v, %v; want both > 0", e, w)
	}
	// A renewal (the heartbeat) clears it.
	if err := m.outbox.Extend(ctx, []uuid.UUID{emails[0].ID}, lease); err != nil {
		t.Fatal(err)
	}
	if err := queue.Extend(ctx, []uuid.UUID{batches[0].EndpointID}, lease); err != nil {
		t.Fatal(err)
	}
	if e, w := held("emails", m.outbox.HeldPastHeartbeat), held("endpoints", queue.HeldPastHeartbeat); e != 0 || w != 0 {
		t.Fatalf("renewed: held past heartbeat %v, %v; want 0", e, w)
	}
	// Recorded outcomes end the hold, even once the beats are missed.
	time.Sleep(lease * 3 / 4)
	if err := m.outbox.Retry(ctx, emails[0].ID, time.Hour, "451 later", false); err != nil {
		t.Fatal(err)
	}
	results := []model.DeliveryResult{{EventID: batches[0].Deliveries[0].EventID, Outcome: model.DeliveryDelivered}}
	if _, err := queue.Finish(ctx, batches[0].EndpointID, results, false); err != nil {
		t.Fatal(err)
	}
	if e, w := held("emails", m.outbox.HeldPastHeartbeat), held("endpoints", queue.HeldPastHeartbeat); e != 0 || w != 0 {
		t.Fatalf("outcomes recorded: held past heartbeat %v, %v; want 0", e, w)
	}
}
