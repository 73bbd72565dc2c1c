package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"

	"github.com/subscriberd/subscriberd/internal/logbuf"
	"github.com/subscriberd/subscriberd/internal/smtptest"
	"github.com/subscriberd/subscriberd/internal/testredis"
)

// TestAlertsFireInLivePrometheus proves the alert rules against what the service really
// exports: a real Prometheus server (Debian's prometheus, bound to loopback, a temporary
// storage directory) scrapes a running subscriberd serve, built from this tree, and evaluates a
// test copy of deploy/prometheus/rules.yml in which every duration is 60 times shorter (a
// minute of the real rules is a second here; the 900 s age thresholds become 15 s). Under a
// steady trickle of requests, the test then
//
//   - stops the SMTP server: SubscriberdEmailSendFailures fires, and resolves once it is back;
//   - makes the webhook receiver hang: SubscriberdWebhookQueueStalled fires, and resolves once
//     it answers again;
//   - kills the instance, its workers with it (SIGKILL): SubscriberdTargetDown fires, and
//     resolves once it runs again;
//   - cuts the database off: SubscriberdAvailabilityBurnFast and
//     SubscriberdEmailOutboxUnreadable fire, and resolve once it is back.
//
// Before the faults it checks that every series a rule or a dashboard panel reads is exported
// by the service (Prometheus has scraped it). Skipped, loudly, without a prometheus binary
// (PROMETHEUS, or prometheus on PATH; scripts/test.sh installs Debian's).
func TestAlertsFireInLivePrometheus(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs a Prometheus server and the service for minutes")
	}
	postgresOnly(t, noOutageOnSQLite)
	promBin := os.Getenv("PROMETHEUS")
	if promBin == "" {
		var err error
		if promBin, err = exec.LookPath("prometheus"); err != nil {
			t.Skip("\n###########################################################################\n" +
				"## NO PROMETHEUS: the alerts' live test is SKIPPED. Install Debian's     ##\n" +
				"## prometheus package or set PROMETHEUS=/path/to/prometheus.             ##\n" +
				"###########################################################################")
		}
	}
	t.Parallel()
	dir := t.TempDir()

	// The service: the binary of this tree, on a database reached through a proxy the test
	// can cut, mailing the test's SMTP server, delivering to the test's receiver.
	bin := filepath.Join(dir, "subscriberd")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/subscriberd/subscriberd/cmd/subscriberd").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	direct := freshDatabase(t)
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newTCPProxy(t, u.Host)
	via := *u
	via.Host = proxy.addr
	e := newEnv(t, func(o *envOptions) { o.dsn = direct }) // the newsletter and key, written directly
	mailServer := smtptest.Start(t)
	receiver := newHangingReceiver(t)
	listen, admin := freeAddr(t), freeAddr(t)
	svc := &service{bin: bin, env: []string{
		"DATABASE_URL=" + via.String(), "SMTP_URL=" + mailServer.URL(), "REDIS_URL=" + testredis.URL(t),
		"LISTEN_ADDR=" + listen, "ADMIN_ADDR=" + admin, "LOG_FORMAT=json", "LOG_LEVEL=warn",
		"WEBHOOK_ALLOW_PRIVATE=true", "WEBHOOK_TIMEOUT=120s", "OTEL_SDK_DISABLED=true",
		// Limits stay on (their series are read by a rule) but never refuse the trickle.
		"RATE_LIMITS=100000/1m", "BULK_RATE_LIMITS=100000/1m", "WRITE_LOCKOUT=off",
	}}
	svc.start(t)
	t.Cleanup(svc.kill)
	base := "http://" + listen + "/api/v1"

	// Prometheus, scraping the admin listener every second, with the fast copy of the rules.
	rules := fastRules(t)
	if err := os.WriteFile(filepath.Join(dir, "rules.yml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	promAddr := freeAddr(t)
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 900ms
  evaluation_interval: 1s
rule_files: [rules.yml]
scrape_configs:
  - job_name: subscriberd
    static_configs:
      - targets: [%q]
`, admin)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	var promLog logbuf.Buffer
	prom := exec.Command(promBin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "tsdb"), "--web.listen-address="+promAddr)
	prom.Stdout, prom.Stderr = &promLog, &promLog
	if err := prom.Start(); err != nil {
		t.Fatal(err)
	}
	promDone := make(chan struct{})
	go func() { prom.Wait(); close(promDone) }() //nolint:errcheck // its log says why
	t.Cleanup(func() {
		prom.Process.Signal(syscall.SIGTERM) //nolint:errcheck
		select {
		case <-promDone:
		case <-time.After(20 * time.Second):
			prom.Process.Kill() //nolint:errcheck
			<-promDone
		}
		if t.Failed() {
			t.Logf("prometheus log:\n%s", promLog.String())
		}
	})
	p := &promClient{base: "http://" + promAddr}

	// A webhook endpoint, and a steady trickle: a list every 200 ms, a pending subscriber (an
	// email and a webhook delivery) every 500 ms, as long as the test runs.
	call(t, "POST", base+"/webhooks", e.key, fmt.Sprintf(`{"url":%q,"events":["subscriber.created"]}`, receiver.srv.URL), http.StatusCreated)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			send(base+"/subscribers?limit=1", "GET", e.key, "")
			if i%3 == 0 {
				send(base+"/subscribers", "POST", e.key, fmt.Sprintf(`{"email":"trickle%d@example.com","status":"pending"}`, i))
			}
		}
	}()
	t.Cleanup(func() { close(stop); wg.Wait() })

	// What a few series need to exist at all: a bulk create, an idempotent write, a refused key.
	call(t, "POST", base+"/subscribers/bulk", e.key, `[{"email":"bulk@example.com"}]`, http.StatusCreated)
	send(base+"/subscribers", "POST", e.key, `{"email":"idem@example.com"}`, "Idempotency-Key: k1")
	send(base+"/subscribers", "GET", "sk_"+strings.Repeat("x", 40), "")

	t.Run("every series the rules and dashboards read is exported", func(t *testing.T) {
		want := readSeries(t)
		deadline := time.Now().Add(60 * time.Second)
		for {
			have := p.names()
			var missing []string
			for _, n := range want {
				if !have[n] {
					missing = append(missing, n)
				}
			}
			if len(missing) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("series read by a rule or a dashboard panel that the service does not export: %v", missing)
			}
			time.Sleep(time.Second)
		}
	})
	p.waitFor(t, "SubscriberdTargetDown", false, time.Minute) // scraped

	t.Run("SMTP down", func(t *testing.T) {
		mailServer.Stop()
		p.waitFor(t, "SubscriberdEmailSendFailures", true, 2*time.Minute)
		mailServer.Restart()
		p.waitFor(t, "SubscriberdEmailSendFailures", false, 2*time.Minute)
	})
	t.Run("webhook receiver hangs", func(t *testing.T) {
		receiver.hang()
		p.waitFor(t, "SubscriberdWebhookQueueStalled", true, 2*time.Minute)
		receiver.release()
		p.waitFor(t, "SubscriberdWebhookQueueStalled", false, 2*time.Minute)
	})
	t.Run("instance and its workers killed", func(t *testing.T) {
		svc.kill()
		p.waitFor(t, "SubscriberdTargetDown", true, time.Minute)
		svc.start(t)
		p.waitFor(t, "SubscriberdTargetDown", false, time.Minute)
	})
	t.Run("database down", func(t *testing.T) {
		proxy.cut()
		p.waitFor(t, "SubscriberdAvailabilityBurnFast", true, 2*time.Minute)
		p.waitFor(t, "SubscriberdEmailOutboxUnreadable", true, 2*time.Minute)
		proxy.restore()
		p.waitFor(t, "SubscriberdAvailabilityBurnFast", false, 3*time.Minute)
		p.waitFor(t, "SubscriberdEmailOutboxUnreadable", false, 2*time.Minute)
	})
}

// fastRules is deploy/prometheus/rules.yml with every duration (for:, range selectors,
// offsets) and the stall alerts' age thresholds 60 times shorter.
func fastRules(t *testing.T) []byte {
	t.Helper()
	raw, err := os.ReadFile("../deploy/prometheus/rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	scale := func(n, unit string) string {
		v, _ := strconv.Atoi(n)
		secs := v * map[string]int{"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
		return strconv.Itoa(max(secs/60, 1)) + "s"
	}
	dur := regexp.MustCompile(`(\[|offset |for: )(\d+)([smhd])\b`)
	out := dur.ReplaceAllStringFunc(string(raw), func(m string) string {
		p := dur.FindStringSubmatch(m)
		return p[1] + scale(p[2], p[3])
	})
	// The stall alerts' age thresholds, one per lane of the email outbox and the webhook
	// queue, shortened as the durations are.
	age := regexp.MustCompile(`(oldest_due_age_seconds\{[^}]*lane="[a-z]+"\}\) > )(\d+)`)
	if n := len(age.FindAllString(out, -1)); n != 4 {
		t.Fatalf("rules.yml has %d lane age thresholds, the test copy expects 4 (two lanes of emails and of webhooks): update fastRules", n)
	}
	return []byte(age.ReplaceAllStringFunc(out, func(m string) string {
		p := age.FindStringSubmatch(m)
		return p[1] + strings.TrimSuffix(scale(p[2], "s"), "s")
	}))
}

// readSeries lists every series name a rule or a dashboard panel reads, except the rules' own
// records and Prometheus's up.
func readSeries(t *testing.T) []string {
	t.Helper()
	var exprs []string
	raw, err := os.ReadFile("../deploy/prometheus/rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rf struct {
		Groups []struct {
			Rules []struct{ Record, Expr string }
		}
	}
	if err := yaml.Unmarshal(raw, &rf); err != nil {
		t.Fatal(err)
	}
	recorded := map[string]bool{"up": true}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
			if r.Record != "" {
				recorded[r.Record] = true
			}
		}
	}
	dash, err := os.ReadFile("../deploy/grafana/dashboards/subscriberd.json")
	if err != nil {
		t.Fatal(err)
	}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if s, ok := v["expr"].(string); ok {
				exprs = append(exprs, s)
			}
			for _, c := range v {
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	var d any
	if err := json.Unmarshal(dash, &d); err != nil {
		t.Fatal(err)
	}
	walk(d)
	grafana := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h",
		"${datasource}", "prometheus", "$job", "subscriberd", "$instance", ".*")
	names := map[string]bool{}
	for _, x := range exprs {
		ast, err := parser.NewParser(parser.Options{}).ParseExpr(grafana.Replace(x))
		if err != nil {
			t.Fatalf("%q does not parse: %v", x, err)
		}
		parser.Inspect(ast, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok && vs.Name != "" && !recorded[vs.Name] {
				names[vs.Name] = true
			}
			return nil
		})
	}
	if len(names) < 5 {
		t.Fatalf("only %d series read by the rules and dashboards: %v", len(names), names)
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// service is subscriberd serve as a process, started and killed by the test.
type service struct {
	bin string
	env []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	log  logbuf.Buffer
}

func (s *service) start(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd := exec.Command(s.bin, "serve")
	cmd.Env = append(os.Environ(), s.env...)
	cmd.Stdout, cmd.Stderr = &s.log, &s.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }() //nolint:errcheck // killed by the test
	s.cmd, s.done = cmd, done
	var admin string
	for _, kv := range s.env {
		if v, ok := strings.CutPrefix(kv, "ADMIN_ADDR="); ok {
			admin = v
		}
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if res, err := http.Get("http://" + admin + "/readyz"); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-done:
			t.Fatalf("subscriberd serve exited at start:\n%s", s.log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("subscriberd serve not ready after 60 s:\n%s", s.log.String())
		}
	}
}

// kill ends the process at once (SIGKILL), as a crash would.
func (s *service) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill() //nolint:errcheck // already gone is fine
	<-s.done
	s.cmd = nil
}

// hangingReceiver is a webhook receiver that answers 204, or, while hanging, holds every
// request until released or its client gives up.
type hangingReceiver struct {
	srv     *httptest.Server
	hanging atomic.Bool
	mu      sync.Mutex
	gate    chan struct{}
}

func newHangingReceiver(t *testing.T) *hangingReceiver {
	r := &hangingReceiver{gate: make(chan struct{})}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		io.Copy(io.Discard, req.Body) //nolint:errcheck
		if r.hanging.Load() {
			r.mu.Lock()
			gate := r.gate
			r.mu.Unlock()
			select {
			case <-gate:
			case <-req.Context().Done():
				return
			}
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(func() { r.release(); r.srv.Close() })
	return r
}

func (r *hangingReceiver) hang() {
	r.mu.Lock()
	r.gate = make(chan struct{})
	r.mu.Unlock()
	r.hanging.Store(true)
}

func (r *hangingReceiver) release() {
	if r.hanging.Swap(false) {
		r.mu.Lock()
		close(r.gate)
		r.mu.Unlock()
	}
}

// promClient reads a Prometheus server's HTTP API.
type promClient struct{ base string }

func (p *promClient) get(path string, v any) error {
	res, err := http.Get(p.base + path)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, res.Status)
	}
	return json.NewDecoder(res.Body).Decode(v)
}

// names is the set of series names Prometheus holds.
func (p *promClient) names() map[string]bool {
	var res struct{ Data []string }
	if err := p.get("/api/v1/label/__name__/values", &res); err != nil {
		return nil
	}
	out := map[string]bool{}
	for _, n := range res.Data {
		out[n] = true
	}
	return out
}

// waitFor polls /api/v1/alerts until the alert is firing (firing true) or not (neither
// firing nor pending: resolved), and fails the test after timeout.
func (p *promClient) waitFor(t *testing.T, alert string, firing bool, timeout time.Duration) {
	t.Helper()
	start := time.Now()
	var last string
	for deadline := start.Add(timeout); ; time.Sleep(500 * time.Millisecond) {
		var res struct {
			Data struct {
				Alerts []struct {
					Labels map[string]string
					State  string
				}
			}
		}
		state := "inactive"
		if err := p.get("/api/v1/alerts", &res); err != nil {
			state = err.Error()
		}
		var states []string
		for _, a := range res.Data.Alerts {
			states = append(states, a.Labels["alertname"]+"="+a.State)
			if a.Labels["alertname"] == alert && (state == "inactive" || a.State == "firing") {
				state = a.State
			}
		}
		last = strings.Join(states, ", ")
		if (firing && state == "firing") || (!firing && state == "inactive") {
			t.Logf("%s %s after %s", alert, map[bool]string{true: "fired", false: "resolved"}[firing], time.Since(start).Round(time.Second))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not %s after %s; alerts: [%s]", alert, map[bool]string{true: "firing", false: "resolved"}[firing], timeout, last)
		}
	}
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// send makes a request with key and discards the answer; failures are part of the faults.
func send(target, method, key, body string, headers ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(k, strings.TrimSpace(v))
	}
	if res, err := http.DefaultClient.Do(req); err == nil {
		io.Copy(io.Discard, res.Body) //nolint:errcheck
		res.Body.Close()
	}
}

// call makes a request that must answer want.
func call(t *testing.T, method, target, key, body string, want int) {
	t.Helper()
	req, err := http.NewRequest(method, target, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != want {
		t.Fatalf("%s %s: %d %s; want %d", method, target, res.StatusCode, b, want)
	}
}
