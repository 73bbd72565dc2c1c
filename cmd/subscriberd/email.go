package main

import (
	"context"
	"log/slog"

	"github.com/uptrace/bun"

	"github.com/subscriberd/subscriberd/mail"
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
func newMailer(cfg config, log *slog.Logger) (*mailer, error) {
	composer, err := mail.NewComposer(cfg["MAIL_FROM"], cfg["PUBLIC_BASE_URL"])
	if err != nil {
		return nil, err
	}
	if cfg["SMTP_URL"] == "" {
		return &mailer{composer: composer, transport: mail.LogTransport{Log: log}}, nil
	}
	s, err := mail.NewSMTP(cfg["SMTP_URL"], 0)
	if err != nil {
		return nil, err
	}
	return &mailer{composer: composer, transport: s, smtp: s.String()}, nil
}

// startWorker runs the email worker until ctx ends; the returned channel closes once it has
// finished the email in hand.
func startWorker(ctx context.Context, db *bun.DB, m *mailer, metrics *telemetry.Metrics, log *slog.Logger) <-chan struct{} {
	if m.smtp == "" {
		log.Warn("SMTP_URL is not set: confirmation emails are written to the log instead of being sent")
	} else {
		log.Info("sending confirmation emails", "smtp", m.smtp)
	}
	outbox := repo.NewOutbox(db)
	if err := metrics.RegisterOutboxGauges(outbox.Stats); err != nil {
		log.Error("outbox gauges not exported", "error", err)
	}
	w := mail.NewWorker(outbox, m.transport, m.composer, mail.WorkerConfig{
		Wake:     outbox.Listen(ctx, log),
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
