package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
	"github.com/subscriberd/subscriberd/telemetry"
)

// cliFlags is the flag set of a one-shot command: its own flags plus DATABASE_URL and logging.
func cliFlags(name string, stderr io.Writer, getenv func(string) string) (*flag.FlagSet, *configLoader) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs, bindConfig(fs, getenv, "DATABASE_URL", "DATA_DIR", "LOG_LEVEL", "LOG_FORMAT")
}

// withAccounts runs fn on the accounts of the existing database (withDB).
func withAccounts(ctx context.Context, prog string, loader *configLoader, stderr io.Writer, fn func(*repo.Accounts) error) error {
	return withDB(ctx, prog, loader, stderr, func(db *repo.DB, _ *slog.Logger) error { return fn(repo.NewAccounts(db)) })
}

// storeLocation names the database of dsn for a person: the SQLite file's absolute path, or the
// PostgreSQL URL without its password.
func storeLocation(dsn string) string {
	if !repo.IsSQLite(dsn) {
		return redact(dsn)
	}
	path, err := repo.SQLitePath(dsn)
	if err != nil {
		return dsn
	}
	if abs, err := filepath.Abs(path); err == nil {
		return abs
	}
	return path
}

// ensureDatabase creates the database when it is missing, saying so: a warning naming a new
// PostgreSQL database, since a typo in DATABASE_URL makes one too.
func ensureDatabase(ctx context.Context, cfg *Config, log *slog.Logger) error {
	created, err := repo.EnsureDatabase(ctx, cfg.DatabaseURL)
	if err != nil {
		return cfg.dbErr(err)
	}
	if !created {
		return nil
	}
	if repo.IsSQLite(cfg.DatabaseURL) {
		log.Info("created the SQLite database", "path", storeLocation(cfg.DatabaseURL))
		return nil
	}
	log.Warn("created the PostgreSQL database, which did not exist; check DATABASE_URL if this was not meant",
		"database", databaseName(cfg.DatabaseURL), "url", redact(cfg.DatabaseURL))
	return nil
}

// databaseName is the database a PostgreSQL URL names.
func databaseName(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return ""
	}
	return strings.TrimPrefix(u.Path, "/")
}

func migrateCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs, loader := cliFlags("migrate", stderr, getenv)
	if _, err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	cfg, err := loader.load(nil)
	if err != nil {
		return err
	}
	log, err := telemetry.NewLogger(stderr, cfg.LogLevel.String(), cfg.LogFormat)
	if err != nil {
		return err
	}
	logStore(log, cfg.DatabaseURL)
	if err := ensureDatabase(ctx, cfg, log); err != nil {
		return err
	}
	db, err := repo.Open(cfg.DatabaseURL, repo.Options{MaxConns: 2})
	if err != nil {
		return cfg.dbErr(err)
	}
	defer db.Close()
	applied, err := repo.Migrate(ctx, db)
	if err != nil {
		return err
	}
	log.Info("migrations applied", "count", len(applied))
	if applied == nil {
		applied = []string{}
	}
	return printJSON(stdout, map[string]any{"applied": applied})
}

type newsletterJSON struct {
	ID        string     `json:"id"`
	Name      string     `json:"name"`
	APIAccess bool       `json:"api_access"`
	CreatedAt *time.Time `json:"created_at,omitempty"` // in lists
}

func newsletterCmd(ctx context.Context, prog string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("newsletter: want create, update or list")
	}
	fs, loader := cliFlags("newsletter "+args[0], stderr, getenv)
	switch args[0] {
	case "create":
		name := fs.String("name", "", "newsletter name")
		access := fs.Bool("api-access", true, "whether the newsletter's plan has API access")
		if _, err := parseArgs(fs, args[1:], 0); err != nil {
			return err
		}
		if strings.TrimSpace(*name) == "" {
			return errors.New("newsletter create: --name is required")
		}
		return withAccounts(ctx, prog, loader, stderr, func(a *repo.Accounts) error {
			n, err := a.CreateNewsletter(ctx, strings.TrimSpace(*name), *access)
			if err != nil {
				return err
			}
			return printJSON(stdout, newsletterJSON{ID: n.ID.String(), Name: n.Name, APIAccess: n.APIAccess})
		})
	case "update":
		name := fs.String("name", "", "new newsletter name")
		access := fs.Bool("api-access", true, "whether the newsletter's plan has API access (unchanged when not given)")
		id, err := idArg(fs, args[1:])
		if err != nil {
			return err
		}
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		var newAccess *bool
		if set["api-access"] {
			newAccess = access
		}
		var newName *string
		if set["name"] {
			if strings.TrimSpace(*name) == "" {
				return errors.New("newsletter update: --name must not be empty")
			}
			newName = new(strings.TrimSpace(*name))
		}
		if newAccess == nil && newName == nil {
			return errors.New("newsletter update: give --name NAME, --api-access=BOOL or both")
		}
		return withAccounts(ctx, prog, loader, stderr, func(a *repo.Accounts) error {
			n, err := a.UpdateNewsletter(ctx, id, newAccess, newName)
			if errors.Is(err, model.ErrNewsletterNotFound) {
				return fmt.Errorf("newsletter update: no newsletter %s (%s newsletter list shows them)", id, prog)
			}
			if err != nil {
				return err
			}
			return printJSON(stdout, newsletterJSON{ID: n.ID.String(), Name: n.Name, APIAccess: n.APIAccess})
		})
	case "list":
		if _, err := parseArgs(fs, args[1:], 0); err != nil {
			return err
		}
		return withAccounts(ctx, prog, loader, stderr, func(a *repo.Accounts) error {
			ns, err := a.Newsletters(ctx)
			if err != nil {
				return err
			}
			out := make([]newsletterJSON, len(ns))
			for i, n := range ns {
				out[i] = newsletterJSON{ID: n.ID.String(), Name: n.Name, APIAccess: n.APIAccess, CreatedAt: &n.CreatedAt}
			}
			return printJSON(stdout, map[string]any{"newsletters": out})
		})
	default:
		return fmt.Errorf("newsletter: unknown subcommand %q (want create, update or list)", args[0])
	}
}

// keyJSON is an API key as listed: never the key itself.
type keyJSON struct {
	ID        string     `json:"id"`
	Prefix    string     `json:"prefix"`
	Label     string     `json:"label"`
	Scope     string     `json:"scope"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at"`
	// ExpiresAt is when a rotated key stops working; LastUsedAt is to the minute.
	ExpiresAt  *time.Time `json:"expires_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
}

// scopeFlag parses --scope: read or write.
func scopeFlag(cmd, v string) (model.Scope, error) {
	sc, ok := model.ParseScope(v)
	if !ok {
		return "", fmt.Errorf("%s: --scope must be read or write, not %q", cmd, v)
	}
	return sc, nil
}

func apikeyCmd(ctx context.Context, prog string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("apikey: want create, list, rotate or revoke")
	}
	fs, loader := cliFlags("apikey "+args[0], stderr, getenv)
	switch args[0] {
	case "create":
		nl := fs.String("newsletter", "", "newsletter id")
		label := fs.String("label", "", "a note on what the key is for")
		scopeName := fs.String("scope", string(model.ScopeWrite), "read (GET operations only) or write (every operation)")
		if _, err := parseArgs(fs, args[1:], 0); err != nil {
			return err
		}
		id, err := uuid.Parse(*nl)
		if err != nil {
			return fmt.Errorf("apikey create: --newsletter must be a newsletter id (%s newsletter list shows them)", prog)
		}
		scope, err := scopeFlag("apikey create", *scopeName)
		if err != nil {
			return err
		}
		return withAccounts(ctx, prog, loader, stderr, func(a *repo.Accounts) error {
			k, secret, err := a.CreateScopedKey(ctx, id, *label, scope)
			if errors.Is(err, model.ErrNewsletterNotFound) {
				return fmt.Errorf("apikey create: no newsletter %s (%s newsletter list shows them)", id, prog)
			}
			if err != nil {
				return err
			}
			return printJSON(stdout, map[string]string{"id": k.ID.String(), "prefix": k.Prefix, "key": secret, "scope": string(k.Scope)})
		})
	case "rotate":
		grace := fs.Duration("grace", model.DefaultRotationGrace, "how long the old key keeps working (0s: it stops now)")
		id, err := idArg(fs, args[1:])
		if err != nil {
			return err
		}
		if *grace < 0 {
			return fmt.Errorf("apikey rotate: --grace must not be negative, not %s", *grace)
		}
		return withAccounts(ctx, prog, loader, stderr, func(a *repo.Accounts) error {
			next, secret, old, err := a.RotateKey(ctx, id, *grace)
			switch {
			case errors.Is(err, model.ErrKeyRevoked):
				return fmt.Errorf("apikey rotate: key %s is revoked or expired; create a new one with %s apikey create", id, prog)
			case errors.Is(err, model.ErrKeyNotFound):
				return fmt.Errorf("apikey rotate: no key %s (%s apikey list --newsletter ID shows them)", id, prog)
			case err != nil:
				return err
			}
			return printJSON(stdout, map[string]any{"id": next.ID.String(), "prefix": next.Prefix, "key": secret,
				"scope": string(next.Scope), "replaces": old.ID.String(), "old_key_expires_at": old.ExpiresAt})
		})
	case "list":
		nl := fs.String("newsletter", "", "newsletter id")
		if _, err := parseArgs(fs, args[1:], 0); err != nil {
			return err
		}
		id, err := uuid.Parse(*nl)
		if err != nil {
			return fmt.Errorf("apikey list: --newsletter must be a newsletter id (%s newsletter list shows them)", prog)
		}
		return withAccounts(ctx, prog, loader, stderr, func(a *repo.Accounts) error {
			keys, err := a.Keys(ctx, id)
			if errors.Is(err, model.ErrNewsletterNotFound) {
				return fmt.Errorf("apikey list: no newsletter %s (%s newsletter list shows them)", id, prog)
			}
			if err != nil {
				return err
			}
			out := make([]keyJSON, len(keys))
			for i, k := range keys {
				out[i] = keyJSON{ID: k.ID.String(), Prefix: k.Prefix, Label: k.Label, Scope: string(k.Scope),
					CreatedAt: k.CreatedAt, RevokedAt: k.RevokedAt, ExpiresAt: k.ExpiresAt, LastUsedAt: k.LastUsedAt}
			}
			return printJSON(stdout, map[string]any{"keys": out})
		})
	case "revoke":
		id, err := idArg(fs, args[1:])
		if err != nil {
			return err
		}
		return withAccounts(ctx, prog, loader, stderr, func(a *repo.Accounts) error {
			if err := a.RevokeKey(ctx, id); errors.Is(err, model.ErrKeyNotFound) {
				return fmt.Errorf("apikey revoke: no key %s (%s apikey list --newsletter ID shows them)", id, prog)
			} else if err != nil {
				return err
			}
			return printJSON(stdout, map[string]any{"id": id.String(), "revoked": true})
		})
	default:
		return fmt.Errorf("apikey: unknown subcommand %q (want create, list, rotate or revoke)", args[0])
	}
}

// parseArgs parses a command's flags, which may come before, between and after its arguments,
// and returns the arguments; more than max of them is an error naming the first extra one.
// A true/false flag takes its value after "=": in "--api-access false" the flag is true and
// "false" is an argument, which must not pass silently.
func parseArgs(fs *flag.FlagSet, args []string, max int) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		if len(pos) == max {
			extra := fs.Arg(0)
			// The word before it, when it is a flag that took no value: "--migrate false".
			if i := len(args) - fs.NArg() - 1; i >= 0 && strings.HasPrefix(args[i], "-") && !strings.Contains(args[i], "=") {
				if _, err := strconv.ParseBool(extra); err == nil {
					return nil, fmt.Errorf("%s: unexpected argument %q (a true/false flag takes its value after =, as in %s=%s)",
						fs.Name(), extra, args[i], extra)
				}
			}
			return nil, fmt.Errorf("%s: unexpected argument %q", fs.Name(), extra)
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// idArg parses a command that takes one ID argument, with its flags before or after it.
func idArg(fs *flag.FlagSet, args []string) (uuid.UUID, error) {
	pos, err := parseArgs(fs, args, 1)
	if err != nil {
		return uuid.Nil, err
	}
	if len(pos) == 0 {
		return uuid.Nil, fmt.Errorf("%s: an ID argument is required", fs.Name())
	}
	id, err := uuid.Parse(pos[0])
	if err != nil {
		return uuid.Nil, fmt.Errorf("%s: %q is not an id", fs.Name(), pos[0])
	}
	return id, nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	return enc.Encode(v)
}
