package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
	"github.com/subscriberd/subscriberd/telemetry"
)

// cliFlags is the flag set of a one-shot command: its own flags plus DATABASE_URL and logging.
func cliFlags(name string, stderr io.Writer, getenv func(string) string) (*flag.FlagSet, func() config) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs, bindSettings(fs, getenv, "DATABASE_URL", "DATA_DIR", "LOG_LEVEL", "LOG_FORMAT")
}

// withAccounts opens the database (creating and migrating it, so a newcomer's first command
// works on an empty server) and runs fn.
func withAccounts(ctx context.Context, cfg config, stderr io.Writer, fn func(*repo.Accounts) error) error {
	if err := resolveDatabase(cfg); err != nil {
		return err
	}
	log, err := telemetry.NewLogger(stderr, cfg["LOG_LEVEL"], cfg["LOG_FORMAT"])
	if err != nil {
		return err
	}
	db, err := openDB(ctx, cfg, true, log)
	if err != nil {
		return err
	}
	defer db.Close()
	return fn(repo.NewAccounts(db))
}

func migrateCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs, resolve := cliFlags("migrate", stderr, getenv)
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := resolve()
	if err := resolveDatabase(cfg); err != nil {
		return err
	}
	log, err := telemetry.NewLogger(stderr, cfg["LOG_LEVEL"], cfg["LOG_FORMAT"])
	if err != nil {
		return err
	}
	logStore(log, cfg["DATABASE_URL"])
	var db *bun.DB
	if err := repo.EnsureDatabase(ctx, cfg["DATABASE_URL"]); err != nil {
		return dbErr(cfg, err)
	}
	if db, err = repo.Open(cfg["DATABASE_URL"], repo.Options{MaxConns: 2}); err != nil {
		return dbErr(cfg, err)
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
	ID        string `json:"id"`
	Name      string `json:"name"`
	APIAccess bool   `json:"api_access"`
}

func newsletterCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("newsletter: want create or update")
	}
	fs, resolve := cliFlags("newsletter "+args[0], stderr, getenv)
	name := fs.String("name", "", "newsletter name")
	access := fs.Bool("api-access", true, "whether the newsletter's plan has API access")
	switch args[0] {
	case "create":
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if strings.TrimSpace(*name) == "" {
			return errors.New("newsletter create: --name is required")
		}
		return withAccounts(ctx, resolve(), stderr, func(a *repo.Accounts) error {
			n, err := a.CreateNewsletter(ctx, strings.TrimSpace(*name), *access)
			if err != nil {
				return err
			}
			return printJSON(stdout, newsletterJSON{ID: n.ID.String(), Name: n.Name, APIAccess: n.APIAccess})
		})
	case "update":
		id, rest, err := idArg("newsletter update", args[1:])
		if err != nil {
			return err
		}
		if err := fs.Parse(rest); err != nil {
			return err
		}
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["api-access"] {
			return errors.New("newsletter update: --api-access is required")
		}
		var newName *string
		if set["name"] {
			if strings.TrimSpace(*name) == "" {
				return errors.New("newsletter update: --name must not be empty")
			}
			n := strings.TrimSpace(*name)
			newName = &n
		}
		return withAccounts(ctx, resolve(), stderr, func(a *repo.Accounts) error {
			n, err := a.UpdateNewsletter(ctx, id, *access, newName)
			if err != nil {
				return err
			}
			return printJSON(stdout, newsletterJSON{ID: n.ID.String(), Name: n.Name, APIAccess: n.APIAccess})
		})
	default:
		return fmt.Errorf("newsletter: unknown subcommand %q (want create or update)", args[0])
	}
}

func apikeyCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("apikey: want create or revoke")
	}
	fs, resolve := cliFlags("apikey "+args[0], stderr, getenv)
	switch args[0] {
	case "create":
		nl := fs.String("newsletter", "", "newsletter id")
		label := fs.String("label", "", "a note on what the key is for")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		id, err := uuid.Parse(*nl)
		if err != nil {
			return errors.New("apikey create: --newsletter must be a newsletter id")
		}
		return withAccounts(ctx, resolve(), stderr, func(a *repo.Accounts) error {
			k, secret, err := a.CreateKey(ctx, id, *label)
			if errors.Is(err, model.ErrNewsletterNotFound) {
				return fmt.Errorf("apikey create: no newsletter %s", id)
			}
			if err != nil {
				return err
			}
			return printJSON(stdout, map[string]string{"id": k.ID.String(), "prefix": k.Prefix, "key": secret})
		})
	case "revoke":
		id, rest, err := idArg("apikey revoke", args[1:])
		if err != nil {
			return err
		}
		if err := fs.Parse(rest); err != nil {
			return err
		}
		return withAccounts(ctx, resolve(), stderr, func(a *repo.Accounts) error {
			if err := a.RevokeKey(ctx, id); errors.Is(err, model.ErrKeyNotFound) {
				return fmt.Errorf("apikey revoke: no key %s", id)
			} else if err != nil {
				return err
			}
			return printJSON(stdout, map[string]any{"id": id.String(), "revoked": true})
		})
	default:
		return fmt.Errorf("apikey: unknown subcommand %q (want create or revoke)", args[0])
	}
}

// idArg takes the leading ID argument of a command, accepting flags before or after it.
func idArg(cmd string, args []string) (uuid.UUID, []string, error) {
	for i, a := range args {
		if strings.HasPrefix(a, "-") {
			continue
		}
		if i > 0 && !strings.Contains(args[i-1], "=") && !isBoolFlag(args[i-1]) {
			continue // the value of the previous flag
		}
		id, err := uuid.Parse(a)
		if err != nil {
			return uuid.Nil, nil, fmt.Errorf("%s: %q is not an id", cmd, a)
		}
		rest := append(append([]string{}, args[:i]...), args[i+1:]...)
		return id, rest, nil
	}
	return uuid.Nil, nil, fmt.Errorf("%s: an ID argument is required", cmd)
}

func isBoolFlag(arg string) bool {
	return strings.HasPrefix(strings.TrimLeft(arg, "-"), "api-access")
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	return enc.Encode(v)
}
