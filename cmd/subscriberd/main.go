// Command subscriberd serves the subscriber API and manages its newsletters and API keys.
//
//	subscriberd dev                        serve, making a demo newsletter and API key on an empty database
//	subscriberd serve                      run the API, the admin listener and the email worker
//	subscriberd migrate                    apply pending migrations and exit
//	subscriberd newsletter create --name NAME [--api-access=false]
//	subscriberd newsletter update ID [--api-access=BOOL] [--name NAME]
//	subscriberd newsletter list
//	subscriberd apikey create --newsletter ID [--label TEXT] [--scope read|write]
//	subscriberd apikey list --newsletter ID
//	subscriberd apikey rotate ID [--grace DURATION]
//	subscriberd apikey revoke ID
//	subscriberd import --newsletter ID [--status pending] FILE
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := runAs(ctx, progName(os.Args[0]), os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "subscriberd:", err)
		}
		os.Exit(1)
	}
}

const usage = `usage: PROG <command> [flags]

commands:
  dev                                     serve for development: lockouts off, emails and
                                          their links on stdout; on an empty database first
                                          make a demo newsletter and API key, print a curl line
  serve [--dev]                           run the API, admin listener and email worker
  migrate                                 create the database if missing, apply pending
                                          migrations and exit
  newsletter create --name NAME [--api-access=false]
  newsletter update ID [--api-access=BOOL] [--name NAME]
  newsletter list
  apikey create --newsletter ID [--label TEXT] [--scope read|write]
  apikey list --newsletter ID             prefix, label, scope, created, revoked, expiry and
                                          last-used times; never the key
  apikey rotate ID [--grace DURATION]     a new key like it; the old one expires after the
                                          grace (default 24h)
  apikey revoke ID
  import --newsletter ID [--status pending] FILE
                                          import a CSV or NDJSON file of subscribers,
                                          showing progress; existing ones are left as
                                          they are
  bulk-action --newsletter ID --action ACTION [--tags T,…] [--attributes JSON]
              (--filter JSON | --segment ID)
                                          add or remove tags, set attributes or
                                          unsubscribe a selection, showing progress

Run "PROG <command> -h" for its flags. Every setting is an environment variable
(DATABASE_URL, LISTEN_ADDR, …) that a flag of the same name in kebab case overrides.
Without DATABASE_URL the store is an SQLite file in DATA_DIR (default ./data); only
serve, dev and migrate create it.`

// progName is how the user ran the program, for the commands hints print: "go run
// ./cmd/subscriberd" when arg0 is a binary go run built (in the build cache, GOCACHE/xx/<hash>-d/,
// or in a temporary go-build directory), otherwise arg0 as typed (subscriberd, ./bin/subscriberd).
func progName(arg0 string) string {
	if arg0 == "" {
		return "subscriberd"
	}
	dir := filepath.ToSlash(filepath.Dir(arg0))
	if goRunCache.MatchString(path.Base(dir)) || strings.Contains(dir, "/go-build") && strings.HasSuffix(dir, "/exe") {
		return "go run ./cmd/subscriberd"
	}
	return arg0
}

// goRunCache matches the build cache directory go run (Go 1.24 and later) keeps binaries in.
var goRunCache = regexp.MustCompile(`^[0-9a-f]{64}-d$`)

// run is the whole program: it parses args, reads configuration through getenv, writes
// machine-readable output to stdout and logs to stderr, and returns when done or ctx ends.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return runAs(ctx, "subscriberd", args, getenv, stdout, stderr)
}

// runAs is run for a program the user started as prog (see progName).
func runAs(ctx context.Context, prog string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	usage := strings.ReplaceAll(usage, "PROG", prog)
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return errors.New("no command given")
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "serve":
		return serve(ctx, prog, rest, getenv, stdout, stderr, false)
	case "dev":
		return serve(ctx, prog, rest, getenv, stdout, stderr, true)
	case "migrate":
		return migrateCmd(ctx, rest, getenv, stdout, stderr)
	case "newsletter":
		return newsletterCmd(ctx, prog, rest, getenv, stdout, stderr)
	case "apikey":
		return apikeyCmd(ctx, prog, rest, getenv, stdout, stderr)
	case "import":
		return importCmd(ctx, prog, rest, getenv, stdout, stderr)
	case "bulk-action":
		return bulkActionCmd(ctx, prog, rest, getenv, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprintln(stdout, usage)
		return nil
	default:
		fmt.Fprintln(stderr, usage)
		return fmt.Errorf("unknown command %q", cmd)
	}
}
