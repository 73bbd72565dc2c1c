package integration

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/subscriberd/subscriberd/internal/testdb"
)

// Tests of docs/api-contract.md §9 (lookup by email, cursors), on the store TEST_STORE names.

const (
	msgEmailFilter   = "The email filter must be a valid email address."
	msgPageAndCursor = "Use either page or cursor, not both."
	msgCursorInvalid = "The cursor is invalid."
)

func (r response) pagination(t *testing.T) map[string]any {
	t.Helper()
	p, ok := r.body["pagination"].(map[string]any)
	if !ok {
		t.Fatalf("no pagination in %s", r.raw)
	}
	return p
}

func (r response) list(t *testing.T) []map[string]any {
	t.Helper()
	raw, ok := r.body["data"].([]any)
	if !ok {
		t.Fatalf("data is not an array: %s", r.raw)
	}
	out := make([]map[string]any, len(raw))
	for i, v := range raw {
		out[i] = v.(map[string]any)
	}
	return out
}

func want400(t *testing.T, r response, msg string) {
	t.Helper()
	r.want(t, http.StatusBadRequest, "validation_error")
	if want := `{"success":false,"code":"validation_error","message":"` + msg + `"}`; strings.TrimSpace(string(r.raw)) != want {
		t.Fatalf("body %s; want %s", r.raw, want)
	}
}

func TestLookupByEmail(t *testing.T) {
	e := newEnv(t)
	created := e.do("POST", "/subscribers", map[string]any{"email": "Ada@Example.com", "name": "Ada"}).want(t, http.StatusCreated, "").data(t)
	e.do("POST", "/subscribers", map[string]any{"email": "bob@example.com", "status": "pending"}).want(t, http.StatusCreated, "")
	other := newEnvOn(t, e)
	other.do("POST", "/subscribers", map[string]any{"email": "carl@example.com"}).want(t, http.StatusCreated, "")

	tests := []struct {
		name, query string
		found       bool
	}{
		{"exact", "email=Ada@Example.com", true},
		{"case-insensitive", "email=ada@EXAMPLE.COM", true},
		{"trimmed", "email=" + url.QueryEscape("  ada@example.com\t"), true},
		{"with its status", "email=ada@example.com&status=active", true},
		{"with another status", "email=ada@example.com&status=pending", false},
		{"unknown", "email=nobody@example.com", false},
		{"another newsletter's", "email=carl@example.com", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.do("GET", "/subscribers?"+tt.query, nil).want(t, http.StatusOK, "")
			total, data := 0.0, []map[string]any{}
			if tt.found {
				total, data = 1, []map[string]any{created}
			}
			if diff := cmp.Diff(data, r.list(t)); diff != "" {
				t.Errorf("data (-want +got):\n%s", diff)
			}
			want := map[string]any{"page": 1.0, "limit": 25.0, "total": total, "pages": total, "next_cursor": nil}
			if diff := cmp.Diff(want, r.pagination(t)); diff != "" {
				t.Errorf("pagination (-want +got):\n%s", diff)
			}
		})
	}
	for _, bad := range []string{"x", "ada", "a b@example.com", "Ada <ada@example.com>", "ada@localhost", " ",
		strings.Repeat("a", 250) + "@example.com"} {
		want400(t, e.do("GET", "/subscribers?email="+url.QueryEscape(bad), nil), msgEmailFilter)
	}
	// An empty value is no filter, as for the other parameters.
	if r := e.do("GET", "/subscribers?email=", nil).want(t, http.StatusOK, ""); len(r.list(t)) != 2 {
		t.Fatalf("email= listed %s", r.raw)
	}
}

// TestLookupByEmailUsesUniqueIndex: the lookup reads the unique index on the case-folded email,
// whatever the newsletter's size.
func TestLookupByEmailUsesUniqueIndex(t *testing.T) {
	e := newEnv(t)
	var joined string
	if testdb.Store() == testdb.SQLite {
		joined = explain(t, e, `SELECT * FROM subscribers WHERE newsletter_id = ? AND email_key = ?`, e.nl.String(), "a@example.com")
	} else {
		// The planner's choice on an empty table rests on guesses that a column's width
		// tips (two indexes tie at one estimated row): plan with a newsletter's statistics.
		ctx := context.Background()
		if _, err := e.db.ExecContext(ctx, `INSERT INTO subscribers (id, newsletter_id, email, email_key, first_name, last_name, status, created_at, updated_at)
			SELECT gen_random_uuid(), ?, 's' || i || '@example.com', 's' || i || '@example.com', '', '', 'active', now(), now()
			FROM generate_series(1, 2000) AS i`, e.nl); err != nil {
			t.Fatal(err)
		}
		if _, err := e.db.ExecContext(ctx, `ANALYZE subscribers`); err != nil {
			t.Fatal(err)
		}
		joined = explain(t, e, `SELECT * FROM subscribers WHERE newsletter_id = ? AND email_key = ?`, e.nl, "a@example.com")
	}
	want := "subscribers_newsletter_email_key"
	if testdb.Store() == testdb.SQLite { // the UNIQUE (newsletter_id, email_key) constraint's index
		want = "(newsletter_id=? AND email_key=?)"
	}
	if !strings.Contains(joined, want) {
		t.Fatalf("plan does not use %s:\n%s", want, joined)
	}
}

// walkCursor lists every page from query with cursors, calling between before each next page.
func walkCursor(t *testing.T, e *env, query string, between func(page int)) []string {
	t.Helper()
	var ids []string
	r := e.do("GET", "/subscribers?"+query, nil).want(t, http.StatusOK, "")
	for page := 1; ; page++ {
		for _, s := range r.list(t) {
			ids = append(ids, s["id"].(string))
		}
		next, _ := r.pagination(t)["next_cursor"].(string)
		if next == "" {
			return ids
		}
		if between != nil {
			between(page)
		}
		r = e.do("GET", "/subscribers?"+query+"&cursor="+url.QueryEscape(next), nil).want(t, http.StatusOK, "")
		p := r.pagination(t)
		if p["page"] != nil || p["pages"] != nil {
			t.Fatalf("cursor page has page %v, pages %v; want null", p["page"], p["pages"])
		}
	}
}

// TestCursorWalkWithCreates: a cursor walk over 1,000 subscribers visits each exactly once
// while subscribers are created between the pages.
func TestCursorWalkWithCreates(t *testing.T) {
	e := newEnv(t)
	want := map[string]bool{}
	for b := range 10 {
		items := make([]any, 100)
		for i := range items {
			items[i] = map[string]any{"email": fmt.Sprintf("w%d-%d@example.com", b, i)}
		}
		for _, s := range e.do("POST", "/subscribers/bulk", items).want(t, http.StatusCreated, "").data(t)["created"].([]any) {
			want[s.(map[string]any)["id"].(string)] = true
		}
	}
	n := 0
	ids := walkCursor(t, e, "limit=30", func(int) {
		n++
		e.do("POST", "/subscribers", map[string]any{"email": fmt.Sprintf("new%d@example.com", n)}).want(t, http.StatusCreated, "")
	})
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] {
			t.Fatalf("%s visited twice", id)
		}
		seen[id] = true
	}
	for id := range want {
		if !seen[id] {
			t.Fatalf("%s not visited", id)
		}
	}
	// The subscribers created during the walk came first in the order, so none was visited.
	if len(ids) != len(want) {
		t.Fatalf("visited %d; want %d", len(ids), len(want))
	}
	// A filtered walk: only the status, each once.
	e.do("POST", "/subscribers", map[string]any{"email": "p1@example.com", "status": "pending"}).want(t, http.StatusCreated, "")
	e.do("POST", "/subscribers", map[string]any{"email": "p2@example.com", "status": "pending"}).want(t, http.StatusCreated, "")
	if got := walkCursor(t, e, "limit=1&status=pending", nil); len(got) != 2 {
		t.Fatalf("pending walk = %v; want 2", got)
	}
}

func TestCursorPages(t *testing.T) {
	e := newEnv(t)
	for i := range 5 {
		e.do("POST", "/subscribers", map[string]any{"email": fmt.Sprintf("c%d@example.com", i)}).want(t, http.StatusCreated, "")
	}
	all := e.do("GET", "/subscribers", nil).want(t, http.StatusOK, "").list(t)
	first := e.do("GET", "/subscribers?limit=2", nil).want(t, http.StatusOK, "")
	cur := first.pagination(t)["next_cursor"].(string)
	second := e.do("GET", "/subscribers?limit=2&cursor="+cur, nil).want(t, http.StatusOK, "")
	if diff := cmp.Diff(all[2:4], second.list(t)); diff != "" {
		t.Fatalf("second page (-want +got):\n%s", diff)
	}
	p := second.pagination(t)
	if p["total"] != 5.0 || p["limit"] != 2.0 || p["page"] != nil || p["pages"] != nil || p["next_cursor"] == nil {
		t.Fatalf("pagination = %v", p)
	}
	// The last page: next_cursor null as nothing follows. A page that ends exactly at the end
	// says so too.
	last := e.do("GET", "/subscribers?limit=2&cursor="+p["next_cursor"].(string), nil).want(t, http.StatusOK, "")
	if len(last.list(t)) != 1 || last.pagination(t)["next_cursor"] != nil {
		t.Fatalf("last page = %s", last.raw)
	}
	exact := e.do("GET", "/subscribers?limit=5", nil).want(t, http.StatusOK, "")
	if exact.pagination(t)["next_cursor"] != nil {
		t.Fatalf("a page ending at the end has a next_cursor: %s", exact.raw)
	}
	// A cursor from another instance works: the key is shared through the database.
	second2 := e.do("GET", e.secondInstance(t)+"/subscribers?limit=2&cursor="+cur, nil).want(t, http.StatusOK, "")
	if diff := cmp.Diff(second.list(t), second2.list(t)); diff != "" {
		t.Fatalf("second instance's page (-want +got):\n%s", diff)
	}
	// The limit may change along the walk: the cursor is a position.
	if got := e.do("GET", "/subscribers?limit=3&cursor="+cur, nil).want(t, http.StatusOK, "").list(t); len(got) != 3 {
		t.Fatalf("limit 3 after the cursor: %d", len(got))
	}

	// Errors.
	want400(t, e.do("GET", "/subscribers?page=1&cursor="+cur, nil), msgPageAndCursor)
	want400(t, e.do("GET", "/subscribers?page=2&limit=2&cursor="+cur, nil), msgPageAndCursor)
	raw, _ := base64.RawURLEncoding.DecodeString(cur)
	raw[5] ^= 1
	tampered := base64.RawURLEncoding.EncodeToString(raw)
	for name, c := range map[string]string{
		"garbage": "abc", "tampered": tampered, "padded": cur + "=", "truncated": cur[:len(cur)-1],
		"other status": "", "other email": "",
	} {
		q := "/subscribers?limit=2&cursor=" + url.QueryEscape(c)
		switch name {
		case "other status":
			q = "/subscribers?limit=2&status=active&cursor=" + cur
		case "other email":
			q = "/subscribers?limit=2&email=c1@example.com&cursor=" + cur
		}
		if c == "" && !strings.HasPrefix(name, "other") {
			continue
		}
		t.Run(name, func(t *testing.T) { want400(t, e.do("GET", q, nil), msgCursorInvalid) })
	}
	// Another newsletter cannot use it.
	other := newEnvOn(t, e)
	want400(t, other.do("GET", "/subscribers?limit=2&cursor="+cur, nil), msgCursorInvalid)
	// With an email filter, a cursor is bound to it (whatever its case) and pages past it.
	one := e.do("GET", "/subscribers?email=c1@example.com&limit=1", nil).want(t, http.StatusOK, "")
	if one.pagination(t)["next_cursor"] != nil {
		t.Fatalf("a lookup has a next_cursor: %s", one.raw)
	}
}

// TestCursorPagesUseTheListIndex: a cursor page reads the list index from its position
// (no sort, no scan of the rows before it), so it costs what a first page costs.
func TestCursorPagesUseTheListIndex(t *testing.T) {
	e := newEnv(t)
	if testdb.Store() == testdb.SQLite {
		joined := explain(t, e, `SELECT id FROM subscribers
WHERE newsletter_id = ? AND (created_at, id) < (?, ?) ORDER BY created_at DESC, id DESC LIMIT 26`,
			e.nl.String(), "2026-01-01 00:00:00+00:00", "01900000-0000-7000-8000-000000000000")
		if !strings.Contains(joined, "subscribers_list_idx (newsletter_id=? AND") || strings.Contains(joined, "TEMP B-TREE") {
			t.Fatalf("plan:\n%s", joined)
		}
		return
	}
	joined := explain(t, e, `SELECT id FROM subscribers
WHERE newsletter_id = ? AND (created_at, id) < (?::timestamptz, ?::uuid) ORDER BY created_at DESC, id DESC LIMIT 26`,
		e.nl, "2026-01-01T00:00:00Z", "01900000-0000-7000-8000-000000000000")
	if !strings.Contains(joined, "subscribers_list_idx") || !strings.Contains(joined, "Index Cond: ((newsletter_id = ") ||
		!strings.Contains(joined, "ROW(created_at, id) < ROW(") || strings.Contains(joined, "Sort") {
		t.Fatalf("plan:\n%s", joined)
	}
}

// explain returns the plan of query, one line of it a line: SQLite's EXPLAIN QUERY PLAN
// details, or PostgreSQL's EXPLAIN with sequential scans off (a test's tiny table would be
// scanned).
func explain(t *testing.T, e *env, query string, args ...any) string {
	t.Helper()
	ctx := context.Background()
	sqlite := testdb.Store() == testdb.SQLite
	prefix := "EXPLAIN "
	if sqlite {
		prefix = "EXPLAIN QUERY PLAN "
	} else if _, err := e.db.ExecContext(ctx, "SET enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}
	rows, err := e.db.QueryContext(ctx, prefix+query, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan string
	for rows.Next() {
		var line string
		var err error
		if sqlite {
			var id, parent, unused int
			err = rows.Scan(&id, &parent, &unused, &line)
		} else {
			err = rows.Scan(&line)
		}
		if err != nil {
			t.Fatal(err)
		}
		plan += line + "\n"
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return plan
}
