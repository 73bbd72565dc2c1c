package repo_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
)

// runBulk stores req as a bulk action of nl by key prefix sk_pin and runs it to the end in
// batches of size, as a worker does; it returns the action.
func runBulk(t *testing.T, db *repo.DB, nl uuid.UUID, size int, req model.BulkRequest) model.BulkAction {
	t.Helper()
	ctx := context.Background()
	store := repo.NewBulkActions(db)
	a, err := store.Create(ctx, model.NewBulkAction{BulkRequest: req, NewsletterID: nl, KeyPrefix: "sk_pin"})
	if err != nil {
		t.Fatal(err)
	}
	job, ok, err := store.Claim(ctx, time.Minute)
	if err != nil || !ok || job.ID != a.ID {
		t.Fatalf("claim = %v, %v, %v; want bulk action %s", job.ID, ok, err, a.ID)
	}
	for range 1000 {
		_, done, err := store.Batch(ctx, job, size, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			a, err := store.Get(ctx, nl, a.ID)
			if err != nil {
				t.Fatal(err)
			}
			return a
		}
	}
	t.Fatal("the bulk action did not complete in 1000 batches")
	return model.BulkAction{}
}

func mustRequest(t *testing.T, body string) model.BulkRequest {
	t.Helper()
	var obj map[string]any
	dec := json.NewDecoder(strings.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&obj); err != nil {
		t.Fatal(err)
	}
	r, verr := model.ParseBulkRequest(obj)
	if verr != nil {
		t.Fatalf("%s: %v", body, verr.Fields)
	}
	return r
}

// TestBulkEventsAreNewEvents pins the events a bulk action's batch writes (built in SQL on
// PostgreSQL) to model.NewEventOf's, byte for byte, for each action: the subscriber after the
// change and the previous values the single operation records, whatever the name, address,
// attributes and tags hold that JSON escapes. Each changed subscriber gets exactly one event,
// an unchanged one none; the tag counters stay exact.
func TestBulkEventsAreNewEvents(t *testing.T) {
	db, nl := attributesDB(t)
	ctx := context.Background()
	subs := repo.NewSubscribers(db)
	createEscapingSubscribers(t, subs, nl)
	for _, tc := range []struct {
		body      string
		wantEvent model.EventType
	}{
		{`{"action":"add_tags","tags":["Beta","new & <x>"],"filter":{}}`, model.EventUpdated},
		{`{"action":"add_tags","tags":["beta"],"filter":{}}`, model.EventUpdated}, // only those without it
		{`{"action":"remove_tags","tags":["zeta","t50","nobody"],"filter":{}}`, model.EventUpdated},
		{`{"action":"set_attributes","attributes":{"plan":"<pro> & \"co\"","seats":6,"new":"ü > ?","trial":null,"gone":null},"filter":{}}`, model.EventUpdated},
		{`{"action":"unsubscribe","filter":{"status":"pending"}}`, model.EventUnsubscribed},
		{`{"action":"unsubscribe","filter":{}}`, model.EventUnsubscribed},
	} {
		req := mustRequest(t, tc.body)
		before := map[uuid.UUID]model.Subscriber{}
		list, _, err := subs.List(ctx, nl, model.ListQuery{Page: 1, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range list {
			full, err := subs.Get(ctx, nl, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			before[s.ID] = full
		}
		var last time.Time
		if err := db.NewRaw("SELECT coalesce(max(created_at), '2000-01-01') FROM subscriber_events").Scan(ctx, &last); err != nil {
			t.Fatal(err)
		}
		a := runBulk(t, db, nl, 2, req)
		var evs []struct {
			ID           uuid.UUID `bun:"id"`
			SubscriberID uuid.UUID `bun:"subscriber_id"`
			Type         string    `bun:"type"`
			Payload      string    `bun:"payload"`
			CreatedAt    time.Time `bun:"created_at"`
		}
		if err := db.NewRaw("SELECT id, subscriber_id, type, payload, created_at FROM subscriber_events WHERE created_at > ?", last).
			Scan(ctx, &evs); err != nil {
			t.Fatal(err)
		}
		if int64(len(evs)) != a.Counts.Changed || a.Counts.Changed+a.Counts.Unchanged != a.Counts.Matched ||
			a.Counts.Processed != a.Counts.Matched || a.State != model.BulkCompleted {
			t.Fatalf("%s: %d events for counts %+v, state %s", tc.body, len(evs), a.Counts, a.State)
		}
		changed := 0
		for _, s := range before {
			after, err := subs.Get(ctx, nl, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			var prev map[string]any
			switch req.Action {
			case model.ActionAddTags, model.ActionRemoveTags:
				if tags, ch, verr := req.TagsChange().Apply(s.Tags); verr == nil && ch {
					prev = map[string]any{"tags": s.Tags}
					if !slices.Equal(tags, after.Tags) {
						t.Errorf("%s: %s has tags %v; want %v", tc.body, s.Email, after.Tags, tags)
					}
				}
			case model.ActionSetAttributes:
				if attrs, p, verr := model.MergeAttributes(s.Attributes, req.Attributes, "attributes"); verr == nil && len(p) > 0 {
					prev = map[string]any{"attributes": p}
					if string(attrs.JSON()) != string(after.Attributes.JSON()) {
						t.Errorf("%s: %s has attributes %s; want %s", tc.body, s.Email, after.Attributes.JSON(), attrs.JSON())
					}
				}
			case model.ActionUnsubscribe:
				if req.Target.Filter.Match(s.Status, s.CreatedAt, s.Attributes, s.Tags) && s.Status != model.StatusUnsubscribed {
					prev = map[string]any{"status": string(s.Status)}
				}
			}
			var mine []int
			for i, ev := range evs {
				if ev.SubscriberID == s.ID {
					mine = append(mine, i)
				}
			}
			if prev == nil {
				if len(mine) != 0 || !after.UpdatedAt.Equal(s.UpdatedAt) {
					t.Errorf("%s: %s unchanged but has %d events, updated_at %v → %v", tc.body, s.Email, len(mine), s.UpdatedAt, after.UpdatedAt)
				}
				continue
			}
			changed++
			if len(mine) != 1 {
				t.Errorf("%s: %s changed with %d events; want 1", tc.body, s.Email, len(mine))
				continue
			}
			ev := evs[mine[0]]
			want := model.NewEventOf(tc.wantEvent, after, prev, model.APISource("sk_pin"), ev.CreatedAt)
			wantJSON := strings.Replace(string(want.Payload), want.ID.String(), ev.ID.String(), 1)
			if ev.Payload != wantJSON || ev.Type != string(tc.wantEvent) {
				t.Errorf("%s: event of %s:\n got %s %s\nwant %s %s", tc.body, s.Email, ev.Type, ev.Payload, tc.wantEvent, wantJSON)
			}
		}
		if req.Action == model.ActionSetAttributes && a.Counts.Unchanged < 2 {
			t.Errorf("%s: %d unchanged; want at least the two at the limits", tc.body, a.Counts.Unchanged)
		}
		if int64(changed) != a.Counts.Changed {
			t.Errorf("%s: changed = %d; want %d", tc.body, a.Counts.Changed, changed)
		}
		checkTagCounts(t, db, nl)
	}
}

// createEscapingSubscribers stores, in nl, subscribers whose events' JSON puts every escape of
// Go's encoding/json to the test: names, addresses, attributes and tags with quotes,
// backslashes, <, > and &, non-ASCII text, attributes of each JSON type (numbers whole and
// not), a full set of model.MaxTags tags, attributes at the limits of docs/api-contract.md
// §19.1, and, stored as if an older version had let them in, names with the line and
// paragraph separators (U+2028, U+2029), which Go escapes and the rules now refuse.
func createEscapingSubscribers(t *testing.T, subs *repo.Subscribers, nl uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	inputs := []string{
		`{"email":"plain@example.com","name":"Ann Lee"}`,
		`{"email":"o'brien&co+x@example.com","name":"<b>Tom</b> & \"Jerry\" \\ back/slash","status":"pending"}`,
		`{"email":"uni@example.com","name":"Zoë  Ünïcödé 日本","tags":["zeta","Beta"]}`,
		`{"email":"attrs@example.com","attributes":{"plan":"<pro> & \"co\"","seats":5,"ratio":1.5,"trial":false,"zz":"日本 ½ /"},"tags":["vip","a<b"]}`,
		`{"email":"full@example.com","tags":["t00","t01","t02","t03","t04","t05","t06","t07","t08","t09","t10","t11","t12","t13","t14","t15","t16","t17","t18","t19","t20","t21","t22","t23","t24","t25","t26","t27","t28","t29","t30","t31","t32","t33","t34","t35","t36","t37","t38","t39","t40","t41","t42","t43","t44","t45","t46","t47","t48","t49","t50","t51","t52","t53","t54","t55","t56","t57","t58","t59","t60","t61","t62","t63","t64","t65","t66","t67","t68","t69","t70","t71","t72","t73","t74","t75","t76","t77","t78","t79","t80","t81","t82","t83","t84","t85","t86","t87","t88","t89","t90","t91","t92","t93","t94","t95","t96","t97","t98","t99"]}`,
	}
	// At the limits of docs/api-contract.md §19.1: 48 keys (TestBulkEventsAreNewEvents' patch
	// adds 3, one too many), and 8,165 bytes (its patch's values go past 8,192).
	many, big := map[string]any{}, map[string]any{}
	for i := range 48 {
		many[fmt.Sprintf("k%02d", i)] = i
	}
	for i := range 8 {
		big[fmt.Sprintf("b%d", i)] = strings.Repeat("x", 1000)
	}
	big["b8"] = strings.Repeat("y", 100)
	for _, attrs := range []map[string]any{many, big} {
		js, _ := json.Marshal(map[string]any{"email": fmt.Sprintf("limit%d@example.com", len(attrs)), "attributes": attrs})
		inputs = append(inputs, string(js))
	}
	for _, in := range inputs {
		var obj map[string]any
		dec := json.NewDecoder(strings.NewReader(in))
		dec.UseNumber()
		if err := dec.Decode(&obj); err != nil {
			t.Fatal(err)
		}
		ns, verr := model.ParseCreate(obj)
		if verr != nil {
			t.Fatalf("%s: %v", in, verr.Fields)
		}
		if _, err := subs.Create(ctx, nl, ns); err != nil {
			t.Fatal(err)
		}
	}
	// Not through model.ParseCreate, which refuses the separators.
	if _, err := subs.Create(ctx, nl, model.NewSubscriber{Email: "sep@example.com", FirstName: "Line\u2028Sep",
		LastName: "Para\u2029Sep <&>", Status: model.StatusActive, Tags: []string{"x"}}); err != nil {
		t.Fatal(err)
	}
}
