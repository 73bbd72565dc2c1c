package api_test

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/subscriberd/subscriberd/api"
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

func TestWriteConcurrency(t *testing.T) {
	for pool, want := range map[int]int{1: 1, 2: 1, 4: 3, 8: 6, 16: 12, 40: 30} {
		if got := api.WriteConcurrency(pool); got != want {
			t.Errorf("WriteConcurrency(%d) = %d; want %d", pool, got, want)
		}
	}
}
