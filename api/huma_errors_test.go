package api_test

import (
	"encoding/json"
	"testing"

	"github.com/danielgtaylor/huma/v2"

	"github.com/subscriberd/subscriberd/api"
)

func TestLaravelKey(t *testing.T) {
	tests := []struct{ in, want string }{
		{"body", "body"},
		{"body.email", "email"},
		{"body[2].email", "2.email"},
		{"body[3]", "3"},
		{"body[10].name", "10.name"},
		{"query.limit", "limit"},
		{"path.id", "id"},
		{"header.Content-Type", "Content-Type"},
		{"", "body"},
	}
	for _, tt := range tests {
		if got := api.LaravelKey(tt.in); got != tt.want {
			t.Errorf("laravelKey(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
}

// TestHumaErrorEnvelope: Huma's own errors (which the preflight mostly prevents) still come
// out as the contract's envelope.
func TestHumaErrorEnvelope(t *testing.T) {
	tests := []struct {
		name       string
		status     int
		msg        string
		errs       []error
		wantStatus int
		want       string
	}{
		{"field details become Laravel keys", 422, "validation failed",
			[]error{&huma.ErrorDetail{Message: "m1", Location: "body[1].email"}, &huma.ErrorDetail{Message: "m2", Location: "body[1].email"}, &huma.ErrorDetail{Message: "m3", Location: "body"}},
			422, `{"success":false,"code":"validation_error","message":"The given data was invalid.","errors":{"1.email":["m1","m2"],"body":["m3"]}}`},
		{"generic message replaced by the status text", 400, "validation failed", nil,
			400, `{"success":false,"code":"validation_error","message":"Bad Request"}`},
		{"empty message", 415, "", nil,
			415, `{"success":false,"code":"unsupported_media_type","message":"Unsupported Media Type"}`},
		{"413", 413, "request body is too large", nil,
			413, `{"success":false,"code":"payload_too_large","message":"request body is too large"}`},
		{"unknown 5xx", 502, "bad gateway", nil,
			502, `{"success":false,"code":"internal_error","message":"bad gateway"}`},
		{"unknown 4xx", 409, "conflict", nil,
			409, `{"success":false,"code":"validation_error","message":"conflict"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := api.HumaError(tt.status, tt.msg, tt.errs...)
			if err.GetStatus() != tt.wantStatus {
				t.Errorf("status = %d; want %d", err.GetStatus(), tt.wantStatus)
			}
			b, jerr := json.Marshal(err)
			if jerr != nil {
				t.Fatal(jerr)
			}
			jsonEqual(t, b, tt.want)
		})
	}
	if _, ok := api.HumaError(0, "").(*api.Error); !ok {
		t.Errorf("HumaError(0, \"\") is not *api.Error; Huma reflects on it for the schema")
	}
}
