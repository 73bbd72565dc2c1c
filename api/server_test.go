package api_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/subscriberd/subscriberd/api"
)

// TestNewWithoutOptionalDependencies: Logger and Metrics may be nil.
func TestNewWithoutOptionalDependencies(t *testing.T) {
	srv := api.New(api.Config{Store: &fakeStore{}, Auth: newFakeAuth()})
	for _, r := range []req{
		{"GET", subs, nil, []string{bearer(keyA)}},
		{"GET", "/nope", nil, nil},
	} {
		rec := newRecorder()
		srv.ServeHTTP(rec, newRequest(r))
		if rec.Code != http.StatusOK && rec.Code != http.StatusNotFound {
			t.Errorf("%s %s: status %d; want 200 or 404", r.method, r.path, rec.Code)
		}
	}
}

// TestHandle: an extra handler mounted on the public mux gets the common headers and does
// not need a key.
func TestHandle(t *testing.T) {
	e := newEnv(t)
	e.srv.Handle("GET /confirm/{token}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("token " + r.PathValue("token"))) //nolint:errcheck
	}))
	rec := e.do(t, req{"GET", "/confirm/abc", nil, nil})
	if rec.Code != http.StatusOK || rec.Body.String() != "token abc" {
		t.Fatalf("GET /confirm/abc: status %d, body %q; want 200 \"token abc\"", rec.Code, rec.Body)
	}
	if rec.Header().Get("Cache-Control") != "no-store" || rec.Header().Get("X-Request-Id") == "" {
		t.Errorf("headers %v; want Cache-Control and X-Request-Id", rec.Header())
	}
	if rec := e.do(t, req{"POST", "/confirm/abc", nil, nil}); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /confirm/abc: status %d; want 405", rec.Code)
	}
}

// TestOpenAPIMethodMatchesServed: srv.OpenAPI() is the document served.
func TestOpenAPIMethodMatchesServed(t *testing.T) {
	_, served := openAPIDoc(t)
	b, err := json.Marshal(newEnv(t).srv.OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(served, got); diff != "" {
		t.Errorf("OpenAPI() differs from /api/v1/openapi.json (-served +OpenAPI()):\n%s", diff)
	}
}
