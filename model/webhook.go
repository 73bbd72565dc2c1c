package model

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"maps"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Webhook endpoint statuses.
const (
	WebhookEnabled  = "enabled"
	WebhookDisabled = "disabled"
)

// Limits of webhook endpoints (docs/api-contract.md §10.3).
const (
	MaxWebhooks      = 20
	MaxWebhookURLLen = 2048
)

// Messages of the webhook endpoint rules (docs/api-contract.md §10.3).
const (
	msgURL            = "The %s field must be a valid URL."
	msgURLScheme      = "The %s field must be an http or https URL."
	msgURLCredentials = "The %s field must not contain a user name or password."
	msgArray          = "The %s field must be an array."
	msgSelectedEvent  = "The selected %s is invalid."
	// MsgWebhookPublicURL refuses a URL on a loopback, private, link-local or unspecified address.
	MsgWebhookPublicURL = "The url must be a public http or https address."
	// MsgWebhookLimit refuses a newsletter's 21st endpoint.
	MsgWebhookLimit = "A newsletter can have at most 20 webhook endpoints."
)

// Webhook is a newsletter's webhook endpoint. Secret is "whsec_" and the base64 of 32 random
// bytes; it is shown once, when the endpoint is made.
type Webhook struct {
	ID           uuid.UUID
	NewsletterID uuid.UUID
	URL          string
	Events       []EventType
	Secret       string
	Status       string
	CreatedAt    time.Time
}

// NewWebhook is a validated request to create an endpoint.
type NewWebhook struct {
	URL    string
	Events []EventType
}

// ParseWebhook validates a create body (decoded JSON): url required, an absolute http or https
// URL of at most MaxWebhookURLLen characters without user or password; events optional
// (absent = every type), each a known type, no repeats; nothing else.
func ParseWebhook(obj map[string]any) (NewWebhook, *ValidationError) {
	var verr *ValidationError
	var out NewWebhook
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		if k != "url" && k != "events" {
			verr = verr.Add(k, fmt.Sprintf(msgProhibited, k))
		}
	}
	switch raw, ok := obj["url"]; {
	case !ok || raw == nil:
		verr = verr.Add("url", fmt.Sprintf(msgRequired, "url"))
	default:
		s, isStr := raw.(string)
		if !isStr {
			verr = verr.Add("url", fmt.Sprintf(msgString, "url"))
			break
		}
		s = strings.TrimSpace(s)
		if msg := checkWebhookURL(s); msg != "" {
			verr = verr.Add("url", msg)
			break
		}
		out.URL = s
	}
	raw, ok := obj["events"]
	if !ok || raw == nil {
		out.Events = append([]EventType(nil), EventTypes...)
		return out, verr
	}
	list, isList := raw.([]any)
	if !isList {
		return out, verr.Add("events", fmt.Sprintf(msgArray, "events"))
	}
	seen := map[EventType]bool{}
	for i, item := range list {
		attr := "events." + strconv.Itoa(i)
		s, _ := item.(string)
		t, known := ParseEventType(s)
		switch {
		case !known:
			verr = verr.Add(attr, fmt.Sprintf(msgSelectedEvent, attr))
		case seen[t]:
			verr = verr.Add(attr, fmt.Sprintf(msgDistinct, attr))
		default:
			seen[t] = true
			out.Events = append(out.Events, t)
		}
	}
	if out.Events == nil {
		out.Events = []EventType{}
	}
	return out, verr
}

// checkWebhookURL says what is wrong with s as a webhook URL, or "".
func checkWebhookURL(s string) string {
	if utf8.RuneCountInString(s) > MaxWebhookURLLen {
		return fmt.Sprintf(msgMax, "url", MaxWebhookURLLen)
	}
	u, err := url.Parse(s)
	// url.Parse takes a raw space in the path or the query; a URL has none (RFC 3986), and
	// which receiver it would reach (%20, +, or a cut) is anyone's guess.
	if err != nil || strings.ContainsRune(s, ' ') || !u.IsAbs() || u.Host == "" || u.Opaque != "" || u.Hostname() == "" {
		return fmt.Sprintf(msgURL, "url")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Sprintf(msgURLScheme, "url")
	}
	if u.User != nil {
		return fmt.Sprintf(msgURLCredentials, "url")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Sprintf(msgURL, "url")
		}
	}
	return ""
}

// PublicAddr reports whether a is an address a webhook may be delivered to: not loopback,
// private (RFC 1918, RFC 4193), link-local, unspecified or multicast, nor in notPublic.
// IPv4-mapped IPv6 addresses, those of the NAT64 well-known prefix and 6to4 addresses are
// judged as the IPv4 address they carry (64:ff9b::7f00:1 reaches 127.0.0.1 through a
// translator, 2002:7f00:1:: through a relay).
func PublicAddr(a netip.Addr) bool {
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

// WebhookBackoff is the delay after each failed delivery attempt (docs/api-contract.md §10.4),
// before jitter: after the last, the delivery fails.
var WebhookBackoff = []time.Duration{
	5 * time.Second, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 5 * time.Hour, 10 * time.Hour, 10 * time.Hour,
}

// WebhookFailingLimit is how long an endpoint's deliveries may all fail before it is disabled.
const WebhookFailingLimit = 5 * 24 * time.Hour

// WebhookSecretPrefix starts every webhook signing secret (the Standard Webhooks convention).
const WebhookSecretPrefix = "whsec_"

// NewWebhookSecret makes a signing secret: WebhookSecretPrefix and the standard base64 of 32
// random bytes.
func NewWebhookSecret() string {
	var b [32]byte
	rand.Read(b[:]) //nolint:errcheck // crypto/rand.Read never fails (Go 1.24+)
	return WebhookSecretPrefix + base64.StdEncoding.EncodeToString(b[:])
}

// Delivery is one event due for delivery to one endpoint.
type Delivery struct {
	EventID     uuid.UUID
	Type        EventType
	Payload     []byte // the event object, sent as the body
	Attempts    int    // attempts already made
	Traceparent string // W3C trace context of the request that caused the event; may be ""
}

// DeliveryBatch is what one claim hands a worker for one endpoint: its due deliveries, oldest
// due first. The endpoint is leased to the worker until it records the outcome.
type DeliveryBatch struct {
	EndpointID uuid.UUID
	URL        string
	Secret     string
	Deliveries []Delivery
}

// Outcomes of a delivery attempt, as recorded and counted in webhook_deliveries_total.
const (
	DeliveryDelivered = "delivered" // a 2xx answer
	DeliveryRetry     = "retry"     // failed; due again after a back-off
	DeliveryFailed    = "failed"    // failed for good: the last attempt, or the endpoint was disabled
	DeliveryReleased  = "released"  // not attempted (shutdown, lease ending, endpoint failing): due again, uncounted
)

// DeliveryResult is the outcome of one delivery of a batch.
type DeliveryResult struct {
	EventID uuid.UUID
	Outcome string        // DeliveryDelivered, DeliveryRetry, DeliveryFailed or DeliveryReleased
	Delay   time.Duration // DeliveryRetry, DeliveryReleased: due again after this
	Status  int           // the receiver's HTTP status; 0 when there was no answer
	Error   string        // what went wrong, for inspection; never the secret
}
