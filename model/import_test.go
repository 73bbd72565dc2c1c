package model

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseImportRow(t *testing.T) {
	for _, tc := range []struct {
		name   string
		data   string
		def    Status
		want   NewSubscriber
		fields map[string][]string
	}{
		{"default status", `{"email":" a@example.com ","name":"Ann Lee"}`, StatusPending,
			NewSubscriber{Email: "a@example.com", FirstName: "Ann", LastName: "Lee", Status: StatusPending}, nil},
		{"own status", `{"email":"a@example.com","status":"active"}`, StatusPending,
			NewSubscriber{Email: "a@example.com", Status: StatusActive}, nil},
		{"invalid email", `{"email":"nope"}`, StatusActive, NewSubscriber{},
			map[string][]string{"email": {"The email field must be a valid email address."}}},
		{"every field at once", `{"email":5,"status":"unsubscribed","colour":"red"}`, StatusActive, NewSubscriber{},
			map[string][]string{"email": {"The email field must be a string."}, "colour": {"The colour field is prohibited."},
				"status": {"The selected status is invalid; it must be active or pending."}}},
		{"missing email", `{"name":"Ann"}`, StatusActive, NewSubscriber{},
			map[string][]string{"email": {"The email field is required."}}},
		{"not an object", `[1]`, StatusActive, NewSubscriber{},
			map[string][]string{"body": {"The row must be a JSON object."}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, verr := ParseImportRow([]byte(tc.data), tc.def)
			var fields map[string][]string
			if verr != nil {
				fields = verr.Fields
			}
			if diff := cmp.Diff(tc.fields, fields); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.want, got); verr == nil && diff != "" {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
