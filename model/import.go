package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"time"

	"github.com/google/uuid"
)

// Import states (docs/api-contract.md §15). ImportUploading is an upload still arriving; no
// answer of the API ever shows it.
const (
	ImportUploading = "uploading"
	ImportQueued    = "queued"
	ImportRunning   = "running"
	ImportCompleted = "completed"
	ImportCancelled = "cancelled"
)

// Import file formats.
const (
	ImportCSV    = "csv"
	ImportNDJSON = "ndjson"
)

// Import limits by default (docs/api-contract.md §17).
const (
	DefaultImportMaxRows  = 1_000_000
	DefaultImportMaxBytes = 256 << 20
)

// Row outcomes of an import: what became of each row (docs/api-contract.md §15).
const (
	RowCreated    = "created"
	RowExisting   = "existing"
	RowSuppressed = "suppressed"
	RowInvalid    = "invalid"
)

// ImportCounts are an import's row counts. Processed is Created + Existing + Suppressed +
// Invalid, the rows handled by committed batches.
type ImportCounts struct {
	Rows, Processed, Created, Existing, Suppressed, Invalid int64
}

// Add adds o's outcome counts (not Rows) to c.
func (c *ImportCounts) Add(o ImportCounts) {
	c.Processed += o.Processed
	c.Created += o.Created
	c.Existing += o.Existing
	c.Suppressed += o.Suppressed
	c.Invalid += o.Invalid
}

// Import is one import of a file of subscribers into a newsletter.
type Import struct {
	ID            uuid.UUID
	NewsletterID  uuid.UUID
	State         string
	Format        string
	DefaultStatus Status
	Counts        ImportCounts
	CreatedAt     time.Time
	StartedAt     *time.Time
	FinishedAt    *time.Time
}

// NewImport is what an upload says about the import it makes: the newsletter, the format, the
// status of rows that give none, the key's display prefix (the source of the events of the
// subscribers it creates) and the upload's W3C traceparent (to which its batches link).
type NewImport struct {
	NewsletterID  uuid.UUID
	Format        string
	DefaultStatus Status
	KeyPrefix     string
	Traceparent   string
}

// ImportJob is an import claimed by a worker: the import, the token of the claim (checked
// by every batch, so that a worker whose lease ran out commits nothing more) and the
// upload's traceparent and key prefix.
type ImportJob struct {
	Import
	Claim       uuid.UUID
	KeyPrefix   string
	Traceparent string
}

// ImportRowError is an invalid row of an import: its 1-based data row and its field messages.
type ImportRowError struct {
	Row    int64
	Errors map[string][]string
}

// Import errors.
var (
	ErrImportNotFound = errors.New("import not found")
	// ErrImportFinished is a cancel of an import that has completed or was cancelled.
	ErrImportFinished = errors.New("import already finished")
	// ErrImportLost is a batch of a worker that no longer holds the import: its lease ran
	// out and another worker took it over, or it was cancelled.
	ErrImportLost = errors.New("import no longer held by this worker")
)

// ImportTooLargeError is an upload over a limit of docs/api-contract.md §17.
type ImportTooLargeError struct{ Message string }

func (e *ImportTooLargeError) Error() string { return e.Message }

// ImportFileError is an upload that is not a well-formed file: no email column, not UTF-8,
// broken quoting. Message names the line.
type ImportFileError struct{ Message string }

func (e *ImportFileError) Error() string { return e.Message }

// ParseImportRow validates one row of an import staged as JSON text (a JSON object: a CSV
// row's columns by name or an NDJSON line), as ParseImportObject does.
func ParseImportRow(data []byte, def Status) (NewSubscriber, *ValidationError) {
	var obj map[string]any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&obj); err != nil || obj == nil {
		// Checked at upload; a row that got here unreadable is reported, not fatal.
		return NewSubscriber{}, (*ValidationError)(nil).Add(attrBody, "The row must be a JSON object.")
	}
	return ParseImportObject(obj, def)
}

// ParseImportObject validates one row of an import (a CSV row's columns by name, or an NDJSON
// line's object, its numbers as json.Number) by the rules of a create (docs/api-contract.md
// §3); a row without a status takes def. It may change obj.
func ParseImportObject(obj map[string]any, def Status) (NewSubscriber, *ValidationError) {
	if _, ok := obj[attrStatus]; !ok {
		obj[attrStatus] = string(def)
	}
	return ParseCreate(obj)
}
