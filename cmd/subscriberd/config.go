package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"

	"github.com/subscriberd/subscriberd/repo"
)

// setting is one configuration value: an environment variable, overridable by the flag of
// the same name in kebab case (DATABASE_URL → --database-url).
type setting struct {
	env, def, usage string
	secret          bool // masked when logged
}

// sqliteFile is the name of the embedded database's file in DATA_DIR.
const sqliteFile = "subscribers.db"

// settings lists every variable of API.md §7.
var settings = []setting{
	{env: "DATABASE_URL", usage: "postgres://… (PostgreSQL) or sqlite:///path.db; unset = SQLite in DATA_DIR", secret: true},
	{env: "DATA_DIR", def: "./data", usage: "directory of the embedded SQLite database (" + sqliteFile + ") when DATABASE_URL is unset"},
	{env: "LISTEN_ADDR", def: ":8080", usage: "public API and confirmation pages"},
	{env: "ADMIN_ADDR", def: ":9090", usage: "/metrics, /livez, /readyz, /debug/pprof/"},
	{env: "PUBLIC_BASE_URL", def: "http://localhost:8080", usage: "base of links in emails"},
	{env: "SMTP_URL", usage: "smtp://user:pass@host:port or smtps://…; unset = emails are logged", secret: true},
	{env: "MAIL_FROM", def: "Newsletter <no-reply@localhost>", usage: "sender of emails"},
	{env: "REDIS_URL", usage: "shared rate-limit and lockout counters", secret: true},
	{env: "RATE_LIMITS", def: "60/1m,500/1h,3000/24h", usage: "per-key windows, or off"},
	{env: "BULK_RATE_LIMITS", def: "10/1m,100/1h,500/24h", usage: "extra windows for bulk create, or off"},
	{env: "AUTH_LOCKOUT", def: "10/10m:15m", usage: "auth failures/window:lock per client IP, or off"},
	{env: "WRITE_LOCKOUT", def: "30/10m:10m", usage: "4xx writes/window:lock per key, or off"},
	{env: "TRUSTED_PROXIES", usage: "CIDRs whose X-Forwarded-For is believed"},
	{env: "LOG_LEVEL", def: "info", usage: "debug, info, warn or error"},
	{env: "LOG_FORMAT", def: "json", usage: "json or text"},
	{env: "DOCS_UI", def: "on", usage: "the reference page at /api/v1/docs: on or off (the OpenAPI document is always served)"},
}

// config is the resolved settings by variable name.
type config map[string]string

func flagName(env string) string { return strings.ToLower(strings.ReplaceAll(env, "_", "-")) }

// bindSettings registers a flag for each named setting (all when names is empty) and returns
// a function that resolves them after parsing: flag if given, else environment, else default.
func bindSettings(fs *flag.FlagSet, getenv func(string) string, names ...string) func() config {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	vals := map[string]*string{}
	for _, s := range settings {
		if len(names) > 0 && !want[s.env] {
			continue
		}
		vals[s.env] = fs.String(flagName(s.env), "", s.usage+" (env "+s.env+")")
	}
	return func() config {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		cfg := config{}
		for _, s := range settings {
			v, ok := vals[s.env]
			if !ok {
				continue
			}
			switch {
			case set[flagName(s.env)]:
				cfg[s.env] = *v
			case getenv(s.env) != "":
				cfg[s.env] = getenv(s.env)
			default:
				cfg[s.env] = s.def
			}
		}
		return cfg
	}
}

// storeFrom is the config key, not a setting, naming the variable that chose the database:
// DATA_DIR when DATABASE_URL was unset.
const storeFrom = "store_from"

// dbErr prefixes a database error with the variable that chose the database and its URL.
func dbErr(cfg config, err error) error {
	name := "DATABASE_URL"
	if cfg[storeFrom] != "" {
		name = cfg[storeFrom]
	}
	return fmt.Errorf("%s (%s): %w", name, redact(cfg["DATABASE_URL"]), err)
}

// resolveDatabase checks DATABASE_URL and, when it is unset, sets it to the embedded SQLite file
// in DATA_DIR, so that everything after reads one URL. Errors name the variable.
func resolveDatabase(cfg config) error {
	dsn := cfg["DATABASE_URL"]
	if dsn == "" {
		dir := cfg["DATA_DIR"]
		if strings.TrimSpace(dir) == "" {
			return errors.New("DATA_DIR: must name a directory (DATABASE_URL is unset, so the SQLite database lives there)")
		}
		cfg["DATABASE_URL"] = repo.SQLiteURL(filepath.Join(dir, sqliteFile))
		cfg[storeFrom] = "DATA_DIR"
		return nil
	}
	if repo.IsSQLite(dsn) {
		if _, err := repo.SQLitePath(dsn); err != nil {
			return fmt.Errorf("DATABASE_URL: %w", err)
		}
		return nil
	}
	if err := validateURL("DATABASE_URL", dsn, "postgres", "postgresql", "sqlite"); err != nil {
		return err
	}
	return nil
}

// validateAddr checks a listen address host:port.
func validateAddr(name, v string) error {
	if _, _, err := net.SplitHostPort(v); err != nil {
		return fmt.Errorf("%s: %q is not a host:port address", name, v)
	}
	return nil
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

// redact hides the password of a URL for logs and errors.
func redact(v string) string {
	u, err := url.Parse(v)
	if err != nil {
		return "(unparsable)"
	}
	return u.Redacted()
}
