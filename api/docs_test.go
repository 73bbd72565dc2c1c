package api_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/subscriberd/subscriberd/api"
)

var (
	// attrURL finds the URLs an HTML page loads or links: src, href, data-url.
	attrURL = regexp.MustCompile(`(?i)\b(?:src|href|data-url|action|srcset|poster)\s*=\s*"([^"]*)"`)
	// cssURL finds what a stylesheet loads.
	cssURL = regexp.MustCompile(`(?i)url\(\s*["']?([^"')]*)|@import\s+["']?([^"';\s]*)`)
)

// sameOrigin reports whether ref, as written in a page or stylesheet, stays on the page's
// origin (a path or a relative reference) or fetches nothing (data:, a fragment).
func sameOrigin(ref string) bool {
	switch {
	case strings.HasPrefix(ref, "data:"), strings.HasPrefix(ref, "#"):
		return true
	case strings.HasPrefix(ref, "//"), strings.Contains(ref, "://"):
		return false
	}
	return !strings.Contains(strings.SplitN(ref, "/", 2)[0], ":") // no scheme such as javascript:
}

// TestDocsPageOffline: the reference page and everything it loads come from the service
// itself, under a Content-Security-Policy that allows no other origin, and a browser without
// scripts is pointed at the OpenAPI document.
func TestDocsPageOffline(t *testing.T) {
	e := newEnv(t)
	rec := e.do(t, req{"GET", "/api/v1/docs", nil, nil})
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") {
		t.Fatalf("GET /api/v1/docs = %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
		t.Errorf("GET /api/v1/docs Cache-Control = %q, want no-store as every response of the contract (§1)", cc)
	}
	csp := rec.Header().Get("Content-Security-Policy")
	for _, d := range strings.Split(csp, ";") {
		for _, src := range strings.Fields(d)[1:] {
			if src != "'self'" && src != "'none'" && src != "data:" {
				t.Errorf("CSP directive %q allows %s; want only 'self' (and data: images)", strings.TrimSpace(d), src)
			}
		}
	}
	for _, want := range []string{"default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("CSP %q lacks %q", csp, want)
		}
	}
	page := rec.Body.String()
	noscript := page[strings.Index(page, "<noscript>")+1 : strings.Index(page, "</noscript>")]
	if !strings.Contains(noscript, `href="/api/v1/openapi.yaml"`) {
		t.Errorf("the <noscript> fallback does not link /api/v1/openapi.yaml:\n%s", noscript)
	}

	loaded := 0
	for _, m := range attrURL.FindAllStringSubmatch(page, -1) {
		ref := m[1]
		if !sameOrigin(ref) {
			t.Errorf("the page references another origin: %s", m[0])
			continue
		}
		res := e.do(t, req{"GET", ref, nil, nil})
		if res.Code != http.StatusOK || res.Body.Len() == 0 {
			t.Errorf("GET %s (referenced by the page) = %d, %d bytes", ref, res.Code, res.Body.Len())
			continue
		}
		loaded++
		ct := res.Header().Get("Content-Type")
		switch {
		case strings.HasPrefix(ct, "text/css"):
			for _, c := range cssURL.FindAllStringSubmatch(res.Body.String(), -1) {
				if r := c[1] + c[2]; !sameOrigin(r) {
					t.Errorf("%s loads another origin: %.80s", ref, c[0])
				}
			}
		case strings.HasSuffix(ref, "/docs.js"):
			if regexp.MustCompile(`https?:|["']//`).MatchString(res.Body.String()) {
				t.Errorf("%s names another origin:\n%s", ref, res.Body.String())
			}
		}
	}
	if loaded < 4 { // stylesheet, bundle, starter, the document
		t.Errorf("the page loads %d same-origin resources; want the stylesheet, both scripts and the document", loaded)
	}
}

// TestDocsAssetsRevalidate: the large assets are answered 304 when the browser's copy is
// current, and unknown asset names are the API's 404.
func TestDocsAssetsRevalidate(t *testing.T) {
	e := newEnv(t)
	rec := e.do(t, req{"GET", api.DocsAssetsPath + "swagger-ui-bundle.js", nil, nil})
	etag := rec.Header().Get("ETag")
	if rec.Code != http.StatusOK || etag == "" || rec.Header().Get("Cache-Control") != "no-cache" {
		t.Fatalf("bundle: %d, ETag %q, Cache-Control %q", rec.Code, etag, rec.Header().Get("Cache-Control"))
	}
	if rec := e.do(t, req{"GET", api.DocsAssetsPath + "swagger-ui-bundle.js", nil, []string{"If-None-Match: " + etag}}); rec.Code != http.StatusNotModified {
		t.Errorf("If-None-Match with the current ETag = %d, want 304", rec.Code)
	}
	for _, name := range []string{"LICENSE", "NOTICE"} {
		if rec := e.do(t, req{"GET", api.DocsAssetsPath + name, nil, nil}); rec.Code != http.StatusOK ||
			!strings.Contains(rec.Body.String(), "SmartBear") && !strings.Contains(rec.Body.String(), "Apache License") {
			t.Errorf("%s: %d", name, rec.Code)
		}
	}
	for _, name := range []string{"docs.html", "README.md", "..%2fdocs.go", "nope.js"} {
		rec := e.do(t, req{"GET", api.DocsAssetsPath + name, nil, nil})
		if rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), `"not_found"`) {
			t.Errorf("GET assets/%s = %d %s; want the 404 envelope", name, rec.Code, rec.Body.String())
		}
	}
}

// TestDocsDisabled: with the page off (DOCS_UI=off) it and its assets are unknown paths; the
// OpenAPI document is still served.
func TestDocsDisabled(t *testing.T) {
	e := newEnv(t, func(c *api.Config) { c.DisableDocs = true })
	for _, p := range []string{"/api/v1/docs", api.DocsAssetsPath + "swagger-ui-bundle.js"} {
		if rec := e.do(t, req{"GET", p, nil, nil}); rec.Code != http.StatusNotFound {
			t.Errorf("GET %s with the docs off = %d, want 404", p, rec.Code)
		}
	}
	if rec := e.do(t, req{"GET", "/api/v1/openapi.yaml", nil, nil}); rec.Code != http.StatusOK {
		t.Errorf("GET /api/v1/openapi.yaml with the docs off = %d, want 200", rec.Code)
	}
}

// chromium finds a headless Chromium: $CHROMIUM, else chromium or chromium-browser on PATH.
func chromium() string {
	if c := os.Getenv("CHROMIUM"); c != "" {
		return c
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// offlineChromium are the flags that keep Chromium off the network: every host name fails
// to resolve and every request not to loopback goes to a proxy that does not exist.
var offlineChromium = []string{"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
	"--disable-background-networking", "--disable-component-update", "--disable-sync",
	"--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
	"--proxy-server=http://127.0.0.1:9", // loopback bypasses a proxy by default
	"--enable-logging=stderr", "--v=0"}

// TestDocsPageRendersOffline loads the page in headless Chromium with the network off and
// finds every operation drawn, with no Content-Security-Policy violation on the console.
// scripts/test.sh installs Chromium when it is missing; without it the test is skipped.
func TestDocsPageRendersOffline(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no browser")
	}
	bin := chromium()
	if bin == "" {
		t.Skip("#### NO CHROMIUM: the docs page was NOT loaded in a browser (install the Debian package " +
			"`chromium`, or set CHROMIUM; scripts/test.sh installs it) ####")
	}
	e := newEnv(t)
	srv := httptest.NewServer(e.srv)
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := append(append([]string{}, offlineChromium...), "--user-data-dir="+t.TempDir(),
		"--virtual-time-budget=15000", "--dump-dom", srv.URL+"/api/v1/docs")
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", bin, err, stderr.String())
	}
	dom := stdout.String()
	for _, op := range []string{"create-subscriber", "bulk-create-subscribers", "list-subscribers", "get-subscriber",
		"update-subscriber", "unsubscribe-subscriber", "Create a subscriber", "Unsubscribe a subscriber"} {
		if !strings.Contains(dom, op) {
			t.Errorf("the rendered page lacks %q", op)
		}
	}
	if t.Failed() {
		t.Logf("DOM (%d bytes):\n%.3000s\nstderr:\n%s", len(dom), dom, stderr.String())
	}
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(line, "CONSOLE") || strings.Contains(line, "Content Security Policy") ||
			strings.Contains(line, "net::ERR_") {
			t.Errorf("browser console: %s", line)
		}
	}
}
