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

	"github.com/subscriberd/subscriberd/mail"
	"github.com/subscriberd/subscriberd/repo"
)

// workerProcessEnv, set, makes the test binary a worker process (runWorkerProcess): the
// email worker of the service on the database, SMTP server and lease the environment names.
// A process of its own is what kill -9 can take away mid-send, with its connections.
const workerProcessEnv = "SUBSCRIBERD_TEST_WORKER"

func runWorkerProcess() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "worker process:", err); return 2 }
	lease, err := time.ParseDuration(os.Getenv("WORKER_LEASE"))
	if err != nil {
		return fail(err)
	}
	db, err := repo.Open(os.Getenv("WORKER_DATABASE_URL"), repo.Options{})
	if err != nil {
		return fail(err)
	}
	tr, err := mail.NewSMTP(os.Getenv("WORKER_SMTP_URL"), 5*time.Second)
	if err != nil {
		return fail(err)
	}
	composer, err := mail.NewComposer(testFrom, "http://127.0.0.1")
	if err != nil {
		return fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	outbox := repo.NewOutbox(db)
	w := mail.NewWorker(outbox, tr, composer, mail.WorkerConfig{
		Lease: lease, PollInterval: 100 * time.Millisecond, RetryBase: 100 * time.Millisecond, Logger: discardLog,
	})
	if err := w.Run(ctx); err != nil {
		return fail(err)
	}
	return 0
}

// startWorkerProcess runs a worker process for m with the given lease until t ends.
func (m *mailEnv) startWorkerProcess(lease time.Duration) *exec.Cmd {
	m.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), workerProcessEnv+"=1", "WORKER_LEASE="+lease.String(),
		"WORKER_DATABASE_URL="+m.dsn, "WORKER_SMTP_URL="+m.smtp.URL())
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		m.t.Fatal(err)
	}
	m.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck
	return cmd
}

// TestCrashedWorkerEmailsGoOutAfterRestart kills a worker process (SIGKILL) while it is in the
// middle of sending a batch, starts a new one at once, and counts how long the crashed
// worker's emails take to go out: one lease (the claim's lease, renewed by a live worker and
// by nobody once it died) and a poll. The lease is shortened to 2 s so the test runs in
// seconds; mail.DefaultLease is one minute, the same logic. Every email goes out exactly once.
func TestCrashedWorkerEmailsGoOutAfterRestart(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	if mail.DefaultLease != time.Minute {
		t.Errorf("mail.DefaultLease = %v; docs/operating.md promises recovery within about a minute", mail.DefaultLease)
	}
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
	w := m.startWorkerProcess(lease)
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
	m.startWorkerProcess(lease)
	waitFor(t, "every email", func() bool { return len(m.smtp.Messages()) >= n })
	took := time.Since(killedAt)
	t.Logf("the crashed worker's emails were all out %v after the restart (lease %v)", took.Round(10*time.Millisecond), lease)
	if took > lease+3*time.Second {
		t.Errorf("emails out %v after the restart, want within the lease (%v) and a few polls", took, lease)
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
