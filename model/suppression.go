package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/google/uuid"
)

// SuppressionReason is why an address is on a newsletter's suppression list
// (docs/api-contract.md §13).
type SuppressionReason string

// The suppression reasons.
const (
	ReasonManual     SuppressionReason = "manual"
	ReasonHardBounce SuppressionReason = "hard_bounce"
	ReasonComplaint  SuppressionReason = "complaint"
	ReasonDeclined   SuppressionReason = "declined"
	ReasonErased     SuppressionReason = "erased"
)

// SuppressionReasons lists every reason, in the order the contract names them.
var SuppressionReasons = []SuppressionReason{ReasonManual, ReasonHardBounce, ReasonComplaint, ReasonDeclined, ReasonErased}

// InputSuppressionReasons lists the reasons a client may give through the API.
var InputSuppressionReasons = []SuppressionReason{ReasonManual, ReasonHardBounce, ReasonComplaint}

// ParseSuppressionReason returns the reason named s, or false when s names none.
func ParseSuppressionReason(s string) (SuppressionReason, bool) {
	for _, r := range SuppressionReasons {
		if string(r) == s {
			return r, true
		}
	}
	return "", false
}

// Kinds of suppression source.
const (
	SuppressionSourceAPI         = "api"
	SuppressionSourceSMTP        = "smtp"
	SuppressionSourceDeclineLink = "decline_link"
	SuppressionSourceErase       = "erase"
)

// MaxSMTPReplyLength is how much of an SMTP reply a hard bounce's source keeps, in characters.
const MaxSMTPReplyLength = 200

// SuppressionSource is what put an address on the list: an API key (by its display prefix),
// the SMTP server's reply, a decline link, or an erasure.
type SuppressionSource struct {
	Kind   string
	APIKey string // SuppressionSourceAPI
	Reply  string // SuppressionSourceSMTP: at most MaxSMTPReplyLength characters
}

// SMTPSuppressionSource is the source of a hard bounce with the server's reply, cut to
// MaxSMTPReplyLength characters.
func SMTPSuppressionSource(reply string) SuppressionSource {
	n := 0
	for i := range reply {
		if n == MaxSMTPReplyLength {
			reply = reply[:i]
			break
		}
		n++
	}
	return SuppressionSource{Kind: SuppressionSourceSMTP, Reply: reply}
}

// MarshalJSON writes the source in the contract's form.
func (s SuppressionSource) MarshalJSON() ([]byte, error) {
	switch s.Kind {
	case SuppressionSourceAPI:
		return json.Marshal(struct {
			Kind   string `json:"kind"`
			APIKey string `json:"api_key"`
		}{s.Kind, s.APIKey})
	case SuppressionSourceSMTP:
		return json.Marshal(struct {
			Kind  string `json:"kind"`
			Reply string `json:"reply"`
		}{s.Kind, s.Reply})
	}
	return json.Marshal(struct {
		Kind string `json:"kind"`
	}{s.Kind})
}

// UnmarshalJSON reads the contract's form.
func (s *SuppressionSource) UnmarshalJSON(b []byte) error {
	var w struct {
		Kind   string `json:"kind"`
		APIKey string `json:"api_key"`
		Reply  string `json:"reply"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*s = SuppressionSource{Kind: w.Kind, APIKey: w.APIKey, Reply: w.Reply}
	return nil
}

// Suppression is one entry of a newsletter's suppression list. Email is "" for an erased
// entry, of which only the hash of the address is kept.
type Suppression struct {
	ID           uuid.UUID
	NewsletterID uuid.UUID
	Email        string
	Reason       SuppressionReason
	Source       SuppressionSource
	CreatedAt    time.Time
}

// NewSuppression is a validated request to suppress an address.
type NewSuppression struct {
	Email  string
	Reason SuppressionReason
	Source SuppressionSource
}

// NormalizeEmail is EmailKey, under the name the suppression code knew it by: the form under
// which a suppression matches an address (docs/api-contract.md §13, §18).
func NormalizeEmail(email string) string { return EmailKey(email) }

// SuppressionQuery selects one page of a newsletter's suppression list (newest first).
type SuppressionQuery struct {
	Limit  int
	Reason SuppressionReason // "" means every reason
	// Email, when set, selects the entry of this address (matched by its normalised form, or
	// by its hash for an erased entry): 0 or 1 entry.
	Email string
	// After, when set, starts the page after this position (a cursor, §9.2).
	After *Position
}

// ErrSuppressionNotFound is an unknown suppression id, or another newsletter's.
var ErrSuppressionNotFound = errors.New("suppression not found")

// ErrEmailSuppressed is returned when an address that would be subscribed is suppressed
// (docs/api-contract.md §13); the error is a *SuppressedError.
var ErrEmailSuppressed = errors.New("email is suppressed")

// SuppressedError reports the suppressed addresses of a write: for a single write, Reasons
// has the one entry at index 0; for a bulk create, the zero-based input positions.
type SuppressedError struct {
	Reasons map[int]SuppressionReason
	// Bulk is set for a bulk create, whose fields are keyed "<index>.email".
	Bulk bool
}

func (e *SuppressedError) Error() string { return ErrEmailSuppressed.Error() }

// Unwrap makes errors.Is(err, ErrEmailSuppressed) hold.
func (e *SuppressedError) Unwrap() error { return ErrEmailSuppressed }

// Suppressed returns the error of one write whose address is suppressed for reason.
func Suppressed(reason SuppressionReason) error {
	return &SuppressedError{Reasons: map[int]SuppressionReason{0: reason}}
}

// Fields are the 422's field messages (docs/api-contract.md §13).
func (e *SuppressedError) Fields() map[string][]string {
	out := make(map[string][]string, len(e.Reasons))
	for i, r := range e.Reasons {
		key := attrEmail
		if e.Bulk {
			key = strconv.Itoa(i) + "." + attrEmail
		}
		out[key] = []string{SuppressedMessage(r)}
	}
	return out
}

// SuppressedMessage is the contract's message for an address suppressed for reason.
func SuppressedMessage(reason SuppressionReason) string {
	return fmt.Sprintf("This address is suppressed (%s) and cannot be subscribed.", reason)
}

// MaxBulkSuppressions is how many entries one bulk suppression may carry.
const MaxBulkSuppressions = 1000

const (
	attrReason        = "reason"
	msgSelectedReason = "The selected %s is invalid; it must be manual, hard_bounce or complaint."
)

// ParseSuppression validates a suppression body: email (the §3 rule), reason (optional,
// default manual, one of InputSuppressionReasons); no other property.
func ParseSuppression(obj map[string]any) (NewSuppression, *ValidationError) {
	ns, _, verr := parseSuppressionItem(obj, "")
	if verr != nil {
		return NewSuppression{}, verr
	}
	return ns, nil
}

// ParseSuppressionBulk validates a bulk suppression body: 1 to MaxBulkSuppressions objects,
// each as ParseSuppression, no two with the same address; keys "<index>.<field>".
func ParseSuppressionBulk(items []any) ([]NewSuppression, *ValidationError) {
	out, verr := parseBulk(items, MaxBulkSuppressions, NormalizeEmail, func(obj map[string]any, prefix string) (NewSuppression, string, bool, *ValidationError) {
		ns, emailOK, verr := parseSuppressionItem(obj, prefix)
		return ns, ns.Email, emailOK, verr
	})
	if verr != nil {
		return nil, verr
	}
	return out, nil
}

func parseSuppressionItem(obj map[string]any, prefix string) (ns NewSuppression, emailOK bool, verr *ValidationError) {
	var unknown []string
	for k := range obj {
		if k != attrEmail && k != attrReason {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		verr = verr.Add(prefix+k, fmt.Sprintf(msgProhibited, prefix+k))
	}
	ns.Reason = ReasonManual
	attr := prefix + attrEmail
	if raw, ok := obj[attrEmail]; ok {
		email, msg := checkEmail(raw, attr)
		if msg != "" {
			verr = verr.Add(attr, msg)
		}
		ns.Email, emailOK = email, msg == ""
	} else {
		verr = verr.Add(attr, fmt.Sprintf(msgRequired, attr))
	}
	if raw, ok := obj[attrReason]; ok {
		s, _ := raw.(string)
		r, known := ParseSuppressionReason(s)
		if !known || !slices.Contains(InputSuppressionReasons, r) {
			verr = verr.Add(prefix+attrReason, fmt.Sprintf(msgSelectedReason, prefix+attrReason))
		}
		ns.Reason = r
	}
	return ns, emailOK, verr
}

// ParseSuppressionQuery validates the list's limit and reason; "" means the default and every
// reason. An invalid value is a *QueryError (400).
func ParseSuppressionQuery(limit, reason string) (SuppressionQuery, error) {
	q := SuppressionQuery{Limit: DefaultLimit}
	if limit != "" {
		n, ok := parseBoundedInt(limit, 1, MaxLimit)
		if !ok {
			return q, &QueryError{msgQueryLimit}
		}
		q.Limit = n
	}
	if reason != "" {
		r, ok := ParseSuppressionReason(reason)
		if !ok {
			return q, &QueryError{msgQueryReason}
		}
		q.Reason = r
	}
	return q, nil
}

const msgQueryReason = "The reason filter must be one of: manual, hard_bounce, complaint, declined, erased."
