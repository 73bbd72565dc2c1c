package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
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

// startBulkActionWorker runs the bulk action workers (BULK_ACTION_WORKERS) until ctx ends;
// the returned channel closes once the batches in hand are committed and their actions given
// back.
func startBulkActionWorker(ctx context.Context, db *repo.DB, workers int, metrics *telemetry.Metrics, log *slog.Logger) <-chan struct{} {
	if workers == 0 {
		return noWorkers(log, "BULK_ACTION_WORKERS=0: this instance processes no bulk actions; another instance on the database must")
	}
	w := importer.NewBulkWorker(repo.NewBulkActions(db), importer.BulkConfig{Workers: workers, Recorder: metrics, Logger: log})
	return runWorker(ctx, w.Run)
}

// bulkActionCmd is "subscriberd bulk-action --newsletter ID --action ACTION (--filter JSON |
// --segment ID)": it starts a bulk action of the newsletter (docs/api-contract.md §20.2),
// processes it with its own workers beside any serve on the database, and shows its progress
// until it finishes, as import does; last it prints the action as one JSON object.
func bulkActionCmd(ctx context.Context, prog string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs, loader := cliFlags("bulk-action", stderr, getenv)
	nl := fs.String("newsletter", "", "newsletter id")
	action := fs.String("action", "", "add_tags, remove_tags, set_attributes or unsubscribe")
	tags := fs.String("tags", "", "the tags of add_tags and remove_tags, separated by commas")
	attrs := fs.String("attributes", "", "the merge patch of set_attributes, a JSON object")
	filter := fs.String("filter", "", "the subscribers to act on: a filter object in JSON ('{}' selects everyone)")
	segment := fs.String("segment", "", "the subscribers to act on: a segment's id")
	workers := fs.Int("workers", 1, "workers this command runs to process the action; 0 leaves it to serve")
	if _, err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	id, err := uuid.Parse(*nl)
	if err != nil {
		return fmt.Errorf("bulk-action: --newsletter must be a newsletter id (%s newsletter list shows them)", prog)
	}
	body := map[string]any{"action": *action}
	if *tags != "" {
		var list []any
		for t := range strings.SplitSeq(*tags, ",") {
			list = append(list, t)
		}
		body["tags"] = list
	}
	for flag, v := range map[string]string{"attributes": *attrs, "filter": *filter} {
		if v == "" {
			continue
		}
		var obj any
		dec := json.NewDecoder(strings.NewReader(v))
		dec.UseNumber()
		if err := dec.Decode(&obj); err != nil {
			return fmt.Errorf("bulk-action: --%s must be a JSON object: %w", flag, err)
		}
		body[flag] = obj
	}
	if *segment != "" {
		body["segment"] = *segment
	}
	req, verr := model.ParseBulkRequest(body)
	if verr != nil {
		var msgs []string
		for _, k := range slices.Sorted(maps.Keys(verr.Fields)) {
			msgs = append(msgs, verr.Fields[k]...)
		}
		return fmt.Errorf("bulk-action: %s", strings.Join(msgs, " "))
	}
	return withDB(ctx, prog, loader, stderr, func(db *repo.DB, log *slog.Logger) error {
		if _, err := repo.NewAccounts(db).Newsletter(ctx, id); err != nil {
			if errors.Is(err, model.ErrNewsletterNotFound) {
				return fmt.Errorf("bulk-action: no newsletter %s (%s newsletter list shows them)", id, prog)
			}
			return err
		}
		if req.Target.Segment != nil {
			f, err := repo.NewSegments(db).Filter(ctx, id, *req.Target.Segment)
			if errors.Is(err, model.ErrSegmentNotFound) {
				return fmt.Errorf("bulk-action: %s", model.MsgSegmentInvalid)
			}
			if err != nil {
				return err
			}
			req.Target.Filter = &f
		}
		store := repo.NewBulkActions(db)
		a, err := store.Create(ctx, model.NewBulkAction{BulkRequest: req, NewsletterID: id})
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "bulk action %s: %s queued\n", a.ID, a.Action)
		if *workers > 0 {
			wctx, stop := context.WithCancel(ctx)
			done := runWorker(wctx, importer.NewBulkWorker(store, importer.BulkConfig{Workers: *workers, Logger: log}).Run)
			defer func() { stop(); <-done }()
		}
		a, err = followBulkAction(ctx, store, a, stdout)
		if err != nil {
			return err
		}
		c := a.Counts
		fmt.Fprintf(stdout, "bulk action %s %s: %d matched: %d changed, %d unchanged\n", a.ID, a.State, c.Matched, c.Changed, c.Unchanged)
		return printJSON(stdout, api.BulkActionOf(a))
	})
}

// followBulkAction shows a's progress on w until it finishes or ctx ends: import's bar on a
// terminal (newProgressBar), a line a second otherwise.
func followBulkAction(ctx context.Context, store *repo.BulkActions, a model.BulkAction, w io.Writer) (model.BulkAction, error) {
	var bar *progressbar.ProgressBar
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		bar = newProgressBar(w, max(a.Counts.Matched, 1), "acting on", "subscribers")
	}
	var lastLine time.Time
	for {
		finished := a.State == model.BulkCompleted || a.State == model.BulkCancelled
		switch {
		case bar != nil:
			bar.ChangeMax64(max(a.Counts.Matched, 1))
			bar.Set64(a.Counts.Processed) //nolint:errcheck // display only
		case time.Since(lastLine) >= time.Second || finished:
			lastLine = time.Now()
			fmt.Fprintf(w, "bulk action %s: %s, %d of %d subscribers processed\n", a.ID, a.State, a.Counts.Processed, a.Counts.Matched)
		}
		if finished {
			if bar != nil {
				bar.Finish()    //nolint:errcheck // display only
				fmt.Fprintln(w) // the bar's line ends
			}
			return a, nil
		}
		select {
		case <-ctx.Done():
			return a, fmt.Errorf("bulk-action: stopped following bulk action %s (it goes on in serve): %w", a.ID, ctx.Err())
		case <-time.After(importPoll):
		}
		next, err := store.Get(ctx, a.NewsletterID, a.ID)
		if err != nil {
			return a, err
		}
		a = next
	}
}
