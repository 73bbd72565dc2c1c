package model

import (
	"crypto/rand"
	"crypto/sha256"
	"strings"
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
