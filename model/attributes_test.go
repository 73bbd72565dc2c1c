package model_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/subscriberd/subscriberd/model"
)

// decode reads a JSON value as the API decodes bodies: numbers as json.Number.
func decode(t testing.TB, s string) any {
	t.Helper()
	var v any
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %s: %v", s, err)
	}
	return v
}

func fields(verr *model.ValidationError) map[string][]string {
	if verr == nil {
		return nil
	}
	return verr.Fields
}

func TestParseAttributes(t *testing.T) {
	long := strings.Repeat("é", 1000)
	tests := []struct {
		name  string
		field string
		in    string
		want  string // the attributes as JSON, when valid
		errs  map[string][]string
	}{
		{name: "empty", in: `{}`, want: `{}`},
		{name: "values", in: `{"plan":"pro","seats":5,"trial":false,"ratio":0.25}`,
			want: `{"plan":"pro","ratio":0.25,"seats":5,"trial":false}`},
		{name: "numbers canonical", in: `{"a":1E+2,"b":1.50,"c":-0,"d":-0.0,"e":12345678901234567890123,"f":1e-3,"g":0.000}`,
			want: `{"a":100,"b":1.5,"c":0,"d":0,"e":12345678901234567890123,"f":0.001,"g":0}`},
		{name: "1000 characters", in: `{"a":"` + long + `"}`, want: `{"a":"` + long + `"}`},
		{name: "empty string and NaN spelled", in: `{"a":"","b":"NaN","c":"Infinity"}`, want: `{"a":"","b":"NaN","c":"Infinity"}`},
		{name: "not an object", in: `[1]`, errs: map[string][]string{"attributes": {"The attributes field must be an object."}}},
		{name: "null object", in: `null`, errs: map[string][]string{"attributes": {"The attributes field must be an object."}}},
		{name: "null value on create", in: `{"plan":null}`,
			errs: map[string][]string{"attributes.plan": {"The attributes.plan field must be a string, number or boolean."}}},
		{name: "object and array values", in: `{"a":{},"b":[]}`, errs: map[string][]string{
			"attributes.a": {"The attributes.a field must be a string, number or boolean."},
			"attributes.b": {"The attributes.b field must be a string, number or boolean."}}},
		{name: "not finite", in: `{"n":1e400,"m":-1e400}`, errs: map[string][]string{
			"attributes.m": {"The attributes.m field must be a string, number or boolean."},
			"attributes.n": {"The attributes.n field must be a string, number or boolean."}}},
		{name: "too long", in: `{"a":"` + long + `x"}`,
			errs: map[string][]string{"attributes.a": {"The attributes.a field must not be greater than 1000 characters."}}},
		{name: "invalid characters", in: `{"a":"x\u0000","b":"\u200b","c":"a\u2028b","d":"\u202e"}`, errs: map[string][]string{
			"attributes.a": {"The attributes.a field contains invalid characters."},
			"attributes.b": {"The attributes.b field contains invalid characters."},
			"attributes.c": {"The attributes.c field contains invalid characters."},
			"attributes.d": {"The attributes.d field contains invalid characters."}}},
		{name: "invalid keys, once", in: `{"Plan":1,"1a":2,"a-b":3,"":4,"ok":5}`,
			errs: map[string][]string{"attributes": {"The attributes field has an invalid key."}}},
		{name: "key of 64", in: `{"a` + strings.Repeat("b", 63) + `":1}`, want: `{"a` + strings.Repeat("b", 63) + `":1}`},
		{name: "key of 65", in: `{"a` + strings.Repeat("b", 64) + `":1}`,
			errs: map[string][]string{"attributes": {"The attributes field has an invalid key."}}},
		{name: "bulk prefix", field: "2.attributes", in: `{"plan":[],"x y":1}`, errs: map[string][]string{
			"2.attributes":      {"The 2.attributes field has an invalid key."},
			"2.attributes.plan": {"The 2.attributes.plan field must be a string, number or boolean."}}},
		{name: "51 keys", in: manyKeys(51, `1`), errs: map[string][]string{"attributes": {"The attributes field must not have more than 50 keys."}}},
		{name: "50 keys", in: manyKeys(50, `1`), want: manyKeys(50, `1`)},
		{name: "over 8192 bytes", in: manyKeys(9, `"`+strings.Repeat("a", 1000)+`"`),
			errs: map[string][]string{"attributes": {"The attributes field must not be greater than 8192 bytes."}}},
		{name: "escapes count", in: `{"a":"` + strings.Repeat(`\"`, 1000) + `","b":"` + strings.Repeat(`\\`, 1000) + `","c":"` + strings.Repeat(`<`, 1000) + `","d":"` + strings.Repeat("x", 1000) + `","e":"` + strings.Repeat("x", 1000) + `","f":"` + strings.Repeat("x", 1000) + `","g":"` + strings.Repeat("x", 143) + `"}`,
			errs: map[string][]string{"attributes": {"The attributes field must not be greater than 8192 bytes."}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			field := tt.field
			if field == "" {
				field = "attributes"
			}
			got, verr := model.ParseAttributes(decode(t, tt.in), field)
			if diff := cmp.Diff(tt.errs, fields(verr)); diff != "" {
				t.Fatalf("ParseAttributes(%.80s) errors (-want +got):\n%s", tt.in, diff)
			}
			if tt.errs != nil {
				if got != nil {
					t.Errorf("ParseAttributes(%.80s) = %v with errors; want nil", tt.in, got)
				}
				return
			}
			if g := string(got.JSON()); g != tt.want {
				t.Errorf("ParseAttributes(%.80s).JSON() = %.200s; want %.200s", tt.in, g, tt.want)
			}
		})
	}
}

func TestAttributesSizeBoundary(t *testing.T) {
	// {"a":"…"} is 8 bytes around the value: exactly 8192 passes, one more byte fails. Values
	// of at most 1000 characters, so several keys; "é" is two bytes.
	build := func(total int) string {
		// k0..k8 keys of "x" values filling total bytes.
		var b strings.Builder
		b.WriteString("{")
		remaining := total - 2
		for i := 0; remaining > 0; i++ {
			if i > 0 {
				b.WriteString(",")
				remaining--
			}
			key := "k" + string(rune('a'+i))
			overhead := len(`"` + key + `":""`)
			n := min(1000, remaining-overhead)
			b.WriteString(`"` + key + `":"` + strings.Repeat("x", n) + `"`)
			remaining -= overhead + n
		}
		b.WriteString("}")
		return b.String()
	}
	for _, size := range []int{8192, 8193} {
		in := build(size)
		if len(in) != size {
			t.Fatalf("built %d bytes; want %d", len(in), size)
		}
		got, verr := model.ParseAttributes(decode(t, in), "attributes")
		if (verr == nil) != (size <= model.MaxAttributesBytes) {
			t.Errorf("ParseAttributes(%d bytes) error = %v; want an error only over 8192", size, fields(verr))
		}
		if verr == nil && len(got.JSON()) != size {
			t.Errorf("JSON() of %d bytes is %d bytes", size, len(got.JSON()))
		}
	}
}

func manyKeys(n int, value string) string {
	var b strings.Builder
	b.WriteString("{")
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`"k` + strings.Repeat("x", i/26) + string(rune('a'+i%26)) + `":` + value)
	}
	b.WriteString("}")
	// Keys sorted as JSON() sorts them, so the text doubles as the wanted output.
	attrs, _ := model.DecodeAttributes([]byte(b.String()))
	return string(attrs.JSON())
}

func TestCanonicalNumber(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"0", "0", true}, {"-0", "0", true}, {"-0.0", "0", true}, {"0e5", "0", true},
		{"5", "5", true}, {"5.0", "5", true}, {"1.50", "1.5", true}, {"-1.50", "-1.5", true},
		{"1e2", "100", true}, {"1E+2", "100", true}, {"1.5e1", "15", true}, {"15e-1", "1.5", true},
		{"1e-3", "0.001", true}, {"0.001", "0.001", true}, {"123.456e1", "1234.56", true},
		{"12345678901234567890123", "12345678901234567890123", true},
		{"1e308", "1" + strings.Repeat("0", 308), true},
		{"1e309", "", false}, {"1e400", "", false}, {"-1e400", "", false},
		{"1e-400", "0." + strings.Repeat("0", 399) + "1", true},
		{"1e-9999", "", false}, {"1e-99999999999999999999", "", false}, {"1e99999999999999999999", "", false},
		{"", "", false}, {"01", "", false}, {"1.", "", false}, {".5", "", false}, {"+1", "", false},
		{"1e", "", false}, {"NaN", "", false}, {"Infinity", "", false}, {"0x10", "", false}, {"1 ", "", false},
	}
	for _, tt := range tests {
		got, ok := model.CanonicalNumber(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("CanonicalNumber(%q) = %.40q, %v; want %.40q, %v", tt.in, got, ok, tt.want, tt.ok)
		}
		if ok {
			if again, _ := model.CanonicalNumber(got); again != got {
				t.Errorf("CanonicalNumber(%q) = %q is not canonical: %q", tt.in, got, again)
			}
		}
	}
}

func TestParseAttributesPatchAndMerge(t *testing.T) {
	stored := model.Attributes{"plan": "free", "seats": json.Number("5"), "trial": true}
	tests := []struct {
		name     string
		stored   model.Attributes
		patch    string
		want     string
		previous map[string]any
		errs     map[string][]string
	}{
		{name: "empty patch changes nothing", stored: stored, patch: `{}`,
			want: `{"plan":"free","seats":5,"trial":true}`, previous: map[string]any{}},
		{name: "set, remove, keep", stored: stored, patch: `{"plan":"pro","trial":null,"company":"Acme"}`,
			want:     `{"company":"Acme","plan":"pro","seats":5}`,
			previous: map[string]any{"plan": "free", "trial": true, "company": nil}},
		{name: "same values change nothing", stored: stored, patch: `{"plan":"free","seats":5.0,"gone":null}`,
			want: `{"plan":"free","seats":5,"trial":true}`, previous: map[string]any{}},
		{name: "string and number differ", stored: stored, patch: `{"seats":"5"}`,
			want: `{"plan":"free","seats":"5","trial":true}`, previous: map[string]any{"seats": json.Number("5")}},
		{name: "onto nothing", stored: nil, patch: `{"a":1}`, want: `{"a":1}`, previous: map[string]any{"a": nil}},
		{name: "null removes only in a patch", stored: stored, patch: `{"plan":null}`,
			want: `{"seats":5,"trial":true}`, previous: map[string]any{"plan": "free"}},
		{name: "not an object", stored: stored, patch: `"x"`,
			errs: map[string][]string{"attributes": {"The attributes field must be an object."}}},
		{name: "bad value and key", stored: stored, patch: `{"a":[1],"B":null}`, errs: map[string][]string{
			"attributes":   {"The attributes field has an invalid key."},
			"attributes.a": {"The attributes.a field must be a string, number or boolean."}}},
		{name: "51 sets refused at once", stored: nil, patch: manyKeys(51, `1`),
			errs: map[string][]string{"attributes": {"The attributes field must not have more than 50 keys."}}},
		{name: "result over 50 keys", stored: attrsOf(t, manyKeys(49, `1`)), patch: `{"new1":1,"new2":2}`,
			errs: map[string][]string{"attributes": {"The attributes field must not have more than 50 keys."}}},
		{name: "removals make room", stored: attrsOf(t, manyKeys(50, `1`)), patch: `{"ka":null,"new1":1}`},
		{name: "result over 8192 bytes", stored: attrsOf(t, manyKeys(8, `"`+strings.Repeat("a", 1000)+`"`)),
			patch: `{"zz":"` + strings.Repeat("b", 1000) + `"}`,
			errs:  map[string][]string{"attributes": {"The attributes field must not be greater than 8192 bytes."}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := string(tt.stored.JSON())
			p, verr := model.ParseAttributesPatch(decode(t, tt.patch), "attributes")
			var (
				got  model.Attributes
				prev map[string]any
			)
			if verr == nil {
				got, prev, verr = model.MergeAttributes(tt.stored, p, "attributes")
			}
			if diff := cmp.Diff(tt.errs, fields(verr)); diff != "" {
				t.Fatalf("errors (-want +got):\n%s", diff)
			}
			if string(tt.stored.JSON()) != before {
				t.Errorf("MergeAttributes modified stored: %s; was %s", tt.stored.JSON(), before)
			}
			if tt.errs != nil {
				return
			}
			if tt.name == "removals make room" {
				if len(got) != 50 || got["new1"] == nil || got["ka"] != nil {
					t.Errorf("merge = %s; want 50 keys with new1 and without ka", got.JSON())
				}
				return
			}
			if g := string(got.JSON()); g != tt.want {
				t.Errorf("merge = %s; want %s", g, tt.want)
			}
			if diff := cmp.Diff(tt.previous, prev); diff != "" {
				t.Errorf("previous (-want +got):\n%s", diff)
			}
		})
	}
}

func attrsOf(t *testing.T, s string) model.Attributes {
	t.Helper()
	a, verr := model.ParseAttributes(decode(t, s), "attributes")
	if verr != nil {
		t.Fatalf("ParseAttributes(%.60s): %v", s, verr.Fields)
	}
	return a
}

func TestSubscriberAttributeFields(t *testing.T) {
	obj := decode(t, `{"email":"a@x.io","attributes":{"plan":null},"tags":["B","a",1]}`).(map[string]any)
	_, _, verr := model.ParseSubscriberAttributes(obj, "2.")
	want := map[string][]string{
		"2.attributes.plan": {"The 2.attributes.plan field must be a string, number or boolean."},
		"2.tags.2":          {"The 2.tags.2 field must be a string."},
	}
	if diff := cmp.Diff(want, fields(verr)); diff != "" {
		t.Errorf("create fields (-want +got):\n%s", diff)
	}
	attrs, tags, verr := model.ParseSubscriberAttributes(decode(t, `{"email":"a@x.io"}`).(map[string]any), "")
	if verr != nil || attrs != nil || tags != nil {
		t.Errorf("absent = %v, %v, %v; want none", attrs, tags, verr)
	}
	patch, tags, verr := model.ParseSubscriberAttributesPatch(decode(t, `{"attributes":{"plan":null},"tags":[]}`).(map[string]any))
	if verr != nil || len(patch) != 1 || patch["plan"] != nil || tags == nil || len(tags) != 0 {
		t.Errorf("patch = %v, %#v, %v; want plan removed and tags emptied", patch, tags, verr)
	}
	patch, tags, verr = model.ParseSubscriberAttributesPatch(map[string]any{"name": "x"})
	if verr != nil || patch != nil || tags != nil {
		t.Errorf("patch without them = %v, %#v, %v; want nil, nil", patch, tags, verr)
	}
	if model.UpdateEmptyMessage != "At least one of email, name, status, attributes or tags must be provided." {
		t.Errorf("UpdateEmptyMessage = %q", model.UpdateEmptyMessage)
	}
}

func TestDecodeAttributesKeepsNumbers(t *testing.T) {
	// PostgreSQL's jsonb text has spaces after ':' and ','; numbers keep their spelling.
	got, err := model.DecodeAttributes([]byte(`{"a": 12345678901234567890123, "b": "x", "c": true}`))
	if err != nil {
		t.Fatal(err)
	}
	if g := string(got.JSON()); g != `{"a":12345678901234567890123,"b":"x","c":true}` {
		t.Errorf("DecodeAttributes → %s", g)
	}
	if !bytes.Equal(model.Attributes{}.JSON(), []byte(`{}`)) || !bytes.Equal(model.Attributes(nil).JSON(), []byte(`{}`)) {
		t.Errorf("empty JSON = %s", model.Attributes{}.JSON())
	}
}
