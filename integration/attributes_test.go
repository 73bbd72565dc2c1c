package integration

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/subscriberd/subscriberd/importer"
)

// Attributes and tags (docs/api-contract.md §19), sentence by sentence, on the store under
// test (TEST_STORE).

// TestAttributesAndTagsOnCreate: create takes both, normalises the tags, and every answer that
// returns the subscriber sends both ({} and [] when none).
func TestAttributesAndTagsOnCreate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.do("POST", "/subscribers", map[string]any{"email": "ann@example.com",
		"attributes": map[string]any{"plan": "pro", "seats": 5, "trial": false, "ratio": 1.5},
		"tags":       []any{" Beta", "vip", "beta", "Zoë"}}).want(t, http.StatusCreated, "").data(t)
	wantAttrs := map[string]any{"plan": "pro", "seats": float64(5), "trial": false, "ratio": 1.5}
	wantTags := []any{"beta", "vip", "zoë"}
	if diff := cmp.Diff(wantAttrs, d["attributes"]); diff != "" {
		t.Errorf("attributes (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantTags, d["tags"]); diff != "" {
		t.Errorf("tags (-want +got):\n%s", diff)
	}
	id := d["id"].(string)
	if diff := cmp.Diff(d, e.do("GET", "/subscribers/"+id, nil).want(t, http.StatusOK, "").data(t)); diff != "" {
		t.Errorf("GET differs (-create +get):\n%s", diff)
	}
	list := e.do("GET", "/subscribers", nil).want(t, http.StatusOK, "")
	if diff := cmp.Diff([]any{d}, list.body["data"]); diff != "" {
		t.Errorf("list (-want +got):\n%s", diff)
	}
	if got := e.do("GET", "/subscribers?email=ann@example.com", nil).want(t, http.StatusOK, "").body["data"]; !cmp.Equal([]any{d}, got) {
		t.Errorf("lookup by email = %v, want %v", got, d)
	}
	if got := e.do("DELETE", "/subscribers/"+id, nil).want(t, http.StatusOK, "").data(t); !cmp.Equal(got["tags"], wantTags) || !cmp.Equal(got["attributes"], wantAttrs) {
		t.Errorf("DELETE answered %v", got)
	}

	// None given: {} and [].
	n := e.do("POST", "/subscribers", map[string]any{"email": "bob@example.com"}).want(t, http.StatusCreated, "").data(t)
	if !cmp.Equal(n["attributes"], map[string]any{}) || !cmp.Equal(n["tags"], []any{}) {
		t.Errorf("without attributes and tags: %v, %v; want {} and []", n["attributes"], n["tags"])
	}
	bulk := e.do("POST", "/subscribers/bulk", []any{
		map[string]any{"email": "c1@example.com", "tags": []any{"x"}},
		map[string]any{"email": "c2@example.com", "attributes": map[string]any{"k": true}},
	}).want(t, http.StatusCreated, "").body["data"].(map[string]any)["created"].([]any)
	c1, c2 := bulk[0].(map[string]any), bulk[1].(map[string]any)
	if !cmp.Equal(c1["tags"], []any{"x"}) || !cmp.Equal(c1["attributes"], map[string]any{}) ||
		!cmp.Equal(c2["tags"], []any{}) || !cmp.Equal(c2["attributes"], map[string]any{"k": true}) {
		t.Errorf("bulk created %v", bulk)
	}
	if got := e.do("GET", "/subscribers/"+c2["id"].(string), nil).want(t, http.StatusOK, "").data(t); !cmp.Equal(got, c2) {
		t.Errorf("GET of a bulk item = %v, want %v", got, c2)
	}
	// The counts of GET /tags are kept by the stores' triggers.
	if n := e.count("SELECT coalesce(sum(n), 0) FROM subscriber_tag_counts WHERE tag = 'beta'"); n != 1 {
		t.Errorf("beta counted %d times, want 1", n)
	}
}

// TestAttributesAndTagsRules: §19.1's rules and messages on create, one and bulk; nothing is
// stored.
func TestAttributesAndTagsRules(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	many := map[string]any{}
	for i := range 51 {
		many[fmt.Sprintf("k%d", i)] = i
	}
	tooManyTags := make([]any, 101)
	for i := range tooManyTags {
		tooManyTags[i] = fmt.Sprintf("t%d", i)
	}
	long := make([]byte, 1001)
	for i := range long {
		long[i] = 'a'
	}
	big := map[string]any{}
	for i := range 9 {
		big[fmt.Sprintf("k%d", i)] = string(long[:1000])
	}
	for _, tc := range []struct {
		name string
		body any
		want map[string][]string
	}{
		{"attributes not an object", map[string]any{"email": "a@x.io", "attributes": []any{}},
			map[string][]string{"attributes": {"The attributes field must be an object."}}},
		{"null value on create", map[string]any{"email": "a@x.io", "attributes": map[string]any{"plan": nil}},
			map[string][]string{"attributes.plan": {"The attributes.plan field must be a string, number or boolean."}}},
		{"object value", map[string]any{"email": "a@x.io", "attributes": map[string]any{"plan": map[string]any{}}},
			map[string][]string{"attributes.plan": {"The attributes.plan field must be a string, number or boolean."}}},
		{"long value", map[string]any{"email": "a@x.io", "attributes": map[string]any{"plan": string(long)}},
			map[string][]string{"attributes.plan": {"The attributes.plan field must not be greater than 1000 characters."}}},
		{"control in value", map[string]any{"email": "a@x.io", "attributes": map[string]any{"plan": "a\u200bb"}},
			map[string][]string{"attributes.plan": {"The attributes.plan field contains invalid characters."}}},
		{"bad key", map[string]any{"email": "a@x.io", "attributes": map[string]any{"Plan": "x"}},
			map[string][]string{"attributes": {"The attributes field has an invalid key."}}},
		{"51 keys", map[string]any{"email": "a@x.io", "attributes": many},
			map[string][]string{"attributes": {"The attributes field must not have more than 50 keys."}}},
		{"over 8192 bytes", map[string]any{"email": "a@x.io", "attributes": big},
			map[string][]string{"attributes": {"The attributes field must not be greater than 8192 bytes."}}},
		{"tags not an array", map[string]any{"email": "a@x.io", "tags": "beta"},
			map[string][]string{"tags": {"The tags field must be an array."}}},
		{"tag not a string", map[string]any{"email": "a@x.io", "tags": []any{"a", 1}},
			map[string][]string{"tags.1": {"The tags.1 field must be a string."}}},
		{"empty tag", map[string]any{"email": "a@x.io", "tags": []any{"  "}},
			map[string][]string{"tags.0": {"The tags.0 field must be between 1 and 64 characters."}}},
		{"comma in tag", map[string]any{"email": "a@x.io", "tags": []any{"a,b"}},
			map[string][]string{"tags.0": {"The tags.0 field contains invalid characters."}}},
		{"101 tags", map[string]any{"email": "a@x.io", "tags": tooManyTags},
			map[string][]string{"tags": {"The tags field must not have more than 100 items."}}},
	} {
		r := e.do("POST", "/subscribers", tc.body).want(t, http.StatusUnprocessableEntity, "validation_error")
		if diff := cmp.Diff(tc.want, r.fieldErrors(t)); diff != "" {
			t.Errorf("%s: errors (-want +got):\n%s", tc.name, diff)
		}
	}
	r := e.do("POST", "/subscribers/bulk", []any{
		map[string]any{"email": "a@x.io"},
		map[string]any{"email": "b@x.io", "tags": []any{""}},
		map[string]any{"email": "c@x.io", "attributes": map[string]any{"plan": []any{}}},
	}).want(t, http.StatusUnprocessableEntity, "validation_error")
	want := map[string][]string{
		"1.tags.0":          {"The 1.tags.0 field must be between 1 and 64 characters."},
		"2.attributes.plan": {"The 2.attributes.plan field must be a string, number or boolean."},
	}
	if diff := cmp.Diff(want, r.fieldErrors(t)); diff != "" {
		t.Errorf("bulk errors (-want +got):\n%s", diff)
	}
	if n := e.count("SELECT count(*) FROM subscribers"); n != 0 {
		t.Errorf("%d subscribers stored by refused requests", n)
	}
}

// concurrently runs fn(i) for i in 0..n-1 at once.
func concurrently(n int, fn func(i int)) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); fn(i) }()
	}
	wg.Wait()
}

// TestUpdateMergesAttributesAndTags: PUT applies attributes as a JSON merge patch and tags as
// the whole set (§19.2); the limits apply to the result; a patch that changes nothing records
// nothing; the updated event's previous holds what changed.
func TestUpdateMergesAttributesAndTags(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.do("POST", "/subscribers", map[string]any{"email": "ann@example.com",
		"attributes": map[string]any{"plan": "free", "seats": 1, "company": "Acme"}, "tags": []any{"a"}}).
		want(t, http.StatusCreated, "").data(t)["id"].(string)
	path := "/subscribers/" + id

	d := e.do("PUT", path, map[string]any{"attributes": map[string]any{"plan": "pro", "company": nil, "trial": true}}).
		want(t, http.StatusOK, "").data(t)
	if diff := cmp.Diff(map[string]any{"plan": "pro", "seats": float64(1), "trial": true}, d["attributes"]); diff != "" {
		t.Errorf("merged attributes (-want +got):\n%s", diff)
	}
	if !cmp.Equal(d["tags"], []any{"a"}) {
		t.Errorf("tags = %v; want them kept", d["tags"])
	}
	d = e.do("PUT", path, map[string]any{"tags": []any{"Z", "b"}}).want(t, http.StatusOK, "").data(t)
	if !cmp.Equal(d["tags"], []any{"b", "z"}) || d["attributes"].(map[string]any)["plan"] != "pro" {
		t.Errorf("after replacing the tags: %v", d)
	}
	// Nothing changes: 200, no event.
	for _, body := range []map[string]any{{"attributes": map[string]any{}}, {"attributes": map[string]any{"gone": nil}},
		{"tags": []any{"b", "Z"}}, {"attributes": map[string]any{"plan": "pro"}}} {
		if got := e.do("PUT", path, body).want(t, http.StatusOK, "").data(t); !cmp.Equal(got, d) {
			t.Errorf("PUT %v changed the subscriber: %v", body, got)
		}
	}
	wantEvents := []eventSummary{
		{Type: "subscriber.created", Previous: map[string]any{}, Source: map[string]any{"kind": "api", "api_key": e.keyPrefix()}},
		{Type: "subscriber.updated", Previous: map[string]any{"attributes": map[string]any{"plan": "free", "company": "Acme", "trial": nil}},
			Source: map[string]any{"kind": "api", "api_key": e.keyPrefix()}},
		{Type: "subscriber.updated", Previous: map[string]any{"tags": []any{"a"}},
			Source: map[string]any{"kind": "api", "api_key": e.keyPrefix()}},
	}
	evs := e.history(id)
	if diff := cmp.Diff(wantEvents, summarize(evs)); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if got := evs[len(evs)-1]["data"].(map[string]any)["subscriber"]; !cmp.Equal(got, d) {
		t.Errorf("the last event's subscriber = %v, want %v", got, d)
	}

	// The limits apply to the result of the merge; nothing changes.
	many := map[string]any{}
	for i := range 48 {
		many[fmt.Sprintf("k%d", i)] = i
	}
	r := e.do("PUT", path, map[string]any{"attributes": many}).want(t, http.StatusUnprocessableEntity, "validation_error")
	if diff := cmp.Diff(map[string][]string{"attributes": {"The attributes field must not have more than 50 keys."}}, r.fieldErrors(t)); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
	for _, tc := range []struct {
		body map[string]any
		want map[string][]string
	}{
		{map[string]any{}, map[string][]string{"body": {"At least one of email, name, status, attributes or tags must be provided."}}},
		{map[string]any{"attributes": map[string]any{"plan": []any{}}}, map[string][]string{"attributes.plan": {"The attributes.plan field must be a string, number or boolean."}}},
		{map[string]any{"tags": nil}, map[string][]string{"tags": {"The tags field must be an array."}}},
	} {
		r := e.do("PUT", path, tc.body).want(t, http.StatusUnprocessableEntity, "validation_error")
		if diff := cmp.Diff(tc.want, r.fieldErrors(t)); diff != "" {
			t.Errorf("PUT %v errors (-want +got):\n%s", tc.body, diff)
		}
	}
	if got := e.do("GET", path, nil).want(t, http.StatusOK, "").data(t); !cmp.Equal(got, d) {
		t.Errorf("refused PUTs changed the subscriber: %v", got)
	}

	// The upsert merges the same way, and creates with what it is given.
	u := e.do("PUT", upsertPath("ann@example.com"), map[string]any{"attributes": map[string]any{"seats": nil}, "tags": []any{}}).
		want(t, http.StatusOK, "").data(t)
	if !cmp.Equal(u["attributes"], map[string]any{"plan": "pro", "trial": true}) || !cmp.Equal(u["tags"], []any{}) {
		t.Errorf("upsert of an existing address: %v", u)
	}
	n := e.do("PUT", upsertPath("new@example.com"), map[string]any{"attributes": map[string]any{"plan": "x", "gone": nil}, "tags": []any{"T"}}).
		want(t, http.StatusCreated, "").data(t)
	if !cmp.Equal(n["attributes"], map[string]any{"plan": "x"}) || !cmp.Equal(n["tags"], []any{"t"}) {
		t.Errorf("upsert of a new address: %v", n)
	}
}

// TestConcurrentAttributeWritesKeepEveryKey: 50 PUTs at once, each setting a different key,
// leave all 50 (the merge runs under the row lock).
func TestConcurrentAttributeWritesKeepEveryKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.do("POST", "/subscribers", map[string]any{"email": "ann@example.com"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
	statuses := make([]int, 50)
	concurrently(50, func(i int) {
		statuses[i] = e.do("PUT", "/subscribers/"+id, map[string]any{"attributes": map[string]any{fmt.Sprintf("k%d", i): i}}).status
	})
	for i, st := range statuses {
		if st != http.StatusOK {
			t.Errorf("PUT %d: %d", i, st)
		}
	}
	attrs := e.do("GET", "/subscribers/"+id, nil).want(t, http.StatusOK, "").data(t)["attributes"].(map[string]any)
	if len(attrs) != 50 {
		t.Errorf("%d keys after 50 concurrent PUTs, want 50: %v", len(attrs), attrs)
	}
	if n := len(e.history(id)); n != 51 {
		t.Errorf("%d events, want 51", n)
	}
}

// TestTagsOperation: POST /subscribers/{id}/tags adds and removes at once (§19.2), with its
// rules, its 404, its event only when the set changed, and Idempotency-Key.
func TestTagsOperation(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.do("POST", "/subscribers", map[string]any{"email": "ann@example.com", "tags": []any{"a", "b"}}).
		want(t, http.StatusCreated, "").data(t)["id"].(string)
	path := "/subscribers/" + id + "/tags"
	e.do("DELETE", "/subscribers/"+id, nil).want(t, http.StatusOK, "") // any status

	d := e.do("POST", path, map[string]any{"add": []any{"C", "a"}, "remove": []any{"B", "zz"}}).want(t, http.StatusOK, "").data(t)
	if !cmp.Equal(d["tags"], []any{"a", "c"}) || d["status"] != "unsubscribed" || d["id"] != id {
		t.Errorf("after the change: %v", d)
	}
	if got := e.do("POST", path, map[string]any{"add": []any{"a"}}).want(t, http.StatusOK, "").data(t); !cmp.Equal(got, d) {
		t.Errorf("a change to nothing answered %v", got)
	}
	evs := summarize(e.history(id))
	wantLast := eventSummary{Type: "subscriber.updated", Previous: map[string]any{"tags": []any{"a", "b"}},
		Source: map[string]any{"kind": "api", "api_key": e.keyPrefix()}}
	if len(evs) != 3 || !cmp.Equal(evs[2], wantLast) {
		t.Errorf("events %v; want created, unsubscribed, then %v", evs, wantLast)
	}

	tooMany := make([]any, 99)
	for i := range tooMany {
		tooMany[i] = fmt.Sprintf("t%03d", i)
	}
	for _, tc := range []struct {
		body any
		want map[string][]string
	}{
		{map[string]any{}, map[string][]string{"body": {"At least one of add or remove must be provided."}}},
		{map[string]any{"add": []any{"x"}, "remove": []any{"y", "X"}}, map[string][]string{"remove.1": {"The remove.1 field must not also be added."}}},
		{map[string]any{"add": []any{""}}, map[string][]string{"add.0": {"The add.0 field must be between 1 and 64 characters."}}},
		{map[string]any{"remove": "a"}, map[string][]string{"remove": {"The remove field must be an array."}}},
		{map[string]any{"add": []any{"x"}, "tags": []any{}}, map[string][]string{"tags": {"The tags field is prohibited."}}},
		{map[string]any{"add": tooMany}, map[string][]string{"tags": {"The tags field must not have more than 100 items."}}},
	} {
		r := e.do("POST", path, tc.body).want(t, http.StatusUnprocessableEntity, "validation_error")
		if diff := cmp.Diff(tc.want, r.fieldErrors(t)); diff != "" {
			t.Errorf("%v: errors (-want +got):\n%s", tc.body, diff)
		}
	}
	if got := e.do("GET", "/subscribers/"+id, nil).want(t, http.StatusOK, "").data(t); !cmp.Equal(got["tags"], d["tags"]) {
		t.Errorf("refused changes changed the tags: %v", got["tags"])
	}
	e.do("POST", "/subscribers/01a21363-a43b-7cde-b444-4915076b1130/tags", map[string]any{"add": []any{"x"}}).
		want(t, http.StatusNotFound, "not_found")

	// Idempotency-Key: the replay answers as the first did and changes nothing more.
	first := e.do("POST", path, map[string]any{"add": []any{"k"}}, "Idempotency-Key: tags-1").want(t, http.StatusOK, "")
	e.do("POST", path, map[string]any{"remove": []any{"k"}}).want(t, http.StatusOK, "")
	again := e.do("POST", path, map[string]any{"add": []any{"k"}}, "Idempotency-Key: tags-1").want(t, http.StatusOK, "")
	if string(again.raw) != string(first.raw) {
		t.Errorf("replay = %s, want %s", again.raw, first.raw)
	}
	if got := e.do("GET", "/subscribers/"+id, nil).want(t, http.StatusOK, "").data(t)["tags"]; !cmp.Equal(got, []any{"a", "c"}) {
		t.Errorf("the replay changed the tags: %v", got)
	}
}

// TestConcurrentTagChangesKeepEveryTag: 50 requests at once, each adding a different tag,
// leave all 50.
func TestConcurrentTagChangesKeepEveryTag(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.do("POST", "/subscribers", map[string]any{"email": "ann@example.com"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
	statuses := make([]int, 50)
	concurrently(50, func(i int) {
		statuses[i] = e.do("POST", "/subscribers/"+id+"/tags", map[string]any{"add": []any{fmt.Sprintf("t%02d", i)}}).status
	})
	for i, st := range statuses {
		if st != http.StatusOK {
			t.Errorf("request %d: %d", i, st)
		}
	}
	tags := e.do("GET", "/subscribers/"+id, nil).want(t, http.StatusOK, "").data(t)["tags"].([]any)
	if len(tags) != 50 {
		t.Errorf("%d tags after 50 concurrent additions, want 50: %v", len(tags), tags)
	}
	if n := e.count("SELECT coalesce(sum(n), 0) FROM subscriber_tag_counts"); n != 50 {
		t.Errorf("tag counts sum to %d, want 50", n)
	}
}

// TestListTags: GET /tags lists the held tags sorted by code point with exact counts (any
// status), pages by cursor, and refuses a bad limit or cursor.
func TestListTags(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.do("POST", "/subscribers/bulk", []any{
		map[string]any{"email": "a@example.com", "tags": []any{"beta", "vip", "Zoë"}},
		map[string]any{"email": "b@example.com", "tags": []any{"beta", "b_%'\"\\$@"}},
		map[string]any{"email": "c@example.com", "tags": []any{"gone"}},
	}).want(t, http.StatusCreated, "")
	c := e.do("GET", "/subscribers?email=c@example.com", nil).want(t, http.StatusOK, "").body["data"].([]any)[0].(map[string]any)
	e.do("POST", "/subscribers/"+c["id"].(string)+"/tags", map[string]any{"remove": []any{"gone"}}).want(t, http.StatusOK, "")
	e.do("DELETE", "/subscribers/"+c["id"].(string), nil).want(t, http.StatusOK, "")

	all := e.do("GET", "/tags", nil).want(t, http.StatusOK, "")
	want := []any{
		map[string]any{"tag": "b_%'\"\\$@", "subscribers": float64(1)},
		map[string]any{"tag": "beta", "subscribers": float64(2)},
		map[string]any{"tag": "vip", "subscribers": float64(1)},
		map[string]any{"tag": "zoë", "subscribers": float64(1)},
	}
	if diff := cmp.Diff(want, all.body["data"]); diff != "" {
		t.Errorf("tags (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]any{"limit": float64(100), "next_cursor": nil}, all.body["pagination"]); diff != "" {
		t.Errorf("pagination (-want +got):\n%s", diff)
	}
	var walked []any
	path := "/tags?limit=3"
	for range 5 {
		r := e.do("GET", path, nil).want(t, http.StatusOK, "")
		walked = append(walked, r.body["data"].([]any)...)
		next, _ := r.body["pagination"].(map[string]any)["next_cursor"].(string)
		if next == "" {
			break
		}
		path = "/tags?limit=3&cursor=" + next
	}
	if diff := cmp.Diff(want, walked); diff != "" {
		t.Errorf("walked pages (-want +got):\n%s", diff)
	}
	for q, msg := range map[string]string{
		"limit=0":     "The limit parameter must be an integer between 1 and 1000.",
		"limit=1001":  "The limit parameter must be an integer between 1 and 1000.",
		"cursor=abc":  "The cursor is invalid.",
		"cursor=YQ.x": "The cursor is invalid.",
	} {
		r := e.do("GET", "/tags?"+q, nil).want(t, http.StatusBadRequest, "validation_error")
		if r.body["message"] != msg {
			t.Errorf("%s: message %v, want %s", q, r.body["message"], msg)
		}
	}
	// Another newsletter's cursor is refused.
	other := newEnv(t)
	first := e.do("GET", "/tags?limit=1", nil).want(t, http.StatusOK, "").body["pagination"].(map[string]any)["next_cursor"].(string)
	other.do("GET", "/tags?cursor="+first, nil).want(t, http.StatusBadRequest, "validation_error")
}

// TestListFilters: GET /subscribers' filters of §19.3, ANDed with status and each other, with
// exact totals, cursors that carry them, and their 400s.
func TestListFilters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	mk := func(email string, attrs map[string]any, tags ...any) string {
		body := map[string]any{"email": email, "tags": append([]any{}, tags...)}
		if attrs != nil {
			body["attributes"] = attrs
		}
		return e.do("POST", "/subscribers", body).want(t, http.StatusCreated, "").data(t)["id"].(string)
	}
	a := mk("a@example.com", map[string]any{"plan": "pro", "seats": 5, "trial": false}, "beta", "vip")
	b := mk("b@example.com", map[string]any{"plan": "pro", "seats": "5", "trial": "false"}, "beta")
	c := mk("c@example.com", map[string]any{"plan": "free"})
	d := mk("d@example.com", nil, "vip")
	e.do("DELETE", "/subscribers/"+d, nil).want(t, http.StatusOK, "")

	ids := func(query string) ([]string, float64) {
		t.Helper()
		r := e.do("GET", "/subscribers?"+query, nil).want(t, http.StatusOK, "")
		var out []string
		for _, s := range r.body["data"].([]any) {
			out = append(out, s.(map[string]any)["id"].(string))
		}
		return out, r.body["pagination"].(map[string]any)["total"].(float64)
	}
	for q, want := range map[string][]string{
		"tag=beta":                           {b, a},
		"tag=Beta&tag=VIP":                   {a},
		"not_tag=beta":                       {d, c},
		"not_tag=beta&status=active":         {c},
		"tag=vip&status=unsubscribed":        {d},
		"attr[plan]=pro":                     {b, a},
		"attr[seats]=5":                      {b, a},
		"attr[trial]=false":                  {b, a},
		"attr[plan]=pro&attr[seats]=5":       {b, a},
		"attr[plan]=Pro":                     nil,
		"has_attr=plan":                      {c, b, a},
		"has_attr=plan&has_attr=trial":       {b, a},
		"has_attr=nothing":                   nil,
		"tag=beta&not_tag=vip&has_attr=plan": {b},
	} {
		got, total := ids(q)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", q, diff)
		}
		if int(total) != len(want) {
			t.Errorf("%s: total %v, want %d", q, total, len(want))
		}
	}
	// The bounds are exclusive.
	created := e.do("GET", "/subscribers/"+b, nil).want(t, http.StatusOK, "").data(t)["created_at"].(string)
	if got, _ := ids("created_after=" + url.QueryEscape(created) + "&created_before=" + url.QueryEscape(created)); len(got) != 0 {
		t.Errorf("both bounds at b's creation selected %v", got)
	}
	if got, total := ids("created_after=2000-01-01T00:00:00-05:00&created_before=2999-01-01T00:00:00Z&tag=beta"); len(got) != 2 || total != 2 {
		t.Errorf("wide bounds selected %v (%v)", got, total)
	}

	// A cursor carries its filters.
	r := e.do("GET", "/subscribers?tag=beta&limit=1", nil).want(t, http.StatusOK, "")
	next := r.body["pagination"].(map[string]any)["next_cursor"].(string)
	if got, _ := ids("tag=beta&limit=1&cursor=" + next); !cmp.Equal(got, []string{a}) {
		t.Errorf("second page = %v, want a", got)
	}
	for _, q := range []string{"cursor=" + next, "tag=vip&cursor=" + next, "tag=beta&not_tag=x&cursor=" + next} {
		r := e.do("GET", "/subscribers?"+q, nil).want(t, http.StatusBadRequest, "validation_error")
		if r.body["message"] != "The cursor is invalid." {
			t.Errorf("%s: %v", q, r.body["message"])
		}
	}
	// The email lookup is ANDed with them too.
	if got, total := ids("email=a@example.com&not_tag=vip"); len(got) != 0 || total != 0 {
		t.Errorf("lookup with a filter it fails: %v (%v)", got, total)
	}

	for q, msg := range map[string]string{
		"tag=%20":                 "The tag filter must be between 1 and 64 characters.",
		"attr[Plan]=x":            "The attr filter key must match ^[a-z][a-z0-9_]{0,63}$.",
		"created_after=yesterday": "The created_after filter must be an RFC 3339 date-time.",
		"tag=1&tag=2&tag=3&tag=4&tag=5&tag=6&tag=7&tag=8&tag=9&tag=10&tag=11": "The tag filter takes at most 10 values.",
	} {
		r := e.do("GET", "/subscribers?"+q, nil).want(t, http.StatusBadRequest, "validation_error")
		if r.body["message"] != msg {
			t.Errorf("%s: message %v, want %s", q, r.body["message"], msg)
		}
	}
}

// TestListFiltersMatchLiterally: each of ' " \ $ @ % _ in a tag or an attribute value
// matches itself only, on both stores.
func TestListFiltersMatchLiterally(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for i, ch := range []string{"'", `"`, `\`, "$", "@", "%", "_"} {
		val := "a" + ch + "b"
		id := e.do("POST", "/subscribers", map[string]any{"email": fmt.Sprintf("m%d@example.com", i),
			"tags": []any{val}, "attributes": map[string]any{"k": val}}).want(t, http.StatusCreated, "").data(t)["id"].(string)
		// A decoy that a LIKE, a JSONPath or an unescaped pattern would also select.
		e.do("POST", "/subscribers", map[string]any{"email": fmt.Sprintf("decoy%d@example.com", i),
			"tags": []any{"axb" + ch}, "attributes": map[string]any{"k": "axb"}}).want(t, http.StatusCreated, "")
		for _, q := range []string{"tag=" + url.QueryEscape(val), "attr[k]=" + url.QueryEscape(val)} {
			r := e.do("GET", "/subscribers?"+q, nil).want(t, http.StatusOK, "")
			data := r.body["data"].([]any)
			if len(data) != 1 || data[0].(map[string]any)["id"] != id || r.body["pagination"].(map[string]any)["total"] != float64(1) {
				t.Errorf("%s selected %s", q, r.raw)
			}
		}
	}
}

// TestImportNDJSONAttributesAndTags: each NDJSON line of an import takes attributes and tags
// (§19.2) by the create's rules, keyed like the fields in the row errors.
func TestImportNDJSONAttributesAndTags(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startImporter(t, importer.Config{})
	file := `{"email":"a@example.com","attributes":{"plan":"pro","seats":5},"tags":["Beta","vip"]}` + "\n" +
		`{"email":"b@example.com","attributes":{"plan":null},"tags":[""]}` + "\n"
	res := e.upload("application/x-ndjson", file, "").want(t, http.StatusAccepted, "")
	e.waitImport(t, res.header.Get("Location"), "completed")
	got := e.do(http.MethodGet, "/subscribers?email=a@example.com", nil).want(t, http.StatusOK, "").body["data"].([]any)
	if len(got) != 1 || !cmp.Equal(got[0].(map[string]any)["attributes"], map[string]any{"plan": "pro", "seats": float64(5)}) ||
		!cmp.Equal(got[0].(map[string]any)["tags"], []any{"beta", "vip"}) {
		t.Errorf("imported a = %v", got)
	}
	errs := e.do(http.MethodGet, strings.TrimPrefix(res.header.Get("Location"), "/api/v1")+"/errors", nil).want(t, http.StatusOK, "")
	want := []any{map[string]any{"row": float64(2), "errors": map[string]any{
		"attributes.plan": []any{"The attributes.plan field must be a string, number or boolean."},
		"tags.0":          []any{"The tags.0 field must be between 1 and 64 characters."}}}}
	if diff := cmp.Diff(want, errs.body["data"]); diff != "" {
		t.Errorf("row errors (-want +got):\n%s", diff)
	}
	if n := e.count("SELECT coalesce(sum(n), 0) FROM subscriber_tag_counts WHERE tag = 'beta'"); n != 1 {
		t.Errorf("beta counted %d times, want 1", n)
	}
}

// TestImportCSVAttributesAndTags: a CSV file's "tags" column holds a row's tags separated by
// commas and each "attributes.<key>" column sets that attribute to the cell's text, an empty
// cell setting nothing; other columns are ignored, and row errors are keyed like the fields
// (docs/api-contract.md §19.2).
func TestImportCSVAttributesAndTags(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startImporter(t, importer.Config{})
	file := "email,Tags,attributes.plan,attributes.seats,notes\n" +
		"a@example.com,\"Beta, vip\",pro,5,ignored\n" +
		"b@example.com,,,,\n" +
		"c@example.com,\"ok,\",x,,\n"
	res := e.upload("text/csv", file, "").want(t, http.StatusAccepted, "")
	e.waitImport(t, res.header.Get("Location"), "completed")
	for email, want := range map[string][2]any{
		"a@example.com": {map[string]any{"plan": "pro", "seats": "5"}, []any{"beta", "vip"}},
		"b@example.com": {map[string]any{}, []any{}},
	} {
		got := e.do(http.MethodGet, "/subscribers?email="+email, nil).want(t, http.StatusOK, "").body["data"].([]any)
		if len(got) != 1 || !cmp.Equal(got[0].(map[string]any)["attributes"], want[0]) || !cmp.Equal(got[0].(map[string]any)["tags"], want[1]) {
			t.Errorf("imported %s = %v; want attributes %v, tags %v", email, got, want[0], want[1])
		}
	}
	errs := e.do(http.MethodGet, strings.TrimPrefix(res.header.Get("Location"), "/api/v1")+"/errors", nil).want(t, http.StatusOK, "")
	want := []any{map[string]any{"row": float64(3), "errors": map[string]any{
		"tags.1": []any{"The tags.1 field must be between 1 and 64 characters."}}}}
	if diff := cmp.Diff(want, errs.body["data"]); diff != "" {
		t.Errorf("row errors (-want +got):\n%s", diff)
	}
}

// TestTraceListFilterKinds: the list's span names the kinds of filter used and never their
// values, nor does any span of the request.
func TestTraceListFilterKinds(t *testing.T) {
	o := newObserved(t)
	o.do("POST", "/subscribers", map[string]any{"email": "ann@example.com", "tags": []any{"secrettag"},
		"attributes": map[string]any{"plan": "hiddenvalue"}}).want(t, http.StatusCreated, "")
	r, tr := o.traced("GET", "/subscribers?tag=secrettag&attr[plan]=hiddenvalue&has_attr=plan&created_after=2000-01-01T00:00:00Z", nil)
	if got := r.want(t, http.StatusOK, "").body["pagination"].(map[string]any)["total"]; got != float64(1) {
		t.Errorf("total = %v, want 1", got)
	}
	srv := serverSpan(t, tr)
	if diff := cmp.Diff([]string{"tag", "attr", "has_attr", "created_after"}, attrMap(srv)["app.list.filters"].AsStringSlice()); diff != "" {
		t.Errorf("app.list.filters (-want +got):\n%s", diff)
	}
	assertNoSecrets(t, tr, o.key, "secrettag", "hiddenvalue")
}
