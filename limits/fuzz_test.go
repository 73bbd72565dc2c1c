package limits

import (
	"net/http/httptest"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

// FuzzParseWindows: whatever the input, parsing does not panic, and what parses is valid and
// survives a round trip through Window.String.
func FuzzParseWindows(f *testing.F) {
	for _, s := range []string{DefaultRateLimits, DefaultBulkRateLimits, "off", "1/1d", "5/1m,5/1m", "9999999999/1s", "1/-1m", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ws, err := ParseWindows("RATE_LIMITS", s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "RATE_LIMITS: ") {
				t.Fatalf("error %q does not name the variable", err)
			}
			return
		}
		var parts []string
		for _, w := range ws {
			if w.Limit < 1 || w.Period <= 0 || w.emission() < 1 {
				t.Fatalf("ParseWindows(%q) gave an invalid window %+v", s, w)
			}
			parts = append(parts, w.String())
		}
		if len(ws) == 0 {
			return
		}
		again, err := ParseWindows("RATE_LIMITS", strings.Join(parts, ","))
		if err != nil || !reflect.DeepEqual(again, ws) {
			t.Fatalf("round trip of %v: %v, %v", ws, again, err)
		}
	})
}

// FuzzClientIP: the client is the peer unless the peer is trusted, and otherwise an address
// that appears in the request.
func FuzzClientIP(f *testing.F) {
	f.Add("10.0.0.1:80", "1.2.3.4, 10.0.0.2")
	f.Add("203.0.113.1:80", "1.2.3.4")
	f.Add("[fd00::1]:80", "[2001:db8::1]:5, garbage,,")
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	f.Fuzz(func(t *testing.T, remote, xff string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		r.Header.Set("X-Forwarded-For", xff)
		got := ClientIP(r, trusted)
		peer := parseHop(remote)
		if !peer.IsValid() || !isTrusted(peer, trusted) {
			if got != peer {
				t.Fatalf("untrusted peer %q: ClientIP = %v, want the peer", remote, got)
			}
			return
		}
		if got == peer {
			return
		}
		for hop := range strings.SplitSeq(xff, ",") {
			if parseHop(hop) == got {
				return
			}
		}
		t.Fatalf("ClientIP = %v: neither the peer %q nor a hop of %q", got, remote, xff)
	})
}
