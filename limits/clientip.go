package limits

import (
	"net/http"
	"net/netip"
	"strings"
)

// ClientIP returns the address of the client that sent r: the TCP peer, unless the peer is a
// trusted proxy. Then X-Forwarded-For is read from the right (each proxy appends the address
// it received from) and the first hop that is not a trusted proxy is the client; a client can
// prepend anything, but cannot get past the hops the trusted proxies appended. When every hop
// is trusted, the leftmost is returned; a hop that is not an address stops the walk at the
// last good one. The result is invalid only when r.RemoteAddr is not an address.
func ClientIP(r *http.Request, trusted []netip.Prefix) netip.Addr {
	peer := parseHop(r.RemoteAddr)
	if !peer.IsValid() || !isTrusted(peer, trusted) {
		return peer
	}
	client := peer
	values := r.Header.Values("X-Forwarded-For")
	for i := len(values) - 1; i >= 0; i-- {
		hops := strings.Split(values[i], ",")
		for j := len(hops) - 1; j >= 0; j-- {
			hop := parseHop(hops[j])
			if !hop.IsValid() {
				return client
			}
			client = hop
			if !isTrusted(hop, trusted) {
				return client
			}
		}
	}
	return client
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parseHop parses "addr", "addr:port" or "[addr]:port", unmapping IPv4-in-IPv6 and dropping
// IPv6 zones.
func parseHop(s string) netip.Addr {
	s = strings.TrimSpace(s)
	a, err := netip.ParseAddr(s)
	if err != nil {
		ap, perr := netip.ParseAddrPort(s)
		if perr != nil {
			return netip.Addr{}
		}
		a = ap.Addr()
	}
	return a.Unmap().WithZone("")
}
