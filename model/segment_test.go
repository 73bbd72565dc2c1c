package model_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/subscriberd/subscriberd/model"
)

// TestFilterJSONRoundTrip: a segment's stored filter (Filter.JSON) reads back as the same
// filter, and filters with one Key have one JSON.
func TestFilterJSONRoundTrip(t *testing.T) {
	for _, in := range []string{
		`{}`,
		`{"status":"pending"}`,
		`{"tags":["B","a"," a"],"not_tags":["X"],"attributes":{"seats":5,"trial":false,"plan":"pro","ratio":1.50},` +
			`"has_attributes":["z","a"],"created_after":"2026-06-11T17:00:00.25+02:00","created_before":"2026-06-12T00:00:00Z"}`,
		`{"attributes":{"note":"<&> \"q\" ü"}}`,
	} {
		f, verr := model.ParseSegmentFilter(decode(t, in), "filter")
		if verr != nil {
			t.Fatalf("%s: %v", in, verr.Fields)
		}
		js := f.JSON()
		back, err := model.DecodeFilter(js)
		if err != nil {
			t.Fatalf("%s: %s does not decode: %v", in, js, err)
		}
		if back.Key() != f.Key() || string(back.JSON()) != string(js) {
			t.Errorf("%s: %s read back as %s", in, js, back.JSON())
		}
	}
	f, _ := model.ParseSegmentFilter(decode(t, `{"tags":["B","a"],"attributes":{"seats":5},"created_after":"2026-06-11T17:00:00.25+02:00"}`), "filter")
	if got, want := string(f.JSON()), `{"attributes":{"seats":"5"},"created_after":"2026-06-11T15:00:00.25+00:00","tags":["a","b"]}`; got != want {
		t.Errorf("JSON = %s; want %s", got, want)
	}
}

// TestFilterAnd: every condition of both holds; two statuses cannot.
func TestFilterAnd(t *testing.T) {
	parse := func(s string) model.Filter {
		f, verr := model.ParseSegmentFilter(decode(t, s), "filter")
		if verr != nil {
			t.Fatal(verr.Fields)
		}
		return f
	}
	a := parse(`{"status":"active","tags":["b","a"],"attributes":{"plan":"pro"},"created_after":"2026-01-01T00:00:00Z","created_before":"2026-12-01T00:00:00Z"}`)
	b := parse(`{"tags":["a","c"],"not_tags":["x"],"attributes":{"plan":"free","seats":5},"has_attributes":["k"],"created_after":"2026-02-01T00:00:00Z","created_before":"2026-11-01T00:00:00Z"}`)
	got, ok := a.And(b)
	if !ok {
		t.Fatal("And refused compatible filters")
	}
	after := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
	before := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	want := model.Filter{Status: model.StatusActive, Tags: []string{"a", "b", "c"}, NotTags: []string{"x"},
		Attributes:    []model.AttributeCondition{{Key: "plan", Value: "free"}, {Key: "plan", Value: "pro"}, {Key: "seats", Value: "5"}},
		HasAttributes: []string{"k"}, CreatedAfter: &after, CreatedBefore: &before}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("And (-want +got):\n%s", diff)
	}
	if ba, _ := b.And(a); ba.Key() != got.Key() {
		t.Errorf("And is not symmetric: %s / %s", ba.Key(), got.Key())
	}
	// Both conditions on plan must hold: nobody matches.
	created := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	if got.Match(model.StatusActive, created, model.Attributes{"plan": "pro", "seats": "5", "k": 1}, []string{"a", "b", "c"}) {
		t.Error("a subscriber matched plan=pro and plan=free")
	}
	if self, _ := a.And(a); self.Key() != a.Key() {
		t.Errorf("a And a = %s; want %s", self.Key(), a.Key())
	}
	if z, ok := (model.Filter{}).And(model.Filter{}); !ok || !z.IsZero() {
		t.Errorf("{} And {} = %+v, %v", z, ok)
	}
	if _, ok := a.And(parse(`{"status":"pending"}`)); ok {
		t.Error("And combined two statuses")
	}
}

func TestParseSegment(t *testing.T) {
	obj := func(s string) map[string]any { return decode(t, s).(map[string]any) }
	ns, verr := model.ParseNewSegment(obj(`{"name":"  Pro  "}`))
	if verr != nil || ns.Name != "Pro" || !ns.Filter.IsZero() {
		t.Errorf("ParseNewSegment = %+v, %v", ns, verr)
	}
	for _, c := range []struct {
		in   string
		want map[string][]string
	}{
		{`{}`, map[string][]string{"name": {"The name field is required."}}},
		{`{"name":"` + strings.Repeat("x", 101) + `","filter":{"tags":[1]},"x":1}`, map[string][]string{
			"name": {"The name field must not be greater than 100 characters."}, "filter.tags.0": {"The filter.tags.0 field must be a string."},
			"x": {"The x field is prohibited."}}},
	} {
		_, verr := model.ParseNewSegment(obj(c.in))
		if verr == nil {
			t.Fatalf("%s: no error", c.in)
		}
		if diff := cmp.Diff(c.want, verr.Fields); diff != "" {
			t.Errorf("%s (-want +got):\n%s", c.in, diff)
		}
	}
	p, verr := model.ParseSegmentPatch(obj(`{"filter":{}}`))
	if verr != nil || p.Name != nil || p.Filter == nil || !p.Filter.IsZero() {
		t.Errorf("ParseSegmentPatch = %+v, %v", p, verr)
	}
	if _, verr := model.ParseSegmentPatch(obj(`{}`)); verr == nil || !cmp.Equal(verr.Fields, map[string][]string{"body": {model.MsgSegmentPatch}}) {
		t.Errorf("empty patch: %v", verr)
	}
	if model.SegmentNameKey("Straße") != model.SegmentNameKey("STRASSE") || model.SegmentNameKey("a") == model.SegmentNameKey("b") {
		t.Error("SegmentNameKey does not fold case")
	}
}

// TestSegmentNotFoundIsNotFound: a segment's not-found is the stores' usual not-found too, and
// still tells itself apart.
func TestSegmentNotFoundIsNotFound(t *testing.T) {
	err := fmt.Errorf("get: %w", model.ErrSegmentNotFound)
	if !errors.Is(err, model.ErrNotFound) || !errors.Is(err, model.ErrSegmentNotFound) {
		t.Errorf("%v is not both ErrNotFound and ErrSegmentNotFound", err)
	}
	if errors.Is(model.ErrNotFound, model.ErrSegmentNotFound) {
		t.Error("every not-found is a segment's")
	}
}
