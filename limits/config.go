package limits

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Defaults of docs/api-contract.md §7, as the environment spells them.
const (
	DefaultRateLimits     = "60/1m,500/1h,3000/24h"
	DefaultBulkRateLimits = "10/1m,100/1h,500/24h"
	DefaultAuthLockout    = "10/10m:15m"
	DefaultWriteLockout   = "30/10m:10m"
	// DefaultConfirmRateLimits is the budget of the confirmation pages per client address: a
	// person confirming spends two (the page, then its form's POST).
	DefaultConfirmRateLimits = "30/1m"
)

// Off is the value that disables a limit or a lockout.
const Off = "off"

// MaxLockoutFailures bounds a lockout's failure count: each subject keeps the times of its
// last failures, up to this many.
const MaxLockoutFailures = 10000

// Window is one rate window: at most Limit requests per Period. It is enforced as a GCRA
// bucket: a burst of Limit, refilled continuously at Limit per Period.
type Window struct {
	Limit  int
	Period time.Duration
}

// String formats w as the environment spells it, e.g. "60/1m0s".
func (w Window) String() string { return strconv.Itoa(w.Limit) + "/" + w.Period.String() }

// emission is the time one request costs, in microseconds: Period/Limit.
func (w Window) emission() int64 { return w.Period.Microseconds() / int64(w.Limit) }

// Lockout is a lockout rule: Failures failures within Window lock the subject for Lock.
// The zero Lockout is off.
type Lockout struct {
	Failures int
	Window   time.Duration
	Lock     time.Duration
}

// Enabled reports whether the rule is on.
func (l Lockout) Enabled() bool { return l.Failures > 0 }

// Config is the whole limits policy. Nil window lists and zero lockouts are off.
type Config struct {
	Rate         []Window // per key, every request
	Bulk         []Window // per key, bulk requests, counted in addition to Rate
	AuthLockout  Lockout  // authentication failures per client IP
	WriteLockout Lockout  // 4xx write responses per key
	Confirm      []Window // per client IP, the confirmation pages (GET and POST /confirm/{token})
}

// ParseWindows parses a list of windows such as "60/1m,500/1h,3000/24h", or "off" (nil).
// name is the variable the value came from; errors start with it.
func ParseWindows(name, value string) ([]Window, error) {
	value = strings.TrimSpace(value)
	if strings.EqualFold(value, Off) {
		return nil, nil
	}
	if value == "" {
		return nil, fmt.Errorf("%s: empty; want windows like %q, or %q", name, DefaultRateLimits, Off)
	}
	var ws []Window
	seen := map[time.Duration]bool{}
	for item := range strings.SplitSeq(value, ",") {
		item = strings.TrimSpace(item)
		n, d, err := parseCount(item)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %v (want windows like %q, or %q)", name, item, err, DefaultRateLimits, Off)
		}
		w := Window{Limit: n, Period: d}
		if w.emission() < 1 {
			return nil, fmt.Errorf("%s: %q: more than one request per microsecond", name, item)
		}
		if seen[d] {
			return nil, fmt.Errorf("%s: two windows of %s", name, d)
		}
		seen[d] = true
		ws = append(ws, w)
	}
	return ws, nil
}

// ParseLockout parses a lockout rule "failures/window:lock" such as "10/10m:15m", or "off"
// (the zero Lockout). name is the variable the value came from; errors start with it.
func ParseLockout(name, value string) (Lockout, error) {
	value = strings.TrimSpace(value)
	if strings.EqualFold(value, Off) {
		return Lockout{}, nil
	}
	bad := func(why string) (Lockout, error) {
		return Lockout{}, fmt.Errorf("%s: %q: %s (want failures/window:lock like %q, or %q)", name, value, why, DefaultAuthLockout, Off)
	}
	count, lock, ok := strings.Cut(value, ":")
	if !ok {
		return bad("no :lock time")
	}
	n, w, err := parseCount(count)
	if err != nil {
		return bad(err.Error())
	}
	if n > MaxLockoutFailures {
		return bad(fmt.Sprintf("more than %d failures", MaxLockoutFailures))
	}
	l, err := parseDuration(lock)
	if err != nil {
		return bad(err.Error())
	}
	return Lockout{Failures: n, Window: w, Lock: l}, nil
}

// ParseTrustedProxies parses a comma-separated list of CIDRs (a bare address means that
// address alone). The empty string trusts no proxy.
func ParseTrustedProxies(value string) ([]netip.Prefix, error) {
	var ps []netip.Prefix
	for item := range strings.SplitSeq(value, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		p, err := netip.ParsePrefix(item)
		if err != nil {
			a, aerr := netip.ParseAddr(item)
			if aerr != nil {
				return nil, fmt.Errorf("TRUSTED_PROXIES: %q is not a CIDR such as 10.0.0.0/8 or an address", item)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		ps = append(ps, p.Masked())
	}
	return ps, nil
}

// parseCount parses "n/duration".
func parseCount(s string) (int, time.Duration, error) {
	ns, ds, ok := strings.Cut(s, "/")
	if !ok {
		return 0, 0, fmt.Errorf("no /")
	}
	n, err := strconv.Atoi(strings.TrimSpace(ns))
	if err != nil || n < 1 {
		return 0, 0, fmt.Errorf("count %q is not a whole number ≥ 1", ns)
	}
	d, err := parseDuration(ds)
	if err != nil {
		return 0, 0, err
	}
	return n, d, nil
}

// parseDuration accepts Go durations ("90s", "10m", "24h") and whole days ("1d").
func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	var d time.Duration
	var err error
	if days, ok := strings.CutSuffix(s, "d"); ok {
		var n int
		n, err = strconv.Atoi(days)
		d = time.Duration(n) * 24 * time.Hour
	} else {
		d, err = time.ParseDuration(s)
	}
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("duration %q is not a positive duration such as 1m, 1h or 24h", s)
	}
	return d, nil
}
