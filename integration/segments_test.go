package integration

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/uptrace/bun"
)

// Segments (docs/api-contract.md §20.1), sentence by sentence, on the store under test
// (TEST_STORE).

// TestSegmentsCRUD: create (201, Location), get with the member count, list, update and
// delete, each answer the segment {id, name, filter, created_at, updated_at}.
func TestSegmentsCRUD(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, s := range []map[string]any{
		{"email": "a@example.com", "tags": []any{"beta"}, "attributes": map[string]any{"plan": "pro", "seats": 5}},
		{"email": "b@example.com", "tags": []any{"beta", "vip"}},
		{"email": "c@example.com", "attributes": map[string]any{"plan": "pro"}},
	} {
		e.do("POST", "/subscribers", s).want(t, http.StatusCreated, "")
	}

	r := e.do("POST", "/segments", map[string]any{"name": "  Pro beta  ", "filter": map[string]any{
		"tags": []any{"Beta"}, "attributes": map[string]any{"seats": 5, "plan": "pro"}, "status": "active",
		"created_after": "2000-01-01T01:00:00+01:00"}}).want(t, http.StatusCreated, "")
	seg := r.data(t)
	id, _ := seg["id"].(string)
	if _, err := uuid.Parse(id); err != nil {
		t.Fatalf("id %q: %v", id, err)
	}
	if loc := r.header.Get("Location"); loc != "/api/v1/segments/"+id {
		t.Errorf("Location = %q", loc)
	}
	if got := slices.Sorted(mapKeys(seg)); !cmp.Equal(got, []string{"created_at", "filter", "id", "name", "updated_at"}) {
		t.Errorf("fields = %v", got)
	}
	// The filter comes back canonical: tags normalised, attribute values as the text they
	// match, bounds in UTC.
	wantFilter := map[string]any{"tags": []any{"beta"}, "attributes": map[string]any{"plan": "pro", "seats": "5"},
		"status": "active", "created_after": "2000-01-01T00:00:00+00:00"}
	if diff := cmp.Diff(wantFilter, seg["filter"]); diff != "" {
		t.Errorf("filter (-want +got):\n%s", diff)
	}
	if seg["name"] != "Pro beta" || seg["created_at"] != seg["updated_at"] || !strings.HasSuffix(seg["created_at"].(string), "+00:00") {
		t.Errorf("segment = %v", seg)
	}

	// GET: the segment and its exact member count now.
	got := e.do("GET", "/segments/"+id, nil).want(t, http.StatusOK, "").data(t)
	if got["subscribers"] != float64(1) {
		t.Errorf("subscribers = %v, want 1 (a)", got["subscribers"])
	}
	delete(got, "subscribers")
	if diff := cmp.Diff(seg, got); diff != "" {
		t.Errorf("GET differs from the create (-create +get):\n%s", diff)
	}

	// PUT: name and/or filter; a filter given replaces the old one.
	upd := e.do("PUT", "/segments/"+id, map[string]any{"filter": map[string]any{"tags": []any{"vip"}}}).want(t, http.StatusOK, "").data(t)
	if upd["name"] != "Pro beta" || !cmp.Equal(upd["filter"], map[string]any{"tags": []any{"vip"}}) || upd["created_at"] != seg["created_at"] {
		t.Errorf("after the filter's update: %v", upd)
	}
	if n := e.do("GET", "/segments/"+id, nil).want(t, http.StatusOK, "").data(t)["subscribers"]; n != float64(1) {
		t.Errorf("subscribers after the update = %v, want 1 (b)", n)
	}
	upd = e.do("PUT", "/segments/"+id, map[string]any{"name": "VIP"}).want(t, http.StatusOK, "").data(t)
	if upd["name"] != "VIP" || !cmp.Equal(upd["filter"], map[string]any{"tags": []any{"vip"}}) {
		t.Errorf("after the rename: %v", upd)
	}
	upd = e.do("PUT", "/segments/"+id, map[string]any{"name": "Everyone", "filter": map[string]any{}}).want(t, http.StatusOK, "").data(t)
	if upd["name"] != "Everyone" || !cmp.Equal(upd["filter"], map[string]any{}) {
		t.Errorf("after both: %v", upd)
	}
	// A PUT with the values already there writes nothing, updated_at included.
	stamp := func() string {
		var ts string
		if err := e.db.NewRaw("SELECT CAST(updated_at AS TEXT) FROM segments WHERE id = ?", id).Scan(context.Background(), &ts); err != nil {
			t.Fatal(err)
		}
		return ts
	}
	before := stamp()
	e.do("PUT", "/segments/"+id, map[string]any{"name": "Everyone", "filter": map[string]any{}}).want(t, http.StatusOK, "")
	e.do("PUT", "/segments/"+id, map[string]any{"filter": map[string]any{"tags": []any{}}}).want(t, http.StatusOK, "")
	if after := stamp(); after != before {
		t.Errorf("updated_at moved from %s to %s without a change", before, after)
	}
	// An empty filter selects everyone, any status.
	e.do("DELETE", "/subscribers/"+e.do("GET", "/subscribers?email=c@example.com", nil).body["data"].([]any)[0].(map[string]any)["id"].(string), nil).
		want(t, http.StatusOK, "")
	if n := e.do("GET", "/segments/"+id, nil).want(t, http.StatusOK, "").data(t)["subscribers"]; n != float64(3) {
		t.Errorf("subscribers of {} = %v, want 3", n)
	}

	// DELETE answers the segment as it was; then it is gone.
	del := e.do("DELETE", "/segments/"+id, nil).want(t, http.StatusOK, "").data(t)
	if diff := cmp.Diff(upd, del); diff != "" {
		t.Errorf("DELETE answered (-last +deleted):\n%s", diff)
	}
	for _, m := range []string{"GET", "PUT", "DELETE"} {
		var body any
		if m == "PUT" {
			body = map[string]any{"name": "x"}
		}
		r := e.do(m, "/segments/"+id, body).want(t, http.StatusNotFound, "not_found")
		if r.body["message"] != "Segment not found." {
			t.Errorf("%s of a deleted segment: %s", m, r.raw)
		}
	}
	if n := e.count("SELECT count(*) FROM segments"); n != 0 {
		t.Errorf("segments = %d after the delete", n)
	}
	// The subscribers are not changed by any of it.
	if n := e.count("SELECT count(*) FROM subscribers"); n != 3 {
		t.Errorf("subscribers = %d", n)
	}
}

func mapKeys(m map[string]any) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// TestSegmentNotFound: an unknown id, one that is not a UUID, and another newsletter's
// segment are 404 not_found, Segment not found., on every item operation.
func TestSegmentNotFound(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	other := e.do("POST", "/segments", map[string]any{"name": "Mine"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
	_, key2 := e.newKey(t, true)
	for _, path := range []string{"/segments/" + uuid.Must(uuid.NewV7()).String(), "/segments/not-a-uuid", "/segments/" + other} {
		for _, m := range []string{"GET", "PUT", "DELETE"} {
			var body any
			if m == "PUT" {
				body = map[string]any{"name": "Theirs"}
			}
			r := e.do(m, path, body, "Authorization: Bearer "+key2).want(t, http.StatusNotFound, "not_found")
			if r.body["message"] != "Segment not found." {
				t.Errorf("%s %s: message %v", m, path, r.body["message"])
			}
		}
	}
	if got := e.do("GET", "/segments/"+other, nil).want(t, http.StatusOK, "").data(t)["name"]; got != "Mine" {
		t.Errorf("the other newsletter changed it: %v", got)
	}
}

// TestSegmentNameRules: name is required, 1 to 100 characters with §3's rules, and unique per
// newsletter case-insensitively, on create and on update; unknown properties are refused;
// an update needs name or filter. Nothing that fails is stored.
func TestSegmentNameRules(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	long := strings.Repeat("é", 101)
	for _, c := range []struct {
		body any
		want map[string][]string
	}{
		{map[string]any{}, map[string][]string{"name": {"The name field is required."}}},
		{map[string]any{"name": nil}, map[string][]string{"name": {"The name field is required."}}},
		{map[string]any{"name": "   "}, map[string][]string{"name": {"The name field is required."}}},
		{map[string]any{"name": 5}, map[string][]string{"name": {"The name field must be a string."}}},
		{map[string]any{"name": long}, map[string][]string{"name": {"The name field must not be greater than 100 characters."}}},
		{map[string]any{"name": "a\u202eb"}, map[string][]string{"name": {"The name field contains invalid characters."}}},
		{map[string]any{"name": "ok", "color": "red"}, map[string][]string{"color": {"The color field is prohibited."}}},
	} {
		r := e.do("POST", "/segments", c.body).want(t, http.StatusUnprocessableEntity, "validation_error")
		if diff := cmp.Diff(c.want, r.fieldErrors(t)); diff != "" {
			t.Errorf("POST %v (-want +got):\n%s", c.body, diff)
		}
	}
	if n := e.count("SELECT count(*) FROM segments"); n != 0 {
		t.Fatalf("refused creates stored %d segments", n)
	}

	e.do("POST", "/segments", map[string]any{"name": strings.Repeat("é", 100)}).want(t, http.StatusCreated, "")
	first := e.do("POST", "/segments", map[string]any{"name": "Straße Fans"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
	second := e.do("POST", "/segments", map[string]any{"name": "Other"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
	taken := map[string][]string{"name": {"The name has already been taken."}}
	for _, name := range []string{"Straße Fans", "STRASSE FANS", "straße fans", " Straße Fans "} {
		r := e.do("POST", "/segments", map[string]any{"name": name}).want(t, http.StatusUnprocessableEntity, "validation_error")
		if diff := cmp.Diff(taken, r.fieldErrors(t)); diff != "" {
			t.Errorf("POST %q (-want +got):\n%s", name, diff)
		}
		r = e.do("PUT", "/segments/"+second, map[string]any{"name": name}).want(t, http.StatusUnprocessableEntity, "validation_error")
		if diff := cmp.Diff(taken, r.fieldErrors(t)); diff != "" {
			t.Errorf("PUT %q (-want +got):\n%s", name, diff)
		}
	}
	// Its own name in another case is no conflict; another newsletter may use the name.
	if got := e.do("PUT", "/segments/"+first, map[string]any{"name": "STRASSE fans"}).want(t, http.StatusOK, "").data(t)["name"]; got != "STRASSE fans" {
		t.Errorf("renamed to %v", got)
	}
	_, key2 := e.newKey(t, true)
	e.do("POST", "/segments", map[string]any{"name": "Other"}, "Authorization: Bearer "+key2).want(t, http.StatusCreated, "")

	for _, c := range []struct {
		body any
		want map[string][]string
	}{
		{map[string]any{}, map[string][]string{"body": {"At least one of name or filter must be provided."}}},
		{map[string]any{"name": ""}, map[string][]string{"name": {"The name field is required."}}},
		{map[string]any{"filter": nil}, map[string][]string{"filter": {"The filter field must be an object."}}},
		{map[string]any{"id": "x"}, map[string][]string{"id": {"The id field is prohibited."}}},
	} {
		r := e.do("PUT", "/segments/"+second, c.body).want(t, http.StatusUnprocessableEntity, "validation_error")
		if diff := cmp.Diff(c.want, r.fieldErrors(t)); diff != "" {
			t.Errorf("PUT %v (-want +got):\n%s", c.body, diff)
		}
	}
	if got := e.do("GET", "/segments/"+second, nil).want(t, http.StatusOK, "").data(t); got["name"] != "Other" || !cmp.Equal(got["filter"], map[string]any{}) {
		t.Errorf("refused updates changed it: %v", got)
	}
}

// TestSegmentFilterErrors: every part of the filter follows §19.3's rules, as 422 field errors
// keyed filter.<part>[.<item or key>]; nothing is stored.
func TestSegmentFilterErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	eleven := make([]any, 11)
	for i := range eleven {
		eleven[i] = fmt.Sprintf("t%d", i)
	}
	manyAttrs := map[string]any{}
	for i := range 11 {
		manyAttrs[fmt.Sprintf("k%d", i)] = "v"
	}
	for _, c := range []struct {
		filter any
		keys   []string
	}{
		{"beta", []string{"filter"}},
		{[]any{}, []string{"filter"}},
		{map[string]any{"status": "gone"}, []string{"filter.status"}},
		{map[string]any{"status": 1}, []string{"filter.status"}},
		{map[string]any{"tags": "beta"}, []string{"filter.tags"}},
		{map[string]any{"tags": eleven}, []string{"filter.tags"}},
		{map[string]any{"tags": []any{"ok", 5, " ", strings.Repeat("x", 65), "a,b\u0000"}},
			[]string{"filter.tags.1", "filter.tags.2", "filter.tags.3", "filter.tags.4"}},
		{map[string]any{"not_tags": []any{true}}, []string{"filter.not_tags.0"}},
		{map[string]any{"not_tags": eleven}, []string{"filter.not_tags"}},
		{map[string]any{"attributes": []any{}}, []string{"filter.attributes"}},
		{map[string]any{"attributes": manyAttrs}, []string{"filter.attributes"}},
		{map[string]any{"attributes": map[string]any{"Plan": "x"}}, []string{"filter.attributes"}},
		{map[string]any{"attributes": map[string]any{"plan": map[string]any{}, "seats": nil, "ok": 1,
			"long": strings.Repeat("x", 1001), "bad": "a\u2028b"}},
			[]string{"filter.attributes.bad", "filter.attributes.long", "filter.attributes.plan", "filter.attributes.seats"}},
		{map[string]any{"has_attributes": "plan"}, []string{"filter.has_attributes"}},
		{map[string]any{"has_attributes": []any{"ok", "Not OK", 3}}, []string{"filter.has_attributes.1", "filter.has_attributes.2"}},
		{map[string]any{"has_attributes": eleven}, []string{"filter.has_attributes"}},
		{map[string]any{"created_after": "yesterday"}, []string{"filter.created_after"}},
		{map[string]any{"created_before": 1700000000}, []string{"filter.created_before"}},
		{map[string]any{"segment": "x"}, []string{"filter.segment"}},
	} {
		for _, write := range []struct{ method, path string }{{"POST", "/segments"}, {"PUT", ""}} {
			body := map[string]any{"name": "S", "filter": c.filter}
			path := write.path
			if write.method == "PUT" {
				path = "/segments/" + e.segment(t, "Target", map[string]any{})
				body = map[string]any{"filter": c.filter}
			}
			r := e.do(write.method, path, body).want(t, http.StatusUnprocessableEntity, "validation_error")
			errs := r.fieldErrors(t)
			if got := slices.Sorted(mapKeysS(errs)); !cmp.Equal(got, c.keys) {
				t.Errorf("%s filter %v: keys %v, want %v (%s)", write.method, c.filter, got, c.keys, r.raw)
			}
			for k, msgs := range errs {
				if len(msgs) != 1 || !strings.HasPrefix(msgs[0], "The "+k+" ") && !strings.HasPrefix(msgs[0], "The selected "+k+" ") {
					t.Errorf("%s: message %q does not name its key", k, msgs)
				}
			}
		}
	}
	if n := e.count("SELECT count(*) FROM segments"); n != 1 {
		t.Errorf("segments = %d, want only the target", n)
	}
	if got := e.do("GET", "/segments/"+e.segment(t, "Target", nil), nil).want(t, http.StatusOK, "").data(t)["filter"]; !cmp.Equal(got, map[string]any{}) {
		t.Errorf("refused updates changed the filter: %v", got)
	}
	// The messages of §19.1 and §19.3, keyed for the segment.
	r := e.do("POST", "/segments", map[string]any{"name": "S", "filter": map[string]any{
		"tags": []any{" "}, "attributes": map[string]any{"plan": []any{}}, "status": "x"}}).want(t, http.StatusUnprocessableEntity, "validation_error")
	want := map[string][]string{
		"filter.tags.0":          {"The filter.tags.0 field must be between 1 and 64 characters."},
		"filter.attributes.plan": {"The filter.attributes.plan field must be a string, number or boolean."},
		"filter.status":          {"The selected filter.status is invalid; it must be active, pending or unsubscribed."},
	}
	if diff := cmp.Diff(want, r.fieldErrors(t)); diff != "" {
		t.Errorf("messages (-want +got):\n%s", diff)
	}
}

func mapKeysS(m map[string][]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// segment returns the id of the env's segment named name, created with filter when there is
// none (nil: {}).
func (e *env) segment(t *testing.T, name string, filter map[string]any) string {
	t.Helper()
	var id string
	err := e.db.NewRaw("SELECT id FROM segments WHERE newsletter_id = ? AND name = ?", e.nl, name).Scan(context.Background(), &id)
	if err == nil {
		return id
	}
	body := map[string]any{"name": name}
	if filter != nil {
		body["filter"] = filter
	}
	return e.do("POST", "/segments", body).want(t, http.StatusCreated, "").data(t)["id"].(string)
}

// TestSegmentLimit: a newsletter has at most 100 segments (422 keyed body), judged so that
// concurrent creates cannot pass it together; concurrent creates of one name make one.
func TestSegmentLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for i := range 95 {
		e.do("POST", "/segments", map[string]any{"name": fmt.Sprintf("s%03d", i)}).want(t, http.StatusCreated, "")
	}
	var created, refused atomic.Int32
	concurrently(10, func(i int) {
		r := e.do("POST", "/segments", map[string]any{"name": fmt.Sprintf("c%d", i)})
		switch {
		case r.status == http.StatusCreated:
			created.Add(1)
		case r.status == http.StatusUnprocessableEntity && cmp.Equal(r.fieldErrors(t),
			map[string][]string{"body": {"A newsletter can have at most 100 segments."}}):
			refused.Add(1)
		default:
			t.Errorf("concurrent create: %d %s", r.status, r.raw)
		}
	})
	if created.Load() != 5 || refused.Load() != 5 {
		t.Errorf("created %d, refused %d; want 5 and 5", created.Load(), refused.Load())
	}
	if n := e.count("SELECT count(*) FROM segments"); n != 100 {
		t.Errorf("segments = %d, want 100", n)
	}
	r := e.do("POST", "/segments", map[string]any{"name": "one more"}).want(t, http.StatusUnprocessableEntity, "validation_error")
	if r.body["message"] == "" || !cmp.Equal(r.fieldErrors(t), map[string][]string{"body": {"A newsletter can have at most 100 segments."}}) {
		t.Errorf("101st: %s", r.raw)
	}
	// Deleting one makes room again.
	e.do("DELETE", "/segments/"+e.segment(t, "s000", nil), nil).want(t, http.StatusOK, "")
	e.do("POST", "/segments", map[string]any{"name": "one more"}).want(t, http.StatusCreated, "")

	// Concurrent creates of one name (in any case) in another newsletter: exactly one.
	_, key2 := e.newKey(t, true)
	var ok atomic.Int32
	concurrently(8, func(i int) {
		r := e.do("POST", "/segments", map[string]any{"name": []string{"Same", "SAME", "same", "sAmE"}[i%4]}, "Authorization: Bearer "+key2)
		switch {
		case r.status == http.StatusCreated:
			ok.Add(1)
		case r.status != http.StatusUnprocessableEntity ||
			!cmp.Equal(r.fieldErrors(t), map[string][]string{"name": {"The name has already been taken."}}):
			t.Errorf("concurrent create of one name: %d %s", r.status, r.raw)
		}
	})
	if ok.Load() != 1 {
		t.Errorf("%d concurrent creates of one name succeeded, want 1", ok.Load())
	}
}

// TestListSegments: sorted by name (case-insensitively), with limit and cursor.
func TestListSegments(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.do("GET", "/segments", nil).want(t, http.StatusOK, "")
	if !cmp.Equal(r.body["data"], []any{}) || !cmp.Equal(r.body["pagination"], map[string]any{"limit": float64(25), "next_cursor": nil}) {
		t.Errorf("empty list: %s", r.raw)
	}
	for _, n := range []string{"delta", "Bravo", "alpha", "Charlie", "echo"} {
		e.do("POST", "/segments", map[string]any{"name": n, "filter": map[string]any{"tags": []any{n}}}).want(t, http.StatusCreated, "")
	}
	var names []string
	cursor := ""
	pages := 0
	for {
		q := "/segments?limit=2"
		if cursor != "" {
			q += "&cursor=" + url.QueryEscape(cursor)
		}
		r := e.do("GET", q, nil).want(t, http.StatusOK, "")
		pages++
		for _, s := range r.body["data"].([]any) {
			seg := s.(map[string]any)
			names = append(names, seg["name"].(string))
			if !cmp.Equal(seg["filter"], map[string]any{"tags": []any{strings.ToLower(seg["name"].(string))}}) {
				t.Errorf("listed %v", seg)
			}
		}
		pg := r.body["pagination"].(map[string]any)
		if pg["limit"] != float64(2) {
			t.Errorf("limit = %v", pg["limit"])
		}
		next, _ := pg["next_cursor"].(string)
		if next == "" {
			break
		}
		cursor = next
		if pages > 5 {
			t.Fatal("the cursors do not end")
		}
	}
	if want := []string{"alpha", "Bravo", "Charlie", "delta", "echo"}; !cmp.Equal(names, want) || pages != 3 {
		t.Errorf("walked %v in %d pages, want %v in 3", names, pages, want)
	}
	for _, q := range []string{"limit=0", "limit=101", "limit=x", "cursor=nope", "cursor=" + url.QueryEscape(cursor+"x")} {
		e.do("GET", "/segments?"+q, nil).want(t, http.StatusBadRequest, "validation_error")
	}
	// Another newsletter's cursor is refused.
	_, key2 := e.newKey(t, true)
	r = e.do("GET", "/segments?cursor="+url.QueryEscape(cursor), nil, "Authorization: Bearer "+key2).want(t, http.StatusBadRequest, "validation_error")
	if r.body["message"] != "The cursor is invalid." {
		t.Errorf("message = %v", r.body["message"])
	}
}

// TestListBySegment: GET /subscribers?segment=<id> lists the segment's members at the time of
// the request, ANDed with the other filters; an unknown segment is a 400; a cursor carries the
// segment.
func TestListBySegment(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	mk := func(email string, attrs map[string]any, tags ...any) string {
		body := map[string]any{"email": email, "tags": append([]any{}, tags...)}
		if attrs != nil {
			body["attributes"] = attrs
		}
		return e.do("POST", "/subscribers", body).want(t, http.StatusCreated, "").data(t)["id"].(string)
	}
	a := mk("a@example.com", map[string]any{"plan": "pro"}, "beta", "vip")
	b := mk("b@example.com", map[string]any{"plan": "pro"}, "beta")
	c := mk("c@example.com", map[string]any{"plan": "free"}, "beta")
	d := mk("d@example.com", nil, "vip")
	e.do("DELETE", "/subscribers/"+b, nil).want(t, http.StatusOK, "")

	pro := e.segment(t, "Pro beta", map[string]any{"tags": []any{"beta"}, "attributes": map[string]any{"plan": "pro"}})
	all := e.segment(t, "Everyone", map[string]any{})
	active := e.segment(t, "Active", map[string]any{"status": "active"})
	list := func(query string) ([]string, float64) {
		t.Helper()
		r := e.do("GET", "/subscribers?"+query, nil).want(t, http.StatusOK, "")
		var out []string
		for _, s := range r.body["data"].([]any) {
			out = append(out, s.(map[string]any)["id"].(string))
		}
		return out, r.body["pagination"].(map[string]any)["total"].(float64)
	}
	count := func(id string) float64 {
		t.Helper()
		return e.do("GET", "/segments/"+id, nil).want(t, http.StatusOK, "").data(t)["subscribers"].(float64)
	}
	for q, want := range map[string][]string{
		"segment=" + pro:                       {b, a},
		"segment=" + all:                       {d, c, b, a},
		"segment=" + active:                    {d, c, a},
		"segment=" + pro + "&status=active":    {a},
		"segment=" + active + "&status=active": {d, c, a},
		// The list's status and the segment's both hold: none is active and unsubscribed.
		"segment=" + active + "&status=unsubscribed": nil,
		"segment=" + pro + "&not_tag=vip":            {b},
		"segment=" + pro + "&tag=vip":                {a},
		// Conditions on one key both hold.
		"segment=" + pro + "&attr[plan]=free":                     nil,
		"segment=" + pro + "&attr[plan]=pro":                      {b, a},
		"segment=" + all + "&has_attr=plan":                       {c, b, a},
		"segment=" + pro + "&email=a@example.com":                 {a},
		"segment=" + pro + "&email=c@example.com":                 nil,
		"segment=" + strings.ToUpper(pro):                         {b, a},
		"segment=" + pro + "&created_before=2000-01-01T00:00:00Z": nil,
	} {
		got, total := list(q)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", q, diff)
		}
		if int(total) != len(want) {
			t.Errorf("%s: total %v, want %d", q, total, len(want))
		}
	}
	// The count of GET /segments/{id} is the list's total.
	for id, want := range map[string]float64{pro: 2, all: 4, active: 3} {
		if got := count(id); got != want {
			t.Errorf("segment %s counts %v, want %v", id, got, want)
		}
	}

	// Evaluated anew each time: a new member appears, a changed one leaves, a changed filter
	// changes the members.
	f := mk("f@example.com", map[string]any{"plan": "pro"}, "beta")
	if got, _ := list("segment=" + pro); !cmp.Equal(got, []string{f, b, a}) || count(pro) != 3 {
		t.Errorf("after a new member: %v (%v)", got, count(pro))
	}
	e.do("PUT", "/subscribers/"+a, map[string]any{"attributes": map[string]any{"plan": "free"}}).want(t, http.StatusOK, "")
	if got, _ := list("segment=" + pro); !cmp.Equal(got, []string{f, b}) || count(pro) != 2 {
		t.Errorf("after a member left: %v (%v)", got, count(pro))
	}
	e.do("PUT", "/segments/"+pro, map[string]any{"filter": map[string]any{"tags": []any{"vip"}}}).want(t, http.StatusOK, "")
	if got, _ := list("segment=" + pro); !cmp.Equal(got, []string{d, a}) || count(pro) != 2 {
		t.Errorf("after the filter changed: %v (%v)", got, count(pro))
	}

	// An unknown, another newsletter's or malformed segment is a 400.
	_, key2 := e.newKey(t, true)
	theirs := e.do("POST", "/segments", map[string]any{"name": "Theirs"}, "Authorization: Bearer "+key2).want(t, http.StatusCreated, "").data(t)["id"].(string)
	for _, s := range []string{uuid.Must(uuid.NewV7()).String(), theirs, "nope", "%20"} {
		r := e.do("GET", "/subscribers?segment="+s, nil).want(t, http.StatusBadRequest, "validation_error")
		if r.body["message"] != "The selected segment is invalid." {
			t.Errorf("segment=%s: %s", s, r.raw)
		}
		if _, ok := r.body["errors"]; ok {
			t.Errorf("segment=%s: a 400 with errors", s)
		}
	}
	deleted := e.segment(t, "Gone", map[string]any{})
	e.do("DELETE", "/segments/"+deleted, nil).want(t, http.StatusOK, "")
	e.do("GET", "/subscribers?segment="+deleted, nil).want(t, http.StatusBadRequest, "validation_error")
}

// TestSegmentCursor: a cursor carries its filters, the segment's id included: the next page
// with the same segment follows, evaluated anew; a cursor used with other filters is refused.
func TestSegmentCursor(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var ids []string
	for i := range 5 {
		ids = append(ids, e.do("POST", "/subscribers", map[string]any{"email": fmt.Sprintf("s%d@example.com", i), "tags": []any{"beta"}}).
			want(t, http.StatusCreated, "").data(t)["id"].(string))
	}
	seg := e.segment(t, "Beta", map[string]any{"tags": []any{"beta"}})
	other := e.segment(t, "Beta too", map[string]any{"tags": []any{"beta"}})
	r := e.do("GET", "/subscribers?segment="+seg+"&limit=2", nil).want(t, http.StatusOK, "")
	next := r.body["pagination"].(map[string]any)["next_cursor"].(string)
	// A subscriber created meanwhile comes first in the order: the walk goes on after the page.
	e.do("POST", "/subscribers", map[string]any{"email": "late@example.com", "tags": []any{"beta"}}).want(t, http.StatusCreated, "")
	r = e.do("GET", "/subscribers?segment="+seg+"&limit=2&cursor="+next, nil).want(t, http.StatusOK, "")
	var got []string
	for _, s := range r.body["data"].([]any) {
		got = append(got, s.(map[string]any)["id"].(string))
	}
	if want := []string{ids[2], ids[1]}; !cmp.Equal(got, want) {
		t.Errorf("second page %v, want %v", got, want)
	}
	if pg := r.body["pagination"].(map[string]any); pg["total"] != float64(6) || pg["page"] != nil {
		t.Errorf("pagination %v", pg)
	}
	// The segment's filter is not in the cursor: changed, the walk goes on with the new one.
	e.do("PUT", "/segments/"+seg, map[string]any{"filter": map[string]any{"tags": []any{"beta"}, "created_before": "2999-01-01T00:00:00Z"}}).
		want(t, http.StatusOK, "")
	e.do("GET", "/subscribers?segment="+seg+"&limit=2&cursor="+next, nil).want(t, http.StatusOK, "")
	for _, q := range []string{"cursor=" + next, "segment=" + other + "&cursor=" + next, "segment=" + seg + "&tag=beta&cursor=" + next,
		"segment=" + seg + "&status=active&cursor=" + next} {
		r := e.do("GET", "/subscribers?"+q, nil).want(t, http.StatusBadRequest, "validation_error")
		if r.body["message"] != "The cursor is invalid." {
			t.Errorf("%s: %v", q, r.body["message"])
		}
	}
	// And a cursor of the list without a segment is refused with one.
	plain := e.do("GET", "/subscribers?tag=beta&limit=2", nil).want(t, http.StatusOK, "").body["pagination"].(map[string]any)["next_cursor"].(string)
	e.do("GET", "/subscribers?tag=beta&segment="+seg+"&cursor="+plain, nil).want(t, http.StatusBadRequest, "validation_error")
}

// TestSegmentsReadKey: a read key may call only the GETs of segments, and list by a segment.
func TestSegmentsReadKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.segment(t, "Everyone", nil)
	_, secret := e.readKey(t)
	auth := "Authorization: Bearer " + secret
	for _, w := range []struct {
		method, path string
		body         any
	}{
		{"POST", "/segments", map[string]any{"name": "New"}},
		{"PUT", "/segments/" + id, map[string]any{"name": "Renamed"}},
		{"DELETE", "/segments/" + id, nil},
		{"POST", "/segments", map[string]any{}}, // refused before the body is looked at
	} {
		r := e.do(w.method, w.path, w.body, auth).want(t, http.StatusForbidden, "insufficient_scope")
		if r.body["message"] != "This API key can only read." {
			t.Errorf("%s %s: %s", w.method, w.path, r.raw)
		}
	}
	for _, path := range []string{"/segments", "/segments/" + id, "/subscribers?segment=" + id} {
		e.do("GET", path, nil, auth).want(t, http.StatusOK, "")
	}
	if got := e.do("GET", "/segments/"+id, nil).want(t, http.StatusOK, "").data(t)["name"]; got != "Everyone" || e.count("SELECT count(*) FROM segments") != 1 {
		t.Errorf("a read key changed the segments: %v", got)
	}
}

// TestSegmentIdempotency: the segment writes take Idempotency-Key (§8): a retried create
// gets the first answer again, Location included, and creates nothing more.
func TestSegmentIdempotency(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	body := `{"name":"Retried","filter":{"tags":["beta"]}}`
	first := e.do("POST", "/segments", body, "Idempotency-Key: seg-1").want(t, http.StatusCreated, "")
	again := e.do("POST", "/segments", body, "Idempotency-Key: seg-1").want(t, http.StatusCreated, "")
	if string(again.raw) != string(first.raw) || again.header.Get("Idempotent-Replayed") != "true" ||
		again.header.Get("Location") != first.header.Get("Location") || first.header.Get("Location") == "" {
		t.Errorf("replay: %d %s %v; first %s %v", again.status, again.raw, again.header, first.raw, first.header)
	}
	if n := e.count("SELECT count(*) FROM segments"); n != 1 {
		t.Errorf("segments = %d, want 1", n)
	}
	// Without the key the same body is a second create: the name is taken.
	e.do("POST", "/segments", body).want(t, http.StatusUnprocessableEntity, "validation_error")
	// Another body with the key: 422 idempotency_key_reused.
	e.do("POST", "/segments", `{"name":"Other"}`, "Idempotency-Key: seg-1").want(t, http.StatusUnprocessableEntity, "idempotency_key_reused")

	id := first.data(t)["id"].(string)
	put := e.do("PUT", "/segments/"+id, `{"name":"Renamed"}`, "Idempotency-Key: seg-2").want(t, http.StatusOK, "")
	e.do("PUT", "/segments/"+id, `{"name":"Again"}`).want(t, http.StatusOK, "")
	if r := e.do("PUT", "/segments/"+id, `{"name":"Renamed"}`, "Idempotency-Key: seg-2").want(t, http.StatusOK, ""); string(r.raw) != string(put.raw) ||
		r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("PUT replay: %s", r.raw)
	}
	if got := e.do("GET", "/segments/"+id, nil).want(t, http.StatusOK, "").data(t)["name"]; got != "Again" {
		t.Errorf("the replayed PUT ran again: name %v", got)
	}
	del := e.do("DELETE", "/segments/"+id, nil, "Idempotency-Key: seg-3").want(t, http.StatusOK, "")
	if r := e.do("DELETE", "/segments/"+id, nil, "Idempotency-Key: seg-3").want(t, http.StatusOK, ""); string(r.raw) != string(del.raw) {
		t.Errorf("DELETE replay: %s", r.raw)
	}
	e.do("DELETE", "/segments/"+id, nil).want(t, http.StatusNotFound, "not_found")
}

// TestSegmentsGoWithTheirNewsletter: deleting a newsletter deletes its segments.
func TestSegmentsGoWithTheirNewsletter(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.segment(t, "Everyone", nil)
	nl2, key2 := e.newKey(t, true)
	e.do("POST", "/segments", map[string]any{"name": "Theirs"}, "Authorization: Bearer "+key2).want(t, http.StatusCreated, "")
	if _, err := e.db.NewRaw("DELETE FROM newsletters WHERE id = ?", nl2).Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := e.count("SELECT count(*) FROM segments"); n != 1 {
		t.Errorf("segments = %d after the newsletter's deletion, want 1", n)
	}
}

// countHook keeps the text of the statements that count subscribers (as bun sent them, the
// arguments in place).
type countHook struct {
	mu      sync.Mutex
	queries []string
}

func (h *countHook) BeforeQuery(ctx context.Context, _ *bun.QueryEvent) context.Context { return ctx }

func (h *countHook) AfterQuery(_ context.Context, ev *bun.QueryEvent) {
	if strings.HasPrefix(ev.Query, "SELECT count(*) FROM subscribers WHERE") {
		h.mu.Lock()
		h.queries = append(h.queries, ev.Query)
		h.mu.Unlock()
	}
}

// TestSegmentCountUsesTheFilterIndexes: the member count of GET /segments/{id} is one
// statement with the filtered list's conditions, which PostgreSQL answers from §19.3's indexes
// (the tags' and the attributes' GIN indexes), not by reading every subscriber.
func TestSegmentCountUsesTheFilterIndexes(t *testing.T) {
	postgresOnly(t, "the plan of PostgreSQL's GIN indexes; SQLite has no index of JSON contents")
	t.Parallel()
	h := &countHook{}
	e := newEnv(t, withHook(h))
	// A newsletter of 5,000 subscribers, 1 % of whom match, with statistics: the planner's
	// choice on an empty table says nothing.
	ctx := context.Background()
	if _, err := e.db.ExecContext(ctx, `INSERT INTO subscribers (id, newsletter_id, email, email_key, first_name, last_name,
    status, created_at, updated_at, attributes, tags)
SELECT gen_random_uuid(), ?, 's' || i || '@example.com', 's' || i || '@example.com', '', '', 'active', now(), now(),
    CASE WHEN i % 100 = 0 THEN '{"plan": "pro"}'::jsonb ELSE '{}'::jsonb END,
    CASE WHEN i % 100 = 0 THEN '{beta}'::text[] ELSE '{}'::text[] END
FROM generate_series(1, 5000) AS i`, e.nl); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.ExecContext(ctx, `ANALYZE subscribers`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		filter map[string]any
		index  string
	}{
		{map[string]any{"tags": []any{"beta"}}, "subscribers_tags_idx"},
		{map[string]any{"attributes": map[string]any{"plan": "pro"}}, "subscribers_attributes_idx"},
		{map[string]any{"has_attributes": []any{"plan"}}, "subscribers_attribute_names_idx"},
	} {
		id := e.segment(t, c.index, c.filter)
		h.mu.Lock()
		h.queries = nil
		h.mu.Unlock()
		if n := e.do("GET", "/segments/"+id, nil).want(t, http.StatusOK, "").data(t)["subscribers"]; n != float64(50) {
			t.Errorf("%v: subscribers = %v, want 50", c.filter, n)
		}
		h.mu.Lock()
		queries := slices.Clone(h.queries)
		h.mu.Unlock()
		if len(queries) != 1 {
			t.Fatalf("%v: %d counting statements, want 1: %v", c.filter, len(queries), queries)
		}
		if plan := explain(t, e, queries[0]); !strings.Contains(plan, c.index) {
			t.Errorf("%v: the count does not use %s:\n%s\n%s", c.filter, c.index, queries[0], plan)
		}
	}
}
