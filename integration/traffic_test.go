package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/subscriberd/subscriberd/api"
)

// The document never lies about errors (docs/api-contract.md §1, §17): every answer the
// servers of this suite send is recorded, with the operation that sent it, and when the
// package's tests have run, TestMain checks each (status, code) against the OpenAPI document:
// a status the operation does not declare, or an error code its response's code enum does not
// list, fails the package run (checkTraffic). It is fed by the tests' real requests, so a new
// operation or code is checked as soon as a test drives it.
//
// A server of the suite takes part when its handler is wrapped in recordTraffic (newEnv's
// is). The operation is the route the server itself matched (it tells its response writers
// through SetRoute, as it tells the tracing handler); answers to requests that matched no
// operation (404 and 405 of routing, the docs) are not operations' answers and are left out,
// and so is 499, the status of a request whose client went away before the answer: nobody
// receives it.

// answer is one kind of answer an operation sent.
type answer struct {
	method, route string
	status        int
	code          string // the error envelope's code; "" for a success
}

var traffic = struct {
	mu   sync.Mutex
	seen map[answer]string // → an example: the request's path and the start of the body
}{seen: map[answer]string{}}

// recordTraffic wraps a server's handler so that its answers are checked against the
// document at the end of the package run.
func recordTraffic(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &trafficWriter{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		if rec.route == "" || rec.status == StatusClientClosed {
			return
		}
		a := answer{method: r.Method, route: rec.route, status: rec.status}
		if a.status >= 400 {
			var env struct {
				Code string `json:"code"`
			}
			if err := json.Unmarshal(rec.body.Bytes(), &env); err != nil || env.Code == "" {
				a.code = "(no envelope)"
			} else {
				a.code = env.Code
			}
		}
		traffic.mu.Lock()
		if _, ok := traffic.seen[a]; !ok {
			traffic.seen[a] = fmt.Sprintf("%s %s → %.200s", r.Method, r.URL.Path, rec.body.String())
		}
		traffic.mu.Unlock()
	})
}

// StatusClientClosed is api.StatusClientClosed (499).
const StatusClientClosed = api.StatusClientClosed

// trafficWriter remembers an answer's status, route and, for an error, its body.
type trafficWriter struct {
	http.ResponseWriter
	status int
	route  string
	body   bytes.Buffer
}

// SetRoute records the route the server matched, and tells it on to the writers this one
// wraps (the tracing handler's, when there is one outside).
func (w *trafficWriter) SetRoute(route string) {
	w.route = route
	for next := w.ResponseWriter; next != nil; {
		if rs, ok := next.(interface{ SetRoute(string) }); ok {
			rs.SetRoute(route)
			return
		}
		u, ok := next.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return
		}
		next = u.Unwrap()
	}
}

func (w *trafficWriter) WriteHeader(code int) {
	if code >= 200 && (w.status == 0 || code == StatusClientClosed) {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *trafficWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.status >= 400 && w.body.Len() < 1<<16 {
		w.body.Write(b)
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *trafficWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// checkTraffic compares every recorded answer with the OpenAPI document the service serves
// and returns one line per answer it does not declare, sorted.
func checkTraffic() []string {
	raw, err := json.Marshal(api.New(api.Config{}).OpenAPI())
	if err != nil {
		return []string{"marshalling the OpenAPI document: " + err.Error()}
	}
	var doc struct {
		Paths map[string]map[string]struct {
			OperationID string `json:"operationId"`
			Responses   map[string]struct {
				Content map[string]struct {
					Schema struct {
						AllOf []struct {
							Properties struct {
								Code struct {
									Enum []string `json:"enum"`
								} `json:"code"`
							} `json:"properties"`
						} `json:"allOf"`
					} `json:"schema"`
				} `json:"content"`
			} `json:"responses"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return []string{"decoding the OpenAPI document: " + err.Error()}
	}
	traffic.mu.Lock()
	defer traffic.mu.Unlock()
	var problems []string
	for a, example := range traffic.seen {
		method := a.method
		if method == http.MethodHead { // the mux answers HEAD with the GET operation
			method = http.MethodGet
		}
		op, ok := doc.Paths[a.route][strings.ToLower(method)]
		if !ok {
			if _, isPath := doc.Paths[a.route]; isPath {
				problems = append(problems, fmt.Sprintf("%s %s: no such operation in the document (%s)", a.method, a.route, example))
			}
			continue // not an API operation (a confirmation page, the document itself)
		}
		resp, ok := op.Responses[strconv.Itoa(a.status)]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s (%s %s) answered %d, which it does not declare: %s",
				op.OperationID, a.method, a.route, a.status, example))
			continue
		}
		if a.status < 400 {
			continue
		}
		var enum []string
		for _, part := range resp.Content["application/json"].Schema.AllOf {
			enum = append(enum, part.Properties.Code.Enum...)
		}
		if !slices.Contains(enum, a.code) {
			problems = append(problems, fmt.Sprintf("%s (%s %s) answered %d %s, which its %d response does not list (it lists %v): %s",
				op.OperationID, a.method, a.route, a.status, a.code, a.status, enum, example))
		}
	}
	slices.Sort(problems)
	return problems
}

// trafficSummary is the count of distinct answers checked, for the log.
func trafficSummary() int {
	traffic.mu.Lock()
	defer traffic.mu.Unlock()
	return len(traffic.seen)
}
