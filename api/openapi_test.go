package api_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/subscriberd/subscriberd/model"
)

// openAPIDoc fetches the served document.
func openAPIDoc(t *testing.T) ([]byte, map[string]any) {
	t.Helper()
	e := newEnv(t)
	rec := e.do(t, req{"GET", "/api/v1/openapi.json", nil, nil})
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /api/v1/openapi.json: status %d; want 200 without a key", rec.Code)
	}
	var doc map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatalf("decoding the OpenAPI document: %v", err)
	}
	return rec.Body.Bytes(), doc
}

// at walks doc along path (object keys), failing the test when a step is missing.
func at(t *testing.T, doc any, path ...string) any {
	t.Helper()
	cur := doc
	for i, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			t.Fatalf("%s is %T, not an object", strings.Join(path[:i], "."), cur)
		}
		if cur, ok = m[p]; !ok {
			t.Fatalf("%s missing from the OpenAPI document", strings.Join(path[:i+1], "."))
		}
	}
	return cur
}

func TestOpenAPIGolden(t *testing.T) {
	raw, _ := openAPIDoc(t)
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, raw, "", "  "); err != nil {
		t.Fatal(err)
	}
	pretty.WriteByte('\n')
	golden(t, "openapi.json", pretty.Bytes())
}

func TestOpenAPIServedWithoutKey(t *testing.T) {
	e := newEnv(t)
	for _, path := range []string{"/api/v1/openapi.json", "/api/v1/openapi.yaml", "/api/v1/docs"} {
		rec := e.do(t, req{"GET", path, nil, nil})
		if rec.Code != http.StatusOK || rec.Body.Len() == 0 {
			t.Errorf("GET %s without a key: status %d, %d bytes; want 200 and a body", path, rec.Code, rec.Body.Len())
		}
	}
	if n := e.auth.Lookups(); n != 0 {
		t.Errorf("authenticator lookups = %d for the document and docs; want 0", n)
	}
}

func TestOpenAPIInfoAndSecurity(t *testing.T) {
	_, doc := openAPIDoc(t)
	checks := []struct {
		path []string
		want any
	}{
		{[]string{"openapi"}, "3.1.0"},
		{[]string{"info", "title"}, "Subscriber Management API"},
		{[]string{"info", "version"}, "1.2.0"},
		{[]string{"components", "securitySchemes", "bearer", "type"}, "http"},
		{[]string{"components", "securitySchemes", "bearer", "scheme"}, "bearer"},
	}
	for _, c := range checks {
		if diff := cmp.Diff(c.want, at(t, doc, c.path...)); diff != "" {
			t.Errorf("%s mismatch (-want +got):\n%s", strings.Join(c.path, "."), diff)
		}
	}
	for path, item := range at(t, doc, "paths").(map[string]any) {
		for method, op := range item.(map[string]any) {
			want := []any{map[string]any{"bearer": []any{}}}
			if diff := cmp.Diff(want, at(t, op, "security")); diff != "" {
				t.Errorf("%s %s security mismatch (-want +got):\n%s", method, path, diff)
			}
		}
	}
}

// documentedCodes lists, per operation, every error status the handler can send and the
// codes it comes with: the auth and plan errors, 429 (limits), 500 and 503 for everyone; 413
// for a declared Content-Length over the limit (the edge, every route); the body errors
// (and 408, a body slower than the read timeout) for the operations with a body; 404 for the
// item operations; 400 for a query string over the edge's bounds (every operation) and the
// list's parameters; 400, 408, 409, 413 and 422 for the writes, which take Idempotency-Key
// (and read the body to fingerprint it).
var documentedCodes = func() map[string]map[int][]string {
	common := map[int][]string{400: {"validation_error"}, 401: {"unauthorized"}, 403: {"api_access_disabled"},
		413: {"payload_too_large"}, 429: {"rate_limit_exceeded"}, 500: {"internal_error"}, 503: {"service_unavailable"}}
	with := func(extra map[int][]string) map[int][]string {
		m := maps.Clone(common)
		maps.Copy(m, extra)
		return m
	}
	idem := map[int][]string{408: {"request_timeout"}, 409: {"idempotency_key_in_use"}, 422: {"idempotency_key_reused"}}
	body := func(c422 ...string) map[int][]string {
		return map[int][]string{408: {"request_timeout"}, 409: {"idempotency_key_in_use"}, 415: {"unsupported_media_type"},
			422: append([]string{"validation_error", "idempotency_key_reused"}, c422...)}
	}
	notFound := map[int][]string{404: {"not_found"}}
	m := map[string]map[int][]string{
		"create-subscriber":       with(body("email_already_subscribed", "email_suppressed")),
		"bulk-create-subscribers": with(body("email_suppressed")),
		"list-subscribers":        with(nil),
		"get-subscriber":          with(notFound),
		"update-subscriber":       with(merge(body("email_already_subscribed", "email_suppressed"), notFound)),
		// Created as create, updated as update (no email: never taken); a create that loses
		// its race upsertTries times answers as create would.
		"upsert-subscriber-by-email": with(body("email_already_subscribed", "email_suppressed")),
		"unsubscribe-subscriber":     with(merge(idem, notFound)),
		"list-subscriber-events":     with(notFound),
		"export-subscriber":          with(notFound),
		"erase-subscriber":           with(merge(idem, notFound)),
		"change-subscriber-tags":     with(merge(body(), notFound)),
		"list-tags":                  with(nil),
		"create-webhook":             with(body()),
		"list-webhooks":              with(nil),
		"get-webhook":                with(notFound),
		"delete-webhook":             with(merge(idem, notFound)),
		"create-suppression":         with(body()),
		"bulk-create-suppressions":   with(body()),
		"list-suppressions":          with(nil),
		"get-suppression":            with(notFound),
		"delete-suppression":         with(merge(idem, notFound)),
		// Imports take no Idempotency-Key and read their file in the handler (§15).
		"create-import":      with(map[int][]string{415: {"unsupported_media_type"}}),
		"list-imports":       with(nil),
		"get-import":         with(notFound),
		"list-import-errors": with(notFound),
		"cancel-import":      with(merge(notFound, map[int][]string{409: {"import_finished"}})),
		"create-segment":     with(body()),
		"list-segments":      with(nil),
		"get-segment":        with(notFound),
		"update-segment":     with(merge(body(), notFound)),
		"delete-segment":     with(merge(idem, notFound)),
		"create-bulk-action": with(body()),
		"list-bulk-actions":  with(nil),
		"get-bulk-action":    with(notFound),
		"cancel-bulk-action": with(merge(merge(idem, notFound), map[int][]string{409: {"idempotency_key_in_use", "bulk_action_finished"}})),
	}
	// A read-only key is refused every write (docs/api-contract.md §16.2).
	for op, id := range operations {
		if !strings.HasPrefix(op, "GET ") {
			m[id][403] = []string{"api_access_disabled", "insufficient_scope"}
		}
	}
	return m
}()

func merge(a, b map[int][]string) map[int][]string {
	m := maps.Clone(a)
	maps.Copy(m, b)
	return m
}

// documented lists, per operation, every status the handler can send: its success and
// the error statuses of documentedCodes.
var documented = func() map[string][]int {
	// A suppression of an address already suppressed answers 200 with the entry; the bulk
	// answers 200 whatever it created (docs/api-contract.md §13).
	// An upload answers 202: its rows are processed in the background (§15).
	successes := map[string][]int{"create-suppression": {200, 201}, "bulk-create-suppressions": {200},
		"create-import": {202}, "upsert-subscriber-by-email": {200, 201}, "create-bulk-action": {202}}
	out := map[string][]int{}
	for id, codes := range documentedCodes {
		success, ok := successes[id]
		if !ok {
			success = []int{200}
			if strings.HasPrefix(id, "create-") || strings.HasPrefix(id, "bulk-create-") {
				success = []int{201}
			}
		}
		out[id] = append(slices.Sorted(maps.Keys(codes)), success...)
		slices.Sort(out[id])
	}
	return out
}()

// operations maps "METHOD path" in the document to its operation id.
var operations = map[string]string{
	"POST /api/v1/subscribers":                 "create-subscriber",
	"POST /api/v1/subscribers/bulk":            "bulk-create-subscribers",
	"GET /api/v1/subscribers":                  "list-subscribers",
	"GET /api/v1/subscribers/{id}":             "get-subscriber",
	"PUT /api/v1/subscribers/{id}":             "update-subscriber",
	"PUT /api/v1/subscribers/by-email/{email}": "upsert-subscriber-by-email",
	"DELETE /api/v1/subscribers/{id}":          "unsubscribe-subscriber",
	"GET /api/v1/subscribers/{id}/events":      "list-subscriber-events",
	"GET /api/v1/subscribers/{id}/export":      "export-subscriber",
	"POST /api/v1/subscribers/{id}/erase":      "erase-subscriber",
	"POST /api/v1/subscribers/{id}/tags":       "change-subscriber-tags",
	"GET /api/v1/tags":                         "list-tags",
	"POST /api/v1/webhooks":                    "create-webhook",
	"GET /api/v1/webhooks":                     "list-webhooks",
	"GET /api/v1/webhooks/{id}":                "get-webhook",
	"DELETE /api/v1/webhooks/{id}":             "delete-webhook",
	"POST /api/v1/suppressions":                "create-suppression",
	"POST /api/v1/suppressions/bulk":           "bulk-create-suppressions",
	"GET /api/v1/suppressions":                 "list-suppressions",
	"GET /api/v1/suppressions/{id}":            "get-suppression",
	"DELETE /api/v1/suppressions/{id}":         "delete-suppression",
	"POST /api/v1/imports":                     "create-import",
	"GET /api/v1/imports":                      "list-imports",
	"GET /api/v1/imports/{id}":                 "get-import",
	"GET /api/v1/imports/{id}/errors":          "list-import-errors",
	"DELETE /api/v1/imports/{id}":              "cancel-import",
	"POST /api/v1/segments":                    "create-segment",
	"GET /api/v1/segments":                     "list-segments",
	"GET /api/v1/segments/{id}":                "get-segment",
	"PUT /api/v1/segments/{id}":                "update-segment",
	"DELETE /api/v1/segments/{id}":             "delete-segment",
	"POST /api/v1/bulk-actions":                "create-bulk-action",
	"GET /api/v1/bulk-actions":                 "list-bulk-actions",
	"GET /api/v1/bulk-actions/{id}":            "get-bulk-action",
	"DELETE /api/v1/bulk-actions/{id}":         "cancel-bulk-action",
}

func TestOpenAPIResponses(t *testing.T) {
	_, doc := openAPIDoc(t)
	seen := map[string]bool{}
	for path, item := range at(t, doc, "paths").(map[string]any) {
		for method, op := range item.(map[string]any) {
			key := strings.ToUpper(method) + " " + path
			id, ok := operations[key]
			if !ok {
				t.Errorf("undocumented-by-test operation %s", key)
				continue
			}
			seen[key] = true
			if got := at(t, op, "operationId"); got != id {
				t.Errorf("%s operationId = %v; want %s", key, got, id)
			}
			responses := at(t, op, "responses").(map[string]any)
			var got []int
			for code := range responses {
				n, err := strconv.Atoi(code)
				if err != nil {
					t.Errorf("%s documents response %q; want only numeric statuses", key, code)
					continue
				}
				got = append(got, n)
			}
			slices.Sort(got)
			if diff := cmp.Diff(documented[id], got); diff != "" {
				t.Errorf("%s documented statuses mismatch (-want +got):\n%s", key, diff)
			}
			for code, resp := range responses {
				schema := at(t, resp, "content", "application/json", "schema").(map[string]any)
				if code < "400" {
					if ref, _ := schema["$ref"].(string); !strings.HasSuffix(ref, "Envelope") {
						t.Errorf("%s %s schema = %v; want a success envelope", key, code, schema)
					}
					continue
				}
				// 422 and 429 carry typed errors (docs/api-contract.md §3, §5); the others none.
				// Each narrows code to the codes the operation sends with that status.
				wantErr := map[string]string{"422": "ValidationError", "429": "RateLimitError"}[code]
				allOf, _ := schema["allOf"].([]any)
				if len(allOf) != 2 || at(t, allOf[0], "$ref") != "#/components/schemas/"+or(wantErr, "Error") {
					t.Errorf("%s %s schema = %v; want the %s envelope narrowed", key, code, schema, or(wantErr, "Error"))
					continue
				}
				n, _ := strconv.Atoi(code)
				var want []any
				for _, c := range slices.Sorted(slices.Values(documentedCodes[id][n])) {
					want = append(want, c)
				}
				if diff := cmp.Diff(want, at(t, allOf[1], "properties", "code", "enum")); diff != "" {
					t.Errorf("%s %s code enum mismatch (-want +got):\n%s", key, code, diff)
				}
			}
		}
	}
	if len(seen) != len(operations) {
		t.Errorf("document has operations %v; want %v", slices.Sorted(maps.Keys(seen)), slices.Sorted(maps.Keys(operations)))
	}
	loc := at(t, doc, "paths", "/api/v1/subscribers", "post", "responses", "201", "headers", "Location")
	if loc == nil {
		t.Errorf("create's 201 does not document Location")
	}
}

// TestDocumentedStatusesAreSent drives every operation into every status the document lists
// (except 429, which the limits middleware will send, and 408, which needs a server's read
// timeout) and checks nothing else comes out.
func TestDocumentedStatusesAreSent(t *testing.T) {
	type scenario struct {
		name  string
		setup func(*env)
		key   string
		body  string
		ct    string
		path  string // overrides the operation's path
		hdr   string // an extra "Name: value" header
		query string // appended to the path
	}
	big := `[` + strings.Repeat(" ", 1<<20) + `]`
	common := []scenario{
		{name: "ok"},
		{name: "no key", key: "-"},
		{name: "no access", key: keyNoAccess},
		{name: "store fails", setup: func(e *env) { e.store.err = errOpaque }},
		{name: "store down", setup: func(e *env) { e.store.err = model.ErrUnavailable }},
		{name: "query over the bounds", query: "?" + strings.Repeat("a&", 40)},
		{name: "too large", body: big},
	}
	withBody := []scenario{
		{name: "malformed", body: `{"x":`},
		{name: "text", ct: "text/plain"},
		{name: "invalid", body: `{"email":"x"}`},
		{name: "invalid item", body: `[{"email":"x"}]`},
	}
	item := subs + "/01900000-0000-7000-8000-000000000001"
	idem := []scenario{
		{name: "bad idempotency key", hdr: "Idempotency-Key: a b"},
		{name: "idempotency key in use", hdr: "Idempotency-Key: k1", setup: func(e *env) { e.idem.running[newsletterA.String()+" k1"] = true }},
		{name: "idempotency key reused", hdr: "Idempotency-Key: k2", setup: func(e *env) {
			e.idem.stored[newsletterA.String()+" k2"] = model.StoredResponse{Fingerprint: []byte("other"), Status: 200, Body: []byte("{}")}
		}},
	}
	withBody = append(withBody, idem...)
	ops := []struct {
		id, method, path, body string
		extra                  []scenario
	}{
		{"create-subscriber", "POST", subs, `{"email":"n@example.com"}`, withBody},
		{"bulk-create-subscribers", "POST", subs + "/bulk", `[{"email":"n@example.com"}]`, withBody},
		{"list-subscribers", "GET", subs, "", []scenario{{name: "bad query", path: subs + "?page=x"}}},
		{"get-subscriber", "GET", item, "", []scenario{{name: "unknown", path: subs + "/" + unknowID}}},
		{"update-subscriber", "PUT", item, `{"name":"N"}`, append(slices.Clone(withBody), scenario{name: "unknown", path: subs + "/" + unknowID})},
		{"upsert-subscriber-by-email", "PUT", subs + "/by-email/added1@example.com", `{"name":"N"}`,
			append(slices.Clone(withBody), scenario{name: "new address", path: subs + "/by-email/n@example.com"})},
		{"unsubscribe-subscriber", "DELETE", item, "", append([]scenario{{name: "not a UUID", path: subs + "/x"}}, idem...)},
	}
	for _, op := range ops {
		t.Run(op.id, func(t *testing.T) {
			sent := map[int]bool{}
			for _, sc := range append(slices.Clone(common), op.extra...) {
				e := newEnv(t)
				e.store.add(newsletterA) // the item the path names
				if sc.setup != nil {
					sc.setup(e)
				}
				r := req{method: op.method, path: or(sc.path, op.path) + sc.query}
				if body := or(sc.body, op.body); body != "" {
					r.body = strings.NewReader(body)
				}
				if sc.key != "-" {
					r.headers = append(r.headers, bearer(or(sc.key, keyA)))
				}
				if sc.ct != "" {
					r.headers = append(r.headers, "Content-Type: "+sc.ct)
				}
				if sc.hdr != "" {
					r.headers = append(r.headers, sc.hdr)
				}
				rec := e.do(t, r)
				if !slices.Contains(documented[op.id], rec.Code) {
					t.Errorf("%s: status %d is not documented for %s (body %.200s)", sc.name, rec.Code, op.id, rec.Body)
				}
				sent[rec.Code] = true
			}
			// 429 comes from the limits middleware, 408 from the server's read timeout
			// (integration.TestSlowBodyPastReadTimeout).
			want := slices.DeleteFunc(slices.Clone(documented[op.id]), func(c int) bool {
				return c == http.StatusTooManyRequests || c == http.StatusRequestTimeout
			})
			got := slices.Sorted(maps.Keys(sent))
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("statuses sent mismatch with the documented ones (-want +got):\n%s", diff)
			}
		})
	}
}

// TestOpenAPISchemasMatchModel: published limits and enums are the model's constants.
func TestOpenAPISchemasMatchModel(t *testing.T) {
	_, doc := openAPIDoc(t)
	strs := func(ss ...model.Status) []any {
		out := make([]any, len(ss))
		for i, s := range ss {
			out[i] = string(s)
		}
		return out
	}
	eventTypes := make([]any, len(model.EventTypes))
	for i, et := range model.EventTypes {
		eventTypes[i] = string(et)
	}
	inputFields := make([]any, len(model.InputFields))
	for i, f := range model.InputFields {
		inputFields[i] = f
	}
	schemas := []string{"components", "schemas"}
	s := func(p ...string) []string { return append(slices.Clone(schemas), p...) }
	checks := []struct {
		path []string
		want any
	}{
		{s("SubscriberInput", "properties", "email", "maxLength"), float64(model.MaxEmailLength)},
		{s("SubscriberInput", "properties", "name", "maxLength"), float64(model.MaxNameLength)},
		{s("SubscriberInput", "properties", "status", "enum"), strs(model.InputStatuses...)},
		{s("SubscriberInput", "required"), []any{"email"}},
		{s("SubscriberInput", "additionalProperties"), false},
		{s("SubscriberUpdate", "properties", "email", "maxLength"), float64(model.MaxEmailLength)},
		{s("SubscriberUpdate", "properties", "name", "maxLength"), float64(model.MaxNameLength)},
		{s("SubscriberUpdate", "properties", "status", "enum"), strs(model.InputStatuses...)},
		{s("SubscriberUpdate", "minProperties"), float64(1)},
		{s("SubscriberUpdate", "additionalProperties"), false},
		{s("Subscriber", "properties", "status", "enum"), strs(model.Statuses...)},
		{s("Subscriber", "required"), []any{"id", "email", "name", "status", "created_at", "attributes", "tags"}},
		{s("Subscriber", "properties", "tags", "items", "type"), "string"},
		{s("Subscriber", "properties", "attributes", "type"), "object"},
		{s("Subscriber", "properties", "attributes", "additionalProperties"), map[string]any{"anyOf": []any{
			map[string]any{"type": "string", "maxLength": float64(model.MaxAttributeValueLength)},
			map[string]any{"type": "number"}, map[string]any{"type": "boolean"}}}},
		{s("SubscriberInput", "properties", "tags", "maxItems"), float64(model.MaxTags)},
		{s("SubscriberUpdate", "properties", "attributes", "additionalProperties"), map[string]any{"anyOf": []any{
			map[string]any{"type": []any{"string", "null"}, "maxLength": float64(model.MaxAttributeValueLength)}, map[string]any{"type": []any{"number", "null"}},
			map[string]any{"type": []any{"boolean", "null"}}}}},
		{s("Error", "required"), []any{"success", "code", "message"}},
		{s("Pagination", "properties", "limit", "maximum"), float64(model.MaxLimit)},
		{[]string{"paths", "/api/v1/subscribers/bulk", "post", "requestBody", "content", "application/json", "schema", "maxItems"}, float64(model.MaxBulkItems)},
		{[]string{"paths", "/api/v1/subscribers/bulk", "post", "requestBody", "content", "application/json", "schema", "minItems"}, float64(1)},
		{[]string{"paths", "/api/v1/subscribers/bulk", "post", "requestBody", "content", "application/json", "schema", "items", "$ref"}, "#/components/schemas/SubscriberInput"},
		{[]string{"paths", "/api/v1/subscribers", "post", "requestBody", "content", "application/json", "schema", "$ref"}, "#/components/schemas/SubscriberInput"},
		{[]string{"paths", "/api/v1/subscribers/{id}", "put", "requestBody", "content", "application/json", "schema", "$ref"}, "#/components/schemas/SubscriberUpdate"},
		{s("WebhookInput", "properties", "url", "maxLength"), float64(model.MaxWebhookURLLen)},
		{s("WebhookInput", "properties", "url", "type"), "string"},
		{s("WebhookInput", "properties", "events", "items", "enum"), eventTypes},
		{s("WebhookInput", "properties", "events", "uniqueItems"), true},
		{s("WebhookInput", "required"), []any{"url"}},
		{s("WebhookInput", "additionalProperties"), false},
		{[]string{"paths", "/api/v1/webhooks", "post", "requestBody", "content", "application/json", "schema", "$ref"}, "#/components/schemas/WebhookInput"},
	}
	for _, c := range checks {
		if diff := cmp.Diff(c.want, at(t, doc, c.path...)); diff != "" {
			t.Errorf("%s mismatch (-want +got):\n%s", strings.Join(c.path, "."), diff)
		}
	}
	for _, name := range []string{"SubscriberInput", "SubscriberUpdate"} {
		props := slices.Sorted(maps.Keys(at(t, doc, s(name, "properties")...).(map[string]any)))
		want := slices.Sorted(slices.Values(model.InputFields))
		if diff := cmp.Diff(want, props); diff != "" {
			t.Errorf("%s properties mismatch (-want +got):\n%s", name, diff)
		}
	}
	for _, name := range []string{"Subscriber", "Error", "ValidationError", "RateLimitError", "RetryAfter"} {
		props := slices.Sorted(maps.Keys(at(t, doc, s(name, "properties")...).(map[string]any)))
		want := map[string][]string{"Subscriber": {"attributes", "created_at", "email", "id", "name", "status", "tags"}, "Error": {"code", "message", "success"},
			"ValidationError": {"code", "errors", "message", "success"}, "RateLimitError": {"code", "errors", "message", "success"},
			"RetryAfter": {"retry_after"}}[name]
		if diff := cmp.Diff(want, props); diff != "" {
			t.Errorf("%s properties mismatch (-want +got):\n%s", name, diff)
		}
	}

	params := map[string]map[string]any{}
	for _, p := range at(t, doc, "paths", "/api/v1/subscribers", "get", "parameters").([]any) {
		pm := p.(map[string]any)
		params[fmt.Sprint(pm["name"])] = pm["schema"].(map[string]any)
	}
	paramChecks := []struct {
		param, field string
		want         any
	}{
		{"page", "type", "integer"},
		{"page", "minimum", float64(1)},
		{"page", "default", float64(model.DefaultPage)},
		{"limit", "type", "integer"},
		{"limit", "minimum", float64(1)},
		{"limit", "maximum", float64(model.MaxLimit)},
		{"limit", "default", float64(model.DefaultLimit)},
		{"status", "enum", strs(model.Statuses...)},
	}
	for _, c := range paramChecks {
		if diff := cmp.Diff(c.want, params[c.param][c.field]); diff != "" {
			t.Errorf("query %s %s mismatch (-want +got):\n%s", c.param, c.field, diff)
		}
	}
}

// TestOpenAPIUpdateHasNoDefaultStatus: an omitted status keeps its value on update
// (docs/api-contract.md §4.5); a default of "active" in SubscriberUpdate tells generated clients and
// validators the opposite.
func TestOpenAPIUpdateHasNoDefaultStatus(t *testing.T) {
	_, doc := openAPIDoc(t)
	status := at(t, doc, "components", "schemas", "SubscriberUpdate", "properties", "status").(map[string]any)
	if d, ok := status["default"]; ok {
		t.Errorf("SubscriberUpdate status default = %v; want none", d)
	}
}

// TestOpenAPIArraysNotNullable: the service always sends arrays ("data": []), so the document
// must not allow null there.
func TestOpenAPIArraysNotNullable(t *testing.T) {
	_, doc := openAPIDoc(t)
	for _, p := range [][]string{
		{"components", "schemas", "ListEnvelope", "properties", "data", "type"},
		{"components", "schemas", "BulkCreated", "properties", "created", "type"},
	} {
		if diff := cmp.Diff("array", at(t, doc, p...)); diff != "" {
			t.Errorf("%s mismatch (-want +got):\n%s", strings.Join(p, "."), diff)
		}
	}
}

// or returns a unless it is empty, else b.
func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TestOpenAPIForGeneratedClients: what a client generator needs to type the API (issue
// "OpenAPI for generated clients"): errors typed on 422 and 429, a server, and email formats
// that do not refuse the Unicode addresses the API accepts.
func TestOpenAPIForGeneratedClients(t *testing.T) {
	raw, doc := openAPIDoc(t)
	sc := func(p ...string) any { return at(t, doc, append([]string{"components", "schemas"}, p...)...) }
	checks := []struct {
		got, want any
	}{
		{sc("ValidationError", "properties", "errors", "type"), "object"},
		{sc("ValidationError", "properties", "errors", "additionalProperties", "type"), "array"},
		{sc("ValidationError", "properties", "errors", "additionalProperties", "items", "type"), "string"},
		{sc("RateLimitError", "properties", "errors", "$ref"), "#/components/schemas/RetryAfter"},
		{sc("RetryAfter", "properties", "retry_after", "type"), "integer"},
		{sc("RetryAfter", "required"), []any{"retry_after"}},
		{sc("SubscriberInput", "properties", "email", "format"), "idn-email"},
		{sc("SubscriberUpdate", "properties", "email", "format"), "idn-email"},
		{sc("Subscriber", "properties", "email", "format"), "idn-email"},
		{at(t, doc, "servers"), []any{map[string]any{"url": "/", "description": "The service serving this document (paths include /api/v1)."}}},
	}
	for i, c := range checks {
		if diff := cmp.Diff(c.want, c.got); diff != "" {
			t.Errorf("check %d mismatch (-want +got):\n%s", i, diff)
		}
	}
	if bytes.Contains(raw, []byte(`"format":"email"`)) {
		t.Error(`the document still has format "email" (ASCII only in JSON Schema)`)
	}
}

// TestOpenAPIIdempotency: every write declares the Idempotency-Key header (docs/api-contract.md
// §8), its 409 with Retry-After and the replay header; reads do not take the header.
func TestOpenAPIIdempotency(t *testing.T) {
	_, doc := openAPIDoc(t)
	for key, id := range operations {
		method, path, _ := strings.Cut(key, " ")
		op := at(t, doc, "paths", path, strings.ToLower(method))
		var has bool
		params, _ := op.(map[string]any)["parameters"].([]any) // GET /webhooks has none
		for _, p := range params {
			if p.(map[string]any)["name"] == "Idempotency-Key" {
				has = true
				if p.(map[string]any)["in"] != "header" || p.(map[string]any)["required"] == true {
					t.Errorf("%s: Idempotency-Key = %v; want an optional header", id, p)
				}
			}
		}
		// Imports take no Idempotency-Key (docs/api-contract.md §15): an upload is streamed,
		// never held whole to be hashed, and a cancel that is retried answers 409
		// import_finished with nothing changed.
		if write := method != "GET" && !strings.Contains(path, "/imports"); has != write {
			t.Errorf("%s declares Idempotency-Key = %v; want %v", id, has, write)
			continue
		}
		if !has {
			continue
		}
		if at(t, op, "responses", "409", "headers", "Retry-After") == nil {
			t.Errorf("%s: 409 without Retry-After", id)
		}
		success := "200"
		if slices.Contains(documented[id], 201) {
			success = "201"
		}
		if slices.Contains(documented[id], 202) {
			success = "202"
		}
		if at(t, op, "responses", success, "headers", "Idempotent-Replayed") == nil {
			t.Errorf("%s: %s without Idempotent-Replayed", id, success)
		}
	}
}

// TestOpenAPINameNullable: null is a valid name in every input (it clears the name,
// docs/api-contract.md §4.5), so the input schemas declare ["string", "null"], and the 3.0
// rendering nullable; the pattern is the model's.
func TestOpenAPINameNullable(t *testing.T) {
	_, doc := openAPIDoc(t)
	for _, name := range []string{"SubscriberInput", "SubscriberUpdate"} {
		prop := at(t, doc, "components", "schemas", name, "properties", "name").(map[string]any)
		if diff := cmp.Diff([]any{"string", "null"}, prop["type"]); diff != "" {
			t.Errorf("%s.name type mismatch (-want +got):\n%s", name, diff)
		}
		if prop["pattern"] != model.NamePattern() {
			t.Errorf("%s.name pattern = %v; want model.NamePattern()", name, prop["pattern"])
		}
	}
	e := newEnv(t)
	rec := e.do(t, req{"GET", "/api/v1/openapi-3.0.json", nil, nil})
	var doc30 map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &doc30); err != nil {
		t.Fatalf("decoding the 3.0 document: %v", err)
	}
	for _, name := range []string{"SubscriberInput", "SubscriberUpdate"} {
		prop := at(t, doc30, "components", "schemas", name, "properties", "name").(map[string]any)
		if prop["type"] != "string" || prop["nullable"] != true {
			t.Errorf("3.0 %s.name = type %v nullable %v; want string, nullable", name, prop["type"], prop["nullable"])
		}
	}
}
