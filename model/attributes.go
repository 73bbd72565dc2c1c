package model

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Limits of attributes and tags (docs/api-contract.md §19.1, §19.3).
const (
	MaxAttributes           = 50
	MaxAttributeKeyLength   = 64
	MaxAttributeValueLength = 1000
	MaxAttributesBytes      = 8192
	MaxTags                 = 100
	MaxTagLength            = 64
	MaxFilterValues         = 10
)

// AttributeKeyPattern is the rule of an attribute key, as the contract and the published schema
// write it.
const AttributeKeyPattern = `^[a-z][a-z0-9_]{0,63}$`

// Messages of docs/api-contract.md §19. %s is the field: "attributes", "2.attributes.plan".
const (
	msgAttrValue    = "The %s field must be a string, number or boolean."
	msgAttrMaxKeys  = "The %s field must not have more than %d keys."
	msgAttrMaxBytes = "The %s field must not be greater than %d bytes."
	msgAttrKey      = "The %s field has an invalid key."
	attrAttributes  = "attributes"
	attrTags        = "tags"
)

// UpdateEmptyMessage is §4.5's "at least one field" message from version 1.3 on
// (docs/api-contract.md §19.2), when attributes and tags count as fields of an update.
const UpdateEmptyMessage = "At least one of email, name, status, attributes or tags must be provided."

// UpdateFields are the properties an update (and an upsert's body, without email) may carry
// from version 1.3 on; InputFields plus these two are what a create accepts.
var UpdateFields = []string{"email", "name", "status", attrAttributes, attrTags}

// Attributes are a subscriber's attributes (docs/api-contract.md §19.1): each value is a
// string, a bool or a json.Number in canonical spelling (CanonicalNumber). Parsed and merged
// values always hold to the limits; the zero value is no attributes.
type Attributes map[string]any

// AttributesPatch is an update's attributes (docs/api-contract.md §19.2): a JSON merge patch
// of one level, where a nil value removes the key.
type AttributesPatch map[string]any

// ParseAttributes validates the attributes of a create (one, a bulk item, an import's row),
// decoded JSON as the API decodes it (objects as map[string]any, numbers as json.Number; a
// float64 is taken as its shortest spelling). field is the name the messages use,
// "attributes" or "2.attributes". null values are refused: only an update removes.
func ParseAttributes(raw any, field string) (Attributes, *ValidationError) {
	obj, verr := attributesObject(raw, field)
	if verr != nil {
		return nil, verr
	}
	if len(obj) > MaxAttributes {
		// Only the count: the values of an object this large are not worth a message each.
		return nil, verr.Add(field, fmt.Sprintf(msgAttrMaxKeys, field, MaxAttributes))
	}
	out := make(Attributes, len(obj))
	badKey := false
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		if !ValidAttributeKey(k) {
			badKey = true
			continue
		}
		v, msg := attributeValue(obj[k], field+"."+k)
		if msg != "" {
			verr = verr.Add(field+"."+k, msg)
			continue
		}
		out[k] = v
	}
	if badKey {
		verr = verr.Add(field, fmt.Sprintf(msgAttrKey, field))
	}
	if verr != nil {
		return nil, verr
	}
	if msg := out.checkSize(field); msg != "" {
		return nil, verr.Add(field, msg)
	}
	return out, nil
}

// ParseAttributesPatch validates the attributes of an update (PUT, upsert, a bulk action's
// set_attributes): the rules of ParseAttributes, but null removes a key. The limits of the
// whole object apply to the result of the merge (MergeAttributes), except that a patch that
// sets more than MaxAttributes keys cannot give a valid result and is refused at once.
func ParseAttributesPatch(raw any, field string) (AttributesPatch, *ValidationError) {
	obj, verr := attributesObject(raw, field)
	if verr != nil {
		return nil, verr
	}
	sets := 0
	for _, v := range obj {
		if v != nil {
			sets++
		}
	}
	if sets > MaxAttributes {
		return nil, verr.Add(field, fmt.Sprintf(msgAttrMaxKeys, field, MaxAttributes))
	}
	out := make(AttributesPatch, len(obj))
	badKey := false
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		if !ValidAttributeKey(k) {
			badKey = true
			continue
		}
		if obj[k] == nil {
			out[k] = nil
			continue
		}
		v, msg := attributeValue(obj[k], field+"."+k)
		if msg != "" {
			verr = verr.Add(field+"."+k, msg)
			continue
		}
		out[k] = v
	}
	if badKey {
		verr = verr.Add(field, fmt.Sprintf(msgAttrKey, field))
	}
	if verr != nil {
		return nil, verr
	}
	return out, nil
}

// MergeAttributes applies patch to stored as RFC 7396 does (docs/api-contract.md §19.2): each
// key given is set, a key given as nil is removed, the others stay. The result must hold to
// the limits of the whole object (keyed field, "attributes"). previous holds each key whose
// value changed, with its value before (nil when it had none); it is empty when nothing
// changed, and then result equals stored. stored is not modified.
func MergeAttributes(stored Attributes, patch AttributesPatch, field string) (result Attributes, previous map[string]any, verr *ValidationError) {
	result = maps.Clone(stored)
	if result == nil {
		result = Attributes{}
	}
	previous = map[string]any{}
	for _, k := range slices.Sorted(maps.Keys(patch)) {
		v := patch[k]
		old, had := stored[k]
		switch {
		case v == nil && had:
			delete(result, k)
			previous[k] = old
		case v == nil:
		case !had || !SameAttributeValue(old, v):
			result[k] = v
			previous[k] = nilIfAbsent(old, had)
		}
	}
	if len(result) > MaxAttributes {
		return nil, nil, verr.Add(field, fmt.Sprintf(msgAttrMaxKeys, field, MaxAttributes))
	}
	if msg := result.checkSize(field); msg != "" {
		return nil, nil, verr.Add(field, msg)
	}
	return result, previous, nil
}

func nilIfAbsent(v any, ok bool) any {
	if !ok {
		return nil
	}
	return v
}

// SameAttributeValue reports whether two attribute values are the same value of the same type:
// "5" and 5 differ; numbers compare by their canonical spelling.
func SameAttributeValue(a, b any) bool {
	switch a := a.(type) {
	case string:
		b, ok := b.(string)
		return ok && a == b
	case bool:
		b, ok := b.(bool)
		return ok && a == b
	case json.Number:
		b, ok := b.(json.Number)
		return ok && a == b
	}
	return false
}

// ValidAttributeKey reports whether k matches AttributeKeyPattern.
func ValidAttributeKey(k string) bool {
	if len(k) == 0 || len(k) > MaxAttributeKeyLength || k[0] < 'a' || k[0] > 'z' {
		return false
	}
	for i := 1; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// JSON returns the attributes as compact JSON, keys sorted, nothing escaped that JSON does not
// require (so "<" is one byte): the form the size limit counts, and the one to store.
func (a Attributes) JSON() []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range slices.Sorted(maps.Keys(a)) {
		if i > 0 {
			b.WriteByte(',')
		}
		writeJSONString(&b, k)
		b.WriteByte(':')
		switch v := a[k].(type) {
		case string:
			writeJSONString(&b, v)
		case json.Number:
			b.WriteString(string(v))
		case bool:
			b.WriteString(strconv.FormatBool(v))
		default:
			b.WriteString("null") // never: parsed and merged values are one of the three
		}
	}
	b.WriteByte('}')
	return b.Bytes()
}

// checkSize returns the size message when a's compact JSON is over MaxAttributesBytes.
func (a Attributes) checkSize(field string) string {
	if len(a.JSON()) > MaxAttributesBytes {
		return fmt.Sprintf(msgAttrMaxBytes, field, MaxAttributesBytes)
	}
	return ""
}

func writeJSONString(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	b.Truncate(b.Len() - 1)
}

// DecodeAttributes reads stored attributes (Attributes.JSON, or PostgreSQL's jsonb text of
// them) back. Numbers keep their spelling.
func DecodeAttributes(data []byte) (Attributes, error) {
	var obj map[string]any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&obj); err != nil {
		return nil, fmt.Errorf("decode attributes: %w", err)
	}
	return Attributes(obj), nil
}

func attributesObject(raw any, field string) (map[string]any, *ValidationError) {
	obj, ok := raw.(map[string]any)
	if !ok {
		return nil, (*ValidationError)(nil).Add(field, fmt.Sprintf(msgObject, field))
	}
	return obj, nil
}

// attributeValue returns an attribute's value as stored (a number in canonical spelling), or
// the message that refuses it.
func attributeValue(raw any, field string) (any, string) {
	switch v := raw.(type) {
	case string:
		if strings.IndexFunc(v, ForbiddenInName) >= 0 {
			return nil, fmt.Sprintf(msgInvalidChars, field)
		}
		if utf8.RuneCountInString(v) > MaxAttributeValueLength {
			return nil, fmt.Sprintf(msgMax, field, MaxAttributeValueLength)
		}
		return v, ""
	case bool:
		return v, ""
	case json.Number:
		n, ok := CanonicalNumber(string(v))
		if !ok {
			return nil, fmt.Sprintf(msgAttrValue, field)
		}
		return json.Number(n), ""
	case float64:
		if math.IsInf(v, 0) || math.IsNaN(v) {
			return nil, fmt.Sprintf(msgAttrValue, field)
		}
		n, _ := CanonicalNumber(strconv.FormatFloat(v, 'g', -1, 64))
		return json.Number(n), ""
	}
	return nil, fmt.Sprintf(msgAttrValue, field)
}

// CanonicalNumber returns the one spelling under which a number is stored and compared
// (docs/api-contract.md §19.1, §19.3): plain decimal digits, no exponent, no leading zeros,
// no trailing zeros after the point, no "-0"; 1E+2 → 100, 1.50 → 1.5, -0.0 → 0. It keeps the
// value exact, however many digits. ok is false when s is not a JSON number, when its value is
// beyond the finite range of a double (1e400: a client's JSON parser would read Infinity), or
// when its spelling would be longer than MaxAttributesBytes (1e-9999: no attributes object
// could hold it). Two numbers are equal exactly when their canonical spellings are, which is
// also how PostgreSQL's jsonb compares them.
func CanonicalNumber(s string) (string, bool) {
	neg, intPart, frac, exp, ok := splitJSONNumber(s)
	if !ok {
		return "", false
	}
	if f, err := strconv.ParseFloat(s, 64); err != nil && (math.IsInf(f, 0) || math.IsNaN(f)) {
		return "", false
	}
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		return "0", true
	}
	// value = 0.digits × 10^point, where point counts the digits before the decimal point.
	point := int64(len(intPart)-(len(intPart+frac)-len(digits))) + exp
	digits = strings.TrimRight(digits, "0")
	var length int64
	switch {
	case point <= 0:
		length = 2 - point + int64(len(digits))
	case point >= int64(len(digits)):
		length = point
	default:
		length = int64(len(digits)) + 1
	}
	if length > MaxAttributesBytes {
		return "", false
	}
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	switch {
	case point <= 0:
		b.WriteString("0.")
		b.WriteString(strings.Repeat("0", int(-point)))
		b.WriteString(digits)
	case point >= int64(len(digits)):
		b.WriteString(digits)
		b.WriteString(strings.Repeat("0", int(point)-len(digits)))
	default:
		b.WriteString(digits[:point])
		b.WriteByte('.')
		b.WriteString(digits[point:])
	}
	return b.String(), true
}

// splitJSONNumber parses the JSON number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
// It returns the exponent clamped far beyond any length CanonicalNumber accepts.
func splitJSONNumber(s string) (neg bool, intPart, frac string, exp int64, ok bool) {
	i := 0
	if i < len(s) && s[i] == '-' {
		neg = true
		i++
	}
	start := i
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	intPart = s[start:i]
	if intPart == "" || len(intPart) > 1 && intPart[0] == '0' {
		return false, "", "", 0, false
	}
	if i < len(s) && s[i] == '.' {
		i++
		start = i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		frac = s[start:i]
		if frac == "" {
			return false, "", "", 0, false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		expNeg := false
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			expNeg = s[i] == '-'
			i++
		}
		start = i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			if exp < 1<<40 {
				exp = exp*10 + int64(s[i]-'0')
			}
			i++
		}
		if start == i {
			return false, "", "", 0, false
		}
		if expNeg {
			exp = -exp
		}
	}
	return neg, intPart, frac, exp, i == len(s)
}

// ParseSubscriberAttributes reads the §19 fields of a create's input object (one, a bulk item
// with prefix "2.", an NDJSON line): attributes and tags, both optional (absent: none).
func ParseSubscriberAttributes(obj map[string]any, prefix string) (Attributes, []string, *ValidationError) {
	var (
		attrs Attributes
		tags  []string
		verr  *ValidationError
	)
	if raw, ok := obj[attrAttributes]; ok {
		a, aerr := ParseAttributes(raw, prefix+attrAttributes)
		verr = verr.Merge(aerr)
		attrs = a
	}
	if raw, ok := obj[attrTags]; ok {
		t, terr := ParseTags(raw, prefix+attrTags)
		verr = verr.Merge(terr)
		tags = t
	}
	if verr != nil {
		return nil, nil, verr
	}
	return attrs, tags, nil
}

// ParseSubscriberAttributesPatch reads the §19 fields of an update (PUT, the upsert's body):
// attributes as a merge patch (nil when absent), tags as the whole new set (nil when absent,
// an empty non-nil slice when given as []).
func ParseSubscriberAttributesPatch(obj map[string]any) (AttributesPatch, []string, *ValidationError) {
	var (
		patch AttributesPatch
		tags  []string
		verr  *ValidationError
	)
	if raw, ok := obj[attrAttributes]; ok {
		p, perr := ParseAttributesPatch(raw, attrAttributes)
		verr = verr.Merge(perr)
		patch = p
	}
	if raw, ok := obj[attrTags]; ok {
		t, terr := ParseTags(raw, attrTags)
		verr = verr.Merge(terr)
		if t == nil {
			t = []string{}
		}
		tags = t
	}
	if verr != nil {
		return nil, nil, verr
	}
	return patch, tags, nil
}
