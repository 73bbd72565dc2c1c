package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/subscriberd/subscriberd/cmd/subscriber-bench/baseline"
	"github.com/subscriberd/subscriberd/cmd/subscriber-bench/load"
	"github.com/subscriberd/subscriberd/cmd/subscriber-bench/pgstat"
	"github.com/subscriberd/subscriberd/cmd/subscriber-bench/svc"
)

// Report is everything a run measured; it is what -json writes.
type Report struct {
	Meta        Meta         `json:"meta"`
	Seeds       []SeedRecord `json:"seeds,omitempty"`
	Runs        []RunRecord  `json:"runs"`
	Comparisons []Comparison `json:"comparisons"`
	RSS         []RSSRecord  `json:"rss,omitempty"`
	Scale       *ScaleRecord `json:"scale,omitempty"`
	// Telemetry is the telemetry comparison (telemetry.go).
	Telemetry *TelemetryReport `json:"telemetry,omitempty"`
	// Reference sets the measured service scenarios against an earlier report (-compare-with).
	Reference *Reference `json:"reference,omitempty"`
	// Import and ImportVariants are the import scenario and its variants (imports.go); Tags,
	// Bulk and Singles what ran after it (tags.go, bulk.go).
	Import         *ImportRecord  `json:"import,omitempty"`
	ImportVariants []ImportRecord `json:"import_variants,omitempty"`
	Tags           *TagsRecord    `json:"tags,omitempty"`
	Bulk           *BulkRecord    `json:"bulk,omitempty"`
	Singles        []SingleRecord `json:"singles,omitempty"`
	// Problems lists what makes the run a failure: errors, stalls, answers off the contract.
	Problems []string `json:"problems"`
}

// Meta describes the run.
type Meta struct {
	RunID              string `json:"run_id"`
	Label              string `json:"label,omitempty"`
	StartedAt          string `json:"started_at"`
	URL                string `json:"url"`
	Clients            int    `json:"clients"`
	Passes             int    `json:"passes"`
	CheckClients       []int  `json:"check_clients"`
	Duration           string `json:"duration"`
	Warmup             string `json:"warmup"`
	CheckDuration      string `json:"check_duration"`
	Machine            string `json:"machine"`
	Command            string `json:"command,omitempty"`
	GoVersion          string `json:"go_version"`
	NumCPU             int    `json:"num_cpu"`
	GOMAXPROCS         int    `json:"gomaxprocs"`
	PostgresVersion    string `json:"postgres_version,omitempty"`
	Newsletter         string `json:"newsletter,omitempty"`
	SubscribersAtStart int64  `json:"subscribers_at_start"`
	ServicePID         int    `json:"service_pid,omitempty"`
	Vacuumed           bool   `json:"vacuumed"` // VACUUM ANALYZE after seeding
	// WhereNote says what the where-the-time-goes section could not measure on this server.
	WhereNote string `json:"where_note,omitempty"`
}

// SeedRecord is one seeding through the bulk API.
type SeedRecord struct {
	Rows       int     `json:"rows"`
	Seconds    float64 `json:"seconds"`
	RowsPerSec float64 `json:"rows_per_sec"`
}

// RunRecord is one scenario run.
type RunRecord struct {
	Scenario string `json:"scenario"`
	Kind     string `json:"kind"`  // service, baseline, or an instance of the telemetry comparison
	Phase    string `json:"phase"` // measure, paired, check or scale
	Pass     int    `json:"pass,omitempty"`
	Against  string `json:"against,omitempty"` // in phase paired, the scenario it alternated with
	Clients  int    `json:"clients"`
	Desc     string `json:"description"`

	Requests       int64             `json:"requests"`
	OK             int64             `json:"ok"`
	ErrorCount     int64             `json:"error_count"`
	Errors         map[string]int64  `json:"errors,omitempty"`
	ErrorDetails   map[string]string `json:"error_details,omitempty"`
	Seconds        float64           `json:"seconds"`
	RequestsPerSec float64           `json:"requests_per_sec"`
	RowsPerSec     float64           `json:"rows_per_sec"`
	MeanMs         float64           `json:"mean_ms"`
	P50Ms          float64           `json:"p50_ms"`
	P90Ms          float64           `json:"p90_ms"`
	P99Ms          float64           `json:"p99_ms"`
	MaxMs          float64           `json:"max_ms"`
	LongestGapMs   float64           `json:"longest_gap_ms"`
	// The CPU the service process (with -pid), PostgreSQL's processes (see databaseCPU) and
	// this tool used during the measured window, in cores (1.0 = one core busy).
	ServiceCPU float64 `json:"service_cpu_cores,omitempty"`
	DBCPU      float64 `json:"db_cpu_cores,omitempty"`
	ToolCPU    float64 `json:"tool_cpu_cores"`
	// For writes: the writer's database connections and how many distinct backend pid % 16
	// they have, the subscriber_counts slot each tries first (see counterSlots).
	Conns        int `json:"db_conns,omitempty"`
	CounterSlots int `json:"counter_slots,omitempty"`
	// For scenarios that queue confirmation emails: how many were pending after the run,
	// whether the worker sent them all before the next scenario, how many were left, and how
	// long the wait took.
	OutboxQueued  int           `json:"outbox_pending_after_run,omitempty"`
	OutboxDrained bool          `json:"outbox_drained,omitempty"`
	OutboxLeft    int           `json:"outbox_left,omitempty"`
	DrainSeconds  float64       `json:"outbox_drain_seconds,omitempty"`
	Probe         string        `json:"probe_error,omitempty"` // the probed answer was off the contract
	Where         *pgstat.Where `json:"where,omitempty"`       // where PostgreSQL's time went (-where)
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (r *RunRecord) fill(out load.Outcome) {
	s := out.Summary
	r.Requests, r.OK, r.ErrorCount, r.Errors = s.Requests, s.OK, s.ErrorCount(), s.Errors
	if len(out.Details) > 0 {
		r.ErrorDetails = out.Details
	}
	r.Seconds = s.Elapsed.Seconds()
	r.RequestsPerSec, r.RowsPerSec = s.RequestsPerSec, s.RowsPerSec
	r.MeanMs, r.P50Ms, r.P90Ms, r.P99Ms, r.MaxMs = msOf(s.Mean), msOf(s.P50), msOf(s.P90), msOf(s.P99), msOf(s.Max)
	r.LongestGapMs = msOf(s.LongestGap)
}

// Comparison is a service scenario set against a baseline scenario of the same run.
type Comparison struct {
	Service  string  `json:"service"`
	Baseline string  `json:"baseline"`
	Metric   string  `json:"metric"` // requests/s or rows/s
	Value    float64 `json:"service_value"`
	Base     float64 `json:"baseline_value"`
	Ratio    float64 `json:"ratio"`
	Target   string  `json:"target,omitempty"` // the minimum ratio ("": for information)
	Met      *bool   `json:"met,omitempty"`
	// PassRatios are each pass's ratio when the two service scenarios ran in alternating
	// slices (phase paired); Ratio, Value and Base are then the medians.
	PassRatios []float64 `json:"pass_ratios,omitempty"`
}

// alternated tells whether c comes from runs in alternating slices (see pairedRatio).
func (c Comparison) alternated() bool { return len(c.PassRatios) > 0 }

// RSSRecord is the service's peak resident set size during one part of the run.
type RSSRecord struct {
	During  string  `json:"during"`
	PeakMiB float64 `json:"peak_mib"`
}

// ScaleRecord compares the first page at a larger table with the measured run.
type ScaleRecord struct {
	Subscribers int64   `json:"subscribers"`
	P50Ratio    float64 `json:"p50_ratio"`
	P99Ratio    float64 `json:"p99_ratio"`
	RateRatio   float64 `json:"rate_ratio"`
}

// Reference is this run's measured service scenarios set against an earlier report.
type Reference struct {
	Path      string           `json:"path"`
	RunID     string           `json:"run_id"`
	Label     string           `json:"label,omitempty"`
	StartedAt string           `json:"started_at,omitempty"`
	Command   string           `json:"command,omitempty"`
	Ratios    []ReferenceRatio `json:"ratios"`
	RSS       []RSSRecord      `json:"rss,omitempty"` // the reference's
}

// ReferenceRatio is one scenario now against the reference: ratios of throughput (rows/s for
// bulk) and of p50 and p99 latency, and each run's ratio to the scenario's first baseline and
// CPU per request.
type ReferenceRatio struct {
	Scenario  string  `json:"scenario"`
	Now       float64 `json:"requests_per_sec"`
	Then      float64 `json:"reference_requests_per_sec"`
	RateRatio float64 `json:"rate_ratio"`
	P50Ratio  float64 `json:"p50_ratio"`
	P99Ratio  float64 `json:"p99_ratio"`
	NowBase   float64 `json:"baseline_ratio,omitempty"`
	ThenBase  float64 `json:"reference_baseline_ratio,omitempty"`
	NowCPU    CPUus   `json:"cpu_us"`
	ThenCPU   CPUus   `json:"reference_cpu_us"`
}

// CPUus is a scenario's CPU per request in µs: the service's, PostgreSQL's and the load
// generator's, 0 when unknown.
type CPUus struct {
	Service  float64 `json:"service"`
	Postgres float64 `json:"postgres"`
	Tool     float64 `json:"tool"`
}

func cpuUs(r *RunRecord) CPUus {
	z := func(v float64) float64 {
		if math.IsNaN(v) {
			return 0
		}
		return v
	}
	return CPUus{z(usPerReq(r.ServiceCPU, r)), z(usPerReq(r.DBCPU, r)), z(usPerReq(r.ToolCPU, r))}
}

// baseRatio is the ratio of rep's comparison of scenario with its first baseline, 0 when none.
func (rep *Report) baseRatio(scenario string) float64 {
	for _, c := range rep.Comparisons {
		if c.Service == scenario {
			return c.Ratio
		}
	}
	return 0
}

func readJSON(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &rep, nil
}

// compareWith sets rep against the report written earlier at path (-compare-with), if any.
func (rep *Report) compareWith(path string) error {
	if path == "" {
		return nil
	}
	ref, err := readJSON(path)
	if err != nil {
		return fmt.Errorf("-compare-with: %w", err)
	}
	rep.against(ref, path)
	return nil
}

// against fills Reference from ref, an earlier report of the same tool.
func (rep *Report) against(ref *Report, path string) {
	out := &Reference{Path: path, RunID: ref.Meta.RunID, Label: ref.Meta.Label, StartedAt: ref.Meta.StartedAt,
		Command: ref.Meta.Command, RSS: ref.RSS}
	for _, p := range plan {
		now := rep.find("service", p.service, "measure", rep.Meta.Clients)
		then := ref.find("service", p.service, "measure", rep.Meta.Clients)
		if now == nil || then == nil {
			continue
		}
		out.Ratios = append(out.Ratios, ReferenceRatio{Scenario: p.service, Now: now.RequestsPerSec, Then: then.RequestsPerSec,
			RateRatio: load.Ratio(now.RequestsPerSec, then.RequestsPerSec), P50Ratio: load.Ratio(now.P50Ms, then.P50Ms), P99Ratio: load.Ratio(now.P99Ms, then.P99Ms),
			NowBase: rep.baseRatio(p.service), ThenBase: ref.baseRatio(p.service), NowCPU: cpuUs(now), ThenCPU: cpuUs(then)})
	}
	rep.Reference = out
}

// target is one of the ratio targets.
type target struct {
	service, baseline string
	vsService         bool    // baseline names a service scenario, not a raw-SQL baseline
	rows              bool    // compare rows/s instead of requests/s
	min               float64 // 0 = shown for information
	strict            bool    // the ratio must exceed min

	// paired: the two service scenarios also run in alternating slices (runServicePair), and
	// the verdict is on those runs. Only for two scenarios of like latency: the calls of a
	// slow one that start near the end of its slice run on into the other's, which then
	// starts late; against a deep page (40 ms a call against 4) that cost the fast one 3 %.
	paired bool
}

var targets = []target{
	{service: svc.CreateActive, baseline: baseline.InsertOne, min: 0.5},
	{service: svc.CreatePending, baseline: baseline.InsertPending, min: 0.5},
	{service: svc.Bulk100, baseline: baseline.Insert100, rows: true, min: 0.7},
	{service: svc.ListFirst, baseline: baseline.Page, min: 0.25},
	{service: svc.ListFirst, baseline: baseline.PageCount},
	{service: svc.ListDeep, baseline: baseline.PageDeep, min: 1, strict: true},
	{service: svc.ListDeep, baseline: baseline.PageDeepCount},
	{service: svc.ListStatus, baseline: baseline.PageStatus},
	{service: svc.Get, baseline: baseline.SelectByID, min: 0.3},
	{service: svc.Update, baseline: baseline.UpdateByID},
	// API 1.1 (issue #21): against the service's own scenarios.
	{service: svc.CreateIdem, baseline: svc.CreateActive, vsService: true, paired: true, min: 0.85},
	{service: svc.Replay, baseline: svc.Get, vsService: true, paired: true, min: 1},
	{service: svc.LookupEmail, baseline: svc.Get, vsService: true, paired: true, min: 0.8},
	{service: svc.ListCursorDeep, baseline: svc.ListFirst, vsService: true, paired: true, min: 0.8},
	{service: svc.ListCursorDeep, baseline: svc.ListDeep, vsService: true, min: 10},
	// API 1.3 (§19.4): the filtered lists cost at most 1.5 × their own statement run bare.
	{service: svc.ListTag, baseline: baseListTag, min: 1 / 1.5},
	{service: svc.ListAttr, baseline: baseListAttr, min: 1 / 1.5},
	{service: svc.CreateAttrs, baseline: svc.CreateActive, vsService: true, paired: true, min: 0.85},
	// API 1.3 (§20.1): a segment's member count, at most 1.5 × its count statement run bare.
	{service: svc.SegmentCount, baseline: baseSegmentCount, min: 1 / 1.5},
}

// cpuTarget is a target on what a request costs: the service's own CPU per request (at most
// maxSvcUs; 0, none), the scenario's throughput against its baseline (at least minRatio) and
// PostgreSQL's CPU per request against the baseline's (at most maxDBTimes; 0, none).
type cpuTarget struct {
	service, baseline string
	maxSvcUs          float64
	minRatio          float64
	maxDBTimes        float64
}

var cpuTargets = []cpuTarget{
	{svc.Get, baseline.SelectByID, 90, 0.6, 1.5},
	{svc.ListFirst, baseline.Page, 150, 0.5, 0},
	{svc.ListDeep, baseline.PageDeep, 0, 1, 0},
	{svc.CreateActive, baseline.InsertOne, 150, 0.8, 0},
	{svc.Update, baseline.UpdateByID, 150, 0.8, 0},
}

// The target beside cpuTargets: the peak RSS at 256 clients.
const (
	rss256TargetMiB    = 64
	rss256TargetClient = "256 clients"
)

// cpuVerdict is a cpuTarget's figures in a run (median passes), in µs per request and ratios.
// byCPU is the baseline's CPU per request over the scenario's, all processes counted: on a
// machine the two saturate, their throughput ratio comes to about that. withoutService is the
// same with the service's part left out: the most the ratio could be if the service cost
// nothing.
type cpuVerdict struct {
	cpuTarget
	svcUs, db, baseDB, ratio, byCPU, withoutService float64
}

func cpuVerdicts(rep *Report) []cpuVerdict {
	var out []cpuVerdict
	for _, t := range cpuTargets {
		s := rep.find("service", t.service, "measure", rep.Meta.Clients)
		b := rep.find("baseline", t.baseline, "measure", rep.Meta.Clients)
		if s == nil || b == nil {
			continue
		}
		svcUs, db, tool := usPerReq(s.ServiceCPU, s), usPerReq(s.DBCPU, s), usPerReq(s.ToolCPU, s)
		baseDB := usPerReq(b.DBCPU, b)
		base := baseDB + usPerReq(b.ToolCPU, b) // NaN when either is unknown
		out = append(out, cpuVerdict{cpuTarget: t, svcUs: svcUs, db: db, baseDB: baseDB,
			ratio: load.Ratio(s.RequestsPerSec, b.RequestsPerSec), byCPU: base / (svcUs + db + tool), withoutService: base / (db + tool)})
	}
	return out
}

// kind is the run kind of the target's baseline.
func (t target) kind() string {
	if t.vsService {
		return "service"
	}
	return "baseline"
}

// rssTargetMiB is the bound on peak RSS at 64 clients.
const rssTargetMiB = 100

// find returns the run of kind and scenario in phase at clients; when several passes ran it,
// the one with the median throughput (the lower middle one of an even count).
func (rep *Report) find(kind, scenario, phase string, clients int) *RunRecord {
	var runs []*RunRecord
	for i := range rep.Runs {
		r := &rep.Runs[i]
		if r.Kind == kind && r.Scenario == scenario && r.Phase == phase && r.Clients == clients {
			runs = append(runs, r)
		}
	}
	if len(runs) == 0 {
		return nil
	}
	sort.SliceStable(runs, func(i, j int) bool { return runs[i].RequestsPerSec < runs[j].RequestsPerSec })
	return runs[(len(runs)-1)/2]
}

// compare fills Comparisons from the measured runs.
func (rep *Report) compare() {
	rep.Comparisons = nil
	for _, t := range targets {
		s := rep.find("service", t.service, "measure", rep.Meta.Clients)
		b := rep.find(t.kind(), t.baseline, "measure", rep.Meta.Clients)
		if s == nil || b == nil {
			continue
		}
		c := Comparison{Service: t.service, Baseline: t.baseline, Metric: "requests/s", Value: s.RequestsPerSec, Base: b.RequestsPerSec}
		if t.rows {
			c.Metric, c.Value, c.Base = "rows/s", s.RowsPerSec, b.RowsPerSec
		}
		c.Ratio = load.Ratio(c.Value, c.Base)
		if t.paired {
			rep.pairedRatio(&c)
		}
		if t.min > 0 {
			met := c.Ratio >= t.min
			c.Target = fmt.Sprintf("≥ %.2f", t.min)
			if t.strict {
				met = c.Ratio > t.min
				c.Target = fmt.Sprintf("> %.2f", t.min)
			}
			met = met && !math.IsNaN(c.Ratio)
			c.Met = &met
		}
		rep.Comparisons = append(rep.Comparisons, c)
	}
}

// pairedRatio sets c from the runs in which its two service scenarios alternated, when there
// are any: per pass, the ratio of their request rates; overall, the medians.
func (rep *Report) pairedRatio(c *Comparison) {
	vs, bs := rep.perPass(func(r *RunRecord) bool {
		return r.Phase == phasePaired && r.Scenario == c.Service && r.Against == c.Baseline
	},
		func(r *RunRecord) bool {
			return r.Phase == phasePaired && r.Scenario == c.Baseline && r.Against == c.Service
		}, reqRate)
	if len(vs) == 0 {
		return
	}
	ratios := make([]float64, len(vs))
	for i := range vs {
		ratios[i] = load.Ratio(vs[i], bs[i])
	}
	c.Value, c.Base, c.Ratio, c.PassRatios = median(vs), median(bs), median(ratios), ratios
}

// perPass pairs, pass by pass, the runs at the report's clients that a and b select, and
// returns value of each pass's a and b run, in pass order (the later run of a pass that has
// several).
func (rep *Report) perPass(a, b func(*RunRecord) bool, value func(*RunRecord) float64) (as, bs []float64) {
	va, vb := map[int]float64{}, map[int]float64{}
	for i := range rep.Runs {
		switch r := &rep.Runs[i]; {
		case r.Clients != rep.Meta.Clients:
		case a(r):
			va[r.Pass] = value(r)
		case b(r):
			vb[r.Pass] = value(r)
		}
	}
	for _, p := range slices.Sorted(maps.Keys(va)) {
		if y, ok := vb[p]; ok {
			as, bs = append(as, va[p]), append(bs, y)
		}
	}
	return as, bs
}

// runOf selects the runs of kind, scenario and phase.
func runOf(kind, scenario, phase string) func(*RunRecord) bool {
	return func(r *RunRecord) bool { return r.Kind == kind && r.Scenario == scenario && r.Phase == phase }
}

func reqRate(r *RunRecord) float64  { return r.RequestsPerSec }
func rowsRate(r *RunRecord) float64 { return r.RowsPerSec }

// pairedComparisons are the comparisons taken from alternating runs (see pairedRatio).
func (rep *Report) pairedComparisons() []Comparison {
	var out []Comparison
	for _, c := range rep.Comparisons {
		if c.alternated() {
			out = append(out, c)
		}
	}
	return out
}

// list shows vs, each as show shows it, comma-separated.
func list(vs []float64, show func(float64) string) string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = show(v)
	}
	return strings.Join(out, ", ")
}

// judge lists the run's problems: any error, any stall, any answer off the contract.
func (rep *Report) judge(stall time.Duration) {
	rep.Problems = nil
	for _, r := range rep.Runs {
		id := fmt.Sprintf("%s %s %s at %d clients", r.Phase, r.Kind, r.Scenario, r.Clients)
		if r.ErrorCount > 0 {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: %d errors (%s)", id, r.ErrorCount, errorList(&r, "×", ", ")))
		}
		if r.LongestGapMs >= msOf(stall) {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: stalled, nothing finished for %.1fs", id, r.LongestGapMs/1000))
		}
		if r.OutboxQueued > 0 && !r.OutboxDrained {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: %d of %d confirmation emails still pending %.0fs after the run",
				id, r.OutboxLeft, r.OutboxQueued, r.DrainSeconds))
		}
		if r.Probe != "" {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: answer off the contract: %s", id, r.Probe))
		}
	}
	for _, r := range rep.Singles {
		if r.Problem != "" {
			rep.Problems = append(rep.Problems, fmt.Sprintf("the single create during %s: %s", r.During, r.Problem))
		}
	}
	rep.judgeTelemetry()
}

// Failed tells whether the run found errors, stalls, answers off the contract or a telemetry
// comparison whose export did not work.
func (rep *Report) Failed() bool { return len(rep.Problems) > 0 }

func writeJSON(path string, rep *Report) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func f1(v float64) string {
	if math.IsNaN(v) || v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", v)
}

func f2(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

func errs(r *RunRecord) string {
	if r.ErrorCount == 0 {
		return "0"
	}
	return errorList(r, ":", ",")
}

// errorList is the run's errors as kind<sep>count, by kind, joined by join.
func errorList(r *RunRecord, sep, join string) string {
	kinds := load.Summary{Errors: r.Errors}.ErrorKinds()
	for i, k := range kinds {
		kinds[i] = fmt.Sprintf("%s%s%d", k, sep, r.Errors[k])
	}
	return strings.Join(kinds, join)
}

func rowsCol(r *RunRecord) string {
	if r.RowsPerSec == r.RequestsPerSec {
		return ""
	}
	return f1(r.RowsPerSec)
}

// measured lists each measured service scenario (its median pass) and then each of its
// baselines, named "baseline NAME".
func measured(rep *Report) (names []string, runs []*RunRecord) {
	for _, p := range plan {
		s := rep.find("service", p.service, "measure", rep.Meta.Clients)
		if s == nil {
			continue
		}
		names, runs = append(names, s.Scenario), append(runs, s)
		for _, name := range p.baselines {
			if b := rep.find("baseline", name, "measure", rep.Meta.Clients); b != nil {
				names, runs = append(names, "baseline "+name), append(runs, b)
			}
		}
	}
	return names, runs
}

// cpuSplit is r's CPU per request in µs of the service (NaN for a baseline, which the tool
// drives alone), PostgreSQL and the tool, and their total.
func cpuSplit(r *RunRecord) (service, db, tool, total float64) {
	service, db, tool = usPerReq(r.ServiceCPU, r), usPerReq(r.DBCPU, r), usPerReq(r.ToolCPU, r)
	if r.Kind == "baseline" {
		service = math.NaN()
	}
	for _, v := range []float64{service, db, tool} {
		if !math.IsNaN(v) {
			total += v
		}
	}
	return service, db, tool, total
}

// usPerReq converts cores used during r's window into µs of CPU per request; NaN when
// unknown.
func usPerReq(cores float64, r *RunRecord) float64 {
	if cores <= 0 || r.RequestsPerSec <= 0 {
		return math.NaN()
	}
	return cores / r.RequestsPerSec * 1e6
}

// cpuCol shows the cores the service and the tool used.
func cpuCol(r *RunRecord) string {
	if r.ServiceCPU == 0 {
		return fmt.Sprintf("-/%.2f", r.ToolCPU)
	}
	return fmt.Sprintf("%.2f/%.2f", r.ServiceCPU, r.ToolCPU)
}

func firstWords(s string, n int) string {
	f := strings.Fields(s)
	if len(f) > n {
		f = f[:n]
	}
	return strings.Join(f, " ")
}
