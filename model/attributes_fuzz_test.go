package model_test

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/subscriberd/subscriberd/model"
)

// FuzzParseAttributes feeds the attribute validator any JSON (deep, huge, odd numbers, NaN
// spelled in strings) on create and as a patch. It must never panic, must answer every
// refusal with field messages under attributes, and must accept only what §19.1 allows:
// valid keys, at most 50, strings of at most 1,000 characters with nothing forbidden, finite
// numbers in canonical spelling, booleans, at most 8,192 bytes.
func FuzzParseAttributes(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"plan":"pro","seats":5,"trial":false}`, `{"n":1e400}`, `{"n":-0}`, `{"n":-0.0e-0}`,
		`{"n":1e-400}`, `{"n":1E+308}`, `{"n":12345678901234567890123456789}`, `{"s":"NaN","t":"Infinity","u":"-Infinity"}`,
		`{"a":null}`, `{"a":{"b":{"c":[1,[2,[3]]]}}}`, `{"A":1,"_a":2,"a-b":3}`, `{"a":"\u202e\u0000"}`,
		`[1,2]`, `"x"`, `null`, `5`, `{"a":"` + strings.Repeat("x", 1001) + `"}`, manyKeys(51, `1`),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var raw any
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		if dec.Decode(&raw) != nil {
			return
		}
		got, verr := model.ParseAttributes(raw, "attributes")
		checkAttributesOutcome(t, body, got, verr)
		patch, perr := model.ParseAttributesPatch(raw, "attributes")
		if perr != nil {
			checkAttributesOutcome(t, body, nil, perr)
			return
		}
		merged, _, merr := model.MergeAttributes(nil, patch, "attributes")
		checkAttributesOutcome(t, body, merged, merr)
		if verr == nil && merr == nil && !bytes.Equal(got.JSON(), merged.JSON()) {
			t.Errorf("%s: create %s, patch onto nothing %s; want the same", body, got.JSON(), merged.JSON())
		}
	})
}

func checkAttributesOutcome(t *testing.T, body []byte, got model.Attributes, verr *model.ValidationError) {
	t.Helper()
	if verr != nil {
		if got != nil {
			t.Errorf("%.100s: attributes %v with an error", body, got)
		}
		if len(verr.Fields) == 0 || len(verr.Fields) > model.MaxAttributes+1 {
			t.Errorf("%.100s: %d error keys; want 1 to 51", body, len(verr.Fields))
		}
		for k, msgs := range verr.Fields {
			if k != "attributes" && !strings.HasPrefix(k, "attributes.") || len(msgs) != 1 || msgs[0] == "" {
				t.Errorf("%.100s: error %q: %q", body, k, msgs)
			}
		}
		return
	}
	if len(got) > model.MaxAttributes {
		t.Errorf("%.100s: accepted %d keys", body, len(got))
	}
	js := got.JSON()
	if len(js) > model.MaxAttributesBytes {
		t.Errorf("%.100s: accepted %d bytes", body, len(js))
	}
	for k, v := range got {
		if !model.ValidAttributeKey(k) {
			t.Errorf("%.100s: accepted key %q", body, k)
		}
		switch v := v.(type) {
		case string:
			if utf8.RuneCountInString(v) > model.MaxAttributeValueLength || strings.IndexFunc(v, model.ForbiddenInName) >= 0 {
				t.Errorf("%.100s: accepted value %q", body, v)
			}
		case bool:
		case json.Number:
			if c, ok := model.CanonicalNumber(string(v)); !ok || c != string(v) {
				t.Errorf("%.100s: accepted number %s, not canonical", body, v)
			}
			if f, err := strconv.ParseFloat(string(v), 64); err != nil {
				t.Errorf("%.100s: accepted number %s that is not a finite double: %v (%v)", body, v, f, err)
			}
		default:
			t.Errorf("%.100s: accepted value %#v", body, v)
		}
	}
	back, err := model.DecodeAttributes(js)
	if err != nil || !bytes.Equal(back.JSON(), js) {
		t.Errorf("%.100s: JSON %s does not read back (%v)", body, js, err)
	}
}

// TestParseAttributesHostile runs the validator over the bodies the issue names: a 1 MiB
// object, 10,000 keys, a deep one, huge numbers. Each is refused with a handful of messages,
// not one per key, and without expanding a number's exponent.
func TestParseAttributesHostile(t *testing.T) {
	var tenK strings.Builder
	tenK.WriteString("{")
	for i := range 10000 {
		if i > 0 {
			tenK.WriteString(",")
		}
		tenK.WriteString(`"k` + strconv.Itoa(i) + `":{"x":[1e400]}`)
	}
	tenK.WriteString("}")
	deep := `{"a":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `}`
	tests := []struct {
		name, body string
		maxKeys    int
	}{
		{"10,000 keys", tenK.String(), 1},
		{"1 MiB value", `{"a":"` + strings.Repeat("é", 1<<19) + `"}`, 1},
		{"deep", deep, 1},
		{"exponents", `{"a":1e999999999999999999,"b":1e-999999999999999999,"c":` + strings.Repeat("9", 400) + `,"d":0.` + strings.Repeat("0", 9000) + `1}`, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw := decode(t, tt.body)
			_, verr := model.ParseAttributes(raw, "attributes")
			if verr == nil || len(verr.Fields) > tt.maxKeys {
				t.Errorf("ParseAttributes(%s) = %v; want refused with at most %d keys", tt.name, fields(verr), tt.maxKeys)
			}
			_, perr := model.ParseAttributesPatch(raw, "attributes")
			if perr == nil || len(perr.Fields) > tt.maxKeys {
				t.Errorf("ParseAttributesPatch(%s) = %v; want refused with at most %d keys", tt.name, fields(perr), tt.maxKeys)
			}
		})
	}
}

// BenchmarkParseAttributes shows the validator's cost grows with its input linearly: the
// time per key of a 50-key object, and of 1,000 and 10,000 removals in a patch.
func BenchmarkParseAttributes(b *testing.B) {
	for _, n := range []int{50, 1000, 10000} {
		var s strings.Builder
		s.WriteString("{")
		for i := range n {
			if i > 0 {
				s.WriteString(",")
			}
			v := `"value ` + strconv.Itoa(i) + `"`
			if n > model.MaxAttributes {
				v = "null"
			}
			s.WriteString(`"k` + strconv.Itoa(i) + `":` + v)
		}
		s.WriteString("}")
		raw := decode(b, s.String())
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			for b.Loop() {
				if _, verr := model.ParseAttributesPatch(raw, "attributes"); verr != nil {
					b.Fatal(verr.Fields)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/key")
		})
	}
}
