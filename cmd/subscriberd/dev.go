package main

import (
	"context"
	"fmt"
	"io"
	"net"

	"github.com/subscriberd/subscriberd/limits"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
)

// devNewsletterName is the name of the newsletter dev makes on an empty database.
const devNewsletterName = "Demo Newsletter"

// devDefaults replace the defaults of serve in dev: a developer trying keys and mistakes on
// localhost is not locked out. A variable or flag given explicitly still wins.
var devDefaults = map[string]string{
	"AUTH_LOCKOUT":  limits.Off,
	"WRITE_LOCKOUT": limits.Off,
}

// devDemo is what dev found or made, to print once the API listens.
type devDemo struct {
	newsletter model.Newsletter
	key        string // "" when the database already had a newsletter (no key is made then)
}

// devSetup makes a demo newsletter and an API key when the database has no newsletter yet;
// otherwise it only finds the first newsletter, to say how to make a key for it.
func devSetup(ctx context.Context, accounts *repo.Accounts) (*devDemo, error) {
	nl, found, err := accounts.FirstNewsletter(ctx)
	if err != nil {
		return nil, fmt.Errorf("dev: %w", err)
	}
	if found {
		return &devDemo{newsletter: nl}, nil
	}
	if nl, err = accounts.CreateNewsletter(ctx, devNewsletterName, true); err != nil {
		return nil, fmt.Errorf("dev: create the demo newsletter: %w", err)
	}
	_, key, err := accounts.CreateKey(ctx, nl.ID, "dev")
	if err != nil {
		return nil, fmt.Errorf("dev: create the demo API key: %w", err)
	}
	return &devDemo{newsletter: nl, key: key}, nil
}

// baseURL is the URL a local client reaches the listener at: localhost when it listens on
// every interface.
func baseURL(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "http://" + addr.String()
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port)
}

// print writes the key and a curl line that creates a subscriber, or, when the database already
// had a newsletter, how to make a key for it (as prog, the way the user ran the program), and
// the development settings in force.
func (d *devDemo) print(w io.Writer, addr net.Addr, prog string, cfg *Config) {
	base := baseURL(addr)
	if d.key == "" {
		fmt.Fprintf(w, `
The database already has a newsletter, %q (%s); no demo key was made.
Make a key for it with:

  %s apikey create --newsletter %s

`, d.newsletter.Name, d.newsletter.ID, prog, d.newsletter.ID)
	} else {
		fmt.Fprintf(w, `
Made the newsletter %q (%s) and an API key for it.
The key is shown only now:

  %s

Create a subscriber:

  curl -i %s/api/v1/subscribers -H 'Authorization: Bearer %s' -H 'Content-Type: application/json' -d '{"email":"john@example.com","name":"John Doe","status":"active"}'

`, d.newsletter.Name, d.newsletter.ID, d.key, base, d.key)
	}
	fmt.Fprintf(w, "API reference: %s/api/v1/docs\n", base)
	fmt.Fprintf(w, "Lockouts: AUTH_LOCKOUT=%s, WRITE_LOCKOUT=%s (dev turns both off unless set). Rate limits: RATE_LIMITS=%s.\n",
		cfg.raw["AUTH_LOCKOUT"], cfg.raw["WRITE_LOCKOUT"], cfg.raw["RATE_LIMITS"])
	if cfg.SMTPURL == "" {
		fmt.Fprintf(w, "Emails: not sent (SMTP_URL is unset); each confirmation link is printed here.\n")
	}
	fmt.Fprintln(w)
}
