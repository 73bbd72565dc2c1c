package api

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/subscriberd/subscriberd/limits"
	"github.com/subscriberd/subscriberd/mail"
	"github.com/subscriberd/subscriberd/model"
)

// ConfirmRoute is the route of the double-opt-in pages (docs/api-contract.md §6, §12), on the
// public listener, without an API key; DeclineRoute is its "I did not sign up" page.
const (
	ConfirmRoute = "/confirm/{token}"
	DeclineRoute = ConfirmRoute + "/decline"
)

// Confirmer resolves confirmation tokens, given by hash. An unusable token (unknown, expired,
// superseded, or its subscriber no longer pending) is model.ErrTokenInvalid.
type Confirmer interface {
	// Lookup changes nothing.
	Lookup(ctx context.Context, hash []byte) (model.Confirmation, error)
	// Confirm activates the pending subscriber; again with the token that confirmed, it
	// succeeds and changes nothing.
	Confirm(ctx context.Context, hash []byte) (model.Confirmation, error)
	// Decline unsubscribes the pending subscriber and suppresses its address (reason
	// declined), and reports whether the suppression is new; again with the token that
	// declined, it succeeds and changes nothing.
	Decline(ctx context.Context, hash []byte) (model.Confirmation, bool, error)
}

// Page actions and outcomes (telemetry's confirmation_page_posts_total labels).
const (
	actionConfirm = "confirm"
	actionDecline = "decline"

	outcomeConfirmed = "confirmed"
	outcomeDeclined  = "declined"
	outcomeRepeated  = "repeated"
	outcomeRefused   = "refused"
	outcomeInvalid   = "invalid"
)

// Notices of a POST that changed nothing (docs/api-contract.md §12.1).
const (
	NoticeConfirm = "Press the button to confirm your subscription."
	NoticeDecline = "Press the button to stop all email to this address."
)

// maxPageForm bounds the body of a page's POST: a nonce and a checkbox.
const maxPageForm = 4 << 10

// HandleConfirmations serves the confirmation pages with c (docs/api-contract.md §12): GET
// shows the confirm or decline page and changes nothing, since mail scanners fetch links; a
// POST acts only with proof that a person asked — the page's nonce, copied into the form by the
// page's script on a trusted click, or the checkbox of browsers without scripts, or for a
// decline the one-click unsubscribe of RFC 8058. Unusable tokens get the 404 page.
func (s *Server) HandleConfirmations(c Confirmer) {
	s.mux.HandleFunc("GET "+mail.ScriptPath, func(w http.ResponseWriter, _ *http.Request) { mail.WriteScript(w) })
	s.mux.HandleFunc("GET "+ConfirmRoute, func(w http.ResponseWriter, r *http.Request) { s.pageGet(w, r, c, actionConfirm) })
	s.mux.HandleFunc("POST "+ConfirmRoute, func(w http.ResponseWriter, r *http.Request) { s.pagePost(w, r, c, actionConfirm) })
	s.mux.HandleFunc("GET "+DeclineRoute, func(w http.ResponseWriter, r *http.Request) { s.pageGet(w, r, c, actionDecline) })
	s.mux.HandleFunc("POST "+DeclineRoute, func(w http.ResponseWriter, r *http.Request) { s.pagePost(w, r, c, actionDecline) })
}

// pageStart applies the pages' rate limit and reads the token: ok false when the answer has
// been written.
func (s *Server) pageStart(w http.ResponseWriter, r *http.Request) (token string, ip netip.Addr, ok bool) {
	ip = limits.ClientIP(r, s.cfg.TrustedProxies)
	// Every page costs a token lookup: a budget per client address (docs/limits.md) keeps a
	// client from guessing tokens at the database's expense.
	if s.limiter != nil {
		if d := s.limiter.CheckConfirm(r.Context(), ip); !d.Allowed {
			w.Header().Set("Retry-After", strconv.Itoa(d.RetryAfter))
			mail.WritePage(w, mail.PageRateLimited, "")
			return "", ip, false
		}
	}
	// The token is a secret: it goes into no log, error or span, only into its hash.
	token = r.PathValue("token")
	if !mail.WellFormedToken(token) {
		mail.WritePage(w, mail.PageInvalid, "")
		return "", ip, false
	}
	return token, ip, true
}

func (s *Server) pageGet(w http.ResponseWriter, r *http.Request, c Confirmer, action string) {
	token, _, ok := s.pageStart(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	hash := mail.HashToken(token)
	conf, err := c.Lookup(ctx, hash)
	if err != nil {
		s.pageError(w, ctx, err)
		return
	}
	s.dbOutage.OK(ctx)
	s.writeState(w, action, token, hash, conf, "")
}

// writeState writes the page for conf as it stands: the done page, the 404 of a token that did
// the other thing, or the form (with notice, after a POST that changed nothing).
func (s *Server) writeState(w http.ResponseWriter, action, token string, hash []byte, conf model.Confirmation, notice string) {
	d := mail.PageData{Newsletter: conf.NewsletterName, Email: conf.Email, Token: token, Notice: notice}
	switch {
	case action == actionConfirm && conf.Declined, action == actionDecline && conf.Confirmed:
		mail.WritePage(w, mail.PageInvalid, "")
	case conf.Confirmed:
		mail.WritePage(w, mail.PageConfirmed, conf.NewsletterName)
	case conf.Declined:
		mail.WritePage(w, mail.PageDeclined, conf.NewsletterName)
	case action == actionDecline:
		d.Nonce = s.nonces.Make(actionDecline, hash, time.Now())
		mail.WritePageData(w, mail.PageDecline, d)
	default:
		d.Nonce = s.nonces.Make(actionConfirm, hash, time.Now())
		mail.WritePageData(w, mail.PageConfirm, d)
	}
}

func (s *Server) pagePost(w http.ResponseWriter, r *http.Request, c Confirmer, action string) {
	token, ip, ok := s.pageStart(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	hash := mail.HashToken(token)
	now := time.Now()
	// A body that is too long or not a form proves nothing: it is read as an empty form.
	r.Body = http.MaxBytesReader(w, r.Body, maxPageForm)
	_ = r.ParseForm()
	src := model.LinkSource("", r.UserAgent())
	if ip.IsValid() {
		src.IP = ip.String()
	}
	switch served, valid := s.nonces.Check(action, hash, r.PostForm.Get("intent"), now); {
	case valid:
		onPage := max(int64(now.Sub(served)/time.Second), 0)
		src.Method, src.SecondsOnPage = model.MethodButton, &onPage
	case r.PostForm.Get("consent") == "yes":
		src.Method = model.MethodCheckbox
	case action == actionDecline && r.PostForm.Get("List-Unsubscribe") == "One-Click":
		// RFC 8058: sent by a mailbox provider on the person's action only.
		src.Method = "one_click"
	}
	if src.Method == "" {
		// No proof that a person asked (a scanner, or the form submitted as it is): nothing
		// changes, and the page asks for the button again.
		conf, err := c.Lookup(ctx, hash)
		if err != nil {
			s.pageOutcome(ctx, action, outcomeInvalid)
			s.pageError(w, ctx, err)
			return
		}
		s.dbOutage.OK(ctx)
		s.pageOutcome(ctx, action, outcomeRefused)
		notice := NoticeConfirm
		if action == actionDecline {
			notice = NoticeDecline
		}
		s.writeState(w, action, token, hash, conf, notice)
		return
	}
	ctx = model.WithSource(ctx, src)
	var conf model.Confirmation
	var err error
	var created bool
	if action == actionDecline {
		conf, created, err = c.Decline(ctx, hash)
	} else {
		conf, err = c.Confirm(ctx, hash)
	}
	if err != nil {
		if errors.Is(err, model.ErrTokenInvalid) {
			s.pageOutcome(ctx, action, outcomeInvalid)
		}
		s.pageError(w, ctx, err)
		return
	}
	s.dbOutage.OK(ctx)
	switch {
	case action == actionDecline:
		if created {
			s.metrics.SuppressionsCreated(string(model.ReasonDeclined), 1)
			s.pageOutcome(ctx, action, outcomeDeclined)
		} else {
			s.pageOutcome(ctx, action, outcomeRepeated)
		}
		mail.WritePage(w, mail.PageDeclined, conf.NewsletterName)
	default:
		// Confirm does not tell a first confirmation from a repeat; the event log does.
		s.pageOutcome(ctx, action, outcomeConfirmed)
		mail.WritePage(w, mail.PageConfirmed, conf.NewsletterName)
	}
}

// pageOutcome counts a POST's outcome and names it on the request's span.
func (s *Server) pageOutcome(ctx context.Context, action, outcome string) {
	trace.SpanFromContext(ctx).SetAttributes(attribute.String("subscriberd.page.action", action),
		attribute.String("subscriberd.page.outcome", outcome))
	s.metrics.PagePost(action, outcome)
}

// pageError writes the page of a failed lookup or change.
func (s *Server) pageError(w http.ResponseWriter, ctx context.Context, err error) {
	switch {
	case errors.Is(err, model.ErrTokenInvalid):
		s.dbOutage.OK(ctx) // the database answered
		mail.WritePage(w, mail.PageInvalid, "")
	case clientGone(ctx):
		w.WriteHeader(StatusClientClosed) // nobody is left to read a page
	default:
		if errors.Is(err, model.ErrUnavailable) {
			s.dbOutage.Failed(ctx, err)
		} else if ctx.Err() == nil {
			s.log.ErrorContext(ctx, "confirmation failed", "error", err)
		}
		w.Header().Set("Retry-After", strconv.Itoa(unavailableRetryIn))
		mail.WritePage(w, mail.PageUnavailable, "")
	}
}
