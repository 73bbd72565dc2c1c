package model

import (
	"crypto/rand"
	"crypto/sha256"
	"strings"
	"time"
)

// API key format: "sk_" and KeyRandomLength base62 characters (about 238 bits).
const (
	KeyPrefix       = "sk_"
	KeyRandomLength = 40
	keyDisplayChars = 4
	base62          = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
)

// NewKeySecret makes a new API key. Only its hash and display prefix are ever stored.
func NewKeySecret() (key, prefix string, hash []byte) {
	var b strings.Builder
	b.Grow(len(KeyPrefix) + KeyRandomLength)
	b.WriteString(KeyPrefix)
	// Rejection sampling keeps every character uniform: bytes ≥ 248 (4×62) are drawn again.
	buf := make([]byte, KeyRandomLength*2)
	for n := 0; n < KeyRandomLength; {
		rand.Read(buf) //nolint:errcheck // crypto/rand.Read never fails (Go 1.24+)
		for _, c := range buf {
			if c >= 248 || n == KeyRandomLength {
				continue
			}
			b.WriteByte(base62[c%62])
			n++
		}
	}
	key = b.String()
	return key, key[:len(KeyPrefix)+keyDisplayChars], HashKey(key)
}

// HashKey is the stored form of a key: SHA-256, enough for a random 238-bit secret.
func HashKey(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return h[:]
}

// WellFormedKey reports whether key has the shape of an API key, so a malformed one is
// rejected without a lookup.
func WellFormedKey(key string) bool {
	if !strings.HasPrefix(key, KeyPrefix) || len(key) < len(KeyPrefix)+32 || len(key) > 128 {
		return false
	}
	for i := len(KeyPrefix); i < len(key); i++ {
		if strings.IndexByte(base62, key[i]) < 0 {
			return false
		}
	}
	return true
}

// Scope is what an API key may do (docs/api-contract.md §16.2).
type Scope string

// The scopes of a key: write is every operation; read only GET.
const (
	ScopeWrite Scope = "write"
	ScopeRead  Scope = "read"
)

// Scopes are the valid scopes, the default first.
var Scopes = []Scope{ScopeWrite, ScopeRead}

// ParseScope returns the scope named s, and false when s names none.
func ParseScope(s string) (Scope, bool) {
	for _, sc := range Scopes {
		if string(sc) == s {
			return sc, true
		}
	}
	return "", false
}

// MsgInsufficientScope is the message of the 403 a read key gets on a write.
const MsgInsufficientScope = "This API key can only read."

// Allows reports whether a key with this scope may make a request with method: a read key
// only GET (and HEAD, its header-only form); a write key, and a key of no known scope (an
// older store's, all of whose keys could write), everything.
func (s Scope) Allows(method string) bool {
	if s != ScopeRead {
		return true
	}
	return method == "GET" || method == "HEAD"
}

// DefaultRotationGrace is how long a rotated key keeps working by default.
const DefaultRotationGrace = 24 * time.Hour

// Expired reports whether a key that expires at expiresAt (zero: never) no longer works at now.
func Expired(expiresAt, now time.Time) bool {
	return !expiresAt.IsZero() && !now.Before(expiresAt)
}

// RevokedAsOf is when k was revoked, as of now: RevokedAt when it was revoked by hand, or, for
// a rotated key whose grace has ended (Expired), the end of its grace, since such a key "is
// revoked" (docs/api-contract.md §16.2); nil while it works.
func (k APIKey) RevokedAsOf(now time.Time) *time.Time {
	if k.RevokedAt != nil {
		return k.RevokedAt
	}
	if k.ExpiresAt != nil && Expired(*k.ExpiresAt, now) {
		return new(*k.ExpiresAt)
	}
	return nil
}
