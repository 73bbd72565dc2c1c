package mail

import (
	"context"
	"errors"
	"log/slog"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/subscriberd/subscriberd/internal/outage"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/outbox"
)

// Outbox is the storage the worker needs: the transactional outbox of confirmation emails and
// the confirmation tokens. Several workers, in one process or many, may use one outbox at once.
// Times are taken from the outbox's own clock; the worker passes durations.
type Outbox interface {
	// Claim leases up to limit due pending emails, oldest due first, skipping rows other
	// workers hold (FOR UPDATE SKIP LOCKED): each claimed email is hidden from other claims for
	// lease, so that a worker that dies mid-send gives its emails back when the lease ends.
	Claim(ctx context.Context, limit int, lease time.Duration) ([]model.OutboxEmail, error)
	// IssueToken stores the hash of a new token for e, valid for ttl, and retires the
	// subscriber's earlier tokens. It fails with model.ErrEmailObsolete when e is no longer
	// pending, its subscriber is no longer pending, or a newer email superseded it.
	IssueToken(ctx context.Context, e model.OutboxEmail, hash []byte, ttl time.Duration) error
	// CommitSend re-checks, under the subscriber's lock, that e is still wanted (else
	// model.ErrEmailObsolete, without calling accept), calls accept — the SMTP server's
	// acceptance of the message — and records e as sent, all in one transaction: a refusal
	// that races the send commits before it or after the server accepted the email, never in
	// between. accept's error is returned as is. accept is called at most once. mailed says
	// that a server, not the log, takes the email: only then is it a confirmation_sent event.
	CommitSend(ctx context.Context, e model.OutboxEmail, mailed bool, accept func() error) error
	// Extend renews the lease of claimed emails still in the worker's hands (its heartbeat).
	Extend(ctx context.Context, ids []uuid.UUID, lease time.Duration) error
	// Retry counts a failed attempt and makes the email due again after delay; unanswered says
	// the attempt's end of DATA got no reply (model.OutboxEmail.Unanswered counts them).
	Retry(ctx context.Context, id uuid.UUID, delay time.Duration, reason string, unanswered bool) error
	// Fail counts a failed attempt and gives up on the email; it stays for inspection.
	Fail(ctx context.Context, id uuid.UUID, reason string) error
	// Cancel gives up on an email nobody wants any more.
	Cancel(ctx context.Context, id uuid.UUID, reason string) error
	// Release hands claimed, untried emails back at once (on shutdown).
	Release(ctx context.Context, ids []uuid.UUID) error
}

// Outcomes of one delivery attempt, as given to [Recorder.EmailSend].
const (
	OutcomeSent      = "sent"
	OutcomeRetry     = "retry"
	OutcomeFailed    = "failed"
	OutcomeCancelled = "cancelled"
	// OutcomeSuppressed is an email dropped at the last check before sending: its address is
	// on the suppression list (docs/api-contract.md §13).
	OutcomeSuppressed = "suppressed"
)

// Bouncer is implemented by an [Outbox] that records hard bounces (docs/api-contract.md §13):
// in one transaction the email fails, its address is suppressed with reason hard_bounce and
// its subscriber unsubscribed. It reports whether the suppression is new. Without it a hard
// bounce only fails the email.
type Bouncer interface {
	Bounce(ctx context.Context, e model.OutboxEmail, reply string) (bool, error)
}

// Recorder receives the worker's metrics: one call per attempt with its outcome
// ([OutcomeSent], [OutcomeLogged], [OutcomeRetry], [OutcomeFailed], [OutcomeCancelled]) and
// duration. ctx holds the attempt's send span, so that the duration can carry its trace as an
// exemplar (telemetry.Metrics does).
type Recorder interface {
	EmailSend(ctx context.Context, outcome string, d time.Duration)
	// SuppressionsCreated counts n new suppression list entries with reason: the worker
	// makes hard_bounce ones (docs/api-contract.md §13).
	SuppressionsCreated(reason string, n int)
}

// WorkerConfig tunes a [Worker]. Zero values take the defaults named on each field.
type WorkerConfig struct {
	BatchSize    int           // emails claimed at once; default 10
	PollInterval time.Duration // look for due emails this often without a wake-up; default 500ms
	Lease        time.Duration // a claimed email is hidden from other workers this long, renewed every third of it while held; default DefaultLease
	RetryBase    time.Duration // delay before the second attempt, doubling after; default 30s
	RetryMax     time.Duration // longest delay between attempts; default 1h
	MaxAttempts  int           // attempts before an email fails for good; default 12
	SendTimeout  time.Duration // bound on one email (token, SMTP, bookkeeping); default 2m

	// Wake, when not nil, is signalled when new emails are queued (on SQLite, by this
	// process), so they go out at once instead of at the next poll.
	Wake <-chan struct{}
	// Recorder receives metrics; nil records nothing.
	Recorder Recorder
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// TracerProvider defaults to the global one.
	TracerProvider trace.TracerProvider
}

func (c *WorkerConfig) defaults() {
	outbox.SetDefault(&c.BatchSize, 10)
	outbox.SetDefault(&c.PollInterval, 500*time.Millisecond)
	outbox.SetDefault(&c.Lease, DefaultLease)
	outbox.SetDefault(&c.RetryBase, 30*time.Second)
	outbox.SetDefault(&c.RetryMax, time.Hour)
	outbox.SetDefault(&c.MaxAttempts, 12)
	outbox.SetDefault(&c.SendTimeout, 2*time.Minute)
	if c.Recorder == nil {
		c.Recorder = nopRecorder{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
}

// DefaultLease is how long a claimed email stays hidden from other workers unless its worker
// renews the claim (every third of it, while the email waits in its batch or is being sent).
// A worker that dies (kill -9, a lost machine) stops renewing, and its emails are claimed again
// by another worker, or itself after a restart, within the lease and a poll interval: about
// 10 s (outbox.DefaultLease).
const DefaultLease = outbox.DefaultLease

type nopRecorder struct{}

func (nopRecorder) EmailSend(context.Context, string, time.Duration) {}
func (nopRecorder) SuppressionsCreated(string, int)                  {}

// Worker delivers the outbox's confirmation emails until its context ends.
type Worker struct {
	outbox    Outbox
	transport Transport
	composer  *Composer
	cfg       WorkerConfig
	log       *slog.Logger
	tracer    trace.Tracer
	// logsOnly: transport writes emails to the log instead of sending them (LogTransport).
	logsOnly bool
	// claims logs failing claims (the database down) in a few lines, not one a poll.
	claims *outage.Log
}

// ClaimOutage is what the email worker logs while it cannot claim due emails.
var ClaimOutage = outage.Messages{
	Start:   "claiming due emails failed",
	Summary: "claiming due emails still failing",
	End:     "claiming due emails works again",
}

// NewWorker returns a worker that claims emails from o, writes them with c and sends them
// through t.
func NewWorker(o Outbox, t Transport, c *Composer, cfg WorkerConfig) *Worker {
	cfg.defaults()
	w := &Worker{
		outbox: o, transport: t, composer: c, cfg: cfg,
		log:    cfg.Logger.With(slog.String("component", "email_worker")),
		tracer: cfg.TracerProvider.Tracer("github.com/subscriberd/subscriberd/mail"),
	}
	w.claims = outage.New(w.log, ClaimOutage, 0, nil)
	_, w.logsOnly = t.(interface{ logsOnly() })
	return w
}

// Run delivers due emails until ctx ends, then returns nil after finishing the email in hand
// and handing the rest of its batch back to the outbox.
func (w *Worker) Run(ctx context.Context) error {
	outbox.Loop(ctx, w.cfg.Wake, w.cfg.PollInterval, func() bool {
		n, err := w.RunOnce(ctx)
		w.claims.Record(ctx, err)
		return err == nil && n >= w.cfg.BatchSize // a full batch means more may be due: go on at once
	})
	return nil
}

// RunOnce claims one batch of due emails and delivers it, and reports how many it claimed.
// When ctx ends it stops after the email in hand and releases the others.
func (w *Worker) RunOnce(ctx context.Context) (int, error) {
	// Emails claimed after a stop are given back at once below (outbox.ClaimContext).
	cctx, cancel, ok := outbox.ClaimContext(ctx, w.cfg.Lease)
	if !ok {
		return 0, nil
	}
	jobs, err := w.outbox.Claim(cctx, w.cfg.BatchSize, w.cfg.Lease)
	cancel()
	if err != nil {
		return 0, err
	}
	if len(jobs) == 0 {
		return 0, nil
	}
	hb := w.startHeartbeat(ctx, jobs)
	defer hb.Stop()
	for i, job := range jobs {
		if ctx.Err() != nil {
			for _, j := range jobs[i:] {
				hb.Drop(j.ID)
			}
			w.release(ctx, jobs[i:])
			break
		}
		w.deliver(ctx, job, hb)
	}
	return len(jobs), nil
}

// heartbeat renews the lease of the claimed emails the worker still holds (outbox.Heartbeat):
// the lease can be short, so a crashed worker's emails come back in seconds, however long the
// batch takes to send.
type heartbeat = outbox.Heartbeat[uuid.UUID]

func (w *Worker) startHeartbeat(ctx context.Context, jobs []model.OutboxEmail) *heartbeat {
	ids := make([]uuid.UUID, len(jobs))
	for i, j := range jobs {
		ids[i] = j.ID
	}
	renew := func(ctx context.Context, ids []uuid.UUID) error { return w.outbox.Extend(ctx, ids, w.cfg.Lease) }
	failed := func(ctx context.Context, n int, err error) {
		// Not lost: when the lease ends another worker may send an email this one is
		// sending, at worst twice; the next beat tries again.
		w.log.WarnContext(ctx, "renewing the lease of claimed emails failed", slog.Int("count", n), errAttr(err))
	}
	return outbox.StartHeartbeat(ctx, w.cfg.Lease, renew, failed, ids...)
}

func (w *Worker) release(ctx context.Context, jobs []model.OutboxEmail) {
	ids := make([]uuid.UUID, len(jobs))
	for i, j := range jobs {
		ids[i] = j.ID
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := w.outbox.Release(rctx, ids); err != nil {
		// Not lost: the lease ends and another worker takes them.
		w.log.WarnContext(ctx, "releasing claimed emails failed", slog.Int("count", len(ids)), errAttr(err))
	}
}

// deliver makes one attempt at one email and records its outcome. It runs to its end even when
// ctx is cancelled (shutdown waits for the email in hand), bounded by SendTimeout.
func (w *Worker) deliver(parent context.Context, job model.OutboxEmail, hb *heartbeat) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), w.cfg.SendTimeout)
	defer cancel()
	attempt := job.Attempts + 1
	opts := []trace.SpanStartOption{
		trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("subscriberd.email.outbox_id", job.ID.String()),
			attribute.String("subscriberd.email.kind", job.Kind),
			attribute.Int("subscriberd.email.attempt", attempt),
		),
	}
	opts = append(opts, outbox.Link(job.Traceparent)...)
	ctx, span := w.tracer.Start(ctx, "email.send", opts...)
	log := w.log.With(slog.String("outbox_id", job.ID.String()), slog.Int("attempt", attempt))

	outcome, err := w.attempt(ctx, job, attempt, log, hb)
	span.SetAttributes(attribute.String("subscriberd.email.outcome", outcome))
	if err != nil {
		// Not span.RecordError: SMTP replies quote the recipient ("550 <ann@example.com>: no
		// such user"), and addresses stay out of traces. The class is enough to find the log.
		span.SetAttributes(attribute.String("error.type", errorType(err)))
		// The server's reply code tells greylisting (451) from a refused sender (550); its
		// text, which may quote the recipient, stays in the log and the outbox row.
		if te, ok := errors.AsType[*textproto.Error](err); ok {
			span.SetAttributes(attribute.Int(AttrSMTPReplyCode, te.Code))
		}
		span.SetStatus(codes.Error, outcome)
	}
	span.End()
	w.cfg.Recorder.EmailSend(ctx, outcome, time.Since(start)) // ctx holds the send span
}

// AttrSMTPReplyCode is the send span's attribute with the SMTP server's reply code to a
// failed attempt (4xx, 5xx); absent when the server gave none (refused connection, timeout).
const AttrSMTPReplyCode = "subscriberd.email.smtp_reply_code"

func (w *Worker) attempt(ctx context.Context, job model.OutboxEmail, attempt int, log *slog.Logger, hb *heartbeat) (string, error) {
	defer hb.Drop(job.ID) // every path below has recorded its outcome by then, or left the lease to end
	if job.Kind != model.EmailKindConfirmation {
		// Written by a newer version, or by hand: this worker cannot write it, and must not
		// send a confirmation in its place. It stays for inspection.
		err := errors.New("unknown email kind " + strconv.Quote(job.Kind))
		if ferr := w.outbox.Fail(ctx, job.ID, err.Error()); ferr != nil {
			log.WarnContext(ctx, "recording failure failed", errAttr(ferr))
		}
		log.ErrorContext(ctx, "email failed for good", errAttr(err))
		return OutcomeFailed, err
	}
	token, hash := NewToken()
	if err := w.outbox.IssueToken(ctx, job, hash, TokenTTL); err != nil {
		if errors.Is(err, model.ErrEmailSuppressed) {
			return w.suppressed(ctx, job, log), nil
		}
		if errors.Is(err, model.ErrEmailObsolete) {
			return w.cancelled(ctx, job, log), nil
		}
		// The database is the likely culprit; nothing was sent. If even the retry cannot be
		// recorded, the lease ends and the email comes back by itself.
		log.WarnContext(ctx, "issuing confirmation token failed", errAttr(err))
		hb.Drop(job.ID)
		if rerr := w.outbox.Retry(ctx, job.ID, w.cfg.RetryBase, "token: "+err.Error(), false); rerr != nil {
			log.WarnContext(ctx, "recording retry failed", errAttr(rerr))
		}
		return OutcomeRetry, err
	}
	msg, err := w.composer.Compose(job, token)
	var accepted bool    // the SMTP server accepted the message, or is taken to have (unconfirmed)
	var unconfirmed bool // no reply to the end of DATA, and not the first time: counted as sent
	var commitErr error  // CommitSend's own failure (obsolete, database), not the server's
	if err == nil {
		err = w.send(ctx, job, msg, &accepted, &unconfirmed, &commitErr)
	}
	switch {
	case accepted:
		if unconfirmed {
			log.WarnContext(ctx, "email counted as sent: the server gave no reply to the end of DATA, "+
				"now and at an earlier attempt, and likely has one of the two", slog.String("message_id", msg.ID))
		}
		if err != nil {
			// The server has the email; when the lease ends it may go out once more, with the
			// same Message-ID. That beats losing it.
			log.ErrorContext(ctx, "email sent but not recorded as sent", errAttr(err))
		}
		if w.logsOnly {
			log.InfoContext(ctx, "email logged", slog.String("message_id", msg.ID))
			return OutcomeLogged, nil
		}
		log.InfoContext(ctx, "email sent", slog.String("message_id", msg.ID))
		return OutcomeSent, nil
	case errors.Is(commitErr, model.ErrEmailSuppressed):
		return w.suppressed(ctx, job, log), nil
	case errors.Is(commitErr, model.ErrEmailObsolete):
		return w.cancelled(ctx, job, log), nil
	case commitErr != nil:
		// The database failed before the server was asked to accept: nothing was sent.
		log.WarnContext(ctx, "checking the email before sending failed", errAttr(commitErr))
		hb.Drop(job.ID)
		if rerr := w.outbox.Retry(ctx, job.ID, w.cfg.RetryBase, "commit: "+commitErr.Error(), false); rerr != nil {
			log.WarnContext(ctx, "recording retry failed", errAttr(rerr))
		}
		return OutcomeRetry, commitErr
	}

	reason := outbox.Truncate(err.Error(), 1000)
	if reply, ok := HardBounce(err); ok {
		if b, ok := w.outbox.(Bouncer); ok {
			created, berr := b.Bounce(ctx, job, reply)
			if berr == nil {
				if created {
					w.cfg.Recorder.SuppressionsCreated(string(model.ReasonHardBounce), 1)
				}
				log.ErrorContext(ctx, "email failed for good: the server refused the recipient; address suppressed (hard_bounce)", errAttr(err))
				return OutcomeFailed, err
			}
			log.WarnContext(ctx, "recording hard bounce failed", errAttr(berr))
		}
	}
	if IsPermanent(err) || attempt >= w.cfg.MaxAttempts {
		if ferr := w.outbox.Fail(ctx, job.ID, reason); ferr != nil {
			log.WarnContext(ctx, "recording failure failed", errAttr(ferr))
		}
		log.ErrorContext(ctx, "email failed for good", slog.Bool("permanent", IsPermanent(err)), errAttr(err))
		return OutcomeFailed, err
	}
	delay := w.Backoff(attempt)
	hb.Drop(job.ID)
	_, unanswered := errors.AsType[*UnconfirmedError](err)
	if rerr := w.outbox.Retry(ctx, job.ID, delay, reason, unanswered); rerr != nil {
		log.WarnContext(ctx, "recording retry failed", errAttr(rerr))
	}
	log.WarnContext(ctx, "email will be retried", slog.Duration("delay", delay), errAttr(err))
	return OutcomeRetry, err
}

// send hands msg to the transport so that the server's acceptance happens inside
// Outbox.CommitSend, under the subscriber's lock: with a [GatedTransport] only the end of DATA
// does (the lock is held for the server's last reply); with any other transport the whole
// send does. accepted tells whether the server accepted the message; commitErr is
// CommitSend's own error when it failed before asking the server (the email no longer wanted,
// or the database).
//
// An end of DATA without a reply ([UnconfirmedError]) leaves the server with the email or
// without it. The first is retried, like any temporary failure: better a duplicate (same
// Message-ID) than a lost email. The second, whatever failures came between, counts as sent
// (unconfirmed is set): one of the two copies is most likely with the server, and a server
// that never replies in time would otherwise get a copy at every attempt, each with a new link
// that kills the previous one's. So at worst one duplicate, as for a crash
// (docs/api-contract.md §6).
func (w *Worker) send(ctx context.Context, job model.OutboxEmail, msg *Message, accepted, unconfirmed *bool, commitErr *error) error {
	unansweredBefore := job.Unanswered > 0
	gate := func(accept func() error) error {
		var acceptErr error
		err := w.outbox.CommitSend(ctx, job, !w.logsOnly, func() error {
			acceptErr = accept()
			if _, ok := errors.AsType[*UnconfirmedError](acceptErr); ok && unansweredBefore {
				acceptErr, *unconfirmed = nil, true
			}
			*accepted = acceptErr == nil
			return acceptErr
		})
		if err != nil && (acceptErr == nil || *accepted) {
			*commitErr = err
		}
		return err
	}
	var err error
	if gt, ok := w.transport.(GatedTransport); ok {
		err = gt.SendGated(ctx, msg, gate)
	} else {
		err = gate(func() error { return w.transport.Send(ctx, msg) })
	}
	if *accepted {
		return *commitErr // the server has it; only the bookkeeping may have failed
	}
	if *commitErr != nil {
		return *commitErr
	}
	return err
}

// suppressed drops an email whose address the last check found suppressed
// (docs/api-contract.md §13).
func (w *Worker) suppressed(ctx context.Context, job model.OutboxEmail, log *slog.Logger) string {
	if err := w.outbox.Cancel(ctx, job.ID, "address suppressed"); err != nil {
		log.WarnContext(ctx, "cancelling email failed", errAttr(err))
	}
	log.InfoContext(ctx, "email dropped: the address is suppressed")
	return OutcomeSuppressed
}

// cancelled gives up on an email found no longer wanted.
func (w *Worker) cancelled(ctx context.Context, job model.OutboxEmail, log *slog.Logger) string {
	if err := w.outbox.Cancel(ctx, job.ID, "subscriber no longer pending or email superseded"); err != nil {
		log.WarnContext(ctx, "cancelling email failed", errAttr(err))
	}
	log.InfoContext(ctx, "email cancelled: no longer wanted")
	return OutcomeCancelled
}

// Backoff is the delay after the given failed attempt (1 for the first): RetryBase doubling
// per attempt up to RetryMax, less a random quarter of it, so that emails that failed together
// do not all come back together.
func (w *Worker) Backoff(attempt int) time.Duration {
	d := w.cfg.RetryBase
	for i := 1; i < attempt && d < w.cfg.RetryMax; i++ {
		d *= 2
	}
	return outbox.Jitter(min(d, w.cfg.RetryMax))
}

// errorType is the low-cardinality class of a failed attempt, for the span's error.type.
func errorType(err error) string {
	switch {
	case IsPermanent(err):
		return "permanent"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	return "transient"
}

// errAttr is err for the worker's log lines, with every email address in its text replaced
// (scrubAddresses): a delivery error quotes the recipient, both in the SMTP server's reply
// ("550 5.1.1 <ann@example.com>: no such user") and in the mail library's own words
// ("affected recipient(s): ann@example.com"), and subscribers' addresses stay out of logs as
// they stay out of traces. The outbox keeps the whole text, beside the address it already has.
// The library's "affected message ID: <id@host>" goes too; the line's outbox_id names it.
func errAttr(err error) slog.Attr {
	return slog.String("error", scrubAddresses(err.Error()))
}

// scrubbedAddress stands for an address scrubAddresses removed.
const scrubbedAddress = "[address]"

// scrubAddresses replaces each email address in s by scrubbedAddress: the run of bytes around
// an "@" up to a space, a double quote, a bracket, a comma, a semicolon or a colon on either
// side, none of which an unquoted address holds (an apostrophe or "=" may be in one, so text
// joined to an address by them goes with it). A quoted local part with spaces, which the API
// does not accept, would keep its quoted part.
func scrubAddresses(s string) string {
	if strings.IndexByte(s, '@') < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	last := 0 // s[:last] is written
	for i := 0; i < len(s); i++ {
		if s[i] != '@' {
			continue
		}
		start, end := i, i+1
		for start > last && !addressDelimiter(s[start-1]) {
			start--
		}
		for end < len(s) && !addressDelimiter(s[end]) {
			end++
		}
		b.WriteString(s[last:start])
		b.WriteString(scrubbedAddress)
		last, i = end, end-1
	}
	b.WriteString(s[last:])
	return b.String()
}

// addressDelimiter reports whether c cannot be part of an unquoted email address.
func addressDelimiter(c byte) bool {
	switch c {
	case ' ', '\t', '\r', '\n', '<', '>', '"', ',', ';', ':', '(', ')', '[', ']':
		return true
	}
	return false
}
