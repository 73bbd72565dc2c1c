package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/subscriberd/subscriberd/cmd/subscriber-bench/svc"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
)

// Segments and bulk actions (docs/api-contract.md §20, §21), on the newsletter right after the
// million-row import and its §19 reads (tags.go): segment_count (GET /segments/{id} of the 1 %
// that hold svc.FilteredTag) against the service's own count statement run bare, then
// bulk_tag_1m: a tag added by POST /bulk-actions to a segment of the imported rows, timed from
// the POST until the action completed. While it runs, and while the 10 %-pending import
// variant queues its confirmation emails, one pending subscriber is created in another
// newsletter (-webhook-plain-key's), and its confirmation email is timed to this tool's SMTP
// receiver (-smtp-receiver, the service's SMTP_URL) and its webhook delivery to a receiver of
// its own.
const (
	BulkTagScenario  = "bulk_tag_1m"
	baseSegmentCount = "segment_count_sql"
	// bulkTag is the tag bulk_tag_1m adds.
	bulkTag = "bulk-1m"
	// Targets: bulk_tag_1m in at most 60 s with a peak RSS under 128 MiB (§20.2); a single
	// create's email and delivery within 5 s plus the receiver's own time (§21), which is nil
	// here: both receivers answer at once.
	bulkTargetSeconds   = 60
	bulkTargetRSSMiB    = 128
	singleTargetSeconds = 5
)

// BulkRecord is bulk_tag_1m's result.
type BulkRecord struct {
	Matched    int64   `json:"matched"`
	Changed    int64   `json:"changed"`
	Seconds    float64 `json:"seconds"`
	PeakRSSMiB float64 `json:"peak_rss_mib,omitempty"`
}

func (r *BulkRecord) met() bool {
	return r.Seconds <= bulkTargetSeconds && r.PeakRSSMiB < bulkTargetRSSMiB
}

// SingleRecord is one pending subscriber created in another newsletter during bulk work: the
// seconds from its POST until its confirmation email reached the SMTP receiver and its
// webhook delivery the webhook receiver (nil: not measured).
type SingleRecord struct {
	During string `json:"during"`
	// Queued is how many emails the bulk lane held pending at the create (-1: unknown).
	Queued          int64    `json:"bulk_emails_queued"`
	EmailSeconds    *float64 `json:"email_seconds,omitempty"`
	DeliverySeconds *float64 `json:"delivery_seconds,omitempty"`
	// Overlapped tells whether the bulk work still went on when both had arrived.
	Overlapped bool   `json:"overlapped"`
	Problem    string `json:"problem,omitempty"`
}

func (r *SingleRecord) met() bool {
	ok := r.Problem == "" && (r.EmailSeconds != nil || r.DeliverySeconds != nil)
	for _, s := range []*float64{r.EmailSeconds, r.DeliverySeconds} {
		ok = ok && (s == nil || *s <= singleTargetSeconds)
	}
	return ok
}

// runBulk runs segment_count and bulk_tag_1m on the newsletter the import filled, whose rows
// were created after since, and VACUUMs after the action so that the variants after it do not
// pay for its million dead rows.
func (b *bench) runBulk(ctx context.Context, since time.Time) error {
	cl, name := b.client, "bench "+b.cfg.runID
	seg, err := cl.CreateSegment(ctx, name+" 1 %", map[string]any{"tags": []string{svc.FilteredTag}})
	if err != nil {
		return fmt.Errorf("%s: %w", svc.SegmentCount, err)
	}
	cl.SetSegment(seg)
	b.runService(ctx, svc.SegmentCount, b.cfg.clients, b.cfg.warmup, b.cfg.duration, "measure", 0)
	if b.base != nil {
		query, args := repo.SegmentCountPostgres(b.base.Newsletter, model.Filter{Tags: []string{svc.FilteredTag}})
		b.runBaselineScenario(ctx, b.base.Statement(baseSegmentCount, "the service's own count of "+svc.SegmentCount+", run bare", query, args...), b.cfg.clients, 0)
		ex, err := b.explain(ctx, svc.SegmentCount, query, args)
		if err != nil {
			return err
		}
		if b.rep.Tags != nil {
			b.rep.Tags.Explains = append(b.rep.Tags.Explains, ex)
		}
	}

	imported, err := cl.CreateSegment(ctx, name+" import", map[string]any{"status": "active", "created_after": since.UTC().Format(time.RFC3339Nano)})
	if err != nil {
		return fmt.Errorf("%s: %w", BulkTagScenario, err)
	}
	single, err := b.startSingles(ctx)
	if err != nil {
		return err
	}
	defer single.close()
	var running, finished atomic.Bool
	stopRSS := b.sampleRSS()
	start := time.Now()
	id, err := cl.StartBulkAction(ctx, map[string]any{"action": "add_tags", "tags": []string{bulkTag}, "segment": imported})
	if err != nil {
		stopRSS()
		return fmt.Errorf("%s: %w", BulkTagScenario, err)
	}
	wait := b.singleDuring(ctx, single, BulkTagScenario, running.Load, func() bool { return !finished.Load() })
	var a svc.BulkAction
	for a.State != "completed" {
		time.Sleep(200 * time.Millisecond)
		if a, err = cl.GetBulkAction(ctx, id); err == nil && a.State == "cancelled" {
			err = fmt.Errorf("cancelled after %d", a.Counts.Processed)
		}
		if err != nil {
			stopRSS()
			wait()
			return fmt.Errorf("%s: %w", BulkTagScenario, err)
		}
		// matched is fixed once the worker has selected the targets: its batches run.
		running.Store(a.State == "running" && a.Counts.Matched > 0)
	}
	finished.Store(true)
	rec := &BulkRecord{Matched: a.Counts.Matched, Changed: a.Counts.Changed, Seconds: time.Since(start).Seconds(), PeakRSSMiB: stopRSS()}
	b.rep.Bulk = rec
	fmt.Fprintf(b.log, "%s: %d matched, %d changed in %.1fs (target ≤ %d s), peak RSS %.0f MiB (target < %d MiB)\n",
		BulkTagScenario, rec.Matched, rec.Changed, rec.Seconds, bulkTargetSeconds, rec.PeakRSSMiB, bulkTargetRSSMiB)
	b.addSingle(wait())
	return b.vacuumTables(ctx)
}

// singles is what a single create needs: a client of the other newsletter, and a receiver of
// that newsletter's webhook endpoint (nil when the service refused it).
type singles struct {
	client *svc.Client
	hook   *receiver
	remove func()
}

// startSingles prepares the single creates in the -webhook-plain-key newsletter, with a webhook
// endpoint there for their deliveries; nil without the key.
func (b *bench) startSingles(ctx context.Context) (*singles, error) {
	if b.cfg.webhookPlainKey == "" {
		fmt.Fprintln(b.log, "note: no single create during bulk work: it needs -webhook-plain-key, another newsletter's key")
		return nil, nil
	}
	s := &singles{client: svc.NewClient(b.cfg.url, b.cfg.webhookPlainKey, b.cfg.runID+"-single", 2, b.cfg.timeout), remove: func() {}}
	rc, err := startReceiver(b.cfg.webhookReceiver)
	if err != nil {
		return nil, err
	}
	id, err := s.client.CreateWebhook(ctx, rc.url)
	if err != nil {
		rc.Close()
		fmt.Fprintf(b.log, "note: a single create's webhook delivery not measured: %v\n", err)
		return s, nil
	}
	s.hook = rc
	s.remove = func() {
		if err := s.client.DeleteWebhook(context.WithoutCancel(ctx), id); err != nil {
			fmt.Fprintf(b.log, "note: deleting the single creates' webhook endpoint: %v\n", err)
		}
		rc.Close()
	}
	return s, nil
}

func (s *singles) close() {
	if s != nil {
		s.remove()
	}
}

// singleDuring creates, in the background, one pending subscriber with s once ready holds (or
// once the returned function is called, whichever comes first), and returns the function that
// waits, up to -drain-timeout, for its email and its delivery and returns the record; busy
// tells, once both arrived, whether the bulk work went on.
func (b *bench) singleDuring(ctx context.Context, s *singles, during string, ready, busy func() bool) func() SingleRecord {
	if s == nil {
		return func() SingleRecord { return SingleRecord{} }
	}
	stop, done := make(chan struct{}), make(chan SingleRecord, 1)
	go func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
	poll:
		for !ready() {
			select {
			case <-stop:
				break poll
			case <-t.C:
			}
		}
		done <- b.single(ctx, s, during, busy)
	}()
	return func() SingleRecord {
		close(stop)
		return <-done
	}
}

// single creates one pending subscriber with s and times its email and delivery.
func (b *bench) single(ctx context.Context, s *singles, during string, busy func() bool) SingleRecord {
	rec := SingleRecord{During: during, Queued: b.bulkEmailsQueued(ctx)}
	email := fmt.Sprintf("single-%s-%d@bench.example.com", strings.ToLower(b.cfg.runID), time.Now().UnixNano())
	var mail <-chan time.Time
	if b.smtp != nil {
		mail = b.smtp.watch(email)
		defer b.smtp.unwatch(email)
	}
	var before int64
	if s.hook != nil {
		before = s.hook.n.Load()
	}
	t0 := time.Now()
	if _, err := s.client.CreatePending(ctx, email); err != nil {
		rec.Problem = "the create failed: " + err.Error()
		return rec
	}
	since := func(t time.Time) *float64 { v := t.Sub(t0).Seconds(); return &v }
	for deadline := t0.Add(b.cfg.drain); ctx.Err() == nil; time.Sleep(20 * time.Millisecond) {
		select {
		case at := <-mail:
			rec.EmailSeconds, mail = since(at), nil
		default:
		}
		if s.hook != nil && rec.DeliverySeconds == nil && s.hook.n.Load() > before {
			rec.DeliverySeconds = since(time.Unix(0, s.hook.last.Load()))
		}
		if (mail == nil) && (s.hook == nil || rec.DeliverySeconds != nil) {
			break
		}
		if time.Now().After(deadline) {
			var late []string
			if mail != nil {
				late = append(late, "its email")
			}
			if s.hook != nil && rec.DeliverySeconds == nil {
				late = append(late, "its webhook delivery")
			}
			rec.Problem = fmt.Sprintf("%s not received within %s", strings.Join(late, " and "), b.cfg.drain)
			break
		}
	}
	rec.Overlapped = busy()
	return rec
}

// addSingle keeps a single create's record and logs it.
func (b *bench) addSingle(r SingleRecord) {
	if r.During == "" {
		return
	}
	b.rep.Singles = append(b.rep.Singles, r)
	fmt.Fprintf(b.log, "single create during %s (%d bulk emails queued): email %s s, webhook delivery %s s (target ≤ %d s)%s %s\n",
		r.During, r.Queued, secs(r.EmailSeconds), secs(r.DeliverySeconds), singleTargetSeconds, map[bool]string{false: "; the bulk work had ended"}[r.Overlapped], r.Problem)
}

func secs(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f", *v)
}

// bulkEmailsQueued is how many emails of the bulk lane (imports, bulk actions) are pending, or
// -1 without a database.
func (b *bench) bulkEmailsQueued(ctx context.Context) int64 {
	n := int64(-1)
	if b.db != nil {
		_ = b.db.NewRaw("SELECT count(*) FROM email_outbox WHERE state = 'pending' AND lane = 1").Scan(ctx, &n)
	}
	return n
}

// smtpReceiver is the tool's SMTP server (-smtp-receiver, the service's SMTP_URL): it accepts
// and discards every message at once, counts them, and tells when one reaches a watched
// recipient.
type smtpReceiver struct {
	addr    string
	srv     *smtp.Server
	n       atomic.Int64
	mu      sync.Mutex
	watched map[string]chan time.Time
}

func startSMTP(addr string) (*smtpReceiver, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-smtp-receiver: %w", err)
	}
	r := &smtpReceiver{addr: ln.Addr().String(), watched: map[string]chan time.Time{}}
	r.srv = smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) { return &smtpSession{r: r}, nil }))
	r.srv.Domain = "localhost"
	r.srv.ReadTimeout, r.srv.WriteTimeout = time.Minute, time.Minute
	go r.srv.Serve(ln) //nolint:errcheck // ends with Close
	return r, nil
}

// watch returns the channel that receives the time a message to addr is accepted.
func (r *smtpReceiver) watch(addr string) <-chan time.Time {
	ch := make(chan time.Time, 1)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.watched[strings.ToLower(addr)] = ch
	return ch
}

func (r *smtpReceiver) unwatch(addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.watched, strings.ToLower(addr))
}

type smtpSession struct {
	r  *smtpReceiver
	to []string
}

func (x *smtpSession) Mail(string, *smtp.MailOptions) error { return nil }

func (x *smtpSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	x.to = append(x.to, to)
	return nil
}

func (x *smtpSession) Data(r io.Reader) error {
	if _, err := io.Copy(io.Discard, r); err != nil {
		return err
	}
	now := time.Now()
	x.r.n.Add(1)
	x.r.mu.Lock()
	defer x.r.mu.Unlock()
	for _, to := range x.to {
		if ch, ok := x.r.watched[strings.ToLower(to)]; ok {
			select {
			case ch <- now:
			default:
			}
		}
	}
	return nil
}

func (x *smtpSession) Reset()        { x.to = nil }
func (x *smtpSession) Logout() error { return nil }

// bulkMarkdown is the segments and bulk actions section: segment_count against its bare
// count, bulk_tag_1m, and the single creates during bulk work.
func bulkMarkdown(w io.Writer, rep *Report) {
	if rep.comparison(svc.SegmentCount) == nil && rep.Bulk == nil && len(rep.Singles) == 0 {
		return
	}
	fmt.Fprintf(w, "\nSegments and bulk actions (§20, §21), on the newsletter after the import and the reads above. "+
		"segment_count reads a segment of the 1 %% that hold `%s` with its exact member count, against the service's own "+
		"count statement run bare at the same concurrency (at most 1.5 × is a ratio of at least 0.67).\n\n", svc.FilteredTag)
	tableHead(w)
	comparisonRow(w, rep, svc.SegmentCount)
	if rep.Tags != nil {
		for _, ex := range rep.Tags.Explains {
			if ex.Scenario == svc.SegmentCount {
				explainMarkdown(w, ex)
			}
		}
	}
	if r := rep.Bulk; r != nil {
		fmt.Fprintf(w, "\n%s: tag `%s` added by one bulk action to a segment of the imported rows (status active, created "+
			"after the import began): %d matched, %d changed in %.1f s, peak RSS %.0f MiB (targets ≤ %d s, < %d MiB): %s.\n",
			BulkTagScenario, bulkTag, r.Matched, r.Changed, r.Seconds, r.PeakRSSMiB, bulkTargetSeconds, bulkTargetRSSMiB, metWord(r.met()))
	}
	if len(rep.Singles) == 0 {
		return
	}
	fmt.Fprintf(w, "\nA single create during bulk work: one pending subscriber created in another newsletter, timed from its "+
		"POST until its confirmation email reached this tool's SMTP receiver and its webhook delivery a receiver of its "+
		"own, both answering at once (target ≤ %d s each, §21).\n\n", singleTargetSeconds)
	fmt.Fprintln(w, "| during | bulk emails queued | email s | delivery s | still running | target | verdict |")
	fmt.Fprintln(w, "|---|--:|--:|--:|---|---|---|")
	for _, r := range rep.Singles {
		verdict := metWord(r.met())
		if r.Problem != "" {
			verdict += ": " + r.Problem
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | ≤ %d s | %s |\n", r.During, r.Queued, secs(r.EmailSeconds), secs(r.DeliverySeconds),
			map[bool]string{true: "yes", false: "no"}[r.Overlapped], singleTargetSeconds, verdict)
	}
}
