package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/subscriberd/subscriberd/importer"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
	"github.com/subscriberd/subscriberd/telemetry"
)

// startBulkWorker runs the bulk action workers on the env's database until t ends, as serve
// does, with a short poll so that tests do not wait.
func (e *env) startBulkWorker(t *testing.T, cfg importer.BulkConfig) {
	t.Helper()
	cfg.Interval = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	w := importer.NewBulkWorker(repo.NewBulkActions(e.db), cfg)
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }() //nolint:errcheck // nil
	t.Cleanup(func() { cancel(); <-done })
}

// waitBulk polls the bulk action at loc until its state is want, and returns it.
func (e *env) waitBulk(t *testing.T, loc, want string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		d := e.do(http.MethodGet, strings.TrimPrefix(loc, "/api/v1"), nil).want(t, http.StatusOK, "").data(t)
		if d["state"] == want {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("bulk action %s is %v, want %s: %v", loc, d["state"], want, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startBulk posts a bulk action and returns its Location.
func (e *env) startBulk(t *testing.T, body map[string]any) string {
	t.Helper()
	r := e.do(http.MethodPost, "/bulk-actions", body).want(t, http.StatusAccepted, "")
	d := r.data(t)
	loc := r.header.Get("Location")
	if loc != "/api/v1/bulk-actions/"+d["id"].(string) || d["state"] != "queued" || d["action"] != body["action"] {
		t.Fatalf("POST /bulk-actions: Location %q, data %v", loc, d)
	}
	return loc
}

// seed creates n subscribers "<prefix><i>@example.com" with body's other fields, 100 a request.
func (e *env) seed(t *testing.T, prefix string, n int, extra map[string]any) []string {
	t.Helper()
	var ids []string
	for start := 0; start < n; start += 100 {
		var items []map[string]any
		for i := start; i < min(n, start+100); i++ {
			item := map[string]any{"email": fmt.Sprintf("%s%d@example.com", prefix, i)}
			for k, v := range extra {
				item[k] = v
			}
			items = append(items, item)
		}
		d := e.do(http.MethodPost, "/subscribers/bulk", items).want(t, http.StatusCreated, "").data(t)
		for _, s := range d["created"].([]any) {
			ids = append(ids, s.(map[string]any)["id"].(string))
		}
	}
	return ids
}

// TestBulkActionsEachAction: each action changes the subscribers its target selects as the
// single operation would, with one event each (and a webhook delivery in the bulk lane) for a
// subscriber changed and none for one that already had the result; unsubscribe cancels the
// unsent confirmation emails; matched, changed and unchanged add up; GET /tags stays exact.
func TestBulkActionsEachAction(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.do(http.MethodPost, "/webhooks", map[string]any{"url": "https://hooks.example.com/in",
		"events": []string{"subscriber.updated", "subscriber.unsubscribed"}}).want(t, http.StatusCreated, "")
	e.startBulkWorker(t, importer.BulkConfig{BatchSize: 7})
	vip := e.seed(t, "vip", 20, map[string]any{"tags": []string{"vip"}, "attributes": map[string]any{"plan": "pro"}})
	plain := e.seed(t, "plain", 15, nil)
	pending := e.seed(t, "pend", 5, map[string]any{"status": "pending", "tags": []string{"vip", "new"}})
	events := func() int {
		return e.count("SELECT count(*) FROM subscriber_events WHERE type <> 'subscriber.created'")
	}
	bulkDeliveries := func() int { return e.count("SELECT count(*) FROM webhook_deliveries WHERE lane = 1") }

	// add_tags on a filter: the 25 vip hold it after; the 5 pending had "new" already.
	loc := e.startBulk(t, map[string]any{"action": "add_tags", "tags": []string{"New", "gold"}, "filter": map[string]any{"tags": []string{"vip"}}})
	d := e.waitBulk(t, loc, "completed")
	wantCounts(t, d, map[string]float64{"matched": 25, "processed": 25, "changed": 25, "unchanged": 0})
	if d["started_at"] == nil || d["finished_at"] == nil {
		t.Errorf("a completed action without started_at or finished_at: %v", d)
	}
	if n := events(); n != 25 {
		t.Errorf("%d events after add_tags, want 25", n)
	}
	got := e.do(http.MethodGet, "/subscribers/"+vip[0], nil).want(t, http.StatusOK, "").data(t)
	if fmt.Sprint(got["tags"]) != "[gold new vip]" {
		t.Errorf("tags = %v, want [gold new vip]", got["tags"])
	}
	// Again: everybody has them now; nothing changes, no event.
	d = e.waitBulk(t, e.startBulk(t, map[string]any{"action": "add_tags", "tags": []string{"gold"}, "filter": map[string]any{"tags": []string{"vip"}}}), "completed")
	wantCounts(t, d, map[string]float64{"matched": 25, "changed": 0, "unchanged": 25})
	if n := events(); n != 25 {
		t.Errorf("%d events after a repeated add_tags, want 25", n)
	}

	// remove_tags on ids: two ids of plain subscribers without it, one unknown id, three vip.
	ids := []string{plain[0], plain[1], uuid.NewString(), vip[0], vip[1], vip[2]}
	d = e.waitBulk(t, e.startBulk(t, map[string]any{"action": "remove_tags", "tags": []string{"gold"}, "ids": ids}), "completed")
	wantCounts(t, d, map[string]float64{"matched": 5, "changed": 3, "unchanged": 2})

	// set_attributes: a merge patch; plan removed where it was, seats set everywhere.
	d = e.waitBulk(t, e.startBulk(t, map[string]any{"action": "set_attributes",
		"attributes": map[string]any{"plan": nil, "seats": 5}, "filter": map[string]any{}}), "completed")
	wantCounts(t, d, map[string]float64{"matched": 40, "changed": 40, "unchanged": 0})
	got = e.do(http.MethodGet, "/subscribers/"+vip[3], nil).want(t, http.StatusOK, "").data(t)
	if fmt.Sprint(got["attributes"]) != "map[seats:5]" {
		t.Errorf("attributes = %v, want {seats: 5}", got["attributes"])
	}
	var prev string
	if err := e.db.NewRaw("SELECT payload FROM subscriber_events WHERE subscriber_id = ? ORDER BY id DESC LIMIT 1", vip[3]).
		Scan(context.Background(), &prev); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(prev, `"previous":{"attributes":{"plan":"pro","seats":null}}`) {
		t.Errorf("set_attributes event %s; want previous {plan: pro, seats: null}", prev)
	}

	// unsubscribe the pending ones: their confirmation emails are cancelled.
	if n := e.count("SELECT count(*) FROM email_outbox WHERE state = 'pending'"); n != 5 {
		t.Fatalf("%d pending emails before, want 5", n)
	}
	d = e.waitBulk(t, e.startBulk(t, map[string]any{"action": "unsubscribe", "filter": map[string]any{"status": "pending"}}), "completed")
	wantCounts(t, d, map[string]float64{"matched": 5, "changed": 5, "unchanged": 0})
	if n := e.count("SELECT count(*) FROM email_outbox WHERE state = 'pending'"); n != 0 {
		t.Errorf("%d pending emails after unsubscribe, want 0", n)
	}
	got = e.do(http.MethodGet, "/subscribers/"+pending[0], nil).want(t, http.StatusOK, "").data(t)
	if got["status"] != "unsubscribed" {
		t.Errorf("status = %v, want unsubscribed", got["status"])
	}
	want := 25 + 3 + 40 + 5
	if n := events(); n != want {
		t.Errorf("%d events in all, want %d", n, want)
	}
	if n := bulkDeliveries(); n != want {
		t.Errorf("%d webhook deliveries in the bulk lane, want %d (one per event)", n, want)
	}
	if n := e.count("SELECT count(*) FROM webhook_deliveries WHERE lane = 0 AND event_id IN (SELECT id FROM subscriber_events WHERE type <> 'subscriber.created')"); n != 0 {
		t.Errorf("%d of the actions' deliveries in the interactive lane", n)
	}
	tags := e.do(http.MethodGet, "/tags", nil).want(t, http.StatusOK, "")
	if fmt.Sprint(tags.body["data"]) != "[map[subscribers:22 tag:gold] map[subscribers:25 tag:new] map[subscribers:25 tag:vip]]" {
		t.Errorf("GET /tags = %v", tags.body["data"])
	}
	if n := e.count("SELECT count(*) FROM bulk_action_targets"); n != 0 {
		t.Errorf("%d targets left after the actions completed", n)
	}
}

// TestBulkActionsBadInput: every refused body is 422 with §20.2's keys and messages, and no
// action is stored.
func TestBulkActionsBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	many := make([]string, 1001)
	for i := range many {
		many[i] = uuid.NewString()
	}
	for _, c := range []struct {
		name string
		body map[string]any
		want map[string][]string
	}{
		{"no target", map[string]any{"action": "unsubscribe"},
			map[string][]string{"body": {"Exactly one of filter, segment or ids must be provided."}}},
		{"two targets", map[string]any{"action": "unsubscribe", "filter": map[string]any{}, "ids": []string{uuid.NewString()}},
			map[string][]string{"body": {"Exactly one of filter, segment or ids must be provided."}}},
		{"unknown segment", map[string]any{"action": "unsubscribe", "segment": uuid.NewString()},
			map[string][]string{"segment": {"The selected segment is invalid."}}},
		{"segment not an id", map[string]any{"action": "unsubscribe", "segment": "x"},
			map[string][]string{"segment": {"The segment field must be a valid UUID."}}},
		{"too many ids", map[string]any{"action": "unsubscribe", "ids": many},
			map[string][]string{"ids": {"The ids field must not have more than 1000 items."}}},
		{"no ids", map[string]any{"action": "unsubscribe", "ids": []string{}},
			map[string][]string{"ids": {"The ids field must have at least 1 item."}}},
		{"bad id", map[string]any{"action": "unsubscribe", "ids": []any{"nope", 5}},
			map[string][]string{"ids.0": {"The ids.0 field must be a valid UUID."}, "ids.1": {"The ids.1 field must be a valid UUID."}}},
		{"bad filter", map[string]any{"action": "unsubscribe", "filter": map[string]any{"tags": []any{""}, "attributes": map[string]any{"plan": []any{}}}},
			map[string][]string{"filter.tags.0": {"The filter.tags.0 field must be between 1 and 64 characters."},
				"filter.attributes.plan": {"The filter.attributes.plan field must be a string, number or boolean."}}},
		{"filter not an object", map[string]any{"action": "unsubscribe", "filter": "x"},
			map[string][]string{"filter": {"The filter field must be an object."}}},
		{"tags missing", map[string]any{"action": "add_tags", "filter": map[string]any{}},
			map[string][]string{"tags": {"The tags field is required when action is add_tags."}}},
		{"tags empty", map[string]any{"action": "remove_tags", "tags": []string{}, "filter": map[string]any{}},
			map[string][]string{"tags": {"The tags field is required when action is remove_tags."}}},
		{"bad tag", map[string]any{"action": "add_tags", "tags": []any{"a,b"}, "filter": map[string]any{}},
			map[string][]string{"tags.0": {"The tags.0 field contains invalid characters."}}},
		{"attributes missing", map[string]any{"action": "set_attributes", "filter": map[string]any{}},
			map[string][]string{"attributes": {"The attributes field is required when action is set_attributes."}}},
		{"bad attribute", map[string]any{"action": "set_attributes", "attributes": map[string]any{"plan": []any{}}, "filter": map[string]any{}},
			map[string][]string{"attributes.plan": {"The attributes.plan field must be a string, number or boolean."}}},
		{"tags on unsubscribe", map[string]any{"action": "unsubscribe", "tags": []string{"a"}, "filter": map[string]any{}},
			map[string][]string{"tags": {"The tags field is prohibited unless action is add_tags or remove_tags."}}},
		{"attributes on add_tags", map[string]any{"action": "add_tags", "tags": []string{"a"}, "attributes": map[string]any{"a": 1}, "filter": map[string]any{}},
			map[string][]string{"attributes": {"The attributes field is prohibited unless action is set_attributes."}}},
		{"no action", map[string]any{"filter": map[string]any{}},
			map[string][]string{"action": {"The action field is required."}}},
		{"unknown action", map[string]any{"action": "delete", "filter": map[string]any{}},
			map[string][]string{"action": {"The selected action is invalid; it must be add_tags, remove_tags, set_attributes or unsubscribe."}}},
		{"unknown field", map[string]any{"action": "unsubscribe", "filter": map[string]any{}, "dry_run": true},
			map[string][]string{"dry_run": {"The dry_run field is prohibited."}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := e.do(http.MethodPost, "/bulk-actions", c.body).want(t, http.StatusUnprocessableEntity, "validation_error").fieldErrors(t)
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("errors = %v\nwant %v", got, c.want)
			}
		})
	}
	if n := e.count("SELECT count(*) FROM bulk_actions"); n != 0 {
		t.Errorf("%d bulk actions stored after refused requests", n)
	}
}

// TestBulkActionsOrderCancelList: a newsletter's actions wait in order; a queued one can be
// cancelled (and changes nothing), a finished one gives 409 bulk_action_finished; the list is
// newest first with a cursor; unknown ids are 404; a read key may list but not start one; an
// Idempotency-Key replays the 202 without a second action.
func TestBulkActionsOrderCancelList(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := e.seed(t, "o", 10, nil)
	first := e.startBulk(t, map[string]any{"action": "add_tags", "tags": []string{"one"}, "filter": map[string]any{}})
	second := e.startBulk(t, map[string]any{"action": "add_tags", "tags": []string{"two"}, "ids": ids[:3]})
	third := e.startBulk(t, map[string]any{"action": "remove_tags", "tags": []string{"one"}, "ids": ids[:1]})
	d := e.do(http.MethodDelete, strings.TrimPrefix(second, "/api/v1"), nil).want(t, http.StatusOK, "").data(t)
	if d["state"] != "cancelled" || d["finished_at"] == nil {
		t.Errorf("cancel = %v", d)
	}
	e.do(http.MethodDelete, strings.TrimPrefix(second, "/api/v1"), nil).want(t, http.StatusConflict, "bulk_action_finished")
	e.startBulkWorker(t, importer.BulkConfig{BatchSize: 3})
	e.waitBulk(t, third, "completed")
	// The third ran after the first: it found the tag to remove on ids[0].
	wantCounts(t, e.waitBulk(t, first, "completed"), map[string]float64{"matched": 10, "changed": 10})
	wantCounts(t, e.waitBulk(t, third, "completed"), map[string]float64{"matched": 1, "changed": 1})
	for _, id := range ids[:3] {
		tags := e.do(http.MethodGet, "/subscribers/"+id, nil).want(t, http.StatusOK, "").data(t)["tags"].([]any)
		if slices.Contains(tags, any("two")) {
			t.Errorf("%s tagged by the cancelled action: %v", id, tags)
		}
	}
	e.do(http.MethodDelete, strings.TrimPrefix(first, "/api/v1"), nil).want(t, http.StatusConflict, "bulk_action_finished")
	e.do(http.MethodGet, "/bulk-actions/"+uuid.NewString(), nil).want(t, http.StatusNotFound, "not_found")
	e.do(http.MethodDelete, "/bulk-actions/"+uuid.NewString(), nil).want(t, http.StatusNotFound, "not_found")
	e.do(http.MethodGet, "/bulk-actions/nope", nil).want(t, http.StatusNotFound, "not_found")

	page := e.do(http.MethodGet, "/bulk-actions?limit=2", nil).want(t, http.StatusOK, "")
	data := page.body["data"].([]any)
	if len(data) != 2 || "/api/v1/bulk-actions/"+data[0].(map[string]any)["id"].(string) != third {
		t.Fatalf("first page = %v", data)
	}
	next := page.body["pagination"].(map[string]any)["next_cursor"].(string)
	rest := e.do(http.MethodGet, "/bulk-actions?limit=2&cursor="+next, nil).want(t, http.StatusOK, "").body["data"].([]any)
	if len(rest) != 1 || "/api/v1/bulk-actions/"+rest[0].(map[string]any)["id"].(string) != first {
		t.Errorf("second page = %v", rest)
	}

	// Idempotency-Key: the same request again is the stored 202, no second action.
	body := map[string]any{"action": "unsubscribe", "ids": ids[:1]}
	a := e.do(http.MethodPost, "/bulk-actions", body, "Idempotency-Key: bulk-1").want(t, http.StatusAccepted, "")
	b := e.do(http.MethodPost, "/bulk-actions", body, "Idempotency-Key: bulk-1").want(t, http.StatusAccepted, "")
	if string(a.raw) != string(b.raw) || b.header.Get("Idempotent-Replayed") != "true" || a.header.Get("Location") != b.header.Get("Location") {
		t.Errorf("replay differs: %s / %s", a.raw, b.raw)
	}
	if n := e.count("SELECT count(*) FROM bulk_actions"); n != 4 {
		t.Errorf("%d bulk actions, want 4", n)
	}

	// A read key lists and reads, but may not start or cancel one.
	_, secret := e.readKey(t)
	e.do(http.MethodPost, "/bulk-actions", body, "Authorization: Bearer "+secret).want(t, http.StatusForbidden, "insufficient_scope")
	e.do(http.MethodDelete, strings.TrimPrefix(first, "/api/v1"), nil, "Authorization: Bearer "+secret).want(t, http.StatusForbidden, "insufficient_scope")
	e.do(http.MethodGet, "/bulk-actions", nil, "Authorization: Bearer "+secret).want(t, http.StatusOK, "")
	e.do(http.MethodGet, strings.TrimPrefix(first, "/api/v1"), nil, "Authorization: Bearer "+secret).want(t, http.StatusOK, "")
}

// TestBulkActionErasedDuringAction: a subscriber erased or deleted after the action started
// (its targets staged) is unchanged by it, counted unchanged, and not brought back.
func TestBulkActionErasedDuringAction(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := e.seed(t, "gone", 6, nil)
	ctx := context.Background()
	store := repo.NewBulkActions(e.db)
	loc := e.startBulk(t, map[string]any{"action": "add_tags", "tags": []string{"late"}, "filter": map[string]any{}})
	job, ok, err := store.Claim(ctx, time.Minute)
	if err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	if c, done, err := store.Batch(ctx, job, 2, time.Minute); err != nil || done || c.Matched != 6 {
		t.Fatalf("staging batch: %+v %v %v", c, done, err)
	}
	e.do(http.MethodPost, "/subscribers/"+ids[0]+"/erase", nil).want(t, http.StatusOK, "")
	e.do(http.MethodPost, "/subscribers/"+ids[5]+"/erase", nil).want(t, http.StatusOK, "")
	for {
		_, done, err := store.Batch(ctx, job, 2, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			break
		}
	}
	wantCounts(t, e.waitBulk(t, loc, "completed"), map[string]float64{"matched": 6, "processed": 6, "changed": 4, "unchanged": 2})
	for _, id := range []string{ids[0], ids[5]} {
		e.do(http.MethodGet, "/subscribers/"+id, nil).want(t, http.StatusNotFound, "not_found")
		if n := e.count("SELECT count(*) FROM subscriber_events WHERE subscriber_id = ? AND type = 'subscriber.updated'", id); n != 0 {
			t.Errorf("%d updated events of an erased subscriber", n)
		}
	}
	if n := e.count("SELECT count(*) FROM subscribers"); n != 4 {
		t.Errorf("%d subscribers, want 4", n)
	}
}

// bulkWorkerProcessEnv, set, makes the test binary a bulk action worker process
// (runBulkWorkerProcess) on the database WORKER_DATABASE_URL names.
const bulkWorkerProcessEnv = "SUBSCRIBERD_TEST_BULK_WORKER"

func runBulkWorkerProcess() int {
	db, err := repo.Open(os.Getenv("WORKER_DATABASE_URL"), repo.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "bulk worker process:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	batch, _ := strconv.Atoi(os.Getenv("WORKER_BATCH_SIZE"))
	w := importer.NewBulkWorker(repo.NewBulkActions(db), importer.BulkConfig{BatchSize: max(batch, 50), Lease: time.Second,
		Interval: 50 * time.Millisecond})
	w.Run(ctx) //nolint:errcheck // nil
	return 0
}

// TestBulkActionSurvivesKill9: the worker process is killed (SIGKILL) in the middle of an
// action, twice, and started again; the action completes with each subscriber changed
// exactly once: one event each, the counts add up, the tag's count is exact.
func TestBulkActionSurvivesKill9(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const n = 3000
	e.seed(t, "k", n, nil)
	loc := e.startBulk(t, map[string]any{"action": "add_tags", "tags": []string{"killed"}, "filter": map[string]any{}})
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), bulkWorkerProcessEnv+"=1", "WORKER_DATABASE_URL="+e.dsn, "WORKER_BATCH_SIZE=50")
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck
		return cmd
	}
	processed := func() float64 {
		d := e.do(http.MethodGet, strings.TrimPrefix(loc, "/api/v1"), nil).want(t, http.StatusOK, "").data(t)
		return d["counts"].(map[string]any)["processed"].(float64)
	}
	last := 0.0
	for kill := range 2 {
		cmd := start()
		deadline := time.Now().Add(60 * time.Second)
		for processed() <= last {
			if time.Now().After(deadline) {
				t.Fatalf("kill %d: no progress past %v", kill+1, last)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		cmd.Wait() //nolint:errcheck // killed
		if last = processed(); last >= n {
			t.Fatalf("kill %d came after the end of the action (%v processed)", kill+1, last)
		}
	}
	start()
	d := e.waitBulk(t, loc, "completed")
	wantCounts(t, d, map[string]float64{"matched": n, "processed": n, "changed": n, "unchanged": 0})
	if got := e.count("SELECT count(*) FROM subscriber_events WHERE type = 'subscriber.updated'"); got != n {
		t.Errorf("%d updated events, want %d", got, n)
	}
	if got := e.count("SELECT count(DISTINCT subscriber_id) FROM subscriber_events WHERE type = 'subscriber.updated'"); got != n {
		t.Errorf("%d subscribers with an updated event, want %d", got, n)
	}
	tags := e.do(http.MethodGet, "/tags", nil).want(t, http.StatusOK, "").body["data"].([]any)
	if len(tags) != 1 || tags[0].(map[string]any)["subscribers"] != float64(n) {
		t.Errorf("GET /tags = %v", tags)
	}
}

// TestBulkActionsNewslettersSideBySide: with two workers, the actions of two newsletters
// both complete, each on its own newsletter's subscribers only.
func TestBulkActionsNewslettersSideBySide(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seed(t, "a", 30, nil)
	other := *e
	other.nl, other.key = e.newKey(t, true)
	other.seed(t, "b", 20, nil)
	la := e.startBulk(t, map[string]any{"action": "add_tags", "tags": []string{"x"}, "filter": map[string]any{}})
	lb := other.startBulk(t, map[string]any{"action": "unsubscribe", "filter": map[string]any{}})
	e.startBulkWorker(t, importer.BulkConfig{Workers: 2, BatchSize: 4})
	wantCounts(t, e.waitBulk(t, la, "completed"), map[string]float64{"matched": 30, "changed": 30})
	wantCounts(t, other.waitBulk(t, lb, "completed"), map[string]float64{"matched": 20, "changed": 20})
	if n := e.count("SELECT count(*) FROM subscribers WHERE status = 'unsubscribed'"); n != 20 {
		t.Errorf("%d unsubscribed, want 20", n)
	}
}

// TestBulkActionBatchSpansAndMetrics: each batch has a span linked to the request's trace,
// counting what it changed; bulk_action_rows_total counts by action and outcome, and
// bulk_actions_running is back to 0 once the action completed. The status counters stay
// exact.
func TestBulkActionBatchSpansAndMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := e.seed(t, "m", 5, nil)
	e.do(http.MethodDelete, "/subscribers/"+ids[0], nil).want(t, http.StatusOK, "")
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	m := telemetry.NewMetrics("test")
	const request = "00-0102030405060708090a0b0c0d0e0f10-0102030405060708-01"
	a, err := repo.NewBulkActions(e.db).Create(context.Background(), model.NewBulkAction{
		BulkRequest: model.BulkRequest{BulkChange: model.BulkChange{Action: model.ActionUnsubscribe},
			Target: model.BulkTarget{Filter: &model.Filter{}}}, NewsletterID: e.nl, KeyPrefix: "sk_test", Traceparent: request})
	if err != nil {
		t.Fatal(err)
	}
	e.startBulkWorker(t, importer.BulkConfig{BatchSize: 2, Recorder: m, Config: importer.Config{TracerProvider: tp}})
	e.waitBulk(t, "/api/v1/bulk-actions/"+a.ID.String(), "completed")
	var batches int
	var changed int64
	for _, s := range rec.Ended() {
		if s.Name() != "bulk action batch" {
			continue
		}
		batches++
		if len(s.Links()) != 1 || s.Links()[0].SpanContext.TraceID().String() != "0102030405060708090a0b0c0d0e0f10" {
			t.Errorf("batch span links %v, want the request's trace", s.Links())
		}
		for _, kv := range s.Attributes() {
			if kv.Key == "bulk_action.changed" {
				changed += kv.Value.AsInt64()
			}
		}
	}
	// One to select the 5 subscribers, three of up to 2.
	if batches != 4 || changed != 4 {
		t.Errorf("%d batch spans counting %d changed, want 4 and 4", batches, changed)
	}
	if got := counterSum(t, m, "bulk_action_rows_total", "outcome", "changed"); got != 4 {
		t.Errorf("bulk_action_rows_total{outcome=changed} = %v, want 4", got)
	}
	if got := counterSum(t, m, "bulk_action_rows_total", "outcome", "unchanged"); got != 1 {
		t.Errorf("bulk_action_rows_total{outcome=unchanged} = %v, want 1", got)
	}
	running := func() float64 {
		mfs, err := m.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "bulk_actions_running" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return -1
	}
	deadline := time.Now().Add(5 * time.Second)
	for running() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("bulk_actions_running = %v after the action completed", running())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for status, want := range map[string]float64{"unsubscribed": 5, "active": 0} {
		total := e.do(http.MethodGet, "/subscribers?status="+status, nil).want(t, http.StatusOK, "").body["pagination"].(map[string]any)["total"]
		if total != want {
			t.Errorf("total of %s = %v, want %v", status, total, want)
		}
	}
}

// TestBulkActionSegmentTarget: a segment target acts on the segment's members by its filter;
// another newsletter's segment is invalid.
func TestBulkActionSegmentTarget(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seed(t, "pro", 7, map[string]any{"attributes": map[string]any{"plan": "pro"}})
	e.seed(t, "free", 5, map[string]any{"attributes": map[string]any{"plan": "free"}})
	seg := e.do(http.MethodPost, "/segments", map[string]any{"name": "Pro", "filter": map[string]any{"attributes": map[string]any{"plan": "pro"}}}).
		want(t, http.StatusCreated, "").data(t)["id"].(string)
	e.startBulkWorker(t, importer.BulkConfig{BatchSize: 3})
	d := e.waitBulk(t, e.startBulk(t, map[string]any{"action": "add_tags", "tags": []string{"paying"}, "segment": seg}), "completed")
	wantCounts(t, d, map[string]float64{"matched": 7, "changed": 7, "unchanged": 0})
	total := e.do(http.MethodGet, "/subscribers?tag=paying", nil).want(t, http.StatusOK, "").body["pagination"].(map[string]any)["total"]
	if total != float64(7) {
		t.Errorf("%v subscribers tagged paying, want 7", total)
	}
	other := *e
	other.nl, other.key = e.newKey(t, true)
	got := other.do(http.MethodPost, "/bulk-actions", map[string]any{"action": "unsubscribe", "segment": seg}).
		want(t, http.StatusUnprocessableEntity, "validation_error").fieldErrors(t)
	if fmt.Sprint(got) != "map[segment:[The selected segment is invalid.]]" {
		t.Errorf("another newsletter's segment: %v", got)
	}
}

// TestSingleChangeOvertakesABulkAction is docs/api-contract.md §21 for bulk actions: the
// deliveries of an action's events wait in the bulk lane, and at the same endpoint a single
// tags operation's delivery, made after them, is claimed first.
func TestSingleChangeOvertakesABulkAction(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := e.seed(t, "lane", 500, nil)
	e.do(http.MethodPost, "/webhooks", map[string]any{"url": "http://127.0.0.1:9/hook", "events": []string{"subscriber.updated"}}).
		want(t, http.StatusCreated, "")
	e.startBulkWorker(t, importer.BulkConfig{BatchSize: 100})
	e.waitBulk(t, e.startBulk(t, map[string]any{"action": "add_tags", "tags": []string{"wave"}, "filter": map[string]any{}}), "completed")
	if n := e.count(`SELECT count(*) FROM webhook_deliveries WHERE state = 'pending' AND lane = 1`); n != 500 {
		t.Fatalf("the action queued %d bulk deliveries; want 500", n)
	}
	e.do(http.MethodPost, "/subscribers/"+ids[7]+"/tags", map[string]any{"add": []string{"single"}}).want(t, http.StatusOK, "")
	batches, err := repo.NewDeliveries(e.db).Claim(context.Background(), 1, 10, 1, time.Minute)
	if err != nil || len(batches) != 1 || len(batches[0].Deliveries) != 10 {
		t.Fatalf("claiming the endpoint: %+v, %v; want one endpoint with 10 deliveries", batches, err)
	}
	if first := string(batches[0].Deliveries[0].Payload); !strings.Contains(first, `"single"`) {
		t.Errorf("the first delivery claimed is %s; want the single change's, before the action's 500", first)
	}
}

// TestBulkActionWithConcurrentWrites: single tags operations on the same subscribers while a
// bulk action adds a tag lose nothing either way: every subscriber ends with both tags, and
// each subscriber's history is a chain — every subscriber.updated event's previous tags are
// the tags of the event before it, whichever of the two made it.
func TestBulkActionWithConcurrentWrites(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := e.seed(t, "race", 200, nil)
	e.startBulkWorker(t, importer.BulkConfig{BatchSize: 10})
	loc := e.startBulk(t, map[string]any{"action": "add_tags", "tags": []string{"bulk"}, "filter": map[string]any{}})
	errs := make(chan error, 4)
	for g := range 4 {
		go func() {
			for i := g; i < len(ids); i += 4 {
				r := e.do(http.MethodPost, "/subscribers/"+ids[i]+"/tags", map[string]any{"add": []string{fmt.Sprintf("single%d", g)}})
				if r.status != http.StatusOK {
					errs <- fmt.Errorf("tags of %s: %d %s", ids[i], r.status, r.raw)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	wantCounts(t, e.waitBulk(t, loc, "completed"), map[string]float64{"matched": 200, "processed": 200, "changed": 200})
	for i, id := range ids {
		tags := e.do(http.MethodGet, "/subscribers/"+id, nil).want(t, http.StatusOK, "").data(t)["tags"]
		if want := fmt.Sprintf("[bulk single%d]", i%4); fmt.Sprint(tags) != want {
			t.Errorf("%s has tags %v, want %s", id, tags, want)
		}
		hist := e.history(id)
		if len(hist) != 3 {
			t.Errorf("%s has %d events, want created and two updated", id, len(hist))
			continue
		}
		for j := 1; j < len(hist); j++ {
			before := hist[j-1]["data"].(map[string]any)["subscriber"].(map[string]any)["tags"]
			prev := hist[j]["data"].(map[string]any)["previous"].(map[string]any)["tags"]
			if fmt.Sprint(prev) != fmt.Sprint(before) {
				t.Errorf("%s event %d: previous tags %v, but the event before left %v", id, j, prev, before)
			}
		}
	}
}
