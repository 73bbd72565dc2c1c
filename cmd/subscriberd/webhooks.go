package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/subscriberd/subscriberd/repo"
	"github.com/subscriberd/subscriberd/telemetry"
	"github.com/subscriberd/subscriberd/webhook"
)

// webhookSettings is the webhook delivery configuration (docs/api-contract.md §11).
type webhookSettings struct {
	timeout time.Duration
	guard   webhook.Guard
	workers int // 0: this instance delivers none
}

// webhooksFrom is the webhook delivery configuration of cfg (WEBHOOK_TIMEOUT,
// WEBHOOK_ALLOW_PRIVATE, WEBHOOK_WORKERS), validated when cfg was loaded.
func webhooksFrom(cfg *Config) webhookSettings {
	return webhookSettings{timeout: cfg.WebhookTimeout, guard: webhook.Guard{AllowPrivate: cfg.WebhookAllowPrivate},
		workers: cfg.WebhookWorkers}
}

// startWebhookWorker runs the webhook workers until ctx ends; the returned channel closes once
// the attempts in hand are finished. With no workers the instance still exports the queue's
// gauges, so that every instance shows deliveries left waiting.
func startWebhookWorker(ctx context.Context, db *repo.DB, s webhookSettings, metrics *telemetry.Metrics, log *slog.Logger) <-chan struct{} {
	if s.guard.AllowPrivate {
		log.Warn("WEBHOOK_ALLOW_PRIVATE is set: webhooks may be delivered to loopback and private addresses")
	}
	queue := repo.NewDeliveries(db)
	if err := metrics.RegisterWebhookGauges(laneGauges(queue.Stats)); err != nil {
		log.Error("webhook gauges not exported", "error", err)
	}
	if err := metrics.RegisterWebhookHeldGauge(queue.HeldPastHeartbeat); err != nil {
		log.Error("webhook gauges not exported", "error", err)
	}
	if s.workers == 0 {
		return noWorkers(log, "WEBHOOK_WORKERS=0: this instance delivers no webhooks; another instance on the database must")
	}
	w := webhook.NewWorker(queue, webhook.Config{
		Workers:  s.workers,
		Timeout:  s.timeout,
		Guard:    s.guard,
		Wake:     queue.Listen(ctx),
		Recorder: metrics,
		Logger:   log,
	})
	return runWorker(ctx, w.Run)
}
