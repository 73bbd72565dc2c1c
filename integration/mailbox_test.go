package integration

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/importer"
	"github.com/subscriberd/subscriberd/repo"
)

// Tests of docs/api-contract.md §18: one address per mailbox, whatever its spelling.

// spellings are pairs of spellings of one mailbox: the first is stored, the second comes
// later (full-width domain, NFD against NFC, the A-label against the U-label both ways).
var spellings = []struct{ name, first, second string }{
	{"full-width domain", "p@example.com", "p@ｅｘａｍｐｌｅ.ｃｏｍ"},
	{"full-width stored first", "p@ｅｘａｍｐｌｅ.ｃｏｍ", "P@Example.com"},
	{"NFD then NFC", "p@bu\u0308cher.example", "p@bücher.example"},
	{"NFC then NFD", "p@bücher.example", "p@bu\u0308cher.example"},
	{"A-label then U-label", "p@xn--bcher-kva.example", "p@bücher.example"},
	{"U-label then A-label", "p@bücher.example", "p@XN--BCHER-KVA.example"},
	{"NFD local part", "zoe\u0308@example.com", "Zoë@example.com"},
}

// otherNewsletter is e acting with the key of a new newsletter of its own.
func (e *env) otherNewsletter(t *testing.T) *env {
	t.Helper()
	o := *e
	o.t = t
	o.nl, o.key = e.newKey(t, true)
	return &o
}

// importOne imports the one address addr and returns the import's counts.
func (e *env) importOne(t *testing.T, addr string) map[string]any {
	t.Helper()
	loc := e.upload("application/x-ndjson", `{"email":`+jsonString(addr)+"}\n", "").want(t, http.StatusAccepted, "").header.Get("Location")
	return e.waitImport(t, loc, "completed")
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestMailboxSpellingsAreOneAddress: a subscriber stored under one spelling is found, and
// refused as a duplicate, under every other spelling of its mailbox: create, bulk, upsert,
// PUT email, import and lookup.
func TestMailboxSpellingsAreOneAddress(t *testing.T) {
	t.Parallel()
	base := newEnv(t)
	base.startImporter(t, importer.Config{})
	for _, sp := range spellings {
		t.Run(sp.name, func(t *testing.T) {
			e := base.otherNewsletter(t)
			id := e.do("POST", "/subscribers", map[string]any{"email": sp.first}).want(t, http.StatusCreated, "").data(t)["id"].(string)

			e.do("POST", "/subscribers", map[string]any{"email": sp.second}).want(t, http.StatusUnprocessableEntity, api.CodeEmailTaken)
			r := e.do("POST", "/subscribers/bulk", []any{map[string]any{"email": "fresh@example.com"}, map[string]any{"email": sp.second}}).
				want(t, http.StatusUnprocessableEntity, "validation_error")
			if got := r.fieldErrors(t)["1.email"]; len(got) != 1 || got[0] != "Email is already subscribed to this newsletter." {
				t.Errorf("bulk: 1.email = %v; want the address taken", got)
			}
			// In one request: the second item repeats the first's address.
			f := base.otherNewsletter(t)
			r = f.do("POST", "/subscribers/bulk", []any{map[string]any{"email": sp.first}, map[string]any{"email": sp.second}}).
				want(t, http.StatusUnprocessableEntity, "validation_error")
			if got := r.fieldErrors(t)["1.email"]; len(got) != 1 || got[0] != "The 1.email field has a duplicate value." {
				t.Errorf("bulk of both spellings: 1.email = %v; want a duplicate value", got)
			}
			// In one import file: the second row is an address earlier in the file.
			loc := f.upload("application/x-ndjson", `{"email":`+jsonString(sp.first)+"}\n"+`{"email":`+jsonString(sp.second)+"}\n", "").
				want(t, http.StatusAccepted, "").header.Get("Location")
			wantCounts(t, f.waitImport(t, loc, "completed"), map[string]float64{"rows": 2, "created": 1, "existing": 1})

			found := e.do("GET", "/subscribers?email="+urlQuery(sp.second), nil).want(t, http.StatusOK, "").body["data"].([]any)
			if len(found) != 1 || found[0].(map[string]any)["id"] != id || found[0].(map[string]any)["email"] != strings.TrimSpace(sp.first) {
				t.Errorf("lookup of %q = %v; want the subscriber %s as stored", sp.second, found, id)
			}
			d := e.do("PUT", upsertPath(sp.second), map[string]any{"name": "Same Person"}).want(t, http.StatusOK, "").data(t)
			if d["id"] != id || d["email"] != sp.first {
				t.Errorf("upsert of %q = %v; want the existing subscriber %s updated", sp.second, d, id)
			}
			other := e.do("POST", "/subscribers", map[string]any{"email": "other@example.com"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
			e.do("PUT", "/subscribers/"+other, map[string]any{"email": sp.second}).want(t, http.StatusUnprocessableEntity, api.CodeEmailTaken)
			// The subscriber itself may change its spelling: the same address.
			d = e.do("PUT", "/subscribers/"+id, map[string]any{"email": sp.second}).want(t, http.StatusOK, "").data(t)
			if d["email"] != sp.second {
				t.Errorf("PUT of the subscriber's own address in another spelling = %v", d)
			}
			imp := e.importOne(t, sp.first)
			wantCounts(t, imp, map[string]float64{"rows": 1, "created": 0, "existing": 1})
			if n := e.count("SELECT count(*) FROM subscribers WHERE newsletter_id = ?", e.nl); n != 2 {
				t.Errorf("subscribers = %d; want 2", n)
			}
		})
	}
}

func urlQuery(s string) string {
	return strings.NewReplacer("%", "%25", "+", "%2B", "&", "%26", "#", "%23", " ", "%20").Replace(s)
}

// TestMailboxSuppressedUnderEverySpelling: an address suppressed under one spelling cannot be
// subscribed under another (create, bulk item, upsert, PUT email, PUT status, import), and the
// suppression list finds its entry under every spelling.
func TestMailboxSuppressedUnderEverySpelling(t *testing.T) {
	t.Parallel()
	base := newEnv(t)
	base.startImporter(t, importer.Config{})
	msg := "This address is suppressed (hard_bounce) and cannot be subscribed."
	for _, sp := range spellings {
		t.Run(sp.name, func(t *testing.T) {
			e := base.otherNewsletter(t)
			held := e.do("POST", "/subscribers", map[string]any{"email": sp.first, "status": "pending"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
			sup := e.do("POST", "/suppressions", map[string]any{"email": sp.first, "reason": "hard_bounce"}).want(t, http.StatusCreated, "").data(t)
			if got := e.do("GET", "/subscribers/"+held, nil).want(t, http.StatusOK, "").data(t)["status"]; got != "unsubscribed" {
				t.Errorf("subscriber of the suppressed address is %v; want unsubscribed", got)
			}
			again := e.do("POST", "/suppressions", map[string]any{"email": sp.second}).want(t, http.StatusOK, "").data(t)
			if again["id"] != sup["id"] || again["reason"] != "hard_bounce" {
				t.Errorf("suppressing %q again = %v; want the entry %v", sp.second, again, sup["id"])
			}
			list := e.do("GET", "/suppressions?email="+urlQuery(sp.second), nil).want(t, http.StatusOK, "").body["data"].([]any)
			if len(list) != 1 || list[0].(map[string]any)["id"] != sup["id"] {
				t.Errorf("suppression lookup of %q = %v; want the entry %v", sp.second, list, sup["id"])
			}

			wantSuppressed := func(what string, r response, key string) {
				t.Helper()
				r.want(t, http.StatusUnprocessableEntity, api.CodeEmailSuppressed)
				if got := r.fieldErrors(t)[key]; len(got) != 1 || got[0] != msg {
					t.Errorf("%s: %s = %v; want %q", what, key, got, msg)
				}
			}
			f := base.otherNewsletter(t)
			f.do("POST", "/suppressions", map[string]any{"email": sp.first, "reason": "hard_bounce"}).want(t, http.StatusCreated, "")
			wantSuppressed("create", f.do("POST", "/subscribers", map[string]any{"email": sp.second}), "email")
			wantSuppressed("bulk", f.do("POST", "/subscribers/bulk", []any{map[string]any{"email": "ok@example.com"}, map[string]any{"email": sp.second}}), "1.email")
			wantSuppressed("upsert", f.do("PUT", upsertPath(sp.second), map[string]any{"status": "pending"}), "email")
			other := f.do("POST", "/subscribers", map[string]any{"email": "other@example.com"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
			wantSuppressed("PUT email", f.do("PUT", "/subscribers/"+other, map[string]any{"email": sp.second}), "email")
			wantSuppressed("PUT status", e.do("PUT", "/subscribers/"+held, map[string]any{"status": "active"}), "email")
			imp := f.importOne(t, sp.second)
			wantCounts(t, imp, map[string]float64{"rows": 1, "created": 0, "suppressed": 1})
			if n := f.count("SELECT count(*) FROM subscribers WHERE newsletter_id = ?", f.nl); n != 1 {
				t.Errorf("subscribers = %d; want only other@example.com", n)
			}
		})
	}
}

// TestMailboxErasedThenFullWidth: an erased address cannot come back in its full-width form.
func TestMailboxErasedThenFullWidth(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.do("POST", "/subscribers", map[string]any{"email": "gone@example.com"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
	e.do("POST", "/subscribers/"+id+"/erase", nil).want(t, http.StatusOK, "")
	for _, addr := range []string{"gone@ｅｘａｍｐｌｅ.ｃｏｍ", "GONE@EXAMPLE.com"} {
		r := e.do("POST", "/subscribers", map[string]any{"email": addr}).want(t, http.StatusUnprocessableEntity, api.CodeEmailSuppressed)
		if got := r.fieldErrors(t)["email"]; len(got) != 1 || !strings.Contains(got[0], "(erased)") {
			t.Errorf("%s: %v; want suppressed (erased)", addr, got)
		}
		e.do("PUT", upsertPath(addr), map[string]any{}).want(t, http.StatusUnprocessableEntity, api.CodeEmailSuppressed)
		list := e.do("GET", "/suppressions?email="+urlQuery(addr), nil).want(t, http.StatusOK, "").body["data"].([]any)
		if len(list) != 1 || list[0].(map[string]any)["reason"] != "erased" {
			t.Errorf("suppression lookup of %s = %v; want the erased entry", addr, list)
		}
	}
}

// TestMailboxDeclinedThenFullWidthUpsert: a person who declined by RFC 8058 one-click cannot
// be subscribed again through the upsert with a full-width spelling, and is not emailed.
func TestMailboxDeclinedThenFullWidthUpsert(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	id, link := m.pendingWithLink("dee@example.com")
	if code, _, body := m.pagePost(link+"/decline", "List-Unsubscribe=One-Click"); code != http.StatusOK {
		t.Fatalf("one-click decline: %d\n%s", code, body)
	}
	for _, body := range []map[string]any{{"status": "pending"}, {"status": "active"}} {
		m.do("PUT", upsertPath("dee@ｅｘａｍｐｌｅ.ｃｏｍ"), body).want(t, http.StatusUnprocessableEntity, api.CodeEmailSuppressed)
	}
	// Without a status the upsert finds the subscriber, and leaves it unsubscribed.
	d := m.do("PUT", upsertPath("dee@ｅｘａｍｐｌｅ.ｃｏｍ"), map[string]any{}).want(t, http.StatusOK, "").data(t)
	if d["id"] != id || d["status"] != "unsubscribed" {
		t.Errorf("upsert without fields = %v; want %s, unsubscribed", d, id)
	}
	m.do("POST", "/subscribers", map[string]any{"email": "DEE@ｅｘａｍｐｌｅ.ｃｏｍ", "status": "pending"}).
		want(t, http.StatusUnprocessableEntity, api.CodeEmailSuppressed)
	m.drain()
	if n := len(m.smtp.Messages()); n != 1 {
		t.Errorf("emails sent = %d (%v); want only the first confirmation", n, links(m.smtp.Messages()))
	}
}

// TestMailboxNoEmailReachesASuppressedMailbox: at the SMTP level, no confirmation reaches a
// suppressed mailbox under any spelling: neither a pending subscriber that the suppression
// unsubscribes, nor one whose suppression arrived behind the API's back (the worker's last
// check), nor a new one; an accepted address goes out with its A-label domain.
func TestMailboxNoEmailReachesASuppressedMailbox(t *testing.T) {
	t.Parallel()
	m := newMailEnv(t)
	// Pending, queued, then suppressed in another spelling.
	m.create("p@xn--bcher-kva.example", "pending")
	m.do("POST", "/suppressions", map[string]any{"email": "p@bu\u0308cher.example"}).want(t, http.StatusCreated, "")
	for _, sp := range []string{"p@bücher.example", "P@BÜCHER.example", "p@XN--BCHER-KVA.EXAMPLE"} {
		m.do("POST", "/subscribers", map[string]any{"email": sp, "status": "pending"}).want(t, http.StatusUnprocessableEntity, api.CodeEmailSuppressed)
	}
	// Pending, queued, and an entry of its mailbox in another spelling written straight to
	// the list (as a race with the API, or another instance, could leave it).
	m.create("q@ｅｘａｍｐｌｅ.ｃｏｍ", "pending")
	h := sha256.Sum256([]byte("q@example.com"))
	if _, err := m.db.NewRaw(`INSERT INTO suppressions (id, newsletter_id, email, email_key, email_hash, reason, source, created_at)
VALUES (?, ?, ?, ?, ?, 'manual', '{"kind":"api","api_key":"sk_test"}', ?)`,
		uuid.Must(uuid.NewV7()), m.nl, "q@example.com", "q@example.com", h[:], time.Now().UTC()).Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Accepted: its envelope names the A-label.
	m.create("r@ｅｘａｍｐｌｅ.ｃｏｍ", "pending")
	m.create("s@bu\u0308cher.example", "pending")
	m.drain()
	var got []string
	for _, msg := range m.smtp.Messages() {
		got = append(got, msg.To)
		if key := strings.ToLower(msg.To); strings.HasPrefix(key, "p@") || strings.HasPrefix(key, "q@") {
			t.Errorf("an email reached the suppressed mailbox %s", msg.To)
		}
	}
	if len(got) != 2 || !containsAll(got, "r@example.com", "s@xn--bcher-kva.example") {
		t.Errorf("recipients = %v; want r@example.com and s@xn--bcher-kva.example", got)
	}
}

func containsAll(list []string, want ...string) bool {
	for _, w := range want {
		found := false
		for _, x := range list {
			found = found || x == w
		}
		if !found {
			return false
		}
	}
	return true
}

// row12 is a subscriber as 1.2 stored it: the email as given (trimmed), the key lower-cased.
type row12 struct {
	email, status string
	age           time.Duration // how long ago it was created
}

// insert12 writes r into newsletter nl as 1.2 did and returns its id.
func (e *env) insert12(t *testing.T, nl uuid.UUID, r row12) uuid.UUID {
	t.Helper()
	id := uuid.Must(uuid.NewV7())
	at := time.Now().UTC().Add(-r.age).Truncate(time.Microsecond)
	if _, err := e.db.NewRaw(`INSERT INTO subscribers (id, newsletter_id, email, email_key, first_name, last_name, status, created_at, updated_at)
VALUES (?, ?, ?, ?, '', '', ?, ?, ?)`, id, nl, r.email, strings.ToLower(r.email), r.status, at, at).Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	return id
}

// insert12Suppression writes an entry as 1.2 did: the hash of the lower-cased address, and for
// an erased one nothing else.
func (e *env) insert12Suppression(t *testing.T, nl uuid.UUID, email, reason string, age time.Duration) uuid.UUID {
	t.Helper()
	id := uuid.Must(uuid.NewV7())
	h := sha256.Sum256([]byte(strings.ToLower(email)))
	var addr, key any
	if reason != "erased" {
		addr, key = email, strings.ToLower(email)
	}
	src := `{"kind":"erase"}`
	if reason != "erased" {
		src = `{"kind":"api","api_key":"sk_old"}`
	}
	if _, err := e.db.NewRaw(`INSERT INTO suppressions (id, newsletter_id, email, email_key, email_hash, reason, source, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, id, nl, addr, key, h[:], reason, src, time.Now().UTC().Add(-age).Truncate(time.Microsecond)).
		Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestMailboxUpgradeRekeys is the migration of docs/api-contract.md §18 on rows written as
// 1.2 wrote them: keys recomputed; of two subscribers of a newsletter now holding one address
// the older keeps it and the newer is unsubscribed (event, webhook delivery, confirmation
// cancelled) with its email as given; the status totals stay exact; suppressions and erased
// entries made before keep matching; running it again changes nothing; rows a 1.2 instance
// writes during the roll-out are re-keyed by the next run.
func TestMailboxUpgradeRekeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.do("POST", "/webhooks", map[string]any{"url": "http://127.0.0.1:9/hook"}).want(t, http.StatusCreated, "")
	h := time.Hour
	// Full-width against plain: the plain one is older.
	a1 := e.insert12(t, e.nl, row12{"p@example.com", "active", 10 * h})
	a2 := e.insert12(t, e.nl, row12{"p@ｅｘａｍｐｌｅ.ｃｏｍ", "pending", 9 * h})
	mailID := uuid.Must(uuid.NewV7())
	now := time.Now().UTC()
	if _, err := e.db.NewRaw(`INSERT INTO email_outbox (id, newsletter_id, subscriber_id, kind, state, attempts, next_attempt_at, last_error, traceparent, created_at, updated_at)
VALUES (?, ?, ?, 'confirmation', 'pending', 0, ?, '', '', ?, ?)`, mailID, e.nl, a2, now, now, now).Exec(ctx); err != nil {
		t.Fatal(err)
	}
	// NFD (older) against NFC (newer, holding the new key already).
	b1 := e.insert12(t, e.nl, row12{"q@bu\u0308cher.example", "active", 8 * h})
	b2 := e.insert12(t, e.nl, row12{"q@bücher.example", "active", 7 * h})
	// A-label (newer) against upper-case U-label (older).
	c1 := e.insert12(t, e.nl, row12{"r@xn--bcher-kva.example", "active", 5 * h})
	c2 := e.insert12(t, e.nl, row12{"R@BÜCHER.example", "unsubscribed", 6 * h})
	// Three spellings: the oldest keeps the address.
	d1 := e.insert12(t, e.nl, row12{"t@example.com", "active", 1 * h})
	d2 := e.insert12(t, e.nl, row12{"t@ｅxample.com", "pending", 4 * h})
	d3 := e.insert12(t, e.nl, row12{"t@ｅｘample.com", "unsubscribed", 3 * h})
	// Alone in its spelling; and the same address in another newsletter, no collision.
	solo := e.insert12(t, e.nl, row12{"solo@ｅｘａｍｐｌｅ.ｃｏｍ", "active", 2 * h})
	other := e.otherNewsletter(t)
	o1 := e.insert12(t, other.nl, row12{"p@ｅｘａｍｐｌｅ.ｃｏｍ", "active", 1 * h})
	// Suppressions: a full-width manual entry, two entries of one address (the full-width
	// one older), erased tombstones of a full-width and of a U-label address.
	e.insert12Suppression(t, e.nl, "s@ｅｘａｍｐｌｅ.ｃｏｍ", "manual", 5*h)
	mOld := e.insert12Suppression(t, e.nl, "m@ｅｘａｍｐｌｅ.ｃｏｍ", "manual", 4*h)
	e.insert12Suppression(t, e.nl, "m@example.com", "complaint", 3*h)
	e.insert12Suppression(t, e.nl, "gone@ｅｘａｍｐｌｅ.ｃｏｍ", "erased", 2*h)
	e.insert12Suppression(t, e.nl, "er@bücher.example", "erased", 2*h)
	// An older entry in another spelling of an address erased later: what stays keeps no address.
	e.insert12Suppression(t, e.nl, "e2@ｅｘａｍｐｌｅ.ｃｏｍ", "manual", 5*h)
	e.insert12Suppression(t, e.nl, "e2@example.com", "erased", 1*h)

	if _, err := repo.Migrate(ctx, e.db); err != nil {
		t.Fatal(err)
	}

	status := func(id uuid.UUID) string {
		t.Helper()
		var s string
		if err := e.db.NewRaw("SELECT status FROM subscribers WHERE id = ?", id).Scan(ctx, &s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	wantKept := map[uuid.UUID]string{a1: "p@example.com", b1: "q@bücher.example", c2: "r@bücher.example", d2: "t@example.com", solo: "solo@example.com", o1: "p@example.com"}
	for id, key := range wantKept {
		var got string
		if err := e.db.NewRaw("SELECT email_key FROM subscribers WHERE id = ?", id).Scan(ctx, &got); err != nil {
			t.Fatal(err)
		}
		if got != key {
			t.Errorf("subscriber %s: key %q; want %q", id, got, key)
		}
	}
	if got := status(c2); got != "unsubscribed" {
		t.Errorf("the older unsubscribed subscriber is %s; want it left unsubscribed", got)
	}
	dups := []struct {
		id, kept     uuid.UUID
		email, was   string
		wantsEvent   bool
		pendingEmail bool
	}{
		{a2, a1, "p@ｅｘａｍｐｌｅ.ｃｏｍ", "pending", true, true},
		{b2, b1, "q@bücher.example", "active", true, false},
		{c1, c2, "r@xn--bcher-kva.example", "active", true, false},
		{d1, d2, "t@example.com", "active", true, false},
		{d3, d2, "t@ｅｘample.com", "unsubscribed", false, false},
	}
	for _, d := range dups {
		sub := e.do("GET", "/subscribers/"+d.id.String(), nil).want(t, http.StatusOK, "").data(t)
		if sub["status"] != "unsubscribed" || sub["email"] != d.email {
			t.Errorf("duplicate %s = %v; want unsubscribed with its email %q", d.id, sub, d.email)
		}
		evs := e.do("GET", "/subscribers/"+d.id.String()+"/events", nil).want(t, http.StatusOK, "").body["data"].([]any)
		if !d.wantsEvent {
			if len(evs) != 0 {
				t.Errorf("duplicate %s, unsubscribed already: events %v; want none", d.id, evs)
			}
			continue
		}
		if len(evs) != 1 {
			t.Fatalf("duplicate %s: events %v; want one", d.id, evs)
		}
		ev := evs[0].(map[string]any)
		data := ev["data"].(map[string]any)
		src := data["source"].(map[string]any)
		if ev["type"] != "subscriber.unsubscribed" || src["kind"] != "duplicate_address" || src["kept"] != d.kept.String() ||
			data["previous"].(map[string]any)["status"] != d.was || data["subscriber"].(map[string]any)["email"] != d.email {
			t.Errorf("duplicate %s: event %v; want subscriber.unsubscribed from %s, source duplicate_address kept %s", d.id, ev, d.was, d.kept)
		}
		if n := e.count(`SELECT count(*) FROM webhook_deliveries w JOIN subscriber_events ev ON ev.id = w.event_id
WHERE ev.subscriber_id = ?`, d.id); n != 1 {
			t.Errorf("duplicate %s: webhook deliveries = %d; want 1", d.id, n)
		}
	}
	if n := e.count("SELECT count(*) FROM email_outbox WHERE id = ? AND state = 'cancelled'", mailID); n != 1 {
		t.Errorf("the newer duplicate's unsent confirmation is not cancelled")
	}
	// Status totals are exact: the list's totals against the rows.
	for _, st := range []string{"active", "pending", "unsubscribed"} {
		got := e.do("GET", "/subscribers?status="+st, nil).want(t, http.StatusOK, "").body["pagination"].(map[string]any)["total"]
		if want := e.count("SELECT count(*) FROM subscribers WHERE newsletter_id = ? AND status = ?", e.nl, st); got != float64(want) {
			t.Errorf("total of %s = %v; want %d", st, got, want)
		}
	}
	// The address is the older subscriber's, under any spelling; the newer cannot take it back.
	for _, sp := range []string{"p@ｅｘａｍｐｌｅ.ｃｏｍ", "p@example.com"} {
		found := e.do("GET", "/subscribers?email="+urlQuery(sp), nil).want(t, http.StatusOK, "").body["data"].([]any)
		if len(found) != 1 || found[0].(map[string]any)["id"] != a1.String() {
			t.Errorf("lookup of %s = %v; want %s", sp, found, a1)
		}
	}
	e.do("PUT", "/subscribers/"+a2.String(), map[string]any{"status": "active"}).want(t, http.StatusUnprocessableEntity, api.CodeEmailTaken)
	e.do("POST", "/subscribers", map[string]any{"email": "q@bu\u0308cher.example"}).want(t, http.StatusUnprocessableEntity, api.CodeEmailTaken)

	// Suppressions made before 1.3 match every spelling of their address, erased ones every
	// address they matched before.
	for addr, reason := range map[string]string{
		"s@example.com": "manual", "s@ｅｘａｍｐｌｅ.ｃｏｍ": "manual", "m@EXAMPLE.com": "manual",
		"gone@ｅｘａｍｐｌｅ.ｃｏｍ": "erased", "GONE@ｅｘａｍｐｌｅ.ｃｏｍ": "erased",
		"er@bücher.example": "erased", "er@xn--bcher-kva.example": "erased", "er@bu\u0308cher.example": "erased",
	} {
		r := e.do("POST", "/subscribers", map[string]any{"email": addr}).want(t, http.StatusUnprocessableEntity, api.CodeEmailSuppressed)
		if got := r.fieldErrors(t)["email"]; len(got) != 1 || !strings.Contains(got[0], "("+reason+")") {
			t.Errorf("%s: %v; want suppressed (%s)", addr, got, reason)
		}
	}
	if n := e.count("SELECT count(*) FROM suppressions WHERE email LIKE 'e2@%'"); n != 0 {
		t.Errorf("an erased address is still on the list in another spelling")
	}
	list := e.do("GET", "/suppressions?email=e2@ｅｘａｍｐｌｅ.ｃｏｍ", nil).want(t, http.StatusOK, "").body["data"].([]any)
	if len(list) != 1 || list[0].(map[string]any)["reason"] != "erased" || list[0].(map[string]any)["email"] != nil {
		t.Errorf("entries of e2@example.com = %v; want one erased entry", list)
	}
	list = e.do("GET", "/suppressions?email=m@example.com", nil).want(t, http.StatusOK, "").body["data"].([]any)
	if len(list) != 1 || list[0].(map[string]any)["id"] != mOld.String() {
		t.Errorf("entries of m@example.com = %v; want the older one only", list)
	}

	// Again: nothing changes.
	counts := func() [3]int {
		return [3]int{e.count("SELECT count(*) FROM subscriber_events"), e.count("SELECT count(*) FROM suppressions"),
			e.count("SELECT count(*) FROM subscribers WHERE status = 'unsubscribed'")}
	}
	before := counts()
	res, err := repo.Rekey(ctx, e.db)
	if err != nil {
		t.Fatal(err)
	}
	if res != (repo.RekeyResult{}) || counts() != before {
		t.Errorf("second run: %+v, counts %v -> %v; want nothing changed", res, before, counts())
	}

	// A 1.2 instance still serving writes a full-width duplicate and an erased tombstone;
	// the next run (`subscriberd migrate` after it stopped) re-keys them.
	late := e.insert12(t, e.nl, row12{"solo@ＥＸＡＭＰＬＥ.com", "active", 0})
	if _, err := repo.Migrate(ctx, e.db); err != nil {
		t.Fatal(err)
	}
	if got := status(late); got != "unsubscribed" {
		t.Errorf("a duplicate written by a 1.2 instance during the roll-out is %s after the next run; want unsubscribed", got)
	}
}

// TestMailboxRekeyWhileServing runs the re-key while the API creates the plain spelling of
// each full-width address a 1.2 instance stored: whichever comes first, each mailbox ends with
// exactly one holder of its key, the older (1.2) subscriber, active; a create that won the race
// is unsubscribed as a duplicate, one that lost it got 422 email_already_subscribed.
func TestMailboxRekeyWhileServing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const n = 30
	old := make([]uuid.UUID, n)
	for i := range n {
		old[i] = e.insert12(t, e.nl, row12{fmt.Sprintf("c%d@ｅｘａｍｐｌｅ.ｃｏｍ", i), "active", time.Hour})
	}
	var wg sync.WaitGroup
	var won atomic.Int32
	errs := make(chan error, n+1)
	wg.Go(func() {
		if _, err := repo.Rekey(ctx, e.db); err != nil {
			errs <- err
		}
	})
	for i := range n {
		wg.Go(func() {
			code, body, err := e.sendWith("POST", "/subscribers", map[string]any{"email": fmt.Sprintf("c%d@example.com", i)})
			if err != nil || code != http.StatusCreated && code != http.StatusUnprocessableEntity {
				errs <- fmt.Errorf("create c%d: %d %s %v", i, code, body, err)
			}
			if code == http.StatusCreated {
				won.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d of %d creates came before the re-key of their address", won.Load(), n)
	for i := range n {
		key := fmt.Sprintf("c%d@example.com", i)
		var holder []uuid.UUID
		if err := e.db.NewRaw("SELECT id FROM subscribers WHERE newsletter_id = ? AND email_key = ?", e.nl, key).Scan(ctx, &holder); err != nil {
			t.Fatal(err)
		}
		if len(holder) != 1 || holder[0] != old[i] {
			t.Errorf("%s is held by %v; want the older subscriber %s", key, holder, old[i])
		}
		if n := e.count("SELECT count(*) FROM subscribers WHERE newsletter_id = ? AND email = ? AND status <> 'unsubscribed'", e.nl, key); n != 0 {
			t.Errorf("the plain spelling %s is subscribed beside the older full-width one", key)
		}
	}
}
