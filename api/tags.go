package api

import (
	"context"
	"net/http"

	"github.com/danielgtaylor/huma/v2"

	"github.com/subscriberd/subscriberd/model"
)

// TagsChangeInput is the body of POST /subscribers/{id}/tags (docs/api-contract.md §19.2),
// decoded as any JSON object so that model reports every problem in the contract's words.
type TagsChangeInput map[string]any

// Schema implements huma.SchemaProvider.
func (TagsChangeInput) Schema(r huma.Registry) *huma.Schema {
	const name = "TagsChange"
	if _, ok := r.Map()[name]; !ok {
		r.Map()[name] = &huma.Schema{
			Type:                 huma.TypeObject,
			AdditionalProperties: false,
			MinProperties:        ptr(1),
			Description: "At least one of add and remove. Tags are normalised as stored ones (trimmed, lower-cased); " +
				"a tag may not be in both lists. The result may hold at most 100 tags.",
			Properties: map[string]*huma.Schema{
				"add":    tagsSchema("Tags to add; those the subscriber has already are left as they are."),
				"remove": tagsSchema("Tags to remove; those the subscriber does not have are ignored."),
			},
		}
	}
	return &huma.Schema{Ref: "#/components/schemas/" + name}
}

// UnmarshalJSON keeps numbers as json.Number (see SubscriberInput).
func (in *TagsChangeInput) UnmarshalJSON(b []byte) error {
	return decodeNumbers(b, (*map[string]any)(in))
}

type tagsInput struct {
	ID   string `path:"id" format:"uuid" doc:"The subscriber's id."`
	Body TagsChangeInput
	Keyed
}

// TagCount is a tag with how many subscribers hold it.
type TagCount struct {
	Tag         string `json:"tag" doc:"The tag." example:"beta"`
	Subscribers int64  `json:"subscribers" minimum:"1" doc:"Subscribers (any status) that hold it, exactly." example:"1234"`
}

// TagPagination describes a page of GET /tags.
type TagPagination struct {
	Limit      int     `json:"limit" minimum:"1" maximum:"1000"`
	NextCursor *string `json:"next_cursor" nullable:"true" doc:"Pass as cursor to get the page after this one; null when no tag follows."`
}

// TagListEnvelope is the success body of GET /tags.
type TagListEnvelope struct {
	Success    bool          `json:"success" doc:"Always true."`
	Data       []TagCount    `json:"data"`
	Pagination TagPagination `json:"pagination"`
}

type tagLimitParam string

func (tagLimitParam) Schema(huma.Registry) *huma.Schema {
	return &huma.Schema{Type: huma.TypeInteger, Minimum: ptr(1.0), Maximum: ptr(float64(model.MaxTagLimit)), Default: model.DefaultTagLimit}
}

type (
	tagListInput struct {
		Limit  tagLimitParam `query:"limit" doc:"Tags per page, 1 to 1000."`
		Cursor cursorParam   `query:"cursor" doc:"The next_cursor of a previous page: the page after it."`
	}
	tagListOutput struct {
		Body TagListEnvelope
	}
)

func (s *Server) listTags(ctx context.Context, p model.Principal, st Stores, in *tagListInput) (*tagListOutput, error) {
	limit, err := model.ParseTagLimit(string(in.Limit))
	if err != nil {
		return nil, err
	}
	var after string
	if in.Cursor != "" {
		var ok bool
		if after, ok = s.decodeKeyCursor("tags", p.NewsletterID.String(), string(in.Cursor)); !ok {
			return nil, newError(http.StatusBadRequest, MsgCursorInvalid)
		}
	}
	tags, err := st.Subscribers.ListTags(ctx, p.NewsletterID, after, limit+1)
	if err != nil {
		return nil, err
	}
	var next *string
	if len(tags) > limit {
		tags = tags[:limit]
		c := s.encodeKeyCursor("tags", p.NewsletterID.String(), tags[len(tags)-1].Tag)
		next = &c
	}
	data := make([]TagCount, len(tags))
	for i, t := range tags {
		data[i] = TagCount{Tag: t.Tag, Subscribers: t.Subscribers}
	}
	return &tagListOutput{Body: TagListEnvelope{Success: true, Data: data,
		Pagination: TagPagination{Limit: limit, NextCursor: next}}}, nil
}

// registerTags adds POST /subscribers/{id}/tags and GET /tags.
func (s *Server) registerTags(withBody, common []int) {
	op := s.operation(http.MethodGet, BasePath+"/tags", "list-tags", "List tags",
		"The newsletter's tags, sorted by code point, each with how many subscribers (any status) hold it, exactly.",
		http.StatusOK, "", append([]int{http.StatusBadRequest}, common...))
	huma.Register(s.api, op, handle(s, s.listTags))
	registerKeyed(s, s.operation(http.MethodPost, BasePath+"/subscribers/{id}/tags", "change-subscriber-tags",
		"Add and remove tags",
		"Adds and removes tags in one atomic change, on a subscriber of any status. Concurrent changes of different "+
			"tags all take effect. A change that leaves the set as it is records no event.",
		http.StatusOK, bodyObject, append([]int{http.StatusNotFound}, withBody...)), s.changeTags)
}

func (s *Server) changeTags(ctx context.Context, p model.Principal, st Stores, in *tagsInput) (*subscriberOutput, error) {
	id, idErr := parseID(in.ID)
	c, verr := model.ParseTagsChange(in.Body)
	if idErr != nil { // an unknown id is 404 whatever the body says
		return nil, idErr
	}
	if verr != nil {
		return nil, verr
	}
	sub, err := st.Subscribers.ChangeTags(withSource(ctx, p), p.NewsletterID, id, c)
	if err != nil {
		return nil, err
	}
	return &subscriberOutput{Body: SubscriberEnvelope{Success: true, Data: toSubscriber(sub)}}, nil
}
