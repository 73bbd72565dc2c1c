package webhook

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// ErrPrivateAddress is a webhook URL, or an address dialled for one, that is not public
// (publicAddr, docs/api-contract.md §10.3).
var ErrPrivateAddress = errors.New("webhook address is not public")

// Guard applies the SSRF rule of docs/api-contract.md §10.3. With AllowPrivate
// (WEBHOOK_ALLOW_PRIVATE) it allows every address.
type Guard struct {
	AllowPrivate bool
	// Resolver looks host names up at creation; nil means net.DefaultResolver.
	Resolver *net.Resolver
}

// resolveTimeout bounds the look-up of a URL's host at creation.
const resolveTimeout = 3 * time.Second

// CheckURL refuses, with ErrPrivateAddress, a URL whose host is or resolves to an address that
// is not public. A host that does not resolve now is accepted: the address dialled is checked
// again at every delivery, which is what protects.
func (g Guard) CheckURL(ctx context.Context, raw string) error {
	if g.AllowPrivate {
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return ErrPrivateAddress
	}
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return ErrPrivateAddress
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if !publicAddr(a) {
			return ErrPrivateAddress
		}
		return nil
	}
	if endsInNumber(host) {
		return ErrPrivateAddress
	}
	r := g.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	addrs, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		if !publicAddr(a) {
			return ErrPrivateAddress
		}
	}
	return nil
}

// endsInNumber reports whether host's last label is a number (decimal digits, or 0x and hex
// digits), as in 127.1, 2130706433, 0x7f000001 or 0177.0.0.1: the URL Standard makes such a
// host an IPv4 address, and browsers, curl and the C library's resolver read it as one
// (127.0.0.1, each of these), though netip does not. No domain name ends in a number, so such
// a host is refused rather than left to whichever resolver the process has.
func endsInNumber(host string) bool {
	last := host[strings.LastIndexByte(host, '.')+1:]
	if h, ok := strings.CutPrefix(last, "0x"); ok {
		return strings.Trim(h, "0123456789abcdef") == ""
	}
	return last != "" && strings.Trim(last, "0123456789") == ""
}

// control is the dialer's Control function: it runs after the name is resolved, with the
// address about to be dialled, so a name that resolves to a private address at delivery time
// (DNS rebinding included) is refused like a private URL.
func (g Guard) control(_, address string, _ syscall.RawConn) error {
	if g.AllowPrivate {
		return nil
	}
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return ErrPrivateAddress
	}
	a, err := netip.ParseAddr(host)
	if err != nil || !publicAddr(a) {
		return ErrPrivateAddress
	}
	return nil
}

// publicAddr reports whether a is an address a webhook may be delivered to: not loopback,
// private (RFC 1918, RFC 4193), link-local, unspecified or multicast, nor in notPublic.
// IPv4-mapped IPv6 addresses, those of the NAT64 well-known prefix and 6to4 addresses are
// judged as the IPv4 address they carry (64:ff9b::7f00:1 reaches 127.0.0.1 through a
// translator, 2002:7f00:1:: through a relay).
func publicAddr(a netip.Addr) bool {
	a = a.Unmap()
	switch b := a.As16(); {
	case nat64.Contains(a):
		a = netip.AddrFrom4([4]byte(b[12:]))
	case sixToFour.Contains(a):
		a = netip.AddrFrom4([4]byte(b[2:6]))
	}
	for _, p := range notPublic {
		if p.Contains(a) {
			return false
		}
	}
	return a.IsValid() && !a.IsLoopback() && !a.IsPrivate() && !a.IsLinkLocalUnicast() &&
		!a.IsLinkLocalMulticast() && !a.IsInterfaceLocalMulticast() && !a.IsMulticast() &&
		!a.IsUnspecified()
}

var (
	// nat64 is the NAT64 well-known prefix (RFC 6052); the IPv4 address is the last 4 bytes.
	nat64 = netip.MustParsePrefix("64:ff9b::/96")
	// sixToFour is 6to4 (RFC 3056); the IPv4 address is bytes 2 to 5.
	sixToFour = netip.MustParsePrefix("2002::/16")
	// notPublic are the networks beyond netip's predicates that no public receiver is on: the
	// IANA special-purpose registries' entries that are not globally reachable, or are
	// deprecated forms that reach an embedded IPv4 address we cannot judge.
	notPublic = []netip.Prefix{
		netip.MustParsePrefix("0.0.0.0/8"),       // "this network" (RFC 1122)
		netip.MustParsePrefix("100.64.0.0/10"),   // shared address space: carriers' and clouds' internal networks (RFC 6598)
		netip.MustParsePrefix("192.0.0.0/24"),    // IETF protocol assignments (RFC 6890)
		netip.MustParsePrefix("192.0.2.0/24"),    // documentation (RFC 5737)
		netip.MustParsePrefix("192.88.99.0/24"),  // 6to4 relay anycast, deprecated (RFC 7526)
		netip.MustParsePrefix("198.18.0.0/15"),   // benchmarking (RFC 2544)
		netip.MustParsePrefix("198.51.100.0/24"), // documentation
		netip.MustParsePrefix("203.0.113.0/24"),  // documentation
		netip.MustParsePrefix("240.0.0.0/4"),     // reserved, and the broadcast address 255.255.255.255
		netip.MustParsePrefix("::/96"),           // IPv4-compatible addresses, deprecated (RFC 4291): ::127.0.0.1
		netip.MustParsePrefix("::ffff:0:0:0/96"), // IPv4-translated addresses (RFC 2765): ::ffff:0:7f00:1
		netip.MustParsePrefix("64:ff9b:1::/48"),  // local-use IPv4/IPv6 translation (RFC 8215)
		netip.MustParsePrefix("100::/64"),        // discard-only (RFC 6666)
		netip.MustParsePrefix("2001::/32"),       // Teredo (RFC 4380): its IPv4 address is obfuscated
		netip.MustParsePrefix("2001:2::/48"),     // benchmarking (RFC 5180)
		netip.MustParsePrefix("2001:db8::/32"),   // documentation (RFC 3849)
		netip.MustParsePrefix("3fff::/20"),       // documentation (RFC 9637)
		netip.MustParsePrefix("fec0::/10"),       // site-local, deprecated (RFC 3879)
	}
)
