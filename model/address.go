package model

import (
	"crypto/sha256"
	"errors"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"
	"golang.org/x/text/unicode/norm"
)

// The one rule of docs/api-contract.md §18: when two addresses are the same address. Every
// comparison of addresses (uniqueness, lookup, upsert, suppressions, erased hashes, import and
// bulk de-duplication) goes through EmailKey, and the mailer names the recipient with
// EnvelopeAddress, which takes its domain from the same processing: the two cannot disagree.
//
// The key's form:
//   - the address is trimmed and lower-cased first, exactly as 1.2 keyed it, and every later
//     step works on that: two addresses 1.2 took for one are still one, so a suppression made
//     before 1.3 keeps matching every address it matched (docs/api-contract.md §18);
//   - the local part is then NFC-normalised and lower-cased again (a composed letter may have
//     a lower-case form of its own);
//   - the domain goes through IDNA with UTS #46 mapping, non-transitional (idna.Lookup), and
//     the key holds its U-label form: Unicode, NFC, lower case, no "xn--" label. A plain ASCII
//     address therefore keeps exactly its 1.2 key, and so does the usual non-ASCII address,
//     written in NFC with its U-labels as people type them; only compatibility forms
//     (full-width), NFD and "xn--" spellings get a new key. The A-label form would have
//     re-keyed every non-ASCII row and every erased hash of one.
//
// A domain that fails IDNA processing is not a valid address (ValidEmail); such an address
// can still be keyed, as a row stored before 1.3 may hold one: its domain is then kept as
// 1.2 keyed it.

// maxDomainBytes bounds the domain IDNA processing is asked to map: punycode is quadratic in
// a label's length, and no valid domain (maxDomain code points) is longer.
const maxDomainBytes = 4 * maxDomain

// errIDNA is a domain that IDNA processing refuses, or that is too long to be one.
var errIDNA = errors.New("the address's domain fails IDNA processing")

// EmailKey is the form under which two addresses are the same address (docs/api-contract.md
// §18): what the unique key of a newsletter's subscribers, the suppression list's entries and
// their hashes hold. It is defined for any string.
func EmailKey(email string) string {
	legacy := LegacyEmailKey(email)
	at := strings.LastIndexByte(legacy, '@')
	if isASCII(legacy) && !strings.Contains(legacy[at+1:], "xn--") {
		// The usual address: IDNA maps a lower-case ASCII domain without A-labels to itself
		// (model tests pin that this shortcut agrees with the full processing).
		return legacy
	}
	return emailKeyFull(legacy)
}

// emailKeyFull is EmailKey of the legacy key l, without the ASCII shortcut.
func emailKeyFull(l string) string {
	at := strings.LastIndexByte(l, '@')
	local, domain := l, ""
	if at >= 0 {
		local, domain = l[:at], l[at+1:]
	}
	local = strings.ToLower(norm.NFC.String(local))
	if at < 0 {
		return local
	}
	if _, u, err := processDomain(domain); err == nil {
		domain = u
	}
	return local + "@" + domain
}

// LegacyEmailKey is the key 1.2 gave an address: trimmed and lower-cased. Erased entries made
// before 1.3 hold the hash of this form (see EmailHashes).
func LegacyEmailKey(email string) string { return strings.ToLower(strings.TrimSpace(email)) }

// EnvelopeAddress is the address as the SMTP envelope names it: the local part as given and
// the domain in its A-label form (an ASCII domain without A-labels as given), from the same
// IDNA processing as EmailKey's (so EmailKey(EnvelopeAddress(a)) == EmailKey(a)). It fails for an address without a local part
// and a domain, or whose domain fails IDNA processing.
func EnvelopeAddress(addr string) (string, error) {
	addr = strings.TrimSpace(addr)
	at := strings.LastIndexByte(addr, '@')
	if at <= 0 || at == len(addr)-1 {
		return "", errors.New("address without a local part and a domain")
	}
	domain := addr[at+1:]
	lower := strings.ToLower(domain)
	a, _, err := processDomain(lower)
	if err != nil {
		return "", err
	}
	if isASCII(domain) && !strings.Contains(lower, "xn--") {
		// An ASCII domain without A-labels maps to itself lower-cased; it goes as given, as
		// before 1.3 (a domain's case means nothing to DNS).
		a = domain
	}
	return addr[:at] + "@" + a, nil
}

// processDomain maps a lower-cased domain through IDNA (UTS #46, the lookup profile) and
// returns its A-label and U-label forms. The forms must map to themselves again (fixed points,
// so that a key or an envelope keyed again gives the same key).
func processDomain(domain string) (ascii, unicode string, err error) {
	if domain == "" || len(domain) > maxDomainBytes {
		return "", "", errIDNA
	}
	ascii, err = idna.Lookup.ToASCII(domain)
	if err != nil {
		return "", "", errIDNA
	}
	unicode, err = idna.Lookup.ToUnicode(ascii)
	if err != nil {
		return "", "", errIDNA
	}
	if again, err := idna.Lookup.ToASCII(unicode); err != nil || again != ascii {
		return "", "", errIDNA
	}
	return ascii, unicode, nil
}

// domainPassesIDNA reports whether domain (whose labels ValidEmail checked already) passes
// processDomain and has dnsShape afterwards. The usual domain, ASCII without an A-label, is
// decided without the IDNA tables: of all the processing, only the rule against "--" in the
// third and fourth places (CheckHyphens) can refuse what ValidEmail's label rules let through
// (FuzzEmailAddress holds the two ways to one answer).
func domainPassesIDNA(domain string) bool {
	lower := strings.ToLower(domain)
	if isASCII(lower) && !strings.Contains(lower, "xn--") {
		for _, l := range strings.Split(lower, ".") {
			if len(l) > 4 && l[2] == '-' && l[3] == '-' {
				return false
			}
		}
		return dnsShape(lower)
	}
	return domainPassesIDNAFull(lower)
}

// domainPassesIDNAFull is domainPassesIDNA of a lower-cased domain without the shortcut.
func domainPassesIDNAFull(lower string) bool {
	ascii, _, err := processDomain(lower)
	return err == nil && dnsShape(ascii)
}

// dnsShape reports whether the A-label form a has at least two non-empty labels of ASCII
// letters, digits and inner hyphens, and a top-level label that is not all digits.
func dnsShape(a string) bool {
	labels := strings.Split(a, ".")
	if len(labels) < 2 {
		return false
	}
	for _, l := range labels {
		if l == "" || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z') {
				return false
			}
		}
	}
	return strings.Trim(labels[len(labels)-1], "0123456789") != ""
}

// EmailHash is the SHA-256 of the address's key: what an erased entry keeps, and what every
// entry of the suppression list is unique on.
func EmailHash(email string) []byte {
	h := sha256.Sum256([]byte(EmailKey(email)))
	return h[:]
}

// LegacyEmailHash is the SHA-256 of the address's 1.2 key (LegacyEmailKey): what an erased
// entry made before 1.3 holds.
func LegacyEmailHash(email string) []byte {
	h := sha256.Sum256([]byte(LegacyEmailKey(email)))
	return h[:]
}

// EmailHashes are the hashes an entry of the suppression list may hold for email: EmailHash,
// then LegacyEmailHash when it differs. An erased entry made before 1.3 holds the hash of the
// 1.2 key, and must keep matching every address it matched (docs/api-contract.md §18). The
// 1.2 key of an address keys to the address's own key, so an entry with the hash of a 1.3
// key that matches the second hash is of the same address: matching both never matches
// another address.
func EmailHashes(email string) [][]byte {
	h, l := EmailHash(email), LegacyEmailHash(email)
	if string(h) == string(l) {
		return [][]byte{h}
	}
	return [][]byte{h, l}
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}
