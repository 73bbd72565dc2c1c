package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
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

// cpuMeter measures the CPU the service and this tool use over a window.
type cpuMeter struct {
	t0       time.Time
	svc, own time.Duration
	pid      int
	ok       bool
}

func (m *cpuMeter) start(pid int) {
	m.pid, m.t0, m.own = pid, time.Now(), selfCPU()
	m.svc, m.ok = serviceCPU(pid)
}

// stop returns the cores used by the service (0 when unknown) and by this tool.
func (m *cpuMeter) stop() (service, tool float64) {
	if m.t0.IsZero() {
		return 0, 0
	}
	el := time.Since(m.t0).Seconds()
	tool = (selfCPU() - m.own).Seconds() / el
	if end, ok := serviceCPU(m.pid); ok && m.ok {
		service = (end - m.svc).Seconds() / el
	}
	return service, tool
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
