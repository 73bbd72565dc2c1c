package integration

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/subscriberd/subscriberd/internal/testdb"
)

// TestEraseTakesTagsNobodyElseHolds: an erasure (§14) removes the counters of the person's
// tags that nobody else holds, and leaves the others' counts exact (GET /tags, §19.3).
func TestEraseTakesTagsNobodyElseHolds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	jane := e.do("POST", "/subscribers", map[string]any{"email": "jane@example.com", "tags": []any{"shared", "vip-jane-doe"}}).
		want(t, http.StatusCreated, "").data(t)["id"].(string)
	bob := e.do("POST", "/subscribers", map[string]any{"email": "bob@example.com", "tags": []any{"shared"}}).
		want(t, http.StatusCreated, "").data(t)["id"].(string)
	e.do("POST", "/subscribers/"+jane+"/erase", nil).want(t, http.StatusOK, "")
	if n := e.count("SELECT count(*) FROM subscriber_tag_counts WHERE tag = 'vip-jane-doe'"); n != 0 {
		t.Errorf("%d counter rows of vip-jane-doe left after its only holder's erasure", n)
	}
	want := []any{map[string]any{"tag": "shared", "subscribers": float64(1)}}
	if diff := cmp.Diff(want, e.do("GET", "/tags", nil).want(t, http.StatusOK, "").body["data"]); diff != "" {
		t.Errorf("tags (-want +got):\n%s", diff)
	}
	if n := e.count("SELECT coalesce(sum(n), 0) FROM subscriber_tag_counts WHERE tag = 'shared'"); n != 1 {
		t.Errorf("shared counts %d, want 1", n)
	}
	e.do("POST", "/subscribers/"+bob+"/erase", nil).want(t, http.StatusOK, "")
	if n := e.count("SELECT count(*) FROM subscriber_tag_counts"); n != 0 {
		t.Errorf("%d counter rows left after every holder's erasure", n)
	}
}

// TestEraseRacesTagAdds: 30 requests add a tag to 30 other subscribers while its only holder
// is erased; GET /tags then counts exactly 30, whatever the order.
func TestEraseRacesTagAdds(t *testing.T) {
	t.Parallel()
	if testdb.Store() != testdb.Postgres {
		t.Skip("PostgreSQL only: SQLite serialises writers")
	}
	e := newEnv(t)
	const others = 30
	holder := e.do("POST", "/subscribers", map[string]any{"email": "holder@example.com", "tags": []any{"race"}}).
		want(t, http.StatusCreated, "").data(t)["id"].(string)
	ids := make([]string, others)
	for i := range ids {
		ids[i] = e.do("POST", "/subscribers", map[string]any{"email": fmt.Sprintf("o%d@example.com", i)}).
			want(t, http.StatusCreated, "").data(t)["id"].(string)
	}
	statuses := make([]int, others+1)
	concurrently(others+1, func(i int) {
		if i == others {
			statuses[i] = e.do("POST", "/subscribers/"+holder+"/erase", nil).status
			return
		}
		statuses[i] = e.do("POST", "/subscribers/"+ids[i]+"/tags", map[string]any{"add": []any{"race"}}).status
	})
	for i, st := range statuses {
		if st != http.StatusOK {
			t.Errorf("request %d: %d", i, st)
		}
	}
	want := []any{map[string]any{"tag": "race", "subscribers": float64(others)}}
	if diff := cmp.Diff(want, e.do("GET", "/tags", nil).want(t, http.StatusOK, "").body["data"]); diff != "" {
		t.Errorf("tags (-want +got):\n%s", diff)
	}
}
