package model

import (
	"encoding/json"
	"fmt"
	"testing"
)

// The hot path of every write: a decoded JSON body checked against the contract's rules.
// Run with: go test -run '^$' -bench . -benchmem ./model

func benchCreateBody(i int) map[string]any {
	return map[string]any{"email": fmt.Sprintf("Person.%d@Example.com", i), "name": "Ada Lovelace King", "status": "pending"}
}

func BenchmarkParseCreate(b *testing.B) {
	body := benchCreateBody(1)
	b.ReportAllocs()
	for b.Loop() {
		if _, verr := ParseCreate(body); verr != nil {
			b.Fatal(verr)
		}
	}
}

func BenchmarkParseCreateInvalid(b *testing.B) {
	body := map[string]any{"email": "not an email", "name": 5, "status": "gone", "extra": true}
	b.ReportAllocs()
	for b.Loop() {
		if _, verr := ParseCreate(body); verr == nil {
			b.Fatal("invalid body accepted")
		}
	}
}

func BenchmarkParseBulk100(b *testing.B) {
	items := make([]any, 100)
	for i := range items {
		items[i] = benchCreateBody(i)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, verr := ParseBulk(items); verr != nil {
			b.Fatal(verr)
		}
	}
}

// BenchmarkDecodeAndParseBulk100 includes what the edge does before validation: decoding the
// JSON array into generic values.
func BenchmarkDecodeAndParseBulk100(b *testing.B) {
	items := make([]any, 100)
	for i := range items {
		items[i] = benchCreateBody(i)
	}
	raw, err := json.Marshal(items)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		var decoded []any
		if err := json.Unmarshal(raw, &decoded); err != nil {
			b.Fatal(err)
		}
		if _, verr := ParseBulk(decoded); verr != nil {
			b.Fatal(verr)
		}
	}
}

func BenchmarkValidEmail(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if !ValidEmail("first.last+tag@mail.example.co.uk") {
			b.Fatal("valid email rejected")
		}
	}
}

func BenchmarkParseListQuery(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseListQuery("2000", "25", "active"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkHashKey(b *testing.B) {
	key, _, _ := NewKeySecret()
	b.ReportAllocs()
	for b.Loop() {
		if !WellFormedKey(key) || len(HashKey(key)) == 0 {
			b.Fatal("key rejected")
		}
	}
}
