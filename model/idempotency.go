package model

import (
	"crypto/sha256"
	"errors"
)

// Idempotency rules of docs/api-contract.md §8.
const (
	// MaxIdempotencyKeyLength is the longest Idempotency-Key accepted, in characters.
	MaxIdempotencyKeyLength = 255
	// MsgIdempotencyKeyInvalid answers a header value that breaks ValidIdempotencyKey (400).
	MsgIdempotencyKeyInvalid = "The Idempotency-Key header must be 1 to 255 visible ASCII characters."
	// MsgIdempotencyKeyInUse answers a key whose first request is still running (409).
	MsgIdempotencyKeyInUse = "A request with this Idempotency-Key is still being processed."
	// MsgIdempotencyKeyReused answers a key stored for another request (422).
	MsgIdempotencyKeyReused = "This Idempotency-Key was already used with a different request."
)

// ErrIdempotencyInUse reports that another request with the same Idempotency-Key is running.
var ErrIdempotencyInUse = errors.New("idempotency key in use")

// ValidIdempotencyKey reports whether s is 1 to 255 visible ASCII characters ('!' to '~').
func ValidIdempotencyKey(s string) bool {
	if len(s) == 0 || len(s) > MaxIdempotencyKeyLength {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '!' || s[i] > '~' {
			return false
		}
	}
	return true
}

// Fingerprint identifies a request for its Idempotency-Key: the SHA-256 of its method, its
// path and the SHA-256 of its exact body bytes.
func Fingerprint(method, path string, body []byte) []byte {
	return FingerprintSum(method, path, sha256.Sum256(body))
}

// FingerprintSum is Fingerprint of a body whose SHA-256 is bh, for a body hashed as it was read.
func FingerprintSum(method, path string, bh [sha256.Size]byte) []byte {
	h := sha256.New()
	h.Write([]byte(method))
	h.Write([]byte{0})
	h.Write([]byte(path))
	h.Write([]byte{0})
	h.Write(bh[:])
	return h.Sum(nil)
}

// StoredResponse is the response of a successful idempotent write, replayed byte for byte.
type StoredResponse struct {
	Fingerprint []byte
	Status      int
	Location    string // "" when the response had none
	Body        []byte
}

// IdempotencyResult is what running an idempotent request did.
type IdempotencyResult struct {
	// Ran is set when the request ran (under its key's lock).
	Ran bool
	// Stored is the response another request with the key stored meanwhile; this request did
	// not run.
	Stored *StoredResponse
}
