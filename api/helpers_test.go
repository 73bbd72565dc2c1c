package api_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/internal/logbuf"
)

// env is a server under test with its fakes.
type env struct {
	srv     *api.Server
	store   *fakeStore
	auth    *fakeAuth
	metrics *fakeMetrics
	idem    *fakeIdempotency
	logs    *logbuf.Buffer
}

type option func(*api.Config)

// newEnv builds the real handler with api.New over in-memory fakes.
func newEnv(t testing.TB, opts ...option) *env {
	t.Helper()
	e := &env{store: &fakeStore{}, auth: newFakeAuth(), metrics: &fakeMetrics{}, logs: &logbuf.Buffer{},
		idem: newFakeIdempotency()}
	cfg := api.Config{
		Store:       e.store,
		Auth:        e.auth,
		Idempotency: e.idem,
		Logger:      slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics:     e.metrics,
	}
	for _, o := range opts {
		o(&cfg)
	}
	e.idem.stores = api.Stores{Subscribers: cfg.Store, Events: cfg.Events, Webhooks: cfg.Webhooks, Suppressions: cfg.Suppressions}
	e.srv = api.New(cfg)
	return e
}

// req is one request: method, path, body (nil for none) and "Name: value" headers.
type req struct {
	method  string
	path    string
	body    io.Reader
	headers []string
}

// do sends r through the server and returns the recorded response.
func (e *env) do(t *testing.T, r req) *httptest.ResponseRecorder {
	t.Helper()
	rec := newRecorder()
	e.srv.ServeHTTP(rec, newRequest(r))
	return rec
}

type recorder = httptest.ResponseRecorder

func newRecorder() *recorder { return httptest.NewRecorder() }

// newRequest builds r; headers are "Name: value", the value trimmed.
func newRequest(r req) *http.Request {
	hr := httptest.NewRequest(r.method, r.path, r.body)
	for _, h := range r.headers {
		name, value, ok := strings.Cut(h, ":")
		if !ok {
			panic("bad header " + h)
		}
		hr.Header.Add(name, strings.TrimSpace(value))
	}
	return hr
}

// call is do with key A's bearer header and a JSON body given as a string ("" for none).
func (e *env) call(t *testing.T, method, path, body string, headers ...string) *httptest.ResponseRecorder {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	return e.do(t, req{method, path, rd, append([]string{"Authorization: Bearer " + keyA}, headers...)})
}

// create makes a subscriber through the API and returns its id.
func (e *env) create(t *testing.T, key, body string) string {
	t.Helper()
	rec := e.do(t, req{"POST", "/api/v1/subscribers", strings.NewReader(body), []string{"Authorization: Bearer " + key}})
	if rec.Code != http.StatusCreated {
		t.Fatalf("create %s: status %d, body %s; want 201", body, rec.Code, rec.Body)
	}
	var env struct{ Data struct{ ID string } }
	if err := json.Unmarshal(rec.Body.Bytes(), &env); err != nil {
		t.Fatalf("create %s: decoding %s: %v", body, rec.Body, err)
	}
	return env.Data.ID
}

// decode parses a response body as a JSON object, failing the test when it is not one.
func decode(t *testing.T, rec *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(rec.Body.Bytes()))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil || m == nil {
		t.Fatalf("body %q is not a JSON object: %v", rec.Body, err)
	}
	return m
}

// decodeInto parses a response body into v.
func decodeInto(t *testing.T, rec *httptest.ResponseRecorder, v any) {
	t.Helper()
	if err := json.Unmarshal(rec.Body.Bytes(), v); err != nil {
		t.Fatalf("decoding body %q: %v", rec.Body, err)
	}
}

// keys returns the sorted keys of m.
func keys(m map[string]any) []string {
	return slices.Sorted(maps.Keys(m))
}
