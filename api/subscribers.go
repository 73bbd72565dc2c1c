package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/danielgtaylor/huma/v2"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/subscriberd/subscriberd/api/cursor"
	"github.com/subscriberd/subscriberd/model"
)

// Subscriber is the public shape of a subscriber.
type Subscriber struct {
	ID         string       `json:"id" format:"uuid" doc:"Identifier of the subscriber (UUIDv7)." example:"01a21363-a43b-7cde-b444-4915076b1130"`
	Email      string       `json:"email" format:"idn-email" doc:"Email address, as given (Unicode kept, no punycode)." example:"john@example.com"`
	Name       string       `json:"name" doc:"Full name; an empty string when none was given." example:"John Doe"`
	Status     string       `json:"status" enum:"active,pending,unsubscribed"`
	CreatedAt  string       `json:"created_at" format:"date-time" doc:"RFC 3339, UTC, whole seconds, numeric offset." example:"2026-06-11T17:00:00+00:00"`
	Attributes AttributeMap `json:"attributes"`
	Tags       []string     `json:"tags" doc:"The subscriber's tags, lower-cased, sorted by code point; [] when none." example:"[\"beta\",\"webinar-2026-11\"]"`
}

// AttributeMap is a subscriber's attributes (docs/api-contract.md §19.1): string, number or
// boolean values by key; {} when none.
type AttributeMap map[string]any

// Schema implements huma.SchemaProvider.
func (AttributeMap) Schema(huma.Registry) *huma.Schema { return attributesSchema(false) }

// attributesSchema is the schema of attributes: values are strings, numbers or booleans, or
// also null (remove) in an update's merge patch.
func attributesSchema(patch bool) *huma.Schema {
	// null is each type's nullable (in the 3.0 document too), not a fourth branch.
	values := []*huma.Schema{
		{Type: huma.TypeString, MaxLength: ptr(model.MaxAttributeValueLength), Nullable: patch},
		{Type: huma.TypeNumber, Nullable: patch},
		{Type: huma.TypeBoolean, Nullable: patch},
	}
	desc := "What an integration knows about the person: string (at most 1,000 characters), number or boolean " +
		"values, at most 50 keys, each matching `" + model.AttributeKeyPattern + "`; at most 8,192 bytes as compact JSON."
	if patch {
		desc += " A JSON merge patch: each key given is set, a key given as null is removed, the others stay."
	}
	return &huma.Schema{Type: huma.TypeObject, Description: desc, MaxProperties: ptr(model.MaxAttributes),
		AdditionalProperties: &huma.Schema{AnyOf: values},
		Examples:             []any{map[string]any{"plan": "pro", "seats": 5, "trial": false}}}
}

// tagsSchema is the schema of a set of tags given in a body.
func tagsSchema(desc string) *huma.Schema {
	return &huma.Schema{Type: huma.TypeArray, MaxItems: ptr(model.MaxTags), Description: desc,
		Items:    &huma.Schema{Type: huma.TypeString, MinLength: ptr(1), MaxLength: ptr(model.MaxTagLength)},
		Examples: []any{[]string{"beta", "webinar-2026-11"}}}
}

// timeLayout is RFC 3339 with a numeric offset and whole seconds: 2026-06-11T17:00:00+00:00.
const timeLayout = "2006-01-02T15:04:05-07:00"

func toSubscriber(m model.Subscriber) Subscriber {
	out := Subscriber{
		ID:        m.ID.String(),
		Email:     m.Email,
		Name:      m.Name(),
		Status:    string(m.Status),
		CreatedAt: m.CreatedAt.UTC().Format(timeLayout),
		// §19.1: always sent, {} and [] when none.
		Attributes: AttributeMap(m.Attributes),
		Tags:       m.Tags,
	}
	if out.Attributes == nil {
		out.Attributes = AttributeMap{}
	}
	if out.Tags == nil {
		out.Tags = []string{}
	}
	return out
}

// SubscriberEnvelope is the success body carrying one subscriber.
type SubscriberEnvelope struct {
	Success bool       `json:"success" doc:"Always true."`
	Data    Subscriber `json:"data"`
}

// BulkCreated is the data of a bulk create: the subscribers in input order.
type BulkCreated struct {
	Created []Subscriber `json:"created"`
}

// BulkEnvelope is the success body of a bulk create.
type BulkEnvelope struct {
	Success bool        `json:"success" doc:"Always true."`
	Data    BulkCreated `json:"data"`
}

// Pagination describes the page a list returned. With a cursor, page and pages are null
// (docs/api-contract.md §9.2).
type Pagination struct {
	Page       *int    `json:"page" minimum:"1" nullable:"true" doc:"The page number; null when the page was asked for with a cursor."`
	Limit      int     `json:"limit" minimum:"1" maximum:"100"`
	Total      int64   `json:"total" minimum:"0" doc:"Subscribers matching the filter."`
	Pages      *int64  `json:"pages" minimum:"0" nullable:"true" doc:"ceil(total / limit); null when the page was asked for with a cursor."`
	NextCursor *string `json:"next_cursor" nullable:"true" doc:"Pass as cursor (with the same status, email and filters) to get the page after this one; null when no subscriber follows this page."`
}

// ListEnvelope is the success body of a list.
type ListEnvelope struct {
	Success    bool         `json:"success" doc:"Always true."`
	Data       []Subscriber `json:"data"`
	Pagination Pagination   `json:"pagination"`
}

// SubscriberInput is a create body. It is decoded as any JSON object so that model can report
// every problem in the contract's words; Schema publishes the rules it enforces.
type SubscriberInput map[string]any

// Schema implements huma.SchemaProvider.
func (SubscriberInput) Schema(r huma.Registry) *huma.Schema {
	return inputSchema(r, "SubscriberInput", []string{"email"})
}

// UnmarshalJSON keeps numbers as json.Number, so that no value (1e400 included) fails to
// decode: every wrong type becomes a field error of the contract.
func (in *SubscriberInput) UnmarshalJSON(b []byte) error {
	return decodeNumbers(b, (*map[string]any)(in))
}

// UnmarshalJSON keeps numbers as json.Number (see SubscriberInput).
func (in *SubscriberUpdate) UnmarshalJSON(b []byte) error {
	return decodeNumbers(b, (*map[string]any)(in))
}

// UnmarshalJSON keeps numbers as json.Number (see SubscriberInput).
func (in *BulkInput) UnmarshalJSON(b []byte) error { return decodeNumbers(b, (*[]any)(in)) }

func decodeNumbers(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	return dec.Decode(v)
}

// SubscriberUpdate is an update body: any of the input fields, at least one.
type SubscriberUpdate map[string]any

// Schema implements huma.SchemaProvider.
func (SubscriberUpdate) Schema(r huma.Registry) *huma.Schema {
	s := inputSchema(r, "SubscriberUpdate", nil)
	r.Map()["SubscriberUpdate"].MinProperties = ptr(1)
	return s
}

// BulkInput is a bulk create body: 1 to 100 SubscriberInput objects.
type BulkInput []any

// Schema implements huma.SchemaProvider.
func (BulkInput) Schema(r huma.Registry) *huma.Schema {
	return &huma.Schema{Type: huma.TypeArray, MinItems: ptr(1), MaxItems: ptr(model.MaxBulkItems),
		Items: inputSchema(r, "SubscriberInput", []string{"email"})}
}

// inputSchema registers the named input object schema once and returns a reference to it.
func inputSchema(r huma.Registry, name string, required []string) *huma.Schema {
	if _, ok := r.Map()[name]; !ok {
		statuses := make([]any, len(model.InputStatuses))
		for i, st := range model.InputStatuses {
			statuses[i] = string(st)
		}
		r.Map()[name] = &huma.Schema{
			Type:                 huma.TypeObject,
			AdditionalProperties: false,
			Required:             required,
			Properties: map[string]*huma.Schema{
				// idn-email, not email: JSON Schema's email is ASCII only, and generated clients
				// and validators that check it refuse the Unicode addresses the API accepts.
				"email": {Type: huma.TypeString, Format: "idn-email", MaxLength: ptr(model.MaxEmailLength),
					Description: "One plain address local@domain, at most 254 characters: no display name, no spaces or quotes; " +
						"a local part of at most 64 characters (letters of any script, digits, !#$%&'*+/=?^_`{|}~- and inner dots); " +
						"a domain of two or more labels of letters (Unicode allowed, kept as given), digits and inner hyphens. " +
						"Surrounding white space is trimmed. Unique per newsletter, case-insensitively.",
					Examples: []any{"john@example.com"}},
				// ["string", "null"]: null is accepted and clears the name, as "" does
				// (docs/api-contract.md §4.5), and a generated client sends it so.
				"name": {Type: huma.TypeString, Nullable: true, MaxLength: ptr(model.MaxNameLength),
					// Every character of the categories Cc, Cf, Zl and Zp is refused
					// (model.ForbiddenInName); the pattern is drawn from the same tables.
					Pattern: model.NamePattern(),
					Description: "Full name, stored as first name and last name split at the first space. \"\" (or null) clears it. " +
						"No character of the Unicode categories Cc, Cf, Zl or Zp (controls, invisible format and bidirectional " +
						"controls, line and paragraph separators); the pattern lists those up to U+FFFF, and the few above " +
						"(" + model.NamePatternOmits() + ") are refused too.",
					Examples: []any{"John Doe"}},
				"status": {Type: huma.TypeString, Enum: statuses,
					Description: "`active` makes the subscriber active at once; `pending` sends a confirmation email."},
				"attributes": attributesSchema(required == nil),
				"tags":       tagsSchema(tagsDesc(required == nil)),
			},
		}
		if required != nil { // on create an omitted status means active; on update it keeps its value
			r.Map()[name].Properties["status"].Default = string(model.StatusActive)
		}
	}
	return &huma.Schema{Ref: "#/components/schemas/" + name}
}

func ptr[T any](v T) *T { return &v }

// tagsDesc describes the tags of a create or (update) an update.
func tagsDesc(update bool) string {
	d := "Labels, each trimmed, 1 to 64 characters with no comma, stored lower-cased; at most 100. " +
		"A tag given twice counts once."
	if update {
		d += " Replaces the whole set; POST /subscribers/{id}/tags adds and removes."
	}
	return d
}

// Query and path parameters are taken as strings and checked by model, so that a bad value
// gets the contract's 400 rather than a generic one; their schemas document the rules.
type (
	pageParam   string
	limitParam  string
	statusParam string
	emailParam  string
	cursorParam string
)

func (pageParam) Schema(huma.Registry) *huma.Schema {
	return &huma.Schema{Type: huma.TypeInteger, Minimum: ptr(1.0), Default: model.DefaultPage}
}

func (limitParam) Schema(huma.Registry) *huma.Schema {
	return &huma.Schema{Type: huma.TypeInteger, Minimum: ptr(1.0), Maximum: ptr(float64(model.MaxLimit)), Default: model.DefaultLimit}
}

func (statusParam) Schema(huma.Registry) *huma.Schema {
	return &huma.Schema{Type: huma.TypeString, Enum: []any{"active", "pending", "unsubscribed"}}
}

func (emailParam) Schema(huma.Registry) *huma.Schema {
	// idn-email, as the input schemas: the lookup takes any address the API accepts.
	return &huma.Schema{Type: huma.TypeString, Format: "idn-email", MaxLength: ptr(model.MaxEmailLength)}
}

func (cursorParam) Schema(huma.Registry) *huma.Schema { return &huma.Schema{Type: huma.TypeString} }

type (
	createInput struct {
		Body SubscriberInput
		Keyed
	}
	bulkInput struct {
		Body BulkInput
		Keyed
	}
	listInput struct {
		Page   pageParam   `query:"page" doc:"Page number, from 1."`
		Limit  limitParam  `query:"limit" doc:"Subscribers per page, 1 to 100."`
		Status statusParam `query:"status" doc:"Only subscribers with this status."`
		Email  emailParam  `query:"email" doc:"Only the subscriber with this address (trimmed, case-insensitive): data holds 0 or 1 subscriber."`
		Cursor cursorParam `query:"cursor" doc:"The next_cursor of a previous page, with the same status, email and filters: the page after it. Not with page."`
		// The filters of docs/api-contract.md §19.3, checked by model.ParseFilterQuery.
		Tag           []string          `query:"tag,explode" maxItems:"10" doc:"Only subscribers with this tag (normalised as stored: Beta selects beta); repeat for all of several, at most 10."`
		NotTag        []string          `query:"not_tag,explode" maxItems:"10" doc:"Only subscribers without this tag; repeatable, at most 10."`
		Attr          map[string]string `query:"attr,deepObject" doc:"attr[key]=value: only subscribers whose attribute key is the string value, or a number or boolean whose JSON text is value."`
		HasAttr       []string          `query:"has_attr,explode" maxItems:"10" doc:"Only subscribers with this attribute set; repeatable, at most 10."`
		CreatedAfter  string            `query:"created_after" format:"date-time" doc:"Only subscribers created after this RFC 3339 date-time (exclusive)."`
		CreatedBefore string            `query:"created_before" format:"date-time" doc:"Only subscribers created before this RFC 3339 date-time (exclusive)."`
		// docs/api-contract.md §20.1.
		Segment string `query:"segment" format:"uuid" doc:"Only the members of this segment, its filter evaluated now (ANDed with the other filters). An unknown segment gives 400."`
	}
	idInput struct {
		ID string `path:"id" format:"uuid" doc:"The subscriber's id."`
	}
	updateInput struct {
		ID   string `path:"id" format:"uuid" doc:"The subscriber's id."`
		Body SubscriberUpdate
		Keyed
	}
	unsubscribeInput struct {
		ID string `path:"id" format:"uuid" doc:"The subscriber's id."`
		Keyed
	}
	createdOutput struct {
		Location string `header:"Location" doc:"Path of the new subscriber."`
		Body     SubscriberEnvelope
	}
	subscriberOutput struct {
		Body SubscriberEnvelope
	}
	bulkOutput struct {
		Body BulkEnvelope
	}
	listOutput struct {
		Body ListEnvelope
	}
)

// The responses of the idempotent writes (docs/api-contract.md §8).
func (o *createdOutput) response() (int, string, any)    { return 0, o.Location, o.Body }
func (o *subscriberOutput) response() (int, string, any) { return 0, "", o.Body }
func (o *bulkOutput) response() (int, string, any)       { return 0, "", o.Body }

// register adds the six operations.
func (s *Server) register() {
	const (
		coll = BasePath + "/subscribers"
		item = coll + "/{id}"
	)
	common := []int{http.StatusUnauthorized, http.StatusForbidden, http.StatusTooManyRequests,
		http.StatusInternalServerError, http.StatusServiceUnavailable}
	withBody := append([]int{http.StatusBadRequest, http.StatusRequestEntityTooLarge,
		http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity}, common...)

	create := answers(s.operation(http.MethodPost, coll, "create-subscriber", "Create a subscriber",
		"A `pending` subscriber is sent a confirmation email; an `active` one is active at once. "+
			"An email already in the newsletter (any status, case-insensitive) gives 422 `email_already_subscribed`.",
		http.StatusCreated, bodyObject, withBody), http.StatusUnprocessableEntity, CodeEmailTaken, CodeEmailSuppressed)
	create.Metadata[metaBulkPath] = bulkPath
	registerKeyed(s, create, s.create)
	bulk := answers(s.operation(http.MethodPost, bulkPath, "bulk-create-subscribers", "Bulk create subscribers",
		"Creates 1 to 100 subscribers all or nothing; `created` follows the input order. "+
			"Field errors are keyed `<index>.<field>`.",
		http.StatusCreated, bodyArray, withBody), http.StatusUnprocessableEntity, CodeEmailSuppressed)
	bulk.Metadata[metaGated] = true
	registerKeyed(s, bulk, s.bulkCreate)
	huma.Register(s.api, s.operation(http.MethodGet, coll, "list-subscribers", "List subscribers",
		"Newest first (`created_at`, then `id`, descending). A page past the end returns `data: []` with the real totals. "+
			"`email` finds one subscriber by address; `cursor` (from `pagination.next_cursor`) walks the list at constant cost per page.",
		http.StatusOK, "", append([]int{http.StatusBadRequest}, common...)), handle(s, s.list))
	huma.Register(s.api, s.operation(http.MethodGet, item, "get-subscriber", "Get a subscriber",
		"The subscriber with this id in the key's newsletter, whatever its status. Another newsletter's id, an unknown id "+
			"or one that is not a UUID gives 404 `not_found`.",
		http.StatusOK, "", append([]int{http.StatusBadRequest, http.StatusNotFound}, common...)), handle(s, s.get))
	registerKeyed(s, answers(s.operation(http.MethodPut, item, "update-subscriber", "Update a subscriber",
		"Any of `email`, `name`, `status`, `attributes` (a merge patch) and `tags` (the whole set); omitted fields keep their values. `status: pending` sends a new "+
			"confirmation email and retires earlier links; `status: active` activates at once (also re-subscribes).",
		http.StatusOK, bodyObject, append([]int{http.StatusNotFound}, withBody...)),
		http.StatusUnprocessableEntity, CodeEmailTaken, CodeEmailSuppressed), s.update)
	registerKeyed(s, s.operation(http.MethodDelete, item, "unsubscribe-subscriber", "Unsubscribe a subscriber",
		"Sets the status to `unsubscribed` and keeps the record; unsent confirmation emails are cancelled. Idempotent.",
		http.StatusOK, "", append([]int{http.StatusBadRequest, http.StatusNotFound}, common...)), s.unsubscribe)

	s.registerUpsert(withBody)
	s.registerTags(withBody, common)
	s.registerEvents(common)
	s.registerPrivacy(common)
	s.registerWebhooks(common, withBody)
	s.registerSuppressions(common, withBody)
	s.registerImports(common)
	s.registerSegments(common, withBody)
	s.registerBulkActions(common, withBody)

}

func (s *Server) operation(method, path, id, summary, desc string, status int, body string, errs []int) huma.Operation {
	op := huma.Operation{
		OperationID:        id,
		Method:             method,
		Path:               path,
		Summary:            summary,
		Description:        desc,
		Tags:               []string{"Subscribers"},
		DefaultStatus:      status,
		Security:           []map[string][]string{{"bearer": {}}},
		SkipValidateBody:   true,
		SkipValidateParams: true,
		// preflight enforces MaxBodyBytes; Huma's own limit only needs to be above it.
		MaxBodyBytes: 2 * MaxBodyBytes,
		// Bodies are read by preflight, under the server's ReadTimeout. Huma's default sets a
		// 5 s read deadline that it never clears: a request slower than that lost its
		// connection context (500) and poisoned the keep-alive connection (503s after it).
		BodyReadTimeout: -1,
		Metadata:        map[string]any{},
	}
	if body != "" {
		op.Metadata[metaBody] = body
		op.RequestBody = &huma.RequestBody{Required: true}
		// preflight reads the body: it may be too slow for the server's read timeout.
		op = answersUsual(op, http.StatusRequestTimeout)
	}
	for _, st := range errs {
		if st == http.StatusUnprocessableEntity && body == "" {
			continue // no body, no field errors: only what answers adds (idempotent's)
		}
		op = answersUsual(op, st)
	}
	// A read-only key may not write (scope.go, docs/api-contract.md §16.2).
	if method != http.MethodGet && slices.Contains(errs, http.StatusForbidden) {
		op = answers(op, http.StatusForbidden, CodeInsufficientScope)
	}
	// The edge refuses a declared Content-Length over MaxBodyBytes on every route, before
	// routing (edge.go), a body or not.
	return answersUsual(op, http.StatusRequestEntityTooLarge)
}

// handle is the Huma handler of fn, an operation that takes no Idempotency-Key (for one
// that does, see registerKeyed).
func handle[I, O any](s *Server, fn handler[I, O]) func(context.Context, *I) (*O, error) {
	return func(ctx context.Context, in *I) (*O, error) { return run(s, ctx, fn, in) }
}

// run runs fn on the pool's stores and applies mapError to its error: the one place errors
// become HTTP (runKeyed does the same under a key).
func run[I, O any](s *Server, ctx context.Context, fn handler[I, O], in *I) (*O, error) {
	out, err := fn(ctx, principalFrom(ctx), s.stores, in)
	if err != nil {
		return nil, s.mapError(ctx, err)
	}
	s.dbOutage.OK(ctx)
	return out, nil
}

func (s *Server) create(ctx context.Context, p model.Principal, st Stores, in *createInput) (*createdOutput, error) {
	ns, verr := model.ParseCreate(in.Body)
	if verr != nil {
		return nil, verr
	}
	sub, err := st.Subscribers.Create(withSource(ctx, p), p.NewsletterID, ns)
	if err != nil {
		return nil, err
	}
	s.metrics.SubscribersCreated("create", string(sub.Status), 1)
	return &createdOutput{
		Location: subscriberPath(sub.ID),
		Body:     SubscriberEnvelope{Success: true, Data: toSubscriber(sub)},
	}, nil
}

// subscriberPath is the path of the subscriber id, a create's Location.
func subscriberPath(id uuid.UUID) string { return BasePath + "/subscribers/" + id.String() }

func (s *Server) bulkCreate(ctx context.Context, p model.Principal, st Stores, in *bulkInput) (*bulkOutput, error) {
	items, verr := model.ParseBulk(in.Body)
	if verr != nil {
		return nil, s.withTakenEmails(ctx, st, p.NewsletterID, items, verr)
	}
	subs, err := st.Subscribers.CreateMany(withSource(ctx, p), p.NewsletterID, items)
	if err != nil {
		return nil, err
	}
	out := &bulkOutput{Body: BulkEnvelope{Success: true, Data: BulkCreated{Created: make([]Subscriber, len(subs))}}}
	counts := map[model.Status]int{}
	for i, sub := range subs {
		out.Body.Data.Created[i] = toSubscriber(sub)
		counts[sub.Status]++
	}
	for st, n := range counts {
		s.metrics.SubscribersCreated("bulk", string(st), n)
	}
	return out, nil
}

// withTakenEmails adds to verr, the 422 of a bulk whose items broke the rules, the items whose
// email the newsletter already has, so that every failing field is reported at once (§3), as
// when the rules pass and the insert finds them. The lookup costs a read on a failing request
// only; when it fails, verr goes as it is.
func (s *Server) withTakenEmails(ctx context.Context, st Stores, nl uuid.UUID, items []model.NewSubscriber, verr *model.ValidationError) *model.ValidationError {
	var emails []string
	for _, it := range items {
		if it.Email != "" {
			emails = append(emails, it.Email)
		}
	}
	if len(emails) == 0 {
		return verr
	}
	taken, err := st.Subscribers.TakenEmails(ctx, nl, emails)
	if err != nil {
		s.log.DebugContext(ctx, "looking up the taken emails of an invalid bulk failed", "error", err)
		return verr
	}
	var indexes []int
	for i, it := range items {
		if it.Email != "" && taken[model.EmailKey(it.Email)] {
			indexes = append(indexes, i)
		}
	}
	return verr.Merge(model.BulkEmailTaken(indexes))
}

// Messages of docs/api-contract.md §9.2.
const (
	MsgPageAndCursor = "Use either page or cursor, not both."
	MsgCursorInvalid = "The cursor is invalid."
)

func (s *Server) list(ctx context.Context, p model.Principal, st Stores, in *listInput) (*listOutput, error) {
	q, err := model.ParseListQuery(string(in.Page), string(in.Limit), string(in.Status))
	if err != nil {
		return nil, err
	}
	if in.Email != "" {
		if q.Email, err = model.ParseEmailFilter(string(in.Email)); err != nil {
			return nil, err
		}
	}
	if q.Filter, err = model.ParseFilterQuery(model.FilterQuery{Tag: in.Tag, NotTag: in.NotTag, HasAttr: in.HasAttr,
		Attr: in.Attr, CreatedAfter: in.CreatedAfter, CreatedBefore: in.CreatedBefore}); err != nil {
		return nil, err
	}
	// The kinds of filter used, never their values (they may be personal data).
	kinds := q.Filter.Kinds()
	var segment uuid.UUID
	if in.Segment != "" {
		kinds = append(kinds, "segment")
		if segment, err = uuid.Parse(in.Segment); err != nil {
			return nil, &model.QueryError{Message: MsgSegmentInvalid}
		}
	}
	trace.SpanFromContext(ctx).SetAttributes(attribute.StringSlice("app.list.filters", kinds))
	binding := listBinding(p.NewsletterID, q, in.Segment != "", segment)
	if in.Segment != "" {
		if err := segmentFilter(ctx, p, st, segment, &q); err != nil {
			return nil, err
		}
	}
	if in.Cursor != "" {
		if in.Page != "" {
			return nil, newError(http.StatusBadRequest, MsgPageAndCursor)
		}
		pos, err := s.cursors.Decode(binding, string(in.Cursor))
		if err != nil {
			return nil, newError(http.StatusBadRequest, MsgCursorInvalid)
		}
		q.After = &model.Position{CreatedAt: pos.Time, ID: pos.ID}
	}
	subs, total, err := st.Subscribers.List(ctx, p.NewsletterID, q)
	if err != nil {
		return nil, err
	}
	var next *string
	if len(subs) > q.Limit { // the store read one more: a subscriber follows this page
		subs = subs[:q.Limit]
		last := subs[len(subs)-1]
		c := s.cursors.Encode(binding, cursor.Position{Time: last.CreatedAt, ID: last.ID})
		next = &c
	}
	data := make([]Subscriber, len(subs))
	for i, sub := range subs {
		data[i] = toSubscriber(sub)
	}
	pg := Pagination{Limit: q.Limit, Total: total, NextCursor: next}
	if q.After == nil {
		pages := (total + int64(q.Limit) - 1) / int64(q.Limit)
		pg.Page, pg.Pages = &q.Page, &pages
	}
	return &listOutput{Body: ListEnvelope{Success: true, Data: data, Pagination: pg}}, nil
}

// listBinding is what a list cursor is bound to (docs/api-contract.md §9.2): the newsletter
// and the filter (status and email), the filters of the query (§19.3) and the segment's id
// (§20.1), not its filter: that is evaluated anew for each page. The limit is not bound: a
// cursor marks a position, and the page after it may be of any size.
func listBinding(nl uuid.UUID, q model.ListQuery, bySegment bool, segment uuid.UUID) string {
	parts := []string{"subscribers", nl.String(), string(q.Status), model.EmailKey(q.Email)}
	if !q.Filter.IsZero() { // §19.3: a cursor carries its filters (unfiltered cursors stay as they were)
		sum := sha256.Sum256([]byte(q.Filter.Key()))
		parts = append(parts, hex.EncodeToString(sum[:]))
	}
	if bySegment {
		parts = append(parts, "segment", segment.String())
	}
	return cursor.Binding(parts...)
}

// segmentFilter applies the list's segment (docs/api-contract.md §20.1): its filter, read
// now, ANDed into q's. One that is not a segment of the newsletter is a 400.
func segmentFilter(ctx context.Context, p model.Principal, st Stores, id uuid.UUID, q *model.ListQuery) error {
	f, err := st.Segments.Filter(ctx, p.NewsletterID, id)
	if errors.Is(err, model.ErrSegmentNotFound) {
		return &model.QueryError{Message: MsgSegmentInvalid}
	}
	if err != nil {
		return err
	}
	// The query's filter has no status (the list's own is q.Status, which the stores AND
	// with a segment's): the two always combine.
	q.Filter, _ = q.Filter.And(f)
	return nil
}

func (s *Server) get(ctx context.Context, p model.Principal, st Stores, in *idInput) (*subscriberOutput, error) {
	id, err := parseID(in.ID)
	if err != nil {
		return nil, err
	}
	sub, err := st.Subscribers.Get(ctx, p.NewsletterID, id)
	if err != nil {
		return nil, err
	}
	return &subscriberOutput{Body: SubscriberEnvelope{Success: true, Data: toSubscriber(sub)}}, nil
}

func (s *Server) update(ctx context.Context, p model.Principal, st Stores, in *updateInput) (*subscriberOutput, error) {
	id, idErr := parseID(in.ID)
	patch, verr := model.ParsePatch(in.Body)
	if idErr != nil { // an unknown id is 404 whatever the body says
		return nil, idErr
	}
	if verr != nil {
		return nil, verr
	}
	sub, err := st.Subscribers.Update(withSource(ctx, p), p.NewsletterID, id, patch)
	if err != nil {
		return nil, err
	}
	return &subscriberOutput{Body: SubscriberEnvelope{Success: true, Data: toSubscriber(sub)}}, nil
}

func (s *Server) unsubscribe(ctx context.Context, p model.Principal, st Stores, in *unsubscribeInput) (*subscriberOutput, error) {
	id, err := parseID(in.ID)
	if err != nil {
		return nil, err
	}
	sub, err := st.Subscribers.Unsubscribe(withSource(ctx, p), p.NewsletterID, id)
	if err != nil {
		return nil, err
	}
	return &subscriberOutput{Body: SubscriberEnvelope{Success: true, Data: toSubscriber(sub)}}, nil
}

// withSource is ctx carrying the event source of a change made with p's key
// (docs/api-contract.md §10.1): the key's display prefix, never the key.
func withSource(ctx context.Context, p model.Principal) context.Context {
	return model.WithSource(ctx, model.APISource(p.KeyPrefix))
}

// parseID accepts only the canonical 36-character UUID form; anything else is not found.
func parseID(s string) (uuid.UUID, error) {
	if len(s) != 36 {
		return uuid.Nil, fmt.Errorf("%w", model.ErrNotFound)
	}
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.Nil, fmt.Errorf("%w", model.ErrNotFound)
	}
	return id, nil
}
