// Package model holds the domain of subscriberd: subscribers, their statuses, the name rule,
// the input validation rules of the contract and the sentinel errors every layer shares.
// It is pure Go: it imports no project package and no framework.
package model

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Status is a subscriber's state.
type Status string

// The subscriber states.
const (
	StatusActive       Status = "active"
	StatusPending      Status = "pending"
	StatusUnsubscribed Status = "unsubscribed"
)

// Statuses lists every state, in the order the contract names them.
var Statuses = []Status{StatusActive, StatusPending, StatusUnsubscribed}

// InputStatuses lists the states a client may ask for on create or update.
var InputStatuses = []Status{StatusActive, StatusPending}

// ParseStatus returns the Status named s, or false when s names none.
func ParseStatus(s string) (Status, bool) {
	for _, st := range Statuses {
		if string(st) == s {
			return st, true
		}
	}
	return "", false
}

// Subscriber is one subscriber of one newsletter.
type Subscriber struct {
	ID           uuid.UUID
	NewsletterID uuid.UUID
	Email        string
	FirstName    string
	LastName     string
	Status       Status
	CreatedAt    time.Time
	UpdatedAt    time.Time
}

// Name joins the stored first and last name the way the contract returns it.
func (s Subscriber) Name() string { return JoinName(s.FirstName, s.LastName) }

// Newsletter is the tenant that owns subscribers and API keys.
type Newsletter struct {
	ID        uuid.UUID
	Name      string
	APIAccess bool
	CreatedAt time.Time
}

// APIKey is a stored API key: never the key itself, only its hash and a display prefix.
type APIKey struct {
	ID           uuid.UUID
	NewsletterID uuid.UUID
	Prefix       string
	Hash         []byte
	Label        string
	CreatedAt    time.Time
	RevokedAt    *time.Time
	Scope        Scope
	// ExpiresAt is when a rotated key stops working (docs/api-contract.md §16.2); nil for a
	// key that was never rotated.
	ExpiresAt *time.Time
	// LastUsedAt is when the key last authenticated a request, to the minute; nil if never.
	LastUsedAt *time.Time
}

// Principal is what a verified API key grants: the newsletter it acts for.
type Principal struct {
	KeyID        uuid.UUID
	KeyPrefix    string // the key's display prefix, the source of the changes it makes
	NewsletterID uuid.UUID
	APIAccess    bool
	Scope        Scope
	// ExpiresAt, when not zero, is when the key stops working (a rotated key's grace ends).
	ExpiresAt time.Time
}

// SplitName applies the storage rule: trim, then split at the first space into first and last
// name, the last with its own leading spaces trimmed. "John Doe Jr" → "John", "Doe Jr".
func SplitName(name string) (first, last string) {
	name = strings.TrimSpace(name)
	first, last, _ = strings.Cut(name, " ")
	return first, strings.TrimSpace(last)
}

// JoinName is the inverse of SplitName as the contract returns it: first + " " + last, trimmed.
func JoinName(first, last string) string {
	return strings.TrimSpace(first + " " + last)
}

// NewSubscriber is a validated request to create one subscriber.
type NewSubscriber struct {
	Email     string
	FirstName string
	LastName  string
	Status    Status
}

// SubscriberPatch is a validated update; nil fields keep their stored values.
type SubscriberPatch struct {
	Email  *string
	Name   *string // already trimmed; "" clears the name
	Status *Status
}

// ListQuery selects one page of a newsletter's subscribers.
type ListQuery struct {
	Page   int
	Limit  int
	Status Status // "" means every status
	// Email, when set, selects the subscriber with this address (trimmed; compared by
	// EmailKey), docs/api-contract.md §9.1.
	Email string
	// After, when set, starts the page after this position in the list order (a cursor,
	// docs/api-contract.md §9.2); Page is then ignored.
	After *Position
}

// Follows reports whether sub comes after the position p in the list order (newest first).
func Follows(p *Position, sub Subscriber) bool {
	if !sub.CreatedAt.Equal(p.CreatedAt) {
		return sub.CreatedAt.Before(p.CreatedAt)
	}
	return bytes.Compare(sub.ID[:], p.ID[:]) < 0
}

// Position is a place in the list order (created_at descending, then id descending): the
// keyset a cursor carries.
type Position struct {
	CreatedAt time.Time
	ID        uuid.UUID
}

// Offset is the number of rows before the page: math.MaxInt, past the end of any list, when
// the product does not fit in an int.
func (q ListQuery) Offset() int {
	if q.Limit > 0 && q.Page-1 > math.MaxInt/q.Limit {
		return math.MaxInt
	}
	return (q.Page - 1) * q.Limit
}

// Paging defaults and bounds of the list operation.
const (
	DefaultPage  = 1
	DefaultLimit = 25
	MaxLimit     = 100
	MaxBulkItems = 100
)

// Sentinel errors. Layers below wrap them with %w; the API maps them to HTTP once.
var (
	ErrNotFound    = errors.New("subscriber not found")
	ErrEmailTaken  = errors.New("email is already subscribed to this newsletter")
	ErrUnavailable = errors.New("storage unavailable")
	// ErrKeyNotFound is returned for an unknown or revoked API key.
	ErrKeyNotFound = errors.New("api key not found")
	// ErrKeyRevoked is the ErrKeyNotFound of a key that exists but was revoked: the client's
	// answer is the same, only telemetry tells them apart.
	ErrKeyRevoked = fmt.Errorf("%w: revoked", ErrKeyNotFound)
	// ErrNewsletterNotFound is returned for an unknown newsletter id.
	ErrNewsletterNotFound = errors.New("newsletter not found")
)

// EmailTakenError reports which items of a bulk create collided with stored subscribers.
type EmailTakenError struct {
	Indexes []int // zero-based input positions whose email already exists
}

func (e *EmailTakenError) Error() string { return ErrEmailTaken.Error() }

// Unwrap makes errors.Is(err, ErrEmailTaken) hold.
func (e *EmailTakenError) Unwrap() error { return ErrEmailTaken }

// ConfirmationEffect says what applying p to before does to the subscriber's confirmation:
// whether outstanding links and unsent emails are retired, and whether a new confirmation
// email is queued. Setting any status retires them, and pending asks again. Changing the
// email of a pending subscriber asks again too: the confirmation must reach the address it
// confirms, and the old link must not confirm the new one.
func (p SubscriberPatch) ConfirmationEffect(before Subscriber) (retire, queue bool) {
	switch {
	case p.Status != nil:
		return true, *p.Status == StatusPending
	case p.Email != nil && EmailKey(*p.Email) != EmailKey(before.Email) && before.Status == StatusPending:
		return true, true
	}
	return false, false
}
