package mail

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"html/template"
	"net/http"
	"strconv"
)

//go:embed pages
var pageFiles embed.FS

var (
	pageTemplates = template.Must(template.ParseFS(pageFiles, "pages/pages.html.tmpl"))
	pageScript    = mustRead("pages/autosubmit.js")
	pageStyle     = mustRead("pages/style.css")
)

// PageCSP is the Content-Security-Policy of every confirmation page: nothing may load, and the
// only script and style allowed are the page's own inline ones, named by their hashes. The form
// may post only to this origin, and no other site may frame the page.
var PageCSP = "default-src 'none'; script-src " + cspHash(pageScript) + "; style-src " + cspHash(pageStyle) +
	"; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// Page is one of the confirmation pages.
type Page int

// The confirmation pages.
const (
	// PageConfirm is the answer to GET /confirm/<token> for a valid token: a form that posts
	// back to the same URL, submitted at once by a small script, with a button for browsers
	// that run no scripts. It changes nothing, so link scanners can fetch it harmlessly.
	PageConfirm Page = iota
	// PageConfirmed says "You're subscribed" (after POST, and when the POST is repeated).
	PageConfirmed
	// PageInvalid says the link is no longer valid (404).
	PageInvalid
	// PageUnavailable asks the person to try again shortly (503), when the database is down.
	PageUnavailable
	// PageRateLimited asks the person to wait a minute (429), when their address has opened
	// too many confirmation pages; the caller sets Retry-After.
	PageRateLimited
)

var pageInfo = map[Page]struct {
	name, title string
	status      int
}{
	PageConfirm:     {"confirm", "Confirm your subscription", http.StatusOK},
	PageConfirmed:   {"confirmed", "You’re subscribed", http.StatusOK},
	PageInvalid:     {"invalid", "Link no longer valid", http.StatusNotFound},
	PageUnavailable: {"unavailable", "Please try again", http.StatusServiceUnavailable},
	PageRateLimited: {"limited", "Please wait a moment", http.StatusTooManyRequests},
}

// Status is the HTTP status the page is served with.
func (p Page) Status() int { return pageInfo[p].status }

// WritePage writes page p with its status and headers: HTML, the strict [PageCSP], never
// cached, never framed, no referrer (the URL holds the token). newsletter is the name shown on
// the confirm and confirmed pages; it is escaped.
func WritePage(w http.ResponseWriter, p Page, newsletter string) {
	info, ok := pageInfo[p]
	if !ok {
		info = pageInfo[PageUnavailable]
	}
	var buf bytes.Buffer
	err := pageTemplates.ExecuteTemplate(&buf, info.name, struct {
		Title, Newsletter string
		Script            template.JS
		Style             template.CSS
	}{info.title, oneLine(newsletter), template.JS(pageScript), template.CSS(pageStyle)})
	if err != nil {
		// The templates are fixed and parsed at start; this only happens on a broken build.
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", PageCSP)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(info.status)
	_, _ = w.Write(buf.Bytes())
}

func cspHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
}

func mustRead(name string) string {
	b, err := pageFiles.ReadFile(name)
	if err != nil {
		panic(err)
	}
	return string(b)
}
