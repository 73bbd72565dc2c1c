package main

import (
	"bytes"
	"flag"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/subscriberd/subscriberd/limits"
	"github.com/subscriberd/subscriberd/mail"
	"github.com/subscriberd/subscriberd/webhook"
)

// loadConfig parses args as serve's settings would be, with env and, for dev, its defaults.
func loadConfig(t *testing.T, env map[string]string, dev bool, args ...string) (*Config, error) {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	l := bindConfig(fs, envFunc(env))
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	var defaults map[string]string
	if dev {
		defaults = devDefaults
	}
	return l.load(defaults)
}

func TestConfigDefaultsComeFromTheirPackages(t *testing.T) {
	cfg, err := loadConfig(t, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	rate, _ := limits.ParseWindows("", limits.DefaultRateLimits)
	bulk, _ := limits.ParseWindows("", limits.DefaultBulkRateLimits)
	auth, _ := limits.ParseLockout("", limits.DefaultAuthLockout)
	write, _ := limits.ParseLockout("", limits.DefaultWriteLockout)
	confirm, _ := limits.ParseWindows("", limits.DefaultConfirmRateLimits)
	want := Config{
		DatabaseURL: "sqlite://" + filepath.Join("data", sqliteFile), DataDir: "./data",
		ListenAddr: ":8080", AdminAddr: ":9090", PublicBaseURL: "http://localhost:8080",
		MailFrom: mail.DefaultFrom, RateLimits: rate, BulkRateLimits: bulk, AuthLockout: auth, WriteLockout: write,
		ConfirmRateLimits: confirm,
		LogLevel:          slog.LevelInfo, LogFormat: "json",
		IdempotencyTTL: 24 * time.Hour, WebhookTimeout: 10 * time.Second, WebhookAllowPrivate: false, DocsUI: true,
		WebhookWorkers: webhook.DefaultWorkers, EmailWorkers: 1,
		ImportMaxRows: 1_000_000, ImportMaxBytes: 256 << 20, ImportWorkers: 1, BulkActionWorkers: 1,
	}
	if diff := cmp.Diff(want, *cfg, cmp.AllowUnexported(Config{}), cmp.FilterPath(func(p cmp.Path) bool {
		f := p.Last().String()
		return f == ".raw" || f == ".explicit" || f == ".storeFrom"
	}, cmp.Ignore())); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	if cfg.Explicit("LISTEN_ADDR") {
		t.Error("a defaulted LISTEN_ADDR counts as explicit")
	}
}

func TestConfigFlagOverridesEnvOverridesDefault(t *testing.T) {
	env := map[string]string{"LISTEN_ADDR": "127.0.0.1:1", "ADMIN_ADDR": "127.0.0.1:2", "IDEMPOTENCY_TTL": "1h",
		"WEBHOOK_ALLOW_PRIVATE": "true"}
	cfg, err := loadConfig(t, env, false, "--listen-addr", "127.0.0.1:3", "--docs-ui=false", "--webhook-timeout", "3s")
	if err != nil {
		t.Fatal(err)
	}
	got := []any{cfg.ListenAddr, cfg.AdminAddr, cfg.IdempotencyTTL, cfg.WebhookAllowPrivate, cfg.DocsUI, cfg.WebhookTimeout}
	want := []any{"127.0.0.1:3", "127.0.0.1:2", time.Hour, true, false, 3 * time.Second}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if !cfg.Explicit("LISTEN_ADDR") || !cfg.Explicit("ADMIN_ADDR") || cfg.Explicit("PUBLIC_BASE_URL") {
		t.Errorf("explicit = %v", cfg.explicit)
	}
}

func TestConfigDevTurnsLockoutsOffUnlessSet(t *testing.T) {
	cfg, err := loadConfig(t, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.AuthLockout.Enabled() || cfg.WriteLockout.Enabled() {
		t.Errorf("dev lockouts = %+v, %+v; want both off", cfg.AuthLockout, cfg.WriteLockout)
	}
	if len(cfg.RateLimits) == 0 {
		t.Error("dev turned the rate limits off too")
	}
	cfg, err = loadConfig(t, map[string]string{"AUTH_LOCKOUT": "3/1m:1m"}, true)
	if err != nil {
		t.Fatal(err)
	}
	if want := (limits.Lockout{Failures: 3, Window: time.Minute, Lock: time.Minute}); cfg.AuthLockout != want {
		t.Errorf("dev with AUTH_LOCKOUT set = %+v, want %+v", cfg.AuthLockout, want)
	}
}

func TestConfigRejectsBadValuesNamingTheVariable(t *testing.T) {
	for _, name := range []string{"IDEMPOTENCY_TTL", "WEBHOOK_TIMEOUT", "WEBHOOK_ALLOW_PRIVATE", "WEBHOOK_WORKERS", "EMAIL_WORKERS", "IMPORT_WORKERS", "DOCS_UI", "LOG_LEVEL", "LOG_FORMAT"} {
		_, err := loadConfig(t, map[string]string{name: "-soon"}, false)
		if err == nil || !strings.HasPrefix(err.Error(), name+": ") {
			t.Errorf("%s=-soon: %v, want an error starting with %s", name, err, name)
		}
	}
}

// TestConfigWorkersBounds: each worker count (WEBHOOK_WORKERS, EMAIL_WORKERS, IMPORT_WORKERS)
// takes 0 (none: another instance must) to 256, and refuses anything else naming itself.
func TestConfigWorkersBounds(t *testing.T) {
	for _, name := range []string{"WEBHOOK_WORKERS", "EMAIL_WORKERS", "IMPORT_WORKERS"} {
		for raw, want := range map[string]int{"0": 0, "1": 1, "256": 256} {
			cfg, err := loadConfig(t, map[string]string{name: raw}, false)
			if err != nil {
				t.Errorf("%s=%s: %v", name, raw, err)
				continue
			}
			got := map[string]int{"WEBHOOK_WORKERS": cfg.WebhookWorkers, "EMAIL_WORKERS": cfg.EmailWorkers, "IMPORT_WORKERS": cfg.ImportWorkers}[name]
			if got != want {
				t.Errorf("%s=%s: %d; want %d", name, raw, got, want)
			}
		}
		for _, raw := range []string{"-1", "257", "1.5", "eight"} {
			if _, err := loadConfig(t, map[string]string{name: raw}, false); err == nil ||
				err.Error() != name+`: "`+raw+`" is not a whole number from 0 to 256` {
				t.Errorf("%s=%s: %v", name, raw, err)
			}
		}
	}
}

func TestConfigLogMasksPasswords(t *testing.T) {
	cfg, err := loadConfig(t, map[string]string{
		"DATABASE_URL": "postgres://app:hunter2@db:5432/subs", "SMTP_URL": "smtps://mailer:s3cret@smtp.example.com",
		"REDIS_URL": "redis://:r3dis@127.0.0.1:6379/0",
	}, false)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("configuration", "config", cfg)
	out := buf.String()
	for _, secret := range []string{"hunter2", "s3cret", "r3dis"} {
		if strings.Contains(out, secret) {
			t.Errorf("the logged configuration holds %q:\n%s", secret, out)
		}
	}
	for _, want := range []string{`"DATABASE_URL":"postgres://app:xxxxx@db:5432/subs"`, `"LISTEN_ADDR":":8080"`, `"IDEMPOTENCY_TTL":"24h"`} {
		if !strings.Contains(out, want) {
			t.Errorf("the logged configuration lacks %s:\n%s", want, out)
		}
	}
	// PostgreSQL takes the password as a query parameter too.
	if got := redact("postgres://app@db:5432/subs?sslmode=disable&password=hunter3&sslpassword=k3y"); strings.Contains(got, "hunter3") ||
		strings.Contains(got, "k3y") || !strings.Contains(got, "sslmode=disable") {
		t.Errorf("redact = %q, want the query's passwords masked and the rest kept", got)
	}
	if got := redact("host=127.0.0.1 password=hunter4"); strings.Contains(got, "hunter4") {
		t.Errorf("redact of a keyword/value DSN = %q", got)
	}
}

// TestConfigBoolsSayOnAndOff: booleans take on and off as well, as DOCS_UI=off is written in
// the docs and other settings say off (RATE_LIMITS=off).
func TestConfigBoolsSayOnAndOff(t *testing.T) {
	for raw, want := range map[string]bool{"off": false, "on": true, "false": false, "true": true} {
		cfg, err := loadConfig(t, map[string]string{"DOCS_UI": raw}, false)
		if err != nil || cfg.DocsUI != want {
			t.Errorf("DOCS_UI=%s: DocsUI %v, %v; want %v", raw, cfg.DocsUI, err, want)
		}
	}
}

// TestParseByteSize: IMPORT_MAX_BYTES takes bytes or KiB, MiB, GiB; anything else stops the
// start with a line naming the variable.
func TestParseByteSize(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want int64
	}{{"256MiB", 256 << 20}, {"1024", 1024}, {"2 GiB", 2 << 30}, {"64KiB", 64 << 10}} {
		if got, err := parseByteSize("IMPORT_MAX_BYTES", tc.raw); err != nil || got != tc.want {
			t.Errorf("parseByteSize(%q) = %d, %v; want %d", tc.raw, got, err, tc.want)
		}
	}
	for _, raw := range []string{"", "0", "-1MiB", "256MB", "lots", "99999999999GiB"} {
		if _, err := parseByteSize("IMPORT_MAX_BYTES", raw); err == nil || !strings.HasPrefix(err.Error(), "IMPORT_MAX_BYTES: ") {
			t.Errorf("parseByteSize(%q) = %v; want an error naming the variable", raw, err)
		}
	}
}
