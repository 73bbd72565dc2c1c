package mail

import (
	"testing"
	"time"
)

func TestNonces(t *testing.T) {
	n := NewNonces([]byte("0123456789abcdef0123456789abcdef"))
	hash := HashToken("token-one")
	now := time.Unix(1_800_000_000, 0)
	good := n.Make("confirm", hash, now)
	if at, ok := n.Check("confirm", hash, good, now.Add(59*time.Minute)); !ok || !at.Equal(now) {
		t.Fatalf("fresh nonce: %v %v", at, ok)
	}
	for name, c := range map[string]struct {
		action, nonce string
		hash          []byte
		at            time.Time
	}{
		"stale":           {"confirm", good, hash, now.Add(61 * time.Minute)},
		"other token":     {"confirm", good, HashToken("token-two"), now},
		"other action":    {"decline", good, hash, now},
		"other key":       {"confirm", NewNonces(nil).Make("confirm", hash, now), hash, now},
		"empty":           {"confirm", "", hash, now},
		"altered time":    {"confirm", "1800000001" + good[10:], hash, now},
		"no mac":          {"confirm", "1800000000.", hash, now},
		"from the future": {"confirm", n.Make("confirm", hash, now.Add(time.Hour)), hash, now},
	} {
		if _, ok := n.Check(c.action, c.hash, c.nonce, c.at); ok {
			t.Errorf("%s: accepted", name)
		}
	}
}
