package model_test

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/subscriberd/subscriberd/model"
)

// collapseFirstSpace is the name rule of docs/api-contract.md §2 written independently of SplitName: trim,
// then collapse the run of white space after the first space into that one space.
func collapseFirstSpace(s string) string {
	s = strings.TrimSpace(s)
	i := strings.IndexByte(s, ' ')
	if i < 0 {
		return s
	}
	return s[:i] + " " + strings.TrimLeftFunc(s[i:], unicode.IsSpace)
}

func FuzzSplitName(f *testing.F) {
	for _, s := range []string{
		"", " ", "Cher", "John Doe", "John Doe Jr", "  John   Doe  ", "John \t Doe", "\u00a0John\u00a0",
		"John\u3000 Doe", "a  ", "  a", "José María", "\xff \xfe", " \u2028x y",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		first, last := model.SplitName(s)
		if strings.ContainsRune(first, ' ') {
			t.Errorf("SplitName(%q) first = %q; want no space in it", s, first)
		}
		if last != strings.TrimSpace(last) {
			t.Errorf("SplitName(%q) last = %q; want it trimmed", s, last)
		}
		if first == "" && last != "" {
			t.Errorf("SplitName(%q) = %q, %q; want no last name without a first", s, first, last)
		}
		if got, want := model.JoinName(first, last), collapseFirstSpace(s); got != want {
			t.Errorf("JoinName(SplitName(%q)) = %q; want %q", s, got, want)
		}
	})
}

func FuzzParseCreate(f *testing.F) {
	for _, s := range []string{
		`{"email":"a@example.com"}`,
		`{"email":"a@example.com","name":"John Doe","status":"pending"}`,
		`{"email":" A@Example.COM ","name":null}`,
		`{"email":"用户@例子.广告","name":"  Zoë  "}`,
		`{"email":5,"name":true,"status":null,"x":[]}`,
		`{"email":"a@127.0.0.1","name":"a\u0000b"}`,
		`{"email":"a@example.com","name":"evil\u202egnp.exe"}`,
		`{"email":"a@example.com","name":"in\u200bvisible \u2066x\u2069"}`,
		`{"email":"\"q\"@x.io","status":"unsubscribed"}`,
		`{}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var obj map[string]any
		if json.Unmarshal(body, &obj) != nil {
			return
		}
		ns, verr := model.ParseCreate(obj)
		if verr != nil {
			if len(verr.Fields) == 0 {
				t.Fatalf("ParseCreate(%s) returned an error with no fields", body)
			}
			for k, msgs := range verr.Fields {
				if len(msgs) == 0 || slices.Contains(msgs, "") {
					t.Errorf("ParseCreate(%s) field %q messages = %q; want non-empty", body, k, msgs)
				}
			}
			if !reflect.DeepEqual(ns, model.NewSubscriber{}) {
				t.Errorf("ParseCreate(%s) = %+v with an error; want the zero value", body, ns)
			}
			return
		}
		if !model.ValidEmail(ns.Email) || utf8.RuneCountInString(ns.Email) > model.MaxEmailLength {
			t.Errorf("ParseCreate(%s) accepted email %q", body, ns.Email)
		}
		if ns.Email != strings.TrimSpace(ns.Email) {
			t.Errorf("ParseCreate(%s) email %q not trimmed", body, ns.Email)
		}
		if !slices.Contains(model.InputStatuses, ns.Status) {
			t.Errorf("ParseCreate(%s) status = %q; want an input status", body, ns.Status)
		}
		name := model.JoinName(ns.FirstName, ns.LastName)
		if utf8.RuneCountInString(name) > model.MaxNameLength {
			t.Errorf("ParseCreate(%s) accepted a name of %d code points", body, utf8.RuneCountInString(name))
		}
		if strings.ContainsFunc(name, func(r rune) bool {
			return r < 0x20 || r == 0x7f || r >= 0x200b && r <= 0x200f || r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069
		}) {
			t.Errorf("ParseCreate(%s) accepted name %q with a control, format or bidi character", body, name)
		}
		for k := range obj {
			if !slices.Contains(model.InputFields, k) {
				t.Errorf("ParseCreate(%s) accepted property %q", body, k)
			}
		}
	})
}

func FuzzParseListQuery(f *testing.F) {
	f.Add("", "", "")
	f.Add("1", "25", "active")
	f.Add("0", "101", "x")
	f.Add("+1", "1.5", "ACTIVE")
	f.Add("99999999999", "-1", " ")
	f.Fuzz(func(t *testing.T, page, limit, status string) {
		q, err := model.ParseListQuery(page, limit, status)
		if err != nil {
			if !reflect.DeepEqual(q, model.ListQuery{}) {
				t.Errorf("ParseListQuery(%q, %q, %q) = %+v with an error; want the zero value", page, limit, status, q)
			}
			return
		}
		if q.Page < 1 || q.Limit < 1 || q.Limit > model.MaxLimit || q.Offset() < 0 {
			t.Errorf("ParseListQuery(%q, %q, %q) = %+v; out of bounds", page, limit, status, q)
		}
		if status != "" && string(q.Status) != status {
			t.Errorf("ParseListQuery(%q, %q, %q) status = %q", page, limit, status, q.Status)
		}
	})
}

// FuzzValidIdempotencyKey checks the header rule of docs/api-contract.md §8 against its
// definition: 1 to 255 bytes, each a visible ASCII character.
func FuzzValidIdempotencyKey(f *testing.F) {
	for _, s := range []string{"", "a", "5f1c7a9e-3b1d-4c55-9d0e-2a6f4b8c1d2e", "a b", "tab\t", "é", "\x7f", "!~",
		strings.Repeat("k", 255), strings.Repeat("k", 256), "\x00", "key\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want := len(s) >= 1 && len(s) <= 255 && strings.IndexFunc(s, func(r rune) bool { return r < '!' || r > '~' }) < 0
		if got := model.ValidIdempotencyKey(s); got != want {
			t.Fatalf("ValidIdempotencyKey(%q) = %v; want %v", s, got, want)
		}
	})
}
