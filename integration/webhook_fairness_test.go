package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/subscriberd/subscriberd/repo"
	"github.com/subscriberd/subscriberd/webhook"
)

// TestWebhookHangingNewsletterDoesNotSlowOthers: one newsletter has the most endpoints it
// may have (20), all of whose receivers hang; another newsletter's healthy endpoint still gets
// its deliveries at once. The workers run as the service runs them (8 workers, 10 s attempts,
// the default back-off): no newsletter's endpoints hold more than half of them, so the median
// delay of the healthy one's deliveries stays under a second (it was 15 s when the hanging
// ones could hold all 8).
func TestWebhookHangingNewsletterDoesNotSlowOthers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	release := make(chan struct{})
	// The attempts each hanging endpoint (a path) has in flight, and the most endpoints with
	// one at once.
	var mu sync.Mutex
	inFlight := map[string]int{}
	most := 0
	holding := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(inFlight)
	}
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// With the body read the server notices at once when the worker gives up.
		io.Copy(io.Discard, r.Body) //nolint:errcheck
		mu.Lock()
		inFlight[r.URL.Path]++
		most = max(most, len(inFlight))
		mu.Unlock()
		defer func() {
			mu.Lock()
			if inFlight[r.URL.Path]--; inFlight[r.URL.Path] == 0 {
				delete(inFlight, r.URL.Path)
			}
			mu.Unlock()
		}()
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(hang.Close)
	var releaseOnce sync.Once
	stopHanging := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(stopHanging) // before the server closes: it waits for its handlers
	for i := range 20 {
		e.hook(fmt.Sprintf("%s/%d", hang.URL, i), []string{"subscriber.created"}, nil)
	}
	// The other newsletter and its healthy receiver.
	_, otherKey := e.newKey(t, true)
	healthy := newReceiver(t)
	d := e.do("POST", "/webhooks", map[string]any{"url": healthy.srv.URL}, "Authorization: Bearer "+otherKey).
		want(t, http.StatusCreated, "").data(t)
	healthy.mu.Lock()
	healthy.secret = d["secret"].(string)
	healthy.mu.Unlock()

	ctx, cancel := context.WithCancel(context.Background())
	q := repo.NewDeliveries(e.db)
	cfg := webhook.Config{Guard: webhook.Guard{AllowPrivate: true}, Logger: discardLog, Wake: q.Listen(ctx)}
	w := webhook.NewWorker(q, cfg)
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }() //nolint:errcheck
	t.Cleanup(func() { stopHanging(); cancel(); <-done })

	// Every hanging endpoint gets deliveries, and the workers take them.
	for i := range 3 {
		e.do("POST", "/subscribers", map[string]any{"email": fmt.Sprintf("hang%d@example.com", i)}).want(t, http.StatusCreated, "")
	}
	waitFor(t, "the hanging receivers to hold workers", func() bool { return holding() >= 4 })

	var delays []time.Duration
	for i := range 10 {
		// The hanging newsletter's traffic goes on: each event makes all 20 endpoints due.
		e.do("POST", "/subscribers", map[string]any{"email": fmt.Sprintf("more%d@example.com", i)}).want(t, http.StatusCreated, "")
		start := time.Now()
		e.do("POST", "/subscribers", map[string]any{"email": fmt.Sprintf("healthy%d@example.com", i)},
			"Authorization: Bearer "+otherKey).want(t, http.StatusCreated, "")
		for len(healthy.deliveries()) < i+1 {
			if time.Since(start) > 45*time.Second {
				t.Fatalf("delivery %d to the healthy endpoint not there after 45 s", i)
			}
			time.Sleep(10 * time.Millisecond)
		}
		delays = append(delays, time.Since(start))
	}
	slices.Sort(delays)
	median := (delays[4] + delays[5]) / 2
	mu.Lock()
	held := most
	mu.Unlock()
	t.Logf("healthy endpoint's delays beside 20 hanging ones: median %v, max %v; at most %d hanging endpoints delivered to at once",
		median.Round(time.Millisecond), delays[9].Round(time.Millisecond), held)
	if median >= time.Second {
		t.Errorf("median delay %v, want under 1 s", median)
	}
	if held > webhook.DefaultWorkers/2 {
		t.Errorf("%d of one newsletter's endpoints delivered to at once, want at most %d (half the workers)", held, webhook.DefaultWorkers/2)
	}
}

// TestWebhookRecoveredReceiverGetsQueuedAtOnce: deliveries that failed while the receiver was
// down wait for their back-off step (here an hour); once the receiver answers 2xx again they
// are due at once and delivered within the endpoint's bound of PerEndpointParallel at a time.
func TestWebhookRecoveredReceiverGetsQueuedAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	var down atomic.Bool
	down.Store(true)
	var inFlight, most atomic.Int64
	rc.setAnswer(func(w http.ResponseWriter, r *http.Request) bool {
		if down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return true
		}
		n := inFlight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(50 * time.Millisecond) // long enough for parallel attempts to overlap
		inFlight.Add(-1)
		return false
	})
	e.hook(rc.srv.URL, nil, rc)
	cfg := testHookConfig()
	cfg.Backoff = []time.Duration{50 * time.Millisecond, time.Hour, time.Hour}
	cfg.PollInterval, cfg.PerEndpointParallel = 20*time.Millisecond, 2
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.hookWorker(cfg).Run(ctx); close(done) }() //nolint:errcheck
	t.Cleanup(func() { cancel(); <-done })

	const n = 6
	for i := range n {
		e.do("POST", "/subscribers", map[string]any{"email": fmt.Sprintf("down%d@example.com", i)}).want(t, http.StatusCreated, "")
	}
	// The outage: every delivery fails twice and waits for its next step, an hour.
	waitFor(t, "every delivery to wait an hour", func() bool {
		return e.count("SELECT count(*) FROM webhook_deliveries WHERE attempts >= 2 AND state = 'pending'") == n
	})
	down.Store(false)
	start := time.Now()
	// A new event is due at once: its delivery is the receiver's first 2xx.
	e.do("POST", "/subscribers", map[string]any{"email": "up@example.com"}).want(t, http.StatusCreated, "")
	for len(rc.deliveries()) < n+1 {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("%d of %d deliveries 20 s after the receiver recovered; the rest wait for their back-off",
				len(rc.deliveries()), n+1)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("all %d deliveries %v after the receiver recovered, at most %d at once", n+1, time.Since(start).Round(time.Millisecond), most.Load())
	if m := most.Load(); m > int64(cfg.PerEndpointParallel) {
		t.Errorf("%d deliveries at once to the endpoint, want at most %d", m, cfg.PerEndpointParallel)
	}
	waitFor(t, "the outcomes recorded", func() bool { return e.count("SELECT count(*) FROM webhook_deliveries") == 0 })
}
