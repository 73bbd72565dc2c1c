package api_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/subscriberd/subscriberd/api"
)

// routeWriter stands for the tracing handler's response writer outside the API
// (telemetry.NewHTTPHandler's): it wants the route template once routing has chosen it.
type routeWriter struct {
	http.ResponseWriter
	routes []string
}

func (w *routeWriter) SetRoute(route string) { w.routes = append(w.routes, route) }

// The API tells the writer outside it the route template that matched (never the path), once,
// through the writers it wraps around it; an unmatched request tells nothing.
func TestRouteToldToTheWriterOutside(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct {
		r    req
		want []string
	}{
		{req{method: "GET", path: api.BasePath + "/subscribers/0190a3c4-0000-7000-8000-000000000001", headers: []string{"Authorization: Bearer " + keyA}},
			[]string{api.BasePath + "/subscribers/{id}"}},
		{req{method: "HEAD", path: api.BasePath + "/subscribers", headers: []string{"Authorization: Bearer " + keyA}}, []string{api.BasePath + "/subscribers"}},
		{req{method: "GET", path: "/nowhere/ann@example.com"}, nil},
	} {
		w := &routeWriter{ResponseWriter: httptest.NewRecorder()}
		e.srv.ServeHTTP(w, newRequest(c.r))
		if len(w.routes) != len(c.want) || (len(c.want) == 1 && w.routes[0] != c.want[0]) {
			t.Errorf("%s %s: routes told %q, want %q", c.r.method, c.r.path, w.routes, c.want)
		}
	}
}
