package api

import (
	"context"
	"errors"
	"net/http"

	"github.com/danielgtaylor/huma/v2"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/propagation"

	"github.com/subscriberd/subscriberd/api/cursor"
	"github.com/subscriberd/subscriberd/model"
)

// BulkActionStore stores bulk actions (docs/api-contract.md §20.2).
type BulkActionStore interface {
	// Create stores a new queued bulk action.
	Create(ctx context.Context, in model.NewBulkAction) (model.BulkAction, error)
	// Get and Cancel answer model.ErrBulkActionNotFound for an unknown id.
	Get(ctx context.Context, newsletterID, id uuid.UUID) (model.BulkAction, error)
	// List returns up to limit+1 bulk actions, newest first, after the position after.
	List(ctx context.Context, newsletterID uuid.UUID, limit int, after *model.Position) ([]model.BulkAction, error)
	// Cancel answers model.ErrBulkActionFinished for an action that has finished.
	Cancel(ctx context.Context, newsletterID, id uuid.UUID) (model.BulkAction, error)
}

// Messages and codes of docs/api-contract.md §20.2.
const (
	MsgBulkActionNotFound = "Bulk action not found."
	MsgBulkActionFinished = "This bulk action has already finished."
	// CodeBulkActionFinished is the code of a cancel of a finished bulk action.
	CodeBulkActionFinished = "bulk_action_finished"
	// BulkActionPath is the path of the bulk actions.
	BulkActionPath = BasePath + "/bulk-actions"
)

// BulkActionInput is the body of POST /bulk-actions, decoded as any JSON object so that model
// reports every problem in the contract's words.
type BulkActionInput map[string]any

// UnmarshalJSON keeps numbers as json.Number (see SubscriberInput).
func (in *BulkActionInput) UnmarshalJSON(b []byte) error {
	return decodeNumbers(b, (*map[string]any)(in))
}

// Schema implements huma.SchemaProvider.
func (BulkActionInput) Schema(r huma.Registry) *huma.Schema {
	const name = "BulkActionInput"
	if _, ok := r.Map()[name]; !ok {
		r.Map()[name] = &huma.Schema{
			Type:                 huma.TypeObject,
			AdditionalProperties: false,
			Required:             []string{"action"},
			Description: "An action and exactly one target: `filter`, `segment` or `ids`. `tags` goes with the tag actions, " +
				"`attributes` with set_attributes.",
			Properties: map[string]*huma.Schema{
				"action": {Type: huma.TypeString, Enum: []any{model.ActionAddTags, model.ActionRemoveTags,
					model.ActionSetAttributes, model.ActionUnsubscribe},
					Description: "What to do to each subscriber, as the single operation does it: the tags operation, PUT's merge patch, DELETE."},
				"tags":       tagsSchema("The tags to add or remove (add_tags, remove_tags; required there, refused otherwise)."),
				"attributes": attributesSchema(true),
				"filter":     segmentFilterSchema(r),
				"segment":    {Type: huma.TypeString, Format: "uuid", Description: "A segment's id: its filter selects the subscribers."},
				"ids": {Type: huma.TypeArray, MinItems: ptr(1), MaxItems: ptr(model.MaxBulkIDs),
					Items:       &huma.Schema{Type: huma.TypeString, Format: "uuid"},
					Description: "1 to 1,000 subscriber ids; ids the newsletter does not have are not counted."},
			},
		}
	}
	return &huma.Schema{Ref: "#/components/schemas/" + name}
}

// BulkActionCounts are a bulk action's counts.
type BulkActionCounts struct {
	Matched   int64 `json:"matched" minimum:"0" doc:"Subscribers the target selected when the action started; 0 while queued."`
	Processed int64 `json:"processed" minimum:"0" doc:"Subscribers handled so far: changed + unchanged."`
	Changed   int64 `json:"changed" minimum:"0" doc:"Subscribers changed, each with its event."`
	Unchanged int64 `json:"unchanged" minimum:"0" doc:"Subscribers that already had the result, no longer exist, or whose result would break a limit (100 tags, 50 attributes, 8,192 bytes)."`
}

// BulkAction is the public shape of a bulk action.
type BulkAction struct {
	ID         string           `json:"id" format:"uuid" doc:"Identifier of the bulk action (UUIDv7)."`
	Action     string           `json:"action" enum:"add_tags,remove_tags,set_attributes,unsubscribe"`
	State      string           `json:"state" enum:"queued,running,completed,cancelled"`
	Counts     BulkActionCounts `json:"counts"`
	CreatedAt  string           `json:"created_at" format:"date-time" example:"2026-06-11T17:00:00+00:00"`
	StartedAt  *string          `json:"started_at" format:"date-time" nullable:"true" doc:"When a worker first took it up; null while queued."`
	FinishedAt *string          `json:"finished_at" format:"date-time" nullable:"true" doc:"When it completed or was cancelled; null before."`
}

// BulkActionOf is the public shape of m.
func BulkActionOf(m model.BulkAction) BulkAction {
	c := m.Counts
	return BulkAction{ID: m.ID.String(), Action: m.Action, State: m.State,
		Counts:    BulkActionCounts{Matched: c.Matched, Processed: c.Processed, Changed: c.Changed, Unchanged: c.Unchanged},
		CreatedAt: model.FormatTime(m.CreatedAt), StartedAt: timePtr(m.StartedAt), FinishedAt: timePtr(m.FinishedAt)}
}

// BulkActionEnvelope is the success body carrying one bulk action.
type BulkActionEnvelope struct {
	Success bool       `json:"success" doc:"Always true."`
	Data    BulkAction `json:"data"`
}

// BulkActionsEnvelope is the success body of a list of bulk actions.
type BulkActionsEnvelope struct {
	Success    bool            `json:"success" doc:"Always true."`
	Data       []BulkAction    `json:"data"`
	Pagination EventPagination `json:"pagination"`
}

type (
	createBulkActionInput struct {
		Body BulkActionInput
		Keyed
	}
	bulkActionIDInput struct {
		ID string `path:"id" format:"uuid" doc:"The bulk action's id."`
	}
	cancelBulkActionInput struct {
		ID string `path:"id" format:"uuid" doc:"The bulk action's id."`
		Keyed
	}
	listBulkActionsInput struct {
		Limit  limitParam `query:"limit" doc:"Bulk actions per page, 1 to 100."`
		Cursor string     `query:"cursor" doc:"The next_cursor of the previous page."`
	}
	bulkActionCreatedOutput struct {
		Location string `header:"Location" doc:"Path of the new bulk action."`
		Body     BulkActionEnvelope
	}
	bulkActionOutput struct {
		Body BulkActionEnvelope
	}
	bulkActionsOutput struct {
		Body BulkActionsEnvelope
	}
)

func (o *bulkActionCreatedOutput) response() (int, string, any) { return 0, o.Location, o.Body }
func (o *bulkActionOutput) response() (int, string, any)        { return 0, "", o.Body }

// registerBulkActions adds the four operations of docs/api-contract.md §20.2.
func (s *Server) registerBulkActions(common, withBody []int) {
	item := BulkActionPath + "/{id}"
	op := func(method, path, id, summary, desc string, status int, body string, errs []int) huma.Operation {
		o := s.operation(method, path, id, summary, desc, status, body, errs)
		o.Tags = []string{"Bulk actions"}
		return o
	}
	registerKeyed(s, op(http.MethodPost, BulkActionPath, "create-bulk-action", "Start a bulk action",
		"Adds or removes tags, sets attributes (a merge patch) or unsubscribes the subscribers a filter, a segment or a list of "+
			"ids selects, in the background. The selection is fixed when the action starts (`counts.matched`); each subscriber "+
			"is changed as the single operation would change it, with its events and webhooks. A newsletter's actions run one "+
			"at a time, in order. Follow the action at `Location`.",
		http.StatusAccepted, bodyObject, withBody), s.createBulkAction)
	huma.Register(s.api, op(http.MethodGet, BulkActionPath, "list-bulk-actions", "List bulk actions",
		"Newest first. Page with `next_cursor`.", http.StatusOK, "", append([]int{http.StatusBadRequest}, common...)),
		handle(s, s.listBulkActions))
	huma.Register(s.api, op(http.MethodGet, item, "get-bulk-action", "Get a bulk action",
		"Its state and counts, updated as its batches commit.", http.StatusOK, "",
		append([]int{http.StatusBadRequest, http.StatusNotFound}, common...)), handle(s, s.getBulkAction))
	registerKeyed(s, answers(op(http.MethodDelete, item, "cancel-bulk-action", "Cancel a bulk action",
		"Cancels a queued or running bulk action; the changes already made stay. A finished one gives 409 `bulk_action_finished`.",
		http.StatusOK, "", append([]int{http.StatusBadRequest, http.StatusNotFound}, common...)),
		http.StatusConflict, CodeBulkActionFinished), s.cancelBulkAction)
}

func (s *Server) createBulkAction(ctx context.Context, p model.Principal, st Stores, in *createBulkActionInput) (*bulkActionCreatedOutput, error) {
	r, verr := model.ParseBulkRequest(in.Body)
	if verr != nil {
		return nil, verr
	}
	if r.Target.Segment != nil {
		f, err := bulkSegmentFilter(ctx, st, p.NewsletterID, *r.Target.Segment)
		if err != nil {
			return nil, err
		}
		r.Target.Filter = &f
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	a, err := st.BulkActions.Create(ctx, model.NewBulkAction{BulkRequest: r, NewsletterID: p.NewsletterID,
		KeyPrefix: p.KeyPrefix, Traceparent: carrier.Get("traceparent")})
	if err != nil {
		return nil, err
	}
	return &bulkActionCreatedOutput{Location: BulkActionPath + "/" + a.ID.String(),
		Body: BulkActionEnvelope{Success: true, Data: BulkActionOf(a)}}, nil
}

// bulkSegmentFilter is the filter of the newsletter's segment id as of now, read through st
// (docs/api-contract.md §20.2: a segment target acts on its members when the action starts, by
// the filter it has when the action is requested). A segment the newsletter does not have is
// 422 keyed segment.
func bulkSegmentFilter(ctx context.Context, st Stores, nl, id uuid.UUID) (model.Filter, error) {
	f, err := st.Segments.Filter(ctx, nl, id)
	if errors.Is(err, model.ErrSegmentNotFound) {
		return model.Filter{}, (*model.ValidationError)(nil).Add("segment", model.MsgSegmentInvalid)
	}
	return f, err
}

// parseBulkActionID is parseID for bulk actions: anything but a canonical UUID is not found.
func parseBulkActionID(s string) (uuid.UUID, error) {
	id, err := parseID(s)
	if err != nil {
		return uuid.Nil, model.ErrBulkActionNotFound
	}
	return id, nil
}

func (s *Server) getBulkAction(ctx context.Context, p model.Principal, st Stores, in *bulkActionIDInput) (*bulkActionOutput, error) {
	id, err := parseBulkActionID(in.ID)
	if err != nil {
		return nil, err
	}
	a, err := st.BulkActions.Get(ctx, p.NewsletterID, id)
	if err != nil {
		return nil, err
	}
	return &bulkActionOutput{Body: BulkActionEnvelope{Success: true, Data: BulkActionOf(a)}}, nil
}

func (s *Server) cancelBulkAction(ctx context.Context, p model.Principal, st Stores, in *cancelBulkActionInput) (*bulkActionOutput, error) {
	id, err := parseBulkActionID(in.ID)
	if err != nil {
		return nil, err
	}
	a, err := st.BulkActions.Cancel(ctx, p.NewsletterID, id)
	if err != nil {
		return nil, err
	}
	return &bulkActionOutput{Body: BulkActionEnvelope{Success: true, Data: BulkActionOf(a)}}, nil
}

func (s *Server) listBulkActions(ctx context.Context, p model.Principal, st Stores, in *listBulkActionsInput) (*bulkActionsOutput, error) {
	q, err := model.ParseListQuery("", string(in.Limit), "")
	if err != nil {
		return nil, err
	}
	binding := cursor.Binding("bulk-actions", p.NewsletterID.String())
	var after *model.Position
	if in.Cursor != "" {
		pos, err := s.cursors.Decode(binding, in.Cursor)
		if err != nil {
			return nil, newError(http.StatusBadRequest, MsgCursorInvalid)
		}
		after = &model.Position{CreatedAt: pos.Time, ID: pos.ID}
	}
	as, err := st.BulkActions.List(ctx, p.NewsletterID, q.Limit, after)
	if err != nil {
		return nil, err
	}
	out := &bulkActionsOutput{Body: BulkActionsEnvelope{Success: true, Pagination: EventPagination{Limit: q.Limit}}}
	if len(as) > q.Limit {
		as = as[:q.Limit]
		last := as[len(as)-1]
		c := s.cursors.Encode(binding, cursor.Position{Time: last.CreatedAt, ID: last.ID})
		out.Body.Pagination.NextCursor = &c
	}
	out.Body.Data = make([]BulkAction, len(as))
	for i, a := range as {
		out.Body.Data[i] = BulkActionOf(a)
	}
	return out, nil
}
