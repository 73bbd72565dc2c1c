package api

import (
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/subscriberd/subscriberd/model"
)

// readAll yields every row of file, or the error that stopped it.
func readAll(file, format string, maxRows, maxBytes int64) ([]string, error) {
	next := ImportRows(strings.NewReader(file), format, maxRows, maxBytes)
	var rows []string
	for {
		row, err := next()
		if errors.Is(err, io.EOF) {
			return rows, nil
		}
		if err != nil {
			return rows, err
		}
		b, err := json.Marshal(row) // keys in order: the objects' fields are compared
		if err != nil {
			return rows, err
		}
		rows = append(rows, string(b))
	}
}

func TestImportRowsCSV(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       []string
	}{
		{"bom, crlf, any column order and case, extra columns ignored",
			"\ufeff Status ,x,EMAIL,Name\r\npending,1,a@example.com,Ann\r\n,2,b@example.com,\r\n",
			[]string{`{"email":"a@example.com","name":"Ann","status":"pending"}`, `{"email":"b@example.com","name":""}`}},
		{"email only, quoted fields with commas, quotes and newlines",
			"email\n\"a@example.com\"\n\"x,\"\"y\"\"\nz\"\n",
			[]string{`{"email":"a@example.com"}`, `{"email":"x,\"y\"\nz"}`}},
		{"short row lacks its last columns; blank lines skipped", "email,name\n\na@example.com\n",
			[]string{`{"email":"a@example.com","name":""}`}},
		{"header only", "email,name\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readAll(tc.file, model.ImportCSV, 10, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("rows (-want +got):\n%s", diff)
			}
		})
	}
}

func TestImportRowsNDJSON(t *testing.T) {
	got, err := readAll("\ufeff{\"email\":\"a@example.com\"}\r\n\n  {\"email\":\"b@example.com\",\"x\":1}  \n", model.ImportNDJSON, 10, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{`{"email":"a@example.com"}`, `{"email":"b@example.com","x":1}`}, got); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
}

func TestImportRowsRefused(t *testing.T) {
	for _, tc := range []struct {
		name, format, file string
		maxRows, maxBytes  int64
		msg                string
		tooLarge           bool
	}{
		{"no email column", model.ImportCSV, "name\nx\n", 10, 1 << 20, "The CSV header (line 1) has no email column.", false},
		{"empty", model.ImportCSV, "", 10, 1 << 20, "The file is empty: a CSV file starts with a header row naming an email column (line 1).", false},
		{"unclosed quote", model.ImportCSV, "email\na@example.com\n\"b@example.com\n", 10, 1 << 20, "The CSV file is malformed at line 3, column 16: extraneous or missing \" in quoted-field.", false},
		{"not UTF-8 in a later line", model.ImportCSV, "email,name\na@example.com,x\nb@example.com,\xc3\x28\n", 10, 1 << 20, "The file is not valid UTF-8: line 3.", false},
		{"not UTF-8 in the header", model.ImportCSV, "email,n\xffme\n", 10, 1 << 20, "The file is not valid UTF-8: line 1.", false},
		{"ndjson array", model.ImportNDJSON, "{\"email\":\"a@example.com\"}\n\n[]\n", 10, 1 << 20, "Line 3 is not a JSON object.", false},
		{"ndjson line too long", model.ImportNDJSON, "{\"email\":\"" + strings.Repeat("a", maxNDJSONLine) + "\"}\n", 10, 4 << 20, "Line 1 is longer than 1 MiB.", false},
		{"rows", model.ImportCSV, "email\na@x.io\nb@x.io\nc@x.io\n", 2, 1 << 20, "An import file must not have more than 2 rows.", true},
		{"bytes", model.ImportNDJSON, strings.Repeat("{\"email\":\"a@example.com\"}\n", 100), 1000, 1 << 10, "An import file must not be larger than 1 KiB.", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := readAll(tc.file, tc.format, tc.maxRows, tc.maxBytes)
			var fe *model.ImportFileError
			var te *model.ImportTooLargeError
			switch {
			case tc.tooLarge && errors.As(err, &te):
				if te.Message != tc.msg {
					t.Errorf("message %q, want %q", te.Message, tc.msg)
				}
			case !tc.tooLarge && errors.As(err, &fe):
				if fe.Message != tc.msg {
					t.Errorf("message %q, want %q", fe.Message, tc.msg)
				}
			default:
				t.Errorf("err = %v, want %q", err, tc.msg)
			}
		})
	}
}
