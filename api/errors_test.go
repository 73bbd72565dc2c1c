package api_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/subscriberd/subscriberd/model"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ with what the code produces")

// golden compares got with the file testdata/name, or rewrites the file under -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", filepath.FromSlash(name))
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading golden file (run go test ./api -update to create it): %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("body differs from %s (-want +got; run go test ./api -update if the change is intended):\n%s",
			path, cmp.Diff(string(want), string(got)))
	}
}

// jsonEqual fails the test when the JSON texts got and want differ in value.
func jsonEqual(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("body %q is not JSON: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("bad want %q: %v", want, err)
	}
	if diff := cmp.Diff(w, g); diff != "" {
		t.Errorf("body mismatch (-want +got):\n%s", diff)
	}
}

func bearer(key string) string { return "Authorization: Bearer " + key }

const (
	subs     = "/api/v1/subscribers"
	unknowID = "01900000-0000-7000-8000-999999999999"
	jsonCT   = "Content-Type: application/json"
)

// Bodies of the contract, spelled out.
const (
	body401 = `{"success":false,"code":"unauthorized","message":"Invalid API key."}`
	body403 = `{"success":false,"code":"api_access_disabled","message":"API access is not enabled."}`
	body404 = `{"success":false,"code":"not_found","message":"Subscriber not found."}`
	body500 = `{"success":false,"code":"internal_error","message":"An unexpected error occurred."}`
)

func bad(msg string) string {
	return `{"success":false,"code":"validation_error","message":` + strconv.Quote(msg) + `}`
}

// TestErrorEnvelopes pins status, headers and exact body of every kind of error the API sends.
func TestErrorEnvelopes(t *testing.T) {
	overMiB := `{"email":"a@example.com","name":"` + strings.Repeat("x", 1<<20) + `"}`
	tests := []struct {
		name        string
		setup       func(*env)
		req         req
		wantStatus  int
		wantBody    string
		wantHeaders map[string]string
		golden      string // file under testdata/errors, when this case is a representative one
	}{
		// 400: the body is not one JSON value of the right type, or a query parameter is bad.
		{name: "invalid JSON", req: req{"POST", subs, strings.NewReader(`{"email":`), []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad("The request body is not valid JSON: unexpected end of JSON input at line 1, column 10."), golden: "400_invalid_json.json"},
		{name: "trailing data after the value", req: req{"POST", subs, strings.NewReader(`{"a":1} x`), []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad("The request body is not valid JSON: invalid character 'x' after top-level value at line 1, column 9.")},
		{name: "two JSON values", req: req{"POST", subs, strings.NewReader(`{"email":"a@example.com"} {}`), []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad("The request body is not valid JSON: invalid character '{' after top-level value at line 1, column 27.")},
		{name: "single quotes", req: req{"POST", subs, strings.NewReader(`{'email':'a@example.com'}`), []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad(`The request body is not valid JSON: invalid character '\'' looking for beginning of object key string at line 1, column 2.`)},
		{name: "missing comma on the third line", req: req{"POST", subs, strings.NewReader("{\n  \"email\": \"ü@example.com\"\n  \"name\": \"x\"\n}"), []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad(`The request body is not valid JSON: invalid character '"' after object key:value pair at line 3, column 3.`)},
		{name: "byte order mark", req: req{"POST", subs, strings.NewReader("\ufeff{\"email\":\"a@example.com\"}"), []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad(`The request body is not valid JSON: invalid character '\ufeff' looking for beginning of value at line 1, column 1.`)},
		{name: "a character outside ASCII where a value belongs", req: req{"POST", subs, strings.NewReader(`{"email": é}`), []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad(`The request body is not valid JSON: invalid character 'é' looking for beginning of value at line 1, column 11.`)},
		{name: "invalid UTF-8 in a string", req: req{"POST", subs, strings.NewReader("{\"email\":\"\xff@example.com\"}"), []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad("The request body is not valid UTF-8."), golden: "400_invalid_utf8.json"},
		{name: "invalid UTF-8 in bulk", req: req{"POST", subs + "/bulk", strings.NewReader("[{\"email\":\"a@example.com\",\"name\":\"\xc3\x28\"}]"), []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad("The request body is not valid UTF-8.")},
		{name: "create with an array", req: req{"POST", subs, strings.NewReader(`[{"email":"a@example.com"}]`), []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad("The request body must be a JSON object. To create several subscribers at once, send the array to POST /api/v1/subscribers/bulk."),
			golden: "400_wrong_type.json"},
		{name: "create with null", req: req{"POST", subs, strings.NewReader(`null`), []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad("The request body must be a JSON object.")},
		{name: "create with a string", req: req{"POST", subs, strings.NewReader(` "a@example.com"`), []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad("The request body must be a JSON object.")},
		{name: "bulk with an object", req: req{"POST", subs + "/bulk", strings.NewReader(`{"email":"a@example.com"}`), []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad("The request body must be a JSON array.")},
		{name: "bulk with null", req: req{"POST", subs + "/bulk", strings.NewReader(`null`), []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad("The request body must be a JSON array.")},
		{name: "update with an array", req: req{"PUT", subs + "/" + unknowID, strings.NewReader(`[]`), []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad("The request body must be a JSON object.")},
		{name: "empty body", req: req{"POST", subs, nil, []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad("The request body is required."), golden: "400_empty_body.json"},
		{name: "white space body", req: req{"POST", subs + "/bulk", strings.NewReader(" \r\n\t"), []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad("The request body is required.")},
		{name: "empty update body", req: req{"PUT", subs + "/" + unknowID, nil, []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad("The request body is required.")},
		{name: "page 0", req: req{"GET", subs + "?page=0", nil, []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad("The page parameter must be an integer greater than or equal to 1."), golden: "400_query.json"},
		{name: "page abc", req: req{"GET", subs + "?page=abc&limit=10", nil, []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad("The page parameter must be an integer greater than or equal to 1.")},
		{name: "limit 101", req: req{"GET", subs + "?limit=101", nil, []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad("The limit parameter must be an integer between 1 and 100.")},
		{name: "limit 1.5", req: req{"GET", subs + "?limit=1.5", nil, []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad("The limit parameter must be an integer between 1 and 100.")},
		{name: "status filter", req: req{"GET", subs + "?status=deleted", nil, []string{bearer(keyA)}},
			wantStatus: 400, wantBody: bad("The status filter must be one of: active, pending, unsubscribed.")},

		// 401, with WWW-Authenticate, before anything about the body.
		{name: "no Authorization header", req: req{"GET", subs, nil, nil},
			wantStatus: 401, wantBody: body401, golden: "401.json"},
		{name: "Basic scheme", req: req{"GET", subs, nil, []string{"Authorization: Basic dXNlcjpwYXNz"}},
			wantStatus: 401, wantBody: body401},
		{name: "Token scheme with a valid key", req: req{"GET", subs, nil, []string{"Authorization: Token " + keyA}},
			wantStatus: 401, wantBody: body401},
		{name: "key without scheme", req: req{"GET", subs, nil, []string{"Authorization: " + keyA}},
			wantStatus: 401, wantBody: body401},
		{name: "Bearer without key", req: req{"GET", subs, nil, []string{"Authorization: Bearer"}},
			wantStatus: 401, wantBody: body401},
		{name: "malformed key", req: req{"GET", subs, nil, []string{"Authorization: Bearer sk_short"}},
			wantStatus: 401, wantBody: body401},
		{name: "key with a bad character", req: req{"GET", subs, nil, []string{"Authorization: Bearer " + keyA[:40] + "-"}},
			wantStatus: 401, wantBody: body401},
		{name: "unknown key", req: req{"GET", subs, nil, []string{bearer(keyUnknown)}},
			wantStatus: 401, wantBody: body401},
		{name: "revoked key", setup: func(e *env) { e.auth.Revoke(keyB) }, req: req{"GET", subs, nil, []string{bearer(keyB)}},
			wantStatus: 401, wantBody: body401},
		{name: "401 before a malformed body", req: req{"POST", subs, strings.NewReader(`{"email":`), nil},
			wantStatus: 401, wantBody: body401},
		{name: "401 before a wrong media type", req: req{"POST", subs, strings.NewReader(`x`), []string{"Content-Type: text/plain"}},
			wantStatus: 401, wantBody: body401},

		// 403
		{name: "plan without API access", req: req{"GET", subs, nil, []string{bearer(keyNoAccess)}},
			wantStatus: 403, wantBody: body403, golden: "403.json"},
		{name: "403 before validation", req: req{"POST", subs, strings.NewReader(`{"email":"bad"}`), []string{bearer(keyNoAccess)}},
			wantStatus: 403, wantBody: body403},

		// 404
		{name: "unknown route", req: req{"GET", "/api/v1/nope", nil, nil},
			wantStatus: 404, wantBody: `{"success":false,"code":"not_found","message":"The requested resource was not found."}`, golden: "404_route.json"},
		{name: "unknown route with a key", req: req{"GET", "/api/v1/subscribers/" + unknowID + "/extra", nil, []string{bearer(keyA)}},
			wantStatus: 404, wantBody: `{"success":false,"code":"not_found","message":"The requested resource was not found."}`},
		{name: "trailing slash", req: req{"GET", subs + "/", nil, []string{bearer(keyA)}},
			wantStatus: 404, wantBody: `{"success":false,"code":"not_found","message":"The requested resource was not found."}`},
		{name: "outside the base path", req: req{"POST", "/subscribers", strings.NewReader(`{}`), nil},
			wantStatus: 404, wantBody: `{"success":false,"code":"not_found","message":"The requested resource was not found."}`},
		{name: "unknown id", req: req{"GET", subs + "/" + unknowID, nil, []string{bearer(keyA)}},
			wantStatus: 404, wantBody: body404, golden: "404_subscriber.json"},
		{name: "id not a UUID", req: req{"GET", subs + "/123", nil, []string{bearer(keyA)}},
			wantStatus: 404, wantBody: body404},
		{name: "id of 36 characters, not a UUID", req: req{"GET", subs + "/zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz", nil, []string{bearer(keyA)}},
			wantStatus: 404, wantBody: body404},
		{name: "id a UUID in braces", req: req{"GET", subs + "/{" + unknowID + "}", nil, []string{bearer(keyA)}},
			wantStatus: 404, wantBody: body404},
		{name: "id a URN", req: req{"DELETE", subs + "/urn:uuid:" + unknowID, nil, []string{bearer(keyA)}},
			wantStatus: 404, wantBody: body404},
		{name: "update of a non-UUID id with a bad body", req: req{"PUT", subs + "/not-a-uuid", strings.NewReader(`{"status":"x"}`), []string{bearer(keyA)}},
			wantStatus: 404, wantBody: body404},
		{name: "unknown id on delete", req: req{"DELETE", subs + "/" + unknowID, nil, []string{bearer(keyA)}},
			wantStatus: 404, wantBody: body404},

		// 405 with Allow, decided by routing before authentication.
		{name: "PATCH on an item", req: req{"PATCH", subs + "/" + unknowID, strings.NewReader(`{}`), nil},
			wantStatus: 405, wantBody: `{"success":false,"code":"method_not_allowed","message":"The method is not allowed for this resource."}`,
			wantHeaders: map[string]string{"Allow": "DELETE, GET, HEAD, PUT"}, golden: "405.json"},
		{name: "DELETE on the collection", req: req{"DELETE", subs, nil, []string{bearer(keyA)}},
			wantStatus: 405, wantBody: `{"success":false,"code":"method_not_allowed","message":"The method is not allowed for this resource."}`,
			wantHeaders: map[string]string{"Allow": "GET, HEAD, POST"}},
		{name: "PUT on the collection", req: req{"PUT", subs, strings.NewReader(`{}`), []string{bearer(keyUnknown)}},
			wantStatus: 405, wantBody: `{"success":false,"code":"method_not_allowed","message":"The method is not allowed for this resource."}`,
			wantHeaders: map[string]string{"Allow": "GET, HEAD, POST"}},
		// GET /subscribers/{id} would take "bulk" for an id; the path is known, so it is 405.
		{name: "GET on bulk", req: req{"GET", subs + "/bulk", nil, []string{bearer(keyA)}},
			wantStatus: 405, wantBody: `{"success":false,"code":"method_not_allowed","message":"The method is not allowed for this resource."}`,
			wantHeaders: map[string]string{"Allow": "POST"}, golden: "405_bulk.json"},
		{name: "PUT on bulk", req: req{"PUT", subs + "/bulk", strings.NewReader(`{}`), nil},
			wantStatus: 405, wantBody: `{"success":false,"code":"method_not_allowed","message":"The method is not allowed for this resource."}`,
			wantHeaders: map[string]string{"Allow": "POST"}},
		{name: "DELETE on bulk", req: req{"DELETE", subs + "/bulk", nil, []string{bearer(keyA)}},
			wantStatus: 405, wantBody: `{"success":false,"code":"method_not_allowed","message":"The method is not allowed for this resource."}`,
			wantHeaders: map[string]string{"Allow": "POST"}},

		// 413 above 1 MiB, checked before the JSON is looked at.
		{name: "body over 1 MiB", req: req{"POST", subs, strings.NewReader(overMiB), []string{bearer(keyA)}},
			wantStatus: 413, wantBody: `{"success":false,"code":"payload_too_large","message":"The request body must not be larger than 1 MiB."}`, golden: "413.json"},
		{name: "bulk body over 1 MiB", req: req{"POST", subs + "/bulk", strings.NewReader(`[` + strings.Repeat(" ", 1<<20) + `]`), []string{bearer(keyA)}},
			wantStatus: 413, wantBody: `{"success":false,"code":"payload_too_large","message":"The request body must not be larger than 1 MiB."}`},

		// 415
		{name: "text/plain", req: req{"POST", subs, strings.NewReader(`{"email":"a@example.com"}`), []string{bearer(keyA), "Content-Type: text/plain"}},
			wantStatus: 415, wantBody: `{"success":false,"code":"unsupported_media_type","message":"The request body must be sent as application/json."}`, golden: "415.json"},
		{name: "form", req: req{"POST", subs, strings.NewReader(`email=a%40example.com`), []string{bearer(keyA), "Content-Type: application/x-www-form-urlencoded"}},
			wantStatus: 415, wantBody: `{"success":false,"code":"unsupported_media_type","message":"The request body must be sent as application/json."}`},
		{name: "multipart on update", req: req{"PUT", subs + "/" + unknowID, strings.NewReader(`--x--`), []string{bearer(keyA), "Content-Type: multipart/form-data; boundary=x"}},
			wantStatus: 415, wantBody: `{"success":false,"code":"unsupported_media_type","message":"The request body must be sent as application/json."}`},
		{name: "unparsable content type", req: req{"POST", subs + "/bulk", strings.NewReader(`[]`), []string{bearer(keyA), "Content-Type: application/json; charset"}},
			wantStatus: 415, wantBody: `{"success":false,"code":"unsupported_media_type","message":"The request body must be sent as application/json."}`},

		// 422
		{name: "field errors", req: req{"POST", subs, strings.NewReader(`{"email":"not-an-email","name":5,"status":"unsubscribed","id":"x"}`), []string{bearer(keyA)}},
			wantStatus: 422, wantBody: `{"success":false,"code":"validation_error","message":"The given data was invalid.","errors":{
				"email":["The email field must be a valid email address."],
				"name":["The name field must be a string."],
				"status":["The selected status is invalid; it must be active or pending."],
				"id":["The id field is prohibited."]}}`, golden: "422_create.json"},
		{name: "missing email", req: req{"POST", subs, strings.NewReader(`{}`), []string{bearer(keyA)}},
			wantStatus: 422, wantBody: `{"success":false,"code":"validation_error","message":"The given data was invalid.","errors":{"email":["The email field is required."]}}`},
		{name: "control character in name", req: req{"POST", subs, strings.NewReader(`{"email":"a@example.com","name":"a\u0000b"}`), []string{bearer(keyA)}},
			wantStatus: 422, wantBody: `{"success":false,"code":"validation_error","message":"The given data was invalid.","errors":{"name":["The name field contains invalid characters."]}}`},
		{name: "tab in name", req: req{"POST", subs, strings.NewReader(`{"email":"a@example.com","name":"a\tb"}`), []string{bearer(keyA)}},
			wantStatus: 422, wantBody: `{"success":false,"code":"validation_error","message":"The given data was invalid.","errors":{"name":["The name field contains invalid characters."]}}`},
		{name: "bulk keys", req: req{"POST", subs + "/bulk", strings.NewReader(`[{"email":"a@example.com"},{"email":"b@example.com","x":1},{"email":"bad"},{"email":"A@EXAMPLE.COM"},7]`), []string{bearer(keyA)}},
			wantStatus: 422, wantBody: `{"success":false,"code":"validation_error","message":"The given data was invalid.","errors":{
				"1.x":["The 1.x field is prohibited."],
				"2.email":["The 2.email field must be a valid email address."],
				"3.email":["The 3.email field has a duplicate value."],
				"4":["The 4 field must be an object."]}}`, golden: "422_bulk.json"},
		{name: "bulk empty", req: req{"POST", subs + "/bulk", strings.NewReader(`[]`), []string{bearer(keyA)}},
			wantStatus: 422, wantBody: `{"success":false,"code":"validation_error","message":"The given data was invalid.","errors":{"body":["The body field must have at least 1 item."]}}`},
		{name: "bulk 101 items", req: req{"POST", subs + "/bulk", strings.NewReader(`[` + strings.Repeat(`{"email":"a@example.com"},`, 100) + `{}]`), []string{bearer(keyA)}},
			wantStatus: 422, wantBody: `{"success":false,"code":"validation_error","message":"The given data was invalid.","errors":{"body":["The body field must not have more than 100 items."]}}`},
		{name: "update with an empty object", req: req{"PUT", subs + "/" + unknowID, strings.NewReader(`{}`), []string{bearer(keyA)}},
			wantStatus: 422, wantBody: `{"success":false,"code":"validation_error","message":"The given data was invalid.","errors":{"body":["At least one of email, name, status, attributes or tags must be provided."]}}`},
		{name: "email already subscribed", setup: func(e *env) { e.store.err = fmt.Errorf("insert: %w", model.ErrEmailTaken) },
			req:        req{"POST", subs, strings.NewReader(`{"email":"a@example.com"}`), []string{bearer(keyA)}},
			wantStatus: 422, wantBody: `{"success":false,"code":"email_already_subscribed","message":"Email is already subscribed to this newsletter.","errors":{"email":["Email is already subscribed to this newsletter."]}}`,
			golden: "422_email_taken.json"},
		{name: "bulk emails already subscribed", setup: func(e *env) { e.store.err = &model.EmailTakenError{Indexes: []int{0, 2}} },
			req:        req{"POST", subs + "/bulk", strings.NewReader(`[{"email":"a@example.com"},{"email":"b@example.com"},{"email":"c@example.com"}]`), []string{bearer(keyA)}},
			wantStatus: 422, wantBody: `{"success":false,"code":"validation_error","message":"The given data was invalid.","errors":{
				"0.email":["Email is already subscribed to this newsletter."],
				"2.email":["Email is already subscribed to this newsletter."]}}`},

		// 500: a generic message, never the cause.
		{name: "unknown store error", setup: func(e *env) {
			e.store.err = errors.New(`pq: relation "secret_table" does not exist; password=hunter2`)
		}, req: req{"GET", subs, nil, []string{bearer(keyA)}}, wantStatus: 500, wantBody: body500, golden: "500.json"},
		{name: "store panic", setup: func(e *env) { e.store.panicWith = `SELECT * FROM secret_table` },
			req: req{"POST", subs, strings.NewReader(`{"email":"a@example.com"}`), []string{bearer(keyA)}}, wantStatus: 500, wantBody: body500},
		{name: "store panic with an error value", setup: func(e *env) { e.store.panicWith = errors.New("driver: bad connection secret") },
			req: req{"DELETE", subs + "/" + unknowID, nil, []string{bearer(keyA)}}, wantStatus: 500, wantBody: body500},
		{name: "unknown authenticator error", setup: func(e *env) { e.auth.err = errors.New("pq: secret_table timeout") },
			req: req{"GET", subs, nil, []string{bearer(keyA)}}, wantStatus: 500, wantBody: body500},

		// 503 with Retry-After.
		{name: "store unavailable", setup: func(e *env) { e.store.err = fmt.Errorf("dial tcp 10.0.0.1:5432: %w", model.ErrUnavailable) },
			req:        req{"GET", subs + "/" + unknowID, nil, []string{bearer(keyA)}},
			wantStatus: 503, wantBody: `{"success":false,"code":"service_unavailable","message":"The service is temporarily unavailable. Please try again later."}`,
			wantHeaders: map[string]string{"Retry-After": "5"}, golden: "503.json"},
		{name: "authenticator unavailable", setup: func(e *env) { e.auth.err = fmt.Errorf("dial: %w", model.ErrUnavailable) },
			req:        req{"POST", subs + "/bulk", strings.NewReader(`[{"email":"a@example.com"}]`), []string{bearer(keyA)}},
			wantStatus: 503, wantBody: `{"success":false,"code":"service_unavailable","message":"The service is temporarily unavailable. Please try again later."}`,
			wantHeaders: map[string]string{"Retry-After": "5"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			if tt.setup != nil {
				tt.setup(e)
			}
			rec := e.do(t, tt.req)
			if rec.Code != tt.wantStatus {
				t.Fatalf("%s %s: status %d, body %.300s; want %d", tt.req.method, tt.req.path, rec.Code, rec.Body, tt.wantStatus)
			}
			if got := rec.Header().Get("Content-Type"); got != "application/json" {
				t.Errorf("Content-Type = %q; want application/json", got)
			}
			jsonEqual(t, rec.Body.Bytes(), tt.wantBody)
			for k, want := range tt.wantHeaders {
				if got := rec.Header().Values(k); len(got) != 1 || got[0] != want {
					t.Errorf("header %s = %q; want [%q]", k, got, want)
				}
			}
			wantAuth := []string(nil) // WWW-Authenticate: Bearer on every 401 and nowhere else
			if rec.Code == http.StatusUnauthorized {
				wantAuth = []string{"Bearer"}
			}
			if diff := cmp.Diff(wantAuth, rec.Header().Values("WWW-Authenticate")); diff != "" {
				t.Errorf("WWW-Authenticate on a %d mismatch (-want +got):\n%s", rec.Code, diff)
			}
			if wantRA := rec.Code == http.StatusServiceUnavailable; wantRA != (rec.Header().Get("Retry-After") != "") {
				t.Errorf("Retry-After = %q on a %d; want it exactly on 503 (and 429)", rec.Header().Get("Retry-After"), rec.Code)
			}
			if tt.wantStatus >= 400 && tt.wantStatus < 500 && tt.setup == nil {
				// No request that fails validation or authentication writes anything.
				for _, c := range e.store.Calls() {
					if c == "Create" || c == "CreateMany" || c == "Update" {
						t.Errorf("store.%s was called for a request answered %d", c, rec.Code)
					}
				}
			}
			for _, secret := range []string{"secret", "hunter2", "pq:", "driver", "goroutine", ".go:"} {
				if strings.Contains(rec.Body.String(), secret) {
					t.Errorf("body %s leaks %q", rec.Body, secret)
				}
			}
			if tt.golden != "" {
				golden(t, "errors/"+tt.golden, rec.Body.Bytes())
			}
		})
	}
}

// TestStoreNotCalledOnInvalidInput: a request failing validation changes nothing in the store;
// the only call it may make is an invalid bulk's read of which emails are taken.
func TestStoreNotCalledOnInvalidInput(t *testing.T) {
	tests := []struct {
		method, path, body string
	}{
		{"POST", subs, `{"email":"bad"}`},
		{"POST", subs + "/bulk", `[{"email":"a@example.com"},{"email":"a@example.com"}]`},
		{"POST", subs + "/bulk", `[{"email":"a@example.com","status":"pending"},{"email":"b@example.com","name":"\u001f"}]`},
		{"PUT", subs + "/" + unknowID, `{"email":"a@example.com","status":"unsubscribed"}`},
		{"GET", subs + "?limit=0", ``},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.body, func(t *testing.T) {
			e := newEnv(t)
			rec := e.call(t, tt.method, tt.path, tt.body)
			if rec.Code != http.StatusUnprocessableEntity && rec.Code != http.StatusBadRequest {
				t.Fatalf("status %d, body %s; want 422 or 400", rec.Code, rec.Body)
			}
			if calls := slices.DeleteFunc(e.store.Calls(), func(c string) bool { return c == "TakenEmails" }); len(calls) != 0 {
				t.Errorf("store calls = %v; want none but TakenEmails", calls)
			}
		})
	}
}

// TestLargeNumberIsAFieldError: a number too large for float64 is still valid JSON, so it is a
// wrong type for its field like any other number (docs/api-contract.md §3), not Go decoder text.
func TestLargeNumberIsAFieldError(t *testing.T) {
	tests := []struct {
		name, big, small string
	}{
		{"name", `{"email":"a@example.com","name":1e400}`, `{"email":"a@example.com","name":5}`},
		{"email", `{"email":-1e999}`, `{"email":5}`},
		{"prohibited", `{"email":"a@example.com","n":1e400}`, `{"email":"a@example.com","n":5}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			got := e.call(t, "POST", subs, tt.big)
			want := e.call(t, "POST", subs, tt.small)
			if got.Code != want.Code {
				t.Errorf("status %d for %s; want %d as for %s", got.Code, tt.big, want.Code, tt.small)
			}
			jsonEqual(t, got.Body.Bytes(), want.Body.String())
		})
	}
}
