package model

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
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

// WebhookBody is a create body as the API decoded it (docs/api-contract.md §10.3). URL is nil
// when absent or null; Events is nil when absent or null (every type), and an item that is not
// a string is "". URLNotString and EventsNotArray say a value had the wrong JSON type (and
// URL, Events are then nil); Unknown lists the other properties sent.
type WebhookBody struct {
	URL            *string
	Events         []string
	URLNotString   bool
	EventsNotArray bool
	Unknown        []string
}

// ParseWebhook validates a create body: url required, an absolute http or https URL of at most
// MaxWebhookURLLen characters without user or password; events optional (absent = every type),
// each a known type, no repeats; nothing else.
func ParseWebhook(b WebhookBody) (NewWebhook, *ValidationError) {
	var verr *ValidationError
	var out NewWebhook
	for _, k := range slices.Sorted(slices.Values(b.Unknown)) {
		verr = verr.Add(k, fmt.Sprintf(msgProhibited, k))
	}
	switch {
	case b.URLNotString:
		verr = verr.Add("url", fmt.Sprintf(msgString, "url"))
	case b.URL == nil:
		verr = verr.Add("url", fmt.Sprintf(msgRequired, "url"))
	default:
		s := strings.TrimSpace(*b.URL)
		if msg := checkWebhookURL(s); msg != "" {
			verr = verr.Add("url", msg)
			break
		}
		out.URL = s
	}
	switch {
	case b.EventsNotArray:
		return out, verr.Add("events", fmt.Sprintf(msgArray, "events"))
	case b.Events == nil:
		out.Events = append([]EventType(nil), EventTypes...)
		return out, verr
	}
	seen := map[EventType]bool{}
	for i, s := range b.Events {
		attr := "events." + strconv.Itoa(i)
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
	// Bulk is set for a delivery of the bulk lane (caused by an import or a bulk action), which
	// the worker may hand back unstarted for the endpoint's next claim (webhook.Config.BulkTurn).
	Bulk bool
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
