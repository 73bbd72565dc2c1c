package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/subscriberd/subscriberd/model"
)

const wantCreatedAt = "2026-06-11T17:00:00+00:00"

func TestCreate(t *testing.T) {
	tests := []struct {
		name string
		body string
		want model.NewSubscriber // what the store receives
		data string              // the data of the response
	}{
		{
			name: "email only",
			body: `{"email":"a@example.com"}`,
			want: model.NewSubscriber{Email: "a@example.com", Status: model.StatusActive},
			data: `{"id":"01900000-0000-7000-8000-000000000001","email":"a@example.com","name":"","status":"active","created_at":"2026-06-11T17:00:00+00:00","attributes":{},"tags":[]}`,
		},
		{
			name: "pending with a name split at the first space",
			body: `{"email":"  John.Doe@Example.com ","name":"  John   Doe Jr ","status":"pending"}`,
			want: model.NewSubscriber{Email: "John.Doe@Example.com", FirstName: "John", LastName: "Doe Jr", Status: model.StatusPending},
			data: `{"id":"01900000-0000-7000-8000-000000000001","email":"John.Doe@Example.com","name":"John Doe Jr","status":"pending","created_at":"2026-06-11T17:00:00+00:00","attributes":{},"tags":[]}`,
		},
		{
			name: "unicode domain returned exactly",
			body: `{"email":"用户@例子.广告","name":null}`,
			want: model.NewSubscriber{Email: "用户@例子.广告", Status: model.StatusActive},
			data: `{"id":"01900000-0000-7000-8000-000000000001","email":"用户@例子.广告","name":"","status":"active","created_at":"2026-06-11T17:00:00+00:00","attributes":{},"tags":[]}`,
		},
		{
			name: "escaped unicode in JSON",
			body: `{"email":"a@m\u00fcnchen.de","name":"Zo\u00eb"}`,
			want: model.NewSubscriber{Email: "a@münchen.de", FirstName: "Zoë", Status: model.StatusActive},
			data: `{"id":"01900000-0000-7000-8000-000000000001","email":"a@münchen.de","name":"Zoë","status":"active","created_at":"2026-06-11T17:00:00+00:00","attributes":{},"tags":[]}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			rec := e.call(t, "POST", subs, tt.body)
			if rec.Code != http.StatusCreated {
				t.Fatalf("status %d, body %s; want 201", rec.Code, rec.Body)
			}
			jsonEqual(t, rec.Body.Bytes(), `{"success":true,"data":`+tt.data+`}`)
			if got, want := rec.Header().Get("Location"), "/api/v1/subscribers/01900000-0000-7000-8000-000000000001"; got != want {
				t.Errorf("Location = %q; want %q", got, want)
			}
			if diff := cmp.Diff([]model.NewSubscriber{tt.want}, e.store.created()); diff != "" {
				t.Errorf("store received (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCreateBodySizeLimit(t *testing.T) {
	tests := []struct {
		name       string
		size       int
		wantStatus int
	}{
		{"exactly 1 MiB", 1 << 20, http.StatusCreated},
		{"1 MiB and one byte", 1<<20 + 1, http.StatusRequestEntityTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj := `{"email":"a@example.com"}`
			body := obj + strings.Repeat(" ", tt.size-len(obj)) // valid JSON of the exact size
			e := newEnv(t)
			rec := e.call(t, "POST", subs, body)
			if rec.Code != tt.wantStatus {
				t.Errorf("status for a %d-byte body = %d, body %.200s; want %d", len(body), rec.Code, rec.Body, tt.wantStatus)
			}
		})
	}
}

func TestContentTypes(t *testing.T) {
	tests := []struct {
		name    string
		headers []string
		want    int
	}{
		{"application/json", []string{"Content-Type: application/json"}, http.StatusCreated},
		{"with charset", []string{"Content-Type: application/json; charset=utf-8"}, http.StatusCreated},
		{"no space before the parameter", []string{"Content-Type: application/json;charset=UTF-8"}, http.StatusCreated},
		{"none", nil, http.StatusCreated},
		{"text/plain", []string{"Content-Type: text/plain"}, http.StatusUnsupportedMediaType},
		{"text/json", []string{"Content-Type: text/json"}, http.StatusUnsupportedMediaType},
		{"problem+json", []string{"Content-Type: application/problem+json"}, http.StatusUnsupportedMediaType},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			rec := e.call(t, "POST", subs, `{"email":"a@example.com"}`, tt.headers...)
			if rec.Code != tt.want {
				t.Errorf("status %d, body %s; want %d", rec.Code, rec.Body, tt.want)
			}
		})
	}
}

// TestContentTypeCaseInsensitive: media types and their parameters are case-insensitive and
// may have white space around ";" (RFC 9110 §8.3), so these are application/json as well.
func TestContentTypeCaseInsensitive(t *testing.T) {
	for _, ct := range []string{"Application/JSON", "APPLICATION/JSON; charset=utf-8", "application/json ; charset=utf-8"} {
		t.Run(ct, func(t *testing.T) {
			e := newEnv(t)
			rec := e.call(t, "POST", subs, `{"email":"a@example.com"}`, "Content-Type: "+ct)
			if rec.Code != http.StatusCreated {
				t.Errorf("status %d, body %s; want 201", rec.Code, rec.Body)
			}
		})
	}
}

func TestAuthorizationHeaderForms(t *testing.T) {
	tests := []struct {
		name   string
		header string
		want   int
	}{
		{"Bearer", "Bearer " + keyA, http.StatusOK},
		{"lower-case scheme", "bearer " + keyA, http.StatusOK},
		{"upper-case scheme", "BEARER " + keyA, http.StatusOK},
		{"extra spaces before the key", "Bearer   " + keyA, http.StatusOK},
		{"lower-case key", "Bearer " + strings.ToLower(keyA), http.StatusUnauthorized},
		{"two keys", "Bearer " + keyA + " " + keyA, http.StatusUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			rec := e.do(t, req{"GET", subs, nil, []string{"Authorization: " + tt.header}})
			if rec.Code != tt.want {
				t.Errorf("status %d, body %s; want %d", rec.Code, rec.Body, tt.want)
			}
		})
	}
}

// A revoked key gets the answer of an unknown one; only the metric and the auth event tell
// them apart, for an operator looking for an integration still sending it.
func TestRevokedKeyIsAnsweredAsUnknownButCountedApart(t *testing.T) {
	e := newEnv(t)
	unknown := e.do(t, req{"GET", subs, nil, []string{bearer(keyUnknown)}})
	e.auth.Revoke(keyB)
	revoked := e.do(t, req{"GET", subs, nil, []string{bearer(keyB)}})
	if revoked.Code != http.StatusUnauthorized || revoked.Body.String() != unknown.Body.String() ||
		revoked.Header().Get("WWW-Authenticate") != unknown.Header().Get("WWW-Authenticate") {
		t.Errorf("revoked key: %d %s %v; unknown key: %d %s %v", revoked.Code, revoked.Body, revoked.Header(),
			unknown.Code, unknown.Body, unknown.Header())
	}
	if diff := cmp.Diff(map[string]int{"invalid": 1, "revoked": 1}, e.metrics.authFailures); diff != "" {
		t.Errorf("auth failures (-want +got):\n%s", diff)
	}
}

// An invalid bulk reports the items whose email is taken too: every failing field at once (§3).
func TestInvalidBulkReportsTakenEmailsToo(t *testing.T) {
	e := newEnv(t)
	if rec := e.call(t, "POST", subs, `{"email":"taken@example.com"}`); rec.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", rec.Code, rec.Body)
	}
	rec := e.call(t, "POST", subs+"/bulk", `[{"email":"Taken@example.com"},{"email":"new1@example.com"},{"email":"NEW1@example.com"},{"email":"bad"}]`)
	if rec.Code != http.StatusUnprocessableEntity {
		t.Fatalf("status %d, body %s; want 422", rec.Code, rec.Body)
	}
	jsonEqual(t, rec.Body.Bytes(), `{"success":false,"code":"validation_error","message":"The given data was invalid.","errors":{
		"0.email":["Email is already subscribed to this newsletter."],
		"2.email":["The 2.email field has a duplicate value."],
		"3.email":["The 3.email field must be a valid email address."]}}`)
	// The lookup failing leaves the rules' errors as they are: never a 503 for a 422.
	e.store.mu.Lock()
	e.store.err = model.ErrUnavailable // the only call an invalid bulk makes is the lookup
	e.store.mu.Unlock()
	rec = e.call(t, "POST", subs+"/bulk", `[{"email":"taken@example.com"},{"email":"bad"}]`)
	if rec.Code != http.StatusUnprocessableEntity || strings.Contains(rec.Body.String(), "0.email") {
		t.Errorf("with the lookup failing: %d %s; want the 422 of the rules alone", rec.Code, rec.Body)
	}
}

func TestMalformedKeyNeedsNoLookup(t *testing.T) {
	e := newEnv(t)
	for _, h := range []string{"", "Basic x", "Bearer sk_short", "Bearer " + strings.Repeat("A", 43)} {
		e.do(t, req{"GET", subs, nil, []string{"Authorization: " + h}})
	}
	if n := e.auth.Lookups(); n != 0 {
		t.Errorf("authenticator lookups = %d for malformed keys; want 0", n)
	}
}

func TestBulkCreate(t *testing.T) {
	e := newEnv(t)
	rec := e.call(t, "POST", subs+"/bulk", `[{"email":"b@example.com","status":"pending","name":"B"},{"email":"a@example.com","name":"A A"}]`)
	if rec.Code != http.StatusCreated {
		t.Fatalf("status %d, body %s; want 201", rec.Code, rec.Body)
	}
	jsonEqual(t, rec.Body.Bytes(), `{"success":true,"data":{"created":[
		{"id":"01900000-0000-7000-8000-000000000001","email":"b@example.com","name":"B","status":"pending","created_at":"`+wantCreatedAt+`","attributes":{},"tags":[]},
		{"id":"01900000-0000-7000-8000-000000000002","email":"a@example.com","name":"A A","status":"active","created_at":"`+wantCreatedAt+`","attributes":{},"tags":[]}]}}`)
	if loc := rec.Header().Get("Location"); loc != "" {
		t.Errorf("Location = %q on bulk; want none", loc)
	}
	if diff := cmp.Diff(map[string]int{"bulk/pending": 1, "bulk/active": 1}, e.metrics.created); diff != "" {
		t.Errorf("SubscribersCreated mismatch (-want +got):\n%s", diff)
	}
}

func TestBulkCreateHundredItems(t *testing.T) {
	var b strings.Builder
	b.WriteString("[")
	for i := range model.MaxBulkItems {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"email":"user%d@example.com"}`, i)
	}
	b.WriteString("]")
	e := newEnv(t)
	rec := e.call(t, "POST", subs+"/bulk", b.String())
	if rec.Code != http.StatusCreated {
		t.Fatalf("status %d, body %.300s; want 201", rec.Code, rec.Body)
	}
	if n := len(e.store.created()); n != 100 {
		t.Errorf("store created %d; want 100", n)
	}
}

func TestList(t *testing.T) {
	e := newEnv(t)
	for _, body := range []string{
		`{"email":"1@example.com"}`, `{"email":"2@example.com","status":"pending"}`, `{"email":"3@example.com"}`,
	} {
		e.create(t, keyA, body)
	}
	e.create(t, keyB, `{"email":"other@example.com"}`)
	id := func(n string) string { return `"01900000-0000-7000-8000-00000000000` + n + `"` }
	sub := func(n, status string) string {
		return `{"id":` + id(n) + `,"email":"` + n + `@example.com","name":"","status":"` + status + `","created_at":"` + wantCreatedAt + `","attributes":{},"tags":[]}`
	}
	tests := []struct {
		name  string
		query string
		want  string
		raw   string // a substring the raw body must contain
	}{
		{"defaults, newest first, own newsletter only", "",
			`{"success":true,"data":[` + sub("3", "active") + `,` + sub("2", "pending") + `,` + sub("1", "active") + `],"pagination":{"page":1,"limit":25,"total":3,"pages":1,"next_cursor":null}}`, ""},
		{"first page", "?limit=2",
			`{"success":true,"data":[` + sub("3", "active") + `,` + sub("2", "pending") + `],"pagination":{"page":1,"limit":2,"total":3,"pages":2,"next_cursor":"CURSOR"}}`, ""},
		{"second page", "?limit=2&page=2",
			`{"success":true,"data":[` + sub("1", "active") + `],"pagination":{"page":2,"limit":2,"total":3,"pages":2,"next_cursor":null}}`, ""},
		{"page past the end", "?limit=2&page=9",
			`{"success":true,"data":[],"pagination":{"page":9,"limit":2,"total":3,"pages":2,"next_cursor":null}}`, `"data":[]`},
		{"status filter", "?status=pending",
			`{"success":true,"data":[` + sub("2", "pending") + `],"pagination":{"page":1,"limit":25,"total":1,"pages":1,"next_cursor":null}}`, ""},
		{"no match", "?status=unsubscribed",
			`{"success":true,"data":[],"pagination":{"page":1,"limit":25,"total":0,"pages":0,"next_cursor":null}}`, `"data":[]`},
		{"empty values are absent, unknown parameters ignored", "?page=&limit=&status=&sort=email",
			`{"success":true,"data":[` + sub("3", "active") + `,` + sub("2", "pending") + `,` + sub("1", "active") + `],"pagination":{"page":1,"limit":25,"total":3,"pages":1,"next_cursor":null}}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := e.call(t, "GET", subs+tt.query, "")
			if rec.Code != http.StatusOK {
				t.Fatalf("status %d, body %s; want 200", rec.Code, rec.Body)
			}
			jsonEqual(t, maskCursor(t, rec.Body.Bytes()), tt.want)
			if !strings.Contains(rec.Body.String(), tt.raw) {
				t.Errorf("body %s; want it to contain %s", rec.Body, tt.raw)
			}
		})
	}
}

func TestListPagesRoundUp(t *testing.T) {
	e := newEnv(t)
	for range 51 {
		e.store.add(newsletterA)
	}
	rec := e.call(t, "GET", subs+"?limit=25&page=3", "")
	var got struct {
		Data       []map[string]any
		Pagination map[string]any
	}
	decodeInto(t, rec, &got)
	if diff := cmp.Diff(map[string]any{"page": 3.0, "limit": 25.0, "total": 51.0, "pages": 3.0, "next_cursor": nil}, got.Pagination); diff != "" {
		t.Errorf("pagination mismatch (-want +got):\n%s", diff)
	}
	if len(got.Data) != 1 {
		t.Errorf("page 3 has %d items; want 1", len(got.Data))
	}
}

func TestGetUpdateUnsubscribe(t *testing.T) {
	e := newEnv(t)
	id := e.create(t, keyA, `{"email":"a@example.com","name":"John Doe","status":"pending"}`)
	other := e.create(t, keyA, `{"email":"taken@example.com"}`)
	foreign := e.create(t, keyB, `{"email":"b@example.com"}`)
	item := subs + "/" + id
	one := func(email, name, status string) string {
		return `{"success":true,"data":{"id":"` + id + `","email":"` + email + `","name":"` + name + `","status":"` + status + `","created_at":"` + wantCreatedAt + `","attributes":{},"tags":[]}}`
	}
	steps := []struct {
		name       string
		method     string
		path       string
		body       string
		wantStatus int
		want       string
	}{
		{"get", "GET", item, "", 200, one("a@example.com", "John Doe", "pending")},
		{"get with an upper-case id", "GET", subs + "/" + strings.ToUpper(id), "", 200, one("a@example.com", "John Doe", "pending")},
		{"another newsletter's id is unknown", "GET", subs + "/" + foreign, "", 404, body404},
		{"update another newsletter's id", "PUT", subs + "/" + foreign, `{"status":"active"}`, 404, body404},
		{"delete another newsletter's id", "DELETE", subs + "/" + foreign, "", 404, body404},
		{"update name only", "PUT", item, `{"name":"  Jane   Roe "}`, 200, one("a@example.com", "Jane Roe", "pending")},
		{"null name clears", "PUT", item, `{"name":null}`, 200, one("a@example.com", "", "pending")},
		{"status active", "PUT", item, `{"status":"active"}`, 200, one("a@example.com", "", "active")},
		{"email trimmed", "PUT", item, `{"email":" New@Example.com "}`, 200, one("New@Example.com", "", "active")},
		{"email of another subscriber", "PUT", item, `{"email":"TAKEN@example.com"}`, 422,
			`{"success":false,"code":"email_already_subscribed","message":"Email is already subscribed to this newsletter.","errors":{"email":["Email is already subscribed to this newsletter."]}}`},
		{"status unsubscribed is not an input", "PUT", item, `{"status":"unsubscribed"}`, 422,
			`{"success":false,"code":"validation_error","message":"The given data was invalid.","errors":{"status":["The selected status is invalid; it must be active or pending. To unsubscribe, send DELETE /api/v1/subscribers/{id}."]}}`},
		{"unsubscribe", "DELETE", item, "", 200, one("New@Example.com", "", "unsubscribed")},
		{"unsubscribe again is the same", "DELETE", item, "", 200, one("New@Example.com", "", "unsubscribed")},
		{"re-subscribe with active", "PUT", item, `{"status":"active","name":"Cher"}`, 200, one("New@Example.com", "Cher", "active")},
	}
	for _, s := range steps {
		rec := e.call(t, s.method, s.path, s.body)
		if rec.Code != s.wantStatus {
			t.Fatalf("%s: status %d, body %s; want %d", s.name, rec.Code, rec.Body, s.wantStatus)
		}
		jsonEqual(t, rec.Body.Bytes(), s.want)
	}
	if got := e.call(t, "GET", subs+"/"+other, ""); got.Code != http.StatusOK {
		t.Errorf("other subscriber: status %d; want 200", got.Code)
	}
}

// TestCreatedAtFormat: RFC 3339, UTC, whole seconds, numeric offset, whatever the stored zone.
func TestCreatedAtFormat(t *testing.T) {
	e := newEnv(t)
	rec := e.call(t, "POST", subs, `{"email":"a@example.com"}`)
	var got struct {
		Data struct {
			CreatedAt string `json:"created_at"`
		}
	}
	decodeInto(t, rec, &got)
	if got.Data.CreatedAt != wantCreatedAt {
		t.Errorf("created_at = %q; want %q (from %v)", got.Data.CreatedAt, wantCreatedAt, createdAt)
	}
	if !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00$`).MatchString(got.Data.CreatedAt) {
		t.Errorf("created_at = %q; want the shape 2026-06-11T17:00:00+00:00", got.Data.CreatedAt)
	}
}

// TestSuccessBodiesCarryOnlyContractFields: no $schema, no extra fields, a boolean success.
func TestSuccessBodiesCarryOnlyContractFields(t *testing.T) {
	e := newEnv(t)
	rec := e.call(t, "POST", subs, `{"email":"a@example.com"}`)
	body := decode(t, rec)
	if diff := cmp.Diff([]string{"data", "success"}, keys(body)); diff != "" {
		t.Errorf("top-level keys mismatch (-want +got):\n%s", diff)
	}
	data, _ := body["data"].(map[string]any)
	if diff := cmp.Diff([]string{"attributes", "created_at", "email", "id", "name", "status", "tags"}, keys(data)); diff != "" {
		t.Errorf("subscriber keys mismatch (-want +got):\n%s", diff)
	}
	if rec.Header().Get("Link") != "" {
		t.Errorf("Link = %q; want none", rec.Header().Get("Link"))
	}
}

// maskCursor replaces a string pagination.next_cursor of a list body with "CURSOR" (cursors
// are signed with a per-process key in these tests).
func maskCursor(t *testing.T, body []byte) []byte {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("body %s: %v", body, err)
	}
	if pg, ok := v["pagination"].(map[string]any); ok {
		if _, ok := pg["next_cursor"].(string); ok {
			pg["next_cursor"] = "CURSOR"
		}
	}
	out, _ := json.Marshal(v)
	return out
}
