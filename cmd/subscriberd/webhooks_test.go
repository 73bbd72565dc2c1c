package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestServeWithoutWebhookWorkers: an instance with WEBHOOK_WORKERS=0 takes webhook endpoints
// and queues deliveries but sends none, and shows them waiting on its /metrics; an instance
// with the default workers on the same database delivers them.
func TestServeWithoutWebhookWorkers(t *testing.T) {
	t.Parallel()
	var got atomic.Int64
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer rc.Close()
	env := map[string]string{
		"DATABASE_URL":          pg.Empty(t),
		"LISTEN_ADDR":           "127.0.0.1:0",
		"ADMIN_ADDR":            "127.0.0.1:0",
		"LOG_FORMAT":            "json",
		"WEBHOOK_ALLOW_PRIVATE": "true",
	}
	cli(t, env, "migrate")
	nl := cli(t, env, "newsletter", "create", "--name", "Hooks")
	key := cli(t, env, "apikey", "create", "--newsletter", nl["id"].(string), "--label", "ci")["key"].(string)

	apiOnly := map[string]string{"WEBHOOK_WORKERS": "0"}
	for k, v := range env {
		apiOnly[k] = v
	}
	a := startServe(t, apiOnly)
	if code, body := call(t, "POST", a.api+"/api/v1/webhooks", key, `{"url":"`+rc.URL+`","events":["subscriber.created"]}`); code != http.StatusCreated {
		t.Fatalf("create webhook = %d %v", code, body)
	}
	if code, body := call(t, "POST", a.api+"/api/v1/subscribers", key, `{"email":"ann@example.com"}`); code != http.StatusCreated {
		t.Fatalf("create subscriber = %d %v", code, body)
	}
	depth := func(n string) func() bool {
		return func() bool {
			return strings.Contains(get(t, a.admin+"/metrics"), "\nwebhook_queue_depth{lane=\"interactive\"} "+n+"\n")
		}
	}
	waitUntil(t, "the queued delivery on /metrics", depth("1"))
	time.Sleep(2 * time.Second) // four of a worker's poll intervals
	if n := got.Load(); n != 0 {
		t.Fatalf("the instance with WEBHOOK_WORKERS=0 delivered %d webhooks", n)
	}
	if !strings.Contains(a.logs.String(), "WEBHOOK_WORKERS=0") {
		t.Errorf("the log does not say that this instance delivers no webhooks:\n%s", a.logs.String())
	}

	b := startServe(t, env)
	waitUntil(t, "the instance with the default workers to deliver the waiting webhook", func() bool { return got.Load() > 0 })
	waitUntil(t, "the delivered queue on /metrics", depth("0"))
	b.stop(t)
	a.stop(t)
	if n := got.Load(); n != 1 {
		t.Errorf("%d deliveries, want 1", n)
	}
}
