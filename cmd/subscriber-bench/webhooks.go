package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/subscriberd/subscriberd/internal/bench/svc"
)

// webhookScenarios are the write scenarios measured again with one enabled webhook endpoint
// subscribed to every event (docs/api-contract.md §10.4); the issue wants each within 15 % of
// its figure without endpoints.
var webhookScenarios = []string{svc.Update, svc.CreateActive, svc.Bulk100}

// WebhookDelivery is the scenario of the delivery throughput: events the service's workers
// delivered per second to a local receiver that answers at once.
const WebhookDelivery = "webhook_delivery"

// webhookSuffix names a write scenario measured with the endpoint, webhookOffSuffix the same
// writes measured without it, paired with it in the same pass.
const (
	webhookSuffix    = "_webhook"
	webhookOffSuffix = "_webhook_off"
)

// receiver is the local webhook receiver: it answers 204 at once and counts deliveries, with
// the time of the last.
type receiver struct {
	srv  *http.Server
	url  string
	n    atomic.Int64
	last atomic.Int64 // Unix nanoseconds
}

func startReceiver(addr string) (*receiver, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-webhook-receiver: %w", err)
	}
	rc := &receiver{url: "http://" + ln.Addr().String() + "/hook"}
	rc.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc.n.Add(1)
		rc.last.Store(time.Now().UnixNano())
		w.WriteHeader(http.StatusNoContent)
	})}
	go rc.srv.Serve(ln) //nolint:errcheck // ends with Close
	return rc, nil
}

// runWebhooks measures the write scenarios with one endpoint subscribed to every event against
// the same writes without one, and the delivery throughput of the backlog the bulk writes
// leave. Each pass runs each scenario twice, back to back on the same tables: without the
// endpoint, then with it (the other way round in even passes, so that neither always runs on
// the larger tables). Each run starts with nothing left to deliver: the endpoint is created
// for its run and deleted after its backlog drained. The service must allow a loopback URL
// (WEBHOOK_ALLOW_PRIVATE=true); otherwise it says so and measures nothing.
func (b *bench) runWebhooks(ctx context.Context) error {
	rc, err := startReceiver(b.cfg.webhookReceiver)
	if err != nil {
		return err
	}
	defer rc.srv.Close()
	// One endpoint created and deleted at once tells whether the service accepts the receiver.
	id, err := b.client.CreateWebhook(ctx, rc.url)
	if err == nil {
		err = b.client.DeleteWebhook(ctx, id)
	}
	if err != nil {
		fmt.Fprintf(b.log, "note: webhooks not measured (does the service run with WEBHOOK_ALLOW_PRIVATE=true?): %v\n", err)
		return nil
	}
	fmt.Fprintf(b.log, "== writes with and without one webhook endpoint (every event) delivering to %s\n", rc.url)
	for pass := 1; pass <= b.cfg.passes; pass++ {
		for _, name := range webhookScenarios {
			if b.cfg.only != nil && !b.cfg.only[name] {
				continue
			}
			order := []bool{false, true}
			if pass%2 == 0 {
				order = []bool{true, false}
			}
			runs := map[bool]RunRecord{} // by whether the endpoint was there
			for _, endpoint := range order {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				r, err := b.runWebhookWrite(ctx, rc, name, endpoint, pass)
				if err != nil {
					return err
				}
				runs[endpoint] = r
			}
			if plain := runs[false]; plain.RowsPerSec > 0 {
				fmt.Fprintf(b.log, "         %s with the endpoint: %.2f × its rows/s without (target ≥ 0.85)\n",
					name, runs[true].RowsPerSec/plain.RowsPerSec)
			}
		}
	}
	return nil
}

// runWebhookWrite runs the write scenario name with an endpoint created for the run (its
// record named with webhookSuffix) or without one (webhookOffSuffix), then waits for what it
// left to be delivered and deletes the endpoint. The last pass's bulk run with the endpoint
// also gives the delivery throughput: every delivery since the run began over the time until
// the last one. While the workers lag, that is their throughput; when they kept up, it is the
// write rate, a floor.
func (b *bench) runWebhookWrite(ctx context.Context, rc *receiver, name string, endpoint bool, pass int) (RunRecord, error) {
	suffix, desc := webhookSuffix, "; one webhook endpoint subscribed to every event"
	if !endpoint {
		suffix, desc = webhookOffSuffix, "; no webhook endpoint, paired with "+name+webhookSuffix
	} else {
		id, err := b.client.CreateWebhook(ctx, rc.url)
		if err != nil {
			return RunRecord{}, fmt.Errorf("creating the bench's webhook endpoint: %w", err)
		}
		defer func() {
			if err := b.client.DeleteWebhook(context.WithoutCancel(ctx), id); err != nil {
				fmt.Fprintf(b.log, "note: deleting the bench's webhook endpoint: %v\n", err)
			}
		}()
	}
	start, before := time.Now(), rc.n.Load()
	b.runOn(ctx, b.main, name, name+suffix, b.cfg.clients, b.cfg.warmup, b.cfg.duration, "measure", pass)
	r := &b.rep.Runs[len(b.rep.Runs)-1]
	r.Desc += desc
	out := *r
	backlogAt := rc.n.Load()
	waitStable(ctx, rc, b.cfg.drain)
	if !endpoint || name != svc.Bulk100 || pass != b.cfg.passes {
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
	fmt.Fprintf(b.log, "measure  service       %-20s %d events in %.1fs: %.0f events/s (%d of them after the writes ended; target ≥ 1000)\n",
		WebhookDelivery, delivered, secs, rec.RequestsPerSec, max(int64(0), rc.n.Load()-backlogAt))
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
