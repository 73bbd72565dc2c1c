package model

import (
	"errors"
	"time"

	"github.com/google/uuid"
)

// EmailKindConfirmation is the outbox kind of a double-opt-in confirmation email, the only
// kind there is today.
const EmailKindConfirmation = "confirmation"

// Outbox states of an email.
const (
	EmailPending   = "pending"
	EmailSent      = "sent"
	EmailFailed    = "failed"
	EmailCancelled = "cancelled"
)

// OutboxEmail is one confirmation email due for delivery: an outbox row together with what is
// needed to write it, read when the email is claimed (the subscriber's current address and name,
// the newsletter's current name).
type OutboxEmail struct {
	ID             uuid.UUID
	NewsletterID   uuid.UUID
	NewsletterName string
	SubscriberID   uuid.UUID
	Email          string
	FirstName      string
	LastName       string
	Kind           string
	Attempts       int    // delivery attempts already made
	Unanswered     int    // attempts whose end of DATA got no reply (the server may have the email)
	Traceparent    string // W3C trace context of the request that queued it; may be ""
	CreatedAt      time.Time
}

// Name is the subscriber's display name, "" when there is none.
func (e OutboxEmail) Name() string { return JoinName(e.FirstName, e.LastName) }

// Confirmation is what a confirmation token leads to.
type Confirmation struct {
	SubscriberID   uuid.UUID
	NewsletterName string
	// Email is the subscriber's address, shown on the pages.
	Email string
	// Confirmed is set when this token already confirmed the subscription.
	Confirmed bool
	// Declined is set when this token already declined it ("I did not sign up").
	Declined bool
}

// Errors of the email outbox and confirmation tokens.
var (
	// ErrEmailObsolete means an outbox email is no longer wanted: its subscriber is no longer
	// pending, a newer confirmation email superseded it, or it was cancelled.
	ErrEmailObsolete = errors.New("confirmation email no longer wanted")
	// ErrTokenInvalid means a confirmation token is unknown, expired or superseded, or its
	// subscriber is no longer pending (and the token is not the one that confirmed it).
	ErrTokenInvalid = errors.New("confirmation link no longer valid")
)

// Re-sends of confirmation emails (docs/api-contract.md §12.3): at most
// MaxConfirmationsPerWindow emails to one subscriber within ConfirmationWindow, the create's
// included.
const (
	MaxConfirmationsPerWindow = 3
	ConfirmationWindow        = 24 * time.Hour
)

// ResendLimitMessage is the 429's message of docs/api-contract.md §12.3.
const ResendLimitMessage = "Too many confirmation emails to this address. Please try again later."

// ResendLimitError refuses another confirmation email to a subscriber: RetryAfter is the whole
// seconds until the oldest counted email leaves the window.
type ResendLimitError struct {
	RetryAfter int
}

func (e *ResendLimitError) Error() string { return "confirmation re-send limit reached" }
