package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"path/filepath"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/uptrace/bun"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/repo"
	"github.com/subscriberd/subscriberd/telemetry"
)

// shutdownGrace is how long in-flight requests may take to finish after SIGTERM (API.md §7).
const shutdownGrace = 25 * time.Second

// serve runs the service until ctx ends. With dev set (subscriberd dev, or serve --dev) it
// first makes a demo newsletter and API key when the database has no newsletter, and prints
// the key and a curl line to stdout once the API listens.
func serve(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, dev bool) error {
	name := "serve"
	if dev {
		name = "dev"
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	migrateFirst := fs.Bool("migrate", true, "apply pending migrations before serving")
	fs.BoolVar(&dev, "dev", dev, "on a database without newsletters, make a demo newsletter and API key and print them with a curl line")
	resolve := bindSettings(fs, getenv)
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := resolve()
	if err := validateServe(cfg); err != nil {
		return err
	}
	lim, err := parseLimits(cfg)
	if err != nil {
		return err
	}
	// Log lines are batched (one write per request was a system call per request); the
	// buffer is flushed last, after everything below has logged its shutdown.
	logw := telemetry.NewLogBuffer(stderr)
	defer logw.Close()
	log, err := telemetry.NewLogger(logw, cfg["LOG_LEVEL"], cfg["LOG_FORMAT"])
	if err != nil {
		return err
	}
	telemetry.LogErrors(log)
	gogc, memLimit := tuneGC(getenv)
	shutdownTracing, err := telemetry.SetupTracing(ctx, version, getenv)
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

	mailer, err := newMailer(cfg, log)
	if err != nil {
		return err
	}

	db, err := openDB(ctx, cfg, *migrateFirst, log)
	if err != nil {
		return err
	}
	defer db.Close()

	metrics := telemetry.NewMetrics(version)
	if err := metrics.RegisterDB(db.DB); err != nil {
		return err
	}
	limiter, closeLimiter := newLimiter(ctx, lim, log, metrics)
	defer closeLimiter()
	accounts := repo.NewAccounts(db)
	public := api.New(api.Config{
		Store:          repo.NewSubscribers(db),
		Auth:           accounts,
		Logger:         log,
		Metrics:        metrics,
		Limiter:        limiter,
		TrustedProxies: lim.trusted,
		DisableDocs:    cfg["DOCS_UI"] == "off",
	})
	public.HandleConfirmations(repo.NewConfirmations(db))

	// The worker outlives ctx: on SIGTERM it is stopped below, after its current email.
	workerCtx, stopWorker := context.WithCancel(context.WithoutCancel(ctx))
	workerDone := startWorker(workerCtx, db, mailer, metrics, log)
	defer func() {
		stopWorker()
		<-workerDone
	}()

	var draining atomic.Bool
	admin := adminHandler(db, metrics, &draining)

	// One server span per request; server.address is the public name, never the Host header.
	traced := telemetry.NewHTTPHandler(public, serverAddress(cfg["PUBLIC_BASE_URL"]), nil)
	publicSrv := newHTTPServer(cfg["LISTEN_ADDR"], traced, log)
	adminSrv := newHTTPServer(cfg["ADMIN_ADDR"], admin, log)
	publicLn, err := net.Listen("tcp", cfg["LISTEN_ADDR"])
	if err != nil {
		return fmt.Errorf("LISTEN_ADDR: %w", err)
	}
	adminLn, err := net.Listen("tcp", cfg["ADMIN_ADDR"])
	if err != nil {
		publicLn.Close()
		return fmt.Errorf("ADMIN_ADDR: %w", err)
	}
	// The demo key is made only once the listeners are bound, so a start that fails on its
	// addresses does not make (and lose) a key the next start would not print again.
	var demo *devDemo
	if dev {
		if demo, err = devSetup(ctx, accounts); err != nil {
			publicLn.Close()
			adminLn.Close()
			return err
		}
	}
	errc := make(chan error, 2)
	go func() { errc <- publicSrv.Serve(publicLn) }()
	go func() { errc <- adminSrv.Serve(adminLn) }()
	log.Info("serving", "listen_addr", publicLn.Addr().String(), "admin_addr", adminLn.Addr().String(),
		"database", redact(cfg["DATABASE_URL"]), "version", version, "gogc", gogc, "gomemlimit", memLimit)
	if demo != nil {
		demo.print(stdout, publicLn.Addr())
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
	adminSrv.Shutdown(stopCtx) //nolint:errcheck // admin has no long requests
	<-workerDone
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shutdown: %w", err)
	}
	log.Info("stopped")
	return nil
}

func validateServe(cfg config) error {
	if err := resolveDatabase(cfg); err != nil {
		return err
	}
	for _, name := range []string{"LISTEN_ADDR", "ADMIN_ADDR"} {
		if err := validateAddr(name, cfg[name]); err != nil {
			return err
		}
	}
	if v := cfg["DOCS_UI"]; v != "on" && v != "off" {
		return fmt.Errorf("DOCS_UI: %q is not on or off", v)
	}
	return validateURL("PUBLIC_BASE_URL", cfg["PUBLIC_BASE_URL"], "http", "https")
}

// openDB opens the pool and, when migrate is set, creates the database if missing and applies
// pending migrations.
func openDB(ctx context.Context, cfg config, migrate bool, log *slog.Logger) (*bun.DB, error) {
	dsn := cfg["DATABASE_URL"]
	logStore(log, dsn)
	if migrate {
		if err := repo.EnsureDatabase(ctx, dsn); err != nil {
			return nil, dbErr(cfg, err)
		}
	}
	db, err := repo.Open(dsn, repo.Options{})
	if err != nil {
		return nil, dbErr(cfg, err)
	}
	if !migrate {
		return db, nil
	}
	applied, err := repo.Migrate(ctx, db)
	if err != nil {
		db.Close()
		return nil, dbErr(cfg, err)
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
func adminHandler(db *bun.DB, metrics *telemetry.Metrics, draining *atomic.Bool) http.Handler {
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
// create. At 400 it collects a quarter as often; the soft limit keeps the heap, and so the
// RSS, bounded whatever the load. make bench (3 passes), GOGC unset -> 400: bulk of 100
// 0.70 -> 0.85 x baseline, list_first and get up as well; peak RSS 35 -> 68 MiB at 64
// clients (target 100 MiB).
const (
	defaultGOGC       = 400
	defaultGOMEMLIMIT = 80 << 20
)

// tuneGC applies defaultGOGC and defaultGOMEMLIMIT where GOGC and GOMEMLIMIT are unset (the
// runtime has read them already) and returns the settings in force: the GC percentage (-1 =
// off) and the soft memory limit in bytes.
func tuneGC(getenv func(string) string) (gogc int, memLimit int64) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGOGC)
	}
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(defaultGOMEMLIMIT)
	}
	gogc = debug.SetGCPercent(-1)
	debug.SetGCPercent(gogc)
	return gogc, debug.SetMemoryLimit(-1)
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
