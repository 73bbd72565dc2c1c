// Command subscriberd serves the subscriber API and manages its newsletters and API keys.
//
//	subscriberd dev                        serve, making a demo newsletter and API key on an empty database
//	subscriberd serve                      run the API, the admin listener and the email worker
//	subscriberd migrate                    apply pending migrations and exit
//	subscriberd newsletter create --name NAME [--api-access=false]
//	subscriberd newsletter update ID --api-access=BOOL [--name NAME]
//	subscriberd apikey create --newsletter ID [--label TEXT]
//	subscriberd apikey revoke ID
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "subscriberd:", err)
		}
		os.Exit(1)
	}
}

const usage = `usage: subscriberd <command> [flags]

commands:
  dev                                     serve; on an empty database first make a demo
                                          newsletter and API key and print a curl line
  serve [--dev]                           run the API, admin listener and email worker
  migrate                                 apply pending migrations and exit
  newsletter create --name NAME [--api-access=false]
  newsletter update ID --api-access=BOOL [--name NAME]
  apikey create --newsletter ID [--label TEXT]
  apikey revoke ID

Run "subscriberd <command> -h" for its flags. Every setting is an environment variable
(DATABASE_URL, LISTEN_ADDR, …) that a flag of the same name in kebab case overrides.
Without DATABASE_URL the store is an SQLite file in DATA_DIR (default ./data).`

// run is the whole program: it parses args, reads configuration through getenv, writes
// machine-readable output to stdout and logs to stderr, and returns when done or ctx ends.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return errors.New("no command given")
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "serve":
		return serve(ctx, rest, getenv, stdout, stderr, false)
	case "dev":
		return serve(ctx, rest, getenv, stdout, stderr, true)
	case "migrate":
		return migrateCmd(ctx, rest, getenv, stdout, stderr)
	case "newsletter":
		return newsletterCmd(ctx, rest, getenv, stdout, stderr)
	case "apikey":
		return apikeyCmd(ctx, rest, getenv, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprintln(stdout, usage)
		return nil
	default:
		fmt.Fprintln(stderr, usage)
		return fmt.Errorf("unknown command %q", cmd)
	}
}
