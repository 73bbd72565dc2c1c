package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/importer"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
	"github.com/subscriberd/subscriberd/telemetry"
)

// startImportWorker runs the import workers (IMPORT_WORKERS) until ctx ends; the returned
// channel closes once the batches in hand are committed and their imports given back.
func startImportWorker(ctx context.Context, db *repo.DB, workers int, metrics *telemetry.Metrics, log *slog.Logger) <-chan struct{} {
	if workers == 0 {
		return noWorkers(log, "IMPORT_WORKERS=0: this instance processes no imports; another instance on the database must")
	}
	w := importer.NewWorker(repo.NewImports(db), importer.Config{Workers: workers, Recorder: metrics, Logger: log})
	return runWorker(ctx, w.Run)
}

// importPoll is how often the import command reads its import's progress.
var importPoll = 250 * time.Millisecond

// importCmd is "subscriberd import --newsletter ID FILE": it stores the file as an import of
// the newsletter (docs/api-contract.md §15), processes it with its own workers beside any serve
// on the database, and shows the progress until it finishes: a bar on a terminal, a line a
// second otherwise. Then it prints the counts and where the row errors are, and, last, the
// import as one JSON object.
func importCmd(ctx context.Context, prog string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs, loader := cliFlags("import", stderr, getenv)
	nl := fs.String("newsletter", "", "newsletter id")
	status := fs.String("status", "active", "status of rows that give none: active or pending")
	format := fs.String("format", "", "csv or ndjson; by default from the file's extension (.ndjson, .jsonl: ndjson; else csv)")
	workers := fs.Int("workers", 1, "workers this command runs to process the import; 0 leaves it to serve")
	pos, err := parseArgs(fs, args, 1)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errors.New("import: want the file to import: import --newsletter ID FILE")
	}
	id, err := uuid.Parse(*nl)
	if err != nil {
		return fmt.Errorf("import: --newsletter must be a newsletter id (%s newsletter list shows them)", prog)
	}
	st, ok := model.ParseStatus(*status)
	if !ok || (st != model.StatusActive && st != model.StatusPending) {
		return errors.New("import: --status must be active or pending")
	}
	switch *format {
	case "":
		*format = model.ImportCSV
		if ext := strings.ToLower(filepath.Ext(pos[0])); ext == ".ndjson" || ext == ".jsonl" {
			*format = model.ImportNDJSON
		}
	case model.ImportCSV, model.ImportNDJSON:
	default:
		return errors.New("import: --format must be csv or ndjson")
	}
	f, err := os.Open(pos[0])
	if err != nil {
		return fmt.Errorf("import: %w", err)
	}
	defer f.Close()
	return withDB(ctx, prog, loader, stderr, func(db *repo.DB, log *slog.Logger) error {
		if _, err := repo.NewAccounts(db).Newsletter(ctx, id); err != nil {
			if errors.Is(err, model.ErrNewsletterNotFound) {
				return fmt.Errorf("import: no newsletter %s (%s newsletter list shows them)", id, prog)
			}
			return err
		}
		store := repo.NewImports(db)
		imp, err := store.Stage(ctx, model.NewImport{NewsletterID: id, Format: *format, DefaultStatus: st},
			api.ImportRows(f, *format, model.DefaultImportMaxRows, 1<<62))
		var fileErr *model.ImportFileError
		var bigErr *model.ImportTooLargeError
		switch {
		case errors.As(err, &fileErr):
			return fmt.Errorf("import: %s", fileErr.Message)
		case errors.As(err, &bigErr):
			return fmt.Errorf("import: %s", bigErr.Message)
		case err != nil:
			return err
		}
		fmt.Fprintf(stdout, "import %s: %d rows stored\n", imp.ID, imp.Counts.Rows)
		if *workers > 0 {
			wctx, stop := context.WithCancel(ctx)
			done := runWorker(wctx, importer.NewWorker(store, importer.Config{Workers: *workers, Logger: log}).Run)
			defer func() { stop(); <-done }()
		}
		imp, err = followImport(ctx, store, imp, stdout)
		if err != nil {
			return err
		}
		c := imp.Counts
		fmt.Fprintf(stdout, "import %s %s: %d rows: %d created, %d existing, %d suppressed, %d invalid\n",
			imp.ID, imp.State, c.Rows, c.Created, c.Existing, c.Suppressed, c.Invalid)
		if c.Invalid > 0 {
			fmt.Fprintf(stdout, "row errors: GET %s/%s/errors\n", api.ImportPath, imp.ID)
		}
		return printJSON(stdout, api.ImportOf(imp))
	})
}

// followImport shows imp's progress on w until it finishes or ctx ends.
func followImport(ctx context.Context, store *repo.Imports, imp model.Import, w io.Writer) (model.Import, error) {
	var bar *progressbar.ProgressBar
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		bar = newProgressBar(w, imp.Counts.Rows, "importing", "rows")
	}
	var lastLine time.Time
	for {
		switch {
		case bar != nil:
			bar.Set64(imp.Counts.Processed) //nolint:errcheck // display only
		case time.Since(lastLine) >= time.Second || imp.State == model.ImportCompleted:
			lastLine = time.Now()
			fmt.Fprintf(w, "import %s: %s, %d of %d rows processed\n", imp.ID, imp.State, imp.Counts.Processed, imp.Counts.Rows)
		}
		if imp.State == model.ImportCompleted || imp.State == model.ImportCancelled {
			if bar != nil {
				bar.Finish()    //nolint:errcheck // display only
				fmt.Fprintln(w) // the bar's line ends
			}
			return imp, nil
		}
		select {
		case <-ctx.Done():
			return imp, fmt.Errorf("import: stopped following import %s (it goes on in serve): %w", imp.ID, ctx.Err())
		case <-time.After(importPoll):
		}
		next, err := store.Get(ctx, imp.NewsletterID, imp.ID)
		if err != nil {
			return imp, err
		}
		imp = next
	}
}

// withDB opens the existing database and runs fn. It never creates a database: a command run
// from another directory, or with a mistyped DATABASE_URL, would otherwise act on a new empty
// store. An existing database is migrated first, so a newcomer's first command works on a new
// server.
func withDB(ctx context.Context, prog string, loader *configLoader, stderr io.Writer, fn func(*repo.DB, *slog.Logger) error) error {
	cfg, err := loader.load(nil)
	if err != nil {
		return err
	}
	log, err := telemetry.NewLogger(stderr, cfg.LogLevel.String(), cfg.LogFormat)
	if err != nil {
		return err
	}
	exists, err := repo.DatabaseExists(ctx, cfg.DatabaseURL)
	if err != nil {
		return cfg.dbErr(err)
	}
	if !exists {
		return fmt.Errorf("no database at %s; set DATA_DIR or DATABASE_URL, or create it there with %s migrate", storeLocation(cfg.DatabaseURL), prog)
	}
	db, err := openDB(ctx, cfg, true, log)
	if err != nil {
		return err
	}
	defer db.Close()
	return fn(db, log)
}

// newProgressBar is the bar of the import and bulk-action commands on a terminal: desc, the
// count of total units and the rate.
func newProgressBar(w io.Writer, total int64, desc, units string) *progressbar.ProgressBar {
	return progressbar.NewOptions64(total, progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(desc), progressbar.OptionShowCount(), progressbar.OptionShowIts(),
		progressbar.OptionSetItsString(units), progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionFullWidth())
}
