package repo_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
)

// TestChangeTagsEventIsNewEvent pins the event a change of tags records (built in SQL on
// PostgreSQL) to model.NewEventOf's, byte for byte, with the request's traceparent and source,
// whatever the name, address, attributes and tags hold that JSON escapes; and the change to
// model.TagsChange.Apply: the set it gives, returned and stored; nothing written and no event
// when the set stays as it is; Apply's *model.ValidationError past model.MaxTags, with nothing
// changed; model.ErrNotFound for a subscriber the newsletter does not have. In a unit of work
// it is part of the unit's transaction. The tag counters stay exact.
func TestChangeTagsEventIsNewEvent(t *testing.T) {
	db, nl := attributesDB(t)
	subs := repo.NewSubscribers(db)
	createEscapingSubscribers(t, subs, nl)
	src := model.APISource("sk_<pin>&")
	ctx, span := sdktrace.NewTracerProvider().Tracer("test").Start(model.WithSource(context.Background(), src), "request")
	defer span.End()
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	traceparent := carrier.Get("traceparent")
	if traceparent == "" {
		t.Fatal("no traceparent")
	}
	// The subscriber returned has the update time the store wrote, which SQLite's column
	// keeps to the microsecond.
	asStored := cmpopts.EquateApproxTime(time.Microsecond)
	list, _, err := subs.List(ctx, nl, model.ListQuery{Page: 1, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}

	type eventRow struct {
		ID          uuid.UUID `bun:"id"`
		Type        string    `bun:"type"`
		Payload     string    `bun:"payload"`
		Traceparent string    `bun:"traceparent"`
		CreatedAt   time.Time `bun:"created_at"`
	}
	events := func(id uuid.UUID) []eventRow {
		t.Helper()
		var evs []eventRow
		if err := db.NewRaw("SELECT id, type, payload, traceparent, created_at FROM subscriber_events WHERE subscriber_id = ? ORDER BY id",
			idArg(id)).Scan(context.Background(), &evs); err != nil {
			t.Fatal(err)
		}
		return evs
	}
	get := func(id uuid.UUID) model.Subscriber {
		t.Helper()
		sub, err := subs.Get(ctx, nl, id)
		if err != nil {
			t.Fatal(err)
		}
		return sub
	}

	for _, c := range []model.TagsChange{ // each sorted, as model.ParseTagsChange gives them
		{Add: []string{"new & <x>", "ü>ö"}, Remove: []string{"zeta"}},
		{Add: []string{"new & <x>"}}, // the set as it is: nothing
		{Remove: []string{"a<b", "beta", "new & <x>", "t50", "x"}},
		{Add: []string{"zz"}, Remove: []string{"nobody"}}, // past model.MaxTags for the full set
		{Add: []string{}, Remove: []string{"nobody"}},
	} {
		for _, s := range list {
			before, evsBefore := get(s.ID), events(s.ID)
			wantTags, changed, wantErr := c.Apply(before.Tags)
			got, err := subs.ChangeTags(ctx, nl, s.ID, c)
			after, evs := get(s.ID), events(s.ID)
			checkTagCounts(t, db, nl)
			if wantErr != nil {
				var verr *model.ValidationError
				if !errors.As(err, &verr) || !cmp.Equal(verr, wantErr) {
					t.Errorf("%+v on %s: error %v; want %v", c, s.Email, err, wantErr.Fields)
				}
				if !cmp.Equal(after, before) || len(evs) != len(evsBefore) {
					t.Errorf("%+v on %s: refused, but %v became %v with %d events more", c, s.Email, before, after,
						len(evs)-len(evsBefore))
				}
				continue
			}
			if err != nil {
				t.Fatalf("%+v on %s: %v", c, s.Email, err)
			}
			if !slices.Equal(after.Tags, wantTags) {
				t.Errorf("%+v on %s: tags %q; want %q", c, s.Email, after.Tags, wantTags)
			}
			if diff := cmp.Diff(after, got, asStored); diff != "" {
				t.Errorf("%+v on %s: returned (-stored +returned):\n%s", c, s.Email, diff)
			}
			if !changed {
				if len(evs) != len(evsBefore) || !after.UpdatedAt.Equal(before.UpdatedAt) {
					t.Errorf("%+v on %s: unchanged, but %d events more, updated_at %v → %v", c, s.Email,
						len(evs)-len(evsBefore), before.UpdatedAt, after.UpdatedAt)
				}
				continue
			}
			if len(evs) != len(evsBefore)+1 {
				t.Errorf("%+v on %s: changed with %d events; want 1", c, s.Email, len(evs)-len(evsBefore))
				continue
			}
			ev := evs[len(evs)-1]
			want := model.NewEventOf(model.EventUpdated, after, map[string]any{"tags": before.Tags}, src, ev.CreatedAt)
			wantJSON := strings.Replace(string(want.Payload), want.ID.String(), ev.ID.String(), 1)
			if ev.Payload != wantJSON || ev.Type != string(model.EventUpdated) || ev.Traceparent != traceparent {
				t.Errorf("%+v on %s: event\n got %s %s %s\nwant %s %s %s", c, s.Email, ev.Type, ev.Traceparent, ev.Payload,
					model.EventUpdated, traceparent, wantJSON)
			}
			if !ev.CreatedAt.Equal(after.UpdatedAt) || ev.ID.Version() != 7 || ev.ID.String() <= evsBefore[len(evsBefore)-1].ID.String() {
				t.Errorf("%+v on %s: event %s at %v after %s; subscriber updated at %v", c, s.Email, ev.ID, ev.CreatedAt,
					evsBefore[len(evsBefore)-1].ID, after.UpdatedAt)
			}
		}
	}

	s := list[0]
	for _, id := range [][2]uuid.UUID{{nl, uuid.Must(uuid.NewV7())}, {uuid.Must(uuid.NewV7()), s.ID}} {
		if _, err := subs.ChangeTags(ctx, id[0], id[1], model.TagsChange{Add: []string{"a"}}); !errors.Is(err, model.ErrNotFound) {
			t.Errorf("newsletter %s, subscriber %s: %v; want %v", id[0], id[1], err, model.ErrNotFound)
		}
	}

	// In a unit of work (a keyed request's): undone with it, kept with it.
	before, evsBefore := get(s.ID), events(s.ID)
	undone := errors.New("undone")
	err = db.InTx(ctx, func(tx repo.Tx) error {
		if _, err := tx.Subscribers().ChangeTags(ctx, nl, s.ID, model.TagsChange{Add: []string{"undone"}}); err != nil {
			return err
		}
		return undone
	})
	if after := get(s.ID); !errors.Is(err, undone) || !cmp.Equal(after, before) || len(events(s.ID)) != len(evsBefore) {
		t.Errorf("a change rolled back with its unit (%v) left %v, was %v", err, after, before)
	}
	var inUnit model.Subscriber
	if err := db.InTx(ctx, func(tx repo.Tx) error {
		var err error
		inUnit, err = tx.Subscribers().ChangeTags(ctx, nl, s.ID, model.TagsChange{Add: []string{"kept"}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if after := get(s.ID); !slices.Contains(after.Tags, "kept") || !cmp.Equal(after, inUnit, asStored) || len(events(s.ID)) != len(evsBefore)+1 {
		t.Errorf("a change committed with its unit: %v, returned %v, %d events more", after, inUnit, len(events(s.ID))-len(evsBefore))
	}
	checkTagCounts(t, db, nl)
}
