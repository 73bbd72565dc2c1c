package model

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Messages of tags (docs/api-contract.md §19.1, §19.2). %s is the field: "tags", "tags.0",
// "add.1".
const (
	msgTagLength      = "The %s field must be between 1 and %d characters."
	msgMaxItems       = "The %s field must not have more than %d items."
	msgTagsChangeNone = "At least one of add or remove must be provided."
	msgAlsoAdded      = "The %s field must not also be added."
	attrAdd           = "add"
	attrRemove        = "remove"
)

// NormalizeTag is the form under which tags are compared and stored (docs/api-contract.md
// §19.1), and filters and the tags operation select them: trimmed, lower-cased, NFC.
// "  Beta " → "beta".
func NormalizeTag(s string) string {
	return norm.NFC.String(strings.ToLower(strings.TrimSpace(s)))
}

// checkTag returns the normalised tag, or the message that refuses raw: not a string, a
// forbidden character anywhere in it as given (Cc, Cf, Zl, Zp as in names, or a comma, which
// separates tags in an import's column), or not 1 to MaxTagLength characters once normalised.
func checkTag(raw any, field string) (string, string) {
	s, ok := raw.(string)
	if !ok {
		return "", fmt.Sprintf(msgString, field)
	}
	if strings.IndexFunc(s, forbiddenInTag) >= 0 {
		return "", fmt.Sprintf(msgInvalidChars, field)
	}
	t := NormalizeTag(s)
	if n := utf8.RuneCountInString(t); n < 1 || n > MaxTagLength {
		return "", fmt.Sprintf(msgTagLength, field, MaxTagLength)
	}
	return t, ""
}

func forbiddenInTag(r rune) bool { return r == ',' || ForbiddenInName(r) }

// ParseTags validates a set of tags given as decoded JSON (docs/api-contract.md §19.1): an
// array of strings, each normalised (NormalizeTag); a tag given twice counts once; at most
// MaxTags once de-duplicated. It returns them sorted by code point. field is the name the
// messages use: "tags", "2.tags", "add".
func ParseTags(raw any, field string) ([]string, *ValidationError) {
	items, ok := raw.([]any)
	if !ok {
		return nil, (*ValidationError)(nil).Add(field, fmt.Sprintf(msgArray, field))
	}
	tags, _, verr := parseTagList(items, field)
	if verr != nil {
		return nil, verr
	}
	return tags, nil
}

// parseTagList validates each item, and returns the set sorted and the normalised tag of each
// item ("" where it failed).
func parseTagList(items []any, field string) ([]string, []string, *ValidationError) {
	var verr *ValidationError
	each := make([]string, len(items))
	set := make([]string, 0, min(len(items), MaxTags+1))
	for i, it := range items {
		f := field + "." + strconv.Itoa(i)
		t, msg := checkTag(it, f)
		if msg != "" {
			verr = verr.Add(f, msg)
			continue
		}
		each[i] = t
		set = append(set, t)
	}
	set = SortTags(set)
	if len(set) > MaxTags {
		verr = verr.Add(field, fmt.Sprintf(msgMaxItems, field, MaxTags))
	}
	return set, each, verr
}

// SortTags sorts tags by code point and removes duplicates, in place; it returns the set.
func SortTags(tags []string) []string {
	slices.Sort(tags) // byte order of UTF-8 is code point order
	return slices.Compact(tags)
}

// TagsChange is a validated body of POST /subscribers/{id}/tags (docs/api-contract.md
// §19.2): the tags to add and to remove, each normalised, sorted and without duplicates, no
// tag in both.
type TagsChange struct {
	Add, Remove []string
}

// ParseTagsChange validates the body of the tags operation: {"add": [...], "remove": [...]},
// at least one of the two; each list by the rules of tags, keyed add.<i> and remove.<i>; a tag
// in both lists is refused at its place in remove. Other properties are prohibited.
func ParseTagsChange(obj map[string]any) (TagsChange, *ValidationError) {
	var verr *ValidationError
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range obj {
			if k != attrAdd && k != attrRemove && !yield(k) {
				return
			}
		}
	}) {
		verr = verr.Add(k, fmt.Sprintf(msgProhibited, k))
	}
	rawAdd, hasAdd := obj[attrAdd]
	rawRemove, hasRemove := obj[attrRemove]
	if !hasAdd && !hasRemove {
		return TagsChange{}, verr.Add(attrBody, msgTagsChangeNone)
	}
	var c TagsChange
	if hasAdd {
		add, aerr := ParseTags(rawAdd, attrAdd)
		verr = verr.Merge(aerr)
		c.Add = add
	}
	if hasRemove {
		items, ok := rawRemove.([]any)
		if !ok {
			verr = verr.Add(attrRemove, fmt.Sprintf(msgArray, attrRemove))
		} else {
			remove, each, rerr := parseTagList(items, attrRemove)
			verr = verr.Merge(rerr)
			c.Remove = remove
			for i, t := range each {
				if _, added := slices.BinarySearch(c.Add, t); t != "" && added {
					f := attrRemove + "." + strconv.Itoa(i)
					verr = verr.Add(f, fmt.Sprintf(msgAlsoAdded, f))
				}
			}
		}
	}
	if verr != nil {
		return TagsChange{}, verr
	}
	return c, nil
}

// Apply returns the set stored with c applied: c.Add added, c.Remove removed, sorted. changed
// reports whether it differs from stored. More than MaxTags in the result is refused, keyed
// tags (docs/api-contract.md §19.2), and then nothing is to change.
func (c TagsChange) Apply(stored []string) (result []string, changed bool, verr *ValidationError) {
	result = make([]string, 0, len(stored)+len(c.Add))
	for _, t := range stored {
		if _, removed := slices.BinarySearch(c.Remove, t); !removed {
			result = append(result, t)
		}
	}
	result = SortTags(append(result, c.Add...))
	if verr = CheckTagCount(len(result)); verr != nil {
		return nil, false, verr
	}
	return result, !slices.Equal(result, stored), nil
}

// CheckTagCount refuses a subscriber's set of n tags when n is past MaxTags, keyed tags, as
// TagsChange.Apply refuses its result (docs/api-contract.md §19.2); nil within the limit. A
// store that applies a change in SQL reports through it the size the set would have reached.
func CheckTagCount(n int) *ValidationError {
	if n <= MaxTags {
		return nil
	}
	return (*ValidationError)(nil).Add(attrTags, fmt.Sprintf(msgMaxItems, attrTags, MaxTags))
}

// TagCount is a tag of a newsletter with how many of its subscribers (any status) hold it
// (GET /tags, docs/api-contract.md §19.3).
type TagCount struct {
	Tag         string
	Subscribers int64
}

// Default and largest page of GET /tags (docs/api-contract.md §19.3).
const (
	DefaultTagLimit = 100
	MaxTagLimit     = 1000
)

// ParseTagLimit validates GET /tags' limit parameter; "" means the default. An invalid value
// is a *QueryError (400).
func ParseTagLimit(limit string) (int, error) {
	if limit == "" {
		return DefaultTagLimit, nil
	}
	n, ok := parseBoundedInt(limit, 1, MaxTagLimit)
	if !ok {
		return 0, &QueryError{fmt.Sprintf("The limit parameter must be an integer between 1 and %d.", MaxTagLimit)}
	}
	return n, nil
}
