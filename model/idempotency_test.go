package model_test

import (
	"bytes"
	"testing"

	"github.com/subscriberd/subscriberd/model"
)

func TestFingerprint(t *testing.T) {
	base := model.Fingerprint("POST", "/api/v1/subscribers", []byte(`{"email":"a@example.com"}`))
	if !bytes.Equal(base, model.Fingerprint("POST", "/api/v1/subscribers", []byte(`{"email":"a@example.com"}`))) {
		t.Fatal("the same request has two fingerprints")
	}
	for name, fp := range map[string][]byte{
		"method": model.Fingerprint("PUT", "/api/v1/subscribers", []byte(`{"email":"a@example.com"}`)),
		"path":   model.Fingerprint("POST", "/api/v1/subscribers/bulk", []byte(`{"email":"a@example.com"}`)),
		"bytes":  model.Fingerprint("POST", "/api/v1/subscribers", []byte(`{"email": "a@example.com"}`)),
		// The parts are delimited: moving a byte from the method to the path is another request.
		"split": model.Fingerprint("POS", "T/api/v1/subscribers", []byte(`{"email":"a@example.com"}`)),
	} {
		if bytes.Equal(base, fp) {
			t.Errorf("another %s has the same fingerprint", name)
		}
	}
}

func TestParseEmailFilter(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"a@example.com", "a@example.com", true},
		{"  A@Example.COM\t", "A@Example.COM", true},
		{"用户@例子.广告", "用户@例子.广告", true},
		{" ", "", false},
		{"a", "", false},
		{"a@b", "", false},
		{"Ada <a@example.com>", "", false},
	}
	for _, tt := range tests {
		got, err := model.ParseEmailFilter(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseEmailFilter(%q) = %q, %v; want %q, ok %v", tt.in, got, err, tt.want, tt.ok)
		}
		if err != nil && err.Error() != "The email filter must be a valid email address." {
			t.Errorf("message %q", err)
		}
	}
}
