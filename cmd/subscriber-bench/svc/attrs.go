package svc

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
)

// The scenarios of attributes and tags (docs/api-contract.md §19.4). create_attrs runs with the
// other writes; the three reads run on the newsletter after the million-row import, whose file
// gives every hundredth row FilteredTag and the attribute plan=FilteredPlan, and the newsletter
// ImportTags tags in all (see the main package's importFile).
const (
	CreateAttrs = "create_attrs" // create_active with 5 attributes and 3 tags
	ListTag     = "list_tag"     // first page with its exact total, tag=FilteredTag
	ListAttr    = "list_attr"    // first page with its exact total, attr[plan]=FilteredPlan
	TagsList    = "tags_list"    // GET /tags, its first page of 100
)

// ImportTags is the number of distinct tags the million-row import gives its rows (see the main
// package's importFile).
const ImportTags = 100

// TagName is the name of the import's n-th tag.
func TagName(n int) string { return fmt.Sprintf("tag-%02d", n) }

// FilteredTag and FilteredPlan are what list_tag and list_attr select: each held by 1 % of the
// imported rows.
var (
	FilteredTag  = TagName(42)
	FilteredPlan = "x"
)

// TagsPage is the page size of tags_list: GET /tags's default limit.
const TagsPage = 100

// attrScenarios are the §19 scenarios (Scenarios lists them with the others).
func (c *Client) attrScenarios() []Scenario {
	get := func(path string) func(int64) request {
		return func(int64) request { return request{method: http.MethodGet, path: path, rows: 1} }
	}
	listCheck := func(status int, body []byte) error { return checkList(status, body, true) }
	return []Scenario{
		{Name: CreateAttrs, Desc: "POST one active subscriber with 5 attributes and 3 tags", Write: true, Check: checkOne(201),
			req: func(seq int64) request {
				// The tags are among the import's, so that the newsletter keeps its 100 tags.
				return request{method: http.MethodPost, path: subscribersPath, rows: 1, body: fmt.Appendf(nil,
					`{"email":%q,"name":"Bench Person %d","status":"active",`+
						`"attributes":{"plan":"pro","seats":%d,"trial":false,"company":"Acme %d","score":1.5},`+
						`"tags":[%q,%q,%q]}`, c.Email("a"), seq, seq%50, seq, TagName(1), TagName(2), TagName(3))}
			}},
		{Name: ListTag, Desc: "GET first page of 25 with its total, tag=" + FilteredTag + " (1 % hold it)", Check: listCheck,
			req: get(subscribersPath + "?tag=" + url.QueryEscape(FilteredTag))},
		{Name: ListAttr, Desc: "GET first page of 25 with its total, attr[plan]=" + FilteredPlan + " (1 % hold it)", Check: listCheck,
			req: get(subscribersPath + "?" + url.QueryEscape("attr[plan]") + "=" + url.QueryEscape(FilteredPlan))},
		{Name: TagsList, Desc: fmt.Sprintf("GET /tags, first page of %d", TagsPage), Check: checkTags, req: get(tagsPath)},
	}
}

const tagsPath = "/api/v1/tags"

// checkTags validates a page of GET /tags: a full page of tags, each held by someone.
func checkTags(status int, body []byte) error {
	tags, _, err := decodeData[[]struct {
		Tag         string `json:"tag"`
		Subscribers int64  `json:"subscribers"`
	}](status, 200, body)
	if err != nil {
		return err
	}
	if len(tags) != TagsPage {
		return fmt.Errorf("%d tags on the page, want %d", len(tags), TagsPage)
	}
	for _, t := range tags {
		if t.Tag == "" || t.Subscribers <= 0 {
			return errors.New("a tag without a name or a holder: " + string(body[:min(len(body), 300)]))
		}
	}
	return nil
}
