package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/subscriberd/subscriberd/limits"
	"github.com/subscriberd/subscriberd/mail"
	"github.com/subscriberd/subscriberd/repo"
	"github.com/subscriberd/subscriberd/telemetry"
	"github.com/subscriberd/subscriberd/webhook"
)

// Config is the whole configuration (docs/api-contract.md §7 and §11), read once at start from
// the environment and flags, validated before anything starts. Packages receive its values,
// never the Config.
//
// Adding a setting: a field here and one line in [Config.settings].
type Config struct {
	DatabaseURL       string // postgres://… or sqlite://…; after loading never empty (DATA_DIR fills it)
	DataDir           string
	ListenAddr        string
	AdminAddr         string
	PublicBaseURL     string
	SMTPURL           string // "" = emails are logged, not sent
	EmailWorkers      int    // email workers this instance runs; 0 = it sends none
	MailFrom          string
	RedisURL          string // "" = limit counters in the process
	RateLimits        []limits.Window
	BulkRateLimits    []limits.Window
	AuthLockout       limits.Lockout
	WriteLockout      limits.Lockout
	ConfirmRateLimits []limits.Window // per client IP, the confirmation pages
	TrustedProxies    []netip.Prefix
	LogLevel          slog.Level
	LogFormat         string

	// Version 1.1 (docs/api-contract.md §11).
	IdempotencyTTL      time.Duration
	WebhookTimeout      time.Duration
	WebhookAllowPrivate bool
	WebhookWorkers      int  // endpoints this instance delivers to at once; 0 = it delivers none
	DocsUI              bool // serve the API reference page /api/v1/docs

	// Imports (docs/api-contract.md §15, §17).
	ImportMaxRows  int64
	ImportMaxBytes int64
	ImportWorkers  int // imports this instance processes at once; 0 = it processes none

	// BulkActionWorkers is how many bulk actions (docs/api-contract.md §20.2) this instance
	// processes at once; 0 = it processes none.
	BulkActionWorkers int

	// raw is each loaded setting as given (or defaulted), for the log; explicit names those
	// given by a flag or the environment rather than defaulted.
	raw      map[string]string
	explicit map[string]bool
	// storeFrom names the variable that chose the database: DATA_DIR when DATABASE_URL was unset.
	storeFrom string
}

// Defaults this package owns; the others come from the package that uses the value.
const (
	defaultDataDir       = "./data"
	defaultListenAddr    = ":8080"
	defaultAdminAddr     = ":9090"
	defaultPublicBaseURL = "http://localhost:8080"
	// Version 1.1 defaults (docs/api-contract.md §11), until the packages that use them export theirs.
	defaultIdempotencyTTL      = "24h"
	defaultWebhookTimeout      = "10s"
	defaultWebhookAllowPrivate = "false"
	defaultDocsUI              = "true"
)

// sqliteFile is the name of the embedded database's file in DATA_DIR.
const sqliteFile = "subscribers.db"

// setting is one configuration value: an environment variable, overridable by the flag of the
// same name in kebab case (DATABASE_URL → --database-url).
type setting struct {
	env    string
	def    string // as the environment spells it
	usage  string
	secret bool // a URL whose password is masked when logged
	parse  func(name, raw string) error
}

// settings lists every variable, bound to the fields of c.
func (c *Config) settings() []setting {
	return []setting{
		{"DATABASE_URL", "", "postgres://… (PostgreSQL) or sqlite:///path.db; unset = SQLite in DATA_DIR", true, to(&c.DatabaseURL, parseText)},
		{"DATA_DIR", defaultDataDir, "directory of the embedded SQLite database (" + sqliteFile + ") when DATABASE_URL is unset", false, to(&c.DataDir, parseText)},
		{"LISTEN_ADDR", defaultListenAddr, "public API and confirmation pages", false, to(&c.ListenAddr, parseAddr)},
		{"ADMIN_ADDR", defaultAdminAddr, "/metrics, /livez, /readyz, /debug/pprof/", false, to(&c.AdminAddr, parseAddr)},
		{"PUBLIC_BASE_URL", defaultPublicBaseURL, "base of links in emails (dev: follows LISTEN_ADDR unless set)", false, to(&c.PublicBaseURL, parseHTTPURL)},
		{"SMTP_URL", "", "smtp://user:pass@host:port or smtps://…; unset = emails are logged", true, to(&c.SMTPURL, parseText)},
		{"EMAIL_WORKERS", "1", "email workers this instance runs, each sending one email at a time; 0 = it sends none (another instance must)", false, to(&c.EmailWorkers, parseWorkers)},
		{"MAIL_FROM", mail.DefaultFrom, "sender of emails", false, to(&c.MailFrom, parseText)},
		{"REDIS_URL", "", "shared rate-limit and lockout counters", true, to(&c.RedisURL, parseRedisURL)},
		{"RATE_LIMITS", limits.DefaultRateLimits, "per-key windows, or off", false, to(&c.RateLimits, limits.ParseWindows)},
		{"BULK_RATE_LIMITS", limits.DefaultBulkRateLimits, "extra windows for bulk create, or off", false, to(&c.BulkRateLimits, limits.ParseWindows)},
		{"AUTH_LOCKOUT", limits.DefaultAuthLockout, "auth failures/window:lock per client IP, or off (dev: off unless set)", false, to(&c.AuthLockout, limits.ParseLockout)},
		{"WRITE_LOCKOUT", limits.DefaultWriteLockout, "4xx writes/window:lock per key, or off (dev: off unless set)", false, to(&c.WriteLockout, limits.ParseLockout)},
		{"CONFIRM_RATE_LIMITS", limits.DefaultConfirmRateLimits, "per-client-IP windows for the /confirm pages, or off", false, to(&c.ConfirmRateLimits, limits.ParseWindows)},
		{"TRUSTED_PROXIES", "", "CIDRs whose X-Forwarded-For is believed", false, to(&c.TrustedProxies, parseProxies)},
		{"LOG_LEVEL", telemetry.DefaultLogLevel, "debug, info, warn or error", false, to(&c.LogLevel, parseLevel)},
		{"LOG_FORMAT", telemetry.DefaultLogFormat, "json or text", false, to(&c.LogFormat, parseFormat)},
		{"IDEMPOTENCY_TTL", defaultIdempotencyTTL, "how long a stored response is replayed for its Idempotency-Key", false, to(&c.IdempotencyTTL, parseDuration)},
		{"WEBHOOK_TIMEOUT", defaultWebhookTimeout, "per webhook delivery attempt", false, to(&c.WebhookTimeout, parseDuration)},
		{"WEBHOOK_ALLOW_PRIVATE", defaultWebhookAllowPrivate, "allow webhook URLs on loopback and private networks", false, to(&c.WebhookAllowPrivate, parseBool)},
		{"WEBHOOK_WORKERS", strconv.Itoa(webhook.DefaultWorkers), "webhook endpoints this instance delivers to at once; 0 = it delivers none (another instance must)", false, to(&c.WebhookWorkers, parseWorkers)},
		{"IMPORT_MAX_ROWS", "1000000", "rows per import", false, to(&c.ImportMaxRows, parseImportRows)},
		{"IMPORT_MAX_BYTES", "256MiB", "bytes per import body (KiB, MiB, GiB suffixes)", false, to(&c.ImportMaxBytes, parseByteSize)},
		{"IMPORT_WORKERS", "1", "imports this instance processes at once; 0 = it processes none (another instance must)", false, to(&c.ImportWorkers, parseWorkers)},
		{"BULK_ACTION_WORKERS", "1", "bulk actions this instance processes at once (of different newsletters); 0 = it processes none (another instance must)", false, to(&c.BulkActionWorkers, parseWorkers)},
		{"DOCS_UI", defaultDocsUI, "serve the API reference page /api/v1/docs (off turns it off; the OpenAPI document stays)", false, to(&c.DocsUI, parseBool)},
	}
}

// to binds a parser of T to the field dst.
func to[T any](dst *T, parse func(name, raw string) (T, error)) func(name, raw string) error {
	return func(name, raw string) error {
		v, err := parse(name, raw)
		if err != nil {
			return err
		}
		*dst = v
		return nil
	}
}

func flagName(env string) string { return strings.ToLower(strings.ReplaceAll(env, "_", "-")) }

// configLoader reads the settings a command binds, once its flags are parsed.
type configLoader struct {
	fs     *flag.FlagSet
	getenv func(string) string
	flags  map[string]*string // by variable name
}

// bindConfig registers a flag for each named setting (all when names is empty) and returns the
// loader that resolves them after parsing: flag if given, else environment, else default.
func bindConfig(fs *flag.FlagSet, getenv func(string) string, names ...string) *configLoader {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	l := &configLoader{fs: fs, getenv: getenv, flags: map[string]*string{}}
	for _, s := range new(Config).settings() {
		if len(names) > 0 && !want[s.env] {
			continue
		}
		// The flag's own default stays empty, so that load tells a flag given from one left
		// out; --help shows the setting's default in its usage instead.
		usage := s.usage + " (env " + s.env
		if s.def != "" {
			usage += "; default " + s.def
		}
		l.flags[s.env] = fs.String(flagName(s.env), "", usage+")")
	}
	return l
}

// load parses and validates the bound settings. defaults replaces the default of a setting
// by name (dev uses it). The first error names its variable.
func (l *configLoader) load(defaults map[string]string) (*Config, error) {
	given := map[string]bool{}
	l.fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	c := &Config{raw: map[string]string{}, explicit: map[string]bool{}}
	for _, s := range c.settings() {
		fv, ok := l.flags[s.env]
		if !ok {
			continue
		}
		raw, explicit := s.def, true
		switch {
		case given[flagName(s.env)]:
			raw = *fv
		case l.getenv(s.env) != "":
			raw = l.getenv(s.env)
		default:
			explicit = false
			if d, ok := defaults[s.env]; ok {
				raw = d
			}
		}
		if err := s.parse(s.env, raw); err != nil {
			return nil, err
		}
		c.raw[s.env], c.explicit[s.env] = raw, explicit
	}
	if _, ok := l.flags["DATABASE_URL"]; ok {
		if err := c.resolveDatabase(); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// override sets a setting after loading (dev's PUBLIC_BASE_URL), parsed like the others.
func (c *Config) override(name, raw string) error {
	for _, s := range c.settings() {
		if s.env == name {
			if err := s.parse(name, raw); err != nil {
				return err
			}
			c.raw[name] = raw
			return nil
		}
	}
	return fmt.Errorf("no setting %s", name)
}

// Explicit reports whether the variable was given by a flag or the environment.
func (c *Config) Explicit(name string) bool { return c.explicit[name] }

// LogValue lists the loaded settings for the log, URL passwords masked.
func (c *Config) LogValue() slog.Value {
	var attrs []slog.Attr
	for _, s := range c.settings() {
		v, ok := c.raw[s.env]
		if !ok {
			continue
		}
		if s.env == "DATABASE_URL" {
			v = c.DatabaseURL
		}
		if s.secret && v != "" {
			v = redact(v)
		}
		attrs = append(attrs, slog.String(s.env, v))
	}
	return slog.GroupValue(attrs...)
}

// dbErr prefixes a database error with the variable that chose the database and its URL.
func (c *Config) dbErr(err error) error {
	name := "DATABASE_URL"
	if c.storeFrom != "" {
		name = c.storeFrom
	}
	return fmt.Errorf("%s (%s): %w", name, redact(c.DatabaseURL), err)
}

// resolveDatabase checks DATABASE_URL and, when it is unset, sets it to the embedded SQLite file
// in DATA_DIR, so that everything after reads one URL. Errors name the variable.
func (c *Config) resolveDatabase() error {
	if c.DatabaseURL == "" {
		if strings.TrimSpace(c.DataDir) == "" {
			return errors.New("DATA_DIR: must name a directory (DATABASE_URL is unset, so the SQLite database lives there)")
		}
		c.DatabaseURL = repo.SQLiteURL(filepath.Join(c.DataDir, sqliteFile))
		c.storeFrom = "DATA_DIR"
		return nil
	}
	if repo.IsSQLite(c.DatabaseURL) {
		if _, err := repo.SQLitePath(c.DatabaseURL); err != nil {
			return fmt.Errorf("DATABASE_URL: %w", err)
		}
		return nil
	}
	return validateURL("DATABASE_URL", c.DatabaseURL, "postgres", "postgresql", "sqlite")
}

func parseText(_, raw string) (string, error) { return raw, nil }

// parseAddr checks a listen address host:port.
func parseAddr(name, raw string) (string, error) {
	if _, _, err := net.SplitHostPort(raw); err != nil {
		return "", fmt.Errorf("%s: %q is not a host:port address", name, raw)
	}
	return raw, nil
}

func parseHTTPURL(name, raw string) (string, error) {
	return raw, validateURL(name, raw, "http", "https")
}

func parseRedisURL(_, raw string) (string, error) {
	if raw == "" {
		return "", nil
	}
	_, err := limits.RedisOptions(raw) // its errors name REDIS_URL
	return raw, err
}

func parseProxies(_, raw string) ([]netip.Prefix, error) { return limits.ParseTrustedProxies(raw) }

func parseLevel(name, raw string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(raw)); err != nil {
		return l, fmt.Errorf("%s: %q is not one of debug, info, warn, error", name, raw)
	}
	return l, nil
}

func parseFormat(name, raw string) (string, error) {
	if raw != "json" && raw != "text" {
		return "", fmt.Errorf("%s: %q is not one of json, text", name, raw)
	}
	return raw, nil
}

func parseDuration(name, raw string) (time.Duration, error) {
	d, err := time.ParseDuration(raw)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s: %q is not a positive duration such as 10s, 5m or 24h", name, raw)
	}
	return d, nil
}

// maxWebhookWorkers bounds WEBHOOK_WORKERS (and EMAIL_WORKERS, IMPORT_WORKERS), so that a slip
// of the keyboard cannot open thousands of connections: each webhook worker keeps up to 4 open
// to its endpoint's receiver.
const maxWebhookWorkers = 256

// parseWorkers reads a worker count from 0 (none) to maxWebhookWorkers.
func parseWorkers(name, raw string) (int, error) {
	n, err := strconv.Atoi(raw)
	if err != nil || n < 0 || n > maxWebhookWorkers {
		return 0, fmt.Errorf("%s: %q is not a whole number from 0 to %d", name, raw, maxWebhookWorkers)
	}
	return n, nil
}

// parseImportRows reads IMPORT_MAX_ROWS: a positive whole number.
func parseImportRows(name, raw string) (int64, error) {
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%s: %q is not a positive whole number", name, raw)
	}
	return n, nil
}

// parseByteSize reads a positive size in bytes, with an optional KiB, MiB or GiB suffix
// (256MiB).
func parseByteSize(name, raw string) (int64, error) {
	num, mult := raw, int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if n, ok := strings.CutSuffix(raw, u.suffix); ok {
			num, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 1 || n > (1<<62)/mult {
		return 0, fmt.Errorf("%s: %q is not a positive size such as 256MiB", name, raw)
	}
	return n * mult, nil
}

func parseBool(name, raw string) (bool, error) {
	switch raw { // on and off, as other settings say off (RATE_LIMITS=off)
	case "on":
		return true, nil
	case "off":
		return false, nil
	}
	b, err := strconv.ParseBool(raw)
	if err != nil {
		return false, fmt.Errorf("%s: %q is not true or false (on or off)", name, raw)
	}
	return b, nil
}

// validateURL checks an absolute URL with one of the schemes.
func validateURL(name, v string, schemes ...string) error {
	u, err := url.Parse(v)
	if err != nil || u.Host == "" {
		return fmt.Errorf("%s: %q is not an absolute URL", name, redact(v))
	}
	for _, s := range schemes {
		if u.Scheme == s {
			return nil
		}
	}
	return fmt.Errorf("%s: scheme %q is not one of %s", name, u.Scheme, strings.Join(schemes, ", "))
}

// redact hides the password of a URL for logs and errors: the user info's, and a query
// parameter's whose name says it is one (PostgreSQL's password, sslpassword).
func redact(v string) string {
	u, err := url.Parse(v)
	if err != nil {
		return "(unparsable)"
	}
	if u.Scheme == "" { // not a URL: a keyword/value DSN ("host=… password=…"), say
		return "(not a URL)"
	}
	if u.RawQuery != "" {
		q := u.Query()
		for k := range q {
			if name := strings.ToLower(k); strings.Contains(name, "password") || strings.Contains(name, "secret") {
				q[k] = []string{"xxxxx"}
			}
		}
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}
