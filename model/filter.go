package model

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Filter selects a newsletter's subscribers (docs/api-contract.md §19.3, §20.1): every
// condition set must hold. It comes from the list's query string (ParseFilterQuery) or from a
// segment's filter object (ParseSegmentFilter), through one set of rules. The zero value
// selects everyone.
type Filter struct {
	// Status, when set, is the one status selected (a segment's; the list has its own).
	Status Status
	// Tags are tags the subscriber has, all of them; NotTags tags it has none of. Both
	// normalised (NormalizeTag), sorted, without duplicates.
	Tags, NotTags []string
	// Attributes are attribute conditions (MatchAttribute), sorted by key: one per key,
	// except in a filter made by And, where two on one key must both hold.
	Attributes []AttributeCondition
	// HasAttributes are keys the subscriber has an attribute for, sorted.
	HasAttributes []string
	// CreatedAfter and CreatedBefore, when set, are exclusive bounds of created_at.
	CreatedAfter, CreatedBefore *time.Time
}

// AttributeCondition is attr[Key]=Value: see MatchAttribute.
type AttributeCondition struct {
	Key, Value string
}

// FilterQuery is the list's filters as its query string gives them (docs/api-contract.md
// §19.3): tag, not_tag and has_attr repeated; attr[<key>] as a deepObject; the bounds as given,
// "" when absent.
type FilterQuery struct {
	Tag, NotTag, HasAttr        []string
	Attr                        map[string]string
	CreatedAfter, CreatedBefore string
}

// The parts of a filter, by their names in a segment's filter object and in the query.
type filterPart struct{ field, param string }

var (
	partStatus        = filterPart{"status", "status"}
	partTags          = filterPart{"tags", "tag"}
	partNotTags       = filterPart{"not_tags", "not_tag"}
	partAttributes    = filterPart{"attributes", "attr"}
	partHasAttributes = filterPart{"has_attributes", "has_attr"}
	partCreatedAfter  = filterPart{"created_after", "created_after"}
	partCreatedBefore = filterPart{"created_before", "created_before"}
	filterParts       = []filterPart{partStatus, partTags, partNotTags, partAttributes, partHasAttributes, partCreatedAfter, partCreatedBefore}
)

// problemKind is what is wrong with a part of a filter; filterProblem.message words it for
// the query (400) or for a segment's field (422).
type problemKind int

const (
	probNotArray problemKind = iota
	probNotObject
	probNotString
	probInvalidChars
	probTagLength
	probTooMany
	probKey
	probValue
	probValueLength
	probTime
	probStatus
)

// filterProblem is one broken rule: the part, and the item (index) or attribute (key) in it.
type filterProblem struct {
	part  filterPart
	index int // -1: the part itself
	key   string
	kind  problemKind
}

const (
	msgFilterTagLength = "The %s filter must be between 1 and %d characters."
	msgFilterChars     = "The %s filter contains invalid characters."
	msgFilterTooMany   = "The %s filter takes at most %d values."
	msgFilterKey       = "The %s filter key must match " + AttributeKeyPattern + "."
	msgFilterValueMax  = "The %s filter must not be greater than %d characters."
	msgFilterTime      = "The %s filter must be an RFC 3339 date-time."
	msgFilterInvalid   = "The %s filter is invalid."
	msgFieldTooMany    = "The %s field must not have more than %d items."
	msgFieldTooManyKey = "The %s field must not have more than %d keys."
	msgFieldKey        = "The %s field must match " + AttributeKeyPattern + "."
	msgFieldTime       = "The %s field must be an RFC 3339 date-time."
	msgFieldStatus     = "The selected %s is invalid; it must be active, pending or unsubscribed."
)

// queryMessage words p as the 400 of a list's query string.
func (p filterProblem) queryMessage() string {
	name := p.part.param
	switch p.kind {
	case probTagLength:
		return fmt.Sprintf(msgFilterTagLength, name, MaxTagLength)
	case probInvalidChars:
		return fmt.Sprintf(msgFilterChars, name)
	case probTooMany:
		return fmt.Sprintf(msgFilterTooMany, name, MaxFilterValues)
	case probKey:
		return fmt.Sprintf(msgFilterKey, name)
	case probValueLength:
		return fmt.Sprintf(msgFilterValueMax, name, MaxAttributeValueLength)
	case probTime:
		return fmt.Sprintf(msgFilterTime, name)
	case probStatus:
		return msgQueryStatus
	}
	return fmt.Sprintf(msgFilterInvalid, name) // types: a query string has only strings
}

// fieldProblem words p as a 422 field error of a filter object named field ("filter").
func (p filterProblem) field(field string) (key, msg string) {
	key = field + "." + p.part.field
	switch {
	case p.index >= 0:
		key += "." + strconv.Itoa(p.index)
	case p.key != "":
		key += "." + p.key
	}
	switch p.kind {
	case probNotArray:
		return key, fmt.Sprintf(msgArray, key)
	case probNotObject:
		return key, fmt.Sprintf(msgObject, key)
	case probNotString:
		return key, fmt.Sprintf(msgString, key)
	case probInvalidChars:
		return key, fmt.Sprintf(msgInvalidChars, key)
	case probTagLength:
		return key, fmt.Sprintf(msgTagLength, key, MaxTagLength)
	case probTooMany:
		if p.part == partAttributes {
			return key, fmt.Sprintf(msgFieldTooManyKey, key, MaxFilterValues)
		}
		return key, fmt.Sprintf(msgFieldTooMany, key, MaxFilterValues)
	case probKey:
		if p.part == partAttributes {
			return key, fmt.Sprintf(msgAttrKey, key)
		}
		return key, fmt.Sprintf(msgFieldKey, key)
	case probValue:
		return key, fmt.Sprintf(msgAttrValue, key)
	case probValueLength:
		return key, fmt.Sprintf(msgMax, key, MaxAttributeValueLength)
	case probTime:
		return key, fmt.Sprintf(msgFieldTime, key)
	case probStatus:
		return key, fmt.Sprintf(msgFieldStatus, key)
	}
	return key, fmt.Sprintf(msgFilterInvalid, key)
}

// rawFilter is a filter before validation, from either source: a nil pointer is a part not
// given. List items and attribute values are decoded JSON (strings, from a query).
type rawFilter struct {
	status, createdAfter, createdBefore *any
	tags, notTags, hasAttributes        *any
	attributes                          *any
}

// validate is the one set of rules of a filter. It returns the filter and every problem, in
// the order of filterParts, then of the items.
func (r rawFilter) validate() (Filter, []filterProblem) {
	var (
		f     Filter
		probs []filterProblem
	)
	if r.status != nil {
		s, _ := (*r.status).(string)
		if st, ok := ParseStatus(s); ok {
			f.Status = st
		} else {
			probs = append(probs, filterProblem{partStatus, -1, "", probStatus})
		}
	}
	var p []filterProblem
	f.Tags, p = filterTags(r.tags, partTags)
	probs = append(probs, p...)
	f.NotTags, p = filterTags(r.notTags, partNotTags)
	probs = append(probs, p...)
	f.Attributes, p = filterAttributes(r.attributes)
	probs = append(probs, p...)
	f.HasAttributes, p = filterKeys(r.hasAttributes)
	probs = append(probs, p...)
	f.CreatedAfter, p = filterTime(r.createdAfter, partCreatedAfter)
	probs = append(probs, p...)
	f.CreatedBefore, p = filterTime(r.createdBefore, partCreatedBefore)
	probs = append(probs, p...)
	if len(probs) > 0 {
		return Filter{}, probs
	}
	return f, nil
}

func filterList(raw *any, part filterPart) ([]any, []filterProblem) {
	items, ok := (*raw).([]any)
	switch {
	case !ok:
		return nil, []filterProblem{{part, -1, "", probNotArray}}
	case len(items) > MaxFilterValues:
		return nil, []filterProblem{{part, -1, "", probTooMany}}
	}
	return items, nil
}

func filterTags(raw *any, part filterPart) ([]string, []filterProblem) {
	if raw == nil {
		return nil, nil
	}
	items, probs := filterList(raw, part)
	var tags []string
	for i, it := range items {
		s, ok := it.(string)
		switch {
		case !ok:
			probs = append(probs, filterProblem{part, i, "", probNotString})
		case strings.IndexFunc(s, forbiddenInTag) >= 0:
			probs = append(probs, filterProblem{part, i, "", probInvalidChars})
		default:
			t := NormalizeTag(s)
			if n := utf8.RuneCountInString(t); n < 1 || n > MaxTagLength {
				probs = append(probs, filterProblem{part, i, "", probTagLength})
				continue
			}
			tags = append(tags, t)
		}
	}
	return SortTags(tags), probs
}

func filterKeys(raw *any) ([]string, []filterProblem) {
	if raw == nil {
		return nil, nil
	}
	items, probs := filterList(raw, partHasAttributes)
	var keys []string
	for i, it := range items {
		s, ok := it.(string)
		switch {
		case !ok:
			probs = append(probs, filterProblem{partHasAttributes, i, "", probNotString})
		case !ValidAttributeKey(s):
			probs = append(probs, filterProblem{partHasAttributes, i, "", probKey})
		default:
			keys = append(keys, s)
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys), probs
}

func filterAttributes(raw *any) ([]AttributeCondition, []filterProblem) {
	if raw == nil {
		return nil, nil
	}
	obj, ok := (*raw).(map[string]any)
	switch {
	case !ok:
		return nil, []filterProblem{{partAttributes, -1, "", probNotObject}}
	case len(obj) > MaxFilterValues:
		return nil, []filterProblem{{partAttributes, -1, "", probTooMany}}
	}
	var (
		conds  []AttributeCondition
		probs  []filterProblem
		badKey bool
	)
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		if !ValidAttributeKey(k) {
			badKey = true
			continue
		}
		v, kind, ok := filterValue(obj[k])
		if !ok {
			probs = append(probs, filterProblem{partAttributes, -1, k, kind})
			continue
		}
		conds = append(conds, AttributeCondition{Key: k, Value: v})
	}
	if badKey {
		probs = append([]filterProblem{{partAttributes, -1, "", probKey}}, probs...)
	}
	return conds, probs
}

// filterValue is the text an attribute condition matches: a string as it is (at most
// MaxAttributeValueLength characters, none forbidden in attribute values: no attribute could
// match more), a number in its canonical spelling, a boolean as true or false.
func filterValue(raw any) (string, problemKind, bool) {
	switch v := raw.(type) {
	case string:
		if strings.IndexFunc(v, ForbiddenInName) >= 0 {
			return "", probInvalidChars, false
		}
		if utf8.RuneCountInString(v) > MaxAttributeValueLength {
			return "", probValueLength, false
		}
		return v, 0, true
	case bool:
		return strconv.FormatBool(v), 0, true
	case json.Number:
		if n, ok := CanonicalNumber(string(v)); ok {
			return n, 0, true
		}
	}
	return "", probValue, false
}

func filterTime(raw *any, part filterPart) (*time.Time, []filterProblem) {
	if raw == nil {
		return nil, nil
	}
	s, ok := (*raw).(string)
	if !ok {
		return nil, []filterProblem{{part, -1, "", probNotString}}
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return nil, []filterProblem{{part, -1, "", probTime}}
	}
	return &t, nil
}

// ParseFilterQuery validates the list's filters from its query string (docs/api-contract.md
// §19.3). An invalid one gives a *QueryError (400) naming the parameter: the first problem in
// the order tag, not_tag, attr, has_attr, created_after, created_before.
func ParseFilterQuery(q FilterQuery) (Filter, error) {
	var r rawFilter
	strs := func(ss []string) *any {
		if ss == nil {
			return nil
		}
		items := make([]any, len(ss))
		for i, s := range ss {
			items[i] = s
		}
		var v any = items
		return &v
	}
	str := func(s string) *any {
		if s == "" {
			return nil
		}
		var v any = s
		return &v
	}
	r.tags, r.notTags, r.hasAttributes = strs(q.Tag), strs(q.NotTag), strs(q.HasAttr)
	if q.Attr != nil {
		obj := make(map[string]any, len(q.Attr))
		for k, v := range q.Attr {
			obj[k] = v
		}
		var v any = obj
		r.attributes = &v
	}
	r.createdAfter, r.createdBefore = str(q.CreatedAfter), str(q.CreatedBefore)
	f, probs := r.validate()
	if len(probs) > 0 {
		return Filter{}, &QueryError{probs[0].queryMessage()}
	}
	return f, nil
}

// ParseSegmentFilter validates a segment's filter object (docs/api-contract.md §20.1), decoded
// JSON, by the rules of ParseFilterQuery. Problems are 422 field errors under field
// ("filter"): filter.tags.0, filter.attributes.plan. {} selects everyone.
func ParseSegmentFilter(raw any, field string) (Filter, *ValidationError) {
	obj, ok := raw.(map[string]any)
	if !ok {
		return Filter{}, (*ValidationError)(nil).Add(field, fmt.Sprintf(msgObject, field))
	}
	var (
		r    rawFilter
		verr *ValidationError
	)
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		v := obj[k]
		switch k {
		case partStatus.field:
			r.status = &v
		case partTags.field:
			r.tags = &v
		case partNotTags.field:
			r.notTags = &v
		case partAttributes.field:
			r.attributes = &v
		case partHasAttributes.field:
			r.hasAttributes = &v
		case partCreatedAfter.field:
			r.createdAfter = &v
		case partCreatedBefore.field:
			r.createdBefore = &v
		default:
			key := field + "." + k
			verr = verr.Add(key, fmt.Sprintf(msgProhibited, key))
		}
	}
	f, probs := r.validate()
	for _, p := range probs {
		verr = verr.Add(p.field(field))
	}
	if verr != nil {
		return Filter{}, verr
	}
	return f, nil
}

// MatchAttribute is the rule of attr[key]=value (docs/api-contract.md §19.3): the attribute is
// a string equal to value, or a number or boolean whose JSON text (canonical, as stored)
// equals value: "5" matches 5 and "5", "false" matches false and "false".
func MatchAttribute(attrs Attributes, key, value string) bool {
	switch v := attrs[key].(type) {
	case string:
		return v == value
	case json.Number:
		return string(v) == value
	case bool:
		return strconv.FormatBool(v) == value
	}
	return false
}

// AttributeProbes are the JSON objects whose containment (PostgreSQL's jsonb @>) selects what
// MatchAttribute(attrs, key, value) selects: {"key": "value"}, and {"key": value} too when
// value spells a stored number (in canonical spelling) or a boolean. Stored numbers being
// canonical, jsonb's numeric equality is then the equality of their JSON text.
func AttributeProbes(key, value string) [][]byte {
	probes := [][]byte{Attributes{key: value}.JSON()}
	switch n, ok := CanonicalNumber(value); {
	case value == "true" || value == "false":
		probes = append(probes, Attributes{key: value == "true"}.JSON())
	case ok && n == value:
		probes = append(probes, Attributes{key: json.Number(value)}.JSON())
	}
	return probes
}

// Match reports whether a subscriber with this status, creation time, attributes and tags
// (sorted, as stored) is selected by f: the reference the stores' SQL is tested against.
func (f Filter) Match(status Status, createdAt time.Time, attrs Attributes, tags []string) bool {
	if f.Status != "" && status != f.Status {
		return false
	}
	for _, t := range f.Tags {
		if _, ok := slices.BinarySearch(tags, t); !ok {
			return false
		}
	}
	for _, t := range f.NotTags {
		if _, ok := slices.BinarySearch(tags, t); ok {
			return false
		}
	}
	for _, c := range f.Attributes {
		if !MatchAttribute(attrs, c.Key, c.Value) {
			return false
		}
	}
	for _, k := range f.HasAttributes {
		if _, ok := attrs[k]; !ok {
			return false
		}
	}
	if f.CreatedAfter != nil && !createdAt.After(*f.CreatedAfter) {
		return false
	}
	if f.CreatedBefore != nil && !createdAt.Before(*f.CreatedBefore) {
		return false
	}
	return true
}

// IsZero reports whether f selects everyone.
func (f Filter) IsZero() bool {
	return f.Status == "" && len(f.Tags) == 0 && len(f.NotTags) == 0 && len(f.Attributes) == 0 &&
		len(f.HasAttributes) == 0 && f.CreatedAfter == nil && f.CreatedBefore == nil
}

// Kinds names the parts of f that are set, in a fixed order (tag, not_tag, attr, has_attr,
// created_after, created_before; status first when set), never their values: what a span
// may record of a list request.
func (f Filter) Kinds() []string {
	var out []string
	for _, p := range filterParts {
		set := false
		switch p {
		case partStatus:
			set = f.Status != ""
		case partTags:
			set = len(f.Tags) > 0
		case partNotTags:
			set = len(f.NotTags) > 0
		case partAttributes:
			set = len(f.Attributes) > 0
		case partHasAttributes:
			set = len(f.HasAttributes) > 0
		case partCreatedAfter:
			set = f.CreatedAfter != nil
		case partCreatedBefore:
			set = f.CreatedBefore != nil
		}
		if set {
			out = append(out, p.param)
		}
	}
	return out
}

// Key is a canonical text of f: two filters select the same subscribers by the same rules
// exactly when their keys are equal. A cursor carries it (or a hash of it) so that a cursor
// used with other filters is refused (docs/api-contract.md §19.3).
func (f Filter) Key() string {
	attrs := make([][2]string, len(f.Attributes))
	for i, c := range f.Attributes {
		attrs[i] = [2]string{c.Key, c.Value}
	}
	bound := func(t *time.Time) string {
		if t == nil {
			return ""
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	b, _ := json.Marshal([]any{f.Status, f.Tags, f.NotTags, attrs, f.HasAttributes,
		bound(f.CreatedAfter), bound(f.CreatedBefore)}) // strings and lists of them always encode
	return string(b)
}

// And is the filter that selects what both f and g select (a segment's filter with the list's
// own, docs/api-contract.md §20.1): every condition of each holds, conditions on the same key
// included. ok is false when no subscriber can match both: two different statuses.
func (f Filter) And(g Filter) (_ Filter, ok bool) {
	union := func(a, b []string) []string {
		if len(a)+len(b) == 0 {
			return nil
		}
		out := slices.Concat(a, b)
		slices.Sort(out)
		return slices.Compact(out)
	}
	later := func(a, b *time.Time) *time.Time {
		if a == nil || (b != nil && b.After(*a)) {
			return b
		}
		return a
	}
	earlier := func(a, b *time.Time) *time.Time {
		if a == nil || (b != nil && b.Before(*a)) {
			return b
		}
		return a
	}
	out := Filter{Status: cmp.Or(f.Status, g.Status), Tags: union(f.Tags, g.Tags), NotTags: union(f.NotTags, g.NotTags),
		HasAttributes: union(f.HasAttributes, g.HasAttributes),
		CreatedAfter:  later(f.CreatedAfter, g.CreatedAfter), CreatedBefore: earlier(f.CreatedBefore, g.CreatedBefore)}
	if len(f.Attributes)+len(g.Attributes) > 0 {
		// Two conditions on one key both hold: both stay (sorted by key, then value).
		out.Attributes = slices.Concat(f.Attributes, g.Attributes)
		slices.SortFunc(out.Attributes, func(a, b AttributeCondition) int {
			return cmp.Or(cmp.Compare(a.Key, b.Key), cmp.Compare(a.Value, b.Value))
		})
		out.Attributes = slices.Compact(out.Attributes)
	}
	return out, f.Status == "" || g.Status == "" || f.Status == g.Status
}
