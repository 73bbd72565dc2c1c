package cursor_test

import (
	"encoding/base64"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/api/cursor"
)

var (
	key     = []byte("0123456789abcdef0123456789abcdef")
	binding = cursor.Binding("subscribers", "01900000-0000-7000-8000-00000000000a", "", "")
	pos     = cursor.Position{Time: time.Date(2026, 6, 11, 17, 0, 0, 123456000, time.UTC),
		ID: uuid.MustParse("01900000-0000-7000-8000-000000000001")}
)

func TestRoundTrip(t *testing.T) {
	c := cursor.New(key)
	s := c.Encode(binding, pos)
	got, err := c.Decode(binding, s)
	if err != nil || !got.Time.Equal(pos.Time) || got.ID != pos.ID {
		t.Fatalf("Decode(Encode(p)) = %v, %v; want %v", got, err, pos)
	}
	// Another instance with the same key reads it; sub-microsecond time is dropped.
	p2 := pos
	p2.Time = p2.Time.Add(999)
	if got, err := cursor.New(key).Decode(binding, c.Encode(binding, p2)); err != nil || !got.Time.Equal(pos.Time) {
		t.Fatalf("decode on a second codec = %v, %v", got, err)
	}
}

func TestInvalid(t *testing.T) {
	c := cursor.New(key)
	s := c.Encode(binding, pos)
	raw, _ := base64.RawURLEncoding.DecodeString(s)
	flip := func(i int) string {
		b := append([]byte(nil), raw...)
		b[i] ^= 0x01
		return base64.RawURLEncoding.EncodeToString(b)
	}
	tests := map[string]struct{ binding, s string }{
		"empty":           {binding, ""},
		"garbage":         {binding, "not a cursor"},
		"padded":          {binding, s + "="},
		"std alphabet":    {binding, base64.StdEncoding.EncodeToString(raw)},
		"truncated":       {binding, s[:len(s)-1]},
		"longer":          {binding, s + "A"},
		"version":         {binding, flip(0)},
		"time":            {binding, flip(3)},
		"id":              {binding, flip(20)},
		"mac":             {binding, flip(len(raw) - 1)},
		"other binding":   {cursor.Binding("subscribers", "01900000-0000-7000-8000-00000000000b", "", ""), s},
		"other filter":    {cursor.Binding("subscribers", "01900000-0000-7000-8000-00000000000a", "active", ""), s},
		"other operation": {cursor.Binding("events", "01900000-0000-7000-8000-00000000000a", "", ""), s},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := c.Decode(tt.binding, tt.s); !errors.Is(err, cursor.ErrInvalid) {
				t.Fatalf("Decode(%q) err = %v; want ErrInvalid", tt.s, err)
			}
		})
	}
	if _, err := cursor.New([]byte("another key, another deployment.")).Decode(binding, s); !errors.Is(err, cursor.ErrInvalid) {
		t.Fatalf("decode under another key: %v; want ErrInvalid", err)
	}
}

// FuzzDecode: no input panics, and only the codec's own cursors for the binding decode.
func FuzzDecode(f *testing.F) {
	c := cursor.New(key)
	s := c.Encode(binding, pos)
	for _, seed := range []string{"", "A", s, s[:len(s)-1], s + "=", "%%%%", "\x00\xff", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in string) {
		p, err := c.Decode(binding, in)
		if err != nil {
			if !errors.Is(err, cursor.ErrInvalid) {
				t.Fatalf("Decode(%q) err = %v; want ErrInvalid", in, err)
			}
			return
		}
		// Forging a MAC by chance is not expected: a cursor that decodes is one the codec made.
		if c.Encode(binding, p) != in {
			t.Fatalf("Decode(%q) accepted a cursor the codec did not make", in)
		}
	})
}
