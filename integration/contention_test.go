package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/driver/pgdriver"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// send is env.do for goroutines: it reports instead of failing the test.
func (e *env) send(method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		js, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(js)
	}
	req, err := http.NewRequest(method, e.base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+e.key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	return res.StatusCode, raw, err
}

// statusCounter tallies the statuses of concurrent requests and records every 5xx.
type statusCounter struct {
	mu     sync.Mutex
	counts map[int]int
	bad    []string
}

func (c *statusCounter) add(status int, raw []byte, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil {
		c.counts = map[int]int{}
	}
	if err != nil {
		c.bad = append(c.bad, err.Error())
		return
	}
	c.counts[status]++
	if status >= 500 {
		c.bad = append(c.bad, fmt.Sprintf("%d %s", status, raw))
	}
}

func (c *statusCounter) check(t *testing.T, allowed ...int) {
	t.Helper()
	for _, b := range c.bad {
		t.Errorf("5xx or transport error: %s", b)
	}
	for s, n := range c.counts {
		ok := false
		for _, a := range allowed {
			ok = ok || s == a
		}
		if !ok {
			t.Errorf("%d × status %d, want only %v", n, s, allowed)
		}
	}
}

// conflictHook counts the statements that failed on a unique violation or a deadlock, as the
// database server would have logged them (with the statement and its values).
type conflictHook struct{ unique, deadlock atomic.Int64 }

func (h *conflictHook) BeforeQuery(ctx context.Context, _ *bun.QueryEvent) context.Context {
	return ctx
}

func (h *conflictHook) AfterQuery(_ context.Context, ev *bun.QueryEvent) {
	if ev.Err == nil {
		return
	}
	var pgErr pgdriver.Error
	if errors.As(ev.Err, &pgErr) {
		switch pgErr.Field('C') {
		case "23505":
			h.unique.Add(1)
		case "40P01", "40001":
			h.deadlock.Add(1)
		}
	}
	var se *sqlite.Error
	if errors.As(ev.Err, &se) && se.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE {
		h.unique.Add(1)
	}
}

func withHook(h bun.QueryHook) func(*envOptions) {
	return func(o *envOptions) { o.queryHook = h }
}

func bulkOf(emails []string) []any {
	items := make([]any, len(emails))
	for i, e := range emails {
		items[i] = map[string]any{"email": e, "status": "pending"}
	}
	return items
}

// Two bulk creates of the same 100 new emails in opposite orders, round after round: one is
// stored (201), the other finds every email taken (422); never a 5xx (it was 500, a deadlock,
// in 2 of 10 rounds). No statement meets a unique violation on the way (docs/api-contract.md
// §5: a duplicate is the client's 422, and the database server must not log it).
func TestContentionOppositeOrderBulks(t *testing.T) {
	t.Parallel()
	hook := &conflictHook{}
	e := newEnv(t, withHook(hook))
	for round := range 10 {
		emails := make([]string, 100)
		for i := range emails {
			emails[i] = fmt.Sprintf("r%d-n%03d@x.io", round, i)
		}
		reversed := make([]string, len(emails))
		for i, m := range emails {
			reversed[len(emails)-1-i] = m
		}
		var c statusCounter
		var wg sync.WaitGroup
		for _, list := range [][]string{emails, reversed} {
			wg.Go(func() { c.add(e.send("POST", "/subscribers/bulk", bulkOf(list))) })
		}
		wg.Wait()
		c.check(t, http.StatusCreated, http.StatusUnprocessableEntity)
		if c.counts[http.StatusCreated] != 1 {
			t.Errorf("round %d: statuses %v, want one 201 and one 422", round, c.counts)
		}
	}
	if n := e.count("SELECT count(*) FROM subscribers"); n != 1000 {
		t.Errorf("subscribers = %d, want 1000", n)
	}
	if n := e.count("SELECT count(*) FROM email_outbox"); n != 1000 {
		t.Errorf("queued emails = %d, want 1000 (one per stored pending subscriber)", n)
	}
	if n := hook.unique.Load(); n != 0 {
		t.Errorf("%d statements failed on a unique violation, want 0", n)
	}
}

// Eight bulks of 100 emails each, overlapping in shuffled order, round after round: each is
// stored whole or answered 422; never a 5xx (up to 4 × 500 a round before).
func TestContentionOverlappingBulks(t *testing.T) {
	t.Parallel()
	hook := &conflictHook{}
	e := newEnv(t, withHook(hook))
	for round := range 5 {
		var c statusCounter
		var wg sync.WaitGroup
		for b := range 8 {
			emails := make([]string, 100)
			for i := range emails {
				emails[i] = fmt.Sprintf("r%d-n%03d@x.io", round, b*30+i) // each shares 70 with the next
			}
			rand.Shuffle(len(emails), func(i, j int) { emails[i], emails[j] = emails[j], emails[i] })
			wg.Go(func() { c.add(e.send("POST", "/subscribers/bulk", bulkOf(emails))) })
		}
		wg.Wait()
		c.check(t, http.StatusCreated, http.StatusUnprocessableEntity)
	}
	if n := hook.unique.Load(); n != 0 {
		t.Errorf("%d statements failed on a unique violation, want 0", n)
	}
}

// Fifty concurrent PUTs moving three emails between two subscribers, round after round: each
// answers 200 or 422 email_already_subscribed, never a 5xx (a deadlock answered 500 before),
// and no statement fails on a unique violation.
func TestContentionEmailSwaps(t *testing.T) {
	t.Parallel()
	hook := &conflictHook{}
	e := newEnv(t, withHook(hook))
	ids := make([]string, 2)
	for i := range ids {
		ids[i] = e.do("POST", "/subscribers", map[string]any{"email": fmt.Sprintf("s%d@x.io", i)}).
			want(t, http.StatusCreated, "").data(t)["id"].(string)
	}
	pool := []string{"s0@x.io", "s1@x.io", "S2@x.io"}
	for round := range 5 {
		var c statusCounter
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Go(func() {
				c.add(e.send("PUT", "/subscribers/"+ids[i%2], map[string]any{"email": pool[(i/2+round)%3]}))
			})
		}
		wg.Wait()
		c.check(t, http.StatusOK, http.StatusUnprocessableEntity)
	}
	if n := e.count("SELECT count(DISTINCT lower(email)) FROM subscribers"); n != 2 {
		t.Errorf("distinct emails = %d, want 2", n)
	}
	if n := hook.unique.Load(); n != 0 {
		t.Errorf("%d statements failed on a unique violation, want 0", n)
	}
}

// A client's duplicate is answered 422 email_already_subscribed without any statement failing
// on the unique key: PostgreSQL logs a failed statement with its values, here an address.
func TestDuplicatesRaiseNoDatabaseError(t *testing.T) {
	t.Parallel()
	hook := &conflictHook{}
	e := newEnv(t, withHook(hook))
	e.do("POST", "/subscribers", map[string]any{"email": "taken@x.io"}).want(t, http.StatusCreated, "")
	other := e.do("POST", "/subscribers", map[string]any{"email": "other@x.io"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
	e.do("POST", "/subscribers", map[string]any{"email": "Taken@X.io"}).want(t, http.StatusUnprocessableEntity, "email_already_subscribed")
	e.do("POST", "/subscribers", map[string]any{"email": "TAKEN@x.io", "status": "pending"}).want(t, http.StatusUnprocessableEntity, "email_already_subscribed")
	e.do("POST", "/subscribers/bulk", bulkOf([]string{"new@x.io", "taken@x.io"})).want(t, http.StatusUnprocessableEntity, "validation_error")
	e.do("PUT", "/subscribers/"+other, map[string]any{"email": "taken@X.IO"}).want(t, http.StatusUnprocessableEntity, "email_already_subscribed")
	if n := hook.unique.Load(); n != 0 {
		t.Errorf("%d statements failed on a unique violation, want 0", n)
	}
}

// Forty concurrent renames of one subscriber, most of them meeting another's change between
// their read and their write: each answers 200 and records exactly one event, and the history
// is one chain, each event's previous name the name the event before it set. A lost update, or
// an event recording a name that was no longer there, breaks the chain.
func TestContentionConcurrentRenames(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.do("POST", "/subscribers", map[string]any{"email": "ren@x.io", "name": "Start"}).
		want(t, http.StatusCreated, "").data(t)["id"].(string)
	const n = 40
	var c statusCounter
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { c.add(e.send("PUT", "/subscribers/"+id, map[string]any{"name": fmt.Sprintf("Name %02d", i)})) })
	}
	wg.Wait()
	c.check(t, http.StatusOK)

	evs := e.history(id)
	if len(evs) != n+1 {
		t.Fatalf("%d events, want %d: the create and one per rename", len(evs), n+1)
	}
	seen := map[string]bool{}
	prev := "Start"
	for _, ev := range evs[1:] {
		d := ev["data"].(map[string]any)
		name := d["subscriber"].(map[string]any)["name"].(string)
		if got := d["previous"].(map[string]any)["name"]; got != prev {
			t.Errorf("event %v: previous name %v, want %q (the name the event before set)", ev["id"], got, prev)
		}
		if seen[name] {
			t.Errorf("name %q set by two events", name)
		}
		seen[name], prev = true, name
	}
	if got := e.do("GET", "/subscribers/"+id, nil).want(t, http.StatusOK, "").data(t)["name"]; got != prev {
		t.Errorf("subscriber's name %v, the last event's %q", got, prev)
	}
}
