package main

import (
	"context"
	"log/slog"

	"github.com/uptrace/bun"

	"github.com/subscriberd/subscriberd/importer"
	"github.com/subscriberd/subscriberd/repo"
	"github.com/subscriberd/subscriberd/telemetry"
)

// startImportWorker runs the import workers (IMPORT_WORKERS) until ctx ends; the returned
// channel closes once the batches in hand are committed and their imports given back.
func startImportWorker(ctx context.Context, db *bun.DB, workers int, metrics *telemetry.Metrics, log *slog.Logger) <-chan struct{} {
	if workers == 0 {
		log.Info("IMPORT_WORKERS=0: this instance processes no imports; another instance on the database must")
		done := make(chan struct{})
		close(done)
		return done
	}
	w := importer.NewWorker(repo.NewImports(db), importer.Config{Workers: workers, Recorder: metrics, Logger: log})
	return runWorker(ctx, w.Run)
}
