// Command subscriber-bench measures a running subscriberd: it drives the HTTP API with N
// concurrent clients per scenario (creates, bulk creates, lists, gets, updates), runs in the
// same process the naive SQL a correct implementation must run (the baseline) through the
// service's own database stack against the same database, and prints each scenario's figures
// and its service/baseline ratio in one table, also written as JSON.
//
// Usage:
//
//	subscriber-bench -url http://127.0.0.1:8080 -key sk_... \
//	    -database-url 'postgres://postgres@127.0.0.1:5432/db?sslmode=disable' \
//	    -seed 100000 -clients 16 -check-clients 64,256 -pid $SERVICE_PID -json bench.json
//
// It also prices telemetry (telemetry.go), webhooks (webhooks.go), the import (imports.go) and
// what follows it (tags.go, bulk.go), where the instances and receivers they need are given.
// scripts/bench.sh (make bench) builds and starts a service on a fresh database and runs it.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	"github.com/subscriberd/subscriberd/cmd/subscriber-bench/baseline"
	"github.com/subscriberd/subscriberd/cmd/subscriber-bench/load"
	"github.com/subscriberd/subscriberd/cmd/subscriber-bench/pgstat"
	"github.com/subscriberd/subscriberd/cmd/subscriber-bench/svc"
)

// config is the command line; parseFlags says what each setting is.
type config struct {
	url, key, databaseURL, newsletter string
	seed, seedParallel, scaleTo       int
	clients, passes                   int
	checkClients                      []int
	duration, warmup, checkDuration   time.Duration
	timeout, stall, drain             time.Duration
	maxRequests                       int64
	only                              map[string]bool
	noBaseline, vacuum                bool
	where                             bool
	pid                               int
	jsonPath, runID, label            string
	command, markdown, compareWith    string
	reportFrom                        string
	pprofURL, profileDir              string
	idSample                          int
	importRows                        int

	// The telemetry comparison (telemetry.go).
	telemetryOffURL, telemetryOnURL, telemetryProdURL string
	telemetryOffPID, telemetryOnPID, telemetryProdPID int
	telemetryScenarios                                []string
	telemetrySlice, telemetryDuration                 time.Duration
	otlpSink                                          string

	// The webhook writes (webhooks.go) and the single creates during bulk work (bulk.go).
	webhooks                         bool
	webhookReceiver, webhookQueueURL string
	webhookQueuePID                  int
	webhookPlainKey, smtpReceiver    string
}

// defaultTelemetryScenarios are the scenarios of the telemetry comparison: the cheapest reads
// and writes, where telemetry's fixed cost per request weighs most.
var defaultTelemetryScenarios = []string{svc.Get, svc.ListFirst, svc.CreateActive, svc.Update}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("subscriber-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.url, "url", "http://127.0.0.1:8080", "base URL of the service")
	fs.StringVar(&c.key, "key", os.Getenv("BENCH_API_KEY"), "API key of the benchmarked newsletter (default $BENCH_API_KEY)")
	fs.StringVar(&c.databaseURL, "database-url", os.Getenv("BENCH_DATABASE_URL"), "the service's database, for the baseline (default $BENCH_DATABASE_URL; empty = no baseline)")
	fs.StringVar(&c.newsletter, "newsletter", "", "the key's newsletter id, for the baseline (default: looked up from a subscriber)")
	fs.IntVar(&c.seed, "seed", 0, "subscribers to create through the bulk API before measuring")
	fs.IntVar(&c.seedParallel, "seed-parallel", 8, "concurrent bulk requests while seeding")
	fs.IntVar(&c.scaleTo, "scale-to", 0, "after the run, seed up to this many subscribers and measure the first page again (e.g. 1000000)")
	fs.IntVar(&c.importRows, "import-rows", 0, "run the "+ImportScenario+" scenario with this many rows, after the others (0 = not run; make bench passes 1000000)")
	fs.IntVar(&c.clients, "clients", 16, "concurrent clients of the measured run")
	fs.IntVar(&c.passes, "passes", 1, "passes of the measured run; the table shows each scenario's median pass")
	checks := fs.String("check-clients", "64,256", "client counts of the no-error/no-stall check of every service scenario (empty = none)")
	fs.DurationVar(&c.duration, "duration", 6*time.Second, "measured time per scenario")
	fs.DurationVar(&c.warmup, "warmup", time.Second, "unmeasured warm-up per scenario")
	fs.DurationVar(&c.checkDuration, "check-duration", 4*time.Second, "measured time per check scenario")
	fs.DurationVar(&c.timeout, "timeout", 20*time.Second, "timeout of one request or query")
	fs.DurationVar(&c.drain, "drain-timeout", 5*time.Minute, "after a scenario that queues confirmation emails, wait this long at most for the service's email worker to send them (over SMTP, 100 to 200 a second on 2 busy cores), so that its work does not slow the next scenario (needs -database-url)")
	fs.DurationVar(&c.stall, "stall", 3*time.Second, "a scenario with no completion for this long has stalled")
	fs.Int64Var(&c.maxRequests, "max-requests", load.DefaultMaxRequests, "cap on the measured operations of one scenario")
	fs.BoolVar(&c.webhooks, "webhooks", true, "after the writes, measure update, create_active and bulk_100 again, without and with one webhook endpoint subscribed to every event in turn (its deliveries made meanwhile, and with -webhook-queue-url only queued), and the delivery throughput to a local receiver (the service needs WEBHOOK_ALLOW_PRIVATE=true)")
	fs.StringVar(&c.webhookReceiver, "webhook-receiver", "127.0.0.1:0", "listen address of the local webhook receiver")
	fs.StringVar(&c.webhookQueueURL, "webhook-queue-url", "", "base URL of an instance of the service with WEBHOOK_WORKERS=0 (same database and key): the webhook writes are also measured on it with the endpoint while the main instance, the only one delivering, is paused (needs -pid and -database-url)")
	fs.IntVar(&c.webhookQueuePID, "webhook-queue-pid", 0, "process id of the -webhook-queue-url instance, for its CPU")
	fs.StringVar(&c.webhookPlainKey, "webhook-plain-key", "", "API key of a second newsletter on the same database, with no webhook endpoint: the single creates during bulk work go to it (bulk.go); with -webhook-queue-url, the writes with their deliveries only queued then also run against the same writes to it, in alternating slices on the queue-only instance, and are judged on those")
	fs.StringVar(&c.smtpReceiver, "smtp-receiver", "", "serve an SMTP receiver on this address (the service's SMTP_URL) that accepts every email at once: the single creates during bulk work time their confirmation email to it (empty = not timed)")
	only := fs.String("only", "", "comma-separated service scenarios to run (default all): "+strings.Join(serviceNames(), ",")+
		"; "+ImportScenario+" is the million-row part (with -import-rows): the import, its variants, and the attribute and tag reads, "+svc.SegmentCount+" and "+BulkTagScenario+" on the newsletter after it")
	fs.BoolVar(&c.vacuum, "vacuum", true, "VACUUM ANALYZE the subscriber tables after seeding, as autovacuum would at some moment of the run (needs -database-url)")
	fs.BoolVar(&c.noBaseline, "no-baseline", false, "skip the baseline even with a database URL")
	fs.BoolVar(&c.where, "where", true, "measure where PostgreSQL's time goes in every measured run of the main instance and of the baseline: statements per request (pg_stat_statements, where the server loads it), WAL bytes and wait events per request (needs -database-url)")
	fs.IntVar(&c.pid, "pid", 0, "process id of the service, for its peak RSS (VmHWM)")
	fs.StringVar(&c.jsonPath, "json", "", "write the results as JSON to this file")
	fs.StringVar(&c.runID, "run-id", "", "run id in emails and the report (default random)")
	fs.StringVar(&c.label, "label", "", "free text recorded in the report (e.g. the service's commit)")
	fs.StringVar(&c.command, "command", "", "the command that ran this, for the Markdown report (e.g. make bench)")
	fs.StringVar(&c.compareWith, "compare-with", "", "a report written earlier by -json: each measured service scenario is set against it (before/after a change, telemetry on/off)")
	fs.StringVar(&c.reportFrom, "report", "", "run nothing: read a report written earlier by -json, work its telemetry comparison out again with this tool, and print it (and write it with -json and -markdown)")
	fs.StringVar(&c.markdown, "markdown", "", "write the results as a Markdown document to this file (e.g. docs/benchmarks.md)")
	fs.StringVar(&c.pprofURL, "pprof-url", "", "admin base URL of the service (e.g. http://127.0.0.1:9090): CPU profile of each measured service scenario and goroutine dumps of the checks into -profile-dir")
	fs.StringVar(&c.profileDir, "profile-dir", "", "where -pprof-url's profiles go")
	fs.IntVar(&c.idSample, "ids", 50000, "known subscriber ids that get and update pick from")
	fs.StringVar(&c.telemetryOffURL, "telemetry-off-url", "", "base URL of a second instance of the service with telemetry off (same database and key): each -telemetry-scenarios scenario is measured on it and on -telemetry-on-url in every pass")
	fs.IntVar(&c.telemetryOffPID, "telemetry-off-pid", 0, "process id of the -telemetry-off-url instance, for its CPU and settings")
	fs.StringVar(&c.telemetryOnURL, "telemetry-on-url", "", "base URL of a third instance of the service with telemetry fully on (every trace sampled and exported, e.g. to -otlp-sink)")
	fs.IntVar(&c.telemetryOnPID, "telemetry-on-pid", 0, "process id of the -telemetry-on-url instance, for its CPU and settings")
	fs.StringVar(&c.telemetryProdURL, "telemetry-prod-url", "", "base URL of an instance of the service at the production setting (OTEL_TRACES_SAMPLER=parentbased_traceidratio, OTEL_TRACES_SAMPLER_ARG=0.1, exporting): measured against -telemetry-off-url in pairs of its own")
	fs.IntVar(&c.telemetryProdPID, "telemetry-prod-pid", 0, "process id of the -telemetry-prod-url instance, for its CPU and settings")
	telScenarios := fs.String("telemetry-scenarios", strings.Join(defaultTelemetryScenarios, ","), "comma-separated scenarios of the telemetry comparison, run whatever -only says (empty = none): "+strings.Join(serviceNames(), ","))
	fs.DurationVar(&c.telemetrySlice, "telemetry-slice", 500*time.Millisecond, "the telemetry comparison runs each scenario on the two instances in alternating slices this long (off on on off …), each for -telemetry-duration in all; a scenario judged against another service scenario of like latency (replay against get, …) runs with it in slices this long too, each for -duration")
	fs.DurationVar(&c.telemetryDuration, "telemetry-duration", 20*time.Second, "measured time per instance and scenario of the telemetry comparison: its overhead is a difference of two throughputs, and 6 s a side read ±3 points on this machine")
	fs.StringVar(&c.otlpSink, "otlp-sink", "", "serve an OTLP/HTTP trace receiver on this address (e.g. 127.0.0.1:4318) for the whole run: it discards the spans and counts the exports and their bytes")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if c.key == "" && c.reportFrom == "" {
		return c, errors.New("-key (or BENCH_API_KEY) is required")
	}
	if c.clients < 1 || c.duration <= 0 || c.passes < 1 {
		return c, errors.New("-clients and -passes must be ≥ 1 and -duration positive")
	}
	for _, f := range strings.Split(*checks, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return c, fmt.Errorf("-check-clients: %q is not a positive number", f)
		}
		c.checkClients = append(c.checkClients, n)
	}
	if *only != "" {
		c.only = map[string]bool{}
		for _, n := range strings.Split(*only, ",") {
			n = strings.TrimSpace(n)
			if !slices.Contains(serviceNames(), n) && n != ImportScenario {
				return c, fmt.Errorf("-only: unknown scenario %q", n)
			}
			c.only[n] = true
		}
	}
	if (c.telemetryOffURL == "") != (c.telemetryOnURL == "") {
		return c, errors.New("-telemetry-off-url and -telemetry-on-url go together")
	}
	if c.telemetrySlice <= 0 || c.telemetryDuration <= 0 {
		return c, errors.New("-telemetry-slice and -telemetry-duration must be positive")
	}
	if c.telemetryProdURL != "" && c.telemetryOffURL == "" {
		return c, errors.New("-telemetry-prod-url needs -telemetry-off-url and -telemetry-on-url")
	}
	if c.telemetryOffPID < 0 || c.telemetryOnPID < 0 || c.telemetryProdPID < 0 {
		return c, errors.New("-telemetry-off-pid, -telemetry-on-pid and -telemetry-prod-pid must not be negative")
	}
	for _, n := range strings.Split(*telScenarios, ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if !slices.Contains(serviceNames(), n) {
			return c, fmt.Errorf("-telemetry-scenarios: unknown scenario %q", n)
		}
		if !slices.Contains(c.telemetryScenarios, n) {
			c.telemetryScenarios = append(c.telemetryScenarios, n)
		}
	}
	if c.pprofURL != "" && c.profileDir == "" {
		return c, errors.New("-pprof-url needs -profile-dir")
	}
	if c.runID == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.runID = time.Now().UTC().Format("0102150405") + hex.EncodeToString(b[:])
	}
	return c, nil
}

// pair is a service scenario and the baselines it is compared with, run right after it so both
// see the same table.
type pair struct {
	service   string
	write     bool
	baselines []string
}

var plan = []pair{
	{svc.ListFirst, false, []string{baseline.Page, baseline.PageCount}},
	{svc.ListDeep, false, []string{baseline.PageDeep, baseline.PageDeepCount}},
	{svc.ListStatus, false, []string{baseline.PageStatus}},
	{svc.Get, false, []string{baseline.SelectByID}},
	{svc.Update, true, []string{baseline.UpdateByID}},
	{svc.CreateActive, true, []string{baseline.InsertOne}},
	{svc.CreatePending, true, []string{baseline.InsertPending}},
	{svc.Bulk100, true, []string{baseline.Insert100}},
	// API 1.1: compared with the service scenarios above (targets in report.go), those of like
	// latency also in alternating slices (runServicePair).
	{svc.ListCursorDeep, false, nil},
	{svc.LookupEmail, false, nil},
	{svc.Replay, false, nil},
	{svc.CreateIdem, true, nil},
	// API 1.3: against create_active (targets); the §19 reads run after the import (tags.go).
	{svc.CreateAttrs, true, nil},
}

func serviceNames() []string {
	var out []string
	for _, p := range plan {
		out = append(out, p.service)
	}
	return out
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "subscriber-bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var rep *Report
	if cfg.reportFrom != "" {
		if rep, err = reread(cfg.reportFrom); err == nil {
			err = rep.compareWith(cfg.compareWith)
		}
	} else {
		rep, err = run(ctx, cfg, os.Stderr)
	}
	if rep != nil {
		printReport(os.Stdout, rep)
		if cfg.jsonPath != "" {
			err = errors.Join(err, writeJSON(cfg.jsonPath, rep))
		}
		if cfg.markdown != "" {
			err = errors.Join(err, writeMarkdown(cfg.markdown, rep))
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "subscriber-bench:", err)
		os.Exit(1)
	}
	if rep.Failed() {
		// The figures are printed; a scenario with errors or a stall is a failed run.
		os.Exit(3)
	}
}

// bench is one run in progress.
type bench struct {
	cfg    config
	log    io.Writer
	client *svc.Client
	main   *instance
	base   *baseline.Runner
	db     *bun.DB
	rep    *Report
	// where measures where PostgreSQL's time goes (-where; nil without it).
	where *pgstat.Probe

	// off, on and prod are the instances of the telemetry comparison (nil without it; prod
	// also without -telemetry-prod-url), offProd off in prod's pairs; sink is the -otlp-sink
	// receiver, lastOnEnd when the latest run on an exporting instance ended.
	off, on, offProd, prod *instance
	sink                   *receiver
	lastOnEnd              time.Time
	// smtp is the -smtp-receiver (nil without it).
	smtp *smtpReceiver
}

// The Kind of the RunRecords of each instance.
const (
	kindService          = "service"
	kindTelemetryOff     = "telemetry-off"
	kindTelemetryOn      = "telemetry-on"
	kindTelemetryOffProd = "telemetry-off-production"
	kindTelemetryProd    = "telemetry-production"
)

// instance is one running service the tool drives: the main one, or one of the two instances
// of the telemetry comparison.
type instance struct {
	kind   string // the Kind of its runs
	client *svc.Client
	pid    int // 0 = unknown
	// sent counts every request of the runs on this instance, warm-ups and probes included
	// (for the OTLP bytes per request of the "on" instance).
	sent atomic.Int64
}

// reread is the report of an earlier run (-report), its comparisons and telemetry comparison
// worked out again from its runs, so that a change of how they are judged applies to it too.
func reread(path string) (*Report, error) {
	rep, err := readJSON(path)
	if err != nil {
		return nil, err
	}
	rep.compare()
	rep.telemetryResults()
	return rep, nil
}

func run(ctx context.Context, cfg config, log io.Writer) (*Report, error) {
	maxClients := cfg.clients
	for _, n := range cfg.checkClients {
		maxClients = max(maxClients, n)
	}
	b := &bench{cfg: cfg, log: log, client: svc.NewClient(cfg.url, cfg.key, cfg.runID, maxClients, cfg.timeout)}
	b.main = &instance{kind: kindService, client: b.client, pid: cfg.pid}
	b.rep = &Report{Meta: Meta{
		RunID: cfg.runID, Label: cfg.label, StartedAt: time.Now().UTC().Format(time.RFC3339), URL: cfg.url,
		Clients: cfg.clients, Passes: cfg.passes, CheckClients: cfg.checkClients, Duration: cfg.duration.String(),
		Warmup: cfg.warmup.String(), CheckDuration: cfg.checkDuration.String(), GoVersion: runtime.Version(),
		NumCPU: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), ServicePID: cfg.pid,
		Machine: machine(), Command: cfg.command,
	}}
	if cfg.otlpSink != "" {
		sink, err := startSink(cfg.otlpSink)
		if err != nil {
			return b.rep, fmt.Errorf("-otlp-sink: %w", err)
		}
		defer sink.Close()
		b.sink = sink
		fmt.Fprintf(log, "OTLP/HTTP trace sink on %s\n", sink.addr)
	}
	if cfg.smtpReceiver != "" {
		r, err := startSMTP(cfg.smtpReceiver)
		if err != nil {
			return b.rep, err
		}
		defer r.srv.Close()
		b.smtp = r
		fmt.Fprintf(log, "SMTP receiver on %s\n", r.addr)
	}
	if cfg.pid > 0 {
		if err := b.rss("before seeding", false); err != nil {
			fmt.Fprintf(log, "warning: peak RSS: %v\n", err)
		}
	}

	// Seed, or learn ids of an already seeded newsletter.
	if cfg.seed > 0 {
		if err := b.seed(ctx, cfg.seed); err != nil {
			return b.rep, err
		}
		b.rss("seeding", true)
	} else {
		ids, err := b.client.ListIDs(ctx, cfg.idSample)
		if err != nil {
			return b.rep, fmt.Errorf("reading subscriber ids: %w", err)
		}
		b.client.IDs = ids
	}
	if len(b.client.IDs) == 0 {
		return b.rep, errors.New("the newsletter has no subscribers: use -seed")
	}
	if len(b.client.IDs) > cfg.idSample {
		b.client.IDs = b.client.IDs[:cfg.idSample]
	}
	b.setupTelemetry()

	if cfg.databaseURL != "" && !cfg.noBaseline {
		if err := b.openBaseline(ctx); err != nil {
			return b.rep, err
		}
		defer b.db.Close()
	} else {
		fmt.Fprintln(log, "note: no -database-url: the baseline is not run and no ratio is computed")
	}

	if err := b.vacuumTables(ctx); err != nil {
		return b.rep, err
	}
	if b.openWhere(ctx); b.where != nil {
		defer b.where.Close()
	}

	// Reads first, so that every read sees the seeded table and not the rows the write
	// scenarios add; then writes. Each group: the measured run (each service scenario followed
	// by its baselines), then the checks at more clients.
	for _, writes := range []bool{false, true} {
		group := map[bool]string{false: "reads", true: "writes"}[writes]
		var scenarios []pair
		for _, p := range plan {
			if p.write == writes && (cfg.only == nil || cfg.only[p.service]) {
				scenarios = append(scenarios, p)
			}
		}
		// Passes go over every scenario in turn, so that a slow spell of a shared machine
		// touches one pass of several scenarios rather than every pass of one.
		for pass := 1; pass <= cfg.passes; pass++ {
			for _, p := range scenarios {
				if ctx.Err() != nil {
					return b.rep, ctx.Err()
				}
				b.runService(ctx, p.service, cfg.clients, cfg.warmup, cfg.duration, "measure", pass)
				if b.base != nil {
					for _, name := range p.baselines {
						b.runBaseline(ctx, name, cfg.clients, pass)
					}
				}
				for _, t := range targets {
					if t.paired && t.service == p.service {
						b.runServicePair(ctx, t.service, t.baseline, pass)
					}
				}
			}
			if err := b.runTelemetry(ctx, writes, pass); err != nil {
				return b.rep, err
			}
		}
		b.rss(fmt.Sprintf("%s, %d clients", group, cfg.clients), true)
		for _, n := range cfg.checkClients {
			for _, p := range scenarios {
				if ctx.Err() != nil {
					return b.rep, ctx.Err()
				}
				b.runService(ctx, p.service, n, cfg.warmup/2, cfg.checkDuration, "check", 0)
			}
			b.rss(fmt.Sprintf("%s, %d clients", group, n), true)
		}
	}
	if cfg.webhooks {
		if err := b.runWebhooks(ctx); err != nil {
			return b.rep, err
		}
	}
	if cfg.importRows > 0 && (cfg.only == nil || cfg.only[ImportScenario]) {
		if err := b.runImports(ctx); err != nil {
			return b.rep, err
		}
	}
	b.rep.compare()
	b.finishTelemetry(ctx)

	if cfg.scaleTo > 0 {
		if err := b.scale(ctx); err != nil {
			return b.rep, err
		}
	}
	if err := b.rep.compareWith(cfg.compareWith); err != nil {
		return b.rep, err
	}
	b.rep.judge(cfg.stall)
	return b.rep, nil
}

func (b *bench) seed(ctx context.Context, n int) error {
	fmt.Fprintf(b.log, "seeding %d subscribers (%d parallel bulk requests)...\n", n, b.cfg.seedParallel)
	t0 := time.Now()
	last := time.Now()
	ids, err := b.client.Seed(ctx, n, b.cfg.seedParallel, func(done int) {
		if time.Since(last) > 5*time.Second {
			last = time.Now()
			fmt.Fprintf(b.log, "  %d/%d (%.0f rows/s)\n", done, n, float64(done)/time.Since(t0).Seconds())
		}
	})
	el := time.Since(t0)
	b.rep.Seeds = append(b.rep.Seeds, SeedRecord{Rows: len(ids), Seconds: el.Seconds(), RowsPerSec: float64(len(ids)) / el.Seconds()})
	if err != nil {
		return fmt.Errorf("seeding after %d rows: %w", len(ids), err)
	}
	fmt.Fprintf(b.log, "seeded %d in %.1fs (%.0f rows/s)\n", len(ids), el.Seconds(), float64(len(ids))/el.Seconds())
	b.client.IDs = append(b.client.IDs, ids...)
	return nil
}

func (b *bench) openBaseline(ctx context.Context) error {
	db, err := baseline.Open(b.cfg.databaseURL, b.cfg.clients)
	if err != nil {
		return err
	}
	b.db = db
	var nl uuid.UUID
	if b.cfg.newsletter != "" {
		if nl, err = uuid.Parse(b.cfg.newsletter); err != nil {
			return fmt.Errorf("-newsletter: %w", err)
		}
	} else {
		first, err := uuid.Parse(b.client.IDs[0])
		if err != nil {
			return fmt.Errorf("subscriber id %q from the API: %w", b.client.IDs[0], err)
		}
		if nl, err = baseline.NewsletterOf(ctx, db, first); err != nil {
			return fmt.Errorf("newsletter of subscriber %s (is -database-url the service's database?): %w", first, err)
		}
	}
	ids := make([]uuid.UUID, 0, len(b.client.IDs))
	for _, s := range b.client.IDs {
		if id, err := uuid.Parse(s); err == nil {
			ids = append(ids, id)
		}
	}
	b.base = baseline.NewRunner(db, nl, ids, b.cfg.runID)
	b.base.Timeout = b.cfg.timeout
	_ = db.NewRaw("SELECT version()").Scan(ctx, &b.rep.Meta.PostgresVersion)
	_ = db.NewRaw("SELECT count(*) FROM subscribers WHERE newsletter_id = ?", nl).Scan(ctx, &b.rep.Meta.SubscribersAtStart)
	b.rep.Meta.Newsletter = nl.String()
	return nil
}

// runService runs one scenario on the main service and records it; pass numbers the passes
// of a multi-pass measured run (0 otherwise).
func (b *bench) runService(ctx context.Context, name string, clients int, warmup, dur time.Duration, phase string, pass int) RunRecord {
	return b.runOn(ctx, b.main, name, name, clients, warmup, dur, phase, pass)
}

// runOn runs one service scenario on the instance in and records it as a run of in's kind
// named as; on the main instance, its CPU profile is saved under that name too.
func (b *bench) runOn(ctx context.Context, in *instance, name, as string, clients int, warmup, dur time.Duration, phase string, pass int) RunRecord {
	sc, rec, op := b.prepare(ctx, in, name, clients, phase, pass)
	rec.Scenario = as
	var wait func()
	app := "" // where the time goes: the main instance's measured runs only
	if in == b.main && phase == "measure" {
		app = serviceApplicationName
	}
	out := b.measure(ctx, &rec, load.Options{Clients: clients, Warmup: warmup, Duration: dur}, op, in.pid, app, func() {
		if b.cfg.pprofURL != "" && in == b.main {
			wait = b.profile(ctx, as, clients, phase, dur)
		}
	})
	if wait != nil {
		wait()
	}
	return b.record(ctx, rec, out, sc.Write, serviceApplicationName, in.pid)
}

// measure runs op with opts and records in rec the CPU of process pid, PostgreSQL and this tool
// over the measured window and, with app, where PostgreSQL's time went for app's connections;
// onMeasure, when set, is called as the window starts.
func (b *bench) measure(ctx context.Context, rec *RunRecord, opts load.Options, op load.Op, pid int, app string, onMeasure func()) load.Outcome {
	var cpu cpuMeter
	var where *pgstat.Window
	opts.MaxRequests = b.cfg.maxRequests
	opts.OnMeasure = func() {
		cpu.start(pid)
		where = b.whereStart(ctx, app)
		if onMeasure != nil {
			onMeasure()
		}
	}
	out := load.Run(ctx, opts, op)
	rec.ServiceCPU, rec.DBCPU, rec.ToolCPU = cpu.stop()
	rec.Requests = out.Summary.Requests
	rec.Where = b.whereStop(ctx, where, rec.Requests)
	return out
}

// phasePaired is the phase of the runs of runServicePair.
const phasePaired = "paired"

// runServicePair runs scenario name and the service scenario it is judged against on the main
// instance in alternating slices, each for -duration, and records both in phase "paired". A few
// minutes apart, a replay and a get, which do about the same work, read 0.78 or 1.19 of each
// other as the machine drifted. Their CPU is not split: the measured runs give each one's.
func (b *bench) runServicePair(ctx context.Context, name, against string, pass int) {
	h := [2]half{b.half(ctx, b.main, name, phasePaired, pass), b.half(ctx, b.main, against, phasePaired, pass)}
	h[0].rec.Against, h[1].rec.Against = against, name
	b.alternate(ctx, h, b.cfg.duration, false)
}

// half is one of the two runs of an alternating pair: a scenario prepared on an instance, its
// record so far (for the caller to name) and its operation.
type half struct {
	in  *instance
	sc  svc.Scenario
	rec RunRecord
	op  load.Op
}

// half prepares scenario name on in for one side of an alternating pair (see prepare).
func (b *bench) half(ctx context.Context, in *instance, name, phase string, pass int) half {
	sc, rec, op := b.prepare(ctx, in, name, b.cfg.clients, phase, pass)
	return half{in: in, sc: sc, rec: rec, op: op}
}

// alternate runs the two halves in alternating slices of -telemetry-slice, each for dur, and
// records a run of each. With splitCPU, each instance's CPU is measured over the whole pair and
// given per second of its own slices, as if it were idle in the other's.
func (b *bench) alternate(ctx context.Context, h [2]half, dur time.Duration, splitCPU bool) [2]RunRecord {
	var cpus [2]cpuMeter
	opts := load.Options{Clients: b.cfg.clients, Warmup: b.cfg.warmup, Duration: dur, MaxRequests: b.cfg.maxRequests}
	if splitCPU {
		opts.OnMeasure = func() {
			for i := range h {
				cpus[i].start(h[i].in.pid)
			}
		}
	}
	outs := load.RunAlternating(ctx, opts, b.cfg.telemetrySlice, [2]load.Op{h[0].op, h[1].op})
	var recs [2]RunRecord
	for i := range h {
		if splitCPU {
			service, _, tool := cpus[i].stop()
			h[i].rec.ServiceCPU, h[i].rec.ToolCPU = 2*service, tool
		}
		recs[i] = b.record(ctx, h[i].rec, outs[i], h[i].sc.Write, serviceApplicationName, h[i].in.pid)
	}
	return recs
}

// prepare checks one answer of scenario name on the instance in against the contract and
// returns the scenario, its run's record so far and the operation to load it with.
func (b *bench) prepare(ctx context.Context, in *instance, name string, clients int, phase string, pass int) (svc.Scenario, RunRecord, load.Op) {
	scs := in.client.Scenarios()
	sc := scs[slices.IndexFunc(scs, func(sc svc.Scenario) bool { return sc.Name == name })]
	rec := RunRecord{Scenario: name, Kind: in.kind, Phase: phase, Clients: clients, Desc: sc.Desc}
	if b.cfg.passes > 1 {
		rec.Pass = pass
	}
	what := "the service's"
	if in.kind != kindService {
		what = "the " + in.kind + " instance's"
	}
	if in != b.main {
		in.sent.Add(1) // the probe
	}
	if err := in.client.Probe(ctx, sc); err != nil {
		rec.Probe = err.Error()
		fmt.Fprintf(b.log, "warning: %s: %s answer is off the contract: %v\n", name, what, err)
	}
	op := sc.Op
	if in != b.main { // the main service's runs stay exactly as they were
		op = func(ctx context.Context, worker int, seq int64) load.Result {
			in.sent.Add(1)
			return sc.Op(ctx, worker, seq)
		}
	}
	return sc, rec, op
}

// record completes rec with out and keeps it: for a write, the writer's (app's, of process pid
// if known) connections and their counter slots; after a pending create, the outbox's drain.
func (b *bench) record(ctx context.Context, rec RunRecord, out load.Outcome, write bool, app string, pid int) RunRecord {
	rec.fill(out)
	if write {
		rec.Conns, rec.CounterSlots = b.counterSlots(ctx, app, pid)
	}
	if rec.Scenario == svc.CreatePending || rec.Scenario == baseline.InsertPending {
		b.drainOutbox(ctx, &rec)
	}
	b.rep.Runs = append(b.rep.Runs, rec)
	b.progress(rec)
	return rec
}

func (b *bench) runBaseline(ctx context.Context, name string, clients int, pass int) RunRecord {
	scs := b.base.Scenarios()
	return b.runBaselineScenario(ctx, scs[slices.IndexFunc(scs, func(sc baseline.Scenario) bool { return sc.Name == name })], clients, pass)
}

// runBaselineScenario runs the baseline sc and records it.
func (b *bench) runBaselineScenario(ctx context.Context, sc baseline.Scenario, clients int, pass int) RunRecord {
	rec := RunRecord{Scenario: sc.Name, Kind: "baseline", Phase: "measure", Clients: clients, Desc: sc.Desc}
	if b.cfg.passes > 1 {
		rec.Pass = pass
	}
	out := b.measure(ctx, &rec, load.Options{Clients: clients, Warmup: b.cfg.warmup, Duration: b.cfg.duration}, sc.Op,
		b.cfg.pid, baseline.ApplicationName, nil)
	write := slices.Contains([]string{baseline.InsertOne, baseline.InsertPending, baseline.Insert100, baseline.UpdateByID}, sc.Name)
	return b.record(ctx, rec, out, write, baseline.ApplicationName, 0)
}

func (b *bench) progress(r RunRecord) {
	fmt.Fprintf(b.log, "%-8s %-13s %-20s %4d clients  %9.1f req/s  p50 %7.2fms  p99 %8.2fms  max %8.2fms  errors %d  cpu svc/tool %s\n",
		r.Phase, r.Kind, r.Scenario, r.Clients, r.RequestsPerSec, r.P50Ms, r.P99Ms, r.MaxMs, r.ErrorCount, cpuCol(&r))
	if r.OutboxQueued > 0 {
		state := "sent"
		if !r.OutboxDrained {
			state = fmt.Sprintf("NOT all sent (%d left)", r.OutboxLeft)
		}
		fmt.Fprintf(b.log, "         %d confirmation emails queued: %s %.1fs after the run\n", r.OutboxQueued, state, r.DrainSeconds)
	}
	if r.Conns > 0 {
		fmt.Fprintf(b.log, "         %d database connections on %d distinct counter slots\n", r.Conns, r.CounterSlots)
	}
	for k, d := range r.ErrorDetails {
		fmt.Fprintf(b.log, "         %s: %.200s\n", k, d)
	}
}

// scale seeds the newsletter up to cfg.scaleTo subscribers and measures the first page again.
func (b *bench) scale(ctx context.Context) error {
	total, err := b.client.Total(ctx)
	if err != nil {
		return err
	}
	if more := b.cfg.scaleTo - int(total); more > 0 {
		if err := b.seed(ctx, more); err != nil {
			return err
		}
	}
	if err := b.vacuumTables(ctx); err != nil {
		return err
	}
	total, err = b.client.Total(ctx)
	if err != nil {
		return err
	}
	b.rep.Scale = &ScaleRecord{Subscribers: total}
	var small *RunRecord
	if r := b.rep.find("service", svc.ListFirst, "measure", b.cfg.clients); r != nil {
		c := *r // b.rep.Runs grows below
		small = &c
	}
	big := b.runService(ctx, svc.ListFirst, b.cfg.clients, b.cfg.warmup, b.cfg.duration, "scale", 0)
	if b.base != nil {
		b.runBaseline(ctx, baseline.Page, b.cfg.clients, 0)
		b.rep.Runs[len(b.rep.Runs)-1].Phase = "scale"
	}
	if small != nil {
		b.rep.Scale.P50Ratio = big.P50Ms / small.P50Ms
		b.rep.Scale.P99Ratio = big.P99Ms / small.P99Ms
		b.rep.Scale.RateRatio = big.RequestsPerSec / small.RequestsPerSec
	}
	b.rss("scale", true)
	return nil
}

// vacuumTables runs VACUUM ANALYZE on the tables the scenarios read, so that planner
// statistics and the visibility map reflect the seeded table from the first scenario on,
// instead of changing whenever autovacuum gets to them during the run.
func (b *bench) vacuumTables(ctx context.Context) error {
	if !b.cfg.vacuum || b.db == nil {
		return nil
	}
	t0 := time.Now()
	for _, t := range []string{"subscribers", "subscriber_counts", "email_outbox"} {
		if _, err := b.db.ExecContext(ctx, "VACUUM ANALYZE "+t); err != nil {
			return fmt.Errorf("VACUUM ANALYZE %s: %w", t, err)
		}
	}
	b.rep.Meta.Vacuumed = true
	fmt.Fprintf(b.log, "VACUUM ANALYZE took %.1fs\n", time.Since(t0).Seconds())
	return nil
}

// counterSlots counts app's connections to the database, and the distinct subscriber_counts
// slots they write first (pg_backend_pid() % 16): few distinct slots would cap write
// concurrency, which recording them rules out (or in) when write figures differ between runs.
// With pid, only that process's connections count (matched by their local ports), not those
// of other instances with the same application name.
func (b *bench) counterSlots(ctx context.Context, app string, pid int) (conns, slots int) {
	if b.db == nil {
		return 0, 0
	}
	const query = `SELECT count(*), count(DISTINCT pid % 16) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = ? AND backend_type = 'client backend'`
	if pid > 0 {
		if ports, err := tcpPorts(pid); err == nil && len(ports) > 0 {
			_ = b.db.NewRaw(query+" AND client_port IN (?)", app, bun.List(ports)).Scan(ctx, &conns, &slots)
			if conns > 0 {
				return conns, slots
			}
			// None matched: a connection over a Unix socket has no port. Count them all.
		}
	}
	_ = b.db.NewRaw(query, app).Scan(ctx, &conns, &slots)
	return conns, slots
}

// drainOutbox waits, up to -drain-timeout, until the email outbox has no pending email left,
// and records how many there were and how long the worker took, so that the next scenario is
// not charged with sending them.
func (b *bench) drainOutbox(ctx context.Context, rec *RunRecord) {
	if b.db == nil || b.cfg.drain <= 0 {
		return
	}
	t0 := time.Now()
	n, left, err := b.waitDrained(ctx, "email_outbox")
	if err != nil || n == 0 {
		return
	}
	rec.OutboxQueued = n
	rec.DrainSeconds = time.Since(t0).Seconds()
	rec.OutboxLeft = left
	rec.OutboxDrained = left == 0
}

// waitDrained waits until table (email_outbox or webhook_deliveries) holds no pending row, or
// -drain-timeout has passed, and returns how many it held at first and at the end.
func (b *bench) waitDrained(ctx context.Context, table string) (first, left int, err error) {
	pending := func() (int, error) {
		var n int
		err := b.db.NewRaw("SELECT count(*) FROM ? WHERE state = 'pending'", bun.Ident(table)).Scan(ctx, &n)
		return n, err
	}
	t0 := time.Now()
	if first, err = pending(); err != nil {
		return 0, 0, err
	}
	left = first
	for left > 0 && time.Since(t0) < b.cfg.drain && ctx.Err() == nil {
		time.Sleep(200 * time.Millisecond)
		if left, err = pending(); err != nil {
			return first, left, err
		}
	}
	return first, left, nil
}
