package mail

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net"
	netmail "net/mail"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"

	"github.com/subscriberd/subscriberd/internal/smtptest"
)

// received is one message as the test server got it.
type received struct {
	From string
	To   []string
	Data []byte
}

// testServer is a real SMTP server on loopback (go-smtp) that keeps what it receives. Rcpt
// answers with rejects[address] when set. With user set it requires AUTH PLAIN.
type testServer struct {
	addr       string
	user, pass string
	mu         sync.Mutex
	msgs       []received
	rejects    map[string]*smtp.SMTPError
	wire       bytes.Buffer  // every byte clients sent, as sent (go-smtp forgives bare paths)
	dataDelay  time.Duration // how long the server takes to reply to the end of DATA
}

// recordingConn copies what a client sends into its server's wire.
type recordingConn struct {
	net.Conn
	ts *testServer
}

func (c recordingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.ts.mu.Lock()
	c.ts.wire.Write(p[:n])
	c.ts.mu.Unlock()
	return n, err
}

type recordingListener struct {
	net.Listener
	ts *testServer
}

func (l recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return recordingConn{Conn: c, ts: l.ts}, nil
}

// sent returns the lines clients sent that start with prefix.
func (ts *testServer) sent(prefix string) []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	var lines []string
	for _, l := range strings.Split(ts.wire.String(), "\r\n") {
		if strings.HasPrefix(l, prefix) {
			lines = append(lines, l)
		}
	}
	return lines
}

func startServer(t *testing.T, user, pass string) *testServer {
	t.Helper()
	ts := &testServer{user: user, pass: pass, rejects: map[string]*smtp.SMTPError{}}
	srv := smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) {
		return &testSession{srv: ts}, nil
	}))
	srv.Domain = "localhost"
	srv.AllowInsecureAuth = true
	srv.ReadTimeout, srv.WriteTimeout = 10*time.Second, 10*time.Second
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts.addr = ln.Addr().String()
	go srv.Serve(recordingListener{Listener: ln, ts: ts})
	t.Cleanup(func() { srv.Close() })
	return ts
}

func (ts *testServer) messages() []received {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return append([]received(nil), ts.msgs...)
}

type testSession struct {
	srv    *testServer
	authed bool
	from   string
	to     []string
}

func (s *testSession) AuthMechanisms() []string {
	if s.srv.user == "" {
		return nil
	}
	return []string{sasl.Plain}
}

func (s *testSession) Auth(string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(_, user, pass string) error {
		if user != s.srv.user || pass != s.srv.pass {
			return smtp.ErrAuthFailed
		}
		s.authed = true
		return nil
	}), nil
}

func (s *testSession) Mail(from string, _ *smtp.MailOptions) error {
	if s.srv.user != "" && !s.authed {
		return smtp.ErrAuthRequired
	}
	s.from = from
	return nil
}

func (s *testSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	s.srv.mu.Lock()
	rej := s.srv.rejects[to]
	s.srv.mu.Unlock()
	if rej != nil {
		return rej
	}
	s.to = append(s.to, to)
	return nil
}

func (s *testSession) Data(r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	s.srv.mu.Lock()
	delay := s.srv.dataDelay
	s.srv.mu.Unlock()
	time.Sleep(delay)
	s.srv.mu.Lock()
	s.srv.msgs = append(s.srv.msgs, received{From: s.from, To: s.to, Data: b})
	s.srv.mu.Unlock()
	return nil
}

func (s *testSession) Reset()        { s.from, s.to = "", nil }
func (s *testSession) Logout() error { return nil }

func composeTest(t *testing.T) *Message {
	t.Helper()
	c, err := NewComposer("Weekly <news@example.com>", "https://news.example.com")
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.Compose(testEmail(), "T0KEN")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// parts returns the content types and decoded bodies of a multipart/alternative message.
func parts(t *testing.T, msg *netmail.Message) map[string]string {
	t.Helper()
	mt, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/alternative" {
		t.Fatalf("Content-Type %q (%v), want multipart/alternative", msg.Header.Get("Content-Type"), err)
	}
	out := map[string]string{}
	mr := multipart.NewReader(msg.Body, params["boundary"])
	for {
		p, err := mr.NextPart() // decodes quoted-printable
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(p)
		ct, _, _ := mime.ParseMediaType(p.Header.Get("Content-Type"))
		out[ct] = string(b)
	}
	return out
}

func TestSMTPSendsMultipartMessage(t *testing.T) {
	ts := startServer(t, "mailer", "s3cret")
	s, err := NewSMTP("smtp://mailer:s3cret@"+ts.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(s.String(), "s3cret") {
		t.Errorf("String() = %q shows the password", s)
	}
	m := composeTest(t)
	if err := s.Send(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	got := ts.messages()
	if len(got) != 1 {
		t.Fatalf("server got %d messages, want 1", len(got))
	}
	if got[0].From != "news@example.com" || len(got[0].To) != 1 || got[0].To[0] != "ann@example.com" {
		t.Errorf("envelope from %q to %q", got[0].From, got[0].To)
	}
	// The paths as RFC 5321 writes them: a strict server refuses "MAIL FROM:news@example.com".
	mailFrom, rcptTo := ts.sent("MAIL FROM:"), ts.sent("RCPT TO:")
	if len(mailFrom) != 1 || !strings.HasPrefix(mailFrom[0], "MAIL FROM:<news@example.com>") ||
		len(rcptTo) != 1 || rcptTo[0] != "RCPT TO:<ann@example.com>" {
		t.Errorf("envelope commands %q %q; want the paths in angle brackets", mailFrom, rcptTo)
	}
	msg, err := netmail.ReadMessage(strings.NewReader(string(got[0].Data)))
	if err != nil {
		t.Fatal(err)
	}
	dec := new(mime.WordDecoder)
	subject, _ := dec.DecodeHeader(msg.Header.Get("Subject"))
	to, err := msg.Header.AddressList("To")
	if err != nil || len(to) != 1 {
		t.Fatalf("To %q: %v", msg.Header.Get("To"), err)
	}
	for _, c := range []struct{ name, got, want string }{
		{"Subject", subject, "Confirm your subscription to Tom & Jerry's <Weekly>"},
		{"From", msg.Header.Get("From"), `"Weekly" <news@example.com>`},
		{"To address", to[0].Address, "ann@example.com"},
		{"To name", to[0].Name, "Ann <b>Lee</b>"},
		{"Message-ID", msg.Header.Get("Message-ID"), "<0191f0a6-6b5e-7c3a-8f00-000000000001@example.com>"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}
	if msg.Header.Get("Date") == "" {
		t.Error("no Date header")
	}
	for _, h := range []string{"User-Agent", "X-Mailer"} {
		if v := msg.Header.Get(h); v != "" {
			t.Errorf("%s: %q tells recipients the mail library", h, v)
		}
	}
	p := parts(t, msg)
	if !strings.Contains(p["text/plain"], "https://news.example.com/confirm/T0KEN") {
		t.Errorf("text/plain part lacks the link: %q", p["text/plain"])
	}
	if !strings.Contains(p["text/html"], `href="https://news.example.com/confirm/T0KEN"`) {
		t.Errorf("text/html part lacks the link: %q", p["text/html"])
	}
}

// A server that does not reply to the end of DATA in time may have the email or not: the
// send fails as unconfirmed, not as an ordinary temporary failure (the worker retries it only
// once), and the wait for that reply is bounded by finalReply.
func TestSMTPUnansweredEndOfDataIsUnconfirmed(t *testing.T) {
	ts := startServer(t, "", "")
	ts.mu.Lock()
	ts.dataDelay = 2 * time.Second
	ts.mu.Unlock()
	s, err := NewSMTP("smtp://"+ts.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	s.finalReply = 200 * time.Millisecond
	start := time.Now()
	err = s.Send(context.Background(), composeTest(t))
	if _, ok := errors.AsType[*UnconfirmedError](err); !ok || IsPermanent(err) || !strings.HasPrefix(err.Error(), UnconfirmedPrefix) {
		t.Fatalf("error %v, want an UnconfirmedError", err)
	}
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Errorf("the send took %v: the final reply was not bounded by finalReply", d)
	}
	// An answered end of DATA is the server's verdict, as before.
	ts.mu.Lock()
	ts.dataDelay = 0
	ts.mu.Unlock()
	if err := s.Send(context.Background(), composeTest(t)); err != nil {
		t.Errorf("send to a server that answers at once: %v", err)
	}
}

func TestSMTPNameCannotInjectHeaders(t *testing.T) {
	ts := startServer(t, "", "")
	s, err := NewSMTP("smtp://"+ts.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	m := composeTest(t)
	// Compose refuses line breaks already; the transport must hold even if one gets through.
	m.To.Name = "Eve\r\nBcc: victim@example.com\r\nX-Evil: 1"
	m.Subject = "Hi\r\nBcc: victim2@example.com"
	if err := s.Send(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	got := ts.messages()
	if len(got) != 1 || len(got[0].To) != 1 || got[0].To[0] != "ann@example.com" {
		t.Fatalf("server got %+v; want one message to ann@example.com only", got)
	}
	msg, err := netmail.ReadMessage(strings.NewReader(string(got[0].Data)))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"Bcc", "X-Evil"} {
		if v := msg.Header.Get(h); v != "" {
			t.Errorf("header %s: %q was injected", h, v)
		}
	}
	to, err := msg.Header.AddressList("To")
	if err != nil || len(to) != 1 || to[0].Address != "ann@example.com" {
		t.Errorf("To = %q (%v), want one address", msg.Header.Get("To"), err)
	}
}

func TestSMTPErrorsAreClassified(t *testing.T) {
	ts := startServer(t, "", "")
	ts.rejects["ann@example.com"] = &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user"}
	s, _ := NewSMTP("smtp://"+ts.addr, 5*time.Second)
	err := s.Send(context.Background(), composeTest(t))
	var perm *PermanentError
	if !errors.As(err, &perm) || perm.Code != 550 {
		t.Fatalf("550 on RCPT: error %v, want a permanent 550", err)
	}
	// The library's error names the recipient; what the worker logs of it (errAttr) does not.
	if !strings.Contains(err.Error(), "ann@example.com") {
		t.Errorf("550 on RCPT: %q no longer names the recipient; is scrubbing still needed?", err)
	}
	if got := errAttr(err).Value.String(); strings.Contains(got, "@") || !strings.Contains(got, "550") {
		t.Errorf("logged as %q: want the reply without the address", got)
	}

	ts.rejects["ann@example.com"] = &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try later"}
	err = s.Send(context.Background(), composeTest(t))
	if err == nil || IsPermanent(err) {
		t.Fatalf("451 on RCPT: error %v, want a temporary error", err)
	}

	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	s, _ = NewSMTP("smtp://"+addr, 2*time.Second)
	err = s.Send(context.Background(), composeTest(t))
	if err == nil || IsPermanent(err) {
		t.Fatalf("server down: error %v, want a temporary error", err)
	}

	s, _ = NewSMTP("smtp://mailer:wrong@"+startServer(t, "mailer", "right").addr, 2*time.Second)
	err = s.Send(context.Background(), composeTest(t))
	if err == nil || IsPermanent(err) {
		t.Fatalf("bad credentials: error %v, want a temporary error (a configuration fault must not drop emails)", err)
	}
	if len(ts.messages()) != 0 {
		t.Errorf("server accepted %d messages, want 0", len(ts.messages()))
	}
}

func TestNewSMTPURLs(t *testing.T) {
	for _, tc := range []struct {
		url, display string
	}{
		{"smtp://mail.example.com", "smtp://mail.example.com:587"},
		{"smtp://localhost:1025", "smtp://localhost:1025"},
		{"smtps://u%40x:p%3Ass@mail.example.com", "smtps://u%40x:***@mail.example.com:465"},
		{"smtp://[::1]:25/", "smtp://[::1]:25"},
	} {
		s, err := NewSMTP(tc.url, 0)
		if err != nil {
			t.Errorf("NewSMTP(%q): %v", tc.url, err)
			continue
		}
		if s.String() != tc.display {
			t.Errorf("NewSMTP(%q).String() = %q, want %q", tc.url, s, tc.display)
		}
	}
	for _, bad := range []string{"", "http://x", "smtp://", "smtp://x:0", "smtp://x:99999", "smtp://x/path", "smtp://x?tls=no", "::"} {
		if _, err := NewSMTP(bad, 0); err == nil {
			t.Errorf("NewSMTP(%q) accepted", bad)
		} else if !strings.HasPrefix(err.Error(), "SMTP_URL") {
			t.Errorf("NewSMTP(%q) error %q does not name SMTP_URL", bad, err)
		}
	}
}

func TestSMTPUnicodeNamesRoundTrip(t *testing.T) {
	ts := startServer(t, "", "")
	s, _ := NewSMTP("smtp://"+ts.addr, 5*time.Second)
	c, _ := NewComposer("Café Brief <brief@example.com>", "https://example.com")
	e := testEmail()
	e.FirstName, e.LastName, e.NewsletterName = "Zoë", "Ünal-Śmith", "Café ☕ Weekly"
	m, err := c.Compose(e, "T")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	msg, err := netmail.ReadMessage(strings.NewReader(string(ts.messages()[0].Data)))
	if err != nil {
		t.Fatal(err)
	}
	subject, err := new(mime.WordDecoder).DecodeHeader(msg.Header.Get("Subject"))
	if err != nil || subject != "Confirm your subscription to Café ☕ Weekly" {
		t.Errorf("Subject %q (%v)", subject, err)
	}
	to, err := msg.Header.AddressList("To")
	if err != nil || to[0].Name != "Zoë Ünal-Śmith" {
		t.Errorf("To %q: %v", msg.Header.Get("To"), err)
	}
	from, err := msg.Header.AddressList("From")
	if err != nil || from[0].Name != "Café Brief" {
		t.Errorf("From %q: %v", msg.Header.Get("From"), err)
	}
	if p := parts(t, msg); !strings.Contains(p["text/plain"], "Hello Zoë Ünal-Śmith,") || !strings.Contains(p["text/html"], "Café ☕ Weekly") {
		t.Errorf("parts do not carry the names in UTF-8: %q", p)
	}
}

// An address whose local part is not ASCII goes only to a server that offers SMTPUTF8; to any
// other it is a permanent failure, before RCPT names it. Its domain goes as punycode, which
// every server takes.
func TestSMTPNonASCIIAddresses(t *testing.T) {
	// A Unicode domain in MAIL_FROM goes as punycode in the envelope, From and the Message-ID.
	c, err := NewComposer("Café <news@bücher.example>", "https://example.com")
	if err != nil {
		t.Fatal(err)
	}
	compose := func(addr string) *Message {
		e := testEmail()
		e.Email = addr
		m, err := c.Compose(e, "T")
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	for _, tc := range []struct {
		name     string
		utf8     bool
		addr     string
		wantRcpt string // "" when the email must fail for good
	}{
		{"ASCII local, Unicode domain, plain server", false, "ann@bücher.example", "ann@xn--bcher-kva.example"},
		{"Unicode local, plain server", false, "zoë@bücher.example", ""},
		{"Unicode local, SMTPUTF8 server", true, "zoë@bücher.example", "zoë@xn--bcher-kva.example"},
		{"ASCII, SMTPUTF8 server", true, "ann@example.com", "ann@example.com"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := smtptest.Start
			if tc.utf8 {
				start = smtptest.StartSMTPUTF8
			}
			srv := start(t)
			s, _ := NewSMTP(srv.URL(), 5*time.Second)
			err := s.Send(context.Background(), compose(tc.addr))
			if tc.wantRcpt == "" {
				if !IsPermanent(err) || !errors.Is(err, ErrNoSMTPUTF8) {
					t.Fatalf("error %v, want a permanent ErrNoSMTPUTF8", err)
				}
				if n := len(srv.Messages()); n != 0 {
					t.Errorf("server accepted %d messages", n)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := srv.Messages()
			if len(got) != 1 || got[0].To != tc.wantRcpt {
				t.Fatalf("accepted %+v, want one message to %s", got, tc.wantRcpt)
			}
			// Headers as the envelope: domains in punycode; a Message-ID is ASCII always.
			to, err := got[0].Header.AddressList("To")
			if err != nil || len(to) != 1 || to[0].Address != tc.wantRcpt {
				t.Errorf("To header %q (%v), want the address %s", got[0].Header.Get("To"), err, tc.wantRcpt)
			}
			from, err := got[0].Header.AddressList("From")
			if err != nil || len(from) != 1 || from[0].Address != "news@xn--bcher-kva.example" || from[0].Name != "Café" {
				t.Errorf("From header %q (%v)", got[0].Header.Get("From"), err)
			}
			if id := got[0].Header.Get("Message-ID"); !strings.HasSuffix(id, "@xn--bcher-kva.example>") || !isASCII(id) {
				t.Errorf("Message-ID %q, want <…@xn--bcher-kva.example>", id)
			}
		})
	}
}
