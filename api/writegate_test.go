package api_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/model"
)

// TestWriteGate: with every write slot taken (a write held in the store), another write waits
// at most WriteWait and answers 503 with Retry-After in the contract's envelope, reaching
// nothing; reads pass at once; once the slot frees, writes run again.
func TestWriteGate(t *testing.T) {
	g := newGateEnv(t, 8, func(c *api.Config) { c.WriteConcurrency, c.WriteWait = 1, 50*time.Millisecond })
	first := g.bulk(context.Background(), bulkBody(0))
	eventually(t, "the first write runs", func() bool { return g.held.inside.Load() == 1 })

	start := time.Now()
	rec := g.call(t, "POST", subs, `{"email":"single@example.com","name":"S"}`)
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("a write with every write slot taken: %d, Retry-After %q, body %s; want 503 with Retry-After",
			rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the write waited %v for a slot; want about WriteWait (50 ms)", took)
	}
	want, err := os.ReadFile("testdata/errors/503.json")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(rec.Body.String()); got != strings.TrimSpace(string(want)) {
		t.Errorf("503 body %s; want the contract's %s", got, want)
	}
	if rec := g.call(t, "GET", subs, ""); rec.Code != http.StatusOK {
		t.Errorf("a read with every write slot taken: %d, body %s; want 200 at once", rec.Code, rec.Body)
	}

	close(g.held.release)
	if rec := <-first; rec.Code != http.StatusCreated {
		t.Fatalf("the held write: %d, body %s", rec.Code, rec.Body)
	}
	if rec := g.call(t, "POST", subs, `{"email":"single@example.com","name":"S"}`); rec.Code != http.StatusCreated {
		t.Errorf("a write once the slot is free: %d, body %s; want 201", rec.Code, rec.Body)
	}
}

// pacedStore's creates take a while each: writes that finish one after another.
type pacedStore struct {
	*fakeStore
	took time.Duration
}

func (s *pacedStore) Create(ctx context.Context, nl uuid.UUID, in model.NewSubscriber) (model.Subscriber, error) {
	time.Sleep(s.took)
	return s.fakeStore.Create(ctx, nl, in)
}

// TestWriteGateQueuesWhileWritesFinish: writes queued behind a gate of one whose writes each
// finish within WriteWait all run, though the last waits several WriteWaits: the gate gives
// up only on slots that do not move.
func TestWriteGateQueuesWhileWritesFinish(t *testing.T) {
	e := newEnv(t, func(c *api.Config) {
		c.Store = &pacedStore{fakeStore: c.Store.(*fakeStore), took: 60 * time.Millisecond}
		c.WriteConcurrency, c.WriteWait = 1, 200*time.Millisecond
	})
	const n = 8 // about 480 ms of writes through one slot
	codes := make(chan int, n)
	for i := range n {
		go func() {
			codes <- e.call(t, "POST", subs, fmt.Sprintf(`{"email":"q%d@example.com","name":"Q"}`, i)).Code
		}()
	}
	for range n {
		if code := <-codes; code != http.StatusCreated {
			t.Errorf("a write queued behind writes that finish: %d; want 201", code)
		}
	}
}

func TestWriteConcurrency(t *testing.T) {
	for pool, want := range map[int]int{1: 1, 2: 1, 4: 3, 8: 6, 16: 12, 40: 30} {
		if got := api.WriteConcurrency(pool); got != want {
			t.Errorf("WriteConcurrency(%d) = %d; want %d", pool, got, want)
		}
	}
}
