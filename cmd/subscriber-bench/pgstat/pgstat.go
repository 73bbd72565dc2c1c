// Package pgstat measures where PostgreSQL's time goes during one run of a benchmark scenario:
// the statements it executed per request and their mean execution time (pg_stat_statements),
// the WAL it wrote per request (pg_current_wal_lsn), and what its backends were waiting on
// (pg_stat_activity, sampled), lock waits among them.
//
// pg_stat_statements needs the server to load it at start (shared_preload_libraries). On a
// server that does not, the statements are not measured and Probe.Note says so; the WAL and
// the wait events are measured on every server.
package pgstat

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/driver/pgdriver"
)

// ApplicationName is what the probe's own connection calls itself in pg_stat_activity.
const ApplicationName = "subscriber-bench-pgstat"

// DefaultInterval is how often pg_stat_activity is sampled during a window: often enough for
// a few hundred samples in a 6 s run, rarely enough that the sampling's own queries cost the
// server well under 1 % of a core.
const DefaultInterval = 20 * time.Millisecond

// Probe reads the statistics of one database.
type Probe struct {
	db         *bun.DB
	Statements bool          // pg_stat_statements can be read on this server
	Note       string        // what is not measured, and why; empty when everything is
	Interval   time.Duration // the sampling period of pg_stat_activity
}

// Open connects to the database at dsn (a PostgreSQL URL) with one connection of its own and
// finds out whether pg_stat_statements is there, creating the extension in the database if
// the server has the library loaded.
func Open(ctx context.Context, dsn string) (*Probe, error) {
	db, err := open(ctx, dsn, ApplicationName)
	if err != nil {
		return nil, err
	}
	p := &Probe{db: db, Interval: DefaultInterval}
	var preload string
	_ = db.NewRaw("SELECT current_setting('shared_preload_libraries')").Scan(ctx, &preload)
	if !strings.Contains(preload, "pg_stat_statements") {
		p.Note = "pg_stat_statements is not loaded by this server (shared_preload_libraries): statements per request are not measured"
		return p, nil
	}
	if _, err := db.ExecContext(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		p.Note = "pg_stat_statements could not be created in the database (" + err.Error() + "): statements per request are not measured"
		return p, nil
	}
	p.Statements = true
	return p, nil
}

// open connects to dsn as app, with at most two connections: the sampler's and a snapshot's.
func open(ctx context.Context, dsn, app string) (*bun.DB, error) {
	sqldb := sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(dsn), pgdriver.WithApplicationName(app)))
	sqldb.SetMaxOpenConns(2)
	db := bun.NewDB(sqldb, pgdialect.New())
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("pgstat: %w", err)
	}
	return db, nil
}

func (p *Probe) Close() error { return p.db.Close() }

// StatementStat is one statement's cumulative counters in pg_stat_statements.
type StatementStat struct {
	QueryID     int64   `bun:"queryid"`
	Query       string  `bun:"query"`
	Calls       int64   `bun:"calls"`
	ExecMs      float64 `bun:"total_exec_time"`
	PlanMs      float64 `bun:"total_plan_time"`
	Rows        int64   `bun:"rows"`
	WALBytes    int64   `bun:"wal_bytes"`
	SharedHit   int64   `bun:"shared_blks_hit"`
	SharedRead  int64   `bun:"shared_blks_read"`
	SharedDirty int64   `bun:"shared_blks_dirtied"`
}

// Sample is one reading of pg_stat_activity: how many of the watched backends were active
// and what each waited on ("CPU" when it waited on nothing).
type Sample map[string]int

// Window is one measured stretch: the counters at its start and the samples taken since.
type Window struct {
	p       *Probe
	app     string
	start   time.Time
	stmts   map[int64]StatementStat
	lsn     string
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	samples []Sample
	errs    int
}

// Start snapshots the counters and starts sampling the active backends whose
// application_name is app in the probe's database.
func (p *Probe) Start(ctx context.Context, app string) (*Window, error) {
	w := &Window{p: p, app: app, start: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	var err error
	if w.stmts, err = p.statements(ctx); err != nil {
		return nil, err
	}
	if err := p.db.NewRaw("SELECT pg_current_wal_lsn()::text").Scan(ctx, &w.lsn); err != nil {
		return nil, fmt.Errorf("pgstat: WAL position: %w", err)
	}
	go w.sample(ctx)
	return w, nil
}

// activityQuery lists what each active backend of the database with the given
// application_name waits on.
const activityQuery = `SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') FROM pg_stat_activity
WHERE datname = current_database() AND application_name = ? AND state = 'active' AND pid <> pg_backend_pid()`

func (w *Window) sample(ctx context.Context) {
	defer close(w.done)
	t := time.NewTicker(w.p.Interval)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var events []string
		err := w.p.db.NewRaw(activityQuery, w.app).Scan(ctx, &events)
		w.mu.Lock()
		if err != nil {
			w.errs++
		} else {
			s := Sample{}
			for _, e := range events {
				s[e]++
			}
			w.samples = append(w.samples, s)
		}
		w.mu.Unlock()
	}
}

// Stop ends the window and works out where the time went over its requests.
func (w *Window) Stop(ctx context.Context, requests int64) (*Where, error) {
	close(w.stop)
	<-w.done
	elapsed := time.Since(w.start)
	var walBytes int64
	if err := w.p.db.NewRaw("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), ?::pg_lsn)::bigint", w.lsn).Scan(ctx, &walBytes); err != nil {
		return nil, fmt.Errorf("pgstat: WAL position: %w", err)
	}
	after, err := w.p.statements(ctx)
	if err != nil {
		return nil, err
	}
	wh := &Where{Requests: requests, Seconds: elapsed.Seconds(), ClusterWALBytes: walBytes, Note: w.p.Note}
	if w.p.Statements {
		wh.addStatements(Delta(w.stmts, after), requests)
	}
	w.mu.Lock()
	wh.addWaits(w.samples, w.p.Interval, requests)
	wh.SampleErrors = w.errs
	w.mu.Unlock()
	if requests > 0 {
		wh.ClusterWALPerRequest = float64(walBytes) / float64(requests)
	}
	return wh, nil
}

// statements reads pg_stat_statements for the probe's database, by queryid; nil without it.
func (p *Probe) statements(ctx context.Context) (map[int64]StatementStat, error) {
	if !p.Statements {
		return nil, nil
	}
	var rows []StatementStat
	err := p.db.NewRaw(`SELECT queryid, query, calls, total_exec_time, total_plan_time, rows, wal_bytes::bigint AS wal_bytes,
    shared_blks_hit, shared_blks_read, shared_blks_dirtied
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND toplevel`).Scan(ctx, &rows)
	if err != nil {
		return nil, fmt.Errorf("pgstat: pg_stat_statements: %w", err)
	}
	m := make(map[int64]StatementStat, len(rows))
	for _, r := range rows {
		m[r.QueryID] = r
	}
	return m, nil
}

// Delta returns, for every statement that ran between the two snapshots, what it did in
// between. A statement first seen in after counts whole. The probe's own reads are left out.
func Delta(before, after map[int64]StatementStat) []StatementStat {
	var out []StatementStat
	for id, a := range after {
		if own(a.Query) {
			continue
		}
		b := before[id]
		d := StatementStat{
			QueryID: id, Query: a.Query,
			Calls: a.Calls - b.Calls, ExecMs: a.ExecMs - b.ExecMs, PlanMs: a.PlanMs - b.PlanMs,
			Rows: a.Rows - b.Rows, WALBytes: a.WALBytes - b.WALBytes,
			SharedHit: a.SharedHit - b.SharedHit, SharedRead: a.SharedRead - b.SharedRead,
			SharedDirty: a.SharedDirty - b.SharedDirty,
		}
		if d.Calls > 0 {
			out = append(out, d)
		}
	}
	// Most execution time first; ties (rare) by id, so the order is stable.
	sort.Slice(out, func(i, j int) bool {
		if out[i].ExecMs != out[j].ExecMs {
			return out[i].ExecMs > out[j].ExecMs
		}
		return out[i].QueryID < out[j].QueryID
	})
	return out
}

// own tells whether a statement is one of this package's reads.
func own(query string) bool {
	for _, s := range []string{"pg_stat_statements", "pg_stat_activity", "pg_current_wal_lsn", "shared_preload_libraries"} {
		if strings.Contains(query, s) {
			return true
		}
	}
	return false
}

// Where is where PostgreSQL's time went during a window, per request of the scenario.
type Where struct {
	Requests int64   `json:"requests"`
	Seconds  float64 `json:"seconds"`
	// Note says what was not measured.
	Note string `json:"note,omitempty"`

	// From pg_stat_statements (zero without it): statements executed per request (top-level,
	// this database, every connection: the service's workers too), their execution and
	// planning time per request, and the WAL they wrote per request.
	StatementsPerRequest float64     `json:"statements_per_request,omitempty"`
	ExecMsPerRequest     float64     `json:"exec_ms_per_request,omitempty"`
	PlanMsPerRequest     float64     `json:"plan_ms_per_request,omitempty"`
	WALPerRequest        float64     `json:"wal_bytes_per_request,omitempty"`
	Statements           []Statement `json:"statements,omitempty"`

	// ClusterWALBytes is the WAL the whole server wrote in the window (pg_current_wal_lsn):
	// every database's, and commit records, which no statement counts.
	ClusterWALBytes      int64   `json:"cluster_wal_bytes"`
	ClusterWALPerRequest float64 `json:"cluster_wal_bytes_per_request"`

	// Samples of pg_stat_activity taken, and worked out from them: how many backends were
	// active on average, and their time per request on each wait event.
	Samples        int     `json:"samples"`
	SampleErrors   int     `json:"sample_errors,omitempty"`
	ActiveBackends float64 `json:"active_backends"`
	Waits          []Wait  `json:"waits,omitempty"`
	// LockWaitUsPerRequest is the part of Waits on heavyweight locks (wait_event_type Lock:
	// rows, transactions, relations) and LWLocks.
	LockWaitUsPerRequest   float64 `json:"lock_wait_us_per_request"`
	LWLockWaitUsPerRequest float64 `json:"lwlock_wait_us_per_request"`
}

// Statement is one statement's share of a window.
type Statement struct {
	Query           string  `json:"query"`
	CallsPerRequest float64 `json:"calls_per_request"`
	MeanExecMs      float64 `json:"mean_exec_ms"`
	MeanPlanMs      float64 `json:"mean_plan_ms,omitempty"`
	WALPerCall      float64 `json:"wal_bytes_per_call"`
	RowsPerCall     float64 `json:"rows_per_call"`
	BlocksPerCall   float64 `json:"shared_blocks_per_call"`
}

// Wait is the time per request the watched backends spent on one wait event ("CPU": running
// or waiting for a core, no event), as sampled.
type Wait struct {
	Event        string  `json:"event"`
	UsPerRequest float64 `json:"us_per_request"`
	Share        float64 `json:"share"` // of all sampled backend time
}

// MaxStatements is how many statements a Where lists (the ones with most execution time).
const MaxStatements = 8

func (w *Where) addStatements(d []StatementStat, requests int64) {
	if requests <= 0 {
		return
	}
	r := float64(requests)
	for _, s := range d {
		w.StatementsPerRequest += float64(s.Calls) / r
		w.ExecMsPerRequest += s.ExecMs / r
		w.PlanMsPerRequest += s.PlanMs / r
		w.WALPerRequest += float64(s.WALBytes) / r
		if len(w.Statements) == MaxStatements {
			continue
		}
		c := float64(s.Calls)
		w.Statements = append(w.Statements, Statement{
			Query: Shorten(s.Query, 120), CallsPerRequest: c / r, MeanExecMs: s.ExecMs / c, MeanPlanMs: s.PlanMs / c,
			WALPerCall: float64(s.WALBytes) / c, RowsPerCall: float64(s.Rows) / c,
			BlocksPerCall: float64(s.SharedHit+s.SharedRead) / c,
		})
	}
}

// addWaits turns samples taken every interval into time per request on each wait event: a
// backend seen in a sample stands for interval of backend time.
func (w *Where) addWaits(samples []Sample, interval time.Duration, requests int64) {
	w.Samples = len(samples)
	if len(samples) == 0 {
		return
	}
	counts := map[string]int{}
	total := 0
	for _, s := range samples {
		for e, n := range s {
			counts[e] += n
			total += n
		}
	}
	w.ActiveBackends = float64(total) / float64(len(samples))
	if requests <= 0 || total == 0 {
		return
	}
	us := float64(interval) / float64(time.Microsecond)
	for e, n := range counts {
		per := float64(n) * us / float64(requests)
		w.Waits = append(w.Waits, Wait{Event: e, UsPerRequest: per, Share: float64(n) / float64(total)})
		switch {
		case strings.HasPrefix(e, "Lock:"):
			w.LockWaitUsPerRequest += per
		case strings.HasPrefix(e, "LWLock:"):
			w.LWLockWaitUsPerRequest += per
		}
	}
	sort.Slice(w.Waits, func(i, j int) bool {
		if w.Waits[i].UsPerRequest != w.Waits[j].UsPerRequest {
			return w.Waits[i].UsPerRequest > w.Waits[j].UsPerRequest
		}
		return w.Waits[i].Event < w.Waits[j].Event
	})
}

// Shorten puts a statement's text on one line, its runs of white space made one space, and
// cuts it to at most n runes.
func Shorten(q string, n int) string {
	q = strings.Join(strings.Fields(q), " ")
	r := []rune(q)
	if len(r) <= n {
		return q
	}
	return string(r[:n-1]) + "…"
}
