package mail

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/textproto"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/subscriberd/subscriberd/model"
)

// fakeRow is one email in fakeOutbox.
type fakeRow struct {
	email    model.OutboxEmail
	state    string
	due      time.Time
	delay    time.Duration // last retry delay
	reason   string
	obsolete bool     // IssueToken answers ErrEmailObsolete
	hashes   [][]byte // issued token hashes
	extended int      // lease renewals
}

// fakeOutbox is an in-memory Outbox: enough of the contract to drive the worker.
type fakeOutbox struct {
	mu       sync.Mutex
	rows     []*fakeRow
	released []uuid.UUID
	claims   chan int // when set, receives the size of every claim
	failing  int      // the next claims that fail, as with the database down
}

func (o *fakeOutbox) add(e model.OutboxEmail) *fakeRow {
	o.mu.Lock()
	defer o.mu.Unlock()
	if e.ID == uuid.Nil {
		e.ID = uuid.New()
	}
	if e.Email == "" {
		e.Email = "s" + e.ID.String()[:8] + "@example.com"
	}
	if e.Kind == "" {
		e.Kind = model.EmailKindConfirmation
	}
	r := &fakeRow{email: e, state: model.EmailPending}
	o.rows = append(o.rows, r)
	return r
}

func (o *fakeOutbox) row(id uuid.UUID) *fakeRow {
	for _, r := range o.rows {
		if r.email.ID == id {
			return r
		}
	}
	panic("no row " + id.String())
}

func (o *fakeOutbox) Claim(_ context.Context, limit int, lease time.Duration) ([]model.OutboxEmail, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.failing > 0 {
		o.failing--
		o.report(-1)
		return nil, fmt.Errorf("claim: %w", model.ErrUnavailable)
	}
	now := time.Now()
	var out []model.OutboxEmail
	for _, r := range o.rows {
		if len(out) < limit && r.state == model.EmailPending && !r.due.After(now) {
			r.due = now.Add(lease)
			out = append(out, r.email)
		}
	}
	o.report(len(out))
	return out, nil
}

// report tells the test about a claim, never blocking the worker.
func (o *fakeOutbox) report(n int) {
	if o.claims != nil {
		select {
		case o.claims <- n:
		default:
		}
	}
}

func (o *fakeOutbox) IssueToken(_ context.Context, e model.OutboxEmail, hash []byte, ttl time.Duration) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	r := o.row(e.ID)
	if r.obsolete {
		return fmt.Errorf("issue: %w", model.ErrEmailObsolete)
	}
	if ttl != TokenTTL {
		return fmt.Errorf("ttl %v", ttl)
	}
	r.hashes = append(r.hashes, hash)
	return nil
}

func (o *fakeOutbox) set(id uuid.UUID, f func(*fakeRow)) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	f(o.row(id))
	return nil
}

func (o *fakeOutbox) CommitSend(_ context.Context, e model.OutboxEmail, _ bool, accept func() error) error {
	o.mu.Lock()
	r := o.row(e.ID)
	wanted := !r.obsolete && r.state == model.EmailPending
	o.mu.Unlock()
	if !wanted {
		return fmt.Errorf("commit: %w", model.ErrEmailObsolete)
	}
	if err := accept(); err != nil {
		return err
	}
	return o.set(e.ID, func(r *fakeRow) { r.state = model.EmailSent; r.email.Attempts++ })
}

func (o *fakeOutbox) Extend(_ context.Context, ids []uuid.UUID, lease time.Duration) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, id := range ids {
		if r := o.row(id); r.state == model.EmailPending {
			r.due = time.Now().Add(lease)
			r.extended++
		}
	}
	return nil
}

func (o *fakeOutbox) Retry(_ context.Context, id uuid.UUID, d time.Duration, reason string, unanswered bool) error {
	return o.set(id, func(r *fakeRow) {
		r.email.Attempts++
		if unanswered {
			r.email.Unanswered++
		}
		r.due, r.delay, r.reason = time.Now().Add(d), d, reason
	})
}

func (o *fakeOutbox) Fail(_ context.Context, id uuid.UUID, reason string) error {
	return o.set(id, func(r *fakeRow) { r.state = model.EmailFailed; r.email.Attempts++; r.reason = reason })
}

func (o *fakeOutbox) Cancel(_ context.Context, id uuid.UUID, reason string) error {
	return o.set(id, func(r *fakeRow) { r.state = model.EmailCancelled; r.reason = reason })
}

func (o *fakeOutbox) Release(_ context.Context, ids []uuid.UUID) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, id := range ids {
		o.row(id).due = time.Time{}
	}
	o.released = append(o.released, ids...)
	return nil
}

// fakeTransport keeps the messages it is given and answers with err(m) when set.
type fakeTransport struct {
	mu   sync.Mutex
	sent []*Message
	err  func(ctx context.Context, m *Message) error
	got  chan *Message
}

func (t *fakeTransport) Send(ctx context.Context, m *Message) error {
	if t.err != nil {
		if err := t.err(ctx, m); err != nil {
			return err
		}
	}
	t.mu.Lock()
	t.sent = append(t.sent, m)
	t.mu.Unlock()
	if t.got != nil {
		t.got <- m
	}
	return nil
}

type fakeRecorder struct {
	mu       sync.Mutex
	outcomes []string
}

func (r *fakeRecorder) SuppressionsCreated(string, int) {}

func (r *fakeRecorder) EmailSend(_ context.Context, outcome string, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d < 0 {
		outcome += "(negative duration)"
	}
	r.outcomes = append(r.outcomes, outcome)
}

func (r *fakeRecorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.outcomes, ",")
}

type workerFixture struct {
	outbox    *fakeOutbox
	transport *fakeTransport
	rec       *fakeRecorder
	spans     *tracetest.SpanRecorder
	logs      *bytes.Buffer
	worker    *Worker
}

func newFixture(t *testing.T, cfg WorkerConfig) *workerFixture {
	t.Helper()
	f := &workerFixture{outbox: &fakeOutbox{}, transport: &fakeTransport{}, rec: &fakeRecorder{},
		spans: tracetest.NewSpanRecorder(), logs: &bytes.Buffer{}}
	c, err := NewComposer("News <news@example.com>", "https://example.com")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Recorder = f.rec
	cfg.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(f.spans))
	cfg.Logger = slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f.worker = NewWorker(f.outbox, f.transport, c, cfg)
	return f
}

func TestWorkerSendsDueEmails(t *testing.T) {
	f := newFixture(t, WorkerConfig{})
	a := f.outbox.add(model.OutboxEmail{NewsletterName: "Weekly", FirstName: "Ann"})
	b := f.outbox.add(model.OutboxEmail{NewsletterName: "Weekly"})
	n, err := f.worker.RunOnce(context.Background())
	if err != nil || n != 2 {
		t.Fatalf("RunOnce = %d, %v; want 2 claimed", n, err)
	}
	if got := f.rec.String(); got != "sent,sent" {
		t.Errorf("outcomes %q, want sent,sent", got)
	}
	for i, r := range []*fakeRow{a, b} {
		if r.state != model.EmailSent || r.email.Attempts != 1 || len(r.hashes) != 1 {
			t.Fatalf("row %d: state %s attempts %d tokens %d; want sent, 1, 1", i, r.state, r.email.Attempts, len(r.hashes))
		}
		m := f.transport.sent[i]
		token := strings.TrimPrefix(m.Link, "https://example.com/confirm/")
		if !bytes.Equal(HashToken(token), r.hashes[0]) {
			t.Errorf("row %d: the link's token does not match the stored hash", i)
		}
		if m.ID != r.email.ID.String()+"@example.com" || m.To.Address != r.email.Email {
			t.Errorf("row %d: message id %q to %q", i, m.ID, m.To.Address)
		}
	}
	if strings.Contains(f.logs.String(), "/confirm/") {
		t.Errorf("the worker logged a link:\n%s", f.logs)
	}
	if n, _ := f.worker.RunOnce(context.Background()); n != 0 {
		t.Errorf("second RunOnce claimed %d, want 0", n)
	}
}

func TestWorkerOutcomes(t *testing.T) {
	temporary := errors.New("451 4.3.0 try again later")
	permanent := &PermanentError{Code: 550, Err: errors.New("550 5.1.1 no such user")}
	unanswered := &UnconfirmedError{Err: os.ErrDeadlineExceeded}
	for _, tc := range []struct {
		name       string
		attempts   int // made before
		unanswered int // of them, with no reply to the end of DATA
		obsolete   bool
		sendErr    error
		outcome    string
		state      string
		wantSent   int
		minD, maxD time.Duration
	}{
		{"temporary first failure", 0, 0, false, temporary, OutcomeRetry, model.EmailPending, 0, 22500 * time.Millisecond, 30 * time.Second},
		{"temporary third failure", 2, 0, false, temporary, OutcomeRetry, model.EmailPending, 0, 90 * time.Second, 120 * time.Second},
		{"temporary failure capped at an hour", 9, 0, false, temporary, OutcomeRetry, model.EmailPending, 0, 45 * time.Minute, time.Hour},
		{"temporary failure at the last attempt", 11, 0, false, temporary, OutcomeFailed, model.EmailFailed, 0, 0, 0},
		{"permanent failure at once", 0, 0, false, permanent, OutcomeFailed, model.EmailFailed, 0, 0, 0},
		{"no longer wanted", 0, 0, true, nil, OutcomeCancelled, model.EmailCancelled, 0, 0, 0},
		{"success after failures", 5, 0, false, nil, OutcomeSent, model.EmailSent, 1, 0, 0},
		{"unknown kind", 0, 0, false, nil, OutcomeFailed, model.EmailFailed, 0, 0, 0},
		// No reply to the end of DATA: retried once (a duplicate at worst), then counted as sent,
		// whatever failures came between.
		{"no reply to the end of DATA", 1, 0, false, unanswered, OutcomeRetry, model.EmailPending, 0, 45 * time.Second, time.Minute},
		{"no reply to the end of DATA again, after other failures", 3, 1, false, unanswered, OutcomeSent, model.EmailSent, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, WorkerConfig{})
			kind := model.EmailKindConfirmation
			if tc.name == "unknown kind" {
				kind = "newsletter-issue"
			}
			r := f.outbox.add(model.OutboxEmail{NewsletterName: "Weekly", Attempts: tc.attempts, Unanswered: tc.unanswered, Kind: kind})
			r.obsolete = tc.obsolete
			f.transport.err = func(context.Context, *Message) error { return tc.sendErr }
			if _, err := f.worker.RunOnce(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got := f.rec.String(); got != tc.outcome {
				t.Errorf("outcome %q, want %q", got, tc.outcome)
			}
			if r.state != tc.state || len(f.transport.sent) != tc.wantSent {
				t.Errorf("state %s, sent %d; want %s, %d", r.state, len(f.transport.sent), tc.state, tc.wantSent)
			}
			if want := tc.unanswered; tc.sendErr == unanswered && r.state == model.EmailPending {
				if r.email.Unanswered != want+1 {
					t.Errorf("unanswered = %d after an unanswered attempt, want %d", r.email.Unanswered, want+1)
				}
			}
			if tc.maxD > 0 && (r.delay < tc.minD || r.delay > tc.maxD) {
				t.Errorf("retry delay %v, want within [%v, %v]", r.delay, tc.minD, tc.maxD)
			}
			if tc.sendErr != nil && tc.state != model.EmailSent && !strings.Contains(r.reason, tc.sendErr.Error()) {
				t.Errorf("recorded reason %q lacks %q", r.reason, tc.sendErr)
			}
			if tc.obsolete && len(r.hashes) != 0 {
				t.Error("a token was stored for an obsolete email")
			}
		})
	}
}

func TestBackoff(t *testing.T) {
	w := NewWorker(&fakeOutbox{}, &fakeTransport{}, nil, WorkerConfig{})
	for _, tc := range []struct {
		attempt int
		max     time.Duration
	}{{1, 30 * time.Second}, {2, time.Minute}, {3, 2 * time.Minute}, {7, 32 * time.Minute}, {8, time.Hour}, {12, time.Hour}, {1000, time.Hour}} {
		for range 50 {
			d := w.Backoff(tc.attempt)
			if d > tc.max || d < tc.max*3/4 {
				t.Fatalf("Backoff(%d) = %v, want within [%v, %v]", tc.attempt, d, tc.max*3/4, tc.max)
			}
		}
	}
}

func TestWorkerSpanLinksTheQueuingRequest(t *testing.T) {
	f := newFixture(t, WorkerConfig{})
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	f.outbox.add(model.OutboxEmail{NewsletterName: "Weekly", Traceparent: tp})
	f.outbox.add(model.OutboxEmail{NewsletterName: "Weekly", Traceparent: "garbage"})
	f.worker.RunOnce(context.Background())
	spans := f.spans.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	s := spans[0]
	if s.Name() != "email.send" || len(s.Links()) != 1 {
		t.Fatalf("span %q with %d links, want email.send with 1", s.Name(), len(s.Links()))
	}
	l := s.Links()[0].SpanContext
	if l.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || l.SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("link to %s/%s", l.TraceID(), l.SpanID())
	}
	if s.SpanContext().TraceID() == l.TraceID() || s.Parent().IsValid() {
		t.Error("the send span should start its own trace and link the request's")
	}
	if len(spans[1].Links()) != 0 {
		t.Errorf("an invalid traceparent gave %d links", len(spans[1].Links()))
	}
}

// TestSendSpanCarriesTheSMTPReplyCode: a failed attempt's span has the server's reply code,
// not its text, which quotes the recipient; a failure without a reply has none.
func TestSendSpanCarriesTheSMTPReplyCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int64
	}{
		{classifyReply("RCPT TO", &textproto.Error{Code: 451, Msg: "4.7.1 <ann@example.com> greylisted"}), 451},
		{classifyReply("MAIL FROM", &textproto.Error{Code: 550, Msg: "5.7.1 sender refused"}), 550},
		{errors.New("dial tcp 127.0.0.1:25: connect: connection refused"), 0},
	} {
		f := newFixture(t, WorkerConfig{})
		f.outbox.add(model.OutboxEmail{NewsletterName: "Weekly", Kind: model.EmailKindConfirmation})
		f.transport.err = func(context.Context, *Message) error { return tc.err }
		f.worker.RunOnce(context.Background())
		spans := f.spans.Ended()
		if len(spans) != 1 {
			t.Fatalf("%d spans, want 1", len(spans))
		}
		var code int64
		for _, a := range spans[0].Attributes() {
			if a.Key == AttrSMTPReplyCode {
				code = a.Value.AsInt64()
			}
			if strings.Contains(a.Value.String(), "@") {
				t.Errorf("attribute %s = %q names an address", a.Key, a.Value.String())
			}
		}
		if code != tc.code {
			t.Errorf("%v: reply code attribute %d, want %d", tc.err, code, tc.code)
		}
	}
}

// spanRecorder is a fakeRecorder that takes the send span's context too, as
// telemetry.Metrics does for its exemplars.
type spanRecorder struct {
	fakeRecorder
	spans []trace.SpanContext
}

func (r *spanRecorder) EmailSend(ctx context.Context, outcome string, d time.Duration) {
	r.fakeRecorder.EmailSend(ctx, outcome, d)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.spans = append(r.spans, trace.SpanContextFromContext(ctx))
}

// The send's duration goes to a recorder that takes a context with the send span in it, so that
// the email latency panel's exemplars lead to the send's trace.
func TestWorkerRecordsTheSendSpanForExemplars(t *testing.T) {
	rec := &spanRecorder{}
	f := newFixture(t, WorkerConfig{})
	f.worker.cfg.Recorder = rec
	f.outbox.add(model.OutboxEmail{NewsletterName: "Weekly"})
	if n, err := f.worker.RunOnce(context.Background()); err != nil || n != 1 {
		t.Fatalf("RunOnce = %d, %v", n, err)
	}
	spans := f.spans.Ended()
	if len(spans) != 1 || len(rec.spans) != 1 || rec.String() != OutcomeSent {
		t.Fatalf("%d spans, %d recorded contexts, outcomes %q; want 1, 1, sent", len(spans), len(rec.spans), rec.String())
	}
	if got, want := rec.spans[0], spans[0].SpanContext(); !got.Equal(want) || !got.IsSampled() {
		t.Errorf("recorded with span %v, want the sampled email.send span %v", got, want)
	}
}

func TestWorkerStopsAfterTheEmailInHand(t *testing.T) {
	f := newFixture(t, WorkerConfig{})
	rows := []*fakeRow{f.outbox.add(model.OutboxEmail{}), f.outbox.add(model.OutboxEmail{}), f.outbox.add(model.OutboxEmail{})}
	ctx, cancel := context.WithCancel(context.Background())
	f.transport.err = func(sendCtx context.Context, _ *Message) error {
		cancel() // shutdown begins while the first email is being sent
		return sendCtx.Err()
	}
	n, err := f.worker.RunOnce(ctx)
	if err != nil || n != 3 {
		t.Fatalf("RunOnce = %d, %v", n, err)
	}
	if rows[0].state != model.EmailSent || len(f.transport.sent) != 1 {
		t.Errorf("first email: state %s, sent %d; want it finished despite the shutdown", rows[0].state, len(f.transport.sent))
	}
	if len(f.outbox.released) != 2 || f.outbox.released[0] != rows[1].email.ID || f.outbox.released[1] != rows[2].email.ID {
		t.Errorf("released %v, want the two untried emails", f.outbox.released)
	}
	for _, r := range rows[1:] {
		if r.state != model.EmailPending || !r.due.IsZero() || len(r.hashes) != 0 {
			t.Errorf("untried email: state %s due %v tokens %d", r.state, r.due, len(r.hashes))
		}
	}
}

func TestWorkerRunWakesOnSignalAndStops(t *testing.T) {
	wake := make(chan struct{}, 1)
	f := newFixture(t, WorkerConfig{PollInterval: time.Hour, Wake: wake, BatchSize: 2})
	f.transport.got = make(chan *Message, 10)
	f.outbox.claims = make(chan int, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- f.worker.Run(ctx) }()

	// The first look at start finds nothing; then three queued emails with a batch of two:
	// one wake-up delivers them all, the next poll being an hour away.
	if n := <-f.outbox.claims; n != 0 {
		t.Fatalf("first claim got %d emails", n)
	}
	for range 3 {
		f.outbox.add(model.OutboxEmail{})
	}
	wake <- struct{}{}
	for i := range 3 {
		select {
		case <-f.transport.got:
		case <-time.After(10 * time.Second):
			t.Fatalf("email %d not delivered after the wake-up", i+1)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// TestWorkerRunSurvivesClaimErrors: claims that fail (the database down) are tried again at
// every poll and logged as one outage.
func TestWorkerRunSurvivesClaimErrors(t *testing.T) {
	f := newFixture(t, WorkerConfig{PollInterval: time.Millisecond})
	f.outbox.failing = 3
	f.outbox.claims = make(chan int, 100)
	f.transport.got = make(chan *Message, 1)
	f.outbox.add(model.OutboxEmail{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- f.worker.Run(ctx) }()
	select {
	case <-f.transport.got:
	case <-time.After(10 * time.Second):
		t.Fatal("no email after the database came back")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
	for range 3 {
		if n := <-f.outbox.claims; n != -1 {
			t.Fatalf("claim answered %d, want the three failures first", n)
		}
	}
	// An outage is a few lines, not one a poll: its start, and its end with the failures.
	logs := f.logs.String()
	if strings.Count(logs, "claiming due emails failed") != 1 || strings.Count(logs, "claiming due emails works again") != 1 ||
		!strings.Contains(logs, "failures=3") {
		t.Errorf("want one line at the first failure and one, counting 3, at the first success:\n%s", logs)
	}
}

func TestScrubAddresses(t *testing.T) {
	for in, want := range map[string]string{
		"":                          "",
		"451 4.3.0 try again later": "451 4.3.0 try again later",
		"550 5.1.1 <ann@example.com>: no such user": "550 5.1.1 <[address]>: no such user",
		"failed to send: 550 5.1.1 user unknown, affected recipient(s): ann.o'neil+news@mail.example.co.uk, bob@example.org": "failed to send: 550 5.1.1 user unknown, affected recipient(s): [address], [address]",
		"rcpt to:ann=x@example.com rejected":    "rcpt to:[address] rejected",
		"quota (ann@example.com) exceeded;a@b":  "quota ([address]) exceeded;[address]",
		"@ alone, and x@":                       "[address] alone, and [address]",
		"bad\u00e9@ex\u00e4mple.com\nnext line": "[address]\nnext line",
	} {
		if got := scrubAddresses(in); got != want {
			t.Errorf("scrubAddresses(%q) = %q, want %q", in, got, want)
		}
	}
}

// A delivery error quotes the recipient; the worker's log lines must not (the outbox row keeps
// the whole text, beside the address it holds anyway).
func TestWorkerLogsNoRecipientAddress(t *testing.T) {
	const addr = "ann.o'neil@example.org"
	for name, sendErr := range map[string]error{
		"temporary": errors.New("451 4.2.2 <" + addr + ">: mailbox full, affected recipient(s): " + addr),
		"permanent": &PermanentError{Code: 550, Err: errors.New("550 5.1.1 <" + addr + ">: no such user")},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, WorkerConfig{})
			r := f.outbox.add(model.OutboxEmail{NewsletterName: "Weekly", Email: addr})
			f.transport.err = func(context.Context, *Message) error { return sendErr }
			if _, err := f.worker.RunOnce(context.Background()); err != nil {
				t.Fatal(err)
			}
			logs := f.logs.String()
			if !strings.Contains(logs, "error=") || !strings.Contains(logs, scrubbedAddress) {
				t.Fatalf("no scrubbed error in the log:\n%s", logs)
			}
			if strings.Contains(logs, "@") || strings.Contains(logs, "o'neil") {
				t.Errorf("the log holds the recipient's address:\n%s", logs)
			}
			if !strings.Contains(r.reason, addr) {
				t.Errorf("the outbox's reason %q lost the server's reply", r.reason)
			}
		})
	}
}

// The worker renews the lease of every email it still holds — the one being sent and those
// waiting in its batch — so a short lease never hands a live worker's emails to another; an
// email's retry delay is never overwritten by a renewal.
func TestWorkerRenewsLeasesWhileItSends(t *testing.T) {
	const lease = 60 * time.Millisecond
	f := newFixture(t, WorkerConfig{Lease: lease, RetryBase: time.Hour, RetryMax: time.Hour})
	slow := f.outbox.add(model.OutboxEmail{})
	waiting := f.outbox.add(model.OutboxEmail{})
	f.transport.err = func(ctx context.Context, m *Message) error {
		time.Sleep(5 * lease) // far longer than the lease
		return errors.New("451 try later")
	}
	if n, err := f.worker.RunOnce(context.Background()); n != 2 || err != nil {
		t.Fatalf("RunOnce = %d, %v", n, err)
	}
	f.outbox.mu.Lock()
	defer f.outbox.mu.Unlock()
	if slow.extended < 3 {
		t.Errorf("email in hand renewed %d times in 5 leases, want at least 3", slow.extended)
	}
	if waiting.extended < 3 {
		t.Errorf("email waiting in the batch renewed %d times in 5 leases, want at least 3", waiting.extended)
	}
	for _, r := range []*fakeRow{slow, waiting} {
		if until := time.Until(r.due); until < 30*time.Minute {
			t.Errorf("after a retry the email is due in %v, want the retry's delay (about an hour), not a lease", until)
		}
	}
}
