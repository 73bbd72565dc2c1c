package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

const msgSuppressedManual = "This address is suppressed (manual) and cannot be subscribed."

// TestSuppressionCreateGetListDelete walks docs/api-contract.md §13's operations: create
// (201, Location; again → 200 with the first entry), get, list with filters and cursor,
// delete (the address can be subscribed again), and the 404s.
func TestSuppressionCreateGetListDelete(t *testing.T) {
	e := newEnv(t)
	r := e.do("POST", "/suppressions", map[string]any{"email": " Ann@Example.com "}).want(t, http.StatusCreated, "")
	d := r.data(t)
	id, _ := d["id"].(string)
	if got := r.header.Get("Location"); got != "/api/v1/suppressions/"+id {
		t.Fatalf("Location = %q, want the entry's path", got)
	}
	if d["email"] != "Ann@Example.com" || d["reason"] != "manual" {
		t.Fatalf("entry %s", r.raw)
	}
	src, _ := d["source"].(map[string]any)
	if src["kind"] != "api" || !strings.HasPrefix(e.key, fmt.Sprint(src["api_key"])) || src["api_key"] == "" {
		t.Fatalf("source %v: want kind api with the key's prefix", src)
	}
	again := e.do("POST", "/suppressions", map[string]any{"email": "ann@example.com", "reason": "complaint"}).want(t, http.StatusOK, "")
	if again.data(t)["id"] != id || again.data(t)["reason"] != "manual" || again.header.Get("Location") != "" {
		t.Fatalf("second create: %s, want the first entry unchanged", again.raw)
	}
	e.do("GET", "/suppressions/"+id, nil).want(t, http.StatusOK, "")
	e.do("POST", "/suppressions", map[string]any{"email": "bob@example.com", "reason": "hard_bounce"}).want(t, http.StatusCreated, "")
	e.do("POST", "/suppressions", map[string]any{"email": "cy@example.com", "reason": "complaint"}).want(t, http.StatusCreated, "")

	list := e.do("GET", "/suppressions?limit=2", nil).want(t, http.StatusOK, "")
	var page struct {
		Data       []map[string]any `json:"data"`
		Pagination struct {
			Limit      int     `json:"limit"`
			NextCursor *string `json:"next_cursor"`
		} `json:"pagination"`
	}
	if err := json.Unmarshal(list.raw, &page); err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 2 || page.Data[0]["email"] != "cy@example.com" || page.Pagination.Limit != 2 || page.Pagination.NextCursor == nil {
		t.Fatalf("first page %s: want the two newest and a cursor", list.raw)
	}
	rest := e.do("GET", "/suppressions?limit=2&cursor="+*page.Pagination.NextCursor, nil).want(t, http.StatusOK, "")
	if err := json.Unmarshal(rest.raw, &page); err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1 || page.Data[0]["id"] != id || page.Pagination.NextCursor != nil {
		t.Fatalf("second page %s: want the oldest and no cursor", rest.raw)
	}
	e.do("GET", "/suppressions?cursor=nonsense", nil).want(t, http.StatusBadRequest, "validation_error")
	e.do("GET", "/suppressions?reason=maybe", nil).want(t, http.StatusBadRequest, "validation_error")
	byReason := e.do("GET", "/suppressions?reason=hard_bounce", nil).want(t, http.StatusOK, "")
	if n := len(byReason.body["data"].([]any)); n != 1 {
		t.Fatalf("reason filter: %d entries, want 1: %s", n, byReason.raw)
	}
	byEmail := e.do("GET", "/suppressions?email=ANN@example.com", nil).want(t, http.StatusOK, "")
	if items := byEmail.body["data"].([]any); len(items) != 1 || items[0].(map[string]any)["id"] != id {
		t.Fatalf("email lookup: %s", byEmail.raw)
	}
	none := e.do("GET", "/suppressions?email=nobody@example.com", nil).want(t, http.StatusOK, "")
	if n := len(none.body["data"].([]any)); n != 0 {
		t.Fatalf("lookup of an address not suppressed: %s", none.raw)
	}

	// Suppressed: no create, no bulk item, no PUT to it.
	r = e.do("POST", "/subscribers", map[string]any{"email": "ann@EXAMPLE.com"}).want(t, http.StatusUnprocessableEntity, "email_suppressed")
	if got := r.fieldErrors(t)["email"]; len(got) != 1 || got[0] != msgSuppressedManual || r.body["message"] != msgSuppressedManual {
		t.Fatalf("422 body %s", r.raw)
	}
	r = e.do("POST", "/subscribers/bulk", []any{map[string]any{"email": "free@example.com"},
		map[string]any{"email": "bob@example.com"}}).want(t, http.StatusUnprocessableEntity, "email_suppressed")
	if got := r.fieldErrors(t)["1.email"]; len(got) != 1 || got[0] != "This address is suppressed (hard_bounce) and cannot be subscribed." {
		t.Fatalf("bulk 422 body %s", r.raw)
	}
	if n := e.count("SELECT count(*) FROM subscribers"); n != 0 {
		t.Fatalf("%d subscribers stored after refused creates", n)
	}

	gone := e.do("DELETE", "/suppressions/"+id, nil).want(t, http.StatusOK, "")
	if gone.data(t)["id"] != id || gone.data(t)["email"] != "Ann@Example.com" {
		t.Fatalf("delete answered %s, want the entry as it was", gone.raw)
	}
	r = e.do("GET", "/suppressions/"+id, nil).want(t, http.StatusNotFound, "not_found")
	if r.body["message"] != "Suppression not found." {
		t.Fatalf("404 body %s", r.raw)
	}
	e.do("DELETE", "/suppressions/"+id, nil).want(t, http.StatusNotFound, "not_found")
	e.do("GET", "/suppressions/not-an-id", nil).want(t, http.StatusNotFound, "not_found")
	e.do("POST", "/subscribers", map[string]any{"email": "ann@example.com"}).want(t, http.StatusCreated, "")
}

// TestSuppressionValidation: a malformed address, an unknown reason or property, an empty or
// oversized bulk, and duplicates in a bulk get their 422; nothing is stored.
func TestSuppressionValidation(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct {
		name string
		body any
		path string
		key  string
	}{
		{"malformed email", map[string]any{"email": "not an address"}, "/suppressions", "email"},
		{"no email", map[string]any{"reason": "manual"}, "/suppressions", "email"},
		{"declined is not for clients", map[string]any{"email": "a@example.com", "reason": "declined"}, "/suppressions", "reason"},
		{"extra property", map[string]any{"email": "a@example.com", "name": "A"}, "/suppressions", "name"},
		{"bulk item", []any{map[string]any{"email": "a@example.com"}, map[string]any{"email": "bad"}}, "/suppressions/bulk", "1.email"},
		{"bulk duplicate", []any{map[string]any{"email": "a@example.com"}, map[string]any{"email": "A@example.com "}}, "/suppressions/bulk", "1.email"},
		{"bulk empty", []any{}, "/suppressions/bulk", "body"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := e.do("POST", c.path, c.body).want(t, http.StatusUnprocessableEntity, "validation_error")
			if _, ok := r.fieldErrors(t)[c.key]; !ok {
				t.Fatalf("errors %s, want the key %s", r.raw, c.key)
			}
		})
	}
	big := make([]any, 1001)
	for i := range big {
		big[i] = map[string]any{"email": fmt.Sprintf("u%d@example.com", i)}
	}
	e.do("POST", "/suppressions/bulk", big).want(t, http.StatusUnprocessableEntity, "validation_error")
	if n := e.count("SELECT count(*) FROM suppressions"); n != 0 {
		t.Fatalf("%d entries stored after refused requests", n)
	}
}

// TestSuppressionBulkAndEffect: a bulk answers the entries in input order (an existing one as
// it is), and unsubscribes the active and pending subscribers with the addresses in the same
// transaction, with their events; an unsubscribed one stays as it is, and a declined address
// that an unsubscribed subscriber holds answers email_suppressed, not email_already_subscribed.
func TestSuppressionBulkAndEffect(t *testing.T) {
	e := newEnv(t)
	active := e.do("POST", "/subscribers", map[string]any{"email": "act@example.com"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
	pending := e.do("POST", "/subscribers", map[string]any{"email": "pen@example.com", "status": "pending"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
	old := e.do("POST", "/suppressions", map[string]any{"email": "old@example.com", "reason": "complaint"}).want(t, http.StatusCreated, "").data(t)
	r := e.do("POST", "/suppressions/bulk", []any{
		map[string]any{"email": "PEN@example.com", "reason": "hard_bounce"},
		map[string]any{"email": "old@example.com"},
		map[string]any{"email": "act@example.com", "reason": "complaint"},
	}).want(t, http.StatusOK, "")
	items := r.data(t)["suppressions"].([]any)
	if len(items) != 3 || items[0].(map[string]any)["reason"] != "hard_bounce" ||
		items[1].(map[string]any)["id"] != old["id"] || items[1].(map[string]any)["reason"] != "complaint" ||
		items[2].(map[string]any)["email"] != "act@example.com" {
		t.Fatalf("bulk answered %s", r.raw)
	}
	for _, id := range []string{active, pending} {
		if got := e.do("GET", "/subscribers/"+id, nil).want(t, http.StatusOK, "").data(t)["status"]; got != "unsubscribed" {
			t.Fatalf("subscriber %s is %v after its address was suppressed", id, got)
		}
	}
	if n := e.count("SELECT count(*) FROM email_outbox WHERE state = 'pending'"); n != 0 {
		t.Fatalf("%d confirmation emails still pending after suppression", n)
	}
	ev := e.do("GET", "/subscribers/"+pending+"/events", nil).want(t, http.StatusOK, "")
	if !strings.Contains(string(ev.raw), `"source":{"kind":"suppression","reason":"hard_bounce","api_key":`) {
		t.Fatalf("events %s: want the unsubscribe with the suppression's source", ev.raw)
	}
	// The unsubscribed subscriber still holds the address: suppressed goes first.
	e.do("POST", "/subscribers", map[string]any{"email": "act@example.com"}).want(t, http.StatusUnprocessableEntity, "email_suppressed")
	e.do("PUT", "/subscribers/"+active, map[string]any{"status": "active"}).want(t, http.StatusUnprocessableEntity, "email_suppressed")
	e.do("PUT", "/subscribers/"+active, map[string]any{"status": "pending"}).want(t, http.StatusUnprocessableEntity, "email_suppressed")
	e.do("PUT", "/subscribers/"+active, map[string]any{"name": "Still Here"}).want(t, http.StatusOK, "")
	free := e.do("POST", "/subscribers", map[string]any{"email": "free@example.com"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
	r = e.do("PUT", "/subscribers/"+free, map[string]any{"email": "old@example.com"}).want(t, http.StatusUnprocessableEntity, "email_suppressed")
	if got := r.fieldErrors(t)["email"]; len(got) != 1 || got[0] != "This address is suppressed (complaint) and cannot be subscribed." {
		t.Fatalf("PUT email 422 %s", r.raw)
	}
	// Taken and suppressed at once: suppressed.
	e.do("PUT", "/subscribers/"+free, map[string]any{"email": "pen@example.com"}).want(t, http.StatusUnprocessableEntity, "email_suppressed")
	// Deleting the entry lets the address be subscribed again, but leaves the unsubscribed one.
	e.do("DELETE", "/suppressions/"+old["id"].(string), nil).want(t, http.StatusOK, "")
	e.do("PUT", "/subscribers/"+free, map[string]any{"email": "old@example.com"}).want(t, http.StatusOK, "")
}
