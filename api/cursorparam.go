package api

import (
	"encoding/base64"
	"net/http"
	"strings"

	"github.com/danielgtaylor/huma/v2"

	"github.com/subscriberd/subscriberd/api/cursor"
	"github.com/subscriberd/subscriberd/model"
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

// A key cursor marks a place in a list sorted by a text key rather than by time (GET /tags by
// tag, GET /segments by name key): the last key of a page (base64url) and a MAC of it bound to
// the list and the newsletter (a cursor.Codec's, over a binding that holds the key):
// "<key>.<mac>".
func (s *Server) encodeKeyCursor(list, nl, key string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(key)) + "." + s.cursors.Encode(cursor.Binding(list, nl, key), cursor.Position{})
}

// decodeKeyCursor is the key of c, a cursor of list made by encodeKeyCursor for the
// newsletter nl; ok is false for anything else.
func (s *Server) decodeKeyCursor(list, nl, c string) (key string, ok bool) {
	enc, mac, ok := strings.Cut(c, ".")
	if !ok {
		return "", false
	}
	k, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil || len(k) == 0 || strings.ContainsRune(string(k), 0) {
		return "", false
	}
	if _, err := s.cursors.Decode(cursor.Binding(list, nl, string(k)), mac); err != nil {
		return "", false
	}
	return string(k), true
}

// newestFirst is one page of a newsletter's jobs, newest first (GET /imports, GET
// /bulk-actions): limit as the query gave it, and after the position that cur, a cursor of list,
// holds. read returns up to limit+1 of them after a position (nil: from the newest), at is a
// job's position, and view its API form. The page's cursor holds its last job's position.
func newestFirst[T, O any](s *Server, list string, p model.Principal, limit, cur string,
	read func(limit int, after *model.Position) ([]T, error), at func(T) model.Position, view func(T) O) ([]O, EventPagination, error) {
	q, err := model.ParseListQuery("", limit, "")
	if err != nil {
		return nil, EventPagination{}, err
	}
	binding := cursor.Binding(list, p.NewsletterID.String())
	var after *model.Position
	if cur != "" {
		pos, err := s.cursors.Decode(binding, cur)
		if err != nil {
			return nil, EventPagination{}, newError(http.StatusBadRequest, MsgCursorInvalid)
		}
		after = &model.Position{CreatedAt: pos.Time, ID: pos.ID}
	}
	jobs, err := read(q.Limit, after)
	if err != nil {
		return nil, EventPagination{}, err
	}
	page := EventPagination{Limit: q.Limit}
	if len(jobs) > q.Limit {
		jobs = jobs[:q.Limit]
		last := at(jobs[len(jobs)-1])
		c := s.cursors.Encode(binding, cursor.Position{Time: last.CreatedAt, ID: last.ID})
		page.NextCursor = &c
	}
	out := make([]O, len(jobs))
	for i, j := range jobs {
		out[i] = view(j)
	}
	return out, page, nil
}
