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
	// PageScript is the pages' one script, served at [ScriptPath].
	PageScript = mustRead("pages/consent.js")
	pageStyle  = mustRead("pages/style.css")
)

// ScriptPath is where the pages' script is served, from the service itself.
const ScriptPath = "/confirm.js"

// PageCSP is the Content-Security-Policy of every confirmation page: nothing may load but the
// service's own script (docs/api-contract.md §12: no inline script at all) and the page's own
// inline style, named by its hash. The form may post only to this origin, and no other site
// may frame the page.
var PageCSP = "default-src 'none'; script-src 'self'; style-src " + cspHash(pageStyle) +
	"; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// Page is one of the confirmation pages.
type Page int

// The confirmation pages.
const (
	// PageConfirm is the answer to GET /confirm/<token> for a valid token: a form that posts
	// back to the same URL, with a button whose nonce the page's script copies into the form
	// only on a trusted click, and a <noscript> checkbox (docs/api-contract.md §12.1). Nothing
	// submits it by itself, so link scanners can fetch it, and run it, harmlessly.
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
	// PageDecline is the answer to GET /confirm/<token>/decline: "I did not sign up"
	// (docs/api-contract.md §12.2), protected as the confirm page is.
	PageDecline
	// PageDeclined says no more email will come.
	PageDeclined
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
	PageDecline:     {"decline", "Did you not sign up?", http.StatusOK},
	PageDeclined:    {"declined", "You’re off the list", http.StatusOK},
}

// PageData is what a page shows. Every field is escaped.
type PageData struct {
	Newsletter string // the newsletter's name
	Email      string // the subscriber's address (confirm and decline pages)
	Token      string // the link's token, for the decline link of the confirm page
	Nonce      string // the page's nonce (Nonces), for its button
	Notice     string // a line above the form, after a POST that changed nothing
}

// Status is the HTTP status the page is served with.
func (p Page) Status() int { return pageInfo[p].status }

// WritePage writes page p with its status and headers: HTML, the strict [PageCSP], never
// cached, never framed, no referrer (the URL holds the token). newsletter is the name shown on
// the pages; it is escaped.
func WritePage(w http.ResponseWriter, p Page, newsletter string) {
	WritePageData(w, p, PageData{Newsletter: newsletter})
}

// WritePageData is WritePage with everything the confirm and decline pages show.
func WritePageData(w http.ResponseWriter, p Page, d PageData) {
	info, ok := pageInfo[p]
	if !ok {
		info = pageInfo[PageUnavailable]
	}
	var buf bytes.Buffer
	err := pageTemplates.ExecuteTemplate(&buf, info.name, struct {
		Title, Newsletter, Email, Token, Nonce, Notice string
		Style                                          template.CSS
	}{info.title, oneLine(d.Newsletter), oneLine(d.Email), d.Token, d.Nonce, d.Notice, template.CSS(pageStyle)})
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

// WriteScript serves [PageScript].
func WriteScript(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/javascript; charset=utf-8")
	h.Set("Cache-Control", "public, max-age=300")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(PageScript)))
	_, _ = w.Write([]byte(PageScript))
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
