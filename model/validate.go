package model

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Field limits of the contract, counted in Unicode code points.
const (
	MaxEmailLength = 254
	MaxNameLength  = 255
	maxLocalLength = 64
	maxDomainLabel = 63
	maxDomain      = 253
)

// InputFields are the only properties a SubscriberInput may carry.
var InputFields = []string{"email", "name", "status", "attributes", "tags"}

// ValidationError is a failed validation: messages keyed by field, Laravel style
// ("email", "2.email", "body"). It maps to 422 validation_error.
type ValidationError struct {
	Fields map[string][]string
}

func (e *ValidationError) Error() string {
	keys := make([]string, 0, len(e.Fields))
	for k := range e.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return "validation failed: " + strings.Join(keys, ", ")
}

// Add records msg under key, creating the error if needed, and returns it.
func (e *ValidationError) Add(key, msg string) *ValidationError {
	if e == nil {
		e = &ValidationError{}
	}
	if e.Fields == nil {
		e.Fields = map[string][]string{}
	}
	e.Fields[key] = append(e.Fields[key], msg)
	return e
}

// Merge adds every message of other to e and returns the result.
func (e *ValidationError) Merge(other *ValidationError) *ValidationError {
	if other == nil {
		return e
	}
	keys := make([]string, 0, len(other.Fields))
	for k := range other.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		for _, m := range other.Fields[k] {
			e = e.Add(k, m)
		}
	}
	return e
}

// QueryError is an invalid query parameter. It maps to 400 validation_error without field errors.
type QueryError struct{ Message string }

func (e *QueryError) Error() string { return e.Message }

// Messages of the contract (docs/api-contract.md §3). %s is the attribute: "email", "2.email".
const (
	msgRequired     = "The %s field is required."
	msgString       = "The %s field must be a string."
	msgEmail        = "The %s field must be a valid email address."
	msgMax          = "The %s field must not be greater than %d characters."
	msgInvalidChars = "The %s field contains invalid characters."
	msgSelected     = "The selected %s is invalid; it must be active or pending."
	msgProhibited   = "The %s field is prohibited."
	msgObject       = "The %s field must be an object."
	msgDistinct     = "The %s field has a duplicate value."
	msgBulkMin      = "The body field must have at least 1 item."
	msgBulkMax      = "The body field must not have more than %d items."
	msgQueryPage    = "The page parameter must be an integer greater than or equal to 1."
	msgQueryLimit   = "The limit parameter must be an integer between 1 and 100."
	msgQueryStatus  = "The status filter must be one of: active, pending, unsubscribed."
	msgQueryEmail   = "The email filter must be a valid email address."
	attrBody        = "body"
	attrEmail       = "email"
	attrName        = "name"
	attrStatus      = "status"
)

// msgUnsubscribe is msgSelected for status "unsubscribed" on update: that is DELETE's job.
const msgUnsubscribe = "The selected %s is invalid; it must be active or pending. To unsubscribe, send DELETE /api/v1/subscribers/{id}."

// EmailTakenMessage is the message for an email that already exists in the newsletter.
const EmailTakenMessage = "Email is already subscribed to this newsletter."

// ParseCreate validates one SubscriberInput object (decoded JSON) for create.
func ParseCreate(obj map[string]any) (NewSubscriber, *ValidationError) {
	return parseInput(obj, "")
}

// ParseBulk validates a bulk create body: 1 to MaxBulkItems SubscriberInput objects, no two
// with the same email (case-insensitive). Keys are "<index>.<field>". When items fail but
// their number is right, the items come back too, each with its email only if that passed its
// rules, so that the caller can add the emails already taken to the same 422 (§3: every
// failing field at once).
func ParseBulk(items []any) ([]NewSubscriber, *ValidationError) {
	return parseBulk(items, MaxBulkItems, EmailKey, func(obj map[string]any, prefix string) (NewSubscriber, string, bool, *ValidationError) {
		ns, emailOK, verr := parseItem(obj, prefix)
		if !emailOK {
			ns.Email = ""
		}
		return ns, ns.Email, emailOK, verr
	})
}

// parseBulk is the shape every bulk body shares: 1 to max objects, each validated by item with
// keys "<prefix><field>" (prefix "<index>."), no two whose valid email has the same key. item
// returns the parsed value, its email and whether the email passed its rules. Duplicates are
// judged on the email alone, whatever else the item gets wrong, so that every failing field is
// reported at once. It returns every item, and the errors.
func parseBulk[T any](items []any, max int, key func(string) string,
	item func(obj map[string]any, prefix string) (T, string, bool, *ValidationError)) ([]T, *ValidationError) {
	var verr *ValidationError
	switch {
	case len(items) < 1:
		return nil, verr.Add(attrBody, msgBulkMin)
	case len(items) > max:
		return nil, verr.Add(attrBody, fmt.Sprintf(msgBulkMax, max))
	}
	out := make([]T, len(items))
	seen := make(map[string]struct{}, len(items))
	for i, it := range items {
		prefix := strconv.Itoa(i) + "."
		obj, ok := it.(map[string]any)
		if !ok {
			verr = verr.Add(strconv.Itoa(i), fmt.Sprintf(msgObject, strconv.Itoa(i)))
			continue
		}
		v, email, emailOK, itemErr := item(obj, prefix)
		verr = verr.Merge(itemErr)
		if emailOK {
			k := key(email)
			if _, dup := seen[k]; dup {
				verr = verr.Add(prefix+attrEmail, fmt.Sprintf(msgDistinct, prefix+attrEmail))
			}
			seen[k] = struct{}{}
		}
		out[i] = v
	}
	return out, verr
}

// BulkEmailTaken builds the 422 for bulk items whose email already exists in the newsletter.
func BulkEmailTaken(indexes []int) *ValidationError {
	var verr *ValidationError
	for _, i := range indexes {
		verr = verr.Add(strconv.Itoa(i)+"."+attrEmail, EmailTakenMessage)
	}
	return verr
}

// ParsePatch validates an update body: any of email, name, status; at least one.
func ParsePatch(obj map[string]any) (SubscriberPatch, *ValidationError) {
	var (
		p    SubscriberPatch
		verr = prohibitUnknown(obj, "", nil)
	)
	if len(obj) == 0 {
		return p, verr.Add(attrBody, UpdateEmptyMessage)
	}
	attrs, tags, aerr := ParseSubscriberAttributesPatch(obj)
	verr = verr.Merge(aerr)
	p.Attributes, p.Tags = attrs, tags
	if raw, ok := obj[attrEmail]; ok {
		email, msg := checkEmail(raw, attrEmail)
		if msg != "" {
			verr = verr.Add(attrEmail, msg)
		} else {
			p.Email = &email
		}
	}
	if raw, ok := obj[attrName]; ok {
		name, msg := checkName(raw, attrName)
		if msg != "" {
			verr = verr.Add(attrName, msg)
		} else {
			p.Name = &name
		}
	}
	if raw, ok := obj[attrStatus]; ok {
		st, msg := checkStatus(raw, attrStatus)
		if raw == string(StatusUnsubscribed) {
			msg = fmt.Sprintf(msgUnsubscribe, attrStatus)
		}
		if msg != "" {
			verr = verr.Add(attrStatus, msg)
		} else {
			p.Status = &st
		}
	}
	if verr != nil {
		return SubscriberPatch{}, verr
	}
	return p, nil
}

// ParseUpsert validates an upsert by email (docs/api-contract.md §16.1): the address from the
// path, by the §3 email rule (keyed email), and a body of name and status by the update's
// rules, empty allowed; an email property is prohibited, as the address is the path's. It
// returns the subscriber to create when the address is new (status active unless given) and
// the patch to apply when it exists.
func ParseUpsert(email string, obj map[string]any) (NewSubscriber, SubscriberPatch, *ValidationError) {
	var verr *ValidationError
	addr, msg := checkEmail(email, attrEmail)
	if msg != "" {
		verr = verr.Add(attrEmail, msg)
	}
	fields := obj
	if _, ok := obj[attrEmail]; ok {
		verr = verr.Add(attrEmail, fmt.Sprintf(msgProhibited, attrEmail))
		fields = maps.Clone(obj)
		delete(fields, attrEmail)
	}
	var p SubscriberPatch
	if len(fields) > 0 { // none given: the subscriber is left as it is
		var perr *ValidationError
		p, perr = ParsePatch(fields)
		verr = verr.Merge(perr)
	}
	if verr != nil {
		return NewSubscriber{}, SubscriberPatch{}, verr
	}
	ns := NewSubscriber{Email: addr, Status: StatusActive}
	if p.Name != nil {
		ns.FirstName, ns.LastName = SplitName(*p.Name)
	}
	if p.Status != nil {
		ns.Status = *p.Status
	}
	if p.Attributes != nil { // a new subscriber's attributes: the patch's, nulls removing nothing
		attrs, _, aerr := MergeAttributes(nil, p.Attributes, attrAttributes)
		if aerr != nil {
			return NewSubscriber{}, SubscriberPatch{}, aerr
		}
		ns.Attributes = attrs
	}
	ns.Tags = p.Tags
	return ns, p, nil
}

func parseInput(obj map[string]any, prefix string) (NewSubscriber, *ValidationError) {
	ns, _, verr := parseItem(obj, prefix)
	if verr != nil {
		return NewSubscriber{}, verr
	}
	return ns, nil
}

// parseItem validates one input object. ns.Email is the valid email whenever emailOK, even
// when other fields fail.
func parseItem(obj map[string]any, prefix string) (ns NewSubscriber, emailOK bool, verr *ValidationError) {
	verr = prohibitUnknown(obj, prefix, nil)
	ns = NewSubscriber{Status: StatusActive}

	attr := prefix + attrEmail
	if raw, ok := obj[attrEmail]; ok {
		email, msg := checkEmail(raw, attr)
		if msg != "" {
			verr = verr.Add(attr, msg)
		}
		ns.Email, emailOK = email, msg == ""
	} else {
		verr = verr.Add(attr, fmt.Sprintf(msgRequired, attr))
	}

	if raw, ok := obj[attrName]; ok {
		attr := prefix + attrName
		name, msg := checkName(raw, attr)
		if msg != "" {
			verr = verr.Add(attr, msg)
		}
		ns.FirstName, ns.LastName = SplitName(name)
	}

	if raw, ok := obj[attrStatus]; ok {
		attr := prefix + attrStatus
		st, msg := checkStatus(raw, attr)
		if msg != "" {
			verr = verr.Add(attr, msg)
		}
		ns.Status = st
	}
	attrs, tags, aerr := ParseSubscriberAttributes(obj, prefix)
	verr = verr.Merge(aerr)
	ns.Attributes, ns.Tags = attrs, tags
	return ns, emailOK, verr
}

// prohibitUnknown reports every property that is not an input field, in a stable order.
func prohibitUnknown(obj map[string]any, prefix string, verr *ValidationError) *ValidationError {
	return verr.Merge(prohibitOthers(obj, InputFields, prefix))
}

// prohibitOthers refuses every property of obj not in allowed, keyed prefix+property, in a
// stable order.
func prohibitOthers(obj map[string]any, allowed []string, prefix string) *ValidationError {
	var verr *ValidationError
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		if !slices.Contains(allowed, k) {
			verr = verr.Add(prefix+k, fmt.Sprintf(msgProhibited, prefix+k))
		}
	}
	return verr
}

// checkEmail returns the trimmed email, or the message that rejects raw.
func checkEmail(raw any, attr string) (string, string) {
	s, ok := raw.(string)
	switch {
	case raw == nil:
		return "", fmt.Sprintf(msgRequired, attr)
	case !ok:
		return "", fmt.Sprintf(msgString, attr)
	}
	s = strings.TrimSpace(s)
	switch {
	case s == "":
		return "", fmt.Sprintf(msgRequired, attr)
	case utf8.RuneCountInString(s) > MaxEmailLength:
		return "", fmt.Sprintf(msgMax, attr, MaxEmailLength)
	case !ValidEmail(s):
		return "", fmt.Sprintf(msgEmail, attr)
	}
	return s, ""
}

// checkName returns the trimmed name ("" for null), or the message that rejects raw.
func checkName(raw any, attr string) (string, string) { return checkNameMax(raw, attr, MaxNameLength) }

// checkNameMax is checkName with at most max characters (a segment's name: §20.1).
func checkNameMax(raw any, attr string, max int) (string, string) {
	if raw == nil {
		return "", ""
	}
	s, ok := raw.(string)
	if !ok {
		return "", fmt.Sprintf(msgString, attr)
	}
	// A control character anywhere in the value as given is refused, even one that trimming
	// would remove; the length is that of the trimmed name, as for email.
	if strings.IndexFunc(s, ForbiddenInName) >= 0 {
		return "", fmt.Sprintf(msgInvalidChars, attr)
	}
	s = strings.TrimSpace(s)
	if utf8.RuneCountInString(s) > max {
		return "", fmt.Sprintf(msgMax, attr, max)
	}
	return s, ""
}

func checkStatus(raw any, attr string) (Status, string) {
	s, _ := raw.(string)
	for _, st := range InputStatuses {
		if string(st) == s {
			return st, ""
		}
	}
	return "", fmt.Sprintf(msgSelected, attr)
}

// ForbiddenInName reports whether a name may not contain r (docs/api-contract.md §3, §17):
// every character of the Unicode categories Cc (controls, C0 and C1), Cf (invisible format
// and bidirectional controls such as U+200B, U+202E, U+2066, U+061C and U+FEFF), Zl and Zp
// (U+2028, U+2029), with which a name could break a line, or reorder or hide what a reader
// sees, in the email's To: header above all.
func ForbiddenInName(r rune) bool {
	if r < 0x80 { // most names are ASCII: spare them the table lookups
		return r <= 0x1f || r == 0x7f
	}
	return unicode.In(r, NameForbiddenCategories...)
}

// NameForbiddenCategories are the Unicode categories ForbiddenInName refuses.
var NameForbiddenCategories = []*unicode.RangeTable{unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp}

// NamePattern is the pattern the published schema gives name: one character class that
// excludes every character of NameForbiddenCategories up to U+FFFF, written so that Go's
// regexp and ECMA-262 (JSON Schema's) read it alike: \xHH below U+0100, the character itself
// above (they share no escape for those). The few such characters above U+FFFF (format
// characters of historic scripts and the tag characters) are left out: ECMA-262 without its u
// flag, as linters and many validators read patterns, sees them as pairs of surrogates and
// refuses the class; the schema's description names them instead.
func NamePattern() string {
	var b strings.Builder
	b.WriteString("^[^")
	write := func(r rune) {
		if r < 0x100 {
			fmt.Fprintf(&b, "\\x%02x", r)
			return
		}
		b.WriteRune(r)
	}
	for _, rg := range mergedRanges(NameForbiddenCategories) {
		if rg[0] > 0xffff {
			break
		}
		rg[1] = min(rg[1], 0xffff)
		write(rg[0])
		if rg[1] > rg[0] {
			b.WriteByte('-')
			write(rg[1])
		}
	}
	b.WriteString("]*$")
	return b.String()
}

// NamePatternOmits lists the characters NamePattern leaves out, as "U+E0001, U+E0020–U+E007F":
// those of NameForbiddenCategories above U+FFFF.
func NamePatternOmits() string {
	var out []string
	for _, rg := range mergedRanges(NameForbiddenCategories) {
		switch {
		case rg[1] <= 0xffff:
		case rg[0] == rg[1]:
			out = append(out, fmt.Sprintf("U+%04X", rg[0]))
		default:
			out = append(out, fmt.Sprintf("U+%04X–U+%04X", max(rg[0], 0x10000), rg[1]))
		}
	}
	return strings.Join(out, ", ")
}

// mergedRanges lists the characters of tables as sorted, merged [lo, hi] ranges.
func mergedRanges(tables []*unicode.RangeTable) [][2]rune {
	var out [][2]rune
	add := func(lo, hi, stride rune) {
		for r := lo; r <= hi; r += stride {
			end := r
			if stride == 1 {
				end = hi
			}
			out = append(out, [2]rune{r, end})
			if stride == 1 {
				break
			}
		}
	}
	for _, t := range tables {
		for _, rg := range t.R16 {
			add(rune(rg.Lo), rune(rg.Hi), rune(rg.Stride))
		}
		for _, rg := range t.R32 {
			add(rune(rg.Lo), rune(rg.Hi), rune(rg.Stride))
		}
	}
	slices.SortFunc(out, func(a, b [2]rune) int { return int(a[0] - b[0]) })
	merged := out[:0]
	for _, rg := range out {
		if n := len(merged); n > 0 && rg[0] <= merged[n-1][1]+1 {
			merged[n-1][1] = max(merged[n-1][1], rg[1])
			continue
		}
		merged = append(merged, rg)
	}
	return merged
}

// ValidEmail reports whether s is one plain address local@domain: no display name, no spaces
// or quotes, a dot-atom local part of at most 64 characters, and a domain of at least two
// labels of letters (Unicode allowed), digits and inner hyphens.
func ValidEmail(s string) bool {
	at := strings.LastIndexByte(s, '@')
	if at <= 0 || at == len(s)-1 {
		return false
	}
	return validLocal(s[:at]) && validDomain(s[at+1:])
}

func validLocal(local string) bool {
	if utf8.RuneCountInString(local) > maxLocalLength {
		return false
	}
	for _, atom := range strings.Split(local, ".") {
		if atom == "" {
			return false // leading, trailing or doubled dot
		}
		for _, r := range atom {
			if !isAtext(r) {
				return false
			}
		}
	}
	return true
}

func isAtext(r rune) bool {
	switch {
	case r < utf8.RuneSelf:
		return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
			strings.ContainsRune("!#$%&'*+/=?^_`{|}~-", r)
	default:
		return unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r)
	}
}

func validDomain(domain string) bool {
	// docs/api-contract.md §18: the domain must pass the IDNA processing that keys the
	// address and names it in the SMTP envelope, and still be a domain in the form the
	// envelope names (a mapping may empty a label or leave a top level of digits).
	return validDomainLabels(domain) && domainPassesIDNA(domain)
}

// validDomainLabels is the §3 rule of the domain as given: at least two labels of letters
// (Unicode allowed), digits and inner hyphens, a top level that is not all digits.
func validDomainLabels(domain string) bool {
	if utf8.RuneCountInString(domain) > maxDomain {
		return false
	}
	labels := strings.Split(domain, ".")
	if len(labels) < 2 {
		return false
	}
	for _, l := range labels {
		if l == "" || utf8.RuneCountInString(l) > maxDomainLabel || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, r := range l {
			if !(r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' ||
				r >= utf8.RuneSelf && (unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r))) {
				return false
			}
		}
	}
	// A top-level label of digits only is an IP address, not a domain.
	tld := labels[len(labels)-1]
	return strings.TrimFunc(tld, func(r rune) bool { return r >= '0' && r <= '9' }) != ""
}

// msgQueryPageMax refuses a page number too large for an int; any smaller one past the end
// is an empty page (docs/api-contract.md §4.3).
var msgQueryPageMax = "The page parameter must not be greater than " + strconv.Itoa(math.MaxInt) + "."

// ParseListQuery validates the list parameters; "" means absent. Invalid values give a
// *QueryError (400).
func ParseListQuery(page, limit, status string) (ListQuery, error) {
	q := ListQuery{Page: DefaultPage, Limit: DefaultLimit}
	if page != "" {
		n, ok := parseBoundedInt(page, 1, math.MaxInt)
		switch {
		case !ok && strings.TrimLeft(page, "0123456789") == "" && strings.TrimLeft(page, "0") != "":
			return ListQuery{}, &QueryError{msgQueryPageMax} // digits, not zero: beyond an int
		case !ok:
			return ListQuery{}, &QueryError{msgQueryPage}
		}
		q.Page = n
	}
	if limit != "" {
		n, ok := parseBoundedInt(limit, 1, MaxLimit)
		if !ok {
			return ListQuery{}, &QueryError{msgQueryLimit}
		}
		q.Limit = n
	}
	if status != "" {
		st, ok := ParseStatus(status)
		if !ok {
			return ListQuery{}, &QueryError{msgQueryStatus}
		}
		q.Status = st
	}
	return q, nil
}

// ParseEmailFilter validates the list's email filter (docs/api-contract.md §9.1): the §3 email
// rule after trimming. It returns the trimmed address or a *QueryError (400).
func ParseEmailFilter(raw string) (string, error) {
	if s, msg := checkEmail(raw, attrEmail); msg == "" {
		return s, nil
	}
	return "", &QueryError{msgQueryEmail}
}

// parseBoundedInt accepts only plain decimal digits within [lo, hi].
func parseBoundedInt(s string, lo, hi int) (int, bool) {
	if strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		return 0, false
	}
	return n, true
}
