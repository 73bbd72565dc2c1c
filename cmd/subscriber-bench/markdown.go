package main

import (
	"bytes"
	"cmp"
	_ "embed"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strings"

	"github.com/prometheus/procfs"
)

// machine describes the host: CPU model, CPU count and memory, from /proc.
func machine() string {
	model, mem := "", ""
	if fs, err := procfs.NewDefaultFS(); err == nil {
		if cpus, err := fs.CPUInfo(); err == nil && len(cpus) > 0 {
			model = cpus[0].ModelName
		}
		if mi, err := fs.Meminfo(); err == nil && mi.MemTotal != nil {
			mem = fmt.Sprintf("%.0f GiB", float64(*mi.MemTotal)/(1<<20))
		}
	}
	return strings.TrimSpace(fmt.Sprintf("%s, %d CPUs, %s", model, runtime.NumCPU(), mem))
}

// writeMarkdown writes the report as a Markdown document: machine, versions, command, the
// table of scenarios with their baselines and ratios, the checks, peak RSS and problems.
func writeMarkdown(path string, rep *Report) error {
	var buf bytes.Buffer
	printReport(&buf, rep)
	buf.WriteString(method)
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// printReport writes the report in Markdown, without the method: what -markdown writes and
// what the tool prints when it ends.
func printReport(w io.Writer, rep *Report) {
	m := rep.Meta
	// The run id and the service's commit go into the commit message that adds the report
	// (they are in the JSON report too), not into the document users read.
	fmt.Fprintf(w, "# Benchmarks\n\nMeasured on %s.\n\n", m.StartedAt)
	fmt.Fprintf(w, "- Machine: %s\n- %s; %s\n", m.Machine, m.GoVersion, firstWords(m.PostgresVersion, 2))
	if m.Command != "" {
		fmt.Fprintf(w, "- Command: `%s`\n", m.Command)
	}
	fmt.Fprintf(w, "- %d subscribers in the newsletter when measuring began; %d clients, %s per scenario after a %s warm-up",
		m.SubscribersAtStart, m.Clients, m.Duration, m.Warmup)
	if m.Passes > 1 {
		fmt.Fprintf(w, ", median of %d passes", m.Passes)
	}
	fmt.Fprintf(w, "; checks at %v clients for %s each.\n", m.CheckClients, m.CheckDuration)
	for _, s := range rep.Seeds {
		fmt.Fprintf(w, "- Seeded %d subscribers through the bulk API in %.1f s (%.0f rows/s).\n", s.Rows, s.Seconds, s.RowsPerSec)
	}
	fmt.Fprintln(w, "\nThe baseline is the naive SQL a correct implementation must run, sent through the same driver "+
		"(bun + pgdriver) at the same concurrency against the same database in the same run. Latencies in ms.")

	fmt.Fprintln(w, "\n| scenario | req/s | rows/s | p50 | p90 | p99 | max | errors | baseline | req/s | rows/s | p50 | p99 | ratio | target | verdict |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|---|---|--:|--:|--:|--:|--:|---|---|")
	for _, p := range plan {
		s := rep.find("service", p.service, "measure", m.Clients)
		if s == nil {
			continue
		}
		left := fmt.Sprintf("| %s | %s | %s | %s | %s | %s | %s | %s ", s.Scenario, f1(s.RequestsPerSec), rowsCol(s),
			f2(s.P50Ms), f2(s.P90Ms), f2(s.P99Ms), f2(s.MaxMs), errs(s))
		first := true
		for _, c := range rep.Comparisons {
			if c.Service != p.service || c.alternated() { // alternating pairs: their own table
				continue
			}
			b := rep.find("baseline", c.Baseline, "measure", m.Clients)
			if b == nil { // a target against another service scenario (API 1.1)
				b = rep.find("service", c.Baseline, "measure", m.Clients)
			}
			if !first {
				left = "| | | | | | | | "
			}
			first = false
			verdict := ""
			if c.Met != nil {
				verdict = metWord(*c.Met)
			}
			rt := f2(c.Ratio)
			if c.Metric == "rows/s" {
				rt += " (rows)"
			}
			fmt.Fprintf(w, "%s| %s | %s | %s | %s | %s | %s | %s | %s |\n", left, c.Baseline, f1(b.RequestsPerSec), rowsCol(b),
				f2(b.P50Ms), f2(b.P99Ms), rt, c.Target, verdict)
		}
		if first { // no comparison in this table: the scenario's own figures alone
			fmt.Fprintf(w, "%s| | | | | | | | |\n", left)
		}
	}

	if paired := rep.pairedComparisons(); len(paired) > 0 {
		fmt.Fprintln(w, "\nAgainst the service's own scenarios: in every pass, each pair also ran in alternating slices "+
			"(a b b a …), each for the scenario's time, so that a slow spell of the machine falls on both; "+
			"the ratio is the median of the passes' ratios.")
		fmt.Fprintln(w, "\n| scenario | req/s | against | req/s | ratio | per pass | target | verdict |")
		fmt.Fprintln(w, "|---|--:|---|--:|--:|--:|---|---|")
		for _, c := range paired {
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", c.Service, f1(c.Value), c.Baseline, f1(c.Base), f2(c.Ratio),
				list(c.PassRatios, f2), c.Target, metWord(c.Met != nil && *c.Met))
		}
	}

	if names, runs := measured(rep); len(runs) > 0 {
		fmt.Fprintln(w, "\nCPU per request in µs: the service's process, PostgreSQL's server processes and the load generator, "+
			"over each measured window (median pass); a baseline has no service part, the tool sends its SQL itself.")
		fmt.Fprintln(w, "\n| scenario | service | PostgreSQL | load generator | total |")
		fmt.Fprintln(w, "|---|--:|--:|--:|--:|")
		for i, r := range runs {
			service, db, tool, total := cpuSplit(r)
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", names[i], f1(service), f1(db), f1(tool), f1(total))
		}
	}

	whereMarkdown(w, rep)

	cpuTargetsMarkdown(w, rep)

	referenceMarkdown(w, rep)

	if t := rep.Telemetry; t != nil {
		fmt.Fprintf(w, "\nTelemetry on the official OpenTelemetry components, off against on at 100 %% sampling and at the production setting (parentbased_traceidratio 0.1), %d clients, in the same passes, in alternating slices (targets: overhead %s):\n", m.Clients, t.Target)
		fmt.Fprintln(w, "\n| scenario | setting | off req/s | on req/s | overhead | per pass | svc µs/req off → on | target | verdict |")
		fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|---|---|")
		for _, s := range t.Scenarios {
			setting := cmp.Or(s.Setting, settingFull) // rows of older reports are at 100 %
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", s.Scenario, setting, f1(s.OffRPS), f1(s.OnRPS), pct(s.Overhead),
				list(s.PassOverheads, pct), cpuChange(s), s.Target, metWord(s.Met))
		}
		fmt.Fprintf(w, "\n%s.\n", t.describe())
	}

	webhooksMarkdown(w, rep)

	fmt.Fprintln(w, "\nChecks at more clients (no error and no stall required):")
	fmt.Fprintln(w, "\n| scenario | clients | req/s | p50 | p99 | max | errors | longest gap ms |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|---|--:|")
	for _, r := range rep.Runs {
		if r.Phase == "measure" || r.Phase == phasePaired {
			continue
		}
		if r.Phase != "check" {
			r.Scenario += " (" + r.Phase + ")"
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %.0f |\n", r.Scenario, r.Clients, f1(r.RequestsPerSec),
			f2(r.P50Ms), f2(r.P99Ms), f2(r.MaxMs), errs(&r), r.LongestGapMs)
	}
	if len(rep.RSS) > 0 {
		fmt.Fprintf(w, "\nPeak RSS of the service (VmHWM, reset between parts of the run; target ≤ %d MiB at 64 clients):\n\n", rssTargetMiB)
		for _, r := range rep.RSS {
			fmt.Fprintf(w, "- %s: %.1f MiB\n", r.During, r.PeakMiB)
		}
	}
	if im := rep.Import; im != nil {
		fmt.Fprintf(w, "\nImports (§15): %d rows in one CSV upload into the newsletter, timed from the upload's start "+
			"until the import completed; the same run's COPY of the file into a bare table took %.1f s, and one "+
			"INSERT … SELECT of its rows into a bare table shaped as subscribers %.1f s. "+
			"Targets: at most 60 s, peak RSS under 128 MiB.\n\n", im.Rows, im.CopySeconds, im.InsertSelectSeconds)
		fmt.Fprintln(w, "| scenario | rows | seconds | rows/s | upload s | peak RSS MiB |")
		fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|")
		for _, r := range append([]ImportRecord{*im}, rep.ImportVariants...) {
			fmt.Fprintf(w, "| %s%s | %d | %.1f | %.0f | %.1f | %.0f |\n", ImportScenario, variantSuffix(r.Variant),
				r.Rows, r.Seconds, r.RowsPerSec, r.UploadSeconds, r.PeakRSSMiB)
		}
	}
	tagsMarkdown(w, rep)
	bulkMarkdown(w, rep)
	if sc := rep.Scale; sc != nil {
		fmt.Fprintf(w, "\nFirst page at %d subscribers against the measured run: p50 ×%.2f, p99 ×%.2f, req/s ×%.2f (target: p50 ≤ ×1.5).\n",
			sc.Subscribers, sc.P50Ratio, sc.P99Ratio, sc.RateRatio)
	}
	if len(rep.Problems) == 0 {
		fmt.Fprintln(w, "\nNo errors, no stalls, every probed answer on contract.")
	} else {
		fmt.Fprintln(w, "\nProblems:")
		fmt.Fprintln(w)
		for _, p := range rep.Problems {
			fmt.Fprintf(w, "- %s\n", p)
		}
	}
}

// method explains how the figures above are made and read, and what counting (statements,
// system calls, allocations) rather than timing shows about a request's cost; it is part of
// every report, so a fresh run replaces the figures and keeps the method. Earlier runs live
// in git's history.
//
//go:embed method.md
var method string

// referenceMarkdown sets each scenario against the earlier run given with -compare-with: its
// throughput, its ratio to its baseline (each in its own run) and its CPU per request, and the
// peak RSS of both.
func referenceMarkdown(w io.Writer, rep *Report) {
	ref := rep.Reference
	if ref == nil || len(ref.Ratios) == 0 {
		return
	}
	fmt.Fprintf(w, "\nBefore and after: the run of %s (`%s`, `--compare-with %s`) against this run. "+
		"Ratios are each run's own, to its baseline; CPU per request in µs, before → after.",
		orDash(ref.StartedAt), orDash(ref.Command), ref.Path)
	if strings.Contains(ref.Command, "--no-telemetry") != strings.Contains(rep.Meta.Command, "--no-telemetry") {
		fmt.Fprint(w, " Only one of the two ran the telemetry comparison, which keeps three more instances of the service, idle, "+
			"on the same database: where their workers cost the database something, compare the ratios rather than the throughput.")
	}
	if speed := ref.machineSpeed(); speed > 0 && (speed < 0.8 || speed > 1.25) {
		fmt.Fprintf(w, " The same SQL (the baselines, on the same data) ran at %.2f × its rate in the before run: the machine was %s, "+
			"so compare the ratios, not the rates or the CPU per request.", speed, map[bool]string{true: "slower", false: "faster"}[speed < 1])
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "\n| scenario | req/s before | req/s after | p50 × | p99 × | ratio before | ratio after | service µs | PostgreSQL µs | load generator µs |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	arrow := func(then, now float64) string { return f1(then) + " → " + f1(now) }
	ratio := func(v float64) string {
		if v == 0 {
			return "-"
		}
		return f2(v)
	}
	for _, r := range ref.Ratios {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.Scenario, f1(r.Then), f1(r.Now), f2(r.P50Ratio), f2(r.P99Ratio), ratio(r.ThenBase), ratio(r.NowBase),
			arrow(r.ThenCPU.Service, r.NowCPU.Service), arrow(r.ThenCPU.Postgres, r.NowCPU.Postgres), arrow(r.ThenCPU.Tool, r.NowCPU.Tool))
	}
	var rss []string
	for _, now := range rep.RSS {
		for _, then := range ref.RSS {
			if then.During == now.During {
				rss = append(rss, fmt.Sprintf("%s %.1f → %.1f MiB", now.During, then.PeakMiB, now.PeakMiB))
			}
		}
	}
	if len(rss) > 0 {
		fmt.Fprintf(w, "\nPeak RSS before → after: %s.\n", strings.Join(rss, "; "))
	}
}

// machineSpeed is the median, over the scenarios with a baseline in both runs, of the baseline's
// throughput now over then (a scenario's rate over its ratio to its baseline): how fast this
// run's machine ran the same SQL as the reference's. 0 when no scenario has both.
func (ref *Reference) machineSpeed() float64 {
	var speeds []float64
	for _, r := range ref.Ratios {
		if r.NowBase > 0 && r.ThenBase > 0 && r.Then > 0 {
			speeds = append(speeds, (r.Now/r.NowBase)/(r.Then/r.ThenBase))
		}
	}
	if len(speeds) == 0 {
		return 0
	}
	return median(speeds)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// webhooksMarkdown writes the writes measured with one webhook endpoint, its deliveries only
// queued and delivered meanwhile, each against the same writes without one in the same passes,
// and the delivery throughput (webhooks.go), when the run measured them.
func webhooksMarkdown(w io.Writer, rep *Report) {
	var rows []string
	pairs := false // a queued ratio is of alternating runs
	for _, name := range webhookScenarios {
		with, plain, ratio, perPass := rep.webhookRatio(name, webhookSuffix)
		if with == nil {
			continue
		}
		queuedRows, queuedRatio, queuedCPU := "-", "-", ""
		if queued, _, r, pp := rep.webhookRatio(name, webhookQueuedSuffix); queued != nil {
			queuedRows, queuedRatio, queuedCPU = f1(queued.RowsPerSec), webhookVerdict(r, pp), cpuTriple(queued)+" → "
			// Judged on the alternating runs when there are some (see runQueuedPair).
			if _, _, r, pp := rep.queuedPairRatio(name); pp != "" {
				queuedRatio, pairs = webhookVerdict(r, pp)+" alt.", true
			}
		}
		rows = append(rows, fmt.Sprintf("| %s | %s | %s | %s | %s | %s | %s → %s%s |", name, f1(plain.RowsPerSec),
			queuedRows, queuedRatio, f1(with.RowsPerSec), webhookVerdict(ratio, perPass), cpuTriple(plain), queuedCPU, cpuTriple(with)))
	}
	d := rep.find("service", WebhookDelivery, "measure", 1)
	if len(rows) == 0 && d == nil {
		return
	}
	fmt.Fprintf(w, "\nWrites with one enabled webhook endpoint subscribed to every event, against the same writes without, %d clients (rows/s). "+
		"In each pass each write ran three times back to back on the same tables (in the reverse order in even passes), each run after the previous one's deliveries had drained: "+
		"without the endpoint; with it, its deliveries only **queued** (the writes went to a second instance with `WEBHOOK_WORKERS=0` while the instance that delivers was paused); "+
		"and with it, **delivered** meanwhile by the main instance, on the same 2 cores as the writes and the receiver. "+
		"A ratio is the median over passes of with/without (target ≥ %.2f), the passes' own in brackets. "+
		"CPU is µs per request of the service instance that took the writes, PostgreSQL and the load tool, which serves the receiver too:\n",
		rep.Meta.Clients, webhookRatioTarget)
	if pairs {
		fmt.Fprint(w, "\nA queued ratio marked alt. is of other runs, in the same passes: the queued writes alternated in half-second slices with the same writes "+
			"to a second newsletter with no endpoint, on the same instance and tables while the one that delivers was paused, so that a slow spell of the machine falls on both "+
			"(back to back, a write's ratio moved by as much as 0.3 between passes).\n")
	}
	fmt.Fprintln(w, "\n| scenario | without | queued | ratio | delivered | ratio | CPU µs without → queued → delivered |")
	fmt.Fprintln(w, "|---|--:|--:|---|--:|---|---|")
	for _, r := range rows {
		fmt.Fprintln(w, r)
	}
	if d != nil {
		fmt.Fprintf(w, "\nDelivery to a local receiver answering at once: %d events in %.1f s, %.0f events/s (target ≥ %d: %s).\n",
			d.Requests, d.Seconds, d.RequestsPerSec, deliveryTarget, metWord(d.RequestsPerSec >= deliveryTarget))
	}
}

// metWord is a verdict column's word: met, or missed in bold.
func metWord(met bool) string {
	if met {
		return "met"
	}
	return "**missed**"
}

// webhookVerdict shows a webhook ratio against webhookRatioTarget, with the passes' ratios.
func webhookVerdict(ratio float64, perPass string) string {
	return fmt.Sprintf("%.2f %s (%s)", ratio, metWord(ratio >= webhookRatioTarget), perPass)
}

// webhookRatio pairs, pass by pass, the measured runs of write scenario name with the endpoint
// (suffix webhookSuffix or webhookQueuedSuffix) and without it, and returns the median run of
// each, the median of the passes' ratios and those ratios listed. with is nil when no pass has
// both runs.
func (rep *Report) webhookRatio(name, suffix string) (with, plain *RunRecord, ratio float64, perPass string) {
	return rep.hookRatio(name+suffix, name+webhookOffSuffix, "measure")
}

// queuedPairRatio is webhookRatio of the runs of runQueuedPair: the queued writes against those
// to the newsletter without an endpoint, in the same alternating slices.
func (rep *Report) queuedPairRatio(name string) (with, plain *RunRecord, ratio float64, perPass string) {
	return rep.hookRatio(name+webhookQueuedSuffix, name+webhookPlainSuffix, phasePaired)
}

// hookRatio pairs, pass by pass, the runs of scenario with and scenario without in phase, as
// webhookRatio says.
func (rep *Report) hookRatio(with, without, phase string) (w, wo *RunRecord, ratio float64, perPass string) {
	ws, wos := rep.perPass(runOf("service", with, phase), runOf("service", without, phase), rowsRate)
	var ratios []float64
	var list []string
	for i := range ws {
		if wos[i] > 0 {
			ratios = append(ratios, ws[i]/wos[i])
			list = append(list, fmt.Sprintf("%.2f", ws[i]/wos[i]))
		}
	}
	if len(ratios) == 0 {
		return nil, nil, 0, ""
	}
	return rep.find("service", with, phase, rep.Meta.Clients), rep.find("service", without, phase, rep.Meta.Clients),
		median(ratios), strings.Join(list, ", ")
}

// cpuTriple shows r's CPU per request of the service, PostgreSQL and the tool, "-" for what
// was not measured.
func cpuTriple(r *RunRecord) string {
	var parts []string
	for _, v := range []float64{usPerReq(r.ServiceCPU, r), usPerReq(r.DBCPU, r), usPerReq(r.ToolCPU, r)} {
		if math.IsNaN(v) {
			parts = append(parts, "-")
		} else {
			parts = append(parts, fmt.Sprintf("%.0f", v))
		}
	}
	return strings.Join(parts, " / ")
}

// cpuTargetsMarkdown judges what a request costs against cpuTargets and rss256TargetMiB.
func cpuTargetsMarkdown(w io.Writer, rep *Report) {
	vs := cpuVerdicts(rep)
	if len(vs) == 0 {
		return
	}
	fmt.Fprintln(w, "\nWhat a request costs, against its targets (median pass): the service's own CPU per request, and the "+
		"throughput against the baseline. *By CPU* is the baseline's CPU per request over the scenario's, every process "+
		"counted: with the machine saturated, the throughput ratio comes to about that. *Without the service* leaves the "+
		"service's part out: the most the ratio could be if the service cost nothing, so a ratio target above it cannot "+
		"be met by work on the service.")
	fmt.Fprintln(w, "\n| scenario | service µs | target | verdict | ratio | target | verdict | by CPU | without the service |")
	fmt.Fprintln(w, "|---|--:|---|---|--:|---|---|--:|--:|")
	for _, v := range vs {
		svcTarget, svcVerdict := "", ""
		if v.maxSvcUs > 0 && !math.IsNaN(v.svcUs) {
			svcTarget, svcVerdict = fmt.Sprintf("≤ %.0f", v.maxSvcUs), metWord(v.svcUs <= v.maxSvcUs)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | ≥ %.2f | %s | %s | %s |\n", v.service, f1(v.svcUs), svcTarget, svcVerdict,
			f2(v.ratio), v.minRatio, metWord(v.ratio >= v.minRatio), f2(v.byCPU), f2(v.withoutService))
	}
	for _, v := range vs {
		if v.maxDBTimes > 0 && !math.IsNaN(v.db) && !math.IsNaN(v.baseDB) {
			fmt.Fprintf(w, "\nPostgreSQL's CPU per %s: %.1f µs, %.2f × the baseline's %.1f µs (target ≤ %.1f ×: %s).\n",
				v.service, v.db, v.db/v.baseDB, v.baseDB, v.maxDBTimes, metWord(v.db <= v.maxDBTimes*v.baseDB))
		}
	}
	peak := 0.0
	for _, r := range rep.RSS {
		if strings.HasSuffix(r.During, rss256TargetClient) {
			peak = max(peak, r.PeakMiB)
		}
	}
	if peak > 0 {
		fmt.Fprintf(w, "\nPeak RSS at %s: %.1f MiB (target ≤ %d MiB: %s).\n", rss256TargetClient, peak, rss256TargetMiB,
			metWord(peak <= rss256TargetMiB))
	}
}
