package api

import (
	"net/http"
	"path"
	"strconv"
	"strings"
)

// Bounds of what the edge parses at all (docs/api-contract.md §4.3, §4.7). They are checked on
// the raw request, before routing, Huma or anything else reads the query or the body: Huma
// looks query parameters up one by one in the raw query, so a query of thousands of names cost
// seconds of CPU before any limit applied.
const (
	// MaxQueryBytes is the longest raw query string (after the "?", as sent) accepted.
	MaxQueryBytes = 2048
	// MaxQueryParams is the most query parameters ("&"-separated items, empty ones included)
	// accepted; the API reads three.
	MaxQueryParams = 32
)

var (
	msgQueryTooLong = "The query string must not be longer than " + strconv.Itoa(MaxQueryBytes) + " bytes."
	msgQueryTooMany = "The query string must not have more than " + strconv.Itoa(MaxQueryParams) + " parameters."
	errBodyTooLarge = newError(http.StatusRequestEntityTooLarge, MsgTooLarge)
)

// bound refuses, before anything parses them, a query string over MaxQueryBytes or
// MaxQueryParams (400) and a declared Content-Length over MaxBodyBytes (413). The 413 is
// answered without reading the body, so a client that sent "Expect: 100-continue" never gets
// "100 Continue" and uploads nothing; the connection is closed after the answer rather than
// left waiting for a body that will not come.
func (s *Server) bound(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if msg := queryProblem(r.URL.RawQuery); msg != "" {
			writeError(w, newError(http.StatusBadRequest, msg))
			return
		}
		if r.ContentLength > MaxBodyBytes {
			w.Header().Set("Connection", "close")
			writeError(w, errBodyTooLarge)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// queryProblem says what is wrong with a raw query string, or "". It only counts bytes.
func queryProblem(raw string) string {
	switch {
	case raw == "":
		return ""
	case len(raw) > MaxQueryBytes:
		return msgQueryTooLong
	case strings.Count(raw, "&")+1 > MaxQueryParams:
		return msgQueryTooMany
	}
	return ""
}

// cleanPath reports whether the mux serves p as it is: no empty, "." or ".." segment (a
// trailing slash is kept). The mux would redirect any other path to its cleaned form, with an
// HTML body; the API answers such a path with the JSON 404 instead, since it names no
// resource as given. The cleaning is the mux's own (net/http's cleanPath).
func cleanPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		np += "/"
	}
	return np == p
}
