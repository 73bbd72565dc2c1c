package model_test

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/subscriberd/subscriberd/model"
)

func TestParseFilterQuery(t *testing.T) {
	ten := strings.Split("a,b,c,d,e,f,g,h,i,j", ",")
	after := time.Date(2026, 6, 11, 15, 0, 0, 0, time.FixedZone("", 2*3600))
	tests := []struct {
		name string
		q    model.FilterQuery
		want model.Filter
		msg  string // the 400's message, when invalid
	}{
		{name: "none", q: model.FilterQuery{}, want: model.Filter{}},
		{name: "tags normalised", q: model.FilterQuery{Tag: []string{"Beta", " beta", "VIP"}, NotTag: []string{"X"}},
			want: model.Filter{Tags: []string{"beta", "vip"}, NotTags: []string{"x"}}},
		{name: "attributes and keys", q: model.FilterQuery{Attr: map[string]string{"seats": "5", "plan": "pro", "note": ""}, HasAttr: []string{"b", "a", "a"}},
			want: model.Filter{Attributes: []model.AttributeCondition{{"note", ""}, {"plan", "pro"}, {"seats", "5"}}, HasAttributes: []string{"a", "b"}}},
		{name: "metacharacters are values", q: model.FilterQuery{Tag: []string{`'"\$@%_`}, Attr: map[string]string{"a": `'"\$@%_ $.a ? @ == 1`}},
			want: model.Filter{Tags: []string{`'"\$@%_`}, Attributes: []model.AttributeCondition{{"a", `'"\$@%_ $.a ? @ == 1`}}}},
		{name: "dates with offsets", q: model.FilterQuery{CreatedAfter: "2026-06-11T15:00:00+02:00", CreatedBefore: "2026-06-12T00:00:00.5Z"},
			want: model.Filter{CreatedAfter: &after, CreatedBefore: ptrTime(time.Date(2026, 6, 12, 0, 0, 0, 5e8, time.UTC))}},
		{name: "ten values", q: model.FilterQuery{Tag: ten}, want: model.Filter{Tags: ten}},
		{name: "empty tag", q: model.FilterQuery{Tag: []string{""}}, msg: "The tag filter must be between 1 and 64 characters."},
		{name: "long not_tag", q: model.FilterQuery{NotTag: []string{strings.Repeat("x", 65)}}, msg: "The not_tag filter must be between 1 and 64 characters."},
		{name: "comma in tag", q: model.FilterQuery{Tag: []string{"a,b"}}, msg: "The tag filter contains invalid characters."},
		{name: "eleven tags", q: model.FilterQuery{Tag: append(ten, "k")}, msg: "The tag filter takes at most 10 values."},
		{name: "eleven not_tags", q: model.FilterQuery{NotTag: append(ten, "k")}, msg: "The not_tag filter takes at most 10 values."},
		{name: "bad attr key", q: model.FilterQuery{Attr: map[string]string{"Plan": "x"}}, msg: "The attr filter key must match ^[a-z][a-z0-9_]{0,63}$."},
		{name: "long attr value", q: model.FilterQuery{Attr: map[string]string{"a": strings.Repeat("x", 1001)}}, msg: "The attr filter must not be greater than 1000 characters."},
		{name: "control in attr value", q: model.FilterQuery{Attr: map[string]string{"a": "x\u0000"}}, msg: "The attr filter contains invalid characters."},
		{name: "eleven attrs", q: model.FilterQuery{Attr: func() map[string]string {
			m := map[string]string{}
			for _, k := range append(ten, "k") {
				m[k] = "v"
			}
			return m
		}()}, msg: "The attr filter takes at most 10 values."},
		{name: "bad has_attr", q: model.FilterQuery{HasAttr: []string{"a b"}}, msg: "The has_attr filter key must match ^[a-z][a-z0-9_]{0,63}$."},
		{name: "eleven has_attr", q: model.FilterQuery{HasAttr: append(ten, "k")}, msg: "The has_attr filter takes at most 10 values."},
		{name: "bad created_after", q: model.FilterQuery{CreatedAfter: "2026-06-11"}, msg: "The created_after filter must be an RFC 3339 date-time."},
		{name: "bad created_before", q: model.FilterQuery{CreatedBefore: "yesterday"}, msg: "The created_before filter must be an RFC 3339 date-time."},
		{name: "first problem wins", q: model.FilterQuery{HasAttr: []string{"A"}, Tag: []string{""}}, msg: "The tag filter must be between 1 and 64 characters."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := model.ParseFilterQuery(tt.q)
			var qe *model.QueryError
			switch {
			case tt.msg != "" && (!errors.As(err, &qe) || qe.Message != tt.msg):
				t.Fatalf("ParseFilterQuery(%+v) error = %v; want QueryError %q", tt.q, err, tt.msg)
			case tt.msg == "" && err != nil:
				t.Fatalf("ParseFilterQuery(%+v) error = %v", tt.q, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseFilterQuery(%+v) (-want +got):\n%s", tt.q, diff)
			}
		})
	}
}

func ptrTime(t time.Time) *time.Time { return &t }

func TestParseSegmentFilter(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want model.Filter
		errs map[string][]string
	}{
		{name: "empty selects everyone", in: `{}`, want: model.Filter{}},
		{name: "all parts", in: `{"status":"unsubscribed","tags":["Beta"],"not_tags":["x"],"attributes":{"plan":"pro","seats":5.0,"trial":false},"has_attributes":["company"],"created_after":"2026-01-01T00:00:00Z"}`,
			want: model.Filter{Status: model.StatusUnsubscribed, Tags: []string{"beta"}, NotTags: []string{"x"},
				Attributes:    []model.AttributeCondition{{"plan", "pro"}, {"seats", "5"}, {"trial", "false"}},
				HasAttributes: []string{"company"}, CreatedAfter: ptrTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}},
		{name: "not an object", in: `[]`, errs: map[string][]string{"filter": {"The filter field must be an object."}}},
		{name: "field errors", in: `{"status":"gone","tags":["",3],"not_tags":"x","attributes":{"plan":null,"seats":1e400,"Bad":1,"note":"\u2028"},"has_attributes":["ok","No"],"created_before":5,"created_after":"soon","extra":1}`,
			errs: map[string][]string{
				"filter.status":           {"The selected filter.status is invalid; it must be active, pending or unsubscribed."},
				"filter.tags.0":           {"The filter.tags.0 field must be between 1 and 64 characters."},
				"filter.tags.1":           {"The filter.tags.1 field must be a string."},
				"filter.not_tags":         {"The filter.not_tags field must be an array."},
				"filter.attributes":       {"The filter.attributes field has an invalid key."},
				"filter.attributes.plan":  {"The filter.attributes.plan field must be a string, number or boolean."},
				"filter.attributes.seats": {"The filter.attributes.seats field must be a string, number or boolean."},
				"filter.attributes.note":  {"The filter.attributes.note field contains invalid characters."},
				"filter.has_attributes.1": {"The filter.has_attributes.1 field must match ^[a-z][a-z0-9_]{0,63}$."},
				"filter.created_after":    {"The filter.created_after field must be an RFC 3339 date-time."},
				"filter.created_before":   {"The filter.created_before field must be a string."},
				"filter.extra":            {"The filter.extra field is prohibited."},
			}},
		{name: "too many", in: `{"tags":["a","b","c","d","e","f","g","h","i","j","k"],"attributes":{"a":1,"b":1,"c":1,"d":1,"e":1,"f":1,"g":1,"h":1,"i":1,"j":1,"k":1}}`,
			errs: map[string][]string{
				"filter.tags":       {"The filter.tags field must not have more than 10 items."},
				"filter.attributes": {"The filter.attributes field must not have more than 10 keys."},
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, verr := model.ParseSegmentFilter(decode(t, tt.in), "filter")
			if diff := cmp.Diff(tt.errs, fields(verr)); diff != "" {
				t.Fatalf("ParseSegmentFilter(%s) errors (-want +got):\n%s", tt.in, diff)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseSegmentFilter(%s) (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}

// TestFilterSourcesAgree holds the two entry points to one rule: a segment's filter and the
// query that spells the same conditions give the same Filter (and the same Key).
func TestFilterSourcesAgree(t *testing.T) {
	q, err := model.ParseFilterQuery(model.FilterQuery{Tag: []string{"B", "a"}, NotTag: []string{"c"},
		Attr: map[string]string{"seats": "5", "trial": "true"}, HasAttr: []string{"x"}, CreatedBefore: "2026-01-01T01:00:00+01:00"})
	if err != nil {
		t.Fatal(err)
	}
	s, verr := model.ParseSegmentFilter(decode(t, `{"tags":["a","b"],"not_tags":["C"],"attributes":{"seats":5,"trial":true},"has_attributes":["x"],"created_before":"2026-01-01T00:00:00Z"}`), "filter")
	if verr != nil {
		t.Fatal(verr.Fields)
	}
	if q.Key() != s.Key() {
		t.Errorf("keys differ:\n query   %s\n segment %s", q.Key(), s.Key())
	}
	if got, want := strings.Join(q.Kinds(), ","), "tag,not_tag,attr,has_attr,created_before"; got != want {
		t.Errorf("Kinds = %s; want %s", got, want)
	}
	if !(model.Filter{}).IsZero() || q.IsZero() {
		t.Errorf("IsZero wrong")
	}
}

func TestMatchAttribute(t *testing.T) {
	attrs := model.Attributes{"plan": "pro", "seats": json.Number("5"), "trial": false, "s5": "5", "sfalse": "false",
		"ratio": json.Number("0.25"), "empty": ""}
	tests := []struct {
		key, value string
		want       bool
	}{
		{"plan", "pro", true}, {"plan", "Pro", false}, {"plan", `"pro"`, false},
		{"seats", "5", true}, {"seats", "5.0", false}, {"seats", `"5"`, false},
		{"s5", "5", true}, {"s5", "5.0", false},
		{"trial", "false", true}, {"trial", "False", false}, {"trial", "0", false},
		{"sfalse", "false", true},
		{"ratio", "0.25", true}, {"ratio", ".25", false},
		{"empty", "", true}, {"missing", "", false},
	}
	for _, tt := range tests {
		if got := model.MatchAttribute(attrs, tt.key, tt.value); got != tt.want {
			t.Errorf("MatchAttribute(%s=%q) = %v; want %v", tt.key, tt.value, got, tt.want)
		}
	}
}

// TestAttributeProbesAgree holds the containment probes the SQL uses to MatchAttribute: a
// stored value matches a value exactly when one of its probes is contained in the attributes,
// with jsonb's equality of scalars (type, then string or numeric value).
func TestAttributeProbesAgree(t *testing.T) {
	values := []any{"5", json.Number("5"), "5.0", json.Number("5.5"), "true", true, false, "false", "x", "",
		json.Number("0"), "0", "-0", json.Number("-1.5"), "1e2", json.Number("100"), `"x"`, "null"}
	queries := []string{"5", "5.0", "true", "false", "x", "", "0", "-0", "-1.5", "1e2", "100", `"x"`, "null", "True"}
	rng := rand.New(rand.NewPCG(49, 49))
	for range 200 {
		v := values[rng.IntN(len(values))]
		q := queries[rng.IntN(len(queries))]
		attrs := model.Attributes{"k": v}
		contained := false
		for _, p := range model.AttributeProbes("k", q) {
			probe, err := model.DecodeAttributes(p)
			if err != nil {
				t.Fatalf("probe %s: %v", p, err)
			}
			contained = contained || jsonbScalarEqual(probe["k"], v)
		}
		if want := model.MatchAttribute(attrs, "k", q); contained != want {
			t.Errorf("value %#v, query %q: probes %s contained = %v; MatchAttribute = %v", v, q, model.AttributeProbes("k", q), contained, want)
		}
	}
}

// jsonbScalarEqual is PostgreSQL's equality of two jsonb scalars: same type, and equal
// strings, numerics (by value) or booleans.
func jsonbScalarEqual(a, b any) bool {
	switch a := a.(type) {
	case string:
		b, ok := b.(string)
		return ok && a == b
	case bool:
		b, ok := b.(bool)
		return ok && a == b
	case json.Number:
		b, ok := b.(json.Number)
		if !ok {
			return false
		}
		x, _ := strconv.ParseFloat(string(a), 64)
		y, _ := strconv.ParseFloat(string(b), 64)
		return x == y
	}
	return false
}

func TestFilterMatch(t *testing.T) {
	created := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	attrs := model.Attributes{"plan": "pro", "seats": json.Number("5")}
	tags := []string{"beta", "vip"}
	f := func(s string) model.Filter {
		got, verr := model.ParseSegmentFilter(decode(t, s), "filter")
		if verr != nil {
			t.Fatal(verr.Fields)
		}
		return got
	}
	tests := []struct {
		filter string
		want   bool
	}{
		{`{}`, true},
		{`{"status":"active"}`, true}, {`{"status":"pending"}`, false},
		{`{"tags":["beta","vip"]}`, true}, {`{"tags":["beta","x"]}`, false},
		{`{"not_tags":["x"]}`, true}, {`{"not_tags":["x","vip"]}`, false},
		{`{"attributes":{"plan":"pro","seats":"5"}}`, true}, {`{"attributes":{"plan":"free"}}`, false},
		{`{"has_attributes":["plan"]}`, true}, {`{"has_attributes":["company"]}`, false},
		{`{"created_after":"2026-06-01T11:59:59Z","created_before":"2026-06-01T14:00:01+02:00"}`, true},
		{`{"created_after":"2026-06-01T12:00:00Z"}`, false}, {`{"created_before":"2026-06-01T14:00:00+02:00"}`, false},
	}
	for _, tt := range tests {
		if got := f(tt.filter).Match(model.StatusActive, created, attrs, tags); got != tt.want {
			t.Errorf("%s.Match = %v; want %v", tt.filter, got, tt.want)
		}
	}
}
