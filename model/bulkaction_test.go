package model_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/model"
)

func decodeBody(t *testing.T, body string) map[string]any {
	t.Helper()
	var obj map[string]any
	dec := json.NewDecoder(strings.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&obj); err != nil {
		t.Fatal(err)
	}
	return obj
}

// TestParseBulkRequest: a valid body becomes the change and target the stores apply — tags
// normalised and sorted, the patch's nulls kept as removals, ids sorted without repeats, a
// filter by the segments' rules; the tag actions map to the tags operation's change.
func TestParseBulkRequest(t *testing.T) {
	a, b := "0190a8c4-0000-7000-8000-00000000000a", "0190a8c4-0000-7000-8000-00000000000b"
	for _, c := range []struct {
		name, body string
		want       model.BulkRequest
		change     model.TagsChange
	}{
		{"add_tags", `{"action":"add_tags","tags":["VIP"," beta ","vip"],"filter":{"tags":["Gold"]}}`,
			model.BulkRequest{BulkChange: model.BulkChange{Action: model.ActionAddTags, Tags: []string{"beta", "vip"}},
				Target: model.BulkTarget{Filter: &model.Filter{Tags: []string{"gold"}}}},
			model.TagsChange{Add: []string{"beta", "vip"}}},
		{"remove_tags", `{"action":"remove_tags","tags":["x"],"ids":["` + b + `","` + a + `","` + b + `"]}`,
			model.BulkRequest{BulkChange: model.BulkChange{Action: model.ActionRemoveTags, Tags: []string{"x"}},
				Target: model.BulkTarget{IDs: []uuid.UUID{uuid.MustParse(a), uuid.MustParse(b)}}},
			model.TagsChange{Remove: []string{"x"}}},
		{"set_attributes", `{"action":"set_attributes","attributes":{"plan":"pro","seats":5,"old":null},"filter":{}}`,
			model.BulkRequest{BulkChange: model.BulkChange{Action: model.ActionSetAttributes,
				Attributes: model.AttributesPatch{"plan": "pro", "seats": json.Number("5"), "old": nil}},
				Target: model.BulkTarget{Filter: &model.Filter{}}},
			model.TagsChange{Add: nil}},
		{"unsubscribe by segment", `{"action":"unsubscribe","segment":"` + a + `"}`,
			model.BulkRequest{BulkChange: model.BulkChange{Action: model.ActionUnsubscribe},
				Target: model.BulkTarget{Segment: ptrUUID(uuid.MustParse(a))}},
			model.TagsChange{Add: nil}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, verr := model.ParseBulkRequest(decodeBody(t, c.body))
			if verr != nil {
				t.Fatalf("errors %v", verr.Fields)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("request mismatch (-want +got):\n%s", diff)
			}
			if got.Action == model.ActionAddTags || got.Action == model.ActionRemoveTags {
				if diff := cmp.Diff(c.change, got.TagsChange()); diff != "" {
					t.Errorf("tags change mismatch (-want +got):\n%s", diff)
				}
			}
		})
	}
}

func ptrUUID(id uuid.UUID) *uuid.UUID { return &id }

// TestParseBulkRequestRefuses: every problem is reported at once, keyed as §20.2 says.
func TestParseBulkRequestRefuses(t *testing.T) {
	for _, c := range []struct {
		name, body string
		want       map[string][]string
	}{
		{"all wrong", `{"action":"add_tags","attributes":{"a":1},"ids":["nope"],"extra":1}`, map[string][]string{
			"tags":       {"The tags field is required when action is add_tags."},
			"attributes": {"The attributes field is prohibited unless action is set_attributes."},
			"ids.0":      {"The ids.0 field must be a valid UUID."},
			"extra":      {"The extra field is prohibited."},
		}},
		{"target and action", `{"action":"nope","segment":"x","filter":{}}`, map[string][]string{
			"action": {"The selected action is invalid; it must be add_tags, remove_tags, set_attributes or unsubscribe."},
			"body":   {"Exactly one of filter, segment or ids must be provided."},
		}},
		{"empty patch", `{"action":"set_attributes","attributes":{},"filter":[]}`, map[string][]string{
			"attributes": {"The attributes field is required when action is set_attributes."},
			"filter":     {"The filter field must be an object."},
		}},
		{"ids not a list", `{"action":"unsubscribe","ids":"x"}`, map[string][]string{
			"ids": {"The ids field must be an array."},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, verr := model.ParseBulkRequest(decodeBody(t, c.body))
			if verr == nil {
				t.Fatal("accepted")
			}
			if diff := cmp.Diff(c.want, verr.Fields); diff != "" {
				t.Errorf("errors mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
