package api_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/subscriberd/subscriberd/model"
)

// checkEnvelope fails unless rec is a contract response: a JSON object with a boolean success
// that matches the status, code and message on errors, and errors only where §1 allows them.
func checkEnvelope(t *testing.T, what string, rec *recorder) {
	t.Helper()
	if rec.Code >= 500 {
		t.Fatalf("%s: status %d, body %s; want no 5xx from input alone", what, rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q; want application/json", what, ct)
	}
	var body map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(rec.Body.Bytes()))
	if err := dec.Decode(&body); err != nil || body == nil || dec.More() {
		t.Fatalf("%s: status %d body %q is not one JSON object: %v", what, rec.Code, rec.Body, err)
	}
	var success bool
	if err := json.Unmarshal(body["success"], &success); err != nil {
		t.Fatalf("%s: success = %s; want a boolean", what, body["success"])
	}
	if success != (rec.Code < 300) {
		t.Errorf("%s: success %v with status %d", what, success, rec.Code)
	}
	if success {
		return
	}
	var code, msg string
	if json.Unmarshal(body["code"], &code) != nil || code == "" || json.Unmarshal(body["message"], &msg) != nil || msg == "" {
		t.Errorf("%s: error body %s lacks a code or a message", what, rec.Body)
	}
	raw, hasErrors := body["errors"]
	if hasErrors != (rec.Code == http.StatusUnprocessableEntity) {
		t.Errorf("%s: status %d with errors present = %v; want errors exactly on 422", what, rec.Code, hasErrors)
	}
	if !hasErrors {
		return
	}
	var fields map[string][]string
	if err := json.Unmarshal(raw, &fields); err != nil || len(fields) == 0 {
		t.Errorf("%s: errors = %s; want field messages: %v", what, raw, err)
	}
	for k, msgs := range fields {
		if len(msgs) == 0 || slices.Contains(msgs, "") {
			t.Errorf("%s: errors[%q] = %q; want non-empty messages", what, k, msgs)
		}
	}
}

var fuzzSeeds = []string{
	``,
	` `,
	`{}`,
	`[]`,
	`null`,
	`{"email":"a@example.com"}`,
	`{"email":"a@example.com","name":"John Doe","status":"pending"}`,
	`[{"email":"a@example.com"},{"email":"A@EXAMPLE.COM"},{"email":"bad"},5,null]`,
	`{"email":"用户@例子.广告","name":null}`,
	`{"email":5,"name":[],"status":{},"x":1}`,
	`{"name":"a\u0000b\u001f\u007f"}`,
	`{"email":` + "\"\xff\"}",
	`{"a":1} x`,
	`{"email":"a@example.com"}{"email":"b@example.com"}`,
	`[{"email":"a@example.com","name":"` + strings.Repeat("ñ", 256) + `"}]`,
	`{"email":"\ud800@example.com"}`,
	`{"email":"a@example.com","email":"b@example.com"}`,
	"\xef\xbb\xbf{}",
	`[[[[[[[[[[]]]]]]]]]]`,
}

// FuzzRequestBody sends any bytes to the three operations that take a body: the answer is
// never a 5xx and always the envelope.
func FuzzRequestBody(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	e := newEnv(f)
	existing := e.store.add(newsletterA)
	targets := []struct{ method, path string }{
		{"POST", subs},
		{"POST", subs + "/bulk"},
		{"PUT", subs + "/" + existing.ID.String()},
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		e.logs.Reset()
		for _, tg := range targets {
			e.store.reset(1)
			rec := e.do(t, req{tg.method, tg.path, bytes.NewReader(body), []string{bearer(keyA)}})
			checkEnvelope(t, tg.method+" "+tg.path, rec)
		}
	})
}

// FuzzListQuery sends any query string to the list operation.
func FuzzListQuery(f *testing.F) {
	for _, s := range []string{"", "page=1", "page=0&limit=101", "status=pending&page=2&limit=1", "page=%zz", "limit=1e2", "page=1&page=2", "status=", ";;&&==",
		"email=a@example.com", "email=%20", "email=x", "cursor=AQ", "cursor=", "page=1&cursor=x", "cursor=%00&email=a@example.com&status=active"} {
		f.Add(s)
	}
	e := newEnv(f)
	e.store.add(newsletterA)
	f.Fuzz(func(t *testing.T, query string) {
		e.logs.Reset()
		r := newRequest(req{"GET", subs, nil, []string{bearer(keyA)}})
		r.URL.RawQuery = query
		rec := newRecorder()
		e.srv.ServeHTTP(rec, r)
		checkEnvelope(t, "GET ?"+query, rec)
		if rec.Code != http.StatusOK && rec.Code != http.StatusBadRequest {
			t.Errorf("GET ?%s: status %d; want 200 or 400", query, rec.Code)
		}
	})
}

// FuzzIdempotencyKey sends any Idempotency-Key value (set on the request directly, as a raw
// client could) with a create: an invalid one is exactly the contract's 400, and nothing else
// is ever a 5xx.
func FuzzIdempotencyKey(f *testing.F) {
	for _, s := range []string{"", "k", "a b", "\t", "é", "\x7f", "\x00", strings.Repeat("k", 255), strings.Repeat("k", 256), "!~"} {
		f.Add(s)
	}
	e := newEnv(f)
	f.Fuzz(func(t *testing.T, key string) {
		e.logs.Reset()
		r := newRequest(req{"POST", subs, strings.NewReader(`{"email":"fuzz@example.com"}`), []string{bearer(keyA)}})
		r.Header["Idempotency-Key"] = []string{key}
		rec := newRecorder()
		e.srv.ServeHTTP(rec, r)
		checkEnvelope(t, "Idempotency-Key "+key, rec)
		if model.ValidIdempotencyKey(key) {
			if rec.Code == http.StatusBadRequest {
				t.Fatalf("valid key %q: 400 %s", key, rec.Body)
			}
			return
		}
		want := `{"success":false,"code":"validation_error","message":"` + model.MsgIdempotencyKeyInvalid + `"}`
		if rec.Code != http.StatusBadRequest || strings.TrimSpace(rec.Body.String()) != want {
			t.Fatalf("key %q: %d %s; want 400 %s", key, rec.Code, rec.Body, want)
		}
	})
}
