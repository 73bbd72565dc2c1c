package mail

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"testing"
)

func TestNewToken(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		tok, hash := NewToken()
		raw, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || len(raw) < 32 {
			t.Fatalf("token %q: decoded %d bytes, err %v; want >= 32 URL-safe base64 bytes", tok, len(raw), err)
		}
		if seen[tok] {
			t.Fatalf("token %q repeated", tok)
		}
		seen[tok] = true
		want := sha256.Sum256([]byte(tok))
		if !bytes.Equal(hash, want[:]) || !bytes.Equal(HashToken(tok), hash) {
			t.Fatalf("hash of %q = %x, want %x", tok, hash, want)
		}
		if !WellFormedToken(tok) {
			t.Fatalf("WellFormedToken(%q) = false", tok)
		}
	}
}

func TestWellFormedToken(t *testing.T) {
	good, _ := NewToken()
	for _, tc := range []struct {
		name string
		in   string
		want bool
	}{
		{"made here", good, true},
		{"empty", "", false},
		{"short", good[:42], false},
		{"long", good + "A", false},
		{"padded std base64", base64.StdEncoding.EncodeToString(make([]byte, 32)), false},
		{"bad character", "!" + good[1:], false},
		{"slash", "/" + good[1:], false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := WellFormedToken(tc.in); got != tc.want {
				t.Errorf("WellFormedToken(%q) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}
