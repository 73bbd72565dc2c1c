package api

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

// FuzzLiteralPercents: whatever the query, every part of literalPercents' answer decodes, a
// query without a stray "%" comes back as it was, and only "%" that start no escape change.
func FuzzLiteralPercents(f *testing.F) {
	for _, s := range []string{"", "a=%zz", "%", "a=%4", "a=%41%", "%%41", "email=ann%40example.com%zz&x=%g", "a=b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got := literalPercents(raw)
		for _, part := range strings.Split(got, "&") {
			var esc url.EscapeError
			if _, err := url.QueryUnescape(part); errors.As(err, &esc) {
				t.Fatalf("literalPercents(%q) = %q: %q does not decode: %v", raw, got, part, err)
			}
		}
		if strings.ReplaceAll(got, "%25", "%") != strings.ReplaceAll(raw, "%25", "%") {
			t.Fatalf("literalPercents(%q) = %q: changed more than stray percents", raw, got)
		}
		if _, err := url.ParseQuery(raw); err == nil && got != raw {
			t.Fatalf("literalPercents(%q) = %q: a query that decodes was changed", raw, got)
		}
	})
}
