package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/subscriberd/subscriberd/internal/logbuf"
)

// daemon is the built binary running in a directory, its output collected.
type daemon struct {
	cmd            *exec.Cmd
	stdout, stderr logbuf.Buffer
	exited         chan error
}

// startBinary runs bin with args in dir, with no DATABASE_URL or DATA_DIR in its environment
// and both listeners on free loopback ports.
func startBinary(t *testing.T, bin, dir string, args ...string) *daemon {
	t.Helper()
	var env []string
	for _, kv := range os.Environ() {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "DATABASE_URL", "DATA_DIR", "LISTEN_ADDR", "ADMIN_ADDR", "LOG_FORMAT", "REDIS_URL", "SMTP_URL":
		default:
			env = append(env, kv)
		}
	}
	d := &daemon{cmd: exec.Command(bin, args...), exited: make(chan error, 1)}
	d.cmd.Dir = dir
	d.cmd.Env = append(env, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0", "LOG_FORMAT=json")
	d.cmd.Stdout, d.cmd.Stderr = &d.stdout, &d.stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.exited <- d.cmd.Wait() }()
	t.Cleanup(func() {
		if d.cmd.ProcessState == nil {
			d.cmd.Process.Kill() //nolint:errcheck // the test failed before stopping it
			<-d.exited
		}
	})
	return d
}

// api waits for the "serving" log line and returns the public base URL.
func (d *daemon) api(t *testing.T) string {
	t.Helper()
	addr := regexp.MustCompile(`"msg":"serving".*"listen_addr":"([^"]+)"`)
	for deadline := time.Now().Add(60 * time.Second); ; {
		if m := addr.FindStringSubmatch(d.stderr.String()); m != nil {
			return "http://" + m[1]
		}
		select {
		case err := <-d.exited:
			t.Fatalf("the binary exited (%v) before serving; stderr:\n%s", err, d.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the binary did not start serving; stderr:\n%s", d.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop sends SIGTERM and wants a clean exit.
func (d *daemon) stop(t *testing.T) {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-d.exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v; stderr:\n%s", err, d.stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the binary did not stop after SIGTERM")
	}
}

func call(t *testing.T, method, url, key, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var v map[string]any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("%s %s: %d, body not JSON: %s", method, url, res.StatusCode, raw)
	}
	return res.StatusCode, v
}

// TestBinaryZeroSetup builds the binary and runs it as a newcomer would, with no database
// configured, in an empty directory: `dev` makes a key and prints a curl line, a subscriber is
// created, and after a restart (SIGTERM, start again) the subscriber is still there, in
// ./data/subscribers.db. The second `dev` makes no new key and says how to make one.
func TestBinaryZeroSetup(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "subscriberd")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0") // the embedded store needs no cgo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := t.TempDir()

	first := startBinary(t, bin, dir, "dev")
	base := first.api(t)
	if !strings.Contains(first.stderr.String(), "using the embedded SQLite database") {
		t.Errorf("no log line says the store is SQLite; stderr:\n%s", first.stderr.String())
	}
	var key, curl string
	for deadline := time.Now().Add(30 * time.Second); curl == ""; {
		sc := bufio.NewScanner(strings.NewReader(first.stdout.String()))
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if strings.HasPrefix(line, "sk_") {
				key = line
			}
			if strings.HasPrefix(line, "curl ") {
				curl = line
			}
		}
		if curl == "" && time.Now().After(deadline) {
			t.Fatalf("dev printed no curl line; stdout:\n%s", first.stdout.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !regexp.MustCompile(`^sk_[0-9A-Za-z]{40}$`).MatchString(key) {
		t.Fatalf("dev printed no key; stdout:\n%s", first.stdout.String())
	}
	for _, part := range []string{base + "/api/v1/subscribers", "'Authorization: Bearer " + key + "'",
		"-H 'Content-Type: application/json'", `-d '{"email":`} {
		if !strings.Contains(curl, part) {
			t.Errorf("the curl line lacks %q: %s", part, curl)
		}
	}
	// The request the curl line makes.
	body := curl[strings.Index(curl, "-d '")+4 : len(curl)-1]
	status, created := call(t, "POST", base+"/api/v1/subscribers", key, body)
	if status != http.StatusCreated {
		t.Fatalf("create = %d %v", status, created)
	}
	id := created["data"].(map[string]any)["id"].(string)
	first.stop(t)
	if _, err := os.Stat(filepath.Join(dir, "data", "subscribers.db")); err != nil {
		t.Fatalf("no database at ./data/subscribers.db: %v", err)
	}

	second := startBinary(t, bin, dir, "dev")
	base = second.api(t)
	status, got := call(t, "GET", base+"/api/v1/subscribers/"+id, key, "")
	if status != http.StatusOK || got["data"].(map[string]any)["email"] != "john@example.com" {
		t.Fatalf("after the restart GET = %d %v", status, got)
	}
	status, list := call(t, "GET", base+"/api/v1/subscribers", key, "")
	if total := list["pagination"].(map[string]any)["total"]; status != http.StatusOK || total != 1.0 {
		t.Errorf("after the restart the list = %d, total %v; want 1", status, total)
	}
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(second.stdout.String(), "apikey create --newsletter"); {
		if time.Now().After(deadline) {
			t.Fatalf("the second dev did not say how to make a key; stdout:\n%s", second.stdout.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if strings.Contains(second.stdout.String(), "sk_") {
		t.Errorf("the second dev made another key:\n%s", second.stdout.String())
	}
	second.stop(t)
}
