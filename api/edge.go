package api

import (
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"
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

	// tooLargeDrain and tooLargeWait bound what bound reads of a body it refuses (413).
	tooLargeDrain = 4 * MaxBodyBytes
	tooLargeWait  = 250 * time.Millisecond
)

var (
	msgQueryTooLong = "The query string must not be longer than " + strconv.Itoa(MaxQueryBytes) + " bytes."
	msgQueryTooMany = "The query string must not have more than " + strconv.Itoa(MaxQueryParams) + " parameters."
	errBodyTooLarge = newError(http.StatusRequestEntityTooLarge, MsgTooLarge)
)

// bound refuses, before anything parses them, a query string over MaxQueryBytes or
// MaxQueryParams (400) and a declared Content-Length over MaxBodyBytes (413). The 413 is
// answered without parsing the body, so a client that sent "Expect: 100-continue" never gets
// "100 Continue" and uploads nothing; the connection is closed after the answer rather than
// left waiting for a body that will not come. A client that sends its body at once has up to
// tooLargeDrain of it read and dropped first, for at most tooLargeWait (a client that never
// sends it waits that long): a connection closed with unread data is reset, and a client
// still sending then sees the reset, not the 413.
func (s *Server) bound(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if msg := queryProblem(r.URL.RawQuery); msg != "" {
			writeError(w, newError(http.StatusBadRequest, msg))
			return
		}
		if q := literalPercents(r.URL.RawQuery); q != r.URL.RawQuery {
			u := *r.URL
			u.RawQuery = q
			r2 := *r
			r2.URL = &u
			r = &r2
		}
		// An import's file has its own limit (IMPORT_MAX_BYTES, docs/api-contract.md §15.1).
		if r.ContentLength > MaxBodyBytes && (r.Method != http.MethodPost || r.URL.Path != ImportPath) {
			w.Header().Set("Connection", "close")
			if r.Header.Get("Expect") == "" {
				_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(tooLargeWait))
				_, _ = io.CopyN(io.Discard, r.Body, tooLargeDrain)
			}
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

// literalPercents returns raw with every "%" that does not start an escape (two hex digits)
// written as "%25". Huma, like Go's url.ParseQuery, skips a parameter whose value it cannot
// decode, as if it had not been sent: ?email=ann%40example.com%zz would list every subscriber,
// and ?status=%zz would not filter. Taken literally, the value is what was sent, and the
// parameter's own rule judges it (an invalid page, limit, status, email or cursor is a 400),
// as PHP, whose decoding the user's Laravel-styled spec assumes, reads it.
func literalPercents(raw string) string {
	var b strings.Builder
	done := 0 // raw[:done] is in b
	for i := strings.IndexByte(raw, '%'); i >= 0; {
		if i+2 >= len(raw) || !ishex(raw[i+1]) || !ishex(raw[i+2]) {
			b.WriteString(raw[done : i+1])
			b.WriteString("25")
			done = i + 1
		}
		next := strings.IndexByte(raw[i+1:], '%')
		if next < 0 {
			break
		}
		i += 1 + next
	}
	if done == 0 {
		return raw
	}
	b.WriteString(raw[done:])
	return b.String()
}

func ishex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
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
