package api

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io"
	"io/fs"
	"net/http"
	"path"
	"sync"
	"time"
)

// docsUI holds the reference page and its assets: Swagger UI from the npm package
// swagger-ui-dist (pinned, licence beside it; see docsui/README.md) and our page and starter.
//
//go:embed docsui
var docsUI embed.FS

// DocsPath is the reference page; DocsAssetsPath the prefix of what it loads.
const (
	DocsPath       = BasePath + "/docs"
	DocsAssetsPath = DocsPath + "/assets/"
)

// docsCSP lets the page load scripts, styles and the OpenAPI document from its own origin
// only, and nothing else. data: images are the icons inlined in swagger-ui.css; they fetch
// nothing. No inline script or style attribute runs.
const docsCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"font-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// docsAssets are the files under DocsAssetsPath, by name, with their media types.
var docsAssets = map[string]string{
	"swagger-ui-bundle.js":             "text/javascript; charset=utf-8",
	"swagger-ui.css":                   "text/css; charset=utf-8",
	"docs.js":                          "text/javascript; charset=utf-8",
	"LICENSE":                          "text/plain; charset=utf-8",
	"NOTICE":                           "text/plain; charset=utf-8",
	"swagger-ui-bundle.js.LICENSE.txt": "text/plain; charset=utf-8",
}

// staticFile is an embedded file, served from the binary's read-only data as it is. Reading
// the files into the heap kept 1.7 MB live (Swagger UI's bundle) for a page few requests ask
// for, and with GOGC=400 the collector lets the heap grow to five times what is live.
type staticFile struct {
	name        string // in docsUI
	contentType string
	etag        func() string // hashed once, at the first request for the file
}

func loadStatic(name, contentType string) staticFile {
	name = path.Join("docsui", name)
	if _, err := fs.Stat(docsUI, name); err != nil {
		panic("api: embedded docs file missing: " + name)
	}
	return staticFile{name: name, contentType: contentType, etag: sync.OnceValue(func() string {
		f, err := docsUI.Open(name)
		if err != nil {
			panic("api: embedded docs file unreadable: " + name)
		}
		defer f.Close()
		h := sha256.New()
		io.Copy(h, f) //nolint:errcheck // an embedded file reads without error
		return `"` + hex.EncodeToString(h.Sum(nil)[:8]) + `"`
	})}
}

// registerDocs mounts the reference page and its assets on the public mux. The page works
// without internet access; without JavaScript it names the OpenAPI document
// (docs/api-contract.md §1).
func (s *Server) registerDocs() {
	page := loadStatic("docs.html", "text/html; charset=utf-8")
	assets := map[string]staticFile{}
	for name, ct := range docsAssets {
		assets[name] = loadStatic(name, ct)
	}
	s.mux.HandleFunc("GET "+DocsPath, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", docsCSP)
		serveStatic(w, r, page, "no-store") // the contract's route: no-store, as every response (§1)
	})
	s.mux.HandleFunc("GET "+DocsAssetsPath+"{file}", func(w http.ResponseWriter, r *http.Request) {
		f, ok := assets[r.PathValue("file")]
		if !ok {
			writeError(w, newError(http.StatusNotFound, MsgRouteNotFound))
			return
		}
		serveStatic(w, r, f, "no-cache") // revalidate: one small 304 per load
	})
}

// serveStatic answers with f, or 304 when the client's copy is current: the assets are large
// and change only with the binary.
func serveStatic(w http.ResponseWriter, r *http.Request, f staticFile, cacheControl string) {
	file, err := docsUI.Open(f.name)
	if err != nil {
		writeError(w, newError(http.StatusNotFound, MsgRouteNotFound))
		return
	}
	defer file.Close()
	h := w.Header()
	h.Set("Content-Type", f.contentType)
	h.Set("Cache-Control", cacheControl)
	h.Set("ETag", f.etag()) // ServeContent answers If-None-Match with it
	// embed.FS documents that its files implement io.Seeker.
	http.ServeContent(w, r, "", time.Time{}, file.(io.ReadSeeker))
}
