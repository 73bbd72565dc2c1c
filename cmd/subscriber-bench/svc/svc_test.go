package svc

import (
	"cmp"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/cmd/subscriber-bench/load"
)

// fakeAPI is a minimal in-memory implementation of the contract's subscriber operations: it
// checks what the client sends the way the service does (key, JSON, unique emails) and
// answers with the contract's envelopes.
type fakeAPI struct {
	mu     sync.Mutex
	emails map[string]bool
	subs   map[string]Subscriber
	order  []string
	calls  map[string]int
	idem   map[string][]byte // Idempotency-Key → stored body
}

func newFakeAPI() *fakeAPI {
	return &fakeAPI{emails: map[string]bool{}, subs: map[string]Subscriber{}, calls: map[string]int{}, idem: map[string][]byte{}}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, status int, code string) {
	writeJSON(w, status, map[string]any{"success": false, "code": code, "message": code})
}

type input struct {
	Email  string `json:"email"`
	Name   string `json:"name"`
	Status string `json:"status"`
}

// add stores new subscribers, all or nothing; false when an email is taken.
func (f *fakeAPI) add(in []input) ([]Subscriber, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	seen := map[string]bool{}
	for _, x := range in {
		k := strings.ToLower(x.Email)
		if f.emails[k] || seen[k] || x.Email == "" {
			return nil, false
		}
		seen[k] = true
	}
	out := make([]Subscriber, len(in))
	for i, x := range in {
		f.emails[strings.ToLower(x.Email)] = true
		s := Subscriber{ID: uuid.Must(uuid.NewV7()).String(), Email: x.Email, Name: x.Name, Status: x.Status,
			CreatedAt: time.Now().UTC().Format("2006-01-02T15:04:05+00:00")}
		f.subs[s.ID] = s
		f.order = append(f.order, s.ID)
		out[i] = s
	}
	return out, true
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer sk_test" {
		fail(w, 401, "unauthorized")
		return
	}
	if r.Body != nil && r.ContentLength != 0 && r.Header.Get("Content-Type") != "application/json" {
		fail(w, 415, "unsupported_media_type")
		return
	}
	f.mu.Lock()
	f.calls[r.Method+" "+r.URL.Path]++
	f.mu.Unlock()
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/api/v1/subscribers" && r.Header.Get("Idempotency-Key") != "":
		// A stand-in for docs/api-contract.md §8: the first request with a key runs, later
		// ones get its body again.
		key := r.Header.Get("Idempotency-Key")
		f.mu.Lock()
		stored, ok := f.idem[key]
		f.mu.Unlock()
		if ok {
			w.Header().Set("Idempotent-Replayed", "true")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(201)
			w.Write(stored)
			return
		}
		var in input
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			fail(w, 400, "validation_error")
			return
		}
		out, ok := f.add([]input{in})
		if !ok {
			fail(w, 422, "email_already_subscribed")
			return
		}
		body, _ := json.Marshal(map[string]any{"success": true, "data": out[0]})
		f.mu.Lock()
		f.idem[key] = body
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		w.Write(body)
	case r.Method == http.MethodPost && r.URL.Path == "/api/v1/subscribers":
		var in input
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			fail(w, 400, "validation_error")
			return
		}
		out, ok := f.add([]input{in})
		if !ok {
			fail(w, 422, "email_already_subscribed")
			return
		}
		writeJSON(w, 201, map[string]any{"success": true, "data": out[0]})
	case r.Method == http.MethodPost && r.URL.Path == "/api/v1/subscribers/bulk":
		var in []input
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || len(in) < 1 || len(in) > 100 {
			fail(w, 422, "validation_error")
			return
		}
		out, ok := f.add(in)
		if !ok {
			fail(w, 422, "validation_error")
			return
		}
		writeJSON(w, 201, map[string]any{"success": true, "data": map[string]any{"created": out}})
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/segments/seg1":
		writeJSON(w, 200, map[string]any{"success": true, "data": map[string]any{"id": "seg1", "name": "s", "filter": map[string]any{}, "subscribers": 1}})
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/tags":
		tags := make([]map[string]any, TagsPage)
		for i := range tags {
			tags[i] = map[string]any{"tag": TagName(i), "subscribers": 1}
		}
		writeJSON(w, 200, map[string]any{"success": true, "data": tags, "pagination": map[string]any{"limit": TagsPage, "next_cursor": nil}})
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/subscribers":
		q := r.URL.Query()
		page, _ := strconv.Atoi(cmp.Or(q.Get("page"), "1"))
		limit, _ := strconv.Atoi(cmp.Or(q.Get("limit"), "25"))
		// A stand-in for the cursors of docs/api-contract.md §9.2: "o<offset>".
		cursor, hasCursor := strings.CutPrefix(q.Get("cursor"), "o")
		offset, _ := strconv.Atoi(cursor)
		if hasCursor {
			page = 1
		}
		if page < 1 || limit < 1 || limit > 100 || (q.Get("cursor") != "" && !hasCursor) {
			fail(w, 400, "validation_error")
			return
		}
		if !hasCursor {
			offset = (page - 1) * limit
		}
		status, email := q.Get("status"), strings.ToLower(q.Get("email"))
		f.mu.Lock()
		var match []Subscriber
		for i := len(f.order) - 1; i >= 0; i-- {
			if s := f.subs[f.order[i]]; (status == "" || s.Status == status) && (email == "" || strings.ToLower(s.Email) == email) {
				match = append(match, s)
			}
		}
		f.mu.Unlock()
		from, to := min(offset, len(match)), min(offset+limit, len(match))
		total := len(match)
		var next any
		if to < len(match) {
			next = "o" + strconv.Itoa(to)
		}
		pg := map[string]any{"page": page, "limit": limit, "total": total, "pages": (total + limit - 1) / limit, "next_cursor": next}
		if hasCursor {
			pg["page"], pg["pages"] = nil, nil
		}
		writeJSON(w, 200, map[string]any{"success": true, "data": append([]Subscriber{}, match[from:to]...), "pagination": pg})
	case strings.HasPrefix(r.URL.Path, "/api/v1/subscribers/"):
		id := strings.TrimPrefix(r.URL.Path, "/api/v1/subscribers/")
		f.mu.Lock()
		s, ok := f.subs[id]
		if ok && r.Method == http.MethodPut {
			var in input
			if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Name == "" {
				f.mu.Unlock()
				fail(w, 422, "validation_error")
				return
			}
			s.Name = in.Name
			f.subs[id] = s
		}
		f.mu.Unlock()
		if !ok {
			fail(w, 404, "not_found")
			return
		}
		writeJSON(w, 200, map[string]any{"success": true, "data": s})
	default:
		fail(w, 404, "not_found")
	}
}

func TestSeedCreatesUniqueSubscribersInBulks(t *testing.T) {
	api := newFakeAPI()
	srv := httptest.NewServer(api)
	defer srv.Close()
	c := NewClient(srv.URL, "sk_test", "run1", 4, 0)
	var last int
	var mu sync.Mutex
	ids, err := c.Seed(context.Background(), 250, 3, func(done int) { mu.Lock(); last = max(last, done); mu.Unlock() })
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 250 || last != 250 {
		t.Fatalf("%d ids, progress reached %d; want 250", len(ids), last)
	}
	uniq := map[string]bool{}
	for _, id := range ids {
		uniq[id] = true
	}
	if len(uniq) != 250 || len(api.subs) != 250 {
		t.Errorf("%d unique ids, %d stored; want 250", len(uniq), len(api.subs))
	}
	if n := api.calls["POST /api/v1/subscribers/bulk"]; n != 3 {
		t.Errorf("%d bulk requests, want 3 (100, 100, 50)", n)
	}
	// A second client with another run id never collides; one with the same run id would.
	if _, err := NewClient(srv.URL, "sk_test", "run2", 4, 0).Seed(context.Background(), 10, 1, nil); err != nil {
		t.Errorf("another run id: %v", err)
	}
	if _, err := NewClient(srv.URL, "sk_test", "run1", 4, 0).Seed(context.Background(), 10, 1, nil); err == nil {
		t.Errorf("reusing a run id: the fake API must reject the duplicate emails")
	}

	got, err := c.ListIDs(context.Background(), 120)
	if err != nil || len(got) != 120 {
		t.Fatalf("ListIDs = %d ids, %v", len(got), err)
	}
}

func TestScenariosProbeAndRunAgainstTheContract(t *testing.T) {
	api := newFakeAPI()
	srv := httptest.NewServer(api)
	defer srv.Close()
	c := NewClient(srv.URL, "sk_test", "run1", 4, 0)
	ids, err := c.Seed(context.Background(), 60, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.IDs = ids
	c.SetSegment("seg1")
	// 60 subscribers make 3 pages; the deep page is past the end, which the probe accepts.
	for _, sc := range c.Scenarios() {
		if err := c.Probe(context.Background(), sc); err != nil {
			t.Errorf("probe %s: %v", sc.Name, err)
		}
		out := load.Run(context.Background(), load.Options{Clients: 3, Duration: time.Hour, MaxRequests: 9}, sc.Op)
		s := out.Summary
		wantRows := int64(9)
		if sc.Name == Bulk100 {
			wantRows = 900
		}
		if s.OK != 9 || s.Rows != wantRows {
			t.Errorf("%s: ok %d rows %d errors %v %v; want 9 ok, %d rows", sc.Name, s.OK, s.Rows, s.Errors, out.Details, wantRows)
		}
	}
	// create_active, create_pending, replay, create_idem and create_attrs: a probe and 9 each.
	if api.calls["POST /api/v1/subscribers"] != 5+45 || api.calls["POST /api/v1/subscribers/bulk"] != 1+1+9 {
		t.Errorf("calls = %v", api.calls)
	}
}

func TestProbeRejectsAResponseOffContract(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A list without pagination, a create answered with 200.
		if r.Method == http.MethodGet {
			writeJSON(w, 200, map[string]any{"success": true, "data": []any{}})
			return
		}
		writeJSON(w, 200, map[string]any{"success": true, "data": map[string]any{"id": "x", "email": "a@b.co", "status": "active", "created_at": "t"}})
	}))
	defer srv.Close()
	c := NewClient(srv.URL, "sk_test", "r", 1, 0)
	for _, sc := range c.Scenarios() {
		if sc.Name != ListFirst && sc.Name != CreateActive {
			continue
		}
		if err := c.Probe(context.Background(), sc); err == nil {
			t.Errorf("probe %s accepted a response off the contract", sc.Name)
		}
	}
}

func TestErrorsAreCountedByKind(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("page") {
		case "1":
			fail(w, 503, "service_unavailable")
		default:
			// Never answers: the client's timeout must end the request.
			select {
			case <-block:
			case <-r.Context().Done():
			}
		}
	}))
	defer srv.Close()

	c := NewClient(srv.URL, "sk_test", "r", 2, 0)
	out := load.Run(context.Background(), load.Options{Clients: 2, Duration: time.Hour, MaxRequests: 6}, opOf(c, ListFirst))
	if out.Summary.Errors["503"] != 6 || out.Summary.OK != 0 {
		t.Errorf("errors = %v ok = %d, want 6 × 503", out.Summary.Errors, out.Summary.OK)
	}
	if !strings.Contains(out.Details["503"], "service_unavailable") {
		t.Errorf("detail = %q, want the response body", out.Details["503"])
	}

	slow := NewClient(srv.URL, "sk_test", "r", 2, 50*time.Millisecond)
	out = load.Run(context.Background(), load.Options{Clients: 2, Duration: time.Hour, MaxRequests: 2}, opOf(slow, ListDeep))
	if out.Summary.Errors["timeout"] != 2 {
		t.Errorf("errors = %v, want 2 timeouts", out.Summary.Errors)
	}

	dead := httptest.NewServer(http.NotFoundHandler())
	addr := dead.URL
	dead.Close()
	out = load.Run(context.Background(), load.Options{Clients: 1, Duration: time.Hour, MaxRequests: 1},
		opOf(NewClient(addr, "sk_test", "r", 1, 0), Get))
	if out.Summary.Errors["transport"] != 1 {
		t.Errorf("errors = %v, want a transport error", out.Summary.Errors)
	}
}

// opOf is the operation of c's scenario name.
func opOf(c *Client, name string) load.Op {
	for _, sc := range c.Scenarios() {
		if sc.Name == name {
			return sc.Op
		}
	}
	panic(name)
}
