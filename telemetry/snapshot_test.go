package telemetry

import (
	"reflect"
	"testing"
	"unsafe"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// hiddenSpan hides the SDK's snapshot type from readSpan, which then reads through the
// accessors.
type hiddenSpan struct{ sdktrace.ReadOnlySpan }

// readInPlace reports whether sd is s's own memory rather than a copy.
func readInPlace(s sdktrace.ReadOnlySpan, sd *spanData) bool {
	v := reflect.ValueOf(s)
	return v.Kind() == reflect.Pointer && v.UnsafePointer() == unsafe.Pointer(sd)
}

// The SDK in go.mod has the snapshot layout spanData mirrors, and reading a span in place
// gives what its accessors give, for spans with every kind of field set. When this fails after
// an SDK upgrade, the snapshot changed: update spanData to match it (the encoder still works
// meanwhile, through the accessors, only slower).
func TestReadSpanInPlace(t *testing.T) {
	if snapshotType() == nil {
		t.Fatalf("the SDK's ended spans (%v) are not laid out as spanData: readSpan copies every span through its accessors", endedSpanType())
	}
	inPlace := 0
	for i, s := range equivalenceSpans(t) {
		got := readSpan(s)
		// Spans of other implementations (tracetest's stubs) are read through the accessors.
		if sdk := reflect.TypeOf(s) == snapshotType(); readInPlace(s, got) != sdk {
			t.Fatalf("span %d (%T): read in place %v, want %v", i, s, readInPlace(s, got), sdk)
		} else if sdk {
			inPlace++
		}
		want := readSpan(hiddenSpan{s})
		if readInPlace(s, want) {
			t.Fatalf("span %d: a hidden span was read in place", i)
		}
		if !reflect.DeepEqual(*got, *want) {
			t.Errorf("span %d: in place %+v\nthrough the accessors %+v", i, *got, *want)
		}
	}
	if inPlace < 5 {
		t.Errorf("%d spans read in place; the test needs the SDK's own spans", inPlace)
	}
}

// snapshotLayout accepts only a pointer to a struct laid out exactly as spanData.
func TestSnapshotLayout(t *testing.T) {
	// variant is a pointer to a struct of spanData's fields as change leaves them.
	variant := func(change func([]reflect.StructField) []reflect.StructField) reflect.Type {
		st := reflect.TypeFor[spanData]()
		fields := make([]reflect.StructField, st.NumField())
		for i := range fields {
			fields[i] = st.Field(i)
			fields[i].Offset, fields[i].Index = 0, nil
		}
		return reflect.PointerTo(reflect.StructOf(change(fields)))
	}
	same := func(fs []reflect.StructField) []reflect.StructField { return fs }
	for _, c := range []struct {
		name string
		t    reflect.Type
		ok   bool
	}{
		{"spanData", reflect.TypeFor[*spanData](), true},
		{"the same fields", variant(same), true},
		{"not a pointer", reflect.TypeFor[spanData](), false},
		{"a field retyped", variant(func(fs []reflect.StructField) []reflect.StructField {
			fs[10].Type = reflect.TypeFor[int64]() // childSpanCount: same size, other type
			return fs
		}), false},
		{"a field renamed", variant(func(fs []reflect.StructField) []reflect.StructField {
			fs[10].Name = "children"
			return fs
		}), false},
		{"two fields swapped", variant(func(fs []reflect.StructField) []reflect.StructField {
			fs[11], fs[12] = fs[12], fs[11]
			return fs
		}), false},
		{"a field more", variant(func(fs []reflect.StructField) []reflect.StructField {
			return append(fs, reflect.StructField{Name: "more", PkgPath: fs[0].PkgPath, Type: reflect.TypeFor[int]()})
		}), false},
		{"a field less", variant(func(fs []reflect.StructField) []reflect.StructField { return fs[:len(fs)-1] }), false},
		{"not a struct", reflect.TypeFor[*int](), false},
		{"nil", nil, false},
	} {
		if got := snapshotLayout(c.t) != nil; got != c.ok {
			t.Errorf("%s (%v): accepted %v, want %v", c.name, c.t, got, c.ok)
		}
	}
}
