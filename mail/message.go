package mail

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	htmltemplate "html/template"
	netmail "net/mail"
	"net/url"
	"strings"
	texttemplate "text/template"
	"unicode"

	"github.com/subscriberd/subscriberd/model"
)

// DefaultFrom is the sender when MAIL_FROM is not set.
const DefaultFrom = "Newsletter <no-reply@localhost>"

//go:embed templates/*.tmpl
var templateFiles embed.FS

var (
	textTemplate = texttemplate.Must(texttemplate.ParseFS(templateFiles, "templates/confirm.txt.tmpl"))
	htmlTemplate = htmltemplate.Must(htmltemplate.ParseFS(templateFiles, "templates/confirm.html.tmpl"))
)

// Message is a rendered confirmation email, ready for a [Transport].
type Message struct {
	// ID is the Message-ID without angle brackets. It is derived from the outbox row, so every
	// attempt at the same email carries the same one and receivers can drop duplicates.
	ID      string
	From    *netmail.Address
	To      *netmail.Address
	Subject string
	Text    string // the text/plain part
	HTML    string // the text/html part
	// Link is the confirmation link inside the parts. It holds the token: never log it above
	// debug level.
	Link string
	// DeclineLink is the "I did not sign up" link (docs/api-contract.md §12.2), in the parts and
	// in the List-Unsubscribe header. It holds the token too.
	DeclineLink string
}

// Composer writes confirmation emails: a sender and the base of the links.
type Composer struct {
	from    *netmail.Address
	baseURL string
	idHost  string
}

// NewComposer checks the sender (MAIL_FROM, one RFC 5322 address, "" for [DefaultFrom]) and
// the public base URL of links (PUBLIC_BASE_URL, absolute http or https).
func NewComposer(from, baseURL string) (*Composer, error) {
	if from == "" {
		from = DefaultFrom
	}
	addr, err := netmail.ParseAddress(from)
	if err != nil {
		return nil, fmt.Errorf("MAIL_FROM: %q is not one email address: %w", from, err)
	}
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
		u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("PUBLIC_BASE_URL: %q is not an absolute http(s) URL without query", baseURL)
	}
	// The sender goes in the envelope of every email, to servers that may not offer SMTPUTF8:
	// its local part must be ASCII, and its domain goes as punycode (in From and in every
	// Message-ID, which must be ASCII whatever the server).
	ascii, utf8Local, err := envelopeAddress(addr.Address)
	if err != nil || utf8Local {
		return nil, fmt.Errorf("MAIL_FROM: %q: the address must have an ASCII local part and a valid domain", from)
	}
	addr = &netmail.Address{Name: addr.Name, Address: ascii}
	_, host, _ := strings.Cut(ascii, "@")
	return &Composer{from: addr, baseURL: strings.TrimRight(baseURL, "/"), idHost: host}, nil
}

// Link is the confirmation link of a token.
func (c *Composer) Link(token string) string { return c.baseURL + "/confirm/" + token }

// Compose writes the confirmation email for e with the given token.
func (c *Composer) Compose(e model.OutboxEmail, token string) (*Message, error) {
	if e.Email == "" {
		return nil, errors.New("compose: no recipient")
	}
	newsletter := oneLine(e.NewsletterName)
	name := oneLine(e.Name())
	data := struct {
		Name, Newsletter, Link, DeclineLink string
		ValidDays                           int
	}{name, newsletter, c.Link(token), c.Link(token) + "/decline", int(TokenTTL.Hours() / 24)}

	var text, html bytes.Buffer
	if err := textTemplate.Execute(&text, data); err != nil {
		return nil, fmt.Errorf("compose text part: %w", err)
	}
	if err := htmlTemplate.Execute(&html, data); err != nil {
		return nil, fmt.Errorf("compose html part: %w", err)
	}
	return &Message{
		ID:          e.ID.String() + "@" + c.idHost,
		From:        c.from,
		To:          &netmail.Address{Name: name, Address: e.Email},
		Subject:     "Confirm your subscription to " + newsletter,
		Text:        text.String(),
		HTML:        html.String(),
		Link:        data.Link,
		DeclineLink: data.DeclineLink,
	}, nil
}

// oneLine replaces control characters (line breaks above all) by spaces, drops the invisible
// format and bidirectional controls names may not hold (model.ForbiddenInName: U+202E would
// reverse what a reader sees of the To: header) and trims the result. The API already refuses
// both in names; this keeps every header one line and in reading order even for values that
// came in some other way: names stored before the API refused them, or a newsletter name set
// by an operator.
func oneLine(s string) string {
	return strings.TrimSpace(strings.Map(func(r rune) rune {
		switch {
		case unicode.IsControl(r) || r == '\u2028' || r == '\u2029':
			return ' '
		case model.ForbiddenInName(r):
			return -1
		}
		return r
	}, s))
}
