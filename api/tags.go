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

// registerTags adds POST /subscribers/{id}/tags.
func (s *Server) registerTags(withBody []int) {
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
