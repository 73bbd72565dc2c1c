package api

import (
	"net/http"

	"github.com/danielgtaylor/huma/v2"
)

// emptyCursor answers 400 "The cursor is invalid." to a request that gives an operation's
// cursor query parameter with no value (cursor= or a bare cursor): that is a malformed cursor,
// not the absence of one (docs/api-contract.md §9.2, §17). It applies to every operation that
// declares a query parameter named cursor, so a new list that takes one needs nothing more.
// Huma hands handlers "" for both, so the raw query decides.
func (s *Server) emptyCursor(ctx huma.Context, next func(huma.Context)) {
	if takesCursor(ctx.Operation()) {
		u := ctx.URL()
		if vs, ok := u.Query()["cursor"]; ok && vs[0] == "" {
			s.writeErr(ctx, newError(http.StatusBadRequest, MsgCursorInvalid))
			return
		}
	}
	next(ctx)
}

// takesCursor reports whether op declares the query parameter cursor.
func takesCursor(op *huma.Operation) bool {
	for _, p := range op.Parameters {
		if p.In == "query" && p.Name == "cursor" {
			return true
		}
	}
	return false
}
