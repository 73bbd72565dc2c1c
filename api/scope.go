package api

import (
	"net/http"
	"strconv"

	"github.com/danielgtaylor/huma/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/subscriberd/subscriberd/model"
)

// scope refuses a write made with a read key (docs/api-contract.md §16.2): 403
// insufficient_scope, after authentication and the plan check and before the key lockout and
// rate limits count the request. Like every 403 it never counts toward the key lockout.
func (s *Server) scope(ctx huma.Context, next func(huma.Context)) {
	if len(ctx.Operation().Security) == 0 {
		next(ctx)
		return
	}
	p := principalFrom(ctx.Context())
	if p.Scope.Allows(ctx.Method()) {
		next(ctx)
		return
	}
	if span := trace.SpanFromContext(ctx.Context()); span.IsRecording() {
		span.AddEvent("scope", trace.WithAttributes(attribute.String("app.auth.outcome", "insufficient_scope"),
			attribute.String("app.api_key.id", p.KeyID.String())))
	}
	s.metrics.ScopeRefused(p.KeyPrefix)
	e := newError(http.StatusForbidden, model.MsgInsufficientScope)
	e.Code = CodeInsufficientScope
	s.writeErr(ctx, e)
}

// documentScope says on every operation's 403 which codes it can carry: api_access_disabled
// on all, insufficient_scope on the writes, which a read key may not make.
func (s *Server) documentScope() {
	for _, p := range s.api.OpenAPI().Paths {
		for _, op := range []*huma.Operation{p.Get, p.Post, p.Put, p.Patch, p.Delete} {
			if op == nil || len(op.Security) == 0 {
				continue
			}
			resp := op.Responses[strconv.Itoa(http.StatusForbidden)]
			if resp == nil {
				continue
			}
			resp.Description = "The newsletter's plan has API access disabled (`api_access_disabled`)."
			if op.Method != http.MethodGet {
				resp.Description = "The newsletter's plan has API access disabled (`api_access_disabled`), or the key is a " +
					"read-only key, which may call only GET operations (`insufficient_scope`, message `" +
					model.MsgInsufficientScope + "`)."
			}
		}
	}
}
