package model_test

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/subscriberd/subscriberd/model"
)

const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

func TestNewKeySecretFormat(t *testing.T) {
	key, prefix, hash := model.NewKeySecret()
	if len(key) != 43 || !strings.HasPrefix(key, "sk_") {
		t.Fatalf("NewKeySecret() key = %q (%d bytes); want sk_ and 40 characters", key, len(key))
	}
	if s := strings.Trim(key[3:], base62); s != "" {
		t.Errorf("NewKeySecret() key %q has non-base62 characters %q", key, s)
	}
	if prefix != key[:7] {
		t.Errorf("NewKeySecret() prefix = %q; want the key's first 7 characters %q", prefix, key[:7])
	}
	if !bytes.Equal(hash, model.HashKey(key)) {
		t.Errorf("NewKeySecret() hash = %x; want HashKey(key) = %x", hash, model.HashKey(key))
	}
	if !model.WellFormedKey(key) {
		t.Errorf("WellFormedKey(NewKeySecret()) = false; want true")
	}
}

// TestNewKeySecretRandomness draws many keys: all distinct, every base62 character used, and
// none strongly favoured (a plain byte%62 without rejection would favour the first 8 by 25%).
func TestNewKeySecretRandomness(t *testing.T) {
	const draws = 2000
	seen := make(map[string]bool, draws)
	prefixes := make(map[string]bool)
	counts := make(map[rune]int)
	for range draws {
		key, prefix, _ := model.NewKeySecret()
		if seen[key] {
			t.Fatalf("NewKeySecret() repeated key %q within %d draws", key, draws)
		}
		seen[key] = true
		prefixes[prefix] = true
		for _, r := range key[3:] {
			counts[r]++
		}
	}
	if len(prefixes) < draws/2 {
		t.Errorf("NewKeySecret() gave %d distinct prefixes in %d draws; want them to vary", len(prefixes), draws)
	}
	if len(counts) != 62 {
		t.Errorf("NewKeySecret() used %d distinct characters; want 62", len(counts))
	}
	mean := float64(draws*40) / 62 // about 1290; one standard deviation is about 36
	for r, n := range counts {
		if float64(n) < mean*0.85 || float64(n) > mean*1.15 {
			t.Errorf("character %q drawn %d times; want within 15%% of %.0f", r, n, mean)
		}
	}
}

func TestHashKey(t *testing.T) {
	// SHA-256 test vector of FIPS 180-2.
	want := "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	if got := hex.EncodeToString(model.HashKey("abc")); got != want {
		t.Errorf("HashKey(\"abc\") = %s; want %s", got, want)
	}
	if bytes.Equal(model.HashKey("sk_a"), model.HashKey("sk_b")) {
		t.Errorf("HashKey gave equal hashes for different keys")
	}
}

func TestWellFormedKey(t *testing.T) {
	tests := []struct {
		name string
		key  string
		want bool
	}{
		{"40 characters", "sk_" + strings.Repeat("aZ9", 13) + "x", true},
		{"32 characters, the minimum", "sk_" + strings.Repeat("A", 32), true},
		{"31 characters", "sk_" + strings.Repeat("A", 31), false},
		{"128 bytes in all", "sk_" + strings.Repeat("b", 125), true},
		{"129 bytes in all", "sk_" + strings.Repeat("b", 126), false},
		{"empty", "", false},
		{"prefix only", "sk_", false},
		{"no prefix", strings.Repeat("A", 40), false},
		{"upper-case prefix", "SK_" + strings.Repeat("A", 40), false},
		{"other prefix", "pk_" + strings.Repeat("A", 40), false},
		{"hyphen", "sk_" + strings.Repeat("A", 39) + "-", false},
		{"underscore", "sk_" + strings.Repeat("A", 39) + "_", false},
		{"space", "sk_" + strings.Repeat("A", 20) + " " + strings.Repeat("A", 19), false},
		{"non-ASCII", "sk_" + strings.Repeat("A", 39) + "é", false},
		{"NUL", "sk_" + strings.Repeat("A", 39) + "\x00", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := model.WellFormedKey(tt.key); got != tt.want {
				t.Errorf("WellFormedKey(%q) = %v; want %v", tt.key, got, tt.want)
			}
		})
	}
}
