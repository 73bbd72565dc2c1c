// Package smtptest runs a real SMTP server on loopback for tests (emersion/go-smtp): it keeps
// every message it accepts, parsed into the parts a confirmation email has, can refuse
// recipients with any SMTP reply, and can be stopped and started again on the same address.
package smtptest

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"mime"
	"mime/multipart"
	"net"
	netmail "net/mail"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
)

// Message is one accepted message.
type Message struct {
	To        string // the envelope recipient
	Header    netmail.Header
	Text      string // the text/plain part, decoded
	HTML      string // the text/html part, decoded
	Link      string // the first confirmation link (…/confirm/<token>) of the text part
	MessageID string
}

// Token is the last path segment of the message's link.
func (m Message) Token() string {
	return linkRE.FindStringSubmatch(m.Text)[1]
}

var linkRE = regexp.MustCompile(`https?://[^\s"<>]+/confirm/([A-Za-z0-9_-]+)`)

// Server is the SMTP server.
type Server struct {
	t    testing.TB
	addr string

	mu     sync.Mutex
	srv    *smtp.Server
	ln     net.Listener
	msgs   []Message
	refuse func(to string, before int) *smtp.SMTPError
	offers map[string]int
	utf8   bool
	onData func(to string) error
}

// StartSMTPUTF8 is Start with a server that offers SMTPUTF8 (RFC 6531): it accepts addresses
// whose local part is not ASCII. A server from Start does not offer it, and refuses them.
func StartSMTPUTF8(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, offers: map[string]int{}, utf8: true,
		addr: fmt.Sprintf("127.%d.%d.%d:0", rand.IntN(256), rand.IntN(256), 1+rand.IntN(254))}
	s.Restart()
	t.Cleanup(s.Stop)
	return s
}

// OnData sets f to run when a message's DATA is complete, before the server keeps and accepts
// it: the moment the client is told "250". f's error refuses the message.
func (s *Server) OnData(f func(to string) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onData = f
}

// Start runs a server until t ends, on a random address of the loopback range (127.x.y.z) so
// that while it is stopped no other test's server can take its port.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, offers: map[string]int{},
		addr: fmt.Sprintf("127.%d.%d.%d:0", rand.IntN(256), rand.IntN(256), 1+rand.IntN(254))}
	s.Restart()
	t.Cleanup(s.Stop)
	return s
}

// URL is the server's smtp:// URL.
func (s *Server) URL() string { return "smtp://" + s.addr }

// Restart starts the server again, on the same address and port, after Stop.
func (s *Server) Restart() {
	s.t.Helper()
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		s.t.Fatalf("smtptest: %v", err)
	}
	s.addr = ln.Addr().String()
	srv := smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) {
		return &session{s: s}, nil
	}))
	srv.Domain = "localhost"
	srv.EnableSMTPUTF8 = s.utf8
	srv.ReadTimeout, srv.WriteTimeout = 10*time.Second, 10*time.Second
	s.mu.Lock()
	s.srv, s.ln = srv, ln
	s.mu.Unlock()
	go srv.Serve(ln) //nolint:errcheck // ends with Stop
}

// Stop closes the listener and every connection: the server is down.
func (s *Server) Stop() {
	s.mu.Lock()
	srv, ln := s.srv, s.ln
	s.srv, s.ln = nil, nil
	s.mu.Unlock()
	if srv != nil {
		// Close the listener ourselves: Server.Close only closes the listeners Serve has
		// registered, and Serve may not have started yet.
		ln.Close()
		srv.Close()
	}
}

// Messages returns what the server accepted so far, in order.
func (s *Server) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.msgs...)
}

// Refuse sets the answer to RCPT: f gets the address and how many times it was offered
// before, and returns the error to answer with, or nil to accept.
func (s *Server) Refuse(f func(to string, before int) *smtp.SMTPError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuse = f
}

// Offered tells how many times RCPT named the address.
func (s *Server) Offered(to string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.offers[to]
}

type session struct {
	s  *Server
	to []string
}

func (x *session) Mail(string, *smtp.MailOptions) error { return nil }

func (x *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	if !x.s.utf8 && !isASCII(to) {
		return &smtp.SMTPError{Code: 553, EnhancedCode: smtp.EnhancedCode{5, 6, 7}, Message: "SMTPUTF8 not offered"}
	}
	x.s.mu.Lock()
	before := x.s.offers[to]
	x.s.offers[to]++
	refuse := x.s.refuse
	x.s.mu.Unlock()
	if refuse != nil {
		if err := refuse(to, before); err != nil {
			return err
		}
	}
	x.to = append(x.to, to)
	return nil
}

func (x *session) Data(r io.Reader) error {
	if len(x.to) != 1 {
		return fmt.Errorf("smtptest: want one recipient, got %q", x.to)
	}
	msg, err := netmail.ReadMessage(r)
	if err != nil {
		return err
	}
	got := Message{To: x.to[0], Header: msg.Header, MessageID: msg.Header.Get("Message-Id")}
	mt, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/alternative" {
		return fmt.Errorf("smtptest: content type %q, want multipart/alternative", msg.Header.Get("Content-Type"))
	}
	mr := multipart.NewReader(msg.Body, params["boundary"])
	for {
		p, err := mr.NextPart() // undoes quoted-printable
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		b, err := io.ReadAll(p)
		if err != nil {
			return err
		}
		switch ct, _, _ := mime.ParseMediaType(p.Header.Get("Content-Type")); ct {
		case "text/plain":
			got.Text = string(b)
		case "text/html":
			got.HTML = string(b)
		}
	}
	got.Link = linkRE.FindString(got.Text)
	x.s.mu.Lock()
	onData := x.s.onData
	x.s.mu.Unlock()
	if onData != nil {
		if err := onData(x.to[0]); err != nil {
			return err
		}
	}
	x.s.mu.Lock()
	x.s.msgs = append(x.s.msgs, got)
	x.s.mu.Unlock()
	return nil
}

func (x *session) Reset()        { x.to = nil }
func (x *session) Logout() error { return nil }

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
