package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/subscriberd/subscriberd/internal/logbuf"
	"github.com/subscriberd/subscriberd/internal/testdb"
	"github.com/subscriberd/subscriberd/internal/testredis"
	"github.com/subscriberd/subscriberd/limits"
	"github.com/subscriberd/subscriberd/repo"
)

var pg *testdb.Server

func TestMain(m *testing.M) {
	code := testdb.Main(m, &pg)
	testredis.Stop()
	os.Exit(code)
}

// removeLimitKeys removes, when t ends, the limiter's Redis keys of the API key keyID (the
// service writes them under the default prefix).
func removeLimitKeys(t *testing.T, redisURL, keyID string) {
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rdb := redis.NewClient(opt)
		defer rdb.Close()
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, limits.DefaultRedisPrefix+"{"+keyID+"}*", 1000).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
	})
}

func envFunc(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestRunRejectsBadUsageAndConfig(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want string // in the error
	}{
		{"no command", nil, nil, "no command"},
		{"unknown command", []string{"launch"}, nil, `unknown command "launch"`},
		{"bad log level", []string{"serve"}, map[string]string{"LOG_LEVEL": "loud"}, "LOG_LEVEL"},
		{"bad log format", []string{"serve"}, map[string]string{"LOG_FORMAT": "xml"}, "LOG_FORMAT"},
		{"bad listen addr", []string{"serve"}, map[string]string{"LISTEN_ADDR": "8080"}, "LISTEN_ADDR"},
		{"bad admin addr flag", []string{"serve", "--admin-addr", "nope"}, nil, "ADMIN_ADDR"},
		{"bad database url", []string{"serve"}, map[string]string{"DATABASE_URL": "mysql://x@y/z"}, "DATABASE_URL"},
		{"sqlite url without slashes", []string{"serve"}, map[string]string{"DATABASE_URL": "sqlite:x.db"}, "DATABASE_URL"},
		{"sqlite url with a query", []string{"migrate"}, map[string]string{"DATABASE_URL": "sqlite:///tmp/x.db?mode=ro"}, "DATABASE_URL"},
		{"empty data dir flag", []string{"serve", "--data-dir="}, nil, "DATA_DIR"},
		{"bad docs ui", []string{"serve"}, map[string]string{"DOCS_UI": "no"}, "DOCS_UI"},
		{"bad public base url", []string{"serve"}, map[string]string{"PUBLIC_BASE_URL": "ftp://x"}, "PUBLIC_BASE_URL"},
		{"bad smtp url", []string{"serve"}, map[string]string{"SMTP_URL": "smtp://mail.example.com:99999"}, "SMTP_URL"},
		{"bad smtp scheme flag", []string{"serve", "--smtp-url", "http://mail.example.com"}, nil, "SMTP_URL"},
		{"bad mail from", []string{"serve"}, map[string]string{"MAIL_FROM": "not an address"}, "MAIL_FROM"},
		{"bad rate limits", []string{"serve"}, map[string]string{"RATE_LIMITS": "60/minute"}, "RATE_LIMITS"},
		{"bad bulk rate limits flag", []string{"serve", "--bulk-rate-limits", "ten"}, nil, "BULK_RATE_LIMITS"},
		{"bad auth lockout", []string{"serve"}, map[string]string{"AUTH_LOCKOUT": "10/10m"}, "AUTH_LOCKOUT"},
		{"bad write lockout", []string{"serve"}, map[string]string{"WRITE_LOCKOUT": "0/10m:10m"}, "WRITE_LOCKOUT"},
		{"bad confirm rate limits", []string{"serve"}, map[string]string{"CONFIRM_RATE_LIMITS": "30/minute"}, "CONFIRM_RATE_LIMITS"},
		{"bad trusted proxies", []string{"serve"}, map[string]string{"TRUSTED_PROXIES": "10.0.0.0/40"}, "TRUSTED_PROXIES"},
		{"bad redis url", []string{"serve"}, map[string]string{"REDIS_URL": "http://127.0.0.1:6379"}, "REDIS_URL"},
		{"newsletter without name", []string{"newsletter", "create"}, nil, "--name is required"},
		{"apikey without newsletter", []string{"apikey", "create"}, nil, "--newsletter"},
		{"revoke without id", []string{"apikey", "revoke"}, nil, "ID argument is required"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := run(t.Context(), tc.args, envFunc(tc.env), io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("run(%v) = %v, want an error mentioning %q", tc.args, err, tc.want)
			}
		})
	}
	// A DATA_DIR that cannot be a directory stops the first command, naming DATA_DIR.
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	err := run(t.Context(), []string{"newsletter", "create", "--name", "x"}, envFunc(map[string]string{"DATA_DIR": file}), io.Discard, io.Discard)
	if err == nil || !strings.HasPrefix(err.Error(), "DATA_DIR") {
		t.Errorf("DATA_DIR on a file: %v, want an error naming DATA_DIR", err)
	}
	// A password in DATABASE_URL never appears in an error.
	err = run(t.Context(), []string{"serve"}, envFunc(map[string]string{
		"DATABASE_URL": "postgres://u:hunter2@127.0.0.1:1/x?sslmode=disable", "LISTEN_ADDR": "x"}), io.Discard, io.Discard)
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error %v leaks the password or is missing", err)
	}
}

// cli runs one command and decodes its JSON output.
func cli(t *testing.T, env map[string]string, args ...string) map[string]any {
	t.Helper()
	var out, errOut bytes.Buffer
	if err := run(t.Context(), args, envFunc(env), &out, &errOut); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, errOut.String())
	}
	var v map[string]any
	if err := json.Unmarshal(out.Bytes(), &v); err != nil {
		t.Fatalf("%v: stdout is not one JSON object: %q", args, out.String())
	}
	return v
}

func TestServeLifecycle(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"DATABASE_URL": pg.Empty(t), // does not exist yet: migrate creates it
		"LISTEN_ADDR":  "127.0.0.1:0",
		"ADMIN_ADDR":   "127.0.0.1:0",
		"LOG_FORMAT":   "json",
		"REDIS_URL":    testredis.URL(t),
	}
	cli(t, env, "migrate")
	nl := cli(t, env, "newsletter", "create", "--name", "Lifecycle")
	if nl["name"] != "Lifecycle" || nl["api_access"] != true {
		t.Fatalf("newsletter = %v", nl)
	}
	key := cli(t, env, "apikey", "create", "--newsletter", nl["id"].(string), "--label", "ci")
	if !regexp.MustCompile(`^sk_[0-9A-Za-z]{40}$`).MatchString(key["key"].(string)) || !strings.HasPrefix(key["key"].(string), key["prefix"].(string)) {
		t.Fatalf("apikey = %v", key)
	}
	removeLimitKeys(t, env["REDIS_URL"], key["id"].(string))
	updated := cli(t, env, "newsletter", "update", nl["id"].(string), "--api-access=true", "--name", "Renamed")
	if updated["name"] != "Renamed" {
		t.Errorf("updated newsletter = %v", updated)
	}

	s := startServe(t, env)
	api, admin, logs := s.api, s.admin, s.logs

	req, _ := http.NewRequest("POST", api+"/api/v1/subscribers", strings.NewReader(`{"email":"life@example.com"}`))
	req.Header.Set("Authorization", "Bearer "+key["key"].(string))
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("create = %d %s", res.StatusCode, body)
	}
	if got := res.Header.Get("RateLimit-Limit"); got != "60" {
		t.Errorf("RateLimit-Limit = %q, want 60 (the default minute window)", got)
	}
	for _, c := range []struct{ path, want string }{
		{"/livez", "ok"}, {"/readyz", "ok"}, {"/healthz", "ok"},
		{"/metrics", `http_server_request_duration_seconds_count{code="201",method="POST",route="/api/v1/subscribers"} 1`},
		{"/metrics", `rate_limit_decisions_total{outcome="allowed",scope="key"} 1`},
		{"/metrics", "rate_limit_redis_up 1"},
	} {
		res, err := http.Get(admin + c.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || !strings.Contains(string(b), c.want) {
			t.Errorf("GET %s = %d, want 200 containing %q", c.path, res.StatusCode, c.want)
		}
	}
	if res, err := http.Get(api + "/metrics"); err == nil {
		res.Body.Close()
		if res.StatusCode != http.StatusNotFound {
			t.Errorf("public /metrics = %d, want 404: metrics only on the admin listener", res.StatusCode)
		}
	}

	cli(t, env, "apikey", "revoke", key["id"].(string))
	s.stop(t)
	if strings.Contains(logs.String(), key["key"].(string)) || strings.Contains(logs.String(), "life@example.com") {
		t.Error("logs contain the API key or the subscriber's email")
	}
}

// served is `serve` running in the test's process.
type served struct {
	api, admin string // base URLs of the listeners
	logs       *logbuf.Buffer
	cancel     context.CancelFunc
	done       chan error
}

// startServe runs `serve` with env and returns once both listeners are bound.
func startServe(t *testing.T, env map[string]string) *served {
	t.Helper()
	return startRun(t, env, io.Discard, "serve")
}

// startRun runs the command args (serve or dev) with env, its stdout to stdout, and returns
// once both listeners are bound.
func startRun(t *testing.T, env map[string]string, stdout io.Writer, args ...string) *served {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	s := &served{logs: &logbuf.Buffer{}, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- run(ctx, args, envFunc(env), stdout, s.logs) }()
	addrs := regexp.MustCompile(`"listen_addr":"([^"]+)","admin_addr":"([^"]+)"`)
	var m []string
	for deadline := time.Now().Add(60 * time.Second); m == nil; time.Sleep(20 * time.Millisecond) {
		if m = addrs.FindStringSubmatch(s.logs.String()); m == nil && time.Now().After(deadline) {
			t.Fatalf("serve did not start; logs:\n%s", s.logs.String())
		}
	}
	s.api, s.admin = "http://"+m[1], "http://"+m[2]
	return s
}

// stop cancels serve and waits for it to return nil, as on SIGTERM.
func (s *served) stop(t *testing.T) {
	t.Helper()
	s.cancel()
	select {
	case err := <-s.done:
		if err != nil {
			t.Errorf("serve returned %v after cancel, want nil", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("serve did not stop after cancel")
	}
}

// TestShutdownCutsWhatOutlastsTheGrace: a request still in flight when the grace ends (here a
// client that sent half its headers and stalls) is cut, and serve still stops cleanly (§7:
// exit 0). Not parallel: it shortens the grace, which the parallel tests read only after it.
func TestShutdownCutsWhatOutlastsTheGrace(t *testing.T) {
	grace := shutdownGrace
	shutdownGrace = time.Second
	t.Cleanup(func() { shutdownGrace = grace })
	env := map[string]string{
		"DATABASE_URL": pg.Empty(t),
		"LISTEN_ADDR":  "127.0.0.1:0",
		"ADMIN_ADDR":   "127.0.0.1:0",
		"LOG_FORMAT":   "json",
	}
	cli(t, env, "migrate")
	s := startServe(t, env)
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.api, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("POST /api/v1/subscribers HTTP/1.1\r\nHost: x\r\n")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the server has read the first line: the request is in flight
	start := time.Now()
	s.stop(t)
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("serve took %v to stop with a 1 s grace; the stalled request was not cut", d)
	}
	if !strings.Contains(s.logs.String(), "shutdown grace over") || !strings.Contains(s.logs.String(), `"msg":"stopped"`) {
		t.Errorf("logs lack the grace warning or the stop:\n%s", s.logs.String())
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck // a test
	if _, err := conn.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("read on the stalled connection after the stop = %v, want it closed", err)
	}
}

// serve --migrate=false on a database nobody migrated says to migrate, not what SQL said.
func TestServeWithoutMigrationsSaysToMigrate(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": pg.Empty(t), "LISTEN_ADDR": "127.0.0.1:0", "ADMIN_ADDR": "127.0.0.1:0"}
	if repo.IsSQLite(env["DATABASE_URL"]) { // an empty file in an existing directory
		path, err := repo.SQLitePath(env["DATABASE_URL"])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
	} else { // an existing database without tables
		cli(t, env, "migrate")
		db, err := repo.Open(env["DATABASE_URL"], repo.Options{MaxConns: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		for _, q := range []string{"DROP SCHEMA public CASCADE", "CREATE SCHEMA public"} {
			if _, err := db.ExecContext(t.Context(), q); err != nil {
				t.Fatal(err)
			}
		}
	}
	msg, _ := runErr(t, env, "serve", "--migrate=false")
	if !strings.Contains(msg, "migrations pending: run subscriberd migrate first") {
		t.Errorf("serve --migrate=false on an empty database: %q", msg)
	}
}
