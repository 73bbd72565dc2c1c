package integration

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/subscriberd/subscriberd/importer"
	"github.com/subscriberd/subscriberd/internal/smtptest"
	"github.com/subscriberd/subscriberd/mail"
	"github.com/subscriberd/subscriberd/repo"
)

// laneRows is how many pending rows newsletter F imports: with one worker sending over real
// SMTP a few hundred emails a second at most, first come, first served would send D's email
// many seconds after the create, behind all of them, and the test fails; few enough that the
// import itself takes seconds under the race detector on SQLite.
const laneRows = 5000

// TestSingleCreateOvertakesAnImport is docs/api-contract.md §21: newsletter F's import has
// queued laneRows confirmation emails (the bulk lane) and as many webhook deliveries to one
// endpoint, and a single create in newsletter D sends its confirmation while most of F's
// emails still wait; at F's endpoint, a single create's delivery is claimed before the
// import's. The figures are logged; the assertions are on order, not on time.
func TestSingleCreateOvertakesAnImport(t *testing.T) {
	t.Parallel()
	e := newEnv(t) // newsletter F
	ctx := context.Background()
	e.do(http.MethodPost, "/webhooks", map[string]any{"url": "http://127.0.0.1:9/hook", "events": []string{"subscriber.created"}}).
		want(t, http.StatusCreated, "")
	e.startImporter(t, importer.Config{})
	var csv strings.Builder
	csv.WriteString("email\n")
	for i := range laneRows {
		fmt.Fprintf(&csv, "f%d@example.com\n", i)
	}
	loc := e.upload("text/csv", csv.String(), "status=pending").want(t, http.StatusAccepted, "").header.Get("Location")
	wantCounts(t, e.waitImport(t, loc, "completed"), map[string]float64{"created": laneRows})
	if n := e.count(`SELECT count(*) FROM email_outbox WHERE newsletter_id = ? AND state = 'pending' AND lane = 1`, e.nl); n != laneRows {
		t.Fatalf("the import queued %d bulk emails; want %d", n, laneRows)
	}

	// At F's endpoint: a single create's delivery comes first, whatever the import queued.
	e.do(http.MethodPost, "/subscribers", map[string]any{"email": "single@example.com", "status": "active"}).
		want(t, http.StatusCreated, "")
	batches, err := repo.NewDeliveries(e.db).Claim(ctx, 1, 10, 1, time.Minute)
	if err != nil || len(batches) != 1 || len(batches[0].Deliveries) != 10 {
		t.Fatalf("claiming F's endpoint: %+v, %v; want one endpoint with 10 deliveries", batches, err)
	}
	if first := string(batches[0].Deliveries[0].Payload); !strings.Contains(first, "single@example.com") {
		t.Errorf("the first delivery claimed is %s; want the single create's, before the import's %d", first, laneRows)
	}

	// Newsletter D and its key, written before the worker runs: on SQLite a direct write
	// would wait for the worker's claims and could find the database busy.
	d := &env{t: t, db: e.db, base: e.base}
	d.nl, d.key = e.newKey(t, true)

	// The email worker, over real SMTP, starts on F's queue.
	smtp := smtptest.Start(t)
	composer, err := mail.NewComposer(testFrom, e.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := mail.NewSMTP(smtp.URL(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	w := mail.NewWorker(repo.NewOutbox(e.db), tr, composer, mail.WorkerConfig{PollInterval: 50 * time.Millisecond, Logger: discardLog})
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { w.Run(wctx); close(done) }() //nolint:errcheck // nil
	t.Cleanup(func() { stop(); <-done })
	waitFor(t, "F's emails to start going out", func() bool { return len(smtp.Messages()) >= 20 })

	// A single create in newsletter D.
	d.do(http.MethodPost, "/subscribers", map[string]any{"email": "person@example.com", "status": "pending"}).
		want(t, http.StatusCreated, "")
	created := time.Now()
	var ahead int
	waitFor(t, "D's confirmation email", func() bool {
		msgs := smtp.Messages()
		i := slices.IndexFunc(msgs, func(m smtptest.Message) bool { return m.To == "person@example.com" })
		if i < 0 {
			return false
		}
		ahead = i
		return true
	})
	took := time.Since(created)
	left := e.count(`SELECT count(*) FROM email_outbox WHERE newsletter_id = ? AND state = 'pending'`, e.nl)
	t.Logf("D's confirmation email went out %v after its create, %d emails after F's first, with %d of F's %d still queued",
		took.Round(time.Millisecond), ahead, left, laneRows)
	if left < laneRows/2 {
		t.Errorf("D's email went out when only %d of F's %d emails were left; want it before most of them (interactive lane first)", left, laneRows)
	}
}

// TestBulkLaneTakesTurns: in the bulk lane the newsletters take turns, whatever the order the
// emails were queued in: newsletter G queued 30 emails before H queued 3, and a claim of 10
// takes G's first, H's first, G's second, H's second…, so H's 3 are all in it. Interactive
// emails come before both.
func TestBulkLaneTakesTurns(t *testing.T) {
	t.Parallel()
	g := newEnv(t)
	h := &env{t: t, db: g.db, base: g.base}
	h.nl, h.key = g.newKey(t, true)
	i := &env{t: t, db: g.db, base: g.base}
	i.nl, i.key = g.newKey(t, true)
	ctx := context.Background()
	create := func(e *env, n int, prefix string) {
		for k := range n {
			e.do(http.MethodPost, "/subscribers", map[string]any{"email": fmt.Sprintf("%s%d@example.com", prefix, k), "status": "pending"}).
				want(t, http.StatusCreated, "")
		}
	}
	create(g, 30, "g")
	create(h, 3, "h")
	// As an import queues them (a batch's emails in the bulk lane), in queueing order.
	if _, err := g.db.ExecContext(ctx, "UPDATE email_outbox SET lane = 1"); err != nil {
		t.Fatal(err)
	}
	create(i, 2, "i") // single creates, after the bulk work: interactive
	got, err := repo.NewOutbox(g.db).Claim(ctx, 10, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, m := range got {
		order = append(order, m.Email[:1])
	}
	slices.Sort(order[2:]) // the bulk part's order among its newsletters is the claim's business
	if strings.Join(order, "") != "iiggggghhh" {
		t.Errorf("a claim of 10 took %v; want the 2 interactive emails first, then H's 3 among G's", order)
	}
}

// slowReceiverBulk is how many bulk deliveries newsletter F's import queues for its slow
// receiver: at 4 at a time and slowAnswer each they would take minutes to drain, so first
// come, first served, or a claim of a hundred of them worked through before the next claim,
// would keep the single create's delivery far past the bound.
const slowReceiverBulk = 2000

// slowAnswer is how long the receiver of TestSingleCreateDeliveryOvertakesBulkAtSlowReceiver
// takes to answer each delivery.
const slowAnswer = 500 * time.Millisecond

// TestSingleCreateDeliveryOvertakesBulkAtSlowReceiver is docs/api-contract.md §21 at one
// endpoint: a receiver that takes slowAnswer for each delivery is working through an import's
// slowReceiverBulk deliveries (the bulk lane) when a single create queues its delivery; the
// worker hands the rest of the bulk claim in hand back after webhook.Config.BulkTurn, and the
// endpoint's next claim takes the single create's first. It arrives within 5 s plus a few of the
// receiver's own times, whatever the bulk queue holds (a claim of 100 worked through would
// take 12.5 s), while most of the import's deliveries still wait.
func TestSingleCreateDeliveryOvertakesBulkAtSlowReceiver(t *testing.T) {
	t.Parallel()
	e := newEnv(t) // newsletter F
	rc := newReceiver(t)
	rc.setAnswer(func(http.ResponseWriter, *http.Request) bool {
		time.Sleep(slowAnswer)
		return false // then verified, recorded and answered 204
	})
	e.hook(rc.srv.URL, []string{"subscriber.created"}, rc)
	e.startImporter(t, importer.Config{})
	var csv strings.Builder
	csv.WriteString("email\n")
	for i := range slowReceiverBulk {
		fmt.Fprintf(&csv, "f%d@example.com\n", i)
	}
	loc := e.upload("text/csv", csv.String(), "status=active").want(t, http.StatusAccepted, "").header.Get("Location")
	wantCounts(t, e.waitImport(t, loc, "completed"), map[string]float64{"created": slowReceiverBulk})
	if n := e.count(`SELECT count(*) FROM webhook_deliveries WHERE state = 'pending' AND lane = 1`); n != slowReceiverBulk {
		t.Fatalf("the import queued %d bulk deliveries; want %d", n, slowReceiverBulk)
	}

	// The workers as serve runs them, but for the receiver on loopback and a timeout the
	// receiver's pace cannot reach on a slow machine.
	cfg := testHookConfig()
	cfg.Timeout = 20 * time.Second
	cfg.Backoff = nil
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.hookWorker(cfg).Run(ctx); close(done) }() //nolint:errcheck // nil
	t.Cleanup(func() { stop(); <-done })
	// The worker has claimed a batch of the import's deliveries and is delivering it.
	waitFor(t, "the import's deliveries to start", func() bool {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		return rc.calls >= 4
	})

	e.do(http.MethodPost, "/subscribers", map[string]any{"email": "single@example.com", "status": "active"}).
		want(t, http.StatusCreated, "")
	created := time.Now()
	waitFor(t, "the single create's delivery", func() bool {
		for _, d := range rc.deliveries() {
			if strings.Contains(string(d.body), "single@example.com") {
				return true
			}
		}
		return false
	})
	took := time.Since(created)
	left := e.count(`SELECT count(*) FROM webhook_deliveries WHERE state = 'pending' AND lane = 1`)
	t.Logf("the single create's delivery arrived %v after its create, %d deliveries after the import's first, with %d of the import's %d still queued",
		took.Round(time.Millisecond), len(rc.deliveries())-1, left, slowReceiverBulk)
	if limit := 5*time.Second + 2*slowAnswer; took > limit {
		t.Errorf("the single create's delivery arrived %v after its create; want within %v (5 s plus the receiver's own time), whatever the bulk lane holds", took, limit)
	}
	if left < slowReceiverBulk/2 {
		t.Errorf("only %d of the import's %d deliveries were left; want most of them still queued", left, slowReceiverBulk)
	}
}
