package model

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"
)

// Bulk actions (docs/api-contract.md §20.2): one change applied to a selection of a
// newsletter's subscribers in the background.
const (
	ActionAddTags       = "add_tags"
	ActionRemoveTags    = "remove_tags"
	ActionSetAttributes = "set_attributes"
	ActionUnsubscribe   = "unsubscribe"
)

// BulkActions lists the actions, in the contract's order.
var BulkActions = []string{ActionAddTags, ActionRemoveTags, ActionSetAttributes, ActionUnsubscribe}

// Bulk action states: the import's (docs/api-contract.md §15).
const (
	BulkQueued    = ImportQueued
	BulkRunning   = ImportRunning
	BulkCompleted = ImportCompleted
	BulkCancelled = ImportCancelled
)

// Outcomes of a bulk action's subscribers (the metric bulk_action_rows_total{outcome}).
const (
	BulkChanged   = "changed"
	BulkUnchanged = "unchanged"
)

// MaxBulkIDs is the most ids a bulk action's ids target takes.
const MaxBulkIDs = 1000

// Messages of a bulk action's body (docs/api-contract.md §20.2).
const (
	msgBulkTarget     = "Exactly one of filter, segment or ids must be provided."
	msgRequiredWhen   = "The %s field is required when action is %s."
	msgProhibitedWhen = "The %s field is prohibited unless action is %s."
	msgSelectedAction = "The selected action is invalid; it must be add_tags, remove_tags, set_attributes or unsubscribe."
	msgUUID           = "The %s field must be a valid UUID."
	msgMinItems       = "The %s field must have at least %d item."
	// MsgSegmentInvalid is the message of a segment target that names no segment of the
	// newsletter, keyed segment.
	MsgSegmentInvalid = "The selected segment is invalid."
)

// BulkCounts are a bulk action's counts: Matched is fixed when it starts; Processed is
// Changed + Unchanged, the subscribers handled by committed batches.
type BulkCounts struct {
	Matched, Processed, Changed, Unchanged int64
}

// BulkTarget is which subscribers a bulk action acts on: exactly one of a filter (a
// segment's filter, as of the request, when Segment is set) or ids.
type BulkTarget struct {
	Filter  *Filter     `json:"filter,omitempty"`
	Segment *uuid.UUID  `json:"segment,omitempty"`
	IDs     []uuid.UUID `json:"ids,omitempty"`
}

// BulkChange is what a bulk action does to each subscriber: Action, with Tags (the tag
// actions: normalised, sorted, no duplicates) or Attributes (set_attributes: a merge patch).
type BulkChange struct {
	Action     string
	Tags       []string
	Attributes AttributesPatch
}

// TagsChange is the change of the tags operation (POST /subscribers/{id}/tags) a tag action
// makes to each subscriber.
func (c BulkChange) TagsChange() TagsChange {
	if c.Action == ActionRemoveTags {
		return TagsChange{Remove: c.Tags}
	}
	return TagsChange{Add: c.Tags}
}

// BulkRequest is a validated body of POST /bulk-actions.
type BulkRequest struct {
	BulkChange
	Target BulkTarget
}

// NewBulkAction is a bulk action to store: the request, its newsletter, the key's display
// prefix (the source of its events) and the request's traceparent (to which its batches link).
type NewBulkAction struct {
	BulkRequest
	NewsletterID uuid.UUID
	KeyPrefix    string
	Traceparent  string
}

// BulkAction is one bulk action.
type BulkAction struct {
	ID, NewsletterID uuid.UUID
	Action           string
	State            string
	Counts           BulkCounts
	CreatedAt        time.Time
	StartedAt        *time.Time
	FinishedAt       *time.Time
}

// BulkJob is a bulk action claimed by a worker: the action, the token of the claim, and the
// request's traceparent.
type BulkJob struct {
	BulkAction
	Claim       uuid.UUID
	Traceparent string
}

// Bulk action errors.
var (
	ErrBulkActionNotFound = errors.New("bulk action not found")
	// ErrBulkActionFinished is a cancel of an action that has completed or was cancelled.
	ErrBulkActionFinished = errors.New("bulk action already finished")
	// ErrBulkActionLost is a batch of a worker that no longer holds the action.
	ErrBulkActionLost = errors.New("bulk action no longer held by this worker")
)

// ParseBulkRequest validates the body of POST /bulk-actions (docs/api-contract.md §20.2),
// decoded JSON with numbers as json.Number: action; tags for the tag actions, attributes (a
// merge patch) for set_attributes, neither otherwise; exactly one target of filter
// (ParseSegmentFilter's rules), segment (an id; whether it exists is the caller's to check)
// or ids (1 to MaxBulkIDs subscriber ids). Problems are 422 field errors.
func ParseBulkRequest(obj map[string]any) (BulkRequest, *ValidationError) {
	var (
		r    BulkRequest
		verr *ValidationError
	)
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		switch k {
		case "action", "tags", "attributes", "filter", "segment", "ids":
		default:
			verr = verr.Add(k, fmt.Sprintf(msgProhibited, k))
		}
	}
	rawAction, ok := obj["action"]
	action, _ := rawAction.(string)
	switch {
	case !ok:
		verr = verr.Add("action", fmt.Sprintf(msgRequired, "action"))
	case !slices.Contains(BulkActions, action):
		verr = verr.Add("action", msgSelectedAction)
		action = ""
	}
	r.Action = action
	rawTags, hasTags := obj["tags"]
	rawAttrs, hasAttrs := obj["attributes"]
	tagAction := action == ActionAddTags || action == ActionRemoveTags
	switch {
	case action == "":
	case tagAction && (!hasTags || isEmptyList(rawTags)):
		verr = verr.Add("tags", fmt.Sprintf(msgRequiredWhen, "tags", action))
	case tagAction:
		tags, terr := ParseTags(rawTags, "tags")
		verr = verr.Merge(terr)
		r.Tags = tags
	case hasTags:
		verr = verr.Add("tags", fmt.Sprintf(msgProhibitedWhen, "tags", "add_tags or remove_tags"))
	}
	switch {
	case action == "":
	case action == ActionSetAttributes && (!hasAttrs || isEmptyObject(rawAttrs)):
		verr = verr.Add("attributes", fmt.Sprintf(msgRequiredWhen, "attributes", action))
	case action == ActionSetAttributes:
		patch, aerr := ParseAttributesPatch(rawAttrs, "attributes")
		verr = verr.Merge(aerr)
		r.Attributes = patch
	case hasAttrs:
		verr = verr.Add("attributes", fmt.Sprintf(msgProhibitedWhen, "attributes", ActionSetAttributes))
	}
	targets := 0
	for _, k := range []string{"filter", "segment", "ids"} {
		if _, ok := obj[k]; ok {
			targets++
		}
	}
	if targets != 1 {
		return BulkRequest{}, verr.Add(attrBody, msgBulkTarget)
	}
	if raw, ok := obj["filter"]; ok {
		f, ferr := ParseSegmentFilter(raw, "filter")
		verr = verr.Merge(ferr)
		r.Target.Filter = &f
	}
	if raw, ok := obj["segment"]; ok {
		id, ok := parseUUIDValue(raw)
		if !ok {
			verr = verr.Add("segment", fmt.Sprintf(msgUUID, "segment"))
		}
		r.Target.Segment = &id
	}
	if raw, ok := obj["ids"]; ok {
		ids, ierr := parseBulkIDs(raw)
		verr = verr.Merge(ierr)
		r.Target.IDs = ids
	}
	if verr != nil {
		return BulkRequest{}, verr
	}
	return r, nil
}

func isEmptyList(raw any) bool {
	l, ok := raw.([]any)
	return ok && len(l) == 0
}

func isEmptyObject(raw any) bool {
	m, ok := raw.(map[string]any)
	return ok && len(m) == 0
}

// parseUUIDValue reads a canonical (lower- or upper-case, hyphenated) UUID string.
func parseUUIDValue(raw any) (uuid.UUID, bool) {
	s, ok := raw.(string)
	if !ok || len(s) != 36 {
		return uuid.Nil, false
	}
	id, err := uuid.Parse(s)
	return id, err == nil
}

// parseBulkIDs validates an ids target: an array of 1 to MaxBulkIDs UUIDs; duplicates count
// once.
func parseBulkIDs(raw any) ([]uuid.UUID, *ValidationError) {
	var verr *ValidationError
	items, ok := raw.([]any)
	switch {
	case !ok:
		return nil, verr.Add("ids", fmt.Sprintf(msgArray, "ids"))
	case len(items) == 0:
		return nil, verr.Add("ids", fmt.Sprintf(msgMinItems, "ids", 1))
	case len(items) > MaxBulkIDs:
		return nil, verr.Add("ids", fmt.Sprintf(msgMaxItems, "ids", MaxBulkIDs))
	}
	ids := make([]uuid.UUID, 0, len(items))
	for i, it := range items {
		id, ok := parseUUIDValue(it)
		if !ok {
			f := "ids." + strconv.Itoa(i)
			verr = verr.Add(f, fmt.Sprintf(msgUUID, f))
			continue
		}
		ids = append(ids, id)
	}
	if verr != nil {
		return nil, verr
	}
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
	return slices.Compact(ids), nil
}
