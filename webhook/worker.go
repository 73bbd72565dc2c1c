package webhook

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/subscriberd/subscriberd/internal/outage"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/outbox"
)

// Queue is the storage the worker needs: the webhook outbox. Several workers, in one process or
// many, may use one queue at once.
type Queue interface {
	// Claim leases up to endpoints endpoints with due deliveries for lease (one worker at a
	// time per endpoint, the one claimed longest ago first, at most perNewsletter of one
	// newsletter's at once) and returns up to perEndpoint due deliveries of each: its
	// interactive ones first, then its bulk ones (Delivery.Bulk), each lane oldest due first.
	Claim(ctx context.Context, endpoints, perEndpoint, perNewsletter int, lease time.Duration) ([]model.DeliveryBatch, error)
	// Extend renews the lease of endpoints the worker still delivers to (its heartbeat).
	Extend(ctx context.Context, endpoints []uuid.UUID, lease time.Duration) error
	// Finish records a batch's outcomes and ends the endpoint's lease; gone (410) disables the
	// endpoint, as do 5 days of failures. It reports whether the endpoint was disabled.
	Finish(ctx context.Context, endpoint uuid.UUID, results []model.DeliveryResult, gone bool) (bool, error)
}

// Recorder receives the worker's metrics: one call per attempt with its outcome
// (model.DeliveryDelivered, DeliveryRetry, DeliveryFailed) and duration; ctx holds the attempt's
// span, for exemplars.
type Recorder interface {
	WebhookDelivery(ctx context.Context, outcome string, d time.Duration)
}

type nopRecorder struct{}

func (nopRecorder) WebhookDelivery(context.Context, string, time.Duration) {}

// Config tunes a [Worker]. Zero values take the defaults named on each field.
type Config struct {
	Workers     int // endpoints delivered to at once (WEBHOOK_WORKERS); default DefaultWorkers
	PerEndpoint int // deliveries claimed per endpoint at once; default 100
	// PerEndpointParallel is how many of an endpoint's deliveries are in flight at once;
	// default 4. One worker serves an endpoint, so this bounds what one receiver gets.
	PerEndpointParallel int
	// PerNewsletter is how many of one newsletter's endpoints are delivered to at once;
	// default half of Workers (at least 1), so that a newsletter whose receivers all hang
	// leaves the other half of the workers to the other newsletters.
	PerNewsletter int
	Timeout       time.Duration // one attempt, answer included (WEBHOOK_TIMEOUT); default 10s
	// Lease is how long a claimed endpoint is hidden from other workers unless renewed; the
	// worker renews it every third of it while it delivers (outbox.Heartbeat), so a dead
	// worker's endpoints are taken over within it. Default outbox.DefaultLease.
	Lease time.Duration
	// Turn is how long one batch may keep starting attempts before the rest goes back to the
	// queue, so that a slow receiver's backlog does not keep a worker indefinitely; default 1m.
	Turn time.Duration
	// BulkTurn is how long one batch may keep starting attempts of the bulk lane (an import's,
	// a bulk action's) before the rest goes back, in its place, for the endpoint's next claim,
	// which takes the endpoint's interactive deliveries first (docs/api-contract.md §21). A
	// delivery of a single API call queued while a slow receiver works through a claim of
	// bulk deliveries so waits for at most BulkTurn of them, plus the attempts in flight,
	// however many are queued; a receiver that answers a claim of PerEndpoint within it never
	// sees the difference. Default 1s.
	BulkTurn     time.Duration
	PollInterval time.Duration // look for due deliveries this often without a wake-up; default 500ms
	// Coalesce is how long a worker waits before claiming again after a batch that was not
	// full, so that a steady stream of events goes out in batches rather than one claim and
	// one transaction for every few events; default 50ms. After a full batch it claims at once.
	Coalesce time.Duration
	// MaxAnswerBytes is how much of a receiver's answer is read (and discarded); default 64 KiB.
	MaxAnswerBytes int64
	// Guard is the SSRF rule applied to every address dialled.
	Guard Guard
	// Backoff is the delay after each failed attempt before jitter; default
	// model.WebhookBackoff. After the last, a delivery fails.
	Backoff []time.Duration

	// Wake, when not nil, is signalled when deliveries are queued.
	Wake <-chan struct{}
	// Recorder receives metrics; nil records nothing.
	Recorder Recorder
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// TracerProvider defaults to the global one.
	TracerProvider trace.TracerProvider
}

func (c *Config) defaults() {
	outbox.SetDefault(&c.Workers, DefaultWorkers)
	outbox.SetDefault(&c.PerEndpoint, 100)
	outbox.SetDefault(&c.PerEndpointParallel, 4)
	outbox.SetDefault(&c.Timeout, 10*time.Second)
	outbox.SetDefault(&c.PerNewsletter, max(c.Workers/2, 1))
	outbox.SetDefault(&c.Lease, outbox.DefaultLease)
	outbox.SetDefault(&c.Turn, time.Minute)
	outbox.SetDefault(&c.BulkTurn, time.Second)
	outbox.SetDefault(&c.PollInterval, 500*time.Millisecond)
	outbox.SetDefault(&c.Coalesce, 50*time.Millisecond)
	outbox.SetDefault(&c.MaxAnswerBytes, 64<<10)
	if len(c.Backoff) == 0 {
		c.Backoff = model.WebhookBackoff
	}
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

// DefaultWorkers is how many endpoints one process delivers to at once by default.
const DefaultWorkers = 8

// UserAgent is the User-Agent of every delivery.
const UserAgent = "subscriberd-webhooks/1"

// Worker delivers the webhook outbox until its context ends.
type Worker struct {
	queue  Queue
	cfg    Config
	client *http.Client
	log    *slog.Logger
	tracer trace.Tracer
	// claims logs failing claims (the database down) in a few lines, not one a poll.
	claims *outage.Log
	// receivers logs each endpoint whose deliveries fail, the same way.
	receivers receiverLogs
}

// ClaimOutage is what the webhook worker logs while it cannot claim due deliveries.
var ClaimOutage = outage.Messages{
	Start:   "claiming due webhooks failed",
	Summary: "claiming due webhooks still failing",
	End:     "claiming due webhooks works again",
}

// ReceiverOutage is what the worker logs while deliveries to one endpoint fail (its lines
// carry endpoint_id): the receiver is down, answers an error, or is not allowed.
var ReceiverOutage = outage.Messages{
	Start:   "webhook deliveries to an endpoint failing; retrying with back-off",
	Summary: "webhook deliveries to an endpoint still failing",
	End:     "webhook deliveries to an endpoint work again",
}

// receiverLogs holds the outage log of each endpoint whose deliveries are failing. An entry
// goes when a delivery succeeds or the endpoint is disabled; one of an endpoint deleted while
// failing stays, a few hundred bytes, until the process ends.
type receiverLogs struct {
	log  *slog.Logger
	mu   sync.Mutex
	down map[uuid.UUID]*outage.Log
}

// failed records a failed attempt to the endpoint: its first starts the endpoint's outage.
func (r *receiverLogs) failed(ctx context.Context, endpoint uuid.UUID, res model.DeliveryResult) {
	r.mu.Lock()
	o := r.down[endpoint]
	if o == nil {
		if r.down == nil {
			r.down = map[uuid.UUID]*outage.Log{}
		}
		o = outage.New(r.log.With(slog.String("endpoint_id", endpoint.String())), ReceiverOutage, 0, nil)
		r.down[endpoint] = o
	}
	r.mu.Unlock()
	o.Failed(ctx, errors.New(res.Error)) // describe's text: the URL is never in it
}

// delivered records a delivery to the endpoint: it ends the endpoint's outage, if any.
func (r *receiverLogs) delivered(ctx context.Context, endpoint uuid.UUID) {
	if o := r.forget(endpoint); o != nil {
		o.OK(ctx)
	}
}

// forget drops the endpoint's outage log (it was disabled, or delivered) and returns it.
func (r *receiverLogs) forget(endpoint uuid.UUID) *outage.Log {
	r.mu.Lock()
	defer r.mu.Unlock()
	o := r.down[endpoint]
	delete(r.down, endpoint)
	return o
}

// NewWorker returns a worker that claims deliveries from q.
func NewWorker(q Queue, cfg Config) *Worker {
	cfg.defaults()
	dialer := &net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second, Control: cfg.Guard.control}
	transport := &http.Transport{
		Proxy:                  nil, // a proxy would dial for us, past the guard
		DialContext:            dialer.DialContext,
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           100,
		MaxIdleConnsPerHost:    cfg.PerEndpointParallel,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    cfg.Timeout,
		ResponseHeaderTimeout:  cfg.Timeout,
		MaxResponseHeaderBytes: 64 << 10,
	}
	log := cfg.Logger.With(slog.String("component", "webhook_worker"))
	return &Worker{
		queue: q, cfg: cfg, claims: outage.New(log, ClaimOutage, 0, nil), receivers: receiverLogs{log: log},
		client: &http.Client{Transport: transport,
			// Redirects are not followed (docs/api-contract.md §10.4): a 3xx is a failed attempt.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		log:    log,
		tracer: cfg.TracerProvider.Tracer("github.com/subscriberd/subscriberd/webhook"),
	}
}

// Run delivers due webhooks until ctx ends, then returns nil once the attempts in hand are
// finished and the rest of their batches handed back. A batch that ends frees its worker; it
// looks for due work at once when the batch was full or every worker was busy, else after
// Coalesce.
func (w *Worker) Run(ctx context.Context) error {
	kick := make(chan struct{}, 1)
	signal := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	if w.cfg.Wake != nil {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-w.cfg.Wake:
					signal()
				}
			}
		}()
	}
	var busy atomic.Int64
	var wg sync.WaitGroup
	outbox.Loop(ctx, kick, w.cfg.PollInterval, func() bool {
		free := w.cfg.Workers - int(busy.Load())
		if free <= 0 {
			return false // a batch ending kicks the loop
		}
		batches, err := w.claim(ctx, free)
		w.claims.Record(ctx, err)
		// Every free worker got an endpoint: more may be due, for the next one to free.
		crowded := len(batches) == free
		for _, b := range batches {
			busy.Add(1)
			wg.Go(func() {
				w.deliverBatch(ctx, b)
				busy.Add(-1)
				if crowded || len(b.Deliveries) == w.cfg.PerEndpoint {
					signal()
				} else {
					time.AfterFunc(w.cfg.Coalesce, signal)
				}
			})
		}
		return false
	})
	wg.Wait()
	return nil
}

// claim claims the batches of up to n endpoints, under outbox.ClaimContext; none once ctx has
// ended. A claim that returns after a stop is handed back at once by deliverBatch, which
// starts nothing then.
func (w *Worker) claim(ctx context.Context, n int) ([]model.DeliveryBatch, error) {
	cctx, cancel, ok := outbox.ClaimContext(ctx, w.cfg.Lease)
	defer cancel()
	if !ok {
		return nil, nil
	}
	return w.queue.Claim(cctx, n, w.cfg.PerEndpoint, w.cfg.PerNewsletter, w.cfg.Lease)
}

// RunOnce claims one round of endpoints, delivers their batches in parallel and waits for them;
// it reports how many deliveries it attempted or released.
func (w *Worker) RunOnce(ctx context.Context) (int, error) {
	batches, err := w.claim(ctx, w.cfg.Workers)
	if err != nil {
		return 0, err
	}
	done := make(chan struct{})
	n := 0
	for _, b := range batches {
		n += len(b.Deliveries)
		go func() {
			w.deliverBatch(ctx, b)
			done <- struct{}{}
		}()
	}
	for range batches {
		<-done
	}
	return n, nil
}

// deliverBatch delivers one endpoint's batch, up to PerEndpointParallel at a time, and records
// the outcomes. After a failed attempt no more are started and the rest of the batch is handed
// back for a few seconds, so a receiver that is down costs one attempt at a time; so is
// whatever is not started within Turn, the bulk deliveries not started within BulkTurn, and, on
// shutdown, whatever was not started. A heartbeat renews the endpoint's lease until the
// outcomes are recorded.
func (w *Worker) deliverBatch(ctx context.Context, b model.DeliveryBatch) {
	start := time.Now()
	deadline, bulkDeadline := start.Add(w.cfg.Turn), start.Add(w.cfg.BulkTurn)
	hb := outbox.StartHeartbeat(ctx, w.cfg.Lease, func(ctx context.Context, ids []uuid.UUID) error {
		return w.queue.Extend(ctx, ids, w.cfg.Lease)
	}, func(ctx context.Context, _ int, err error) {
		// Not lost: the next beat tries again; when the lease ends another worker may
		// deliver what this one is delivering, at worst twice.
		w.log.WarnContext(ctx, "renewing the lease of a webhook endpoint failed",
			slog.String("endpoint_id", b.EndpointID.String()), slog.String("error", err.Error()))
	}, b.EndpointID)
	defer hb.Stop()
	results := make([]model.DeliveryResult, len(b.Deliveries))
	var failed atomic.Bool
	var wg sync.WaitGroup
	sem := make(chan struct{}, w.cfg.PerEndpointParallel)
	started := 0
	for _, d := range b.Deliveries {
		sem <- struct{}{}
		// The batch holds the interactive deliveries first (Queue.Claim): from the first bulk
		// one past BulkTurn on, the rest is bulk work, and goes back. The first attempt is
		// always made, so that every claim moves the queue on.
		now := time.Now()
		if ctx.Err() != nil || failed.Load() || !now.Before(deadline) || (d.Bulk && started > 0 && !now.Before(bulkDeadline)) {
			<-sem
			break
		}
		i := started
		started++
		wg.Go(func() {
			defer func() { <-sem }()
			results[i] = w.attempt(ctx, b, d)
			if results[i].Outcome != model.DeliveryDelivered {
				failed.Store(true)
			}
		})
	}
	wg.Wait()
	gone, delivered := false, false
	for _, r := range results[:started] {
		gone = gone || r.Status == http.StatusGone
		delivered = delivered || r.Outcome == model.DeliveryDelivered
	}
	if delivered {
		w.receivers.delivered(ctx, b.EndpointID)
	}
	for _, r := range results[:started] {
		if r.Outcome != model.DeliveryDelivered {
			w.receivers.failed(ctx, b.EndpointID, r)
		}
	}
	var delay time.Duration
	if failed.Load() {
		delay = outbox.Jitter(w.cfg.Backoff[0])
	}
	results = release(results[:started], b.Deliveries[started:], delay)
	hb.Drop(b.EndpointID) // Finish ends the lease
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	disabled, err := w.queue.Finish(fctx, b.EndpointID, results, gone)
	log := w.log.With(slog.String("endpoint_id", b.EndpointID.String()))
	switch {
	case err != nil:
		// Not lost: the lease ends and the deliveries come back (some may go out twice).
		log.WarnContext(ctx, "recording webhook outcomes failed", slog.String("error", err.Error()))
	case disabled:
		w.receivers.forget(b.EndpointID)
		log.WarnContext(ctx, "webhook endpoint disabled", slog.Bool("gone", gone))
	}
}

func release(results []model.DeliveryResult, rest []model.Delivery, delay time.Duration) []model.DeliveryResult {
	for _, d := range rest {
		results = append(results, model.DeliveryResult{EventID: d.EventID, Outcome: model.DeliveryReleased, Delay: delay})
	}
	return results
}

// attempt posts one event to the endpoint, in a span linked to the request that caused it.
func (w *Worker) attempt(parent context.Context, b model.DeliveryBatch, d model.Delivery) model.DeliveryResult {
	start := time.Now()
	attempt := d.Attempts + 1
	// The attempt runs to its end on shutdown, bounded by the timeout.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), w.cfg.Timeout)
	defer cancel()
	opts := []trace.SpanStartOption{
		trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("subscriberd.webhook.endpoint_id", b.EndpointID.String()),
			attribute.String("subscriberd.webhook.event_id", d.EventID.String()),
			attribute.String("subscriberd.webhook.event_type", string(d.Type)),
			attribute.Int("subscriberd.webhook.attempt", attempt),
		),
	}
	opts = append(opts, outbox.Link(d.Traceparent)...)
	ctx, span := w.tracer.Start(ctx, "webhook.deliver", opts...)
	r := w.post(ctx, b, d)
	r.EventID = d.EventID
	if r.Outcome != model.DeliveryDelivered {
		switch {
		case r.Status == http.StatusGone:
			r.Outcome = model.DeliveryFailed
		case attempt > len(w.cfg.Backoff):
			r.Outcome = model.DeliveryFailed
		default:
			r.Outcome = model.DeliveryRetry
			if r.Delay <= 0 { // no Retry-After
				r.Delay = outbox.Jitter(w.cfg.Backoff[attempt-1])
			}
		}
	}
	span.SetAttributes(attribute.String("subscriberd.webhook.outcome", r.Outcome))
	if r.Status != 0 {
		span.SetAttributes(attribute.Int("http.response.status_code", r.Status))
	}
	if r.Outcome != model.DeliveryDelivered {
		span.SetStatus(codes.Error, r.Outcome)
		if r.Status == 0 {
			span.SetAttributes(attribute.String("error.type", errorType(ctx)))
		}
	}
	span.End()
	w.cfg.Recorder.WebhookDelivery(ctx, r.Outcome, time.Since(start))
	return r
}

// post sends the signed request and reads at most MaxAnswerBytes of the answer. The result
// has Outcome DeliveryDelivered for a 2xx, else the status (0 without an answer), the
// error, and the Retry-After delay the receiver asked for (0 when none).
func (w *Worker) post(ctx context.Context, b model.DeliveryBatch, d model.Delivery) model.DeliveryResult {
	id := d.EventID.String()
	ts := time.Now().Unix()
	sig, err := Sign(b.Secret, id, ts, d.Payload)
	if err != nil {
		return model.DeliveryResult{Error: err.Error()}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.URL, bytes.NewReader(d.Payload))
	if err != nil {
		return model.DeliveryResult{Error: "invalid url"}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", UserAgent)
	req.Header.Set(standardwebhooks.HeaderWebhookID, id)
	req.Header.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(standardwebhooks.HeaderWebhookSignature, sig)
	res, err := w.client.Do(req)
	if err != nil {
		return model.DeliveryResult{Error: describe(err)}
	}
	// The status is the answer: the body is read only so far, then dropped (a body cut short
	// after a 2xx changes nothing).
	io.Copy(io.Discard, io.LimitReader(res.Body, w.cfg.MaxAnswerBytes)) //nolint:errcheck // see above
	res.Body.Close()
	out := model.DeliveryResult{Status: res.StatusCode}
	switch {
	case res.StatusCode >= 200 && res.StatusCode < 300:
		out.Outcome = model.DeliveryDelivered
	default:
		out.Error = "HTTP " + strconv.Itoa(res.StatusCode)
		out.Delay = retryAfter(res.Header.Get("Retry-After"), time.Now())
	}
	return out
}

// maxRetryAfter bounds the delay a receiver may ask for, to the longest back-off step.
const maxRetryAfter = 10 * time.Hour

// retryAfter reads a Retry-After value (seconds or an HTTP date) as a delay of at least a
// second and at most maxRetryAfter; 0 when there is none or it cannot be read.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	var d time.Duration
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0
		}
		d = time.Duration(min(n, int64(maxRetryAfter/time.Second))) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	} else {
		return 0
	}
	return min(max(d, time.Second), maxRetryAfter)
}

// describe is a failed request's error for the outbox and logs, without the URL the client
// quotes (a receiver may put a token of its own in it).
func describe(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if errors.Is(err, ErrPrivateAddress) {
		return ErrPrivateAddress.Error()
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return "timeout: no answer in time"
	}
	return outbox.Truncate(err.Error(), 500)
}

// errorType is the class of an attempt without an answer, for the span's error.type.
func errorType(ctx context.Context) string {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return "timeout"
	}
	return "transport"
}
