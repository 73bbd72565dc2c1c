package model

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestEmailKeySameAddress(t *testing.T) {
	tests := []struct {
		name string
		a, b string
	}{
		{"case", "A@x.io", "a@X.IO"},
		{"surrounding space", "  john.doe@Example.COM\t", "john.doe@example.com"},
		{"non-ASCII case", "ÜSER@MÜNCHEN.DE", "üser@münchen.de"},
		{"full-width domain", "p@ｅｘａｍｐｌｅ.ｃｏｍ", "p@example.com"},
		{"full-width upper-case domain", "p@ＥＸＡＭＰＬＥ.com", "p@example.com"},
		{"NFD domain", "p@bu\u0308cher.example", "p@bücher.example"},
		{"A-label domain", "p@xn--bcher-kva.example", "p@bücher.example"},
		{"upper-case A-label domain", "p@XN--BCHER-KVA.EXAMPLE", "p@Bücher.example"},
		{"NFD local part", "zoe\u0308@x.io", "zoë@x.io"},
		{"NFD upper-case local part", "ZOE\u0308@x.io", "zoë@x.io"},
		{"capital sharp s", "x@STRAẞE.de", "x@straße.de"},
		{"sharp s A-label (non-transitional)", "x@xn--strae-oqa.de", "x@straße.de"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if ka, kb := EmailKey(tt.a), EmailKey(tt.b); ka != kb {
				t.Errorf("EmailKey(%q) = %q, EmailKey(%q) = %q; want equal", tt.a, ka, tt.b, kb)
			}
		})
	}
}

func TestEmailKeyDifferentAddress(t *testing.T) {
	tests := []struct {
		name string
		a, b string
	}{
		{"local part", "a@x.io", "b@x.io"},
		{"domain", "a@x.io", "a@y.io"},
		{"sharp s is not ss (non-transitional)", "x@straße.de", "x@strasse.de"},
		{"accent", "p@bücher.example", "p@bucher.example"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if ka, kb := EmailKey(tt.a), EmailKey(tt.b); ka == kb {
				t.Errorf("EmailKey(%q) = EmailKey(%q) = %q; want different", tt.a, tt.b, ka)
			}
		})
	}
}

// TestEmailKeyKeepsLegacyKeys pins the choice of the key's form: a plain ASCII address and a
// non-ASCII one written in NFC with U-labels keep the key 1.2 gave them (trimmed, lower-cased),
// so their rows and the erased hashes of them need no change.
func TestEmailKeyKeepsLegacyKeys(t *testing.T) {
	for _, a := range []string{
		"john.doe@example.com", "John.Doe+news@Example.COM", " a@b.co ", "x@ab--cd.com",
		"p@bücher.example", "ÜSER@MÜNCHEN.DE", "用户@例子.广告", "x@straße.de",
	} {
		if got, want := EmailKey(a), LegacyEmailKey(a); got != want {
			t.Errorf("EmailKey(%q) = %q; want the 1.2 key %q", a, got, want)
		}
	}
	for _, a := range []string{"p@ｅｘａｍｐｌｅ.ｃｏｍ", "p@bu\u0308cher.example", "p@xn--bcher-kva.example"} {
		if got := EmailKey(a); got == LegacyEmailKey(a) {
			t.Errorf("EmailKey(%q) = %q, the 1.2 key; want the address's own key", a, got)
		}
	}
}

func TestEnvelopeAddress(t *testing.T) {
	tests := []struct{ in, want string }{
		{"p@example.com", "p@example.com"},
		{"P.Q@Example.COM", "P.Q@Example.COM"},
		{"p@ｅｘａｍｐｌｅ.ｃｏｍ", "p@example.com"},
		{"p@bücher.example", "p@xn--bcher-kva.example"},
		{"p@bu\u0308cher.example", "p@xn--bcher-kva.example"},
		{"p@XN--BCHER-KVA.example", "p@xn--bcher-kva.example"},
		{"Zoë@bücher.example", "Zoë@xn--bcher-kva.example"},
	}
	for _, tt := range tests {
		got, err := EnvelopeAddress(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("EnvelopeAddress(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	for _, in := range []string{"", "p", "@x.io", "p@", "p@ab--cd.com", "p@a_b.com", "p@xn--a.example", "p@x.y\u200d"} {
		if got, err := EnvelopeAddress(in); err == nil {
			t.Errorf("EnvelopeAddress(%q) = %q; want an error", in, got)
		}
	}
}

func TestValidEmailRefusesIDNAFailures(t *testing.T) {
	for _, a := range []string{
		"p@ab--cd.com",            // hyphens in the third and fourth places (CheckHyphens)
		"p@xn--a.example",         // broken punycode
		"p@xn--example-.com",      // an A-label that decodes to ASCII
		"p@a.１２３",                 // a top level of digits once mapped
		"p@\u0627\u0644a.example", // a bidi label that breaks the bidi rule
	} {
		if ValidEmail(a) {
			t.Errorf("ValidEmail(%q) = true; want false (fails IDNA processing)", a)
		}
	}
	for _, a := range []string{"p@ｅｘａｍｐｌｅ.ｃｏｍ", "p@bu\u0308cher.example", "p@xn--bcher-kva.example", "用户@例子.广告"} {
		if !ValidEmail(a) {
			t.Errorf("ValidEmail(%q) = false; want true", a)
		}
	}
}

// TestEmailKeyLinear feeds the key, the envelope and the validator inputs far beyond any
// address's length, of the shapes that are slow for IDNA (a long punycode label) and for
// normalisation (runs of combining marks): they must come back (bounded, not quadratic).
func TestEmailKeyLinear(t *testing.T) {
	long := []string{
		"a@xn--" + strings.Repeat("a", 1<<20) + "-kva.example",
		"a@" + strings.Repeat("ü", 1<<19) + ".example",
		strings.Repeat("e\u0308", 1<<19) + "@" + strings.Repeat("e\u0301", 1<<18) + ".example",
		strings.Repeat("@", 1<<20),
	}
	start := time.Now()
	for _, s := range long {
		_ = EmailKey(s)
		_, _ = EnvelopeAddress(s)
		_ = ValidEmail(s)
	}
	// Generous: linear work on these few MiB takes well under a second even on a busy
	// machine, quadratic work on a 1 MiB label takes minutes.
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("keying %d long inputs took %v; want linear time", len(long), d)
	}
}

// FuzzEmailAddress holds the validator, the key and the mailer's envelope to one rule
// (docs/api-contract.md §18): for any address the service accepts, the envelope the mailer
// would use exists and has the address's key; keying is idempotent and depends only on the
// 1.2 key (so that every pair 1.2 took for one address stays one); the ASCII shortcut agrees
// with the full processing; and nothing panics.
func FuzzEmailAddress(f *testing.F) {
	for _, s := range []string{
		"p@example.com", "P@Example.COM", "p@ｅｘａｍｐｌｅ.ｃｏｍ", "p@bu\u0308cher.example",
		"p@bücher.example", "p@xn--bcher-kva.example", "x@İ.com", "x@ab--cd.com", "x@straße.de",
		"zoe\u0308@x.io", "用户@例子.广告", "a@b.c\u0301", "a@xn--zca.de", "a@123.com", "a@x.y\u200d",
		"a@\u0627\u0644.example", "a@ǅ.example", "a@\u1e9e.example", "a@K.example",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		key := EmailKey(s)
		env, envErr := EnvelopeAddress(s)
		_ = ValidEmail(s)
		if got := emailKeyFull(LegacyEmailKey(s)); got != key {
			t.Errorf("EmailKey(%q) = %q; the full processing gives %q", s, key, got)
		}
		if got := EmailKey(LegacyEmailKey(s)); got != key {
			t.Errorf("EmailKey(%q) = %q but EmailKey of its 1.2 key = %q; want equal", s, key, got)
		}
		addr := strings.TrimSpace(s)
		if at := strings.LastIndexByte(addr, '@'); at >= 0 && validLocal(addr[:at]) && validDomainLabels(addr[at+1:]) {
			d := addr[at+1:]
			if fast, full := domainPassesIDNA(d), domainPassesIDNAFull(strings.ToLower(d)); fast != full {
				t.Errorf("domain %q: passes IDNA %v by the shortcut, %v by the full processing", d, fast, full)
			}
		}
		if !utf8.ValidString(addr) || utf8.RuneCountInString(addr) > MaxEmailLength || !ValidEmail(addr) {
			return
		}
		if envErr != nil {
			t.Fatalf("ValidEmail(%q) but EnvelopeAddress fails: %v", addr, envErr)
		}
		if got := EmailKey(env); got != key {
			t.Errorf("EmailKey(%q) = %q but the key of its envelope %q is %q", addr, key, env, got)
		}
		if !isASCII(env[strings.LastIndexByte(env, '@'):]) {
			t.Errorf("EnvelopeAddress(%q) = %q; want an ASCII domain", addr, env)
		}
		if again := EmailKey(key); again != key {
			t.Errorf("EmailKey(%q) = %q, keyed again %q; want idempotent", addr, key, again)
		}
		if !ValidEmail(env) {
			t.Errorf("EnvelopeAddress(%q) = %q is not a valid address", addr, env)
		}
	})
}
