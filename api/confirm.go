package api

import (
	"context"
	"errors"
	"net/http"
	"strconv"

	"github.com/subscriberd/subscriberd/limits"
	"github.com/subscriberd/subscriberd/mail"
	"github.com/subscriberd/subscriberd/model"
)

// ConfirmRoute is the route of the double-opt-in pages (docs/api-contract.md §6), on the public listener,
// without an API key.
const ConfirmRoute = "/confirm/{token}"

// Confirmer resolves confirmation tokens, given by hash. An unusable token (unknown, expired,
// superseded, or its subscriber no longer pending) is model.ErrTokenInvalid.
type Confirmer interface {
	// Lookup changes nothing.
	Lookup(ctx context.Context, hash []byte) (model.Confirmation, error)
	// Confirm activates the pending subscriber; again with the token that confirmed, it
	// succeeds and changes nothing.
	Confirm(ctx context.Context, hash []byte) (model.Confirmation, error)
}

// HandleConfirmations serves the confirmation pages with c: GET /confirm/{token} shows a page
// whose form POSTs to the same URL (auto-submitted by a small script) and changes nothing, since
// mail scanners fetch links; POST confirms and shows "You're subscribed". Unusable tokens get
// the 404 page, for GET and POST alike.
func (s *Server) HandleConfirmations(c Confirmer) {
	s.mux.HandleFunc("GET "+ConfirmRoute, func(w http.ResponseWriter, r *http.Request) {
		s.confirmPage(w, r, c.Lookup, mail.PageConfirm)
	})
	s.mux.HandleFunc("POST "+ConfirmRoute, func(w http.ResponseWriter, r *http.Request) {
		s.confirmPage(w, r, c.Confirm, mail.PageConfirmed)
	})
}

func (s *Server) confirmPage(w http.ResponseWriter, r *http.Request,
	resolve func(context.Context, []byte) (model.Confirmation, error), ok mail.Page) {
	ctx := r.Context()
	ip := limits.ClientIP(r, s.cfg.TrustedProxies)
	// Every page costs a token lookup: a budget per client address (docs/limits.md) keeps a
	// client from guessing tokens at the database's expense.
	if s.limiter != nil {
		if d := s.limiter.CheckConfirm(ctx, ip); !d.Allowed {
			w.Header().Set("Retry-After", strconv.Itoa(d.RetryAfter))
			mail.WritePage(w, mail.PageRateLimited, "")
			return
		}
	}
	// The token is a secret: it goes into no log, error or span, only into its hash.
	token := r.PathValue("token")
	if !mail.WellFormedToken(token) {
		mail.WritePage(w, mail.PageInvalid, "")
		return
	}
	// The source of a confirmation (docs/api-contract.md §10.1): the client's address as the
	// limits judge it (§5) and its browser.
	ipText := ""
	if ip.IsValid() {
		ipText = ip.String()
	}
	c, err := resolve(model.WithSource(ctx, model.LinkSource(ipText, r.UserAgent())), mail.HashToken(token))
	if err == nil || errors.Is(err, model.ErrTokenInvalid) {
		s.dbOutage.OK(ctx) // the database answered
	}
	switch {
	case err == nil && c.Confirmed:
		// Already done (a repeated POST, or the link opened again): say so, no form.
		mail.WritePage(w, mail.PageConfirmed, c.NewsletterName)
	case err == nil:
		mail.WritePage(w, ok, c.NewsletterName)
	case errors.Is(err, model.ErrTokenInvalid):
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
