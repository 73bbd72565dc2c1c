package api

import (
	"context"
	"io"
	"mime"
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/adapters/humago"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/propagation"

	"github.com/subscriberd/subscriberd/api/cursor"
	"github.com/subscriberd/subscriberd/model"
)

// ImportStore stores imports (docs/api-contract.md §15).
type ImportStore interface {
	// Stage validates and stores a new import with the rows next yields (io.EOF ends them)
	// before it returns; when next fails nothing remains and its error is returned.
	Stage(ctx context.Context, in model.NewImport, next func() (map[string]any, error)) (model.Import, error)
	// Get, Errors and Cancel answer model.ErrImportNotFound for an unknown id.
	Get(ctx context.Context, newsletterID, id uuid.UUID) (model.Import, error)
	// List returns up to limit+1 imports, newest first, after the position after.
	List(ctx context.Context, newsletterID uuid.UUID, limit int, after *model.Position) ([]model.Import, error)
	// Errors returns up to limit+1 row errors after the data row afterRow.
	Errors(ctx context.Context, newsletterID, id uuid.UUID, limit int, afterRow int64) ([]model.ImportRowError, error)
	// Cancel answers model.ErrImportFinished for an import that has finished.
	Cancel(ctx context.Context, newsletterID, id uuid.UUID) (model.Import, error)
}

// Messages of docs/api-contract.md §15.
const (
	MsgImportNotFound = "Import not found."
	MsgImportFinished = "This import has already finished."
	MsgImportMedia    = "The request body must be sent as text/csv or application/x-ndjson."
	MsgImportStatus   = "The status parameter must be active or pending."
	// CodeImportFinished is the code of a cancel of a finished import.
	CodeImportFinished = "import_finished"
)

// ImportCounts are an import's row counts.
type ImportCounts struct {
	Rows       int64 `json:"rows" minimum:"0" doc:"Data rows in the file."`
	Processed  int64 `json:"processed" minimum:"0" doc:"Rows handled so far: created + existing + suppressed + invalid."`
	Created    int64 `json:"created" minimum:"0" doc:"Rows that created a subscriber."`
	Existing   int64 `json:"existing" minimum:"0" doc:"Rows whose address the newsletter had, or an earlier row had; nothing about that subscriber changed."`
	Suppressed int64 `json:"suppressed" minimum:"0" doc:"Rows whose address is suppressed."`
	Invalid    int64 `json:"invalid" minimum:"0" doc:"Rows that broke the rules of a create; see the import's errors."`
}

// Import is the public shape of an import.
type Import struct {
	ID            string       `json:"id" format:"uuid" doc:"Identifier of the import (UUIDv7)."`
	State         string       `json:"state" enum:"queued,running,completed,cancelled"`
	Format        string       `json:"format" enum:"csv,ndjson"`
	DefaultStatus string       `json:"default_status" enum:"active,pending" doc:"The status of rows that give none."`
	Counts        ImportCounts `json:"counts"`
	CreatedAt     string       `json:"created_at" format:"date-time" example:"2026-06-11T17:00:00+00:00"`
	StartedAt     *string      `json:"started_at" format:"date-time" nullable:"true" doc:"When a worker first took it up; null while queued."`
	FinishedAt    *string      `json:"finished_at" format:"date-time" nullable:"true" doc:"When it completed or was cancelled; null before."`
}

func timePtr(t *time.Time) *string {
	if t == nil {
		return nil
	}
	s := model.FormatTime(*t)
	return &s
}

// ImportOf is the public shape of m, as GET /imports/{id} shows it.
func ImportOf(m model.Import) Import {
	c := m.Counts
	return Import{ID: m.ID.String(), State: m.State, Format: m.Format, DefaultStatus: string(m.DefaultStatus),
		Counts: ImportCounts{Rows: c.Rows, Processed: c.Processed, Created: c.Created, Existing: c.Existing,
			Suppressed: c.Suppressed, Invalid: c.Invalid},
		CreatedAt: model.FormatTime(m.CreatedAt), StartedAt: timePtr(m.StartedAt), FinishedAt: timePtr(m.FinishedAt)}
}

// ImportEnvelope is the success body carrying one import.
type ImportEnvelope struct {
	Success bool   `json:"success" doc:"Always true."`
	Data    Import `json:"data"`
}

// ImportsEnvelope is the success body of a list of imports.
type ImportsEnvelope struct {
	Success    bool            `json:"success" doc:"Always true."`
	Data       []Import        `json:"data"`
	Pagination EventPagination `json:"pagination"`
}

// ImportRowError is one invalid row of an import.
type ImportRowError struct {
	Row    int64       `json:"row" minimum:"1" doc:"The 1-based data row (the CSV header is not counted; nor are blank NDJSON lines)."`
	Errors FieldErrors `json:"errors"`
}

// ImportErrorsEnvelope is the success body of an import's row errors.
type ImportErrorsEnvelope struct {
	Success    bool             `json:"success" doc:"Always true."`
	Data       []ImportRowError `json:"data"`
	Pagination EventPagination  `json:"pagination"`
}

type importStatusParam string

func (importStatusParam) Schema(huma.Registry) *huma.Schema {
	return &huma.Schema{Type: huma.TypeString, Enum: []any{"active", "pending"}, Default: "active"}
}

type (
	createImportInput struct {
		Status importStatusParam `query:"status" doc:"The status of rows that give none: active (default) or pending."`
		body   io.Reader
		length int64
		ctype  string
	}
	importIDInput struct {
		ID string `path:"id" format:"uuid" doc:"The import's id."`
	}
	listImportsInput struct {
		Limit  limitParam `query:"limit" doc:"Imports per page, 1 to 100."`
		Cursor string     `query:"cursor" doc:"The next_cursor of the previous page."`
	}
	importErrorsInput struct {
		ID     string     `path:"id" format:"uuid" doc:"The import's id."`
		Limit  limitParam `query:"limit" doc:"Row errors per page, 1 to 100."`
		Cursor string     `query:"cursor" doc:"The next_cursor of the previous page."`
	}
	importCreatedOutput struct {
		Location string `header:"Location" doc:"Path of the new import."`
		Body     ImportEnvelope
	}
	importOutput struct {
		Body ImportEnvelope
	}
	importsOutput struct {
		Body ImportsEnvelope
	}
	importErrorsOutput struct {
		Body ImportErrorsEnvelope
	}
)

// Resolve implements huma.Resolver: the file is read as it arrives, by the handler, never
// whole into memory.
func (in *createImportInput) Resolve(ctx huma.Context) []error {
	in.body = ctx.BodyReader()
	in.ctype = ctx.Header("Content-Type")
	r, w := humago.Unwrap(ctx)
	in.length = r.ContentLength
	// A file of up to IMPORT_MAX_BYTES takes longer to arrive than the server's read timeout
	// allows other bodies; where the connection lets us, the upload gets ImportReadTimeout.
	http.NewResponseController(w).SetReadDeadline(time.Now().Add(ImportReadTimeout)) //nolint:errcheck // the server's timeout stays
	return nil
}

// ImportReadTimeout is how long the body of POST /imports may take to arrive: 256 MiB at
// about 4 Mbit/s.
const ImportReadTimeout = 10 * time.Minute

// ImportPath is the path of POST /imports, whose body the 1 MiB limit does not bound.
const ImportPath = BasePath + "/imports"

// registerImports adds the five operations of docs/api-contract.md §15.
func (s *Server) registerImports(common []int) {
	item := ImportPath + "/{id}"
	op := func(method, path, id, summary, desc string, status int, errs []int) huma.Operation {
		o := s.operation(method, path, id, summary, desc, status, "", errs)
		o.Tags = []string{"Imports"}
		return o
	}
	create := op(http.MethodPost, ImportPath, "create-import", "Import subscribers",
		"Uploads a file of up to 1,000,000 subscribers (IMPORT_MAX_ROWS) and 256 MiB (IMPORT_MAX_BYTES): CSV (RFC 4180, "+
			"UTF-8, a header row naming `email` and optionally `name` and `status`) or NDJSON (one subscriber input object per line). "+
			"The rows are stored before the answer and processed in the background: an address the newsletter has is counted "+
			"`existing` and never changed. Follow the import at `Location`.",
		http.StatusAccepted, append([]int{http.StatusBadRequest, http.StatusRequestEntityTooLarge,
			http.StatusUnsupportedMediaType}, common...))
	create.RequestBody = &huma.RequestBody{Required: true, Content: map[string]*huma.MediaType{
		"text/csv":             {Schema: &huma.Schema{Type: huma.TypeString, Examples: []any{"email,name,status\njohn@example.com,John Doe,active\n"}}},
		"application/x-ndjson": {Schema: &huma.Schema{Type: huma.TypeString, Examples: []any{`{"email":"john@example.com","name":"John Doe"}` + "\n"}}},
	}}
	// Huma documents 422 for an operation with parameters; rows are checked later, so an
	// upload never gets one: none is declared, and documentErrors drops Huma's.
	huma.Register(s.api, create, handle(s, s.createImport))
	huma.Register(s.api, op(http.MethodGet, ImportPath, "list-imports", "List imports",
		"Newest first. Page with `next_cursor`.", http.StatusOK, append([]int{http.StatusBadRequest}, common...)), handle(s, s.listImports))
	huma.Register(s.api, op(http.MethodGet, item, "get-import", "Get an import",
		"Its state and counts, updated as its batches commit.", http.StatusOK,
		append([]int{http.StatusBadRequest, http.StatusNotFound}, common...)), handle(s, s.getImport))
	huma.Register(s.api, op(http.MethodGet, item+"/errors", "list-import-errors", "List an import's row errors",
		"The invalid rows in row order, each with its field messages. Page with `next_cursor`.", http.StatusOK,
		append([]int{http.StatusBadRequest, http.StatusNotFound}, common...)), handle(s, s.importErrors))
	huma.Register(s.api, answers(op(http.MethodDelete, item, "cancel-import", "Cancel an import",
		"Cancels a queued or running import; the subscribers it created stay. A finished one gives 409 `import_finished`.",
		http.StatusOK, append([]int{http.StatusBadRequest, http.StatusNotFound}, common...)),
		http.StatusConflict, CodeImportFinished), handle(s, s.cancelImport))
}

func (s *Server) createImport(ctx context.Context, p model.Principal, _ Stores, in *createImportInput) (*importCreatedOutput, error) {
	format := ""
	if mt, _, err := mime.ParseMediaType(in.ctype); err == nil {
		switch mt {
		case "text/csv":
			format = model.ImportCSV
		case "application/x-ndjson", "application/ndjson":
			format = model.ImportNDJSON
		}
	}
	if format == "" {
		return nil, newError(http.StatusUnsupportedMediaType, MsgImportMedia)
	}
	def := model.StatusActive
	switch in.Status {
	case "", "active":
	case "pending":
		def = model.StatusPending
	default:
		return nil, newError(http.StatusBadRequest, MsgImportStatus)
	}
	maxRows, maxBytes := s.importMaxRows(), s.importMaxBytes()
	if in.length > maxBytes {
		return nil, tooLargeBytes(maxBytes)
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	imp, err := s.cfg.Imports.Stage(ctx, model.NewImport{NewsletterID: p.NewsletterID, Format: format,
		DefaultStatus: def, KeyPrefix: p.KeyPrefix, Traceparent: carrier.Get("traceparent")},
		ImportRows(in.body, format, maxRows, maxBytes))
	if err != nil {
		return nil, err
	}
	return &importCreatedOutput{Location: ImportPath + "/" + imp.ID.String(),
		Body: ImportEnvelope{Success: true, Data: ImportOf(imp)}}, nil
}

func (s *Server) importMaxRows() int64 {
	if s.cfg.ImportMaxRows > 0 {
		return s.cfg.ImportMaxRows
	}
	return model.DefaultImportMaxRows
}

func (s *Server) importMaxBytes() int64 {
	if s.cfg.ImportMaxBytes > 0 {
		return s.cfg.ImportMaxBytes
	}
	return model.DefaultImportMaxBytes
}

// parseImportID is parseID for imports: anything but a canonical UUID is not found.
func parseImportID(s string) (uuid.UUID, error) {
	id, err := parseID(s)
	if err != nil {
		return uuid.Nil, model.ErrImportNotFound
	}
	return id, nil
}

func (s *Server) getImport(ctx context.Context, p model.Principal, _ Stores, in *importIDInput) (*importOutput, error) {
	id, err := parseImportID(in.ID)
	if err != nil {
		return nil, err
	}
	imp, err := s.cfg.Imports.Get(ctx, p.NewsletterID, id)
	if err != nil {
		return nil, err
	}
	return &importOutput{Body: ImportEnvelope{Success: true, Data: ImportOf(imp)}}, nil
}

func (s *Server) cancelImport(ctx context.Context, p model.Principal, _ Stores, in *importIDInput) (*importOutput, error) {
	id, err := parseImportID(in.ID)
	if err != nil {
		return nil, err
	}
	imp, err := s.cfg.Imports.Cancel(ctx, p.NewsletterID, id)
	if err != nil {
		return nil, err
	}
	return &importOutput{Body: ImportEnvelope{Success: true, Data: ImportOf(imp)}}, nil
}

func (s *Server) listImports(ctx context.Context, p model.Principal, _ Stores, in *listImportsInput) (*importsOutput, error) {
	data, page, err := newestFirst(s, "imports", p, string(in.Limit), in.Cursor,
		func(limit int, after *model.Position) ([]model.Import, error) {
			return s.cfg.Imports.List(ctx, p.NewsletterID, limit, after)
		}, func(imp model.Import) model.Position { return model.Position{CreatedAt: imp.CreatedAt, ID: imp.ID} }, ImportOf)
	if err != nil {
		return nil, err
	}
	return &importsOutput{Body: ImportsEnvelope{Success: true, Data: data, Pagination: page}}, nil
}

func (s *Server) importErrors(ctx context.Context, p model.Principal, _ Stores, in *importErrorsInput) (*importErrorsOutput, error) {
	id, err := parseImportID(in.ID)
	if err != nil {
		return nil, err
	}
	q, err := model.ParseListQuery("", string(in.Limit), "")
	if err != nil {
		return nil, err
	}
	binding := cursor.Binding("import-errors", p.NewsletterID.String(), id.String())
	var afterRow int64
	if in.Cursor != "" {
		pos, err := s.cursors.Decode(binding, in.Cursor)
		if err != nil {
			return nil, newError(http.StatusBadRequest, MsgCursorInvalid)
		}
		afterRow = pos.Time.Unix() // a row number, carried in the position's time
	}
	rows, err := s.cfg.Imports.Errors(ctx, p.NewsletterID, id, q.Limit, afterRow)
	if err != nil {
		return nil, err
	}
	out := &importErrorsOutput{Body: ImportErrorsEnvelope{Success: true, Pagination: EventPagination{Limit: q.Limit}}}
	if len(rows) > q.Limit {
		rows = rows[:q.Limit]
		c := s.cursors.Encode(binding, cursor.Position{Time: time.Unix(rows[len(rows)-1].Row, 0).UTC()})
		out.Body.Pagination.NextCursor = &c
	}
	out.Body.Data = make([]ImportRowError, len(rows))
	for i, r := range rows {
		out.Body.Data[i] = ImportRowError{Row: r.Row, Errors: r.Errors}
	}
	return out, nil
}
