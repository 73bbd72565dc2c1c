package integration

import (
	"fmt"
	"net/http"
	"testing"
	"unicode"
)

// Tests of the input rules version 1.2 tightens (docs/api-contract.md §17), over real HTTP on
// the store TEST_STORE names.

// TestEmptyCursorIsMalformed: cursor= (and a bare cursor) is a malformed cursor, 400, on every
// operation that takes a cursor, whatever else the query holds; no cursor at all is the first
// page.
func TestEmptyCursorIsMalformed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.do("POST", "/subscribers", map[string]any{"email": "c@example.com"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
	for _, path := range []string{"/subscribers", "/subscribers/" + id + "/events"} {
		for _, q := range []string{"?cursor=", "?cursor", "?limit=2&cursor=", "?cursor=&limit=2"} {
			want400(t, e.do("GET", path+q, nil), msgCursorInvalid)
		}
		e.do("GET", path+"?limit=2", nil).want(t, http.StatusOK, "")
	}
}

// TestNameRefusesUnicodeCategories: every character of the Unicode categories Cc, Cf, Zl and
// Zp, taken from Go's Unicode tables, is refused in a name with the message of §3, through the
// API (bulk creates of up to 100 names, each with one such character inside), and nothing is
// created.
func TestNameRefusesUnicodeCategories(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var chars []rune
	for _, tab := range []*unicode.RangeTable{unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp} {
		for _, rg := range tab.R16 {
			for r := rune(rg.Lo); r <= rune(rg.Hi); r += rune(rg.Stride) {
				chars = append(chars, r)
			}
		}
		for _, rg := range tab.R32 {
			for r := rune(rg.Lo); r <= rune(rg.Hi); r += rune(rg.Stride) {
				chars = append(chars, r)
			}
		}
	}
	for start := 0; start < len(chars); start += 100 {
		batch := chars[start:min(start+100, len(chars))]
		items := make([]map[string]any, len(batch))
		for i, r := range batch {
			items[i] = map[string]any{"email": fmt.Sprintf("n%d@example.com", start+i), "name": "Jo" + string(r) + "hn"}
		}
		res := e.do("POST", "/subscribers/bulk", items).want(t, http.StatusUnprocessableEntity, "validation_error")
		got := res.fieldErrors(t)
		for i, r := range batch {
			key := fmt.Sprintf("%d.name", i)
			if want := "The " + key + " field contains invalid characters."; len(got[key]) != 1 || got[key][0] != want {
				t.Errorf("U+%04X: errors[%s] = %q; want [%q]", r, key, got[key], want)
			}
		}
		if len(got) != len(batch) {
			t.Errorf("%d keys in errors for %d invalid names", len(got), len(batch))
		}
	}
	// The ones the issue found accepted, one by one on create and update.
	id := e.do("POST", "/subscribers", map[string]any{"email": "ok@example.com", "name": "Ok"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
	for _, r := range []rune{0x061c, 0xfeff, 0x2028, 0x2029} {
		res := e.do("POST", "/subscribers", map[string]any{"email": "x@example.com", "name": "A" + string(r) + "B"}).want(t, http.StatusUnprocessableEntity, "validation_error")
		if got := res.fieldErrors(t)["name"]; len(got) != 1 || got[0] != "The name field contains invalid characters." {
			t.Errorf("create with U+%04X: errors.name = %q", r, got)
		}
		e.do("PUT", "/subscribers/"+id, map[string]any{"name": "A" + string(r) + "B"}).want(t, http.StatusUnprocessableEntity, "validation_error")
	}
	if n := e.count("SELECT count(*) FROM subscribers"); n != 1 {
		t.Errorf("%d subscribers stored; want only the valid one", n)
	}
}
