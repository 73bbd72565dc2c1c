package model_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/subscriberd/subscriberd/model"
)

func TestSplitName(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		wantFirst string
		wantLast  string
		wantJoin  string
	}{
		{"first and last", "John Doe", "John", "Doe", "John Doe"},
		{"rest goes to last name", "John Doe Jr", "John", "Doe Jr", "John Doe Jr"},
		{"single word", "Cher", "Cher", "", "Cher"},
		{"empty", "", "", "", ""},
		{"all spaces", "    ", "", "", ""},
		{"leading and trailing spaces", "  John Doe  ", "John", "Doe", "John Doe"},
		{"multiple spaces at the split", "John    Doe", "John", "Doe", "John Doe"},
		{"inner spaces of the last name kept", "John  Doe   Jr", "John", "Doe   Jr", "John Doe   Jr"},
		{"single word with spaces around", "  Cher  ", "Cher", "", "Cher"},
		{"multi-byte", "José María Núñez", "José", "María Núñez", "José María Núñez"},
		{"non-breaking space is not a split point", "Jean\u00a0Paul Sartre", "Jean\u00a0Paul", "Sartre", "Jean\u00a0Paul Sartre"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			first, last := model.SplitName(tt.in)
			if first != tt.wantFirst || last != tt.wantLast {
				t.Errorf("SplitName(%q) = %q, %q; want %q, %q", tt.in, first, last, tt.wantFirst, tt.wantLast)
			}
			if got := model.JoinName(first, last); got != tt.wantJoin {
				t.Errorf("JoinName(%q, %q) = %q; want %q", first, last, got, tt.wantJoin)
			}
		})
	}
}

func TestJoinName(t *testing.T) {
	tests := []struct {
		first, last, want string
	}{
		{"John", "Doe", "John Doe"},
		{"Cher", "", "Cher"},
		{"", "Doe", "Doe"},
		{"", "", ""},
	}
	for _, tt := range tests {
		if got := model.JoinName(tt.first, tt.last); got != tt.want {
			t.Errorf("JoinName(%q, %q) = %q; want %q", tt.first, tt.last, got, tt.want)
		}
	}
}

func TestSubscriberName(t *testing.T) {
	s := model.Subscriber{FirstName: "John", LastName: "Doe Jr"}
	if got, want := s.Name(), "John Doe Jr"; got != want {
		t.Errorf("Subscriber.Name() = %q; want %q", got, want)
	}
}

func TestParseStatus(t *testing.T) {
	tests := []struct {
		in     string
		want   model.Status
		wantOK bool
	}{
		{"active", model.StatusActive, true},
		{"pending", model.StatusPending, true},
		{"unsubscribed", model.StatusUnsubscribed, true},
		{"", "", false},
		{"Active", "", false},
		{"deleted", "", false},
	}
	for _, tt := range tests {
		got, ok := model.ParseStatus(tt.in)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("ParseStatus(%q) = %q, %v; want %q, %v", tt.in, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestStatusLists(t *testing.T) {
	if got := fmt.Sprint(model.Statuses); got != "[active pending unsubscribed]" {
		t.Errorf("Statuses = %s; want [active pending unsubscribed]", got)
	}
	if got := fmt.Sprint(model.InputStatuses); got != "[active pending]" {
		t.Errorf("InputStatuses = %s; want [active pending]", got)
	}
}

func TestEmailKey(t *testing.T) {
	tests := []struct{ a, b string }{
		{"A@x.io", "a@X.IO"},
		{"John.Doe@Example.COM", "john.doe@example.com"},
		{"ÜSER@MÜNCHEN.DE", "üser@münchen.de"},
	}
	for _, tt := range tests {
		if model.EmailKey(tt.a) != model.EmailKey(tt.b) {
			t.Errorf("EmailKey(%q) = %q, EmailKey(%q) = %q; want equal", tt.a, model.EmailKey(tt.a), tt.b, model.EmailKey(tt.b))
		}
	}
	if model.EmailKey("a@x.io") == model.EmailKey("b@x.io") {
		t.Errorf("EmailKey of different addresses are equal; want different")
	}
}

func TestEmailTakenError(t *testing.T) {
	err := fmt.Errorf("insert: %w", &model.EmailTakenError{Indexes: []int{1, 3}})
	if !errors.Is(err, model.ErrEmailTaken) {
		t.Errorf("errors.Is(EmailTakenError, ErrEmailTaken) = false; want true")
	}
	var taken *model.EmailTakenError
	if !errors.As(err, &taken) || fmt.Sprint(taken.Indexes) != "[1 3]" {
		t.Errorf("errors.As(EmailTakenError) gave %v; want indexes [1 3]", taken)
	}
}
