package mail

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	netmail "net/mail"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	gomail "github.com/wneessen/go-mail"
)

// Transport delivers one message. An error wrapping a [*PermanentError] means the message will
// never be accepted as it is; any other error is worth retrying later.
type Transport interface {
	Send(ctx context.Context, m *Message) error
}

// PermanentError is a delivery the SMTP server refused for good: a 5xx reply to the sender,
// a recipient or the message. Retrying it would only be refused again.
type PermanentError struct {
	Code int // the SMTP reply code, 5xx
	Err  error
	// Recipient is set when the server refused the recipient (a 5xx reply to RCPT TO): a hard
	// bounce, which suppresses the address (docs/api-contract.md §13). A refusal of the
	// sender or of the message says nothing about the address.
	Recipient bool
	// Reply is the server's reply, code and text, as it gave it.
	Reply string
}

// HardBounce returns the server's reply when err is a permanent refusal of the recipient.
func HardBounce(err error) (reply string, ok bool) {
	var p *PermanentError
	if errors.As(err, &p) && p.Recipient {
		return p.Reply, true
	}
	return "", false
}

// Error describes the refusal.
func (e *PermanentError) Error() string {
	return fmt.Sprintf("permanent SMTP failure (%d): %v", e.Code, e.Err)
}

// Unwrap returns the underlying error.
func (e *PermanentError) Unwrap() error { return e.Err }

// IsPermanent reports whether err is a permanent delivery failure.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// DefaultSMTPTimeout bounds the connection and every command of one delivery.
const DefaultSMTPTimeout = 30 * time.Second

// SMTP sends messages through an SMTP server, one connection per message.
type SMTP struct {
	host    string
	opts    []gomail.Option
	display string // the URL without password, for logs
	// finalReply bounds the wait for the reply to the end of DATA (DefaultFinalReplyTimeout).
	finalReply time.Duration
}

// DefaultFinalReplyTimeout bounds the wait for the server's reply to the end of DATA. The
// worker holds the subscriber's row lock meanwhile (see GatedTransport), and an unsubscribe or
// an update waiting for that lock must get it within the database's statement timeout (25 s),
// or it fails with 503.
const DefaultFinalReplyTimeout = 20 * time.Second

// UnconfirmedError is a send whose end of DATA got no reply (a timeout, a dropped connection):
// the server may or may not have the email.
type UnconfirmedError struct{ Err error }

// UnconfirmedPrefix starts the text of every UnconfirmedError, and so the last_error it leaves.
const UnconfirmedPrefix = "no reply to the end of DATA (the server may have the email): "

func (e *UnconfirmedError) Error() string { return UnconfirmedPrefix + e.Err.Error() }

// Unwrap returns the connection's error.
func (e *UnconfirmedError) Unwrap() error { return e.Err }

// NewSMTP configures delivery from an SMTP URL:
//   - smtp://[user:pass@]host[:port] — plain connection upgraded with STARTTLS when the server
//     offers it (port 587 by default);
//   - smtps://[user:pass@]host[:port] — implicit TLS (port 465 by default).
//
// Credentials, when given, are sent with AUTH PLAIN, which every submission server offers;
// go-mail refuses to send them over a connection that is not encrypted, except to a server on
// loopback. timeout bounds the connection and each command (0 means [DefaultSMTPTimeout]).
func NewSMTP(rawURL string, timeout time.Duration) (*SMTP, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, errors.New("SMTP_URL: not a URL")
	}
	if timeout <= 0 {
		timeout = DefaultSMTPTimeout
	}
	var port int
	opts := []gomail.Option{gomail.WithTimeout(timeout)}
	switch u.Scheme {
	case "smtp":
		port = 587
		opts = append(opts, gomail.WithTLSPolicy(gomail.TLSOpportunistic))
	case "smtps":
		port = 465
		opts = append(opts, gomail.WithSSL())
	default:
		return nil, fmt.Errorf("SMTP_URL: scheme %q is not smtp or smtps", u.Scheme)
	}
	host := u.Hostname()
	if host == "" {
		return nil, errors.New("SMTP_URL: no host")
	}
	if p := u.Port(); p != "" {
		port, err = strconv.Atoi(p)
		if err != nil || port < 1 || port > 65535 {
			return nil, fmt.Errorf("SMTP_URL: bad port %q", p)
		}
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return nil, errors.New("SMTP_URL: unexpected path or query")
	}
	opts = append(opts, gomail.WithPort(port))
	if u.User != nil && u.User.Username() != "" {
		pass, _ := u.User.Password()
		opts = append(opts, gomail.WithSMTPAuth(gomail.SMTPAuthPlain),
			gomail.WithUsername(u.User.Username()), gomail.WithPassword(pass))
	}
	display := u.Scheme + "://" + net.JoinHostPort(host, strconv.Itoa(port))
	if u.User != nil && u.User.Username() != "" {
		display = u.Scheme + "://" + url.User(u.User.Username()).String() + ":***@" + net.JoinHostPort(host, strconv.Itoa(port))
	}
	return &SMTP{host: host, opts: opts, display: display, finalReply: DefaultFinalReplyTimeout}, nil
}

// String is the server's URL with the password masked, for logs.
func (s *SMTP) String() string { return s.display }

// goMailMsg builds the MIME message: multipart/alternative with text and HTML, the addresses
// set from parsed values so that no name can add a header or a recipient.
func goMailMsg(m *Message) (*gomail.Msg, error) {
	// No User-Agent or X-Mailer: they would tell every recipient the mail library and its
	// version.
	msg := gomail.NewMsg(gomail.WithNoDefaultUserAgent())
	msg.SetAddrHeaderFromMailAddress(gomail.HeaderFrom, m.From)
	// The recipient's domain goes as punycode in To as in the envelope: raw UTF-8 in a header
	// is only for servers that offer SMTPUTF8, and only a non-ASCII local part needs one.
	to, _, err := envelopeAddress(m.To.Address)
	if err != nil {
		return nil, err
	}
	msg.SetAddrHeaderFromMailAddress(gomail.HeaderTo, &netmail.Address{Name: m.To.Name, Address: to})
	msg.Subject(m.Subject)
	msg.SetMessageIDWithValue(m.ID)
	msg.SetDate()
	msg.SetGenHeader(gomail.HeaderXAutoResponseSuppress, "All")
	msg.SetGenHeader("Auto-Submitted", "auto-generated")
	if m.DeclineLink != "" {
		// RFC 2369 and RFC 8058: the mailbox's own "unsubscribe" control declines
		// (docs/api-contract.md §12.2), with one POST and no page.
		msg.SetGenHeader("List-Unsubscribe", "<"+m.DeclineLink+">")
		msg.SetGenHeader("List-Unsubscribe-Post", "List-Unsubscribe=One-Click")
	}
	msg.SetBodyString(gomail.TypeTextPlain, m.Text)
	msg.AddAlternativeString(gomail.TypeTextHTML, m.HTML)
	return msg, nil
}

// LogTransport writes emails to a logger instead of sending them: the honest transport when no
// SMTP_URL is configured. At info it logs the Message-ID, the subject, the recipient with its
// local part masked, and the confirmation link (nobody else will see it: the email is not sent);
// the full recipient and the text only at debug. The worker counts its emails as
// [OutcomeLogged], not sent.
type LogTransport struct {
	Log *slog.Logger
	// Out, when not nil, also receives one line per email with the recipient and the link,
	// ready to click (the dev command's stdout). Writes to it must be safe for concurrent use.
	Out io.Writer
}

// OutcomeLogged is the outcome of an email a [LogTransport] wrote to the log instead of sending.
const OutcomeLogged = "logged"

// Send logs m.
func (t LogTransport) Send(ctx context.Context, m *Message) error {
	t.Log.InfoContext(ctx, "email logged, not sent: SMTP_URL is not set", slog.String("message_id", m.ID),
		slog.String("to", maskAddress(m.To.Address)), slog.String("subject", m.Subject), slog.String("link", m.Link))
	t.Log.DebugContext(ctx, "email content", slog.String("message_id", m.ID), slog.String("to", m.To.Address),
		slog.String("text", m.Text))
	if t.Out != nil {
		fmt.Fprintf(t.Out, "Email to %s (not sent: SMTP_URL is unset). Confirm with:\n  %s\n", m.To.Address, m.Link)
	}
	return nil
}

// logsOnly marks a transport whose deliveries are [OutcomeLogged].
func (LogTransport) logsOnly() {}

// maskAddress keeps the first character of the local part and the domain: a***@example.com.
func maskAddress(addr string) string {
	at := strings.LastIndexByte(addr, '@')
	if at <= 0 {
		return "***"
	}
	r, _ := utf8.DecodeRuneInString(addr)
	return string(r) + "***" + addr[at:]
}
