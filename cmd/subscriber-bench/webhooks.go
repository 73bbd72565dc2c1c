package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/subscriberd/subscriberd/cmd/subscriber-bench/svc"
)

// webhookScenarios are the writes measured again with one webhook endpoint subscribed to every
// event (docs/api-contract.md §10.4).
var webhookScenarios = []string{svc.Update, svc.CreateActive, svc.Bulk100}

// WebhookDelivery is the scenario of the delivery throughput: events the service's workers
// delivered per second to a local receiver that answers at once.
const WebhookDelivery = "webhook_delivery"

// Targets of issue 22: a write with one endpoint keeps webhookRatioTarget of its rate without
// one; the workers deliver deliveryTarget events a second to a receiver that answers at once.
const (
	webhookRatioTarget = 0.85
	deliveryTarget     = 1000
)

// hookMode is one of the three ways a webhook write runs in each pass.
type hookMode int

const (
	hookNone hookMode = iota
	hookQueued
	hookDelivered
)

// The suffix of each way's scenario name, and of the plain runs of runQueuedPair.
const (
	webhookOffSuffix    = "_webhook_off"
	webhookQueuedSuffix = "_webhook_queued"
	webhookSuffix       = "_webhook"
	webhookPlainSuffix  = "_webhook_plain"
)

// plainSeed is how many subscribers the newsletter without an endpoint is seeded with.
const plainSeed = 10000

func (m hookMode) suffix() string {
	return [...]string{webhookOffSuffix, webhookQueuedSuffix, webhookSuffix}[m]
}

// runWebhooks measures the write scenarios with one endpoint subscribed to every event against
// the same writes without one, and the delivery throughput. Each pass runs each scenario back
// to back: without the endpoint, with its deliveries only queued (see queueInstance), and with
// them delivered meanwhile; even passes the other way round, so that none always runs on the
// larger tables. Each run starts with nothing left to deliver. The service must allow a
// loopback URL (WEBHOOK_ALLOW_PRIVATE=true); otherwise nothing is measured.
func (b *bench) runWebhooks(ctx context.Context) error {
	rc, err := startReceiver(b.cfg.webhookReceiver)
	if err != nil {
		return err
	}
	defer rc.Close()
	// One endpoint created and deleted at once tells whether the service accepts the receiver.
	id, err := b.client.CreateWebhook(ctx, rc.url)
	if err == nil {
		err = b.client.DeleteWebhook(ctx, id)
	}
	if err != nil {
		fmt.Fprintf(b.log, "note: webhooks not measured (does the service run with WEBHOOK_ALLOW_PRIVATE=true?): %v\n", err)
		return nil
	}
	queue := b.queueInstance()
	plain, err := b.plainInstance(ctx, queue)
	if err != nil {
		return err
	}
	modes := []hookMode{hookNone, hookDelivered}
	if queue != nil {
		modes = []hookMode{hookNone, hookQueued, hookDelivered}
	}
	fmt.Fprintf(b.log, "== writes with and without one webhook endpoint (every event) delivering to %s\n", rc.url)
	for pass := 1; pass <= b.cfg.passes; pass++ {
		order := slices.Clone(modes)
		if pass%2 == 0 {
			slices.Reverse(order)
		}
		for _, name := range webhookScenarios {
			if b.cfg.only != nil && !b.cfg.only[name] {
				continue
			}
			runs := map[hookMode]RunRecord{}
			for _, mode := range order {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				r, err := b.runWebhookWrite(ctx, rc, queue, name, mode, pass)
				if err != nil {
					return err
				}
				runs[mode] = r
			}
			if plain != nil {
				queued, without, err := b.runQueuedPair(ctx, rc, queue, plain, name, pass)
				if err != nil {
					return err
				}
				if without.RowsPerSec > 0 {
					fmt.Fprintf(b.log, "         %s with the endpoint, deliveries queued, alternating with a newsletter without: %.2f × its rows/s (target ≥ %.2f)\n",
						name, queued.RowsPerSec/without.RowsPerSec, webhookRatioTarget)
				}
			}
			none := runs[hookNone].RowsPerSec
			if none <= 0 {
				continue
			}
			if r, ok := runs[hookQueued]; ok {
				fmt.Fprintf(b.log, "         %s with the endpoint, deliveries queued: %.2f × its rows/s without (target ≥ %.2f)\n",
					name, r.RowsPerSec/none, webhookRatioTarget)
			}
			fmt.Fprintf(b.log, "         %s with the endpoint, delivered meanwhile: %.2f × its rows/s without (target ≥ %.2f)\n",
				name, runs[hookDelivered].RowsPerSec/none, webhookRatioTarget)
		}
	}
	return nil
}

// queueInstance is the -webhook-queue-url instance (WEBHOOK_WORKERS=0), or nil when there is
// none or it cannot be used.
func (b *bench) queueInstance() *instance {
	c := b.cfg
	switch {
	case c.webhookQueueURL == "":
		return nil
	case c.pid <= 0 || b.db == nil:
		fmt.Fprintln(b.log, "note: writes with their deliveries only queued not measured: -webhook-queue-url needs -pid and -database-url")
		return nil
	}
	cl := svc.NewClient(c.webhookQueueURL, c.key, c.runID+"-queue", c.clients, c.timeout)
	cl.IDs = b.client.IDs
	return &instance{kind: kindService, client: cl, pid: c.webhookQueuePID}
}

// plainInstance is the queue-only instance reached with -webhook-plain-key, seeded; nil
// without either.
func (b *bench) plainInstance(ctx context.Context, queue *instance) (*instance, error) {
	c := b.cfg
	if queue == nil || c.webhookPlainKey == "" {
		return nil, nil
	}
	cl := svc.NewClient(c.webhookQueueURL, c.webhookPlainKey, c.runID+"-plain", c.clients, c.timeout)
	ids, err := cl.Seed(ctx, plainSeed, c.seedParallel, nil)
	if err != nil {
		return nil, fmt.Errorf("seeding the -webhook-plain-key newsletter: %w", err)
	}
	cl.IDs = ids
	return &instance{kind: kindService, client: cl, pid: c.webhookQueuePID}, nil
}

// runQueuedPair runs write scenario name on the queue-only instance with one endpoint, its
// deliveries only queued while the main instance is paused, against the same writes to plain's
// newsletter, which has none, in alternating slices: back to back, a pass's two runs read from
// 0.77 to 1.09 of each other as the machine drifted. It returns both runs (phase "paired")
// once the backlog has been delivered.
func (b *bench) runQueuedPair(ctx context.Context, rc *receiver, queue, plain *instance, name string, pass int) (RunRecord, RunRecord, error) {
	remove, err := b.addEndpoint(ctx, rc)
	if err != nil {
		return RunRecord{}, RunRecord{}, err
	}
	defer remove()
	resume, err := b.pauseMain()
	if err != nil {
		return RunRecord{}, RunRecord{}, err
	}
	defer resume()
	queued, without := name+webhookQueuedSuffix, name+webhookPlainSuffix
	h := [2]half{b.half(ctx, queue, name, phasePaired, pass), b.half(ctx, plain, name, phasePaired, pass)}
	h[0].rec.Scenario, h[0].rec.Against = queued, without
	h[1].rec.Scenario, h[1].rec.Against = without, queued
	h[0].rec.Desc += "; one webhook endpoint subscribed to every event, its deliveries queued by an instance with WEBHOOK_WORKERS=0 while the one that delivers was paused"
	h[1].rec.Desc += "; a second newsletter with no webhook endpoint, on the same instance"
	recs := b.alternate(ctx, h, b.cfg.duration, false)
	resume()
	b.waitDelivered(ctx, queued, rc)
	return recs[0], recs[1], nil
}

// addEndpoint creates the bench's webhook endpoint, subscribed to every event and delivering
// to rc, and returns the function that deletes it.
func (b *bench) addEndpoint(ctx context.Context, rc *receiver) (func(), error) {
	id, err := b.client.CreateWebhook(ctx, rc.url)
	if err != nil {
		return nil, fmt.Errorf("creating the bench's webhook endpoint: %w", err)
	}
	return func() {
		if err := b.client.DeleteWebhook(context.WithoutCancel(ctx), id); err != nil {
			fmt.Fprintf(b.log, "note: deleting the bench's webhook endpoint: %v\n", err)
		}
	}, nil
}

// pauseMain stops the main instance (SIGSTOP), the only one with webhook workers, and returns
// the function that resumes it once.
func (b *bench) pauseMain() (func(), error) {
	if err := syscall.Kill(b.cfg.pid, syscall.SIGSTOP); err != nil {
		return nil, fmt.Errorf("pausing the main instance (pid %d): %w", b.cfg.pid, err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			if err := syscall.Kill(b.cfg.pid, syscall.SIGCONT); err != nil {
				fmt.Fprintf(b.log, "warning: resuming the main instance (pid %d): %v\n", b.cfg.pid, err)
			}
		})
	}, nil
}

// waitDelivered waits until the resumed main instance has delivered the queued deliveries.
func (b *bench) waitDelivered(ctx context.Context, name string, rc *receiver) {
	switch _, left, err := b.waitDrained(ctx, "webhook_deliveries"); {
	case err != nil:
		fmt.Fprintf(b.log, "note: %s: reading the webhook queue: %v\n", name, err)
	case left > 0:
		fmt.Fprintf(b.log, "note: %s: %d deliveries still queued after %s\n", name, left, b.cfg.drain)
	}
	waitStable(ctx, rc, b.cfg.drain)
}

// runWebhookWrite runs the write scenario name in the way mode, its record named with the
// mode's suffix; the endpoint, if any, is created for the run and deleted once the run's
// backlog is delivered. The last pass's bulk run with deliveries also gives the delivery
// throughput: every delivery since the run began over the time until the last one (while the
// workers lag, their throughput; when they kept up, the write rate, a floor).
func (b *bench) runWebhookWrite(ctx context.Context, rc *receiver, queue *instance, name string, mode hookMode, pass int) (RunRecord, error) {
	desc := map[hookMode]string{
		hookNone:      "; no webhook endpoint, paired with " + name + webhookSuffix,
		hookQueued:    "; one webhook endpoint subscribed to every event, its deliveries queued by an instance with WEBHOOK_WORKERS=0 while the one that delivers was paused",
		hookDelivered: "; one webhook endpoint subscribed to every event",
	}[mode]
	in := b.main
	if mode != hookNone {
		remove, err := b.addEndpoint(ctx, rc)
		if err != nil {
			return RunRecord{}, err
		}
		defer remove()
	}
	resume := func() {}
	if mode == hookQueued {
		in = queue
		var err error
		if resume, err = b.pauseMain(); err != nil {
			return RunRecord{}, err
		}
		defer resume()
	}
	start, before := time.Now(), rc.n.Load()
	b.runOn(ctx, in, name, name+mode.suffix(), b.cfg.clients, b.cfg.warmup, b.cfg.duration, "measure", pass)
	r := &b.rep.Runs[len(b.rep.Runs)-1]
	r.Desc += desc
	out := *r
	resume()
	backlogAt := rc.n.Load()
	if mode == hookQueued {
		b.waitDelivered(ctx, name+mode.suffix(), rc)
	} else {
		waitStable(ctx, rc, b.cfg.drain)
	}
	if mode != hookDelivered || name != svc.Bulk100 || pass != b.cfg.passes {
		return out, nil
	}
	last := time.Unix(0, rc.last.Load())
	delivered := rc.n.Load() - before
	secs := last.Sub(start).Seconds()
	rec := RunRecord{Scenario: WebhookDelivery, Kind: "service", Phase: "measure", Clients: 1,
		Desc:     "events delivered per second to a local receiver answering 204 at once, from the start of bulk_100_webhook to the last delivery of its backlog",
		Requests: delivered, OK: delivered, Seconds: secs}
	if secs > 0 {
		rec.RequestsPerSec = float64(delivered) / secs
		rec.RowsPerSec = rec.RequestsPerSec
	}
	b.rep.Runs = append(b.rep.Runs, rec)
	fmt.Fprintf(b.log, "measure  service       %-20s %d events in %.1fs: %.0f events/s (%d of them after the writes ended; target ≥ %d)\n",
		WebhookDelivery, delivered, secs, rec.RequestsPerSec, max(int64(0), rc.n.Load()-backlogAt), deliveryTarget)
	return out, nil
}

// waitStable waits until the receiver has had nothing for two seconds, or limit has passed.
func waitStable(ctx context.Context, rc *receiver, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if time.Since(time.Unix(0, rc.last.Load())) > 2*time.Second {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}
