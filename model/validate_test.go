package model_test

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/subscriberd/subscriberd/model"
)

// Messages of docs/api-contract.md §3, written out here rather than taken from the package so that a
// changed wording fails a test.
const (
	msgEmailRequired = "The email field is required."
	msgEmailString   = "The email field must be a string."
	msgEmailInvalid  = "The email field must be a valid email address."
	msgEmailMax      = "The email field must not be greater than 254 characters."
	msgNameString    = "The name field must be a string."
	msgNameMax       = "The name field must not be greater than 255 characters."
	msgNameChars     = "The name field contains invalid characters."
	msgStatus        = "The selected status is invalid; it must be active or pending."
	msgStatusUnsub   = "The selected status is invalid; it must be active or pending. To unsubscribe, send DELETE /api/v1/subscribers/{id}."
)

// emailOfLength builds a valid address of exactly n code points (n ≥ 8) whose characters are
// all two-byte runes (é, ü), so that byte length and code point count differ: local part of
// min(n-6, 64) code points, the rest in domain labels of at most 63, ending in ".de".
func emailOfLength(t *testing.T, n int) string {
	t.Helper()
	localLen := min(n-6, 64)
	rest := n - localLen - 1 - 3 // "@" and ".de"
	var labels []string
	for rest > 0 {
		l := min(rest, 63)
		if rest-l == 1 { // a lone dot would be left over: make this label one shorter
			l--
		}
		labels = append(labels, strings.Repeat("ü", l))
		rest -= l
		if rest > 0 {
			rest-- // the dot before the next label
		}
	}
	email := strings.Repeat("é", localLen) + "@" + strings.Join(labels, ".") + ".de"
	if got := utf8.RuneCountInString(email); got != n {
		t.Fatalf("emailOfLength(%d) built %d code points", n, got)
	}
	if !model.ValidEmail(email) && n <= model.MaxEmailLength {
		t.Fatalf("emailOfLength(%d) built an invalid shape %q", n, email)
	}
	return email
}

func TestEmailOfLengthIsMultiByte(t *testing.T) {
	e := emailOfLength(t, 254)
	if len(e) <= 254*3/2 {
		t.Fatalf("len(emailOfLength(254)) = %d bytes; want well above 254 so bytes ≠ code points", len(e))
	}
}

func TestValidEmail(t *testing.T) {
	tests := []struct {
		name  string
		email string
		want  bool
	}{
		{"plain", "a@example.com", true},
		{"dots in local part", "first.last@example.com", true},
		{"plus tag", "user+tag@example.com", true},
		{"atext specials", "!#$%&'*+/=?^_`{|}~-@example.com", true},
		{"subdomain", "a@mail.eu.example.com", true},
		{"hyphen inside label", "a@my-domain.example", true},
		{"digits in domain", "a@123.example", true},
		{"unicode domain", "a@münchen.de", true},
		{"unicode domain and tld", "用户@例子.广告", true},
		{"unicode local part", "josé@example.com", true},
		{"local part 64", strings.Repeat("a", 64) + "@example.com", true},
		{"local part 65", strings.Repeat("a", 65) + "@example.com", false},
		{"local part 64 code points multi-byte", strings.Repeat("é", 64) + "@example.com", true},
		{"local part 65 code points multi-byte", strings.Repeat("é", 65) + "@example.com", false},
		{"label 63", "a@" + strings.Repeat("b", 63) + ".io", true},
		{"label 64", "a@" + strings.Repeat("b", 64) + ".io", false},
		{"empty", "", false},
		{"no at", "example.com", false},
		{"no local part", "@example.com", false},
		{"no domain", "a@", false},
		{"two at signs", "a@b@example.com", false},
		{"display name", "John Doe <john@example.com>", false},
		{"angle brackets only", "<john@example.com>", false},
		{"space in local part", "john doe@example.com", false},
		{"space in domain", "john@exa mple.com", false},
		{"leading space", " a@example.com", false},
		{"tab", "a\t@example.com", false},
		{"quoted local part", `"john"@example.com`, false},
		{"quoted local part with space", `"john doe"@example.com`, false},
		{"leading dot", ".a@example.com", false},
		{"trailing dot in local part", "a.@example.com", false},
		{"double dot in local part", "a..b@example.com", false},
		{"domain without dot", "a@localhost", false},
		{"domain leading dot", "a@.example.com", false},
		{"domain trailing dot", "a@example.com.", false},
		{"domain double dot", "a@example..com", false},
		{"label leading hyphen", "a@-example.com", false},
		{"label trailing hyphen", "a@example-.com", false},
		{"underscore in domain", "a@ex_ample.com", false},
		{"ip address", "a@127.0.0.1", false},
		{"ip literal", "a@[127.0.0.1]", false},
		{"numeric tld", "a@example.123", false},
		{"ip-like with letters in tld", "a@1.2.3.x4", true},
		{"comment", "a(comment)@example.com", false},
		{"backslash", `a\b@example.com`, false},
		{"comma", "a,b@example.com", false},
		{"two addresses", "a@example.com,b@example.com", false},
		{"newline", "a@example.com\n", false},
		{"nul", "a\x00@example.com", false},
		{"emoji domain", "a@😀.com", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := model.ValidEmail(tt.email); got != tt.want {
				t.Errorf("ValidEmail(%q) = %v; want %v", tt.email, got, tt.want)
			}
		})
	}
}

func TestParseCreate(t *testing.T) {
	email254 := emailOfLength(t, 254)
	email255 := emailOfLength(t, 255)
	name255 := strings.Repeat("ñ", 255) // 510 bytes
	tests := []struct {
		name     string
		in       map[string]any
		want     model.NewSubscriber
		wantErrs map[string][]string
	}{
		{
			name: "email only defaults to active with no name",
			in:   map[string]any{"email": "a@example.com"},
			want: model.NewSubscriber{Email: "a@example.com", Status: model.StatusActive},
		},
		{
			name: "all fields",
			in:   map[string]any{"email": "a@example.com", "name": "John Doe Jr", "status": "pending"},
			want: model.NewSubscriber{Email: "a@example.com", FirstName: "John", LastName: "Doe Jr", Status: model.StatusPending},
		},
		{
			name: "email trimmed",
			in:   map[string]any{"email": " \t a@example.com \n"},
			want: model.NewSubscriber{Email: "a@example.com", Status: model.StatusActive},
		},
		{
			name: "email case kept",
			in:   map[string]any{"email": "John.Doe@Example.COM"},
			want: model.NewSubscriber{Email: "John.Doe@Example.COM", Status: model.StatusActive},
		},
		{
			name: "unicode domain returned exactly",
			in:   map[string]any{"email": "用户@例子.广告"},
			want: model.NewSubscriber{Email: "用户@例子.广告", Status: model.StatusActive},
		},
		{
			name: "email of 254 multi-byte code points",
			in:   map[string]any{"email": email254},
			want: model.NewSubscriber{Email: email254, Status: model.StatusActive},
		},
		{
			name:     "email of 255 multi-byte code points",
			in:       map[string]any{"email": email255},
			wantErrs: map[string][]string{"email": {msgEmailMax}},
		},
		{
			name:     "email over 254 with surrounding spaces counted after trim",
			in:       map[string]any{"email": "  " + email254 + "  "},
			want:     model.NewSubscriber{Email: email254, Status: model.StatusActive},
			wantErrs: nil,
		},
		{
			name:     "email absent",
			in:       map[string]any{"name": "John"},
			wantErrs: map[string][]string{"email": {msgEmailRequired}},
		},
		{
			name:     "email null",
			in:       map[string]any{"email": nil},
			wantErrs: map[string][]string{"email": {msgEmailRequired}},
		},
		{
			name:     "email empty",
			in:       map[string]any{"email": ""},
			wantErrs: map[string][]string{"email": {msgEmailRequired}},
		},
		{
			name:     "email all spaces",
			in:       map[string]any{"email": "   "},
			wantErrs: map[string][]string{"email": {msgEmailRequired}},
		},
		{
			name:     "email number",
			in:       map[string]any{"email": 5.0},
			wantErrs: map[string][]string{"email": {msgEmailString}},
		},
		{
			name:     "email bool",
			in:       map[string]any{"email": true},
			wantErrs: map[string][]string{"email": {msgEmailString}},
		},
		{
			name:     "email array",
			in:       map[string]any{"email": []any{"a@example.com"}},
			wantErrs: map[string][]string{"email": {msgEmailString}},
		},
		{
			name:     "email object",
			in:       map[string]any{"email": map[string]any{}},
			wantErrs: map[string][]string{"email": {msgEmailString}},
		},
		{
			name:     "email invalid",
			in:       map[string]any{"email": "not-an-email"},
			wantErrs: map[string][]string{"email": {msgEmailInvalid}},
		},
		{
			name:     "email with display name",
			in:       map[string]any{"email": "John <john@example.com>"},
			wantErrs: map[string][]string{"email": {msgEmailInvalid}},
		},
		{
			name:     "email local part 65",
			in:       map[string]any{"email": strings.Repeat("a", 65) + "@example.com"},
			wantErrs: map[string][]string{"email": {msgEmailInvalid}},
		},
		{
			name: "name null",
			in:   map[string]any{"email": "a@example.com", "name": nil},
			want: model.NewSubscriber{Email: "a@example.com", Status: model.StatusActive},
		},
		{
			name: "name empty",
			in:   map[string]any{"email": "a@example.com", "name": ""},
			want: model.NewSubscriber{Email: "a@example.com", Status: model.StatusActive},
		},
		{
			name: "name all spaces",
			in:   map[string]any{"email": "a@example.com", "name": "     "},
			want: model.NewSubscriber{Email: "a@example.com", Status: model.StatusActive},
		},
		{
			name: "name single word",
			in:   map[string]any{"email": "a@example.com", "name": "Cher"},
			want: model.NewSubscriber{Email: "a@example.com", FirstName: "Cher", Status: model.StatusActive},
		},
		{
			name: "name surrounding and inner spaces",
			in:   map[string]any{"email": "a@example.com", "name": "  John   Doe  "},
			want: model.NewSubscriber{Email: "a@example.com", FirstName: "John", LastName: "Doe", Status: model.StatusActive},
		},
		{
			name: "name of 255 multi-byte code points",
			in:   map[string]any{"email": "a@example.com", "name": name255},
			want: model.NewSubscriber{Email: "a@example.com", FirstName: name255, Status: model.StatusActive},
		},
		{
			name:     "name of 256 code points",
			in:       map[string]any{"email": "a@example.com", "name": name255 + "x"},
			wantErrs: map[string][]string{"name": {msgNameMax}},
		},
		{
			name:     "name with a C1 control is refused (category Cc, docs/api-contract.md §17)",
			in:       map[string]any{"email": "a@example.com", "name": "Zoë\u0080 O’Brien"},
			wantErrs: map[string][]string{"name": {msgNameChars}},
		},
		{
			name: "name with other non-ASCII characters is accepted",
			in:   map[string]any{"email": "a@example.com", "name": "Zoë O’Brien"},
			want: model.NewSubscriber{Email: "a@example.com", FirstName: "Zoë", LastName: "O’Brien", Status: model.StatusActive},
		},
		{
			name:     "name number",
			in:       map[string]any{"email": "a@example.com", "name": 5.0},
			wantErrs: map[string][]string{"name": {msgNameString}},
		},
		{
			name:     "name bool",
			in:       map[string]any{"email": "a@example.com", "name": false},
			wantErrs: map[string][]string{"name": {msgNameString}},
		},
		{
			name:     "name object",
			in:       map[string]any{"email": "a@example.com", "name": map[string]any{"first": "John"}},
			wantErrs: map[string][]string{"name": {msgNameString}},
		},
		{
			name: "status active",
			in:   map[string]any{"email": "a@example.com", "status": "active"},
			want: model.NewSubscriber{Email: "a@example.com", Status: model.StatusActive},
		},
		{
			name:     "status unsubscribed is not an input status",
			in:       map[string]any{"email": "a@example.com", "status": "unsubscribed"},
			wantErrs: map[string][]string{"status": {msgStatus}},
		},
		{
			name:     "status wrong case",
			in:       map[string]any{"email": "a@example.com", "status": "Active"},
			wantErrs: map[string][]string{"status": {msgStatus}},
		},
		{
			name:     "status empty",
			in:       map[string]any{"email": "a@example.com", "status": ""},
			wantErrs: map[string][]string{"status": {msgStatus}},
		},
		{
			name:     "status null",
			in:       map[string]any{"email": "a@example.com", "status": nil},
			wantErrs: map[string][]string{"status": {msgStatus}},
		},
		{
			name:     "status number",
			in:       map[string]any{"email": "a@example.com", "status": 1.0},
			wantErrs: map[string][]string{"status": {msgStatus}},
		},
		{
			name:     "prohibited property",
			in:       map[string]any{"email": "a@example.com", "first_name": "John"},
			wantErrs: map[string][]string{"first_name": {"The first_name field is prohibited."}},
		},
		{
			name: "several prohibited properties",
			in:   map[string]any{"email": "a@example.com", "id": "x", "created_at": "y", "Email": "z"},
			wantErrs: map[string][]string{
				"id":         {"The id field is prohibited."},
				"created_at": {"The created_at field is prohibited."},
				"Email":      {"The Email field is prohibited."},
			},
		},
		{
			name:     "empty object",
			in:       map[string]any{},
			wantErrs: map[string][]string{"email": {msgEmailRequired}},
		},
		{
			name: "every field fails at once",
			in:   map[string]any{"email": "bad", "name": 1.0, "status": "x", "extra": true},
			wantErrs: map[string][]string{
				"email":  {msgEmailInvalid},
				"name":   {msgNameString},
				"status": {msgStatus},
				"extra":  {"The extra field is prohibited."},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, verr := model.ParseCreate(tt.in)
			if diff := cmp.Diff(tt.wantErrs, fieldsOf(verr)); diff != "" {
				t.Fatalf("ParseCreate(%v) errors mismatch (-want +got):\n%s", tt.in, diff)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseCreate(%v) mismatch (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}

// TestParseCreateNameControlCharacters covers every control character of the contract
// (U+0000–U+001F and U+007F), in every position, including tab and newline.
func TestParseCreateNameControlCharacters(t *testing.T) {
	var controls []rune
	for r := rune(0); r <= 0x1f; r++ {
		controls = append(controls, r)
	}
	controls = append(controls, 0x7f)
	for _, r := range controls {
		for _, name := range []string{string(r), "John" + string(r) + "Doe", string(r) + "John", "John" + string(r)} {
			t.Run(fmt.Sprintf("U+%04X in %q", r, name), func(t *testing.T) {
				_, verr := model.ParseCreate(map[string]any{"email": "a@example.com", "name": name})
				want := map[string][]string{"name": {msgNameChars}}
				if diff := cmp.Diff(want, fieldsOf(verr)); diff != "" {
					t.Errorf("ParseCreate(name %q) errors mismatch (-want +got):\n%s", name, diff)
				}
			})
		}
	}
}

// forbiddenNameChars lists every character of the Unicode categories a name may not hold
// (Cc, Cf, Zl, Zp: docs/api-contract.md §17), read from Go's Unicode tables.
func forbiddenNameChars() []rune {
	var out []rune
	for _, t := range []*unicode.RangeTable{unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp} {
		for _, rg := range t.R16 {
			for r := rune(rg.Lo); r <= rune(rg.Hi); r += rune(rg.Stride) {
				out = append(out, r)
			}
		}
		for _, rg := range t.R32 {
			for r := rune(rg.Lo); r <= rune(rg.Hi); r += rune(rg.Stride) {
				out = append(out, r)
			}
		}
	}
	return out
}

// TestParseNameForbiddenCategories: every character of the categories Cc, Cf, Zl and Zp
// (U+061C, U+FEFF, U+2028 and U+2029 among them) is refused with the message of §3, anywhere
// in the name, in create, bulk and update alike; no other character is refused.
func TestParseNameForbiddenCategories(t *testing.T) {
	refused := forbiddenNameChars()
	for _, must := range []rune{0x00, 0x1f, 0x7f, 0x85, 0xad, 0x061c, 0x200b, 0x202e, 0x2066, 0x2028, 0x2029, 0xfeff, 0xe0001} {
		if !slices.Contains(refused, must) {
			t.Fatalf("U+%04X missing from the table drawn from the Unicode tables", must)
		}
	}
	for _, r := range refused {
		if !model.ForbiddenInName(r) {
			t.Errorf("ForbiddenInName(U+%04X) = false", r)
		}
		for _, name := range []string{string(r), "John" + string(r) + "Doe", string(r) + "John", "John " + string(r)} {
			_, verr := model.ParseCreate(map[string]any{"email": "a@example.com", "name": name})
			if diff := cmp.Diff(map[string][]string{"name": {msgNameChars}}, fieldsOf(verr)); diff != "" {
				t.Errorf("ParseCreate(name %+q) errors mismatch (-want +got):\n%s", name, diff)
			}
			_, verr = model.ParsePatch(map[string]any{"name": name})
			if diff := cmp.Diff(map[string][]string{"name": {msgNameChars}}, fieldsOf(verr)); diff != "" {
				t.Errorf("ParsePatch(name %+q) errors mismatch (-want +got):\n%s", name, diff)
			}
			_, verr = model.ParseBulk([]any{map[string]any{"email": "a@example.com", "name": name}})
			want := map[string][]string{"0.name": {"The 0.name field contains invalid characters."}}
			if diff := cmp.Diff(want, fieldsOf(verr)); diff != "" {
				t.Errorf("ParseBulk(name %+q) errors mismatch (-want +got):\n%s", name, diff)
			}
		}
	}
	// Every other character (surrogates aside, which are not characters) is allowed.
	forbidden := map[rune]bool{}
	for _, r := range refused {
		forbidden[r] = true
	}
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if r >= 0xd800 && r <= 0xdfff {
			continue
		}
		if got := model.ForbiddenInName(r); got != forbidden[r] {
			t.Errorf("ForbiddenInName(U+%04X) = %v; want %v", r, got, forbidden[r])
		}
	}
	// Characters people's names use are accepted.
	for _, r := range []rune{0x200a, 0x2010, 0x202f, 0x2065, 'é', '’', '-', 0x00a0, 'ß', 'ł', '李', 0x0301} {
		name := "Jo" + string(r) + "hn"
		if _, verr := model.ParseCreate(map[string]any{"email": "a@example.com", "name": name}); verr != nil {
			t.Errorf("ParseCreate(name %q) = %v; want accepted", name, fieldsOf(verr))
		}
	}
}

// TestNamePatternMatchesModel: the pattern the document publishes for name refuses exactly
// the characters up to U+FFFF the model refuses, and holds none above (see NamePattern).
func TestNamePatternMatchesModel(t *testing.T) {
	re := regexp.MustCompile(model.NamePattern())
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if r >= 0xd800 && r <= 0xdfff {
			continue
		}
		if got, want := re.MatchString("a"+string(r)+"b"), !model.ForbiddenInName(r) || r > 0xffff; got != want {
			t.Errorf("pattern matches U+%04X = %v; want %v", r, got, want)
		}
	}
}

func TestParseBulk(t *testing.T) {
	ok := func(email string) map[string]any { return map[string]any{"email": email} }
	items := func(n int) []any {
		out := make([]any, n)
		for i := range out {
			out[i] = ok(fmt.Sprintf("user%d@example.com", i))
		}
		return out
	}
	tests := []struct {
		name     string
		in       []any
		want     []model.NewSubscriber
		wantErrs map[string][]string
	}{
		{
			name: "one item",
			in:   []any{ok("a@example.com")},
			want: []model.NewSubscriber{{Email: "a@example.com", Status: model.StatusActive}},
		},
		{
			name: "items keep their order and own status",
			in: []any{
				map[string]any{"email": "b@example.com", "status": "pending", "name": "B B"},
				map[string]any{"email": "a@example.com"},
			},
			want: []model.NewSubscriber{
				{Email: "b@example.com", FirstName: "B", LastName: "B", Status: model.StatusPending},
				{Email: "a@example.com", Status: model.StatusActive},
			},
		},
		{
			name:     "empty array",
			in:       []any{},
			wantErrs: map[string][]string{"body": {"The body field must have at least 1 item."}},
		},
		{
			name:     "nil array",
			in:       nil,
			wantErrs: map[string][]string{"body": {"The body field must have at least 1 item."}},
		},
		{
			name:     "101 items",
			in:       items(101),
			wantErrs: map[string][]string{"body": {"The body field must not have more than 100 items."}},
		},
		{
			name: "field keys carry the zero-based index",
			in: []any{
				ok("a@example.com"),
				ok("b@example.com"),
				map[string]any{"email": "bad", "zzz": 1.0},
				map[string]any{"status": "x"},
			},
			wantErrs: map[string][]string{
				"2.email":  {"The 2.email field must be a valid email address."},
				"2.zzz":    {"The 2.zzz field is prohibited."},
				"3.email":  {"The 3.email field is required."},
				"3.status": {"The selected 3.status is invalid; it must be active or pending."},
			},
		},
		{
			name: "every rule with an index",
			in: []any{
				map[string]any{"email": 5.0, "name": 5.0},
				map[string]any{"email": emailOfLength(t, 255), "name": strings.Repeat("x", 256)},
				map[string]any{"email": "a@example.com", "name": "a\x00b"},
			},
			wantErrs: map[string][]string{
				"0.email": {"The 0.email field must be a string."},
				"0.name":  {"The 0.name field must be a string."},
				"1.email": {"The 1.email field must not be greater than 254 characters."},
				"1.name":  {"The 1.name field must not be greater than 255 characters."},
				"2.name":  {"The 2.name field contains invalid characters."},
			},
		},
		{
			name: "duplicate reported on the later item, case-insensitively and after trimming",
			in:   []any{ok("a@example.com"), ok("b@example.com"), ok(" A@EXAMPLE.com "), ok("B@example.COM")},
			wantErrs: map[string][]string{
				"2.email": {"The 2.email field has a duplicate value."},
				"3.email": {"The 3.email field has a duplicate value."},
			},
		},
		{
			name: "three copies flag the second and third",
			in:   []any{ok("a@example.com"), ok("a@example.com"), ok("a@example.com")},
			wantErrs: map[string][]string{
				"1.email": {"The 1.email field has a duplicate value."},
				"2.email": {"The 2.email field has a duplicate value."},
			},
		},
		{
			name: "non-object items",
			in:   []any{"a@example.com", 5.0, nil, []any{}, ok("a@example.com")},
			wantErrs: map[string][]string{
				"0": {"The 0 field must be an object."},
				"1": {"The 1 field must be an object."},
				"2": {"The 2 field must be an object."},
				"3": {"The 3 field must be an object."},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, verr := model.ParseBulk(tt.in)
			if diff := cmp.Diff(tt.wantErrs, fieldsOf(verr)); diff != "" {
				t.Fatalf("ParseBulk errors mismatch (-want +got):\n%s", diff)
			}
			if verr != nil {
				return // the items of a failed bulk: TestParseBulkKeepsTheEmailsThatPassed
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseBulk mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// A bulk that fails its rules still returns its items, with the email of each whose email
// passed, so that the API can add the ones already taken to the same 422.
func TestParseBulkKeepsTheEmailsThatPassed(t *testing.T) {
	got, verr := model.ParseBulk([]any{
		map[string]any{"email": "a@example.com", "status": "x"},
		map[string]any{"email": "not an address"},
		"not an object",
		map[string]any{"email": "A@example.com"},
	})
	if verr == nil {
		t.Fatal("no error")
	}
	var emails []string
	for _, it := range got {
		emails = append(emails, it.Email)
	}
	if diff := cmp.Diff([]string{"a@example.com", "", "", "A@example.com"}, emails); diff != "" {
		t.Errorf("emails of the failed bulk's items (-want +got):\n%s", diff)
	}
}

func TestParseBulkHundredItems(t *testing.T) {
	in := make([]any, model.MaxBulkItems)
	for i := range in {
		in[i] = map[string]any{"email": fmt.Sprintf("user%d@example.com", i)}
	}
	got, verr := model.ParseBulk(in)
	if verr != nil {
		t.Fatalf("ParseBulk(100 items) = %v; want no error", verr.Fields)
	}
	if len(got) != 100 || got[99].Email != "user99@example.com" {
		t.Errorf("ParseBulk(100 items) returned %d items, last %+v; want 100 in input order", len(got), got[len(got)-1])
	}
}

// TestParseBulkDuplicateOfInvalidItem: docs/api-contract.md §3 reports all failing fields at once, so a later
// item repeating an earlier item's email is a duplicate even when the earlier item fails on
// another field.
func TestParseBulkDuplicateOfInvalidItem(t *testing.T) {
	_, verr := model.ParseBulk([]any{
		map[string]any{"email": "a@example.com", "status": "bogus"},
		map[string]any{"email": "A@example.com"},
	})
	want := map[string][]string{
		"0.status": {"The selected 0.status is invalid; it must be active or pending."},
		"1.email":  {"The 1.email field has a duplicate value."},
	}
	if diff := cmp.Diff(want, fieldsOf(verr)); diff != "" {
		t.Errorf("ParseBulk errors mismatch (-want +got):\n%s", diff)
	}
}

func TestBulkEmailTaken(t *testing.T) {
	got := model.BulkEmailTaken([]int{0, 7})
	want := map[string][]string{
		"0.email": {"Email is already subscribed to this newsletter."},
		"7.email": {"Email is already subscribed to this newsletter."},
	}
	if diff := cmp.Diff(want, fieldsOf(got)); diff != "" {
		t.Errorf("BulkEmailTaken mismatch (-want +got):\n%s", diff)
	}
}

func TestParsePatch(t *testing.T) {
	str := func(s string) *string { return &s }
	st := func(s model.Status) *model.Status { return &s }
	tests := []struct {
		name     string
		in       map[string]any
		want     model.SubscriberPatch
		wantErrs map[string][]string
	}{
		{
			name:     "empty object",
			in:       map[string]any{},
			wantErrs: map[string][]string{"body": {"At least one of email, name, status, attributes or tags must be provided."}},
		},
		{
			name:     "nil object",
			in:       nil,
			wantErrs: map[string][]string{"body": {"At least one of email, name, status, attributes or tags must be provided."}},
		},
		{
			name: "email only, trimmed",
			in:   map[string]any{"email": " New@Example.com "},
			want: model.SubscriberPatch{Email: str("New@Example.com")},
		},
		{
			name: "name null clears",
			in:   map[string]any{"name": nil},
			want: model.SubscriberPatch{Name: str("")},
		},
		{
			name: "name empty clears",
			in:   map[string]any{"name": ""},
			want: model.SubscriberPatch{Name: str("")},
		},
		{
			name: "name trimmed",
			in:   map[string]any{"name": "  Jane  Roe "},
			want: model.SubscriberPatch{Name: str("Jane  Roe")},
		},
		{
			name: "status pending",
			in:   map[string]any{"status": "pending"},
			want: model.SubscriberPatch{Status: st(model.StatusPending)},
		},
		{
			name: "status active",
			in:   map[string]any{"status": "active"},
			want: model.SubscriberPatch{Status: st(model.StatusActive)},
		},
		{
			name: "all fields",
			in:   map[string]any{"email": "a@example.com", "name": "A B", "status": "active"},
			want: model.SubscriberPatch{Email: str("a@example.com"), Name: str("A B"), Status: st(model.StatusActive)},
		},
		{
			name:     "status unsubscribed points to DELETE",
			in:       map[string]any{"status": "unsubscribed"},
			wantErrs: map[string][]string{"status": {msgStatusUnsub}},
		},
		{
			name:     "email null",
			in:       map[string]any{"email": nil},
			wantErrs: map[string][]string{"email": {msgEmailRequired}},
		},
		{
			name:     "email empty",
			in:       map[string]any{"email": ""},
			wantErrs: map[string][]string{"email": {msgEmailRequired}},
		},
		{
			name:     "email invalid",
			in:       map[string]any{"email": "a@b"},
			wantErrs: map[string][]string{"email": {msgEmailInvalid}},
		},
		{
			name:     "email too long",
			in:       map[string]any{"email": emailOfLength(t, 255)},
			wantErrs: map[string][]string{"email": {msgEmailMax}},
		},
		{
			name:     "name control character",
			in:       map[string]any{"name": "a\nb"},
			wantErrs: map[string][]string{"name": {msgNameChars}},
		},
		{
			name:     "name too long",
			in:       map[string]any{"name": strings.Repeat("ß", 256)},
			wantErrs: map[string][]string{"name": {msgNameMax}},
		},
		{
			name:     "only a prohibited property",
			in:       map[string]any{"id": "x"},
			wantErrs: map[string][]string{"id": {"The id field is prohibited."}},
		},
		{
			name: "valid fields are not applied when another fails",
			in:   map[string]any{"email": "a@example.com", "status": "nope", "x": 1.0},
			wantErrs: map[string][]string{
				"status": {msgStatus},
				"x":      {"The x field is prohibited."},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, verr := model.ParsePatch(tt.in)
			if diff := cmp.Diff(tt.wantErrs, fieldsOf(verr)); diff != "" {
				t.Fatalf("ParsePatch(%v) errors mismatch (-want +got):\n%s", tt.in, diff)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParsePatch(%v) mismatch (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}

func TestValidationError(t *testing.T) {
	var verr *model.ValidationError
	verr = verr.Add("name", "n1").Add("email", "e1").Add("email", "e2")
	other := (*model.ValidationError)(nil).Add("0.email", "x")
	verr = verr.Merge(other).Merge(nil)
	want := map[string][]string{"email": {"e1", "e2"}, "name": {"n1"}, "0.email": {"x"}}
	if diff := cmp.Diff(want, verr.Fields); diff != "" {
		t.Errorf("Fields mismatch (-want +got):\n%s", diff)
	}
	if got, want := verr.Error(), "validation failed: 0.email, email, name"; got != want {
		t.Errorf("Error() = %q; want %q", got, want)
	}
	var target *model.ValidationError
	if !errors.As(fmt.Errorf("wrapped: %w", verr), &target) {
		t.Errorf("errors.As(wrapped ValidationError) = false; want true")
	}
}

func TestParseListQuery(t *testing.T) {
	const (
		msgPage    = "The page parameter must be an integer greater than or equal to 1."
		msgPageMax = "The page parameter must not be greater than 9223372036854775807."
		msgLimit   = "The limit parameter must be an integer between 1 and 100."
		msgStatus  = "The status filter must be one of: active, pending, unsubscribed."
	)
	tests := []struct {
		name                string
		page, limit, status string
		want                model.ListQuery
		wantErr             string
	}{
		{name: "defaults", want: model.ListQuery{Page: 1, Limit: 25}},
		{name: "all given", page: "3", limit: "10", status: "pending", want: model.ListQuery{Page: 3, Limit: 10, Status: model.StatusPending}},
		{name: "status unsubscribed", status: "unsubscribed", want: model.ListQuery{Page: 1, Limit: 25, Status: model.StatusUnsubscribed}},
		{name: "status active", status: "active", want: model.ListQuery{Page: 1, Limit: 25, Status: model.StatusActive}},
		{name: "limit 1", limit: "1", want: model.ListQuery{Page: 1, Limit: 1}},
		{name: "limit 100", limit: "100", want: model.ListQuery{Page: 1, Limit: 100}},
		{name: "leading zeros", page: "007", limit: "010", want: model.ListQuery{Page: 7, Limit: 10}},
		{name: "page past int32", page: "2147483648", want: model.ListQuery{Page: 2147483648, Limit: 25}},
		{name: "largest page", page: "9223372036854775807", want: model.ListQuery{Page: math.MaxInt, Limit: 25}},
		{name: "many leading zeros", page: "0000000000000000000001", limit: "000000000000000000100", want: model.ListQuery{Page: 1, Limit: 100}},
		{name: "page 0", page: "0", wantErr: msgPage},
		{name: "page -1", page: "-1", wantErr: msgPage},
		{name: "page abc", page: "abc", wantErr: msgPage},
		{name: "page 1.5", page: "1.5", wantErr: msgPage},
		{name: "page 1.0", page: "1.0", wantErr: msgPage},
		{name: "page +1", page: "+1", wantErr: msgPage},
		{name: "page 1e3", page: "1e3", wantErr: msgPage},
		{name: "page with space", page: " 1", wantErr: msgPage},
		{name: "page 0x10", page: "0x10", wantErr: msgPage},
		{name: "page past int64", page: "9223372036854775808", wantErr: msgPageMax},
		{name: "page huge", page: "99999999999999999999999", wantErr: msgPageMax},
		{name: "page zeros", page: "0000000000000000000000", wantErr: msgPage},
		{name: "page unicode digit", page: "١", wantErr: msgPage},
		{name: "limit 0", limit: "0", wantErr: msgLimit},
		{name: "limit 101", limit: "101", wantErr: msgLimit},
		{name: "limit -5", limit: "-5", wantErr: msgLimit},
		{name: "limit abc", limit: "abc", wantErr: msgLimit},
		{name: "limit huge", limit: "18446744073709551616", wantErr: msgLimit},
		{name: "status invalid", status: "deleted", wantErr: msgStatus},
		{name: "status wrong case", status: "ACTIVE", wantErr: msgStatus},
		{name: "status with space", status: "active ", wantErr: msgStatus},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := model.ParseListQuery(tt.page, tt.limit, tt.status)
			if tt.wantErr != "" {
				var qerr *model.QueryError
				if !errors.As(err, &qerr) {
					t.Fatalf("ParseListQuery(%q, %q, %q) error = %v; want a *model.QueryError", tt.page, tt.limit, tt.status, err)
				}
				if qerr.Message != tt.wantErr || err.Error() != tt.wantErr {
					t.Errorf("ParseListQuery(%q, %q, %q) message = %q; want %q", tt.page, tt.limit, tt.status, qerr.Message, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseListQuery(%q, %q, %q) error = %v; want nil", tt.page, tt.limit, tt.status, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseListQuery(%q, %q, %q) mismatch (-want +got):\n%s", tt.page, tt.limit, tt.status, diff)
			}
		})
	}
}

func TestListQueryOffset(t *testing.T) {
	tests := []struct {
		q    model.ListQuery
		want int
	}{
		{model.ListQuery{Page: 1, Limit: 25}, 0},
		{model.ListQuery{Page: 2, Limit: 25}, 25},
		{model.ListQuery{Page: 4, Limit: 100}, 300},
		{model.ListQuery{Page: math.MaxInt/100 + 1, Limit: 100}, math.MaxInt / 100 * 100},
		{model.ListQuery{Page: math.MaxInt/100 + 2, Limit: 100}, math.MaxInt}, // past any end
		{model.ListQuery{Page: math.MaxInt, Limit: 1}, math.MaxInt - 1},
		{model.ListQuery{Page: math.MaxInt, Limit: 25}, math.MaxInt},
	}
	for _, tt := range tests {
		if got := tt.q.Offset(); got != tt.want {
			t.Errorf("%+v.Offset() = %d; want %d", tt.q, got, tt.want)
		}
	}
}

// fieldsOf returns the field messages of verr, nil when there are none.
func fieldsOf(verr *model.ValidationError) map[string][]string {
	if verr == nil {
		return nil
	}
	return verr.Fields
}
