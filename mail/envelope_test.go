package mail

import (
	"math/rand"
	"testing"
	"testing/quick"
	"unicode/utf8"

	"github.com/subscriberd/subscriberd/model"
)

// envelopeSpellings are addresses the service accepts, in the spellings issue 46 found the
// mailer and the comparison to disagree on.
var envelopeSpellings = []string{
	"p@example.com", "P@Example.COM", "p@ｅｘａｍｐｌｅ.ｃｏｍ", "p@bu\u0308cher.example", "p@bücher.example",
	"p@xn--bcher-kva.example", "p@XN--BCHER-KVA.example", "Zoë@bücher.example", "zoe\u0308@x.io",
	"x@straße.de", "用户@例子.广告",
}

// TestEnvelopeRecipientHasTheAddressKey: docs/api-contract.md §18. The recipient the mailer
// names in RCPT TO is the mailbox the service compares: for every address it accepts, the key
// of the envelope recipient is the key of the address, and the domain is ASCII. The spellings
// above, then random addresses built from letters of several scripts, marks and full-width
// forms (model.FuzzEmailAddress explores further).
func TestEnvelopeRecipientHasTheAddressKey(t *testing.T) {
	accepted := 0
	check := func(addr string) bool {
		if utf8.RuneCountInString(addr) > model.MaxEmailLength || !model.ValidEmail(addr) {
			return true // not an address the service accepts
		}
		accepted++
		rcpt, _, err := envelopeAddress(addr)
		if err != nil {
			t.Errorf("accepted %q, but the mailer cannot name it: %v", addr, err)
			return false
		}
		if model.EmailKey(rcpt) != model.EmailKey(addr) {
			t.Errorf("envelope %q of %q: key %q, the address's %q", rcpt, addr, model.EmailKey(rcpt), model.EmailKey(addr))
			return false
		}
		return true
	}
	for _, a := range envelopeSpellings {
		if !model.ValidEmail(a) {
			t.Errorf("ValidEmail(%q) = false; want an accepted address", a)
		}
		check(a)
	}
	alphabet := []rune("aZ9-.ｅｘＡü\u0308\u0301ßẞİıσςΣ例子ـ\u200dxn")
	gen := func(n int, r interface{ Intn(int) int }) string {
		b := make([]rune, 1+r.Intn(n))
		for i := range b {
			b[i] = alphabet[r.Intn(len(alphabet))]
		}
		return string(b)
	}
	prop := func(seed int64) bool {
		r := newRand(seed)
		return check(gen(6, r) + "@" + gen(12, r) + "." + gen(4, r))
	}
	accepted = 0
	if err := quick.Check(prop, &quick.Config{MaxCount: 20000}); err != nil {
		t.Error(err)
	}
	if accepted < 500 {
		t.Errorf("only %d of 20000 random addresses were accepted; want the property exercised", accepted)
	}
	t.Logf("%d random addresses accepted and checked", accepted)
}

func newRand(seed int64) *rand.Rand { return rand.New(rand.NewSource(seed)) }
