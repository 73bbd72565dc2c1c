package mail

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"time"
)

// TokenBytes is the number of random bytes in a confirmation token (256 bits).
const TokenBytes = 32

// TokenTTL is how long a confirmation link stays valid.
const TokenTTL = 7 * 24 * time.Hour

// tokenLen is the length of a token in unpadded URL-safe base64.
var tokenLen = base64.RawURLEncoding.EncodedLen(TokenBytes)

// NewToken returns a new confirmation token, URL-safe, and the hash under which it is stored.
// The token itself is never stored: it exists only inside the email.
func NewToken() (token string, hash []byte) {
	b := make([]byte, TokenBytes)
	rand.Read(b) // never fails (crypto/rand panics rather than return short)
	token = base64.RawURLEncoding.EncodeToString(b)
	return token, HashToken(token)
}

// HashToken returns the stored form of a token: its SHA-256 digest. A plain hash is enough
// because the token carries 256 random bits: nothing is left to guess or stretch.
func HashToken(token string) []byte {
	sum := sha256.Sum256([]byte(token))
	return sum[:]
}

// WellFormedToken reports whether s has the shape of a token this package makes, so that
// obviously wrong links are answered without asking the database.
func WellFormedToken(s string) bool {
	if len(s) != tokenLen {
		return false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	return err == nil && len(b) == TokenBytes
}
