package api

import (
	"context"
	"net/http"
	"net/netip"
	"strconv"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/adapters/humago"

	"github.com/subscriberd/subscriberd/limits"
)

// Limiter decides the limits and lockouts of docs/api-contract.md §5 steps 1 and 4; *limits.Limiter is the
// implementation. Its decisions never fail: a limiter that cannot decide allows.
type Limiter interface {
	// CheckClient: is the client at ip locked out after repeated authentication failures?
	CheckClient(ctx context.Context, ip netip.Addr) limits.Decision
	// AuthFailed records an authentication failure of ip, before its 401; a refusing Decision
	// means the client is locked already, and the request gets the lockout's 429 instead.
	AuthFailed(ctx context.Context, ip netip.Addr) limits.Decision
	// CheckKey: may the key keyID make this request (its write lockout, its rate windows, and
	// the bulk windows when bulk)?
	CheckKey(ctx context.Context, keyID string, bulk bool) limits.Decision
	// WriteFailed records a failed write of the key keyID.
	WriteFailed(ctx context.Context, keyID string)
	// CheckConfirm: may the client at ip open a confirmation page?
	CheckConfirm(ctx context.Context, ip netip.Addr) limits.Decision
}

// opBulk is the operation whose requests count against the bulk windows too.
const opBulk = "bulk-create-subscribers"

// clientIP is the request's client address (docs/api-contract.md §5): the TCP peer, or the rightmost
// untrusted X-Forwarded-For hop when the peer is a trusted proxy.
func (s *Server) clientIP(ctx huma.Context) netip.Addr {
	r, _ := humago.Unwrap(ctx)
	return limits.ClientIP(r, s.cfg.TrustedProxies)
}

// clientLockout is docs/api-contract.md §5 step 1: a client locked out after repeated authentication
// failures gets 429 for every operation that needs a key, before the key is looked at, so it
// learns nothing about keys and cannot use a valid one while locked.
func (s *Server) clientLockout(ctx huma.Context, next func(huma.Context)) {
	if s.limiter == nil || len(ctx.Operation().Security) == 0 {
		next(ctx)
		return
	}
	if d := s.limiter.CheckClient(ctx.Context(), s.clientIP(ctx)); !d.Allowed {
		s.writeErr(ctx, tooManyRequests(d, MsgClientLocked))
		return
	}
	next(ctx)
}

// limit is docs/api-contract.md §5 step 4, after the key and the plan: the key's write lockout and rate
// windows. Every response of an authenticated request carries the RateLimit-* headers; a
// failed write (4xx other than 401, 403 and 429 to POST, PUT or DELETE) counts toward the
// key's write lockout.
func (s *Server) limit(ctx huma.Context, next func(huma.Context)) {
	if s.limiter == nil || len(ctx.Operation().Security) == 0 {
		next(ctx)
		return
	}
	keyID := principalFrom(ctx.Context()).KeyID.String()
	d := s.limiter.CheckKey(ctx.Context(), keyID, ctx.Operation().OperationID == opBulk)
	if !d.Allowed {
		msg := MsgRateLimited
		if d.Locked {
			msg = MsgKeyLocked
		}
		s.writeErr(ctx, tooManyRequests(d, msg))
		return
	}
	r, w := humago.Unwrap(ctx)
	d.SetHeaders(w.Header())
	next(ctx)
	if limits.CountsAsWriteFailure(r.Method, ctx.Status()) {
		s.limiter.WriteFailed(ctx.Context(), keyID)
	}
}

// tooManyRequests is the contract's 429: errors.retry_after equals Retry-After, and the
// RateLimit-* headers when a window applies. msg says which of the three causes of
// docs/api-contract.md §5 applies: a rate limit, the client's lockout or the key's.
func tooManyRequests(d limits.Decision, msg string) *Error {
	e := newError(http.StatusTooManyRequests, msg)
	e.Errors = RetryAfter{RetryAfter: d.RetryAfter}
	e.headers = http.Header{}
	d.SetHeaders(e.headers)
	return e
}

// documentLimits declares the limit headers in the OpenAPI document, once under
// components/headers and by reference: RateLimit-* on every response an authenticated
// request can get (not 401 and 403, which come before the key is known), and Retry-After on
// 429.
func (s *Server) documentLimits() {
	oapi := s.api.OpenAPI()
	if oapi.Components.Headers == nil {
		oapi.Components.Headers = map[string]*huma.Header{}
	}
	header := func(desc string) *huma.Header {
		return &huma.Header{Description: desc, Schema: &huma.Schema{Type: huma.TypeInteger, Minimum: new(float64)}}
	}
	oapi.Components.Headers["RateLimit-Limit"] = header("Requests allowed in the rate window closest to running out " +
		"(sent when rate limits are on and the key was accepted).")
	oapi.Components.Headers["RateLimit-Remaining"] = header("Requests left in that window after this one.")
	oapi.Components.Headers["RateLimit-Reset"] = header("Seconds until that window is full again.")
	retry := header("Whole seconds until a retry can succeed; equal to errors.retry_after.")
	retry.Required = true
	oapi.Components.Headers["Retry-After"] = retry
	ref := func(name string) *huma.Param { return &huma.Param{Ref: "#/components/headers/" + name} }

	for _, p := range oapi.Paths {
		for _, op := range []*huma.Operation{p.Get, p.Post, p.Put, p.Patch, p.Delete} {
			if op == nil || len(op.Security) == 0 {
				continue
			}
			for code, resp := range op.Responses {
				if code == strconv.Itoa(http.StatusUnauthorized) || code == strconv.Itoa(http.StatusForbidden) || code == "default" {
					continue
				}
				if resp.Headers == nil {
					resp.Headers = map[string]*huma.Param{}
				}
				for _, h := range []string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"} {
					resp.Headers[h] = ref(h)
				}
				if code == strconv.Itoa(http.StatusTooManyRequests) {
					resp.Headers["Retry-After"] = ref("Retry-After")
					resp.Description = "Too many requests: a rate window of the key is empty, or the key or the client is " +
						"temporarily locked out; the message says which. The RateLimit-* headers are absent when the client is locked out."
				}
			}
		}
	}
}
