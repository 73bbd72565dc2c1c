package main

import (
	"bufio"
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
)

// peakRSS reads VmHWM, the peak resident set size, of process pid in KiB from status, the
// text of /proc/PID/status.
func peakRSS(status io.Reader) (int64, error) {
	sc := bufio.NewScanner(status)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != "VmHWM" {
			continue
		}
		f := strings.Fields(val)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("VmHWM line %q", sc.Text())
		}
		return strconv.ParseInt(f[0], 10, 64)
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no VmHWM line")
}

// clockTicks is the kernel's USER_HZ, the unit of the times in /proc/PID/stat: 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// procCPU returns the user plus system CPU time of process pid from the text of
// /proc/PID/stat (fields 14 and 15, counted after the parenthesised command name, which may
// itself contain spaces).
func procCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("no command name in %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("short stat line %q", stat)
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat field %q: %w", s, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// procCPUWithChildren is procCPU plus the CPU of the process's children that it has waited
// for (fields 16 and 17): for PostgreSQL's postmaster, the backends that have exited.
func procCPUWithChildren(stat string) (time.Duration, error) {
	own, err := procCPU(stat)
	if err != nil {
		return 0, err
	}
	f := strings.Fields(stat[strings.LastIndexByte(stat, ')')+1:])
	if len(f) < 15 {
		return 0, fmt.Errorf("short stat line %q", stat)
	}
	var ticks int64
	for _, s := range f[13:15] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat field %q: %w", s, err)
		}
		ticks += n
	}
	return own + time.Duration(ticks)*time.Second/clockTicks, nil
}

// dbProcessName is the command name of every PostgreSQL server process (postmaster,
// backends, background workers), in a container as on the host.
const dbProcessName = "postgres"

// databaseCPU returns the CPU time used so far by the PostgreSQL server processes this tool
// can see: every process named postgres, with the exited children its postmaster reaped, so
// that a backend ending within a window still counts. Other PostgreSQL servers on the machine
// count too; on the bench machine they are idle. ok is false when none is visible.
func databaseCPU() (d time.Duration, ok bool) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	for _, e := range ents {
		name := e.Name()
		if name == "" || name[0] < '0' || name[0] > '9' {
			continue
		}
		comm, err := os.ReadFile("/proc/" + name + "/comm")
		if err != nil || strings.TrimSpace(string(comm)) != dbProcessName {
			continue
		}
		b, err := os.ReadFile("/proc/" + name + "/stat")
		if err != nil {
			continue // exited meanwhile: its parent's children times hold it now
		}
		if t, err := procCPUWithChildren(string(b)); err == nil {
			d += t
			ok = true
		}
	}
	return d, ok
}

func serviceCPU(pid int) (time.Duration, bool) {
	if pid <= 0 {
		return 0, false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	d, err := procCPU(string(b))
	return d, err == nil
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
// record), then resets the peak so the next part of the run is measured on its own. Linux
// resets VmHWM to the current RSS when "5" is written to /proc/PID/clear_refs.
func (b *bench) rss(during string, record bool) error {
	if b.cfg.pid <= 0 {
		return nil
	}
	proc := fmt.Sprintf("/proc/%d", b.cfg.pid)
	if record {
		f, err := os.Open(proc + "/status")
		if err != nil {
			return err
		}
		kb, err := peakRSS(f)
		f.Close()
		if err != nil {
			return err
		}
		b.rep.RSS = append(b.rep.RSS, RSSRecord{During: during, PeakMiB: float64(kb) / 1024})
	}
	if err := os.WriteFile(proc+"/clear_refs", []byte("5"), 0); err != nil {
		return fmt.Errorf("reset the peak RSS (%v): later peaks include earlier parts of the run", err)
	}
	return nil
}

// profile starts fetching profiles of the service for a scenario measured for dur: a CPU
// profile of the measured run for the main phase, a goroutine dump halfway through a check.
// The returned function waits for them.
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

// tcpPorts returns the local ports of the TCP sockets process pid holds open: the inodes of
// its /proc/PID/fd links "socket:[N]" looked up in /proc/PID/net/tcp and tcp6. A database
// connection's local port is its client_port in pg_stat_activity, which tells the connections
// of one service process from those of another process with the same application_name.
func tcpPorts(pid int) ([]int, error) {
	if pid <= 0 {
		return nil, errors.New("no process id")
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		if ino, ok := strings.CutPrefix(link, "socket:["); ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	var ports []int
	for _, table := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			continue // no IPv6
		}
		ports = append(ports, socketPorts(string(b), inodes)...)
	}
	return ports, nil
}

// socketPorts returns the local ports of the sockets of a /proc/net/tcp table whose inode is
// in inodes. A line is "sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout
// inode ...", the addresses as hex "ADDR:PORT".
func socketPorts(table string, inodes map[string]bool) []int {
	var ports []int
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || !inodes[f[9]] {
			continue
		}
		_, hexPort, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		if p, err := strconv.ParseUint(hexPort, 16, 16); err == nil {
			ports = append(ports, int(p))
		}
	}
	return ports
}

// processEnv returns the environment of process pid (/proc/PID/environ).
func processEnv(pid int) ([]string, error) {
	if pid <= 0 {
		return nil, errors.New("no process id")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return nil, err
	}
	var env []string
	for _, kv := range strings.Split(string(b), "\x00") {
		if kv != "" {
			env = append(env, kv)
		}
	}
	return env, nil
}

// telemetrySettings keeps the variables of env that decide what telemetry costs a service:
// the OpenTelemetry SDK's (but not OTEL_EXPORTER_OTLP_*HEADERS, which may carry credentials),
// its log level and format, and the Go runtime's GC and CPU settings. Sorted.
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
