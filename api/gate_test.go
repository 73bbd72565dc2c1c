package api_test

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/model"
)

// heldStore's bulk creates wait, once in the store, until release is closed: the requests
// holding the gate's slots.
type heldStore struct {
	*fakeStore
	release chan struct{}
	inside  atomic.Int32
}

func (s *heldStore) CreateMany(ctx context.Context, nl uuid.UUID, in []model.NewSubscriber) ([]model.Subscriber, error) {
	s.inside.Add(1)
	<-s.release
	return s.fakeStore.CreateMany(ctx, nl, in)
}

// gateMetrics is fakeMetrics with the bulk gate's metrics.
type gateMetrics struct {
	*fakeMetrics
	waiting atomic.Int32
	mu      sync.Mutex
	waits   map[string]int // outcome → count
}

func (m *gateMetrics) BulkGateWaiting(delta int) { m.waiting.Add(int32(delta)) }

func (m *gateMetrics) BulkGateWait(outcome string, _ time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.waits[outcome]++
}

func (m *gateMetrics) Waits() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]int{}
	for k, v := range m.waits {
		out[k] = v
	}
	return out
}

// trackedBody is a request body that tells whether anything read it.
type trackedBody struct {
	io.Reader
	read atomic.Bool
}

func (b *trackedBody) Read(p []byte) (int, error) {
	b.read.Store(true)
	return b.Reader.Read(p)
}

// gateEnv is a server with a bulk gate of n over a heldStore.
type gateEnv struct {
	*env
	held    *heldStore
	metrics *gateMetrics
}

func newGateEnv(t *testing.T, n int, opts ...func(*api.Config)) *gateEnv {
	t.Helper()
	g := &gateEnv{}
	g.env = newEnv(t, func(c *api.Config) {
		g.held = &heldStore{fakeStore: c.Store.(*fakeStore), release: make(chan struct{})}
		g.metrics = &gateMetrics{fakeMetrics: c.Metrics.(*fakeMetrics), waits: map[string]int{}}
		c.Store, c.Metrics, c.BulkConcurrency = g.held, g.metrics, n
		for _, o := range opts {
			o(c)
		}
	})
	t.Cleanup(func() {
		select {
		case <-g.held.release:
		default:
			close(g.held.release)
		}
	})
	return g
}

// bulkBody is a bulk of two subscribers, distinct for each i.
func bulkBody(i int) *trackedBody {
	return &trackedBody{Reader: strings.NewReader(fmt.Sprintf(
		`[{"email":"gate%d-a@example.com","name":"A"},{"email":"gate%d-b@example.com","name":"B"}]`, i, i))}
}

// bulk sends a bulk create of body with ctx and reports its answer on the returned channel.
func (g *gateEnv) bulk(ctx context.Context, body io.Reader, headers ...string) <-chan *recorder {
	done := make(chan *recorder, 1)
	go func() {
		rec := newRecorder()
		r := newRequest(req{"POST", subs + "/bulk", body, append([]string{bearer(keyA)}, headers...)})
		g.srv.ServeHTTP(rec, r.WithContext(ctx))
		done <- rec
	}()
	return done
}

// eventually waits up to 5 s for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestBulkGate: with a gate of N, N+1 concurrent bulk creates run N at a time; the last waits
// without its body read, then runs when a slot frees. Other operations, and requests refused
// before the gate, do not wait.
func TestBulkGate(t *testing.T) {
	const n = 2
	g := newGateEnv(t, n)
	var bodies []*trackedBody
	var answers []<-chan *recorder
	for i := range n + 1 {
		b := bulkBody(i)
		bodies = append(bodies, b)
		answers = append(answers, g.bulk(context.Background(), b, "Idempotency-Key: gate-"+fmt.Sprint(i)))
	}
	eventually(t, "N requests run and one waits", func() bool { return g.held.inside.Load() == n && g.metrics.waiting.Load() == 1 })
	time.Sleep(20 * time.Millisecond) // the waiting one would have gone on by now, were it let
	if got := g.held.inside.Load(); got != n {
		t.Fatalf("%d bulk creates in the store; want %d", got, n)
	}
	unread := 0
	for _, b := range bodies {
		if !b.read.Load() {
			unread++
		}
	}
	if unread != 1 {
		t.Errorf("%d bodies unread while one request waits at the gate; want 1 (a waiting request reads nothing)", unread)
	}

	// Requests that are not bulk creates, or are refused first, pass while the gate is full.
	if rec := g.call(t, "POST", subs, `{"email":"single@example.com","name":"S"}`); rec.Code != http.StatusCreated {
		t.Errorf("single create with the bulk gate full: status %d, body %s; want 201", rec.Code, rec.Body)
	}
	if rec := g.do(t, req{"POST", subs + "/bulk", bulkBody(99), []string{bearer(keyUnknown)}}); rec.Code != http.StatusUnauthorized {
		t.Errorf("bulk with an unknown key and the gate full: status %d; want 401 at once", rec.Code)
	}

	close(g.held.release)
	for i, done := range answers {
		select {
		case rec := <-done:
			if rec.Code != http.StatusCreated {
				t.Errorf("bulk %d: status %d, body %s; want 201", i, rec.Code, rec.Body)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("bulk %d never answered", i)
		}
	}
	if got := g.held.inside.Load(); got != n+1 {
		t.Errorf("%d bulk creates reached the store; want %d", got, n+1)
	}
	if got, want := g.metrics.Waits(), map[string]int{api.GateAdmitted: n + 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("gate waits by outcome %v; want %v", got, want)
	}
	if got := g.metrics.waiting.Load(); got != 0 {
		t.Errorf("%d requests still counted as waiting; want 0", got)
	}
}

// TestBulkGateClientGoneWhileWaiting: a bulk create whose client goes away while it waits at
// the gate answers 499, changes nothing, frees nothing it did not take, and shows its wait on
// the request's span.
func TestBulkGateClientGoneWhileWaiting(t *testing.T) {
	g := newGateEnv(t, 1)
	first := g.bulk(context.Background(), bulkBody(0))
	eventually(t, "the first bulk create runs", func() bool { return g.held.inside.Load() == 1 })

	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	ctx, span := tp.Tracer("test").Start(context.Background(), "POST /api/v1/subscribers/bulk")
	ctx, cancel := context.WithCancel(ctx)
	body := bulkBody(1)
	second := g.bulk(ctx, body, "Idempotency-Key: gone")
	eventually(t, "the second waits at the gate", func() bool { return g.metrics.waiting.Load() == 1 })
	cancel()
	var rec *recorder
	select {
	case rec = <-second:
	case <-time.After(5 * time.Second):
		t.Fatal("the cancelled request is still waiting")
	}
	span.End()
	if rec.Code != api.StatusClientClosed {
		t.Errorf("status %d, body %s; want 499", rec.Code, rec.Body)
	}
	if body.read.Load() {
		t.Error("the cancelled request's body was read")
	}
	g.idem.mu.Lock()
	stored := len(g.idem.stored)
	g.idem.mu.Unlock()
	if stored != 0 {
		t.Errorf("%d idempotent responses stored; want none", stored)
	}

	g.releaseFirstThenBulk(t, first)
	for _, s := range g.store.created() {
		if strings.HasPrefix(s.Email, "gate1-") {
			t.Errorf("the cancelled request created %s", s.Email)
		}
	}
	if got, want := g.metrics.Waits(), map[string]int{api.GateAdmitted: 2, api.GateAbandoned: 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("gate waits by outcome %v; want %v", got, want)
	}

	ended := spans.Ended()
	if len(ended) != 1 {
		t.Fatalf("%d spans; want 1", len(ended))
	}
	var found bool
	for _, ev := range ended[0].Events() {
		if ev.Name != "bulk_gate" {
			continue
		}
		found = true
		attrs := map[string]string{}
		for _, kv := range ev.Attributes {
			attrs[string(kv.Key)] = kv.Value.String()
		}
		if attrs["app.bulk_gate.outcome"] != api.GateAbandoned || attrs["app.bulk_gate.wait_seconds"] == "" {
			t.Errorf("bulk_gate event attributes %v; want outcome abandoned and the wait", attrs)
		}
	}
	if !found {
		t.Error("no bulk_gate event on the request's span")
	}
}

// TestBulkGateWaitIsBounded: a bulk create that finds no free slot within BulkWait answers 503
// with Retry-After, unread and unchanged, and the slot it never took is not given back.
func TestBulkGateWaitIsBounded(t *testing.T) {
	g := newGateEnv(t, 1, func(c *api.Config) { c.BulkWait = 50 * time.Millisecond })
	first := g.bulk(context.Background(), bulkBody(0))
	eventually(t, "the first bulk create runs", func() bool { return g.held.inside.Load() == 1 })

	body := bulkBody(1)
	var rec *recorder
	select {
	case rec = <-g.bulk(context.Background(), body):
	case <-time.After(5 * time.Second):
		t.Fatal("the second bulk create is still waiting after 5 s; want 503 after 50 ms")
	}
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" ||
		!strings.Contains(rec.Body.String(), `"code":"service_unavailable"`) {
		t.Errorf("status %d, Retry-After %q, body %s; want 503 service_unavailable with Retry-After",
			rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
	if body.read.Load() {
		t.Error("the refused request's body was read")
	}

	g.releaseFirstThenBulk(t, first)
	if got, want := g.metrics.Waits(), map[string]int{api.GateAdmitted: 2, api.GateTimedOut: 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("gate waits by outcome %v; want %v", got, want)
	}
}

// releaseFirstThenBulk lets the bulk create holding the gate's only slot finish, then checks
// that the slot is free again (a new bulk create runs at once) and that only those two reached
// the store: the request that waited took no slot and stored nothing.
func (g *gateEnv) releaseFirstThenBulk(t *testing.T, first <-chan *recorder) {
	t.Helper()
	close(g.held.release)
	if rec := <-first; rec.Code != http.StatusCreated {
		t.Errorf("first bulk: status %d, body %s; want 201", rec.Code, rec.Body)
	}
	if rec := g.do(t, req{"POST", subs + "/bulk", bulkBody(2), []string{bearer(keyA)}}); rec.Code != http.StatusCreated {
		t.Errorf("bulk after: status %d, body %s; want 201", rec.Code, rec.Body)
	}
	if got := g.held.inside.Load(); got != 2 {
		t.Errorf("%d bulk creates reached the store; want 2 (not the one that waited)", got)
	}
}

// TestBulkGateAnswersReplaysAtOnce: with the gate full, a bulk create whose Idempotency-Key
// has a stored response gets its replay, or 422 for another body (413 for one over the limit),
// without waiting for a slot, as does a bad key's 400; a new key still waits, its body unread.
func TestBulkGateAnswersReplaysAtOnce(t *testing.T) {
	g := newGateEnv(t, 1, func(c *api.Config) { c.BulkWait = time.Minute })
	stored := `{"success":true,"data":{"created":[]}}`
	sent := `[{"email":"earlier@example.com","name":"E"}]`
	g.idem.stored[newsletterA.String()+" done"] = model.StoredResponse{
		Fingerprint: model.Fingerprint(http.MethodPost, subs+"/bulk", []byte(sent)), Status: http.StatusCreated, Body: []byte(stored)}
	first := g.bulk(context.Background(), bulkBody(0))
	eventually(t, "the first bulk create holds the only slot", func() bool { return g.held.inside.Load() == 1 })

	answer := func(what string, body io.Reader, headers ...string) *recorder {
		t.Helper()
		select {
		case rec := <-g.bulk(context.Background(), body, headers...):
			return rec
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: still waiting at the full gate after 5 s; want an answer at once", what)
			return nil
		}
	}
	rec := answer("replay", strings.NewReader(sent), "Idempotency-Key: done")
	if rec.Code != http.StatusCreated || rec.Header().Get(api.HeaderReplayed) != "true" || rec.Body.String() != stored {
		t.Errorf("replay: status %d, %s %q, body %s; want the stored 201, replayed", rec.Code, api.HeaderReplayed,
			rec.Header().Get(api.HeaderReplayed), rec.Body)
	}
	rec = answer("reused key", bulkBody(1), "Idempotency-Key: done")
	if rec.Code != http.StatusUnprocessableEntity || !strings.Contains(rec.Body.String(), `"code":"`+api.CodeIdempotencyKeyReused+`"`) {
		t.Errorf("reused key: status %d, body %s; want 422 %s", rec.Code, rec.Body, api.CodeIdempotencyKeyReused)
	}
	if got, want := g.metrics.Idempotency(), map[string]int{api.IdempotencyReplayed: 1, api.IdempotencyReused: 1}; !maps.Equal(got, want) {
		t.Errorf("idempotency outcomes counted: %v, want %v", got, want)
	}
	// A body of no declared length, read past the limit as it is hashed.
	rec = answer("too large", io.MultiReader(strings.NewReader(strings.Repeat(" ", api.MaxBodyBytes)), strings.NewReader(sent)),
		"Idempotency-Key: done")
	if rec.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("too large: status %d, body %s; want 413", rec.Code, rec.Body)
	}
	rec = answer("bad key", bulkBody(2), "Idempotency-Key: two words")
	if rec.Code != http.StatusBadRequest {
		t.Errorf("bad key: status %d, body %s; want 400", rec.Code, rec.Body)
	}

	body := bulkBody(3)
	fresh := g.bulk(context.Background(), body, "Idempotency-Key: fresh")
	eventually(t, "the request with a new key waits", func() bool { return g.metrics.waiting.Load() == 1 })
	if body.read.Load() {
		t.Error("the waiting request's body was read")
	}
	close(g.held.release)
	for _, done := range []<-chan *recorder{first, fresh} {
		if rec := <-done; rec.Code != http.StatusCreated || rec.Header().Get(api.HeaderReplayed) != "" {
			t.Errorf("status %d, %s %q, body %s; want 201, run", rec.Code, api.HeaderReplayed, rec.Header().Get(api.HeaderReplayed), rec.Body)
		}
	}
	if got, want := g.metrics.Waits(), map[string]int{api.GateAdmitted: 2}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("gate waits by outcome %v; want %v (only the two that ran)", got, want)
	}
}
