package api_test

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// TestKeyedHandlerAnswersTheStoredResponse: a request whose key's response was stored between
// the middleware's look-up and the unit of work's lock learns it from IdempotencyStore.Run, in
// the handler: it answers the stored response byte for byte, with its status, Location and
// Idempotent-Replayed (docs/api-contract.md §8), or 422 for another body, and changes nothing.
func TestKeyedHandlerAnswersTheStoredResponse(t *testing.T) {
	e := newEnv(t)
	body := `{"email":"ann@example.com","name":"Ann"}`
	send := func(body string) *recorder {
		return e.do(t, req{method: http.MethodPost, path: "/api/v1/subscribers", body: strings.NewReader(body),
			headers: []string{"Authorization: Bearer " + keyA, "Content-Type: application/json", "Idempotency-Key: k"}})
	}
	first := send(body)
	if first.Code != http.StatusCreated {
		t.Fatalf("first request: %d %s", first.Code, first.Body)
	}
	e.idem.mu.Lock()
	e.idem.blind = true
	e.idem.mu.Unlock()
	calls := len(e.store.Calls())

	r := send(body)
	if r.Code != first.Code || !bytes.Equal(r.Body.Bytes(), first.Body.Bytes()) {
		t.Fatalf("replay from the handler = %d %q; want %d %q", r.Code, r.Body, first.Code, first.Body)
	}
	for _, h := range []string{"Location", "Content-Type"} {
		if got, want := r.Header().Get(h), first.Header().Get(h); got != want || got == "" {
			t.Errorf("replay %s = %q; want %q", h, got, want)
		}
	}
	if got := r.Header().Get("Idempotent-Replayed"); got != "true" {
		t.Errorf("replay Idempotent-Replayed = %q; want true", got)
	}

	r = send(`{"email":"bob@example.com"}`)
	if r.Code != http.StatusUnprocessableEntity || !strings.Contains(r.Body.String(), `"code":"idempotency_key_reused"`) {
		t.Fatalf("another body with the key = %d %s; want 422 idempotency_key_reused", r.Code, r.Body)
	}
	if got := e.store.Calls()[calls:]; len(got) != 0 {
		t.Fatalf("the store was called %v; want nothing run again", got)
	}
	if got := e.metrics.Idempotency(); got["replayed"] != 1 || got["reused"] != 1 {
		t.Fatalf("idempotency outcomes = %v; want one replayed, one reused", got)
	}
}
