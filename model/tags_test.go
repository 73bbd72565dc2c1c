package model_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/subscriberd/subscriberd/model"
)

func TestParseTags(t *testing.T) {
	many := func(n int) string {
		items := make([]string, n)
		for i := range items {
			items[i] = `"t` + strconv.Itoa(i) + `"`
		}
		return "[" + strings.Join(items, ",") + "]"
	}
	tests := []struct {
		name, field, in string
		want            []string
		errs            map[string][]string
	}{
		{name: "empty", in: `[]`, want: []string{}},
		{name: "normalised, deduplicated, sorted by code point", in: `[" Beta ","beta","VIP","Äpfel","a\u0308pfel","zebra","Zebra","éa"]`,
			want: []string{"beta", "vip", "zebra", "äpfel", "éa"}},
		{name: "64 characters", in: `["` + strings.Repeat("ж", 64) + `"]`, want: []string{strings.Repeat("ж", 64)}},
		{name: "not an array", in: `"beta"`, errs: map[string][]string{"tags": {"The tags field must be an array."}}},
		{name: "null", in: `null`, errs: map[string][]string{"tags": {"The tags field must be an array."}}},
		{name: "items", in: `[1,"","  ","` + strings.Repeat("x", 65) + `","a,b","a\u0000","\u200bx","ok",null]`, errs: map[string][]string{
			"tags.0": {"The tags.0 field must be a string."},
			"tags.1": {"The tags.1 field must be between 1 and 64 characters."},
			"tags.2": {"The tags.2 field must be between 1 and 64 characters."},
			"tags.3": {"The tags.3 field must be between 1 and 64 characters."},
			"tags.4": {"The tags.4 field contains invalid characters."},
			"tags.5": {"The tags.5 field contains invalid characters."},
			"tags.6": {"The tags.6 field contains invalid characters."},
			"tags.8": {"The tags.8 field must be a string."}}},
		{name: "bulk prefix", field: "2.tags", in: `[5]`, errs: map[string][]string{"2.tags.0": {"The 2.tags.0 field must be a string."}}},
		{name: "100 tags", in: many(100), want: sortedTags(100)},
		{name: "101 tags", in: many(101), errs: map[string][]string{"tags": {"The tags field must not have more than 100 items."}}},
		{name: "101 items, 100 tags", in: strings.Replace(many(101), `"t100"`, `"T0"`, 1), want: sortedTags(100)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			field := tt.field
			if field == "" {
				field = "tags"
			}
			got, verr := model.ParseTags(decode(t, tt.in), field)
			if diff := cmp.Diff(tt.errs, fields(verr)); diff != "" {
				t.Fatalf("ParseTags(%.80s) errors (-want +got):\n%s", tt.in, diff)
			}
			if diff := cmp.Diff(tt.want, got); tt.errs == nil && diff != "" {
				t.Errorf("ParseTags(%.80s) (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}

func sortedTags(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "t" + strconv.Itoa(i)
	}
	return model.SortTags(out)
}

func TestNormalizeTag(t *testing.T) {
	for in, want := range map[string]string{
		" Beta ":       "beta",
		"A\u030a":      "å", // NFD → NFC after lower-casing
		"ÅNGSTRÖM":     "ångström",
		"\u212b":       "å", // the Angstrom sign's NFC is U+00C5, lower-cased
		"İ":            "i", // simple case mapping, as strings.ToLower
		"webinar-2026": "webinar-2026",
	} {
		if got := model.NormalizeTag(in); got != want {
			t.Errorf("NormalizeTag(%q) = %q; want %q", in, got, want)
		}
	}
}

func TestParseTagsChange(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want model.TagsChange
		errs map[string][]string
	}{
		{name: "add", in: `{"add":["B","a","b"]}`, want: model.TagsChange{Add: []string{"a", "b"}}},
		{name: "remove", in: `{"remove":["X"]}`, want: model.TagsChange{Remove: []string{"x"}}},
		{name: "both", in: `{"add":["a"],"remove":["b"]}`, want: model.TagsChange{Add: []string{"a"}, Remove: []string{"b"}}},
		{name: "empty lists", in: `{"add":[],"remove":[]}`, want: model.TagsChange{Add: []string{}, Remove: []string{}}},
		{name: "neither", in: `{}`, errs: map[string][]string{"body": {"At least one of add or remove must be provided."}}},
		{name: "unknown only", in: `{"tags":["a"]}`, errs: map[string][]string{
			"body": {"At least one of add or remove must be provided."},
			"tags": {"The tags field is prohibited."}}},
		{name: "in both lists", in: `{"add":["Beta","c"],"remove":["x"," beta","c"]}`, errs: map[string][]string{
			"remove.1": {"The remove.1 field must not also be added."},
			"remove.2": {"The remove.2 field must not also be added."}}},
		{name: "item rules", in: `{"add":[1,""],"remove":"x"}`, errs: map[string][]string{
			"add.0":  {"The add.0 field must be a string."},
			"add.1":  {"The add.1 field must be between 1 and 64 characters."},
			"remove": {"The remove field must be an array."}}},
		{name: "null list", in: `{"add":null}`, errs: map[string][]string{"add": {"The add field must be an array."}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, verr := model.ParseTagsChange(decode(t, tt.in).(map[string]any))
			if diff := cmp.Diff(tt.errs, fields(verr)); diff != "" {
				t.Fatalf("ParseTagsChange(%s) errors (-want +got):\n%s", tt.in, diff)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseTagsChange(%s) (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}

// TestCheckTagCount: a set is refused past model.MaxTags with the error TagsChange.Apply gives.
func TestCheckTagCount(t *testing.T) {
	for _, tt := range []struct {
		n    int
		errs map[string][]string
	}{
		{n: 0},
		{n: model.MaxTags},
		{n: model.MaxTags + 1, errs: map[string][]string{"tags": {"The tags field must not have more than 100 items."}}},
		{n: 250, errs: map[string][]string{"tags": {"The tags field must not have more than 100 items."}}},
	} {
		if diff := cmp.Diff(tt.errs, fields(model.CheckTagCount(tt.n))); diff != "" {
			t.Errorf("CheckTagCount(%d) errors (-want +got):\n%s", tt.n, diff)
		}
	}
}

func TestTagsChangeApply(t *testing.T) {
	tests := []struct {
		name    string
		stored  []string
		change  model.TagsChange
		want    []string
		changed bool
		errs    map[string][]string
	}{
		{name: "add to nothing", change: model.TagsChange{Add: []string{"a"}}, want: []string{"a"}, changed: true},
		{name: "add present", stored: []string{"a"}, change: model.TagsChange{Add: []string{"a"}}, want: []string{"a"}},
		{name: "remove absent", stored: []string{"a"}, change: model.TagsChange{Remove: []string{"b"}}, want: []string{"a"}},
		{name: "add and remove", stored: []string{"a", "c"}, change: model.TagsChange{Add: []string{"b"}, Remove: []string{"c"}},
			want: []string{"a", "b"}, changed: true},
		{name: "exactly 100", stored: sortedTags(99), change: model.TagsChange{Add: []string{"zz"}}, want: append(sortedTags(99), "zz"), changed: true},
		{name: "past 100", stored: sortedTags(100), change: model.TagsChange{Add: []string{"zz"}},
			errs: map[string][]string{"tags": {"The tags field must not have more than 100 items."}}},
		{name: "past 100 with room made", stored: sortedTags(100), change: model.TagsChange{Add: []string{"zz"}, Remove: []string{"t0"}},
			want: append(sortedTags(100)[1:], "zz"), changed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, changed, verr := tt.change.Apply(tt.stored)
			if diff := cmp.Diff(tt.errs, fields(verr)); diff != "" {
				t.Fatalf("errors (-want +got):\n%s", diff)
			}
			if tt.errs != nil {
				return
			}
			if diff := cmp.Diff(tt.want, got); diff != "" || changed != tt.changed {
				t.Errorf("Apply = %v, %v; want %v, %v", got, changed, tt.want, tt.changed)
			}
		})
	}
}
