package api

import (
	"context"
	"net/http"

	"github.com/danielgtaylor/huma/v2"
	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/api/cursor"
	"github.com/subscriberd/subscriberd/model"
)

// SuppressionStore stores the suppression list (docs/api-contract.md §13).
type SuppressionStore interface {
	// Create suppresses one address and reports whether the entry is new; an active or
	// pending subscriber with it is unsubscribed in the same transaction.
	Create(ctx context.Context, newsletterID uuid.UUID, in model.NewSuppression) (model.Suppression, bool, error)
	// CreateMany is Create for several addresses, all in one transaction, in input order.
	CreateMany(ctx context.Context, newsletterID uuid.UUID, in []model.NewSuppression) ([]model.Suppression, []bool, error)
	// List returns up to q.Limit entries, newest first, and whether more follow.
	List(ctx context.Context, newsletterID uuid.UUID, q model.SuppressionQuery) ([]model.Suppression, bool, error)
	// Get and Delete answer model.ErrSuppressionNotFound for an unknown id.
	Get(ctx context.Context, newsletterID, id uuid.UUID) (model.Suppression, error)
	Delete(ctx context.Context, newsletterID, id uuid.UUID) (model.Suppression, error)
}

// Suppression is the public shape of a suppression list entry.
type Suppression struct {
	ID        string            `json:"id" format:"uuid" doc:"Identifier of the entry (UUIDv7)."`
	Email     *string           `json:"email" format:"idn-email" nullable:"true" doc:"The address as given; null for an erased entry, of which only the SHA-256 of the normalised address is kept."`
	Reason    string            `json:"reason" enum:"manual,hard_bounce,complaint,declined,erased"`
	CreatedAt string            `json:"created_at" format:"date-time" example:"2026-06-11T17:00:00+00:00"`
	Source    SuppressionSource `json:"source"`
}

// SuppressionSource is what put an address on the list.
type SuppressionSource struct {
	Kind   string `json:"kind" enum:"api,smtp,decline_link,erase"`
	APIKey string `json:"api_key,omitempty" doc:"kind api: the display prefix of the key that made the entry."`
	Reply  string `json:"reply,omitempty" doc:"kind smtp: the first 200 characters of the SMTP server's refusal."`
}

func toSuppression(m model.Suppression) Suppression {
	out := Suppression{ID: m.ID.String(), Reason: string(m.Reason), CreatedAt: model.FormatTime(m.CreatedAt),
		Source: SuppressionSource{Kind: m.Source.Kind, APIKey: m.Source.APIKey, Reply: m.Source.Reply}}
	if m.Email != "" {
		email := m.Email
		out.Email = &email
	}
	return out
}

// SuppressionInput is a create body, decoded as any JSON object so that model reports every
// problem in the contract's words; Schema publishes the rules.
type SuppressionInput map[string]any

// Schema implements huma.SchemaProvider.
func (SuppressionInput) Schema(r huma.Registry) *huma.Schema { return suppressionInputSchema(r) }

// UnmarshalJSON keeps numbers as json.Number (see SubscriberInput).
func (in *SuppressionInput) UnmarshalJSON(b []byte) error {
	return decodeNumbers(b, (*map[string]any)(in))
}

// SuppressionBulkInput is a bulk body: 1 to 1000 SuppressionInput objects.
type SuppressionBulkInput []any

// Schema implements huma.SchemaProvider.
func (SuppressionBulkInput) Schema(r huma.Registry) *huma.Schema {
	return &huma.Schema{Type: huma.TypeArray, MinItems: ptr(1), MaxItems: ptr(model.MaxBulkSuppressions),
		Items: suppressionInputSchema(r)}
}

// UnmarshalJSON keeps numbers as json.Number (see SubscriberInput).
func (in *SuppressionBulkInput) UnmarshalJSON(b []byte) error { return decodeNumbers(b, (*[]any)(in)) }

func suppressionInputSchema(r huma.Registry) *huma.Schema {
	const name = "SuppressionInput"
	if _, ok := r.Map()[name]; !ok {
		reasons := make([]any, len(model.InputSuppressionReasons))
		for i, re := range model.InputSuppressionReasons {
			reasons[i] = string(re)
		}
		r.Map()[name] = &huma.Schema{
			Type:                 huma.TypeObject,
			AdditionalProperties: false,
			Required:             []string{"email"},
			Properties: map[string]*huma.Schema{
				"email": {Type: huma.TypeString, Format: "idn-email", MaxLength: ptr(model.MaxEmailLength),
					Description: "The address, by the rule of SubscriberInput's email. Matched trimmed and case-insensitively.",
					Examples:    []any{"john@example.com"}},
				"reason": {Type: huma.TypeString, Enum: reasons, Default: string(model.ReasonManual),
					Description: "Why: your own list (`manual`), your mail provider's bounce or complaint feed."},
			},
		}
	}
	return &huma.Schema{Ref: "#/components/schemas/" + name}
}

type reasonParam string

func (reasonParam) Schema(huma.Registry) *huma.Schema {
	reasons := make([]any, len(model.SuppressionReasons))
	for i, re := range model.SuppressionReasons {
		reasons[i] = string(re)
	}
	return &huma.Schema{Type: huma.TypeString, Enum: reasons}
}

type (
	createSuppressionInput struct {
		Body SuppressionInput
		Keyed
	}
	bulkSuppressionInput struct {
		Body SuppressionBulkInput
		Keyed
	}
	listSuppressionsInput struct {
		Limit  limitParam  `query:"limit" doc:"Entries per page, 1 to 100."`
		Reason reasonParam `query:"reason" doc:"Only entries with this reason."`
		Email  emailParam  `query:"email" doc:"Only the entry of this address (trimmed, case-insensitive; erased entries match by hash): data holds 0 or 1 entry."`
		Cursor cursorParam `query:"cursor" doc:"The next_cursor of a previous page, with the same reason and email: the page after it."`
	}
	suppressionIDInput struct {
		ID string `path:"id" format:"uuid" doc:"The entry's id."`
	}
	deleteSuppressionInput struct {
		ID string `path:"id" format:"uuid" doc:"The entry's id."`
		Keyed
	}
	createdSuppressionOutput struct {
		Status   int
		Location string `header:"Location" doc:"Path of the new entry (201 only)."`
		Body     SuppressionEnvelope
	}
	suppressionOutput struct {
		Body SuppressionEnvelope
	}
	bulkSuppressionOutput struct {
		Body SuppressionBulkEnvelope
	}
	suppressionListOutput struct {
		Body SuppressionListEnvelope
	}
)

// The responses of the idempotent writes (docs/api-contract.md §8).
func (o *createdSuppressionOutput) response() (int, string, any) { return o.Status, o.Location, o.Body }
func (o *suppressionOutput) response() (int, string, any)        { return 0, "", o.Body }
func (o *bulkSuppressionOutput) response() (int, string, any)    { return 0, "", o.Body }

// SuppressionEnvelope is the success body carrying one entry.
type SuppressionEnvelope struct {
	Success bool        `json:"success" doc:"Always true."`
	Data    Suppression `json:"data"`
}

// SuppressionBulk is the data of a bulk suppression: the entries in input order.
type SuppressionBulk struct {
	Suppressions []Suppression `json:"suppressions"`
}

// SuppressionBulkEnvelope is the success body of a bulk suppression.
type SuppressionBulkEnvelope struct {
	Success bool            `json:"success" doc:"Always true."`
	Data    SuppressionBulk `json:"data"`
}

// CursorPagination describes a page of a list walked by cursor only.
type CursorPagination struct {
	Limit      int     `json:"limit" minimum:"1" maximum:"100"`
	NextCursor *string `json:"next_cursor" nullable:"true" doc:"Pass as cursor (with the same filters) to get the page after this one; null when nothing follows."`
}

// SuppressionListEnvelope is the success body of the suppression list.
type SuppressionListEnvelope struct {
	Success    bool             `json:"success" doc:"Always true."`
	Data       []Suppression    `json:"data"`
	Pagination CursorPagination `json:"pagination"`
}

// registerSuppressions adds the five suppression operations (docs/api-contract.md §13); the
// writes take Idempotency-Key.
func (s *Server) registerSuppressions(common, withBody []int) {
	const (
		coll = BasePath + "/suppressions"
		item = coll + "/{id}"
	)
	tag := func(op huma.Operation) huma.Operation {
		op.Tags = []string{"Suppressions"}
		return op
	}
	create := tag(s.operation(http.MethodPost, coll, "create-suppression", "Suppress an address",
		"The address is never emailed again and cannot be subscribed (422 `email_suppressed`). "+
			"An active or pending subscriber with it is unsubscribed at once and its unsent confirmation emails are cancelled. "+
			"An address already suppressed answers 200 with its entry as it is (its first reason stays).",
		http.StatusCreated, bodyObject, withBody))
	registerKeyed(s, create, s.createSuppression)
	if op := s.api.OpenAPI().Paths[coll].Post; op != nil && op.Responses["201"] != nil {
		op.Responses["200"] = &huma.Response{Description: "Already suppressed: the existing entry, unchanged.",
			Content: op.Responses["201"].Content}
	}
	registerKeyed(s, tag(s.operation(http.MethodPost, coll+"/bulk", "bulk-create-suppressions", "Suppress addresses in bulk",
		"1 to 1000 entries, validated all or nothing (field errors keyed `<index>.<field>`); `suppressions` follows the input order, "+
			"each the new or existing entry.",
		http.StatusOK, bodyArray, withBody)), s.bulkSuppress)
	huma.Register(s.api, tag(s.operation(http.MethodGet, coll, "list-suppressions", "List suppressed addresses",
		"Newest first. `email` looks one address up (erased entries match by the hash of the address).",
		http.StatusOK, "", append([]int{http.StatusBadRequest}, common...))), handle(s, s.listSuppressions))
	huma.Register(s.api, tag(s.operation(http.MethodGet, item, "get-suppression", "Get a suppression", "The suppression with this id in the key's newsletter. An unknown id, another newsletter's or one that is not a UUID gives 404 `not_found`.",
		http.StatusOK, "", append([]int{http.StatusBadRequest, http.StatusNotFound}, common...))), handle(s, s.getSuppression))
	registerKeyed(s, tag(s.operation(http.MethodDelete, item, "delete-suppression", "Delete a suppression",
		"The address may be subscribed again; subscribers it unsubscribed stay unsubscribed. Answers the entry as it was.",
		http.StatusOK, "", append([]int{http.StatusBadRequest, http.StatusNotFound}, common...))), s.deleteSuppression)
}

// suppressionSource is the source of the entries p's key makes.
func suppressionSource(p model.Principal) model.SuppressionSource {
	return model.SuppressionSource{Kind: model.SuppressionSourceAPI, APIKey: p.KeyPrefix}
}

func (s *Server) countSuppressions(sups []model.Suppression, created []bool) {
	for i, sup := range sups {
		if created[i] {
			s.metrics.SuppressionsCreated(string(sup.Reason), 1)
		}
	}
}

func (s *Server) createSuppression(ctx context.Context, p model.Principal, st Stores, in *createSuppressionInput) (*createdSuppressionOutput, error) {
	ns, verr := model.ParseSuppression(in.Body)
	if verr != nil {
		return nil, verr
	}
	ns.Source = suppressionSource(p)
	sup, created, err := st.Suppressions.Create(withSource(ctx, p), p.NewsletterID, ns)
	if err != nil {
		return nil, err
	}
	s.countSuppressions([]model.Suppression{sup}, []bool{created})
	out := &createdSuppressionOutput{Status: http.StatusOK, Body: SuppressionEnvelope{Success: true, Data: toSuppression(sup)}}
	if created {
		out.Status, out.Location = http.StatusCreated, BasePath+"/suppressions/"+sup.ID.String()
	}
	return out, nil
}

func (s *Server) bulkSuppress(ctx context.Context, p model.Principal, st Stores, in *bulkSuppressionInput) (*bulkSuppressionOutput, error) {
	items, verr := model.ParseSuppressionBulk(in.Body)
	if verr != nil {
		return nil, verr
	}
	for i := range items {
		items[i].Source = suppressionSource(p)
	}
	sups, created, err := st.Suppressions.CreateMany(withSource(ctx, p), p.NewsletterID, items)
	if err != nil {
		return nil, err
	}
	s.countSuppressions(sups, created)
	out := &bulkSuppressionOutput{Body: SuppressionBulkEnvelope{Success: true, Data: SuppressionBulk{Suppressions: make([]Suppression, len(sups))}}}
	for i, sup := range sups {
		out.Body.Data.Suppressions[i] = toSuppression(sup)
	}
	return out, nil
}

func (s *Server) listSuppressions(ctx context.Context, p model.Principal, st Stores, in *listSuppressionsInput) (*suppressionListOutput, error) {
	q, err := model.ParseSuppressionQuery(string(in.Limit), string(in.Reason))
	if err != nil {
		return nil, err
	}
	if in.Email != "" {
		if q.Email, err = model.ParseEmailFilter(string(in.Email)); err != nil {
			return nil, err
		}
	}
	binding := cursor.Binding("suppressions", p.NewsletterID.String(), string(q.Reason), model.NormalizeEmail(q.Email))
	if in.Cursor != "" {
		pos, err := s.cursors.Decode(binding, string(in.Cursor))
		if err != nil {
			return nil, newError(http.StatusBadRequest, MsgCursorInvalid)
		}
		q.After = &model.Position{CreatedAt: pos.Time, ID: pos.ID}
	}
	sups, more, err := st.Suppressions.List(ctx, p.NewsletterID, q)
	if err != nil {
		return nil, err
	}
	var next *string
	if more && len(sups) > 0 {
		last := sups[len(sups)-1]
		c := s.cursors.Encode(binding, cursor.Position{Time: last.CreatedAt, ID: last.ID})
		next = &c
	}
	data := make([]Suppression, len(sups))
	for i, sup := range sups {
		data[i] = toSuppression(sup)
	}
	return &suppressionListOutput{Body: SuppressionListEnvelope{Success: true, Data: data,
		Pagination: CursorPagination{Limit: q.Limit, NextCursor: next}}}, nil
}

func (s *Server) getSuppression(ctx context.Context, p model.Principal, st Stores, in *suppressionIDInput) (*suppressionOutput, error) {
	return s.suppressionOp(ctx, p, in.ID, st.Suppressions.Get)
}

func (s *Server) deleteSuppression(ctx context.Context, p model.Principal, st Stores, in *deleteSuppressionInput) (*suppressionOutput, error) {
	return s.suppressionOp(ctx, p, in.ID, st.Suppressions.Delete)
}

func (s *Server) suppressionOp(ctx context.Context, p model.Principal, rawID string,
	op func(context.Context, uuid.UUID, uuid.UUID) (model.Suppression, error)) (*suppressionOutput, error) {
	id, err := parseID(rawID)
	if err != nil {
		return nil, model.ErrSuppressionNotFound
	}
	sup, err := op(ctx, p.NewsletterID, id)
	if err != nil {
		return nil, err
	}
	return &suppressionOutput{Body: SuppressionEnvelope{Success: true, Data: toSuppression(sup)}}, nil
}
