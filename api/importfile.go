package api

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/subscriberd/subscriberd/model"
)

// This file reads an import's file (docs/api-contract.md §15) as it arrives, one row at a
// time, into the objects the store validates and stages: a CSV row's columns by name, or an
// NDJSON line's object. What makes the file unreadable (no email column, not UTF-8, broken
// quoting, a line that is not a JSON object) is a *model.ImportFileError naming the line; a
// file over the limits is a *model.ImportTooLargeError. The rows' fields are checked by the
// store as it stages them (model.ParseImportObject); an invalid row is an error of the import.

// maxNDJSONLine is the longest NDJSON line read: a subscriber object is a few hundred bytes.
const maxNDJSONLine = 1 << 20

var bom = []byte("\xef\xbb\xbf")

// limitedBody fails with a *model.ImportTooLargeError once more than max bytes were read.
type limitedBody struct {
	r   io.Reader
	n   int64
	max int64
}

func (l *limitedBody) Read(p []byte) (int, error) {
	if int64(len(p)) > l.max-l.n+1 {
		p = p[:l.max-l.n+1]
	}
	n, err := l.r.Read(p)
	l.n += int64(n)
	if l.n > l.max {
		return n, tooLargeBytes(l.max)
	}
	return n, err
}

func tooLargeBytes(max int64) error {
	return &model.ImportTooLargeError{Message: fmt.Sprintf("An import file must not be larger than %s.", byteSize(max))}
}

func tooManyRows(max int64) error {
	return &model.ImportTooLargeError{Message: fmt.Sprintf("An import file must not have more than %d rows.", max)}
}

// byteSize writes n bytes as the contract does: 256 MiB.
func byteSize(n int64) string {
	switch {
	case n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

func fileError(format string, args ...any) error {
	return &model.ImportFileError{Message: fmt.Sprintf(format, args...)}
}

// ImportRows returns the function that yields the rows of body in format (model.ImportCSV
// or model.ImportNDJSON), one object each (an NDJSON line's numbers as json.Number), then
// io.EOF; it fails after maxRows rows or maxBytes bytes. POST /imports and the import command
// read files with it.
func ImportRows(body io.Reader, format string, maxRows, maxBytes int64) func() (map[string]any, error) {
	lb := &limitedBody{r: body, max: maxBytes}
	br := bufio.NewReaderSize(lb, 64<<10)
	if b, err := br.Peek(len(bom)); err == nil && bytes.Equal(b, bom) {
		br.Discard(len(bom)) //nolint:errcheck // peeked
	}
	var next func() (map[string]any, error)
	if format == model.ImportCSV {
		next = csvRows(br)
	} else {
		next = ndjsonRows(br)
	}
	var n int64
	return func() (map[string]any, error) {
		row, err := next()
		if err != nil && lb.n > lb.max {
			// The parsers may stumble on the cut-off end first: the limit is the cause.
			return nil, tooLargeBytes(maxBytes)
		}
		if err != nil {
			return nil, err
		}
		if n++; n > maxRows {
			return nil, tooManyRows(maxRows)
		}
		return row, nil
	}
}

// csvRows yields a CSV file's rows as objects: email, name when the file has the column (a
// short row's missing one is ""), status when the row gives a non-blank one (else the
// import's default applies), and docs/api-contract.md §19.2's columns: tags from a "tags"
// cell split at its commas, and each "attributes.<key>" column's non-empty cell as that
// attribute's text. The object is checked by the same rules as an NDJSON line's.
func csvRows(r io.Reader) func() (map[string]any, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1 // a short row lacks its last columns; its fields are checked by the rules
	cr.ReuseRecord = true
	emailCol, nameCol, statusCol, tagsCol := -1, -1, -1, -1
	attrCols := map[int]string{} // column → attribute key
	started := false
	return func() (map[string]any, error) {
		rec, err := cr.Read()
		if err != nil {
			return nil, csvError(err, started)
		}
		for i, f := range rec {
			if !utf8.ValidString(f) {
				line, _ := cr.FieldPos(i)
				return nil, fileError("The file is not valid UTF-8: line %d.", line)
			}
		}
		if !started {
			started = true
			for i, h := range rec {
				switch strings.ToLower(strings.TrimSpace(h)) {
				case "email":
					if emailCol < 0 {
						emailCol = i
					}
				case "name":
					if nameCol < 0 {
						nameCol = i
					}
				case "status":
					if statusCol < 0 {
						statusCol = i
					}
				case "tags":
					if tagsCol < 0 {
						tagsCol = i
					}
				default:
					if h = strings.TrimSpace(h); len(h) > len(csvAttributePrefix) && strings.EqualFold(h[:len(csvAttributePrefix)], csvAttributePrefix) {
						attrCols[i] = h[len(csvAttributePrefix):]
					}
				}
			}
			if emailCol < 0 {
				return nil, fileError("The CSV header (line 1) has no email column.")
			}
			rec, err = cr.Read()
			if err != nil {
				return nil, csvError(err, true)
			}
			for i, f := range rec {
				if !utf8.ValidString(f) {
					line, _ := cr.FieldPos(i)
					return nil, fileError("The file is not valid UTF-8: line %d.", line)
				}
			}
		}
		row := make(map[string]any, 3)
		row["email"] = ""
		if emailCol < len(rec) {
			row["email"] = rec[emailCol]
		}
		if nameCol >= 0 {
			name := ""
			if nameCol < len(rec) {
				name = rec[nameCol]
			}
			row["name"] = name
		}
		if statusCol >= 0 && statusCol < len(rec) && strings.TrimSpace(rec[statusCol]) != "" {
			row["status"] = strings.TrimSpace(rec[statusCol])
		}
		if tagsCol >= 0 && tagsCol < len(rec) && strings.TrimSpace(rec[tagsCol]) != "" {
			parts := strings.Split(rec[tagsCol], ",")
			tags := make([]any, len(parts))
			for i, t := range parts {
				tags[i] = t // trimmed and checked by the tags rules
			}
			row["tags"] = tags
		}
		var attrs map[string]any
		for col, key := range attrCols {
			if col >= len(rec) || rec[col] == "" {
				continue // an empty cell sets nothing
			}
			if attrs == nil {
				attrs = make(map[string]any, len(attrCols))
			}
			attrs[key] = rec[col]
		}
		if attrs != nil {
			row["attributes"] = attrs
		}
		return row, nil
	}
}

// csvAttributePrefix begins the header of a CSV column that sets an attribute (§19.2).
const csvAttributePrefix = "attributes."

// csvError is the error of a CSV read that failed: io.EOF at the end of the rows, a file
// error naming the line for broken CSV, the reader's own error otherwise.
func csvError(err error, started bool) error {
	var pe *csv.ParseError
	switch {
	case errors.Is(err, io.EOF) && !started:
		return fileError("The file is empty: a CSV file starts with a header row naming an email column (line 1).")
	case errors.As(err, &pe) && (errors.Is(pe.Err, csv.ErrQuote) || errors.Is(pe.Err, csv.ErrBareQuote) || errors.Is(pe.Err, csv.ErrFieldCount)):
		return fileError("The CSV file is malformed at line %d, column %d: %v.", pe.Line, pe.Column, pe.Err)
	}
	return err
}

func ndjsonRows(r io.Reader) func() (map[string]any, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxNDJSONLine)
	line := 0
	return func() (map[string]any, error) {
		for sc.Scan() {
			line++
			b := bytes.TrimSpace(sc.Bytes())
			switch {
			case len(b) == 0:
				continue // blank lines are not rows
			case !utf8.Valid(b):
				return nil, fileError("The file is not valid UTF-8: line %d.", line)
			case b[0] != '{' || !json.Valid(b):
				return nil, fileError("Line %d is not a JSON object.", line)
			}
			var obj map[string]any
			dec := json.NewDecoder(bytes.NewReader(b))
			dec.UseNumber()
			if err := dec.Decode(&obj); err != nil {
				return nil, fileError("Line %d is not a JSON object.", line)
			}
			return obj, nil
		}
		switch err := sc.Err(); {
		case err == nil:
			return nil, io.EOF
		case errors.Is(err, bufio.ErrTooLong):
			return nil, fileError("Line %d is longer than %s.", line+1, byteSize(maxNDJSONLine))
		default:
			return nil, err
		}
	}
}
