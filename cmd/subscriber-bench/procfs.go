package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
)

// clockTicks is the kernel's USER_HZ, the unit of the times in /proc/PID/stat: 100 on every
// Linux architecture Go supports.
const clockTicks = 100

func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / clockTicks }

// dbProcessName is the command name of every PostgreSQL server process (postmaster,
// backends, background workers), in a container as on the host.
const dbProcessName = "postgres"

// databaseCPU returns the CPU time used so far by the PostgreSQL server processes this tool
// can see (any server's), with the exited children their postmaster reaped, so that a backend
// ending within a window still counts. ok is false when none is visible.
func databaseCPU() (d time.Duration, ok bool) {
	procs, err := procfs.AllProcs()
	if err != nil {
		return 0, false
	}
	for _, p := range procs {
		if comm, err := p.Comm(); err != nil || comm != dbProcessName {
			continue
		}
		if s, err := p.Stat(); err == nil { // else exited meanwhile: its parent's children times hold it now
			d += ticks(int64(s.UTime) + int64(s.STime) + int64(s.CUTime) + int64(s.CSTime))
			ok = true
		}
	}
	return d, ok
}

func serviceCPU(pid int) (time.Duration, bool) {
	if pid <= 0 {
		return 0, false
	}
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, false
	}
	s, err := p.Stat()
	return ticks(int64(s.UTime) + int64(s.STime)), err == nil
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuMeter measures the CPU the service, PostgreSQL and this tool use over a window.
type cpuMeter struct {
	t0           time.Time
	svc, db, own time.Duration
	pid          int
	svcOK, dbOK  bool
}

func (m *cpuMeter) start(pid int) {
	m.pid, m.t0, m.own = pid, time.Now(), selfCPU()
	m.svc, m.svcOK = serviceCPU(pid)
	m.db, m.dbOK = databaseCPU()
}

// stop returns the cores used by the service and by PostgreSQL (0 when unknown) and by this
// tool.
func (m *cpuMeter) stop() (service, db, tool float64) {
	if m.t0.IsZero() {
		return 0, 0, 0
	}
	el := time.Since(m.t0).Seconds()
	tool = (selfCPU() - m.own).Seconds() / el
	if end, ok := serviceCPU(m.pid); ok && m.svcOK {
		service = (end - m.svc).Seconds() / el
	}
	if end, ok := databaseCPU(); ok && m.dbOK && end >= m.db {
		db = (end - m.db).Seconds() / el
	}
	return service, db, tool
}

// rss records the service's peak RSS since the last reset under the label during (when
// record), then resets the peak ("5" to /proc/PID/clear_refs) for the next part of the run.
func (b *bench) rss(during string, record bool) error {
	if b.cfg.pid <= 0 {
		return nil
	}
	if record {
		p, err := procfs.NewProc(b.cfg.pid)
		if err != nil {
			return err
		}
		st, err := p.NewStatus()
		if err != nil {
			return err
		}
		b.rep.RSS = append(b.rep.RSS, RSSRecord{During: during, PeakMiB: float64(st.VmHWM) / (1 << 20)})
	}
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", b.cfg.pid), []byte("5"), 0); err != nil {
		return fmt.Errorf("reset the peak RSS (%v): later peaks include earlier parts of the run", err)
	}
	return nil
}

// profile starts fetching a CPU profile of a measured run, or a goroutine dump halfway through
// a check, of the service; the returned function waits for it.
func (b *bench) profile(ctx context.Context, scenario string, clients int, phase string, dur time.Duration) func() {
	done := make(chan struct{})
	base := strings.TrimRight(b.cfg.pprofURL, "/") + "/debug/pprof/"
	name := filepath.Join(b.cfg.profileDir, fmt.Sprintf("%s-%s-%d", phase, scenario, clients))
	go func() {
		defer close(done)
		var err error
		if phase == "check" {
			select {
			case <-time.After(dur / 2):
			case <-ctx.Done():
				return
			}
			err = fetch(ctx, base+"goroutine?debug=1", name+".goroutines.txt")
		} else {
			secs := max(1, int(dur.Seconds()))
			err = fetch(ctx, fmt.Sprintf("%sprofile?seconds=%d", base, secs), name+".cpu.pprof")
		}
		if err != nil {
			fmt.Fprintf(b.log, "warning: profile of %s: %v\n", scenario, err)
		}
	}()
	return func() { <-done }
}

func fetch(ctx context.Context, url, path string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// tcpPorts returns the local ports of the TCP sockets process pid holds open (its fd links
// "socket:[N]" looked up in its net/tcp and tcp6): a database connection's local port is its
// client_port in pg_stat_activity.
func tcpPorts(pid int) ([]int, error) {
	if pid <= 0 {
		return nil, errors.New("no process id")
	}
	p, err := procfs.NewProc(pid)
	if err != nil {
		return nil, err
	}
	targets, err := p.FileDescriptorTargets()
	if err != nil {
		return nil, err
	}
	inodes := map[uint64]bool{}
	for _, t := range targets {
		if ino, ok := strings.CutPrefix(t, "socket:["); ok {
			if n, err := strconv.ParseUint(strings.TrimSuffix(ino, "]"), 10, 64); err == nil {
				inodes[n] = true
			}
		}
	}
	fs, err := procfs.NewFS(fmt.Sprintf("/proc/%d", pid))
	if err != nil {
		return nil, err
	}
	var ports []int
	//lint:ignore SA1019 netlink's socket diagnostics, which deprecate these, give the same table through another dependency
	for _, table := range []func() (procfs.NetTCP, error){fs.NetTCP, fs.NetTCP6} {
		lines, _ := table() // no IPv6: no table
		for _, l := range lines {
			if inodes[l.Inode] {
				ports = append(ports, int(l.LocalPort))
			}
		}
	}
	return ports, nil
}

// processEnv returns the environment of process pid (/proc/PID/environ).
func processEnv(pid int) ([]string, error) {
	if pid <= 0 {
		return nil, errors.New("no process id")
	}
	p, err := procfs.NewProc(pid)
	if err != nil {
		return nil, err
	}
	return p.Environ()
}

// workerSettings are the service's settings of its background workers, each a count whose
// default is not 0.
var workerSettings = []string{"EMAIL_WORKERS", "WEBHOOK_WORKERS", "IMPORT_WORKERS", "BULK_ACTION_WORKERS"}

// runningWorkers names the workerSettings that env leaves on (unset, or not "0").
func runningWorkers(env []string) []string {
	set := map[string]string{}
	for _, kv := range env {
		if name, v, ok := strings.Cut(kv, "="); ok {
			set[name] = v
		}
	}
	var out []string
	for _, name := range workerSettings {
		if v, ok := set[name]; !ok || strings.TrimSpace(v) != "0" {
			out = append(out, name)
		}
	}
	return out
}

// telemetrySettings keeps, sorted, the variables of env that decide what telemetry costs: the
// OpenTelemetry SDK's (not *HEADERS, which may carry credentials), logging's and the runtime's.
func telemetrySettings(env []string) []string {
	var out []string
	for _, kv := range env {
		name, _, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		switch {
		case strings.HasPrefix(name, "OTEL_") && !strings.Contains(name, "HEADERS"):
		case name == "LOG_LEVEL", name == "LOG_FORMAT", name == "GOGC", name == "GOMEMLIMIT", name == "GOMAXPROCS":
		default:
			continue
		}
		out = append(out, kv)
	}
	sort.Strings(out)
	return out
}
