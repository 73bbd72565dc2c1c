package api_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/subscriberd/subscriberd/limits"
	"github.com/subscriberd/subscriberd/mail"
	"github.com/subscriberd/subscriberd/model"
)

// fakeConfirmer answers by token hash; calls counts the hashes it was asked about.
type fakeConfirmer struct {
	mu      sync.Mutex
	answers map[string]func() (model.Confirmation, error) // by string(hash)
	calls   int
}

func (f *fakeConfirmer) answer(hash []byte) (model.Confirmation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if a, ok := f.answers[string(hash)]; ok {
		return a()
	}
	return model.Confirmation{}, fmt.Errorf("fake: %w", model.ErrTokenInvalid)
}

func (f *fakeConfirmer) Lookup(_ context.Context, hash []byte) (model.Confirmation, error) {
	return f.answer(hash)
}

func (f *fakeConfirmer) Confirm(_ context.Context, hash []byte) (model.Confirmation, error) {
	return f.answer(hash)
}

func (f *fakeConfirmer) Decline(_ context.Context, hash []byte) (model.Confirmation, bool, error) {
	c, err := f.answer(hash)
	c.Confirmed, c.Declined = false, err == nil
	return c, err == nil, err
}

func TestConfirmPages(t *testing.T) {
	valid, _ := mail.NewToken()
	done, _ := mail.NewToken()
	down, _ := mail.NewToken()
	broken, _ := mail.NewToken()
	unknown, _ := mail.NewToken()
	fc := &fakeConfirmer{answers: map[string]func() (model.Confirmation, error){
		string(mail.HashToken(valid)): func() (model.Confirmation, error) {
			return model.Confirmation{NewsletterName: "Tom & Jerry"}, nil
		},
		string(mail.HashToken(done)): func() (model.Confirmation, error) {
			return model.Confirmation{NewsletterName: "Tom & Jerry", Confirmed: true}, nil
		},
		string(mail.HashToken(down)): func() (model.Confirmation, error) {
			return model.Confirmation{}, fmt.Errorf("db: %w", model.ErrUnavailable)
		},
		string(mail.HashToken(broken)): func() (model.Confirmation, error) {
			return model.Confirmation{}, errors.New("something unexpected")
		},
	}}
	e := newEnv(t)
	e.srv.HandleConfirmations(fc)

	for _, tc := range []struct {
		name, method, token string
		status              int
		text                string
	}{
		{"GET a valid link shows the form", "GET", valid, 200, `<form id="consent" method="post">`},
		{"POST a valid link with nothing changes nothing", "POST", valid, 200, "Press the button to confirm your subscription."},
		{"GET a link that confirmed says so", "GET", done, 200, "You’re subscribed"},
		{"POST a link that confirmed says so", "POST", done, 200, "You’re subscribed"},
		{"GET an unknown link", "GET", unknown, 404, "no longer valid"},
		{"POST an unknown link", "POST", unknown, 404, "no longer valid"},
		{"POST a malformed link", "POST", "not-a-token", 404, "no longer valid"},
		{"GET with the database down", "GET", down, 503, "try again"},
		{"GET with an unexpected error", "GET", broken, 503, "try again"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := e.do(t, req{tc.method, "/confirm/" + tc.token, nil, nil})
			if rec.Code != tc.status || !strings.Contains(rec.Body.String(), tc.text) {
				t.Fatalf("status %d, want %d with %q:\n%s", rec.Code, tc.status, tc.text, rec.Body)
			}
			h := rec.Header()
			if !strings.HasPrefix(h.Get("Content-Type"), "text/html") || h.Get("Cache-Control") != "no-store" ||
				h.Get("Content-Security-Policy") != mail.PageCSP || h.Get("X-Request-Id") == "" {
				t.Errorf("headers %v", h)
			}
			if tc.status == 503 && h.Get("Retry-After") == "" {
				t.Error("503 without Retry-After")
			}
			if strings.Contains(rec.Body.String(), tc.token) && !strings.Contains(rec.Body.String(), tc.token+"/decline") {
				t.Error("the page repeats the token outside the decline link")
			}
		})
	}

	// A malformed token is answered without asking storage.
	before := fc.calls
	e.do(t, req{"GET", "/confirm/short", nil, nil})
	if fc.calls != before {
		t.Error("a malformed token reached the Confirmer")
	}
	// Other methods: the envelope's 405 with Allow, decided by routing.
	rec := e.do(t, req{"PUT", "/confirm/" + valid, nil, nil})
	if rec.Code != http.StatusMethodNotAllowed || !strings.Contains(rec.Header().Get("Allow"), "POST") {
		t.Errorf("PUT: status %d Allow %q; want 405 naming GET and POST", rec.Code, rec.Header().Get("Allow"))
	}
	// The token never reaches the logs; the unexpected error does, the unavailable one as a warning.
	logs := e.logs.String()
	for _, tok := range []string{valid, done, down, broken, unknown} {
		if strings.Contains(logs, tok) {
			t.Errorf("logs contain a token")
		}
	}
	if !strings.Contains(logs, "something unexpected") || !strings.Contains(logs, `"level":"WARN","msg":"database unavailable"`) {
		t.Errorf("logs lack the errors:\n%s", logs)
	}
}

// TestConfirmPagesLimitedPerClient: the confirmation pages have a budget per client address
// (CONFIRM_RATE_LIMITS): over it, the friendly 429 page with Retry-After, before any token is
// looked up; other addresses keep theirs; behind a trusted proxy the address is the one
// X-Forwarded-For names (docs/api-contract.md §5).
func TestConfirmPagesLimitedPerClient(t *testing.T) {
	proxy := netip.MustParsePrefix("10.0.0.0/8")
	opt, _ := withLimiter(limits.Config{Confirm: []limits.Window{{Limit: 3, Period: time.Minute}}}, proxy)
	e := newEnv(t, opt)
	fc := &fakeConfirmer{}
	e.srv.HandleConfirmations(fc)
	token, _ := mail.NewToken()
	page := func(method, from string, xff ...string) *httptest.ResponseRecorder {
		r := newRequest(req{method, "/confirm/" + token, nil, nil})
		r.RemoteAddr = from + ":4711"
		for _, v := range xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		rec := httptest.NewRecorder()
		e.srv.ServeHTTP(rec, r)
		return rec
	}
	for i, m := range []string{"GET", "POST", "GET"} {
		if rec := page(m, "192.0.2.1"); rec.Code != http.StatusNotFound {
			t.Fatalf("page %d: status %d; want 404 (the unknown token, within the budget)", i+1, rec.Code)
		}
	}
	lookups := fc.calls
	rec := page("POST", "192.0.2.1")
	if rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), "Please wait a moment") {
		t.Fatalf("over the budget: status %d; want the 429 page:\n%s", rec.Code, rec.Body)
	}
	if ra := rec.Header().Get("Retry-After"); ra != "20" {
		t.Errorf("Retry-After %q; want 20", ra)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/html") || rec.Header().Get("Content-Security-Policy") != mail.PageCSP {
		t.Errorf("headers %v; want the pages' HTML headers", rec.Header())
	}
	if fc.calls != lookups {
		t.Error("a limited request looked its token up")
	}
	if rec := page("GET", "192.0.2.2"); rec.Code != http.StatusNotFound {
		t.Errorf("another address: status %d; want its own budget", rec.Code)
	}
	// Through the trusted proxy, each client named by X-Forwarded-For has its own budget, and a
	// forged leftmost hop does not escape the one the proxy appended.
	for range 3 {
		page("GET", "10.0.0.5", "198.51.100.7")
	}
	if rec := page("GET", "10.0.0.5", "203.0.113.9, 198.51.100.7"); rec.Code != http.StatusTooManyRequests {
		t.Errorf("forged hop behind the proxy: status %d; want 429", rec.Code)
	}
	if rec := page("GET", "10.0.0.5", "198.51.100.8"); rec.Code != http.StatusNotFound {
		t.Errorf("another client behind the proxy: status %d; want 404", rec.Code)
	}
}
