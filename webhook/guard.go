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

	"github.com/subscriberd/subscriberd/model"
)

// ErrPrivateAddress is a webhook URL, or an address dialled for one, that is not public
// (model.PublicAddr, docs/api-contract.md §10.3).
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
		if !model.PublicAddr(a) {
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
		if !model.PublicAddr(a) {
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
	if err != nil || !model.PublicAddr(a) {
		return ErrPrivateAddress
	}
	return nil
}
