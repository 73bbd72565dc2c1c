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

// The telemetry comparison (issue 20) prices telemetry fully on (every trace sampled) and at
// the production setting of docs/operating.md, each against an instance with it off, on the
// same database and key (scripts/bench.sh starts them). In every pass, after a group's main
// scenarios, each telemetry scenario runs on off and on, then on off and production, each pair
// in alternating slices (off on on off …, on off off on … in even passes).

// The settings priced, the names of their rows.
const (
	settingFull       = "100 %"
	settingProduction = "production"
)

// telemetryTarget is the bound on the throughput telemetry may cost at setting on
// scenario: 20 % on get at 100 % sampling, whose request is so cheap that a span's fixed cost
// weighs most.
func telemetryTarget(setting, scenario string) float64 {
	switch {
	case setting == settingProduction:
		return 0.05
	case scenario == svc.Get:
		return 0.20
	}
	return 0.10
}

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
	// Slice is the length of the alternating slices, Duration each instance's measured time
	// in a scenario of a pass.
	Slice     string              `json:"slice,omitempty"`
	Duration  string              `json:"duration,omitempty"`
	Scenarios []TelemetryScenario `json:"scenarios"` // in the plan's order, a row per setting
	// OnRequests counts every request sent to the exporting instances, warm-ups and probes
	// included.
	OnRequests int64       `json:"on_requests_sent"`
	Sink       *SinkReport `json:"sink,omitempty"` // what -otlp-sink received in the whole run
}

// TelemetryScenario is one scenario measured with telemetry off and on at one setting.
type TelemetryScenario struct {
	Scenario string `json:"scenario"`
	// Setting is settingFull or settingProduction ("" in reports of older tools: 100 %).
	Setting string `json:"setting,omitempty"`
	// OffRPS and OnRPS are the median passes' throughputs in the setting's pairs.
	OffRPS float64 `json:"off_requests_per_sec"`
	OnRPS  float64 `json:"on_requests_per_sec"`
	// Overhead is the median of PassOverheads (0.05 = on serves 5 % fewer requests a second):
	// each pass's off and on ran in the same slices, while the median passes' throughputs can
	// come from different passes. 1 − OnRPS/OffRPS when no pass ran both.
	Overhead      float64   `json:"overhead"`
	PassOverheads []float64 `json:"pass_overheads"` // 1 − on/off of each pass, in pass order
	// OffCPUus and OnCPUus are the service's CPU per request in µs in the median passes; 0
	// when the pid was not given.
	OffCPUus float64 `json:"off_service_cpu_us_per_request,omitempty"`
	OnCPUus  float64 `json:"on_service_cpu_us_per_request,omitempty"`
	Target   string  `json:"target"`
	Met      bool    `json:"met"`
}

// SinkReport is what the OTLP sink received.
type SinkReport struct {
	Addr              string  `json:"addr"`
	Posts             int64   `json:"posts"`
	Bytes             int64   `json:"bytes"`
	BytesPerOnRequest float64 `json:"bytes_per_on_request"` // over every request sent to the exporting instances
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

// runPair runs scenario name on both instances in alternating slices, each for
// -telemetry-duration, and records a run of each. Back to back, a slow spell of the machine fell
// on one instance only: single passes of the same code swung by ±20 points. Each instance's
// CPU is split as alternate says.
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

// telemetryMet tells whether an overhead meets target, the bound included (but for floating
// point).
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

// judgeTelemetry is the comparison's problem: a sink that received nothing while the exporting
// instances served requests means their export did not work and the overhead means nothing.
// A missed target is a verdict, not a problem.
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

// cpuChange shows the service's CPU per request off → on.
func cpuChange(s TelemetryScenario) string {
	if s.OffCPUus == 0 || s.OnCPUus == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f → %.0f", s.OffCPUus, s.OnCPUus)
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
