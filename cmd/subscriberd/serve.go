package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"path/filepath"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/repo"
	"github.com/subscriberd/subscriberd/telemetry"
)

// shutdownGrace is how long in-flight requests may take to finish after SIGTERM (docs/api-contract.md §7).
// A variable only so that a test can wait less.
var shutdownGrace = 25 * time.Second

// serve runs the service until ctx ends. With dev set (subscriberd dev, or serve --dev) it
// first makes a demo newsletter and API key when the database has no newsletter, and prints
// the key and a curl line to stdout once the API listens.
func serve(ctx context.Context, prog string, args []string, getenv func(string) string, stdout, stderr io.Writer, dev bool) error {
	name := "serve"
	if dev {
		name = "dev"
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	migrateFirst := fs.Bool("migrate", true, "apply pending migrations before serving")
	fs.BoolVar(&dev, "dev", dev, "on a database without newsletters, make a demo newsletter and API key and print them with a curl line")
	loader := bindConfig(fs, getenv)
	if _, err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	var defaults map[string]string
	if dev {
		defaults = devDefaults
	}
	cfg, err := loader.load(defaults)
	if err != nil {
		return err
	}
	lim, err := limitsFrom(cfg)
	if err != nil {
		return err
	}
	hooks := webhooksFrom(cfg)
	// Log lines are batched (one write per request was a system call per request); the
	// buffer is flushed last, after everything below has logged its shutdown.
	logw := telemetry.NewLogBuffer(stderr)
	defer logw.Close()
	log, err := telemetry.NewLogger(logw, cfg.LogLevel.String(), cfg.LogFormat)
	if err != nil {
		return err
	}
	telemetry.LogErrors(log)
	gogc, memLimit := tuneGC(getenv, memlimit.FromCgroup)
	shutdownTracing, err := telemetry.SetupTracing(ctx, version)
	if err != nil {
		return err
	}
	defer func() {
		flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := shutdownTracing(flushCtx); err != nil {
			log.Warn("flushing traces", "error", err)
		}
	}()

	// The listeners are bound first: in dev, PUBLIC_BASE_URL follows the bound address.
	publicLn, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("LISTEN_ADDR: %w", err)
	}
	defer publicLn.Close()
	adminLn, err := net.Listen("tcp", cfg.AdminAddr)
	if err != nil {
		return fmt.Errorf("ADMIN_ADDR: %w", err)
	}
	defer adminLn.Close()
	if dev && !cfg.Explicit("PUBLIC_BASE_URL") {
		if err := cfg.override("PUBLIC_BASE_URL", baseURL(publicLn.Addr())); err != nil {
			return err
		}
	} else {
		warnBaseURLPort(log, cfg.PublicBaseURL, publicLn.Addr())
	}
	log.Info("configuration", "config", cfg)
	var emailOut io.Writer // dev prints each email's link, ready to click
	if dev {
		stdout = &lockedWriter{w: stdout}
		emailOut = stdout
	}
	mailer, err := newMailer(cfg, log, emailOut)
	if err != nil {
		return err
	}

	db, err := openDB(ctx, cfg, *migrateFirst, log)
	if err != nil {
		return err
	}
	defer db.Close()

	metrics := telemetry.NewMetrics(version)
	if err := metrics.RegisterDB(db.DB.DB); err != nil {
		return err
	}
	limiter, closeLimiter := newLimiter(ctx, lim, log, metrics)
	defer closeLimiter()
	accounts := repo.NewAccounts(db)
	// Cursors are signed with a key kept in the database, so that every instance, and the
	// next start, accepts the cursors of the others (docs/api-contract.md §9.2).
	cursorKey, err := repo.Secret(ctx, db, "cursor")
	if err != nil {
		// With --migrate=false on a database nobody migrated, the error would be SQL's
		// 'relation "service_secrets" does not exist'.
		if n, perr := repo.PendingMigrations(ctx, db); perr == nil && n > 0 {
			return fmt.Errorf("the database has %d migrations pending: run %s migrate first, or serve without --migrate=false", n, prog)
		}
		return cfg.dbErr(err)
	}
	// The confirm and decline pages' nonces (docs/api-contract.md §12.1) are signed with a key
	// kept in the database too: a page served by one instance can be posted to another.
	nonceKey, err := repo.Secret(ctx, db, "page_nonce")
	if err != nil {
		return cfg.dbErr(err)
	}
	idem := repo.NewIdempotency(db, cfg.IdempotencyTTL)
	public := api.New(api.Config{
		Idempotency:    api.IdempotencyOf(idem),
		CursorKey:      cursorKey,
		PageNonceKey:   nonceKey,
		Store:          repo.NewSubscribers(db),
		Auth:           accounts,
		Logger:         log,
		Metrics:        metrics,
		Limiter:        limiter,
		TrustedProxies: lim.trusted,
		Events:         repo.NewEvents(db),
		Privacy:        repo.NewPrivacy(db),
		Webhooks:       repo.NewWebhooks(db),
		Suppressions:   repo.NewSuppressions(db),
		Segments:       repo.NewSegments(db),
		WebhookGuard:   hooks.guard,
		DisableDocs:    !cfg.DocsUI,
		Imports:        repo.NewImports(db),
		ImportMaxRows:  cfg.ImportMaxRows,
		ImportMaxBytes: cfg.ImportMaxBytes,
		BulkActions:    repo.NewBulkActions(db),
		// Half the pool's connections (api.BulkConcurrency): 8 on PostgreSQL, 4 on SQLite.
		BulkConcurrency: api.BulkConcurrency(db.DB.Stats().MaxOpenConnections),
		// Three quarters of the pool's connections (api.WriteConcurrency): 12 on PostgreSQL,
		// 6 on SQLite; the rest stays for reads and the workers.
		WriteConcurrency: api.WriteConcurrency(db.DB.Stats().MaxOpenConnections),
		KeyUsage:         accounts,
	})
	public.HandleConfirmations(repo.NewConfirmations(db))

	// The worker outlives ctx: on SIGTERM it is stopped below, after its current email.
	workerCtx, stopWorker := context.WithCancel(context.WithoutCancel(ctx))
	workerDone := startWorker(workerCtx, db, mailer, cfg.EmailWorkers, metrics, log)
	webhooksDone := startWebhookWorker(workerCtx, db, hooks, metrics, log)
	importsDone := startImportWorker(workerCtx, db, cfg.ImportWorkers, metrics, log)
	bulkDone := startBulkActionWorker(workerCtx, db, cfg.BulkActionWorkers, metrics, log)
	defer func() {
		stopWorker()
		<-workerDone
		<-webhooksDone
		<-importsDone
		<-bulkDone
	}()
	// Expired Idempotency-Key records are purged in small batches, apart from the writes.
	purgeDone := make(chan struct{})
	go func() {
		defer close(purgeDone)
		idem.PurgeLoop(workerCtx, time.Minute, func(err error) { log.Warn("purging idempotency keys", "error", err) })
	}()
	defer func() {
		stopWorker()
		<-purgeDone
	}()
	// When each key was last used is written apart from the requests (docs/api-contract.md §16.2).
	usageDone := make(chan struct{})
	go func() {
		defer close(usageDone)
		public.RunKeyUsage(workerCtx, 15*time.Second)
	}()
	defer func() {
		stopWorker()
		<-usageDone
	}()

	var draining atomic.Bool
	admin := adminHandler(db, metrics, &draining)

	// One server span per request; server.address is the public name, never the Host header.
	traced := telemetry.NewHTTPHandler(public, serverAddress(cfg.PublicBaseURL), nil)
	publicSrv := newHTTPServer(cfg.ListenAddr, traced, log)
	adminSrv := newHTTPServer(cfg.AdminAddr, admin, log)
	// The demo key is made only once the listeners are bound, so a start that fails on its
	// addresses does not make (and lose) a key the next start would not print again.
	var demo *devDemo
	if dev {
		if demo, err = devSetup(ctx, accounts); err != nil {
			return err
		}
	}
	errc := make(chan error, 2)
	go func() { errc <- publicSrv.Serve(publicLn) }()
	go func() { errc <- adminSrv.Serve(adminLn) }()
	log.Info("serving", "listen_addr", publicLn.Addr().String(), "admin_addr", adminLn.Addr().String(),
		"database", redact(cfg.DatabaseURL), "version", version, "gogc", gogc, "gomemlimit", memLimit)
	if demo != nil {
		demo.print(stdout, publicLn.Addr(), prog, cfg)
	}

	select {
	case err := <-errc:
		return fmt.Errorf("server stopped: %w", err)
	case <-ctx.Done():
	}
	// Readiness fails first so load balancers stop sending; then in-flight requests finish.
	draining.Store(true)
	log.Info("shutting down", "grace", shutdownGrace.String())
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	stopWorker() // finishes its current email while the servers drain
	err = publicSrv.Shutdown(stopCtx)
	if errors.Is(err, context.DeadlineExceeded) {
		// The grace is over: what is still in flight (a slow upload, say) is cut, and the
		// stop goes on as planned (§7: exit 0).
		log.Warn("shutdown grace over: closing the connections still open", "grace", shutdownGrace.String())
		err = publicSrv.Close()
	}
	adminSrv.Shutdown(stopCtx) //nolint:errcheck // admin has no long requests
	adminSrv.Close()           //nolint:errcheck // and nothing of it outlasts the grace
	<-workerDone
	<-webhooksDone
	<-importsDone
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shutdown: %w", err)
	}
	log.Info("stopped")
	return nil
}

// openDB opens the pool and, when migrate is set, creates the database if missing and applies
// pending migrations.
func openDB(ctx context.Context, cfg *Config, migrate bool, log *slog.Logger) (*repo.DB, error) {
	dsn := cfg.DatabaseURL
	logStore(log, dsn)
	if migrate {
		if err := ensureDatabase(ctx, cfg, log); err != nil {
			return nil, err
		}
	}
	db, err := repo.Open(dsn, repo.Options{})
	if err != nil {
		return nil, cfg.dbErr(err)
	}
	if !migrate {
		return db, nil
	}
	applied, err := repo.Migrate(ctx, db)
	if err != nil {
		db.Close()
		return nil, cfg.dbErr(err)
	}
	if len(applied) > 0 {
		log.Info("applied migrations", "migrations", applied)
	}
	return db, nil
}

// logStore says, in one line, when the store is the embedded SQLite file, and where it is.
func logStore(log *slog.Logger, dsn string) {
	if !repo.IsSQLite(dsn) {
		return
	}
	path, err := repo.SQLitePath(dsn)
	if err != nil {
		return
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	log.Info("using the embedded SQLite database (WAL, busy timeout, foreign keys on); set DATABASE_URL=postgres://… for PostgreSQL",
		"path", path)
}

func newHTTPServer(addr string, h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// adminHandler serves metrics, health and profiles; never on the public listener.
func adminHandler(db *repo.DB, metrics *telemetry.Metrics, draining *atomic.Bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics.Handler())
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok\n") //nolint:errcheck
	})
	ready := func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if draining.Load() {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		if err := db.PingContext(ctx); err != nil {
			http.Error(w, "database unreachable", http.StatusServiceUnavailable)
			return
		}
		if n, err := repo.PendingMigrations(ctx, db); err != nil || n > 0 {
			http.Error(w, "migrations pending", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n") //nolint:errcheck
	}
	mux.HandleFunc("GET /readyz", ready)
	mux.HandleFunc("GET /healthz", ready)
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// The garbage collector's settings when the environment sets none. Go's default (GOGC=100)
// collects each time the heap doubles; this service's live heap is small (a few MiB) and its
// requests allocate a lot per byte kept (a bulk create decodes 100 JSON objects into maps),
// so it collected many times a second and the collector took about 16 % of the CPU of a bulk
// create. At 400 it collects a quarter as often. make bench (3 passes), GOGC unset -> 400:
// bulk of 100 0.70 -> 0.85 x baseline, list_first and get up as well; peak RSS 35 -> 68 MiB
// at 64 clients (target 100 MiB).
//
// The soft memory limit follows the container's: memLimitRatio of the cgroup's memory limit
// (automemlimit reads cgroup v1 and v2), so that near the limit the collector runs more
// often instead of the container being killed. The fifth left over is for what the limit
// does not count: SQLite's page cache (modernc's allocator is outside the Go heap), thread
// stacks, and the heap's overshoot between two collections at GOGC=400.
//
// Without a container limit the soft limit is defaultMemLimit. GOGC=400 lets the heap grow to
// five times what is live plus four times the goroutine stacks, and both grow with the
// clients. The limit caps that growth where it starts to matter and leaves light load alone:
// at 16 clients the heap's goal stays under it. Past it the collector runs more often (the
// runtime spends at most half the CPU on it, then lets the heap grow), so a load whose live
// heap nears the limit pays in CPU, not in memory; an operator who would rather pay in memory
// sets GOMEMLIMIT.
const (
	defaultGOGC     = 400
	memLimitRatio   = 0.8
	defaultMemLimit = 40 << 20
)

// tuneGC applies defaultGOGC where GOGC is unset and, where GOMEMLIMIT is unset (the runtime
// has read both already), a soft limit of memLimitRatio of what limit reports (the cgroup's
// memory limit in serve), or defaultMemLimit when it reports none or cannot be read; it
// returns the settings in force: the GC percentage (-1 = off) and the soft memory limit in
// bytes (math.MaxInt64 = none).
func tuneGC(getenv func(string) string, limit memlimit.Provider) (gogc int, memLimit int64) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGOGC)
	}
	if getenv("GOMEMLIMIT") == "" {
		n, err := memlimit.ApplyFallback(memlimit.ApplyRatio(limit, memLimitRatio), memlimit.Limit(defaultMemLimit))()
		if err == nil && n > 0 && n <= math.MaxInt64 {
			debug.SetMemoryLimit(int64(n))
		}
	}
	gogc = debug.SetGCPercent(-1)
	debug.SetGCPercent(gogc)
	return gogc, debug.SetMemoryLimit(-1)
}

// warnBaseURLPort warns when PUBLIC_BASE_URL points at this machine on another port than the
// API listens on: the links in emails would lead nowhere. A public name on another port is
// normal behind a reverse proxy, so only loopback names and explicit ports are compared.
func warnBaseURLPort(log *slog.Logger, publicBaseURL string, listen net.Addr) {
	u, err := url.Parse(publicBaseURL)
	if err != nil {
		return
	}
	_, listenPort, err := net.SplitHostPort(listen.String())
	if err != nil {
		return
	}
	host := u.Hostname()
	ip := net.ParseIP(host)
	loopback := host == "localhost" || (ip != nil && ip.IsLoopback())
	if !loopback && u.Port() == "" {
		return
	}
	_, port, _ := net.SplitHostPort(serverAddress(publicBaseURL))
	if port != listenPort {
		log.Warn("PUBLIC_BASE_URL and LISTEN_ADDR disagree on the port: links in emails lead elsewhere unless a proxy forwards them",
			"public_base_url", publicBaseURL, "listen_addr", listen.String())
	}
}

// serverAddress is host:port of the public base URL, the fixed server.address and server.port
// of spans (with the scheme's default port, so the client's Host header never supplies one).
func serverAddress(publicBaseURL string) string {
	u, err := url.Parse(publicBaseURL)
	if err != nil || u.Hostname() == "" {
		return telemetry.ServiceName
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(u.Hostname(), port)
}
