package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/subscriberd/subscriberd/cmd/subscriber-bench/svc"
)

// The telemetry comparison prices telemetry on the official OpenTelemetry components at two
// settings (issue 20): fully on, every trace sampled, and the production setting of
// docs/operating.md (OTEL_TRACES_SAMPLER=parentbased_traceidratio, _ARG=0.1). More instances of
// the service run on the same database with the same key: "off" (OTEL_SDK_DISABLED=true,
// LOG_LEVEL=warn), "on" (every trace sampled) and "production" (-telemetry-prod-url; one in
// ten), both exporting over OTLP to -otlp-sink with the JSON access log at info. In every
// pass of the measured run, after the main scenarios of a group, each telemetry scenario of
// that group runs on off and on, then on off and production, each pair in alternating slices
// of -telemetry-slice (off on on off …, on off off on … in even passes), so that a slow spell
// of the shared machine falls on both alike, each for -telemetry-duration. Each setting's
// overhead is against off's runs of its own pairs.

// The settings priced, the names of their rows.
const (
	settingFull       = "100 %"
	settingProduction = "production"
)

// telemetryTarget is the bound on the throughput telemetry may cost at setting on
// scenario: at the production setting 5 % on every scenario; at 100 % sampling 20 % on get,
// whose request is so cheap that a span's fixed cost weighs most, and 10 % on the others.
func telemetryTarget(setting, scenario string) float64 {
	switch {
	case setting == settingProduction:
		return 0.05
	case scenario == svc.Get:
		return 0.20
	}
	return 0.10
}

// telemetryTargets describes the targets, for the report.
const telemetryTargets = "≤ 5 % at the production setting; at 100 % sampling ≤ 20 % on get, ≤ 10 % on the others"

// telemetrySettingKinds are the Kinds of the runs of each setting's pairs: off's, then on's.
var telemetrySettingKinds = []struct{ setting, off, on string }{
	{settingFull, kindTelemetryOff, kindTelemetryOn},
	{settingProduction, kindTelemetryOffProd, kindTelemetryProd},
}

// TelemetryReport is the telemetry comparison of a run.
type TelemetryReport struct {
	OffURL  string `json:"off_url"`
	OnURL   string `json:"on_url"`
	ProdURL string `json:"production_url,omitempty"`
	OffPID  int    `json:"off_pid,omitempty"`
	OnPID   int    `json:"on_pid,omitempty"`
	ProdPID int    `json:"production_pid,omitempty"`
	// OffSettings, OnSettings and ProdSettings are the telemetry settings in the instances'
	// environments (OTEL_*, LOG_LEVEL, GOGC, ...), read from /proc when their pid is known.
	OffSettings  []string `json:"off_settings,omitempty"`
	OnSettings   []string `json:"on_settings,omitempty"`
	ProdSettings []string `json:"production_settings,omitempty"`
	Target       string   `json:"target"`
	// Slice is the length of the alternating slices in which both instances ran each
	// scenario of a pass (load.RunAlternating), and Duration each instance's measured time
	// in a scenario of a pass.
	Slice    string `json:"slice,omitempty"`
	Duration string `json:"duration,omitempty"`
	// Scenarios are in the order of the plan, each with a row per setting measured.
	Scenarios []TelemetryScenario `json:"scenarios"`
	// OnRequests counts every request sent to the exporting instances ("on" and
	// "production"), warm-ups and probes included.
	OnRequests int64 `json:"on_requests_sent"`
	// Sink is what -otlp-sink received during the whole run (nil without it).
	Sink *SinkReport `json:"sink,omitempty"`
}

// TelemetryScenario is one scenario measured with telemetry off and on at one setting.
type TelemetryScenario struct {
	Scenario string `json:"scenario"`
	// Setting is settingFull or settingProduction ("" in reports of older tools: 100 %).
	Setting string `json:"setting,omitempty"`
	// OffRPS and OnRPS are the median passes' throughputs of off and of the setting's
	// instance in the setting's pairs.
	OffRPS float64 `json:"off_requests_per_sec"`
	OnRPS  float64 `json:"on_requests_per_sec"`
	// Overhead is the median of PassOverheads, a fraction (0.05 = on serves 5 % fewer
	// requests a second): a pass's off and on ran in the same slices, so each pass's ratio is
	// a paired measurement, while the median passes' throughputs (OffRPS, OnRPS) can come from
	// different passes of a machine whose speed drifts. 1 − OnRPS/OffRPS when no pass ran both.
	Overhead float64 `json:"overhead"`
	// PassOverheads is 1 − on/off of each pass's own pair, in pass order.
	PassOverheads []float64 `json:"pass_overheads"`
	// OffCPUus and OnCPUus are the service's CPU per request in µs in the median passes
	// (service_cpu_cores / requests_per_sec × 1e6); 0 when the pid was not given.
	OffCPUus float64 `json:"off_service_cpu_us_per_request,omitempty"`
	OnCPUus  float64 `json:"on_service_cpu_us_per_request,omitempty"`
	Target   string  `json:"target"`
	Met      bool    `json:"met"`
}

// SinkReport is what the OTLP sink received.
type SinkReport struct {
	Addr  string `json:"addr"`
	Posts int64  `json:"posts"`
	Bytes int64  `json:"bytes"`
	// BytesPerOnRequest is Bytes over every request sent to the exporting instances.
	BytesPerOnRequest float64 `json:"bytes_per_on_request"`
}

// setupTelemetry makes the clients of the comparison's instances, once the main client knows
// its subscriber ids: the same key, and the same ids to get and update. Their emails get their
// own prefix, since each client numbers its emails from 1 and the main client's are taken.
func (b *bench) setupTelemetry() {
	c := b.cfg
	if c.telemetryOffURL == "" || len(c.telemetryScenarios) == 0 {
		return
	}
	mk := func(kind, url, suffix string, pid int) *instance {
		cl := svc.NewClient(url, c.key, c.runID+suffix, c.clients, c.timeout)
		cl.IDs = b.client.IDs
		return &instance{kind: kind, client: cl, pid: pid}
	}
	b.off = mk(kindTelemetryOff, c.telemetryOffURL, "-off", c.telemetryOffPID)
	b.on = mk(kindTelemetryOn, c.telemetryOnURL, "-on", c.telemetryOnPID)
	if c.telemetryProdURL != "" {
		// Off's runs paired with production are their own Kind, on off's client.
		b.offProd = &instance{kind: kindTelemetryOffProd, client: b.off.client, pid: c.telemetryOffPID}
		b.prod = mk(kindTelemetryProd, c.telemetryProdURL, "-prod", c.telemetryProdPID)
	}
	t := &TelemetryReport{OffURL: c.telemetryOffURL, OnURL: c.telemetryOnURL, OffPID: c.telemetryOffPID, OnPID: c.telemetryOnPID,
		ProdURL: c.telemetryProdURL, ProdPID: c.telemetryProdPID, Target: telemetryTargets, Slice: c.telemetrySlice.String(),
		Duration: c.telemetryDuration.String()}
	for _, in := range []struct {
		pid int
		out *[]string
	}{{c.telemetryOffPID, &t.OffSettings}, {c.telemetryOnPID, &t.OnSettings}, {c.telemetryProdPID, &t.ProdSettings}} {
		if in.pid == 0 {
			continue
		}
		env, err := processEnv(in.pid)
		if err != nil {
			fmt.Fprintf(b.log, "warning: settings of telemetry instance %d: %v\n", in.pid, err)
			continue
		}
		*in.out = telemetrySettings(env)
		if on := runningWorkers(env); len(on) > 0 {
			// Any instance's workers take any due work of the database: the main instance's
			// imports' emails, say, which its figures then leave out.
			fmt.Fprintf(b.log, "warning: telemetry instance %d runs background workers (%s not 0): it shares the main instance's emails, deliveries or imports\n",
				in.pid, strings.Join(on, ", "))
		}
	}
	b.rep.Telemetry = t
	fmt.Fprintf(b.log, "telemetry comparison of %s: off %s %v, on %s %v, production %s %v\n",
		strings.Join(c.telemetryScenarios, ","), c.telemetryOffURL, t.OffSettings, c.telemetryOnURL, t.OnSettings,
		orDash(c.telemetryProdURL), t.ProdSettings)
}

// telemetryOrder is the order of the two instances in pass: off first in odd passes, on first
// in even ones.
func telemetryOrder[T any](pass int, off, on T) []T {
	if pass%2 == 0 {
		return []T{on, off}
	}
	return []T{off, on}
}

// runTelemetry runs the telemetry scenarios of the group (writes or reads) on both
// instances, as the measured run does: same clients, warm-up and duration.
func (b *bench) runTelemetry(ctx context.Context, writes bool, pass int) error {
	if b.off == nil {
		return nil
	}
	for _, p := range plan {
		if p.write != writes || !slices.Contains(b.cfg.telemetryScenarios, p.service) {
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		b.runPair(ctx, telemetryOrder(pass, b.off, b.on), p.service, pass)
		b.lastOnEnd = time.Now()
		if b.prod != nil && ctx.Err() == nil {
			b.runPair(ctx, telemetryOrder(pass, b.offProd, b.prod), p.service, pass)
			b.lastOnEnd = time.Now()
		}
	}
	return nil
}

// runPair runs scenario name on both instances in alternating slices of -telemetry-slice
// (load.RunAlternating), each for -telemetry-duration after the measured run's warm-up, and
// records a run of each. Back to back, a slow spell of the shared machine a few seconds long
// fell on one instance only: single passes of the same code swung by ±20 points. Each
// instance's CPU is split as alternate says (its background work, such as the span export,
// is counted with its own).
func (b *bench) runPair(ctx context.Context, ins []*instance, name string, pass int) {
	b.alternate(ctx, [2]half{b.half(ctx, ins[0], name, "measure", pass), b.half(ctx, ins[1], name, "measure", pass)},
		b.cfg.telemetryDuration, true)
}

// finishTelemetry waits for the "on" instance's last spans to reach the sink and fills the
// comparison.
func (b *bench) finishTelemetry(ctx context.Context) {
	t := b.rep.Telemetry
	if t == nil {
		return
	}
	if b.sink != nil {
		if !b.lastOnEnd.IsZero() {
			limit := exportDelay(t.OnSettings) + time.Second
			if !b.sink.waitExportAfter(ctx, b.lastOnEnd, limit) {
				fmt.Fprintf(b.log, "note: no span export reached the sink in the %v after the last \"on\" run\n", limit)
			}
		}
		t.Sink = &SinkReport{Addr: b.sink.addr, Posts: b.sink.Posts(), Bytes: b.sink.Bytes()}
	}
	t.OnRequests = b.on.sent.Load()
	if b.prod != nil {
		t.OnRequests += b.prod.sent.Load()
	}
	b.rep.telemetryResults()
}

// exportDelay is the span exporter's batch delay of an instance with settings: its
// OTEL_BSP_SCHEDULE_DELAY in ms, else the SDK's 5 s.
func exportDelay(settings []string) time.Duration {
	for _, kv := range settings {
		if v, ok := strings.CutPrefix(kv, "OTEL_BSP_SCHEDULE_DELAY="); ok {
			if ms, err := strconv.Atoi(v); err == nil && ms >= 0 {
				return time.Duration(ms) * time.Millisecond
			}
		}
	}
	return 5 * time.Second
}

// telemetryResults fills the comparison's scenarios from the measured runs of both instances,
// and the sink's bytes per "on" request.
func (rep *Report) telemetryResults() {
	t := rep.Telemetry
	if t == nil {
		return
	}
	if t.Sink != nil && t.OnRequests > 0 {
		t.Sink.BytesPerOnRequest = float64(t.Sink.Bytes) / float64(t.OnRequests)
	}
	t.Scenarios = nil
	t.Target = telemetryTargets
	for _, p := range plan {
		for _, k := range telemetrySettingKinds {
			off := rep.find(k.off, p.service, "measure", rep.Meta.Clients)
			on := rep.find(k.on, p.service, "measure", rep.Meta.Clients)
			if off == nil || on == nil || off.RequestsPerSec <= 0 {
				continue // not run, or nothing served: no comparison (the errors are problems)
			}
			target := telemetryTarget(k.setting, p.service)
			s := TelemetryScenario{Scenario: p.service, Setting: k.setting, OffRPS: off.RequestsPerSec, OnRPS: on.RequestsPerSec,
				Overhead: 1 - on.RequestsPerSec/off.RequestsPerSec, Target: fmt.Sprintf("≤ %.0f %%", target*100),
				OffCPUus: cpuUs(off).Service, OnCPUus: cpuUs(on).Service}
			s.PassOverheads = rep.passOverheads(p.service, k.off, k.on)
			if len(s.PassOverheads) > 0 {
				s.Overhead = median(s.PassOverheads)
			}
			s.Met = telemetryMet(s.Overhead, target)
			t.Scenarios = append(t.Scenarios, s)
		}
	}
}

// telemetryMet tells whether an overhead meets target, the bound included. The tolerance
// keeps an overhead that is the bound but for floating point on the right side.
func telemetryMet(overhead, target float64) bool { return overhead <= target+1e-9 }

// passOverheads is 1 − on/off of each pass in which scenario ran on both instances, off's
// runs being of Kind offKind and on's of onKind.
func (rep *Report) passOverheads(scenario, offKind, onKind string) []float64 {
	offs, ons := rep.perPass(runOf(offKind, scenario, "measure"), runOf(onKind, scenario, "measure"), reqRate)
	out := []float64{}
	for i := range offs {
		if offs[i] > 0 {
			out = append(out, 1-ons[i]/offs[i])
		}
	}
	return out
}

// median is the middle of xs, or the mean of the two middle values of an even count.
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// judgeTelemetry is the comparison's problem: a sink that received nothing while the "on"
// instance served requests means its export was not working, so "on" measured telemetry
// without its export and the overhead means nothing. A missed target is a verdict, not a
// problem.
func (rep *Report) judgeTelemetry() {
	t := rep.Telemetry
	if t == nil || t.Sink == nil || t.Sink.Bytes > 0 {
		return
	}
	var runs int
	var requests int64
	for _, r := range rep.Runs {
		if (r.Kind == kindTelemetryOn || r.Kind == kindTelemetryProd) && r.Requests > 0 {
			runs++
			requests += r.Requests
		}
	}
	if runs > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf(
			"telemetry: the OTLP sink on %s received nothing while %d runs on the exporting instances (%s) served %d requests: their span export is not working, so the overhead measured is not telemetry's",
			t.Sink.Addr, runs, t.OnURL, requests))
	}
}

// byteSize shows n bytes in KiB or MiB.
func byteSize(n int64) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
}

// pct shows a fraction as a percentage.
func pct(v float64) string { return fmt.Sprintf("%.1f %%", v*100) }

func pcts(vs []float64) string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = pct(v)
	}
	return strings.Join(out, ", ")
}

// cpuChange shows the service's CPU per request off → on.
func cpuChange(s TelemetryScenario) string {
	if s.OffCPUus == 0 || s.OnCPUus == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f → %.0f", s.OffCPUus, s.OnCPUus)
}

// settingOf is the setting of a row; rows of older reports are at 100 %.
func settingOf(s TelemetryScenario) string {
	if s.Setting == "" {
		return settingFull
	}
	return s.Setting
}

// describe is the line under the telemetry table: what off and on were, and what the sink
// received.
func (t *TelemetryReport) describe() string {
	settings := func(s []string, pid int) string {
		switch {
		case pid == 0:
			return "settings unknown (no pid)"
		case len(s) == 0:
			return "no telemetry settings (defaults)"
		}
		return strings.Join(s, " ")
	}
	line := fmt.Sprintf("off = %s; on (100 %%) = %s", settings(t.OffSettings, t.OffPID), settings(t.OnSettings, t.OnPID))
	if t.ProdURL != "" {
		line += fmt.Sprintf("; production = %s", settings(t.ProdSettings, t.ProdPID))
	}
	line += "; Prometheus metrics on in all; overhead = the median over passes of 1 − on/off req/s, each setting against off in its own pairs"
	if t.Slice != "" {
		during := ""
		if t.Duration != "" {
			during = fmt.Sprintf(", %s each,", t.Duration)
		}
		line += fmt.Sprintf("; each pass ran each pair%s in alternating slices of %s (off on on off …, on off off on … in even passes)", during, t.Slice)
	}
	if s := t.Sink; s != nil {
		line += fmt.Sprintf("; the OTLP sink on %s received %d exports, %s (%.0f bytes per request of %d sent to the exporting instances)",
			s.Addr, s.Posts, byteSize(s.Bytes), s.BytesPerOnRequest, t.OnRequests)
	} else {
		line += "; what the exporting instances exported was not counted (no -otlp-sink, or the run ended early)"
	}
	return line
}
