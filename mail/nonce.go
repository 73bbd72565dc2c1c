package mail

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
	"time"
)

// NonceTTL is how long a page's nonce proves intent (docs/api-contract.md §12.1).
const NonceTTL = time.Hour

// Nonces makes and checks the per-page nonces of the confirm and decline pages: an HMAC,
// under a key every instance shares, over the page's action, the token's hash and the time the
// page was served. A nonce is "<unix seconds>.<base64url of the first 16 bytes of the MAC>".
// It reaches the form only through the page's script on a trusted click, so a form submitted
// as it is (by a scanner) carries none. Its methods are safe for concurrent use.
type Nonces struct {
	key []byte
}

// NewNonces returns nonces under key (cmd/subscriberd reads it from the database); a nil key
// makes a random one, good for this process only (tests).
func NewNonces(key []byte) *Nonces {
	if key == nil {
		key = make([]byte, 32)
		rand.Read(key) //nolint:errcheck // never fails
	}
	return &Nonces{key: append([]byte(nil), key...)}
}

// Make returns the nonce of the page of action ("confirm", "decline") for tokenHash, served at.
func (n *Nonces) Make(action string, tokenHash []byte, at time.Time) string {
	ts := strconv.FormatInt(at.Unix(), 10)
	return ts + "." + base64.RawURLEncoding.EncodeToString(n.mac(action, tokenHash, ts))
}

// Check reports when the page holding nonce was served, and whether nonce is a valid one for
// action and tokenHash, made at most NonceTTL before now. A forged, altered, stale or foreign
// nonce is not valid.
func (n *Nonces) Check(action string, tokenHash []byte, nonce string, now time.Time) (time.Time, bool) {
	ts, mac, ok := strings.Cut(nonce, ".")
	if !ok || len(ts) == 0 || len(ts) > 12 {
		return time.Time{}, false
	}
	secs, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || strconv.FormatInt(secs, 10) != ts {
		return time.Time{}, false
	}
	got, err := base64.RawURLEncoding.DecodeString(mac)
	if err != nil || !hmac.Equal(got, n.mac(action, tokenHash, ts)) {
		return time.Time{}, false
	}
	served := time.Unix(secs, 0)
	// A minute of clock difference between instances is allowed ahead.
	if now.Sub(served) > NonceTTL || served.Sub(now) > time.Minute {
		return time.Time{}, false
	}
	return served, true
}

func (n *Nonces) mac(action string, tokenHash []byte, ts string) []byte {
	h := hmac.New(sha256.New, n.key)
	h.Write([]byte("subscriberd page nonce\x00" + action + "\x00"))
	h.Write(tokenHash)
	h.Write([]byte("\x00" + ts))
	return h.Sum(nil)[:16]
}
