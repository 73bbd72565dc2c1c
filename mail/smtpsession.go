package mail

import (
	"context"
	"errors"
	"fmt"
	"net/textproto"
	"strconv"
	"strings"
	"unicode/utf8"

	gomail "github.com/wneessen/go-mail"

	"github.com/subscriberd/subscriberd/model"
)

// GatedTransport is a Transport that can hold a message just before the server accepts it.
// SendGated transmits m up to the end of its DATA and then calls gate with accept, which sends
// the end of DATA and waits for the server's verdict. If gate returns without calling accept,
// the message is abandoned (the connection is closed without ending DATA, so the server
// discards it) and gate's error returned. The worker's gate re-checks, under the subscriber's
// lock, that the email is still wanted, so that the lock is held only for the server's last
// reply (bounded by the SMTP timeout), never for the whole exchange.
type GatedTransport interface {
	Transport
	SendGated(ctx context.Context, m *Message, gate func(accept func() error) error) error
}

// ErrNoSMTPUTF8 is the permanent failure of a recipient whose local part is not ASCII, to a
// server that does not offer SMTPUTF8 (RFC 6531): it could not be named in RCPT TO.
var ErrNoSMTPUTF8 = errors.New("the recipient's local part is not ASCII and the SMTP server does not offer SMTPUTF8")

// Send delivers m over a new connection.
func (s *SMTP) Send(ctx context.Context, m *Message) error {
	return s.SendGated(ctx, m, nil)
}

// SendGated delivers m over a new connection, letting gate decide at the last moment whether
// the server is asked to accept it (see [GatedTransport]); a nil gate accepts at once.
//
// The envelope recipient's domain goes as punycode (any server takes it); a local part that is
// not ASCII goes only to a server that offers SMTPUTF8, and is otherwise a permanent failure
// wrapping [ErrNoSMTPUTF8].
func (s *SMTP) SendGated(ctx context.Context, m *Message, gate func(accept func() error) error) error {
	msg, err := goMailMsg(m)
	if err != nil {
		return &PermanentError{Code: 0, Err: err}
	}
	rcpt, utf8Local, err := envelopeAddress(m.To.Address)
	if err != nil {
		return &PermanentError{Code: 0, Err: err}
	}
	from, _, err := envelopeAddress(m.From.Address)
	if err != nil {
		return &PermanentError{Code: 0, Err: err}
	}
	// A client per message: go-mail clients hold one connection, and a fresh one per email
	// keeps concurrent workers and a restarted server out of each other's way. The
	// connection's deadline (the SMTP timeout) bounds the whole exchange, gate included.
	c, err := gomail.NewClient(s.host, s.opts...)
	if err != nil {
		return fmt.Errorf("smtp client: %w", err)
	}
	sc, err := c.DialToSMTPClientWithContext(ctx)
	if err != nil {
		return fmt.Errorf("smtp connect: %w", err)
	}
	defer sc.Close() //nolint:errcheck // after QUIT, or to abandon the message
	if utf8Local {
		if ok, _ := sc.Extension("SMTPUTF8"); !ok {
			return &PermanentError{Code: 0, Err: ErrNoSMTPUTF8}
		}
	}
	// go-mail's SMTP client sends the path as given: RFC 5321 wants it in angle brackets,
	// and strict servers refuse a bare address.
	if err := sc.Mail("<" + from + ">"); err != nil {
		return classifyReply("MAIL FROM", err)
	}
	if err := sc.Rcpt("<" + rcpt + ">"); err != nil {
		err = classifyReply("RCPT TO "+rcpt, err)
		var p *PermanentError
		var te *textproto.Error
		if errors.As(err, &p) && errors.As(err, &te) {
			p.Recipient, p.Reply = true, strconv.Itoa(te.Code)+" "+te.Msg
		}
		return err
	}
	w, err := sc.Data()
	if err != nil {
		return classifyReply("DATA", err)
	}
	if _, err := msg.WriteTo(w); err != nil {
		return fmt.Errorf("smtp write: %w", err)
	}
	accept := func() error {
		// The reply may take long (content scanning), but not longer than the subscriber's
		// lock may be held (DefaultFinalReplyTimeout).
		if err := sc.UpdateDeadline(s.finalReply); err != nil {
			return fmt.Errorf("smtp: %w", err)
		}
		err := w.Close()
		if _, isReply := errors.AsType[*textproto.Error](err); err != nil && !isReply {
			return &UnconfirmedError{Err: err}
		}
		return classifyReply("end of DATA", err)
	}
	if gate == nil {
		err = accept()
	} else {
		err = gate(accept)
	}
	if err != nil {
		return err
	}
	_ = sc.Quit() // the server has the message; a failed QUIT changes nothing
	return nil
}

// envelopeAddress is addr as the SMTP envelope names it (model.EnvelopeAddress: the domain
// in its A-label form, from the same IDNA processing that keys addresses, so that the mailbox
// written to is the one the suppression list and the uniqueness rule compare,
// docs/api-contract.md §18), and whether its local part needs SMTPUTF8.
func envelopeAddress(addr string) (string, bool, error) {
	env, err := model.EnvelopeAddress(addr)
	if err != nil {
		return "", false, fmt.Errorf("address: %w", err)
	}
	local := env[:strings.LastIndexByte(env, '@')]
	return env, !isASCII(local), nil
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// classifyReply wraps a 5xx reply to the sender, the recipient or the message in a
// PermanentError. Everything else — connection, TLS, 4xx — is temporary: the message may go
// through once the server or its configuration is back.
func classifyReply(step string, err error) error {
	if err == nil {
		return nil
	}
	err = fmt.Errorf("%s: %w", step, err)
	var te *textproto.Error
	if errors.As(err, &te) && te.Code >= 500 && te.Code < 600 {
		return &PermanentError{Code: te.Code, Err: err}
	}
	return err
}
