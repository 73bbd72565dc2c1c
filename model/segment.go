package model

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"golang.org/x/text/cases"
	"golang.org/x/text/unicode/norm"
)

// Segment is a newsletter's saved, dynamic filter (docs/api-contract.md §20.1): its members are
// the subscribers its Filter selects at the time it is used.
type Segment struct {
	ID, NewsletterID     uuid.UUID
	Name                 string
	Filter               Filter
	CreatedAt, UpdatedAt time.Time
}

// NewSegment is a segment to create.
type NewSegment struct {
	Name   string
	Filter Filter
}

// SegmentPatch is a segment's update: each part given (not nil) replaces the stored one.
type SegmentPatch struct {
	Name   *string
	Filter *Filter
}

// Limits and messages of docs/api-contract.md §20.1.
const (
	MaxSegments          = 100
	MaxSegmentNameLength = 100

	MsgSegmentLimit     = "A newsletter can have at most 100 segments."
	MsgSegmentNameTaken = "The name has already been taken."
	MsgSegmentPatch     = "At least one of name or filter must be provided."
)

// ErrSegmentNotFound is an unknown segment id, or another newsletter's. It is ErrNotFound too
// (errors.Is), the stores' usual not-found, for callers that only ask whether a thing exists.
var ErrSegmentNotFound error = segmentNotFound{}

type segmentNotFound struct{}

func (segmentNotFound) Error() string { return "segment not found" }

// Is makes a segment's not-found ErrNotFound too.
func (segmentNotFound) Is(target error) bool { return target == ErrNotFound }

// SegmentFields are the only properties a segment's body may carry.
var SegmentFields = []string{"name", "filter"}

const attrFilter = "filter"

// SegmentNameKey is a segment's name as names are compared (unique per newsletter,
// case-insensitively): NFC, then Unicode case folding.
func SegmentNameKey(name string) string {
	return cases.Fold().String(norm.NFC.String(name))
}

// ParseNewSegment validates a create body (docs/api-contract.md §20.1): name required (§3's
// name rules, 1 to 100 characters), filter optional (absent selects everyone, as {} does).
func ParseNewSegment(obj map[string]any) (NewSegment, *ValidationError) {
	verr := prohibitOthers(obj, SegmentFields, "")
	var ns NewSegment
	name, msg := checkSegmentName(obj[attrName])
	if msg != "" {
		verr = verr.Add(attrName, msg)
	}
	ns.Name = name
	if raw, ok := obj[attrFilter]; ok {
		f, ferr := ParseSegmentFilter(raw, attrFilter)
		verr = verr.Merge(ferr)
		ns.Filter = f
	}
	if verr != nil {
		return NewSegment{}, verr
	}
	return ns, nil
}

// ParseSegmentPatch validates an update body: name and/or filter, with the rules of
// ParseNewSegment; a filter given replaces the stored one. Neither → 422 keyed body.
func ParseSegmentPatch(obj map[string]any) (SegmentPatch, *ValidationError) {
	verr := prohibitOthers(obj, SegmentFields, "")
	var p SegmentPatch
	if raw, ok := obj[attrName]; ok {
		name, msg := checkSegmentName(raw)
		if msg != "" {
			verr = verr.Add(attrName, msg)
		}
		p.Name = &name
	}
	if raw, ok := obj[attrFilter]; ok {
		f, ferr := ParseSegmentFilter(raw, attrFilter)
		verr = verr.Merge(ferr)
		p.Filter = &f
	}
	if verr == nil && p.Name == nil && p.Filter == nil {
		verr = verr.Add(attrBody, MsgSegmentPatch)
	}
	if verr != nil {
		return SegmentPatch{}, verr
	}
	return p, nil
}

// checkSegmentName is §3's name rule with at most MaxSegmentNameLength characters, and
// required: null, absent or all white space is refused.
func checkSegmentName(raw any) (string, string) {
	name, msg := checkNameMax(raw, attrName, MaxSegmentNameLength)
	if msg == "" && name == "" {
		msg = fmt.Sprintf(msgRequired, attrName)
	}
	return name, msg
}

// filterTimeLayout writes a filter's bounds: RFC 3339 in UTC with a numeric offset (§1), and
// the fraction of a second only when there is one, since it is part of the bound.
const filterTimeLayout = "2006-01-02T15:04:05.999999999-07:00"

// JSON is f as a segment's filter object (docs/api-contract.md §20.1) in canonical form: only
// the parts set, lists normalised and sorted, each attribute value as the text it matches
// (a number or boolean condition selects what its text selects: 5 and "5" are one
// condition), the bounds in UTC. ParseSegmentFilter reads it back as f, and two filters with
// the same Key have the same JSON.
func (f Filter) JSON() []byte {
	obj := map[string]any{}
	if f.Status != "" {
		obj[partStatus.field] = string(f.Status)
	}
	if len(f.Tags) > 0 {
		obj[partTags.field] = f.Tags
	}
	if len(f.NotTags) > 0 {
		obj[partNotTags.field] = f.NotTags
	}
	if len(f.Attributes) > 0 {
		attrs := make(map[string]string, len(f.Attributes))
		for _, c := range f.Attributes {
			attrs[c.Key] = c.Value
		}
		obj[partAttributes.field] = attrs
	}
	if len(f.HasAttributes) > 0 {
		obj[partHasAttributes.field] = f.HasAttributes
	}
	if f.CreatedAfter != nil {
		obj[partCreatedAfter.field] = f.CreatedAfter.UTC().Format(filterTimeLayout)
	}
	if f.CreatedBefore != nil {
		obj[partCreatedBefore.field] = f.CreatedBefore.UTC().Format(filterTimeLayout)
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(obj) // strings, and lists and maps of them, always encode
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// DecodeFilter reads a filter object stored by a segment (Filter.JSON).
func DecodeFilter(data []byte) (Filter, error) {
	var raw any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return Filter{}, fmt.Errorf("decode filter: %w", err)
	}
	f, verr := ParseSegmentFilter(raw, attrFilter)
	if verr != nil {
		return Filter{}, fmt.Errorf("decode filter: %w", verr)
	}
	return f, nil
}
