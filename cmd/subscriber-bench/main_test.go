package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/subscriberd/subscriberd/internal/bench/baseline"
	"github.com/subscriberd/subscriberd/internal/bench/svc"
	"github.com/subscriberd/subscriberd/internal/testdb"
)

// pg is the test PostgreSQL (TEST_DATABASE_URL, else a container; see internal/testdb).
var pg *testdb.Server

func TestMain(m *testing.M) { os.Exit(testdb.Main(m, &pg)) }

func TestPeakRSS(t *testing.T) {
	status := "Name:\tsubscriberd\nVmPeak:\t 1300000 kB\nVmHWM:\t   45312 kB\nVmRSS:\t   40000 kB\n"
	kb, err := peakRSS(strings.NewReader(status))
	if err != nil || kb != 45312 {
		t.Errorf("peakRSS = %d, %v; want 45312 (VmHWM, not VmPeak or VmRSS)", kb, err)
	}
	if _, err := peakRSS(strings.NewReader("Name:\tx\nVmRSS:\t 1 kB\n")); err == nil {
		t.Errorf("no VmHWM line: want an error")
	}
	if _, err := peakRSS(strings.NewReader("VmHWM:\t 12 MB\n")); err == nil {
		t.Errorf("a unit other than kB: want an error")
	}
}

func TestParseFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"-key", "sk_x", "-check-clients", "64, 256", "-only", "get,bulk_100"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.checkClients) != 2 || cfg.checkClients[0] != 64 || cfg.checkClients[1] != 256 {
		t.Errorf("check clients = %v", cfg.checkClients)
	}
	if !cfg.only["get"] || !cfg.only["bulk_100"] || len(cfg.only) != 2 || cfg.runID == "" {
		t.Errorf("only = %v, run id %q", cfg.only, cfg.runID)
	}
	if cfg, err := parseFlags([]string{"-key", "k", "-check-clients", ""}, io.Discard); err != nil || len(cfg.checkClients) != 0 {
		t.Errorf("empty -check-clients: %v, %v", cfg.checkClients, err)
	}
	t.Setenv("BENCH_API_KEY", "")
	for _, args := range [][]string{
		{},                                      // no key
		{"-key", "k", "-only", "nope"},          // unknown scenario
		{"-key", "k", "-check-clients", "0"},    // not positive
		{"-key", "k", "-pprof-url", "http://x"}, // no profile dir
		{"-key", "k", "extra"},                  // stray argument
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

func rec(kind, scenario string, rps, rows float64) RunRecord {
	return RunRecord{Scenario: scenario, Kind: kind, Phase: "measure", Clients: 16, RequestsPerSec: rps, RowsPerSec: rows}
}

func TestCompareAppliesTheIssueTargets(t *testing.T) {
	rep := &Report{Meta: Meta{Clients: 16}, Runs: []RunRecord{
		rec("service", svc.CreateActive, 400, 400), rec("baseline", baseline.InsertOne, 1000, 1000), // 0.40 < 0.5
		rec("service", svc.Bulk100, 30, 3000), rec("baseline", baseline.Insert100, 20, 4000), // rows: 0.75
		rec("service", svc.ListDeep, 100, 100), rec("baseline", baseline.PageDeep, 100, 100), // 1.00, not faster
		rec("service", svc.Get, 300, 300), rec("baseline", baseline.SelectByID, 1000, 1000), // 0.30 exactly
		rec("service", svc.Update, 10, 10), rec("baseline", baseline.UpdateByID, 20, 20), // no target
		rec("service", svc.ListFirst, 10, 10), // no baseline run: no comparison
	}}
	rep.compare()
	got := map[string]Comparison{}
	for _, c := range rep.Comparisons {
		got[c.Service+"/"+c.Baseline] = c
	}
	if len(got) != 5 {
		t.Fatalf("%d comparisons, want 5: %+v", len(got), rep.Comparisons)
	}
	for key, want := range map[string]struct {
		ratio float64
		met   string
	}{
		svc.CreateActive + "/" + baseline.InsertOne: {0.4, "false"},
		svc.Bulk100 + "/" + baseline.Insert100:      {0.75, "true"},
		svc.ListDeep + "/" + baseline.PageDeep:      {1, "false"},
		svc.Get + "/" + baseline.SelectByID:         {0.3, "true"},
		svc.Update + "/" + baseline.UpdateByID:      {0.5, "none"},
	} {
		c := got[key]
		met := "none"
		if c.Met != nil {
			met = map[bool]string{true: "true", false: "false"}[*c.Met]
		}
		if c.Ratio < want.ratio-1e-9 || c.Ratio > want.ratio+1e-9 || met != want.met {
			t.Errorf("%s: ratio %v met %s; want %v %s", key, c.Ratio, met, want.ratio, want.met)
		}
	}
	if got[svc.Bulk100+"/"+baseline.Insert100].Metric != "rows/s" {
		t.Errorf("bulk must be compared in rows/s")
	}

	var out bytes.Buffer
	printReport(&out, rep)
	for _, want := range []string{"MISSED", "met", "insert_100_tx", "0.75 (rows)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func TestJudgeFindsErrorsStallsAndProbeFailures(t *testing.T) {
	rep := &Report{Runs: []RunRecord{
		{Scenario: "get", Kind: "service", Phase: "check", Clients: 256, LongestGapMs: 100},
		{Scenario: "list_deep", Kind: "service", Phase: "check", Clients: 256, ErrorCount: 3, Errors: map[string]int64{"timeout": 2, "500": 1}},
		{Scenario: "list_first", Kind: "service", Phase: "check", Clients: 64, LongestGapMs: 3500},
		{Scenario: "create_active", Kind: "service", Phase: "measure", Clients: 16, Probe: "status 200, want 201"},
	}}
	rep.judge(3 * time.Second)
	if len(rep.Problems) != 3 || !rep.Failed() {
		t.Fatalf("problems = %q, want 3", rep.Problems)
	}
	for i, want := range []string{"500×1, timeout×2", "stalled", "off the contract"} {
		if !strings.Contains(rep.Problems[i], want) {
			t.Errorf("problem %d = %q, want it to mention %q", i, rep.Problems[i], want)
		}
	}
	clean := &Report{Runs: rep.Runs[:1]}
	clean.judge(3 * time.Second)
	if clean.Failed() {
		t.Errorf("a clean run failed: %q", clean.Problems)
	}
}

// TestRunAgainstTheService builds subscriberd, starts it on a scratch database the way
// scripts/bench.sh does (through its CLI only, API.md §7), and runs the whole tool against
// it with every scenario bounded by a request count: every probe must pass, no request may
// fail, and every comparison must be filled.
func TestRunAgainstTheService(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts the service; not in -short")
	}
	dsn := pg.Fresh(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "subscriberd")
	gobin, err := exec.LookPath("go") // go test puts its own go first on PATH
	if err != nil {
		t.Fatalf("no go command to build the service: %v", err)
	}
	if out, err := exec.Command(gobin, "build", "-o", bin, "github.com/subscriberd/subscriberd/cmd/subscriberd").CombinedOutput(); err != nil {
		t.Fatalf("build subscriberd: %v\n%s", err, out)
	}
	env := append(os.Environ(), "DATABASE_URL="+dsn, "LISTEN_ADDR=127.0.0.1:"+freePort(t), "ADMIN_ADDR=127.0.0.1:"+freePort(t),
		"RATE_LIMITS=off", "BULK_RATE_LIMITS=off", "AUTH_LOCKOUT=off", "WRITE_LOCKOUT=off", "LOG_LEVEL=warn")
	cli := func(args ...string) map[string]any {
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("subscriberd %v: %v", args, err)
		}
		var v map[string]any
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("subscriberd %v printed %q: %v", args, out, err)
		}
		return v
	}
	cli("migrate")
	nl := cli("newsletter", "create", "--name", "bench test")["id"].(string)
	key := cli("apikey", "create", "--newsletter", nl)["key"].(string)

	var logBuf bytes.Buffer
	srv := exec.Command(bin, "serve")
	srv.Env, srv.Stderr = env, &logBuf
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = srv.Process.Signal(syscall.SIGTERM)
		_ = srv.Wait()
		if t.Failed() {
			t.Logf("service log:\n%s", logBuf.String())
		}
	})
	var listen, admin string
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "LISTEN_ADDR="); ok {
			listen = v
		}
		if v, ok := strings.CutPrefix(e, "ADMIN_ADDR="); ok {
			admin = v
		}
	}
	waitReady(t, "http://"+admin+"/readyz")

	cfg, err := parseFlags([]string{"-url", "http://" + listen, "-key", key, "-database-url", dsn,
		"-seed", "300", "-seed-parallel", "2", "-clients", "3", "-check-clients", "6",
		"-duration", "1h", "-check-duration", "1h", "-warmup", "0", "-max-requests", "12",
		"-stall", "1m", "-pid", "0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg.pid = srv.Process.Pid
	var log bytes.Buffer
	rep, err := run(context.Background(), cfg, &log)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	if rep.Failed() {
		t.Errorf("problems: %q", rep.Problems)
	}
	// 8 measured service scenarios, 10 baselines, 8 checks at 6 clients.
	if len(rep.Runs) != 26 {
		t.Errorf("%d runs, want 26", len(rep.Runs))
	}
	for _, r := range rep.Runs {
		if r.OK != 12 {
			t.Errorf("%s %s %s: %d ok of %d, errors %v", r.Phase, r.Kind, r.Scenario, r.OK, r.Requests, r.ErrorDetails)
		}
	}
	if len(rep.Comparisons) != len(targets) {
		t.Errorf("%d comparisons, want %d", len(rep.Comparisons), len(targets))
	}
	if rep.Meta.Newsletter != nl || rep.Meta.SubscribersAtStart != 300 || !rep.Meta.Vacuumed {
		t.Errorf("meta = %+v; want the CLI's newsletter, 300 subscribers, vacuumed", rep.Meta)
	}
	if len(rep.RSS) != 5 || rep.RSS[0].PeakMiB <= 0 {
		t.Errorf("rss = %+v, want 5 positive records (seeding, then reads and writes at 3 and 6 clients)", rep.RSS)
	}
	path := filepath.Join(dir, "bench.json")
	if err := writeJSON(path, rep); err != nil {
		t.Fatal(err)
	}
	var back Report
	if b, err := os.ReadFile(path); err != nil || json.Unmarshal(b, &back) != nil || len(back.Runs) != 26 {
		t.Errorf("the JSON does not read back: %v", err)
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

func waitReady(t *testing.T, url string) {
	t.Helper()
	for range 300 {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s never became ready", url)
}

func TestFindTakesTheMedianPass(t *testing.T) {
	rep := &Report{Meta: Meta{Clients: 16, Passes: 3}}
	for i, rps := range []float64{900, 300, 600} {
		r := rec("service", svc.Get, rps, rps)
		r.Pass = i + 1
		rep.Runs = append(rep.Runs, r)
	}
	if got := rep.find("service", svc.Get, "measure", 16); got == nil || got.RequestsPerSec != 600 || got.Pass != 3 {
		t.Errorf("median of 900, 300, 600 = %+v, want the 600 of pass 3", got)
	}
	rep.Runs = rep.Runs[:2]
	if got := rep.find("service", svc.Get, "measure", 16); got == nil || got.RequestsPerSec != 300 {
		t.Errorf("median of two = %+v, want the lower one", got)
	}
	if got := rep.find("service", svc.Get, "check", 16); got != nil {
		t.Errorf("found a check run that does not exist: %+v", got)
	}
}

func TestAgainstAReferenceAndMarkdown(t *testing.T) {
	then := &Report{Meta: Meta{Clients: 16, RunID: "old"}, Runs: []RunRecord{rec("service", svc.Get, 1000, 1000)}}
	then.Runs[0].P50Ms = 2
	now := &Report{Meta: Meta{Clients: 16, RunID: "new", Command: "make bench"}, Runs: []RunRecord{
		rec("service", svc.Get, 900, 900), rec("baseline", baseline.SelectByID, 2000, 2000),
		rec("service", svc.ListFirst, 10, 10),
	}}
	now.Runs[0].P50Ms = 3
	now.against(then, "old.json")
	if now.Reference == nil || len(now.Reference.Ratios) != 1 {
		t.Fatalf("reference = %+v, want get alone (list_first has no reference run)", now.Reference)
	}
	if r := now.Reference.Ratios[0]; r.RateRatio != 0.9 || r.P50Ratio != 1.5 {
		t.Errorf("get against the reference: %+v, want throughput ×0.9 and p50 ×1.5", r)
	}
	now.compare()
	var md bytes.Buffer
	markdown(&md, now)
	for _, want := range []string{"`make bench`", "| get | 900.0 |", "| select_by_id | 2000.0 |", "0.45", "met"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md.String())
		}
	}
}

func TestProcCPU(t *testing.T) {
	// A command name with spaces and parentheses; utime 250 and stime 150 ticks = 4 s.
	stat := "4242 (sub (scriber) d) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 150 0 0 20 0 9 0 100 0 0"
	got, err := procCPU(stat)
	if err != nil || got != 4*time.Second {
		t.Errorf("procCPU = %v, %v; want 4s", got, err)
	}
	if _, err := procCPU("4242 (x) S 1 2"); err == nil {
		t.Errorf("short line accepted")
	}
	// The tool's own CPU only grows.
	a := selfCPU()
	for i := 0; i < 1e6; i++ {
		_ = fmt.Sprint(i)
	}
	if b := selfCPU(); b <= a {
		t.Errorf("own CPU did not grow: %v then %v", a, b)
	}
	if _, ok := serviceCPU(os.Getpid()); !ok {
		t.Errorf("cannot read this process's /proc stat")
	}
}
