package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/subscriberd/subscriberd/cmd/subscriber-bench/pgstat"
)

// serviceApplicationName is what the service's connections call themselves in
// pg_stat_activity.
const serviceApplicationName = "subscriberd"

// openWhere opens the probe of where PostgreSQL's time goes (-where), on the service's
// database; a failure only leaves the section out.
func (b *bench) openWhere(ctx context.Context) {
	if !b.cfg.where || b.cfg.databaseURL == "" {
		return
	}
	p, err := pgstat.Open(ctx, b.cfg.databaseURL)
	if err != nil {
		fmt.Fprintf(b.log, "warning: where the time goes: %v\n", err)
		return
	}
	b.where = p
	b.rep.Meta.WhereNote = p.Note
	if p.Note != "" {
		fmt.Fprintf(b.log, "note: %s\n", p.Note)
	}
}

// whereStart starts measuring where PostgreSQL's time goes for a measured run of the main
// instance or of the baseline, whose connections are named app; nil without the probe or app.
func (b *bench) whereStart(ctx context.Context, app string) *pgstat.Window {
	if b.where == nil || app == "" {
		return nil
	}
	w, err := b.where.Start(ctx, app)
	if err != nil {
		fmt.Fprintf(b.log, "warning: where the time goes: %v\n", err)
	}
	return w
}

// whereStop ends the window w of a run of requests (nil: not measured).
func (b *bench) whereStop(ctx context.Context, w *pgstat.Window, requests int64) *pgstat.Where {
	if w == nil {
		return nil
	}
	wh, err := w.Stop(ctx, requests)
	if err != nil {
		fmt.Fprintf(b.log, "warning: where the time goes: %v\n", err)
	}
	return wh
}

// whereStatementsShown is how many statements each scenario lists, most execution time first.
const whereStatementsShown = 5

// topWaits names the n wait events with most time per request, with their µs.
func topWaits(w *pgstat.Where, n int) string {
	var parts []string
	for i, wt := range w.Waits {
		if i == n {
			break
		}
		parts = append(parts, fmt.Sprintf("%s %.0f", wt.Event, wt.UsPerRequest))
	}
	return strings.Join(parts, ", ")
}

// statementsCol shows a figure from pg_stat_statements in format, or a dash without it.
func statementsCol(w *pgstat.Where, format string, v float64) string {
	if w.Note != "" && w.StatementsPerRequest == 0 {
		return "-"
	}
	return fmt.Sprintf(format, v)
}

// whereMarkdown writes where PostgreSQL's time went in the measured runs.
func whereMarkdown(w io.Writer, rep *Report) {
	var names []string
	var rows []*pgstat.Where
	all, runs := measured(rep)
	for i, r := range runs {
		if r.Where != nil {
			names, rows = append(names, all[i]), append(rows, r.Where)
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "\n## Where PostgreSQL's time goes\n\nPer request of each measured run: statements PostgreSQL executed and their "+
		"execution and planning time (pg_stat_statements, this database, every connection), the WAL they wrote, the WAL the "+
		"whole server wrote (pg_current_wal_lsn, commit records and other databases included), and the time the scenario's "+
		"connections spent on each wait event, from pg_stat_activity sampled every "+pgstat.DefaultInterval.String()+
		" (µs of backend time; CPU is running or waiting for a core; Lock is row, transaction and table locks).")
	if rep.Meta.WhereNote != "" {
		fmt.Fprintf(w, "\nNot measured in this run: %s.\n", rep.Meta.WhereNote)
	}
	fmt.Fprintln(w, "\n| scenario | statements | exec ms | plan ms | WAL B | server WAL B | lock µs | LWLock µs | backends | top waits (µs) |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|--:|--:|---|")
	for i, x := range rows {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %.0f | %.0f | %.0f | %.1f | %s |\n", names[i],
			statementsCol(x, "%.2f", x.StatementsPerRequest), statementsCol(x, "%.3f", x.ExecMsPerRequest),
			statementsCol(x, "%.3f", x.PlanMsPerRequest), statementsCol(x, "%.0f", x.WALPerRequest), x.ClusterWALPerRequest, x.LockWaitUsPerRequest, x.LWLockWaitUsPerRequest, x.ActiveBackends, topWaits(x, 3))
	}
	for n, x := range rows {
		if len(x.Statements) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s, statements with most execution time:\n\n| calls/req | mean ms | WAL B/call | rows/call | blocks/call | statement |\n|--:|--:|--:|--:|--:|---|\n", names[n])
		for i, s := range x.Statements {
			if i == whereStatementsShown {
				break
			}
			fmt.Fprintf(w, "| %s | %.3f | %.0f | %s | %s | `%s` |\n", f2(s.CallsPerRequest), s.MeanExecMs, s.WALPerCall, f1(s.RowsPerCall), f1(s.BlocksPerCall),
				strings.ReplaceAll(pgstat.Shorten(s.Query, 90), "|", "\\|"))
		}
	}
}
