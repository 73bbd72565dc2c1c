package model_test

import (
	"testing"

	"github.com/subscriberd/subscriberd/model"
)

func TestConfirmationEffect(t *testing.T) {
	str := func(s string) *string { return &s }
	st := func(s model.Status) *model.Status { return &s }
	pending := model.Subscriber{Email: "a@x.io", Status: model.StatusPending}
	active := model.Subscriber{Email: "a@x.io", Status: model.StatusActive}
	cases := []struct {
		name              string
		patch             model.SubscriberPatch
		before            model.Subscriber
		retire, wantQueue bool
	}{
		{"name only", model.SubscriberPatch{Name: str("X")}, pending, false, false},
		{"to pending", model.SubscriberPatch{Status: st(model.StatusPending)}, active, true, true},
		{"pending again", model.SubscriberPatch{Status: st(model.StatusPending)}, pending, true, true},
		{"to active", model.SubscriberPatch{Status: st(model.StatusActive)}, pending, true, false},
		{"new email while pending", model.SubscriberPatch{Email: str("b@x.io")}, pending, true, true},
		{"same email in another case while pending", model.SubscriberPatch{Email: str("A@X.io")}, pending, false, false},
		{"new email while active", model.SubscriberPatch{Email: str("b@x.io")}, active, false, false},
		{"new email and active", model.SubscriberPatch{Email: str("b@x.io"), Status: st(model.StatusActive)}, pending, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			retire, queue := tc.patch.ConfirmationEffect(tc.before)
			if retire != tc.retire || queue != tc.wantQueue {
				t.Errorf("ConfirmationEffect = retire %v, queue %v; want %v, %v", retire, queue, tc.retire, tc.wantQueue)
			}
		})
	}
}
