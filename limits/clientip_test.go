package limits

import (
	"net/http/httptest"
	"net/netip"
	"testing"
)

func TestClientIP(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	tests := []struct {
		name   string
		remote string
		xff    []string
		want   string
	}{
		{name: "peer, no header", remote: "203.0.113.5:4711", want: "203.0.113.5"},
		{name: "untrusted peer: spoofed header ignored", remote: "203.0.113.5:4711", xff: []string{"1.2.3.4"}, want: "203.0.113.5"},
		{name: "trusted peer, one hop", remote: "10.1.1.1:80", xff: []string{"198.51.100.7"}, want: "198.51.100.7"},
		{name: "trusted peer, spoofed left hops", remote: "10.1.1.1:80", xff: []string{"1.2.3.4, 5.6.7.8, 198.51.100.7"}, want: "198.51.100.7"},
		{name: "chain of trusted proxies", remote: "10.1.1.1:80", xff: []string{"1.2.3.4, 198.51.100.7, 10.9.9.9,10.2.2.2"}, want: "198.51.100.7"},
		{name: "several header lines", remote: "10.1.1.1:80", xff: []string{"1.2.3.4", "198.51.100.7, 10.2.2.2"}, want: "198.51.100.7"},
		{name: "all hops trusted", remote: "10.1.1.1:80", xff: []string{"10.3.3.3, 10.2.2.2"}, want: "10.3.3.3"},
		{name: "trusted peer, no header", remote: "10.1.1.1:80", want: "10.1.1.1"},
		{name: "garbage hop stops at last good", remote: "10.1.1.1:80", xff: []string{"1.2.3.4, nonsense, 10.2.2.2"}, want: "10.2.2.2"},
		{name: "hop with port", remote: "10.1.1.1:80", xff: []string{"198.51.100.7:5555"}, want: "198.51.100.7"},
		{name: "ipv6 peer", remote: "[2001:db8::1]:443", xff: []string{"1.2.3.4"}, want: "2001:db8::1"},
		{name: "ipv6 trusted proxy", remote: "[fd00::1]:443", xff: []string{"[2001:db8::9]:1234"}, want: "2001:db8::9"},
		{name: "mapped ipv4 peer is trusted", remote: "[::ffff:10.1.1.1]:80", xff: []string{"198.51.100.7"}, want: "198.51.100.7"},
		{name: "unparseable peer", remote: "pipe", want: "invalid IP"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tt.remote
			for _, v := range tt.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			if got := ClientIP(r, trusted).String(); got != tt.want {
				t.Errorf("ClientIP(remote %s, X-Forwarded-For %q) = %s, want %s", tt.remote, tt.xff, got, tt.want)
			}
		})
	}
}
