package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
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

// memQueue is a Queue of one batch, recording what Finish was told.
type memQueue struct {
	mu       sync.Mutex
	batches  []model.DeliveryBatch
	finished [][]model.DeliveryResult
	gone     bool
	failing  int // claims to fail before the next succeeds
	claims   int // claims asked for
	extended int // lease renewals
	// endedAt is when Finish ended the lease; lastExtend when it was last renewed.
	endedAt, lastExtend time.Time
}

func (q *memQueue) Claim(context.Context, int, int, int, time.Duration) ([]model.DeliveryBatch, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.claims++
	if q.failing > 0 {
		q.failing--
		return nil, errors.New("database down")
	}
	b := q.batches
	q.batches = nil
	return b, nil
}

func (q *memQueue) Extend(context.Context, []uuid.UUID, time.Duration) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.extended++
	q.lastExtend = time.Now()
	return nil
}

func (q *memQueue) Finish(_ context.Context, _ uuid.UUID, r []model.DeliveryResult, gone bool) (bool, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.endedAt = time.Now()
	q.finished = append(q.finished, r)
	q.gone = q.gone || gone
	return gone, nil
}

type recorder struct {
	mu       sync.Mutex
	outcomes []string
}

func (r *recorder) WebhookDelivery(_ context.Context, outcome string, _ time.Duration) {
	r.mu.Lock()
	r.outcomes = append(r.outcomes, outcome)
	r.mu.Unlock()
}

// TestClaimFailuresAreOneOutage: claims that fail (the database down) are logged as one
// outage, a line when it starts and one when it ends, not a line a poll.
func TestClaimFailuresAreOneOutage(t *testing.T) {
	var logs bytes.Buffer
	var logsMu sync.Mutex
	q := &memQueue{failing: 5}
	w := NewWorker(q, Config{PollInterval: time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(lockedWriter{&logs, &logsMu}, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx) }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		q.mu.Lock()
		n := q.claims
		q.mu.Unlock()
		if n > 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d claims in 10 s", n)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
	logsMu.Lock()
	defer logsMu.Unlock()
	got := logs.String()
	if strings.Count(got, "claiming due webhooks failed") != 1 || strings.Count(got, "claiming due webhooks works again") != 1 ||
		!strings.Contains(got, "failures=5") {
		t.Errorf("want one line at the first failure and one, counting 5, at the first success:\n%s", got)
	}
}

// TestFailingReceiverIsOneOutage: deliveries to an endpoint that fail are logged as one
// outage of that endpoint, with its id and the failure but not its URL, and its end.
func TestFailingReceiverIsOneOutage(t *testing.T) {
	srv := scriptedReceiver(t, 500, 500, 204)
	var logs bytes.Buffer
	q := &memQueue{}
	w := NewWorker(q, Config{Guard: Guard{AllowPrivate: true}, PerEndpointParallel: 1,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	endpoint := uuid.New()
	url := srv.URL + "/hook?token=receiver-secret"
	for range 3 {
		q.batches = []model.DeliveryBatch{{EndpointID: endpoint, URL: url, Secret: model.NewWebhookSecret(),
			Deliveries: []model.Delivery{{EventID: uuid.New(), Type: model.EventCreated, Payload: []byte(`{}`)}}}}
		if _, err := w.RunOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	got := logs.String()
	if strings.Count(got, "webhook deliveries to an endpoint failing") != 1 || !strings.Contains(got, "HTTP 500") ||
		strings.Count(got, "webhook deliveries to an endpoint work again") != 1 || !strings.Contains(got, "failures=2") ||
		strings.Count(got, "endpoint_id="+endpoint.String()) != 2 || strings.Contains(got, "receiver-secret") {
		t.Errorf("want one line when the endpoint starts failing and one, counting 2, when it delivers again, "+
			"with its id and without its URL:\n%s", got)
	}
}

// TestPartialBatchWaitsBeforeClaiming: after a batch that was not full the worker waits
// Coalesce before claiming again, so that a steady stream goes out in batches; after a full
// one it claims again at once, as more is likely due.
func TestPartialBatchWaitsBeforeClaiming(t *testing.T) {
	srv := scriptedReceiver(t, 204, 204)
	for _, full := range []bool{false, true} {
		t.Run(fmt.Sprintf("full=%v", full), func(t *testing.T) {
			q := &memQueue{batches: []model.DeliveryBatch{{EndpointID: uuid.New(), URL: srv.URL, Secret: model.NewWebhookSecret(),
				Deliveries: []model.Delivery{{EventID: uuid.New(), Type: model.EventCreated, Payload: []byte(`{}`)}}}}}
			per := 2
			if full {
				per = 1
			}
			w := NewWorker(q, Config{Guard: Guard{AllowPrivate: true}, Workers: 2, PerEndpoint: per,
				PollInterval: time.Hour, Coalesce: time.Hour})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go w.Run(ctx) //nolint:errcheck // ends with ctx
			claims := func() int {
				q.mu.Lock()
				defer q.mu.Unlock()
				if len(q.finished) == 0 {
					return 0
				}
				return q.claims
			}
			deadline := time.Now().Add(10 * time.Second)
			for claims() == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if full {
				for claims() < 2 && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
				if n := claims(); n != 2 {
					t.Errorf("after a full batch: %d claims, want a second at once", n)
				}
				return
			}
			time.Sleep(200 * time.Millisecond)
			if n := claims(); n != 1 {
				t.Errorf("after a batch that was not full: %d claims, want 1 until Coalesce has passed", n)
			}
		})
	}
}

// scriptedReceiver is a webhook receiver on loopback answering its requests with statuses,
// in order.
func scriptedReceiver(t *testing.T, statuses ...int) *httptest.Server {
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		code := statuses[0]
		statuses = statuses[1:]
		mu.Unlock()
		w.WriteHeader(code)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// lockedWriter serialises writes to a buffer that a test reads.
type lockedWriter struct {
	b  *bytes.Buffer
	mu *sync.Mutex
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// TestAttemptSpanLinksTheCausingRequest: each attempt is a span of its own, linked to the
// request's trace, with the outcome and without the secret; the log has no secret either.
func TestAttemptSpanLinksTheCausingRequest(t *testing.T) {
	srv := scriptedReceiver(t, 500, 204, 204, 410)
	secret := model.NewWebhookSecret()
	cause := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5},
		TraceFlags: trace.FlagsSampled})
	tp := fmt.Sprintf("00-%s-%s-01", cause.TraceID(), cause.SpanID())
	batch := func() model.DeliveryBatch {
		return model.DeliveryBatch{EndpointID: uuid.New(), URL: srv.URL, Secret: secret, Deliveries: []model.Delivery{
			{EventID: uuid.New(), Type: model.EventCreated, Payload: []byte(`{}`), Traceparent: tp},
			{EventID: uuid.New(), Type: model.EventUpdated, Payload: []byte(`{}`), Traceparent: tp}}}
	}
	sr := tracetest.NewSpanRecorder()
	var logs bytes.Buffer
	rec := &recorder{}
	q := &memQueue{}
	w := NewWorker(q, Config{Guard: Guard{AllowPrivate: true}, Recorder: rec, PerEndpointParallel: 1,
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr)),
		Logger:         slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	for range 3 {
		q.batches = []model.DeliveryBatch{batch()}
		if _, err := w.RunOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	spans := sr.Ended()
	if len(spans) != 4 {
		t.Fatalf("%d spans, want one per attempt (4)", len(spans))
	}
	for _, s := range spans {
		if s.Name() != "webhook.deliver" || len(s.Links()) != 1 || s.Links()[0].SpanContext.TraceID() != cause.TraceID() {
			t.Errorf("span %s links %v", s.Name(), s.Links())
		}
		if s.Parent().IsValid() {
			t.Errorf("span has a parent; want a new root linked to the request")
		}
		for _, a := range s.Attributes() {
			if strings.Contains(a.Value.String(), strings.TrimPrefix(secret, "whsec_")) {
				t.Errorf("span attribute %s holds the secret", a.Key)
			}
		}
	}
	if got := fmt.Sprint(rec.outcomes); got != "[retry delivered delivered failed]" {
		t.Errorf("outcomes %s", got)
	}
	// The first batch: 500 → retry, the second delivery released (not attempted).
	if r := q.finished[0]; r[0].Outcome != model.DeliveryRetry || r[1].Outcome != model.DeliveryReleased {
		t.Errorf("first batch %+v", r)
	}
	if !q.gone {
		t.Error("410 did not report the endpoint gone")
	}
	if strings.Contains(logs.String(), strings.TrimPrefix(secret, "whsec_")) {
		t.Error("the log holds the secret")
	}
}

// BenchmarkDeliverBatch delivers batches of 100 events to a receiver that answers 204 at
// once, with every attempt's span recorded: the service's CPU and allocations per event
// (the in-process receiver's are included, the same before and after a change).
func BenchmarkDeliverBatch(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	tp := "00-0102030405060708090a0b0c0d0e0f10-0102030405060708-01"
	payload := []byte(`{"id":"0190c6e0-0000-7000-8000-000000000000","type":"subscriber.created","timestamp":"2026-11-25T18:00:00Z","data":{"subscriber":{"id":"0190c6e0-0000-7000-8000-000000000000","email":"user@example.com","status":"active"}}}`)
	batch := model.DeliveryBatch{EndpointID: uuid.New(), URL: srv.URL, Secret: model.NewWebhookSecret()}
	for range 100 {
		batch.Deliveries = append(batch.Deliveries, model.Delivery{EventID: uuid.New(), Type: model.EventCreated,
			Payload: payload, Traceparent: tp})
	}
	q := &memQueue{}
	w := NewWorker(q, Config{Guard: Guard{AllowPrivate: true}, Recorder: &recorder{},
		TracerProvider: sdktrace.NewTracerProvider(),
		Logger:         slog.New(slog.DiscardHandler)})
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		q.batches, q.finished = []model.DeliveryBatch{batch}, nil
		if n, err := w.RunOnce(context.Background()); err != nil || n != 100 {
			b.Fatal(n, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*100), "ns/event")
}

// TestWorkerRenewsEndpointLeaseWhileDelivering: a receiver slower than the lease keeps its
// endpoint leased by the worker's heartbeat, renewed every third of the lease, and never after
// the batch's outcome is recorded (a renewal would hide the endpoint after Finish).
func TestWorkerRenewsEndpointLeaseWhileDelivering(t *testing.T) {
	const lease = 90 * time.Millisecond
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(5 * lease)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	q := &memQueue{batches: []model.DeliveryBatch{{EndpointID: uuid.New(), URL: srv.URL, Secret: model.NewWebhookSecret(),
		Deliveries: []model.Delivery{{EventID: uuid.New(), Type: model.EventCreated, Payload: []byte(`{}`)}}}}}
	w := NewWorker(q, Config{Lease: lease, Timeout: time.Minute, Guard: Guard{AllowPrivate: true},
		Logger: slog.New(slog.DiscardHandler)})
	if n, err := w.RunOnce(context.Background()); n != 1 || err != nil {
		t.Fatalf("RunOnce = %d, %v", n, err)
	}
	time.Sleep(2 * lease) // a renewal after Finish would come now
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.extended < 3 {
		t.Errorf("lease renewed %d times while the receiver took 5 leases, want at least 3", q.extended)
	}
	if len(q.finished) != 1 || q.finished[0][0].Outcome != model.DeliveryDelivered {
		t.Fatalf("finished %v, want one delivered", q.finished)
	}
	if q.lastExtend.After(q.endedAt) {
		t.Errorf("lease renewed at %v, after Finish ended it at %v", q.lastExtend, q.endedAt)
	}
}

// TestBulkTurnHandsBackTheRest: a batch's bulk deliveries not started within BulkTurn go back
// unstarted and due at once (a release without delay), for the endpoint's next claim to take
// whatever interactive delivery came meanwhile first; the batch's interactive deliveries are
// all made whatever the time; and a batch of bulk work alone makes its first attempt however
// short the turn, so that every claim moves the queue on.
func TestBulkTurnHandsBackTheRest(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	batch := func(interactive, bulk int) model.DeliveryBatch {
		b := model.DeliveryBatch{EndpointID: uuid.New(), URL: srv.URL, Secret: model.NewWebhookSecret()}
		for i := range interactive + bulk {
			b.Deliveries = append(b.Deliveries, model.Delivery{EventID: uuid.New(), Type: model.EventCreated,
				Payload: []byte(`{}`), Bulk: i >= interactive})
		}
		return b
	}
	// A turn already over when the first bulk delivery's turn comes.
	w := NewWorker(&memQueue{}, Config{BulkTurn: time.Nanosecond, PerEndpointParallel: 1,
		Guard: Guard{AllowPrivate: true}, Logger: slog.New(slog.DiscardHandler)})
	for _, c := range []struct{ interactive, bulk, delivered int }{{3, 40, 3}, {0, 5, 1}} {
		q := &memQueue{batches: []model.DeliveryBatch{batch(c.interactive, c.bulk)}}
		w.queue = q
		if n, err := w.RunOnce(context.Background()); err != nil || n != c.interactive+c.bulk {
			t.Fatalf("RunOnce = %d, %v", n, err)
		}
		var outcomes []string
		for i, r := range q.finished[0] {
			outcomes = append(outcomes, r.Outcome)
			if r.Outcome == model.DeliveryReleased && r.Delay != 0 {
				t.Errorf("delivery %d released with a delay of %v, want due at once", i, r.Delay)
			}
		}
		want := strings.Repeat(model.DeliveryDelivered+" ", c.delivered) + strings.Repeat(model.DeliveryReleased+" ", c.interactive+c.bulk-c.delivered)
		if got := strings.Join(outcomes, " ") + " "; got != want {
			t.Errorf("%d interactive and %d bulk deliveries, a bulk turn over at once: %s; want %s", c.interactive, c.bulk, got, want)
		}
	}
}
