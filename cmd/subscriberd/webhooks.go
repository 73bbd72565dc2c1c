package main

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/uptrace/bun"

	"github.com/subscriberd/subscriberd/repo"
	"github.com/subscriberd/subscriberd/telemetry"
	"github.com/subscriberd/subscriberd/webhook"
)

// webhookSettings is the webhook delivery configuration (docs/api-contract.md §11).
type webhookSettings struct {
	timeout time.Duration
	guard   webhook.Guard
}

// parseWebhooks checks WEBHOOK_TIMEOUT and WEBHOOK_ALLOW_PRIVATE; each error names its variable.
func parseWebhooks(cfg config) (webhookSettings, error) {
	d, err := time.ParseDuration(cfg["WEBHOOK_TIMEOUT"])
	if err != nil || d <= 0 || d > 5*time.Minute {
		return webhookSettings{}, fmt.Errorf("WEBHOOK_TIMEOUT: %q is not a duration between 0 and 5m (e.g. 10s)", cfg["WEBHOOK_TIMEOUT"])
	}
	allow, err := strconv.ParseBool(cfg["WEBHOOK_ALLOW_PRIVATE"])
	if err != nil {
		return webhookSettings{}, fmt.Errorf("WEBHOOK_ALLOW_PRIVATE: %q is not true or false", cfg["WEBHOOK_ALLOW_PRIVATE"])
	}
	return webhookSettings{timeout: d, guard: webhook.Guard{AllowPrivate: allow}}, nil
}

// startWebhookWorker runs the webhook workers until ctx ends; the returned channel closes once
// the attempts in hand are finished.
func startWebhookWorker(ctx context.Context, db *bun.DB, s webhookSettings, metrics *telemetry.Metrics, log *slog.Logger) <-chan struct{} {
	if s.guard.AllowPrivate {
		log.Warn("WEBHOOK_ALLOW_PRIVATE is set: webhooks may be delivered to loopback and private addresses")
	}
	queue := repo.NewDeliveries(db)
	if err := metrics.RegisterWebhookGauges(queue.Stats); err != nil {
		log.Error("webhook gauges not exported", "error", err)
	}
	w := webhook.NewWorker(queue, webhook.Config{
		Timeout:  s.timeout,
		Guard:    s.guard,
		Wake:     queue.Listen(ctx, log),
		Recorder: metrics,
		Logger:   log,
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx) //nolint:errcheck // Run only returns nil, when ctx ends
	}()
	return done
}
