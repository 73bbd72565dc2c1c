package integration

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/model"
)

var timestampRE = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00$`)

func TestCreateSubscriber(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.do("POST", "/subscribers", map[string]any{"email": "  John@Example.com ", "name": "  John Doe Jr "}).
		want(t, http.StatusCreated, "")
	d := r.data(t)
	id, err := uuid.Parse(d["id"].(string))
	if err != nil || id.Version() != 7 {
		t.Errorf("id = %v, want a UUIDv7", d["id"])
	}
	if got, want := r.header.Get("Location"), "/api/v1/subscribers/"+id.String(); got != want {
		t.Errorf("Location = %q, want %q", got, want)
	}
	want := map[string]any{"id": id.String(), "email": "John@Example.com", "name": "John Doe Jr", "status": "active", "created_at": d["created_at"], "attributes": map[string]any{}, "tags": []any{}}
	if diff := cmp.Diff(want, d); diff != "" {
		t.Errorf("data (-want +got):\n%s", diff)
	}
	if !timestampRE.MatchString(d["created_at"].(string)) {
		t.Errorf("created_at = %v, want RFC 3339 UTC whole seconds with +00:00", d["created_at"])
	}
	if r.body["success"] != true || len(r.body) != 2 {
		t.Errorf("envelope = %s, want success and data only", r.raw)
	}
	// Stored split at the first space, and read back the same.
	if n := e.count("SELECT count(*) FROM subscribers WHERE first_name = 'John' AND last_name = 'Doe Jr'"); n != 1 {
		t.Errorf("stored name split rows = %d, want 1", n)
	}
	got := e.do("GET", "/subscribers/"+id.String(), nil).want(t, http.StatusOK, "").data(t)
	if diff := cmp.Diff(d, got); diff != "" {
		t.Errorf("get after create (-create +get):\n%s", diff)
	}
	// Active: no confirmation email queued.
	if n := e.count("SELECT count(*) FROM email_outbox"); n != 0 {
		t.Errorf("outbox rows = %d, want 0 for an active subscriber", n)
	}
}

func TestCreatePendingQueuesOneEmail(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.do("POST", "/subscribers", map[string]any{"email": "p@example.com", "status": "pending"}).
		want(t, http.StatusCreated, "").data(t)
	if d["status"] != "pending" || d["name"] != "" {
		t.Errorf("data = %v, want pending with empty name", d)
	}
	if n := e.count("SELECT count(*) FROM email_outbox WHERE subscriber_id = ? AND state = 'pending'", d["id"]); n != 1 {
		t.Errorf("pending outbox rows = %d, want 1", n)
	}
}

func TestCreateUnicodeDomainRoundTrips(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.do("POST", "/subscribers", map[string]any{"email": "jörg@bücher.example", "name": "Jörg Ünal"}).
		want(t, http.StatusCreated, "").data(t)
	if d["email"] != "jörg@bücher.example" || d["name"] != "Jörg Ünal" {
		t.Errorf("data = %v, want the email and name exactly as given", d)
	}
}

func TestDuplicateEmails(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	first := e.do("POST", "/subscribers", map[string]any{"email": "a@x.io"}).want(t, http.StatusCreated, "").data(t)
	wantTaken := map[string][]string{"email": {"Email is already subscribed to this newsletter."}}

	t.Run("same case-insensitively", func(t *testing.T) {
		r := e.do("POST", "/subscribers", map[string]any{"email": "A@X.IO", "status": "pending"}).
			want(t, http.StatusUnprocessableEntity, "email_already_subscribed")
		if r.body["message"] != "Email is already subscribed to this newsletter." {
			t.Errorf("message = %v", r.body["message"])
		}
		if diff := cmp.Diff(wantTaken, r.fieldErrors(t)); diff != "" {
			t.Errorf("errors (-want +got):\n%s", diff)
		}
	})
	t.Run("of an unsubscribed subscriber", func(t *testing.T) {
		e.do("DELETE", "/subscribers/"+first["id"].(string), nil).want(t, http.StatusOK, "")
		e.do("POST", "/subscribers", map[string]any{"email": "a@x.io"}).
			want(t, http.StatusUnprocessableEntity, "email_already_subscribed")
	})
	t.Run("bulk item against stored", func(t *testing.T) {
		r := e.do("POST", "/subscribers/bulk", []any{
			map[string]any{"email": "new1@x.io"}, map[string]any{"email": "A@x.io"},
		}).want(t, http.StatusUnprocessableEntity, "validation_error")
		want := map[string][]string{"1.email": {"Email is already subscribed to this newsletter."}}
		if diff := cmp.Diff(want, r.fieldErrors(t)); diff != "" {
			t.Errorf("errors (-want +got):\n%s", diff)
		}
	})
	t.Run("within one bulk", func(t *testing.T) {
		r := e.do("POST", "/subscribers/bulk", []any{
			map[string]any{"email": "d@x.io"}, map[string]any{"email": "e@x.io"}, map[string]any{"email": "D@X.io"},
		}).want(t, http.StatusUnprocessableEntity, "validation_error")
		want := map[string][]string{"2.email": {"The 2.email field has a duplicate value."}}
		if diff := cmp.Diff(want, r.fieldErrors(t)); diff != "" {
			t.Errorf("errors (-want +got):\n%s", diff)
		}
	})
	t.Run("update to another subscriber's email", func(t *testing.T) {
		other := e.do("POST", "/subscribers", map[string]any{"email": "b@x.io"}).want(t, http.StatusCreated, "").data(t)
		r := e.do("PUT", "/subscribers/"+other["id"].(string), map[string]any{"email": "a@X.io"}).
			want(t, http.StatusUnprocessableEntity, "email_already_subscribed")
		if diff := cmp.Diff(wantTaken, r.fieldErrors(t)); diff != "" {
			t.Errorf("errors (-want +got):\n%s", diff)
		}
		// Its own email in another case is fine.
		got := e.do("PUT", "/subscribers/"+other["id"].(string), map[string]any{"email": "B@x.io"}).
			want(t, http.StatusOK, "").data(t)
		if got["email"] != "B@x.io" {
			t.Errorf("email = %v, want B@x.io", got["email"])
		}
	})
	if n := e.count("SELECT count(*) FROM subscribers"); n != 2 {
		t.Errorf("subscribers = %d, want 2 (nothing created by the failures)", n)
	}
}

func TestConcurrentDuplicateCreates(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const n = 20
	statuses := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := e.do("POST", "/subscribers", map[string]any{"email": "Same@Example.com", "status": []string{"active", "pending"}[i%2]})
			statuses[i] = r.status
			if r.status == http.StatusUnprocessableEntity && r.body["code"] != "email_already_subscribed" {
				t.Errorf("422 code = %v", r.body["code"])
			}
		}()
	}
	wg.Wait()
	count := map[int]int{}
	for _, s := range statuses {
		count[s]++
	}
	if diff := cmp.Diff(map[int]int{201: 1, 422: n - 1}, count); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	if got := e.count("SELECT count(*) FROM subscribers"); got != 1 {
		t.Errorf("stored = %d, want 1", got)
	}
}

func TestBulkCreate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	items := []any{
		map[string]any{"email": "one@x.io", "name": "One Person", "status": "pending"},
		map[string]any{"email": "two@x.io"},
		map[string]any{"email": "three@x.io", "name": nil, "status": "active"},
	}
	r := e.do("POST", "/subscribers/bulk", items).want(t, http.StatusCreated, "")
	created, ok := r.data(t)["created"].([]any)
	if !ok || len(created) != 3 {
		t.Fatalf("created = %v, want 3 subscribers", r.data(t)["created"])
	}
	for i, want := range []struct{ email, name, status string }{
		{"one@x.io", "One Person", "pending"}, {"two@x.io", "", "active"}, {"three@x.io", "", "active"},
	} {
		got := created[i].(map[string]any)
		if got["email"] != want.email || got["name"] != want.name || got["status"] != want.status {
			t.Errorf("created[%d] = %v, want %+v (input order)", i, got, want)
		}
		// Each returned id really is that email's row.
		if n := e.count("SELECT count(*) FROM subscribers WHERE id = ? AND email = ?", got["id"], want.email); n != 1 {
			t.Errorf("created[%d] id does not belong to %s", i, want.email)
		}
	}
	if n := e.count("SELECT count(*) FROM email_outbox"); n != 1 {
		t.Errorf("outbox rows = %d, want 1 (one pending item)", n)
	}
}

func TestBulkIsAllOrNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.do("POST", "/subscribers", map[string]any{"email": "taken@x.io"}).want(t, http.StatusCreated, "")
	cases := []struct {
		name  string
		items []any
		want  map[string][]string
	}{
		{"invalid item", []any{
			map[string]any{"email": "ok1@x.io", "status": "pending"},
			map[string]any{"email": "ok2@x.io"},
			map[string]any{"email": "bad", "zzz": 1},
			map[string]any{"status": "x"},
		}, map[string][]string{
			"2.email":  {"The 2.email field must be a valid email address."},
			"2.zzz":    {"The 2.zzz field is prohibited."},
			"3.email":  {"The 3.email field is required."},
			"3.status": {"The selected 3.status is invalid; it must be active or pending."},
		}},
		{"stored email", []any{
			map[string]any{"email": "ok1@x.io", "status": "pending"},
			map[string]any{"email": "TAKEN@x.io"},
		}, map[string][]string{"1.email": {"Email is already subscribed to this newsletter."}}},
		// Every failing field at once (§3): the stored email with the rules' errors.
		{"stored email and broken rules", []any{
			map[string]any{"email": "Taken@x.io"},
			map[string]any{"email": "new1@x.io"},
			map[string]any{"email": "NEW1@x.io", "status": "x"},
		}, map[string][]string{
			"0.email":  {"Email is already subscribed to this newsletter."},
			"2.email":  {"The 2.email field has a duplicate value."},
			"2.status": {"The selected 2.status is invalid; it must be active or pending."},
		}},
		{"empty", []any{}, map[string][]string{"body": {"The body field must have at least 1 item."}}},
		{"101 items", manyItems(101), map[string][]string{"body": {"The body field must not have more than 100 items."}}},
		{"not objects", []any{1, "x"}, map[string][]string{"0": {"The 0 field must be an object."}, "1": {"The 1 field must be an object."}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do("POST", "/subscribers/bulk", tc.items).want(t, http.StatusUnprocessableEntity, "validation_error")
			if diff := cmp.Diff(tc.want, r.fieldErrors(t)); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
	if n := e.count("SELECT count(*) FROM subscribers"); n != 1 {
		t.Errorf("subscribers = %d, want 1: failed bulks must create nothing", n)
	}
	if n := e.count("SELECT count(*) FROM email_outbox"); n != 0 {
		t.Errorf("outbox rows = %d, want 0: failed bulks must queue nothing", n)
	}
	// 100 items is the maximum and goes through.
	r := e.do("POST", "/subscribers/bulk", manyItems(100)).want(t, http.StatusCreated, "")
	if got := len(r.data(t)["created"].([]any)); got != 100 {
		t.Errorf("created %d, want 100", got)
	}
}

func manyItems(n int) []any {
	items := make([]any, n)
	for i := range items {
		items[i] = map[string]any{"email": fmt.Sprintf("item%d@x.io", i)}
	}
	return items
}

func TestValidation(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	localpart := strings.Repeat("a", 64)
	label := strings.Repeat("d", 63)
	email254 := localpart + "@" + label + "." + label + "." + strings.Repeat("e", 57) + ".io" // 64+1+63+1+63+1+57+1+2 = 253
	email254 = "b" + email254[1:]
	if n := len([]rune(email254)); n != 253 {
		t.Fatalf("test setup: email254 has %d characters", n)
	}
	email254 = localpart + "@" + label + "." + label + "." + strings.Repeat("e", 58) + ".io"
	multibyte254 := strings.Repeat("é", 64) + "@" + strings.Repeat("ü", 63) + "." + strings.Repeat("ö", 63) + "." + strings.Repeat("ä", 58) + ".io"
	cases := []struct {
		name string
		body any
		want map[string][]string // nil: accepted
	}{
		{"email 254 characters", map[string]any{"email": email254}, nil},
		{"email 254 characters, multi-byte", map[string]any{"email": multibyte254}, nil},
		{"email 255 characters", map[string]any{"email": "x" + email254},
			map[string][]string{"email": {"The email field must not be greater than 254 characters."}}},
		{"email missing", map[string]any{"name": "X"}, map[string][]string{"email": {"The email field is required."}}},
		{"email null", map[string]any{"email": nil}, map[string][]string{"email": {"The email field is required."}}},
		{"email not a string", map[string]any{"email": 5}, map[string][]string{"email": {"The email field must be a string."}}},
		{"email with display name", map[string]any{"email": "John <j@x.io>"}, map[string][]string{"email": {"The email field must be a valid email address."}}},
		{"email without dot in domain", map[string]any{"email": "j@localhost"}, map[string][]string{"email": {"The email field must be a valid email address."}}},
		{"email with space", map[string]any{"email": "j d@x.io"}, map[string][]string{"email": {"The email field must be a valid email address."}}},
		{"name 255 characters, multi-byte", map[string]any{"email": "n1@x.io", "name": strings.Repeat("ж", 255)}, nil},
		{"name 256 characters", map[string]any{"email": "n2@x.io", "name": strings.Repeat("ж", 256)},
			map[string][]string{"name": {"The name field must not be greater than 255 characters."}}},
		{"name control character", map[string]any{"email": "n3@x.io", "name": "a\u0000b"},
			map[string][]string{"name": {"The name field contains invalid characters."}}},
		{"name DEL", map[string]any{"email": "n4@x.io", "name": "a\u007fb"},
			map[string][]string{"name": {"The name field contains invalid characters."}}},
		{"name not a string", map[string]any{"email": "n5@x.io", "name": []int{1}},
			map[string][]string{"name": {"The name field must be a string."}}},
		{"status unsubscribed", map[string]any{"email": "s@x.io", "status": "unsubscribed"},
			map[string][]string{"status": {"The selected status is invalid; it must be active or pending."}}},
		{"unknown properties", map[string]any{"email": "u@x.io", "id": "x", "created_at": "y"},
			map[string][]string{"created_at": {"The created_at field is prohibited."}, "id": {"The id field is prohibited."}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := e.count("SELECT count(*) FROM subscribers")
			r := e.do("POST", "/subscribers", tc.body)
			if tc.want == nil {
				r.want(t, http.StatusCreated, "")
				return
			}
			r.want(t, http.StatusUnprocessableEntity, "validation_error")
			if diff := cmp.Diff(tc.want, r.fieldErrors(t)); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
			if after := e.count("SELECT count(*) FROM subscribers"); after != before {
				t.Errorf("a rejected create changed the table: %d → %d rows", before, after)
			}
		})
	}
}

func TestMalformedRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cases := []struct {
		name, method, path string
		body               any
		headers            []string
		status             int
		code               string
	}{
		{"invalid JSON", "POST", "/subscribers", `{"email":`, nil, 400, "validation_error"},
		{"trailing data", "POST", "/subscribers", `{"email":"a@x.io"} x`, nil, 400, "validation_error"},
		{"invalid UTF-8", "POST", "/subscribers", []byte("{\"email\":\"a@x.io\",\"name\":\"\xff\xfe\"}"), nil, 400, "validation_error"},
		{"array for create", "POST", "/subscribers", `[]`, nil, 400, "validation_error"},
		{"object for bulk", "POST", "/subscribers/bulk", `{}`, nil, 400, "validation_error"},
		{"null for bulk", "POST", "/subscribers/bulk", `null`, nil, 400, "validation_error"},
		{"empty body", "POST", "/subscribers", ``, nil, 400, "validation_error"},
		{"text/plain", "POST", "/subscribers", `{"email":"a@x.io"}`, []string{"Content-Type: text/plain"}, 415, "unsupported_media_type"},
		{"form", "POST", "/subscribers", `email=a@x.io`, []string{"Content-Type: application/x-www-form-urlencoded"}, 415, "unsupported_media_type"},
		{"over 1 MiB", "POST", "/subscribers/bulk", `[` + strings.Repeat(" ", 1<<20) + `]`, nil, 413, "payload_too_large"},
		{"bad page", "GET", "/subscribers?page=0", nil, nil, 400, "validation_error"},
		{"bad limit", "GET", "/subscribers?limit=101", nil, nil, 400, "validation_error"},
		{"bad status", "GET", "/subscribers?status=deleted", nil, nil, 400, "validation_error"},
		{"unknown path", "GET", "/nope", nil, nil, 404, "not_found"},
		{"unknown path, no key", "GET", "/nope", nil, []string{"Authorization:"}, 404, "not_found"},
		{"wrong method", "PATCH", "/subscribers/" + uuid.NewString(), nil, []string{"Authorization:"}, 405, "method_not_allowed"},
		{"not a uuid", "GET", "/subscribers/123", nil, nil, 404, "not_found"},
		{"unknown uuid", "GET", "/subscribers/" + uuid.NewString(), nil, nil, 404, "not_found"},
		{"unknown uuid update", "PUT", "/subscribers/" + uuid.NewString(), map[string]any{"name": "x"}, nil, 404, "not_found"},
		{"unknown uuid delete", "DELETE", "/subscribers/" + uuid.NewString(), nil, nil, 404, "not_found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(tc.method, tc.path, tc.body, tc.headers...).want(t, tc.status, tc.code)
			if _, has := r.body["errors"]; has && tc.status != 422 {
				t.Errorf("errors present on a %d: %s", tc.status, r.raw)
			}
			if msg, _ := r.body["message"].(string); msg == "" {
				t.Errorf("no message: %s", r.raw)
			}
		})
	}
	r := e.do("DELETE", "/subscribers", nil, "Authorization:").want(t, 405, "method_not_allowed")
	if got := r.header.Get("Allow"); got != "GET, HEAD, POST" {
		t.Errorf("Allow = %q, want GET, HEAD, POST", got)
	}
	if n := e.count("SELECT count(*) FROM subscribers"); n != 0 {
		t.Errorf("malformed requests created %d subscribers", n)
	}
}

func TestResponseHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.do("GET", "/subscribers", nil, "X-Request-Id: abc-123_x.y")
	if got := r.header.Get("X-Request-Id"); got != "abc-123_x.y" {
		t.Errorf("X-Request-Id = %q, want the caller's", got)
	}
	for _, h := range [][2]string{{"Cache-Control", "no-store"}, {"X-Content-Type-Options", "nosniff"}} {
		if got := r.header.Get(h[0]); got != h[1] {
			t.Errorf("%s = %q, want %q", h[0], got, h[1])
		}
	}
	r = e.do("GET", "/nope", nil, "X-Request-Id: bad id!")
	if got := r.header.Get("X-Request-Id"); got == "" || got == "bad id!" {
		t.Errorf("X-Request-Id = %q, want a new id for an invalid one", got)
	}
	if r.header.Get("Cache-Control") != "no-store" {
		t.Errorf("errors must carry Cache-Control: no-store too")
	}
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(o *envOptions) { o.keyCacheTTL = -1 })
	for _, tc := range []struct{ name, header string }{
		{"missing", "Authorization:"},
		{"other scheme", "Authorization: Basic " + e.key},
		{"no sk_ prefix", "Authorization: Bearer " + strings.TrimPrefix(e.key, "sk_")},
		{"unknown key", "Authorization: Bearer sk_" + strings.Repeat("A", 40)},
		{"truncated key", "Authorization: Bearer " + e.key[:20]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do("GET", "/subscribers", nil, tc.header).want(t, http.StatusUnauthorized, "unauthorized")
			if r.body["message"] != "Invalid API key." || r.header.Get("WWW-Authenticate") != "Bearer" {
				t.Errorf("got message %v, WWW-Authenticate %q", r.body["message"], r.header.Get("WWW-Authenticate"))
			}
		})
	}
	// Lower-case scheme is accepted (schemes are case-insensitive).
	e.do("GET", "/subscribers", nil, "Authorization: bearer "+e.key).want(t, http.StatusOK, "")
	// 401 comes before validation.
	e.do("POST", "/subscribers", `{bad`, "Authorization:").want(t, http.StatusUnauthorized, "unauthorized")

	t.Run("revoked key", func(t *testing.T) {
		nl, key := e.newKey(t, true)
		_ = nl
		e.do("GET", "/subscribers", nil, "Authorization: Bearer "+key).want(t, http.StatusOK, "")
		var id string
		if err := e.db.NewRaw("SELECT id FROM api_keys WHERE newsletter_id = ?", nl).Scan(t.Context(), &id); err != nil {
			t.Fatal(err)
		}
		if err := e.accounts.RevokeKey(t.Context(), uuid.MustParse(id)); err != nil {
			t.Fatal(err)
		}
		e.do("GET", "/subscribers", nil, "Authorization: Bearer "+key).want(t, http.StatusUnauthorized, "unauthorized")
		// Told apart from an unknown key for telemetry, with the key's id.
		p, err := e.accounts.Authenticate(t.Context(), model.HashKey(key))
		if !errors.Is(err, model.ErrKeyRevoked) || !errors.Is(err, model.ErrKeyNotFound) || p.KeyID.String() != id || p.APIAccess {
			t.Errorf("Authenticate(revoked key) = %+v, %v; want its id and ErrKeyRevoked", p, err)
		}
		if _, err := e.accounts.Authenticate(t.Context(), model.HashKey("sk_"+strings.Repeat("C", 40))); !errors.Is(err, model.ErrKeyNotFound) || errors.Is(err, model.ErrKeyRevoked) {
			t.Errorf("Authenticate(unknown key) error = %v; want ErrKeyNotFound alone", err)
		}
	})
	t.Run("plan without API access", func(t *testing.T) {
		_, key := e.newKey(t, false)
		r := e.do("POST", "/subscribers", map[string]any{"email": "x@y.io"}, "Authorization: Bearer "+key).
			want(t, http.StatusForbidden, "api_access_disabled")
		if r.body["message"] != "API access is not enabled." {
			t.Errorf("message = %v", r.body["message"])
		}
		// 403 comes before validation too.
		e.do("POST", "/subscribers", `{bad`, "Authorization: Bearer "+key).want(t, http.StatusForbidden, "api_access_disabled")
	})
	if n := e.count("SELECT count(*) FROM subscribers"); n != 0 {
		t.Errorf("refused requests created %d subscribers", n)
	}
}

func TestNewslettersAreIsolated(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, otherKey := e.newKey(t, true)
	other := "Authorization: Bearer " + otherKey
	mine := e.do("POST", "/subscribers", map[string]any{"email": "shared@x.io"}).want(t, http.StatusCreated, "").data(t)
	// The same email is free in another newsletter.
	theirs := e.do("POST", "/subscribers", map[string]any{"email": "shared@x.io"}, other).want(t, http.StatusCreated, "").data(t)
	id := mine["id"].(string)
	e.do("GET", "/subscribers/"+id, nil, other).want(t, http.StatusNotFound, "not_found")
	e.do("PUT", "/subscribers/"+id, map[string]any{"name": "Hijack"}, other).want(t, http.StatusNotFound, "not_found")
	e.do("DELETE", "/subscribers/"+id, nil, other).want(t, http.StatusNotFound, "not_found")
	list := e.do("GET", "/subscribers", nil, other).want(t, http.StatusOK, "")
	data := list.body["data"].([]any)
	if len(data) != 1 || data[0].(map[string]any)["id"] != theirs["id"] {
		t.Errorf("other newsletter's list = %s, want only its own subscriber", list.raw)
	}
	got := e.do("GET", "/subscribers/"+id, nil).want(t, http.StatusOK, "").data(t)
	if got["name"] != "" || got["status"] != "active" {
		t.Errorf("subscriber changed by another newsletter's key: %v", got)
	}
}

func TestListPaginationWalk(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const total = 53
	var all []any
	for i := range total {
		all = append(all, map[string]any{"email": fmt.Sprintf("w%02d@x.io", i), "status": []string{"active", "pending"}[i%3/2]})
	}
	e.do("POST", "/subscribers/bulk", all[:30]).want(t, http.StatusCreated, "")
	e.do("POST", "/subscribers/bulk", all[30:]).want(t, http.StatusCreated, "")
	e.do("DELETE", "/subscribers/"+e.firstID(t), nil).want(t, http.StatusOK, "")

	walk := func(t *testing.T, query string, wantTotal int) []string {
		t.Helper()
		var ids []string
		seen := map[string]bool{}
		for page := 1; ; page++ {
			r := e.do("GET", fmt.Sprintf("/subscribers?limit=10&page=%d%s", page, query), nil).want(t, http.StatusOK, "")
			p := r.body["pagination"].(map[string]any)
			wantPages := (wantTotal + 9) / 10
			if int(p["total"].(float64)) != wantTotal || int(p["pages"].(float64)) != wantPages ||
				int(p["page"].(float64)) != page || int(p["limit"].(float64)) != 10 {
				t.Fatalf("page %d pagination = %v, want total %d pages %d", page, p, wantTotal, wantPages)
			}
			data := r.body["data"].([]any)
			if len(data) == 0 {
				if page != wantPages+1 {
					t.Fatalf("empty page %d, want pages to end after %d", page, wantPages)
				}
				return ids
			}
			for _, d := range data {
				id := d.(map[string]any)["id"].(string)
				if seen[id] {
					t.Fatalf("id %s repeated on page %d", id, page)
				}
				seen[id] = true
				ids = append(ids, id)
			}
		}
	}
	ids := walk(t, "", total)
	if len(ids) != total {
		t.Errorf("walk returned %d subscribers, want %d", len(ids), total)
	}
	// Order: newest first, then id descending; ids are UUIDv7, so within one bulk a later item
	// has a larger id.
	var want []string
	if err := e.db.NewRaw("SELECT CAST(id AS TEXT) FROM subscribers ORDER BY created_at DESC, id DESC").Scan(t.Context(), &want); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, ids); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
	pending := e.count("SELECT count(*) FROM subscribers WHERE status = 'pending'")
	if got := len(walk(t, "&status=pending", pending)); got != pending {
		t.Errorf("pending walk = %d, want %d", got, pending)
	}
	if got := len(walk(t, "&status=unsubscribed", 1)); got != 1 {
		t.Errorf("unsubscribed walk = %d, want 1", got)
	}
	// Defaults and past-the-end.
	r := e.do("GET", "/subscribers", nil).want(t, http.StatusOK, "")
	if p := r.body["pagination"].(map[string]any); p["page"] != 1.0 || p["limit"] != 25.0 || p["pages"] != 3.0 {
		t.Errorf("default pagination = %v", p)
	}
	r = e.do("GET", "/subscribers?page=99", nil).want(t, http.StatusOK, "")
	if string(r.raw[:len(`{"success":true,"data":[]`)]) != `{"success":true,"data":[]` {
		t.Errorf("past the end = %s, want data: []", r.raw)
	}
	// Any page that fits in an int is a page, past the end of every list: the database is asked
	// for the largest offset there is, and the totals are real. A larger number is refused.
	r = e.do("GET", "/subscribers?limit=100&page=9223372036854775807", nil).want(t, http.StatusOK, "")
	if want := fmt.Sprintf(`{"success":true,"data":[],"pagination":{"page":9223372036854775807,"limit":100,"total":%d,"pages":1,`,
		total); !strings.HasPrefix(string(r.raw), want) {
		t.Errorf("largest page = %s, want data: [] with the real totals", r.raw)
	}
	r = e.do("GET", "/subscribers?page=9223372036854775808", nil).want(t, http.StatusBadRequest, "validation_error")
	if msg := r.body["message"]; msg != "The page parameter must not be greater than 9223372036854775807." {
		t.Errorf("page beyond an int: message %q", msg)
	}
	// An empty newsletter: data is [] and pages 0.
	_, key := e.newKey(t, true)
	r = e.do("GET", "/subscribers", nil, "Authorization: Bearer "+key).want(t, http.StatusOK, "")
	if diff := cmp.Diff(map[string]any{"page": 1.0, "limit": 25.0, "total": 0.0, "pages": 0.0, "next_cursor": nil}, r.body["pagination"]); diff != "" || r.body["data"] == nil {
		t.Errorf("empty list = %s", r.raw)
	}
}

// TestListDeepPages crosses the offset at which PostgreSQL's list statement switches from
// reading the page straight from the list index to an index-only walk of ids (2,000): pages on
// both sides, filtered and not, must be the same slices of one order and carry the same total.
func TestListDeepPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const total = 2150
	for start := 0; start < total; start += 100 {
		var batch []any
		for i := start; i < min(start+100, total); i++ {
			batch = append(batch, map[string]any{"email": fmt.Sprintf("d%04d@x.io", i), "status": []string{"active", "pending"}[i%2]})
		}
		e.do("POST", "/subscribers/bulk", batch).want(t, http.StatusCreated, "")
	}
	for _, status := range []string{"", "active"} {
		var want []string
		where := ""
		if status != "" {
			where = "WHERE status = '" + status + "'"
		}
		if err := e.db.NewRaw("SELECT CAST(id AS TEXT) FROM subscribers "+where+" ORDER BY created_at DESC, id DESC").Scan(t.Context(), &want); err != nil {
			t.Fatal(err)
		}
		query := ""
		if status != "" {
			query = "&status=" + status
		}
		// limit 100: offsets 0, 1900, 2000 (the last one read directly) and 2100 (the first
		// read by ids); limit 1 around the switch.
		for _, pg := range []struct{ page, limit int }{{1, 100}, {20, 100}, {21, 100}, {22, 100}, {2000, 1}, {2001, 1}, {2002, 1}} {
			r := e.do("GET", fmt.Sprintf("/subscribers?page=%d&limit=%d%s", pg.page, pg.limit, query), nil).want(t, http.StatusOK, "")
			if got := int(r.body["pagination"].(map[string]any)["total"].(float64)); got != len(want) {
				t.Errorf("status %q page %d×%d: total %d, want %d", status, pg.page, pg.limit, got, len(want))
			}
			var ids []string
			for _, d := range r.body["data"].([]any) {
				ids = append(ids, d.(map[string]any)["id"].(string))
			}
			from := min((pg.page-1)*pg.limit, len(want))
			if diff := cmp.Diff(want[from:min(from+pg.limit, len(want))], ids, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("status %q page %d×%d (-want +got):\n%s", status, pg.page, pg.limit, diff)
			}
		}
	}
}

func (e *env) firstID(t *testing.T) string {
	t.Helper()
	var id string
	if err := e.db.NewRaw("SELECT CAST(id AS TEXT) FROM subscribers ORDER BY id LIMIT 1").Scan(t.Context(), &id); err != nil {
		t.Fatal(err)
	}
	return id
}

func TestUpdate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.do("POST", "/subscribers", map[string]any{"email": "u@x.io", "name": "Ann Lee"}).want(t, http.StatusCreated, "").data(t)
	id := d["id"].(string)
	path := "/subscribers/" + id
	outbox := func() int {
		return e.count("SELECT count(*) FROM email_outbox WHERE subscriber_id = ? AND state = 'pending'", id)
	}

	got := e.do("PUT", path, map[string]any{"name": "  Cher "}).want(t, http.StatusOK, "").data(t)
	if got["name"] != "Cher" || got["email"] != "u@x.io" || got["status"] != "active" || got["created_at"] != d["created_at"] {
		t.Errorf("after name update = %v", got)
	}
	got = e.do("PUT", path, map[string]any{"name": nil}).want(t, http.StatusOK, "").data(t)
	if got["name"] != "" {
		t.Errorf("null name: name = %v, want cleared", got["name"])
	}
	e.do("PUT", path, map[string]any{"name": "X Y"}).want(t, http.StatusOK, "")
	if got = e.do("PUT", path, map[string]any{"name": ""}).want(t, http.StatusOK, "").data(t); got["name"] != "" {
		t.Errorf(`"" name: name = %v, want cleared`, got["name"])
	}

	got = e.do("PUT", path, map[string]any{"status": "pending"}).want(t, http.StatusOK, "").data(t)
	if got["status"] != "pending" || outbox() != 1 {
		t.Errorf("to pending: status %v, pending emails %d; want pending and 1", got["status"], outbox())
	}
	// Pending again: a new email replaces the unsent one.
	e.do("PUT", path, map[string]any{"status": "pending"}).want(t, http.StatusOK, "")
	if n := outbox(); n != 1 {
		t.Errorf("pending twice: pending emails = %d, want 1", n)
	}
	if n := e.count("SELECT count(*) FROM email_outbox WHERE subscriber_id = ?", id); n != 2 {
		t.Errorf("outbox rows = %d, want 2 (one cancelled)", n)
	}
	got = e.do("PUT", path, map[string]any{"status": "active"}).want(t, http.StatusOK, "").data(t)
	if got["status"] != "active" || outbox() != 0 {
		t.Errorf("to active: status %v, pending emails %d; want active and 0", got["status"], outbox())
	}

	for _, tc := range []struct {
		name string
		body any
		want map[string][]string
	}{
		{"empty object", map[string]any{}, map[string][]string{"body": {"At least one of email, name, status, attributes or tags must be provided."}}},
		{"unsubscribed status", map[string]any{"status": "unsubscribed"}, map[string][]string{"status": {"The selected status is invalid; it must be active or pending. To unsubscribe, send DELETE /api/v1/subscribers/{id}."}}},
		{"bad email", map[string]any{"email": "nope"}, map[string][]string{"email": {"The email field must be a valid email address."}}},
		{"unknown property", map[string]any{"id": uuid.NewString()}, map[string][]string{"id": {"The id field is prohibited."}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do("PUT", path, tc.body).want(t, http.StatusUnprocessableEntity, "validation_error")
			if diff := cmp.Diff(tc.want, r.fieldErrors(t)); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
	final := e.do("GET", path, nil).want(t, http.StatusOK, "").data(t)
	if final["status"] != "active" || final["email"] != "u@x.io" {
		t.Errorf("rejected updates changed the subscriber: %v", final)
	}
}

func TestUnsubscribe(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.do("POST", "/subscribers", map[string]any{"email": "bye@x.io", "status": "pending"}).want(t, http.StatusCreated, "").data(t)
	path := "/subscribers/" + d["id"].(string)
	first := e.do("DELETE", path, nil).want(t, http.StatusOK, "")
	if got := first.data(t)["status"]; got != "unsubscribed" {
		t.Errorf("status = %v, want unsubscribed", got)
	}
	again := e.do("DELETE", path, nil).want(t, http.StatusOK, "")
	if string(again.raw) != string(first.raw) {
		t.Errorf("second unsubscribe = %s, want the same body as the first %s", again.raw, first.raw)
	}
	if n := e.count("SELECT count(*) FROM email_outbox WHERE state = 'pending'"); n != 0 {
		t.Errorf("pending emails after unsubscribe = %d, want 0 (cancelled)", n)
	}
	if n := e.count("SELECT count(*) FROM subscribers"); n != 1 {
		t.Errorf("the record must stay: rows = %d", n)
	}
	// Re-subscribing goes through PUT.
	got := e.do("PUT", path, map[string]any{"status": "active"}).want(t, http.StatusOK, "").data(t)
	if got["status"] != "active" {
		t.Errorf("re-subscribe: status = %v", got["status"])
	}
}

func TestOpenAPIDocumentNeedsNoKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, p := range []string{"/openapi.json", "/openapi.yaml", "/docs"} {
		res, err := http.Get(e.base + p)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Errorf("GET %s = %d, want 200 without a key", p, res.StatusCode)
		}
	}
}
