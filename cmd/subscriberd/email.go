package main

import (
	"context"
	"io"
	"log/slog"
	"sync"

	"github.com/subscriberd/subscriberd/mail"
	"github.com/subscriberd/subscriberd/outbox"
	"github.com/subscriberd/subscriberd/repo"
	"github.com/subscriberd/subscriberd/telemetry"
)

// mailer is the configured email delivery: sender, link base and transport.
type mailer struct {
	composer  *mail.Composer
	transport mail.Transport
	smtp      string // the server, password masked; "" when emails are only logged
}

// newMailer checks MAIL_FROM, PUBLIC_BASE_URL and SMTP_URL; each error names its variable.
// Without SMTP_URL emails are logged, and also written to out when it is not nil (dev).
func newMailer(cfg *Config, log *slog.Logger, out io.Writer) (*mailer, error) {
	composer, err := mail.NewComposer(cfg.MailFrom, cfg.PublicBaseURL)
	if err != nil {
		return nil, err
	}
	if cfg.SMTPURL == "" {
		return &mailer{composer: composer, transport: mail.LogTransport{Log: log, Out: out}}, nil
	}
	s, err := mail.NewSMTP(cfg.SMTPURL, 0)
	if err != nil {
		return nil, err
	}
	return &mailer{composer: composer, transport: s, smtp: s.String()}, nil
}

// startWorker runs workers email workers (EMAIL_WORKERS) until ctx ends; the returned channel
// closes once each has finished the email in hand. With no workers the instance still exports
// the outbox's gauges, so that every instance shows emails left waiting.
func startWorker(ctx context.Context, db *repo.DB, m *mailer, workers int, metrics *telemetry.Metrics, log *slog.Logger) <-chan struct{} {
	outbox := repo.NewOutbox(db)
	if err := metrics.RegisterOutboxGauges(laneGauges(outbox.Stats)); err != nil {
		log.Error("outbox gauges not exported", "error", err)
	}
	if err := metrics.RegisterOutboxHeldGauge(outbox.HeldPastHeartbeat); err != nil {
		log.Error("outbox gauges not exported", "error", err)
	}
	if workers == 0 {
		return noWorkers(log, "EMAIL_WORKERS=0: this instance sends no emails; another instance on the database must")
	}
	if m.smtp == "" {
		log.Warn("SMTP_URL is not set: confirmation emails are written to the log, with their links, instead of being sent")
	} else {
		log.Info("sending confirmation emails", "smtp", m.smtp, "workers", workers)
	}
	// Each worker claims its own batches (the outbox's rows are leased one claim at a time),
	// so that a slow SMTP server holds one of them, not all.
	dones := make([]<-chan struct{}, workers)
	for i := range dones {
		w := mail.NewWorker(outbox, m.transport, m.composer, mail.WorkerConfig{
			Wake:     outbox.Listen(ctx),
			Recorder: metrics,
			Logger:   log,
		})
		dones[i] = runWorker(ctx, w.Run)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, d := range dones {
			<-d
		}
	}()
	return done
}

// lockedWriter serializes writes to w: dev's stdout gets the banner and the emails' links from
// different goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// noWorkers logs why, when a worker setting is 0, this instance runs none of those workers,
// and returns a channel that is closed already: there is nothing to wait for at shutdown.
func noWorkers(log *slog.Logger, why string) <-chan struct{} {
	log.Info(why)
	done := make(chan struct{})
	close(done)
	return done
}

// runWorker runs a worker's Run until ctx ends; the returned channel closes when Run has
// returned (Run only returns nil, when ctx ends).
func runWorker(ctx context.Context, run func(context.Context) error) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx) //nolint:errcheck // nil, when ctx ends
	}()
	return done
}

// laneGauges adapts a queue's per-lane statistics (repo's Stats) to the gauges' callback.
func laneGauges(stats func(context.Context) ([]outbox.LaneStats, error)) telemetry.OutboxStats {
	return func(ctx context.Context) ([]telemetry.QueueLane, error) {
		lanes, err := stats(ctx)
		if err != nil {
			return nil, err
		}
		out := make([]telemetry.QueueLane, len(lanes))
		for i, l := range lanes {
			out[i] = telemetry.QueueLane{Lane: l.Lane.String(), Depth: l.Depth, OldestDueAge: l.OldestDue}
		}
		return out, nil
	}
}
