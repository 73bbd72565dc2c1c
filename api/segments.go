package api

import (
	"context"
	"net/http"

	"github.com/danielgtaylor/huma/v2"
	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/model"
)

// SegmentStore stores segments, saved filters (docs/api-contract.md §20.1).
type SegmentStore interface {
	// Create stores a segment; a name taken (case-insensitively) or a newsletter's 101st is a
	// *model.ValidationError.
	Create(ctx context.Context, newsletterID uuid.UUID, in model.NewSegment) (model.Segment, error)
	// List returns up to limit segments sorted by name (model.SegmentNameKey), after the name
	// key after when it is not "".
	List(ctx context.Context, newsletterID uuid.UUID, after string, limit int) ([]model.Segment, error)
	// Get returns a segment with its exact member count now. Get, Update, Delete and Filter
	// answer model.ErrSegmentNotFound for an unknown id.
	Get(ctx context.Context, newsletterID, id uuid.UUID) (model.Segment, int64, error)
	Update(ctx context.Context, newsletterID, id uuid.UUID, p model.SegmentPatch) (model.Segment, error)
	Delete(ctx context.Context, newsletterID, id uuid.UUID) (model.Segment, error)
	// Filter returns a segment's filter, to evaluate now.
	Filter(ctx context.Context, newsletterID, id uuid.UUID) (model.Filter, error)
}

// Messages of docs/api-contract.md §20.1: the 404 of the segment operations, and the list's
// 400 for a segment parameter that names no segment of the newsletter.
const (
	MsgSegmentNotFound = "Segment not found."
	MsgSegmentInvalid  = "The selected segment is invalid."
)

// Segment is the public shape of a segment.
type Segment struct {
	ID        string        `json:"id" format:"uuid" doc:"Identifier of the segment (UUIDv7)." example:"01a21363-a43b-7cde-b444-4915076b1130"`
	Name      string        `json:"name" doc:"Unique in the newsletter, case-insensitively." example:"Pro plan, beta"`
	Filter    SegmentFilter `json:"filter"`
	CreatedAt string        `json:"created_at" format:"date-time" example:"2026-06-11T17:00:00+00:00"`
	UpdatedAt string        `json:"updated_at" format:"date-time" example:"2026-06-11T17:00:00+00:00"`
}

// SegmentWithCount is a segment with its member count (GET /segments/{id}).
type SegmentWithCount struct {
	Segment
	Subscribers int64 `json:"subscribers" minimum:"0" doc:"How many subscribers the filter selects now, exactly." example:"1234"`
}

// SegmentFilter is a segment's filter object as the service sends it: canonical
// (model.Filter.JSON).
type SegmentFilter struct{ raw []byte }

// MarshalJSON implements json.Marshaler.
func (f SegmentFilter) MarshalJSON() ([]byte, error) { return f.raw, nil }

// Schema implements huma.SchemaProvider.
func (SegmentFilter) Schema(r huma.Registry) *huma.Schema { return segmentFilterSchema(r) }

// segmentFilterSchema is the filter object of a segment (docs/api-contract.md §20.1), the
// rules of the list's filters (§19.3), registered once as SegmentFilter.
func segmentFilterSchema(r huma.Registry) *huma.Schema {
	const name = "SegmentFilter"
	if _, ok := r.Map()[name]; !ok {
		list := func(item *huma.Schema, desc string) *huma.Schema {
			return &huma.Schema{Type: huma.TypeArray, MaxItems: ptr(model.MaxFilterValues), Items: item, Description: desc}
		}
		tag := &huma.Schema{Type: huma.TypeString, MinLength: ptr(1), MaxLength: ptr(model.MaxTagLength)}
		key := &huma.Schema{Type: huma.TypeString, Pattern: model.AttributeKeyPattern}
		r.Map()[name] = &huma.Schema{
			Type:                 huma.TypeObject,
			AdditionalProperties: false,
			Description: "Conditions that must all hold; {} selects everyone. The rules of the list's filters: tags " +
				"are normalised as stored (trimmed, lower-cased), each list takes at most 10 values. The service " +
				"sends the filter in canonical form: only the parts set, lists sorted, attribute values as the text " +
				"they match (5 and \"5\" select the same), bounds in UTC.",
			Properties: map[string]*huma.Schema{
				"status": {Type: huma.TypeString, Enum: []any{"active", "pending", "unsubscribed"},
					Description: "Only subscribers with this status."},
				"tags":     list(tag, "Only subscribers with all of these tags."),
				"not_tags": list(tag, "Only subscribers with none of these tags."),
				"attributes": {Type: huma.TypeObject, MaxProperties: ptr(model.MaxFilterValues),
					AdditionalProperties: &huma.Schema{AnyOf: []*huma.Schema{
						{Type: huma.TypeString, MaxLength: ptr(model.MaxAttributeValueLength)},
						{Type: huma.TypeNumber}, {Type: huma.TypeBoolean}}},
					Description: "Only subscribers whose attribute is this string, or a number or boolean whose JSON text " +
						"is the value's: {\"seats\": 5} selects 5 and \"5\". Keys match `" + model.AttributeKeyPattern + "`.",
					Examples: []any{map[string]any{"plan": "pro", "seats": 5}}},
				"has_attributes": list(key, "Only subscribers with these attributes set."),
				"created_after": {Type: huma.TypeString, Format: "date-time",
					Description: "Only subscribers created after this RFC 3339 date-time (exclusive)."},
				"created_before": {Type: huma.TypeString, Format: "date-time",
					Description: "Only subscribers created before this RFC 3339 date-time (exclusive)."},
			},
		}
	}
	return &huma.Schema{Ref: "#/components/schemas/" + name}
}

// segmentBodySchema is the schema of a create (required name) or update body.
func segmentBodySchema(r huma.Registry, name string, create bool) *huma.Schema {
	if _, ok := r.Map()[name]; !ok {
		s := &huma.Schema{
			Type:                 huma.TypeObject,
			AdditionalProperties: false,
			Properties: map[string]*huma.Schema{
				"name": {Type: huma.TypeString, MinLength: ptr(1), MaxLength: ptr(model.MaxSegmentNameLength),
					Pattern: model.NamePattern(),
					Description: "1 to 100 characters, surrounding white space trimmed, unique in the newsletter " +
						"case-insensitively. No character of the Unicode categories Cc, Cf, Zl or Zp.",
					Examples: []any{"Pro plan, beta"}},
				"filter": segmentFilterSchema(r),
			},
		}
		if create {
			s.Required = []string{"name"}
			s.Description = "An absent filter selects everyone, as {} does."
		} else {
			s.MinProperties = ptr(1)
			s.Description = "name and/or filter; a filter given replaces the segment's."
		}
		r.Map()[name] = s
	}
	return &huma.Schema{Ref: "#/components/schemas/" + name}
}

// SegmentInput is a create body, decoded as any JSON object so that model reports every
// problem in the contract's words.
type SegmentInput map[string]any

// Schema implements huma.SchemaProvider.
func (SegmentInput) Schema(r huma.Registry) *huma.Schema {
	return segmentBodySchema(r, "SegmentInput", true)
}

// UnmarshalJSON keeps numbers as json.Number (see SubscriberInput).
func (in *SegmentInput) UnmarshalJSON(b []byte) error {
	return decodeNumbers(b, (*map[string]any)(in))
}

// SegmentUpdate is an update body: name and/or filter.
type SegmentUpdate map[string]any

// Schema implements huma.SchemaProvider.
func (SegmentUpdate) Schema(r huma.Registry) *huma.Schema {
	return segmentBodySchema(r, "SegmentUpdate", false)
}

// UnmarshalJSON keeps numbers as json.Number (see SubscriberInput).
func (in *SegmentUpdate) UnmarshalJSON(b []byte) error {
	return decodeNumbers(b, (*map[string]any)(in))
}

// SegmentEnvelope is the success body carrying one segment.
type SegmentEnvelope struct {
	Success bool    `json:"success" doc:"Always true."`
	Data    Segment `json:"data"`
}

// SegmentCountEnvelope is the success body of GET /segments/{id}.
type SegmentCountEnvelope struct {
	Success bool             `json:"success" doc:"Always true."`
	Data    SegmentWithCount `json:"data"`
}

// SegmentPagination describes a page of GET /segments.
type SegmentPagination struct {
	Limit      int     `json:"limit" minimum:"1" maximum:"100"`
	NextCursor *string `json:"next_cursor" nullable:"true" doc:"Pass as cursor to get the page after this one; null when no segment follows."`
}

// SegmentListEnvelope is the success body of GET /segments.
type SegmentListEnvelope struct {
	Success    bool              `json:"success" doc:"Always true."`
	Data       []Segment         `json:"data"`
	Pagination SegmentPagination `json:"pagination"`
}

type (
	createSegmentInput struct {
		Body SegmentInput
		Keyed
	}
	segmentIDInput struct {
		ID string `path:"id" format:"uuid" doc:"The segment's id."`
	}
	updateSegmentInput struct {
		ID   string `path:"id" format:"uuid" doc:"The segment's id."`
		Body SegmentUpdate
		Keyed
	}
	deleteSegmentInput struct {
		ID string `path:"id" format:"uuid" doc:"The segment's id."`
		Keyed
	}
	segmentListInput struct {
		Limit  limitParam  `query:"limit" doc:"Segments per page, 1 to 100."`
		Cursor cursorParam `query:"cursor" doc:"The next_cursor of a previous page: the page after it."`
	}
	createdSegmentOutput struct {
		Location string `header:"Location" doc:"Path of the new segment."`
		Body     SegmentEnvelope
	}
	segmentOutput struct {
		Body SegmentEnvelope
	}
	segmentCountOutput struct {
		Body SegmentCountEnvelope
	}
	segmentListOutput struct {
		Body SegmentListEnvelope
	}
)

// The responses of the idempotent writes (docs/api-contract.md §8).
func (o *createdSegmentOutput) response() (int, string, any) { return 0, o.Location, o.Body }
func (o *segmentOutput) response() (int, string, any)        { return 0, "", o.Body }

func toSegment(m model.Segment) Segment {
	return Segment{ID: m.ID.String(), Name: m.Name, Filter: SegmentFilter{raw: m.Filter.JSON()},
		CreatedAt: model.FormatTime(m.CreatedAt), UpdatedAt: model.FormatTime(m.UpdatedAt)}
}

// registerSegments adds the five segment operations (docs/api-contract.md §20.1); the writes
// take Idempotency-Key.
func (s *Server) registerSegments(common, withBody []int) {
	const (
		coll = BasePath + "/segments"
		item = coll + "/{id}"
	)
	tag := func(op huma.Operation) huma.Operation {
		op.Tags = []string{"Segments"}
		return op
	}
	registerKeyed(s, tag(s.operation(http.MethodPost, coll, "create-segment", "Create a segment",
		"A saved filter, evaluated anew each time it is used (`GET /subscribers?segment=<id>`). The name is unique in "+
			"the newsletter, case-insensitively (422 keyed `name`); at most 100 segments per newsletter (422 keyed `body`).",
		http.StatusCreated, bodyObject, withBody)), s.createSegment)
	huma.Register(s.api, tag(s.operation(http.MethodGet, coll, "list-segments", "List segments",
		"Sorted by name (case-insensitively, by code point), with `limit` and `cursor`.",
		http.StatusOK, "", append([]int{http.StatusBadRequest}, common...))), handle(s, s.listSegments))
	huma.Register(s.api, tag(s.operation(http.MethodGet, item, "get-segment", "Get a segment",
		"The segment with `subscribers`, how many subscribers its filter selects now, exactly. An unknown id gives 404 `not_found`.",
		http.StatusOK, "", append([]int{http.StatusBadRequest, http.StatusNotFound}, common...))), handle(s, s.getSegment))
	registerKeyed(s, tag(s.operation(http.MethodPut, item, "update-segment", "Update a segment",
		"`name` and/or `filter`; a filter given replaces the segment's.",
		http.StatusOK, bodyObject, append([]int{http.StatusNotFound}, withBody...))), s.updateSegment)
	registerKeyed(s, tag(s.operation(http.MethodDelete, item, "delete-segment", "Delete a segment",
		"Answers the segment as it was. Its subscribers are not changed.",
		http.StatusOK, "", append([]int{http.StatusBadRequest, http.StatusNotFound}, common...))), s.deleteSegment)
}

// segmentID is the id of a path, or model.ErrSegmentNotFound (404) when it is not a UUID.
func segmentID(raw string) (uuid.UUID, error) {
	id, err := parseID(raw)
	if err != nil {
		return uuid.Nil, model.ErrSegmentNotFound
	}
	return id, nil
}

func (s *Server) createSegment(ctx context.Context, p model.Principal, st Stores, in *createSegmentInput) (*createdSegmentOutput, error) {
	ns, verr := model.ParseNewSegment(in.Body)
	if verr != nil {
		return nil, verr
	}
	seg, err := st.Segments.Create(ctx, p.NewsletterID, ns)
	if err != nil {
		return nil, err
	}
	return &createdSegmentOutput{Location: BasePath + "/segments/" + seg.ID.String(),
		Body: SegmentEnvelope{Success: true, Data: toSegment(seg)}}, nil
}

func (s *Server) listSegments(ctx context.Context, p model.Principal, st Stores, in *segmentListInput) (*segmentListOutput, error) {
	q, err := model.ParseListQuery("", string(in.Limit), "")
	if err != nil {
		return nil, err
	}
	var after string
	if in.Cursor != "" {
		var ok bool
		if after, ok = s.decodeKeyCursor("segments", p.NewsletterID.String(), string(in.Cursor)); !ok {
			return nil, newError(http.StatusBadRequest, MsgCursorInvalid)
		}
	}
	segs, err := st.Segments.List(ctx, p.NewsletterID, after, q.Limit+1)
	if err != nil {
		return nil, err
	}
	var next *string
	if len(segs) > q.Limit {
		segs = segs[:q.Limit]
		c := s.encodeKeyCursor("segments", p.NewsletterID.String(), model.SegmentNameKey(segs[len(segs)-1].Name))
		next = &c
	}
	data := make([]Segment, len(segs))
	for i, seg := range segs {
		data[i] = toSegment(seg)
	}
	return &segmentListOutput{Body: SegmentListEnvelope{Success: true, Data: data,
		Pagination: SegmentPagination{Limit: q.Limit, NextCursor: next}}}, nil
}

func (s *Server) getSegment(ctx context.Context, p model.Principal, st Stores, in *segmentIDInput) (*segmentCountOutput, error) {
	id, err := segmentID(in.ID)
	if err != nil {
		return nil, err
	}
	seg, n, err := st.Segments.Get(ctx, p.NewsletterID, id)
	if err != nil {
		return nil, err
	}
	return &segmentCountOutput{Body: SegmentCountEnvelope{Success: true,
		Data: SegmentWithCount{Segment: toSegment(seg), Subscribers: n}}}, nil
}

func (s *Server) updateSegment(ctx context.Context, p model.Principal, st Stores, in *updateSegmentInput) (*segmentOutput, error) {
	id, idErr := segmentID(in.ID)
	patch, verr := model.ParseSegmentPatch(in.Body)
	if idErr != nil { // an unknown id is 404 whatever the body says
		return nil, idErr
	}
	if verr != nil {
		return nil, verr
	}
	seg, err := st.Segments.Update(ctx, p.NewsletterID, id, patch)
	if err != nil {
		return nil, err
	}
	return &segmentOutput{Body: SegmentEnvelope{Success: true, Data: toSegment(seg)}}, nil
}

func (s *Server) deleteSegment(ctx context.Context, p model.Principal, st Stores, in *deleteSegmentInput) (*segmentOutput, error) {
	id, err := segmentID(in.ID)
	if err != nil {
		return nil, err
	}
	seg, err := st.Segments.Delete(ctx, p.NewsletterID, id)
	if err != nil {
		return nil, err
	}
	return &segmentOutput{Body: SegmentEnvelope{Success: true, Data: toSegment(seg)}}, nil
}
