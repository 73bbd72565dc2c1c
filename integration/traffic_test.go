package integration

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/subscriberd/subscriberd/api"
)

// The document never lies (docs/api-contract.md §1, §17): every answer the servers of this
// suite send is recorded, with the operation that sent it, and when the package's tests have
// run, TestMain checks each against the OpenAPI document: a status the operation does not
// declare, an error code its response's code enum does not list, or a body its response's
// schema does not accept fails the package run (checkTraffic). The bodies are checked by Ajv,
// a JSON Schema 2020-12 validator (testdata/ajv, pinned, installed with npm ci when missing;
// without node the body check is skipped, loudly). It is fed by the tests' real requests, so a
// new operation, code or event source is checked as soon as a test drives it.
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
	// bodies are distinct JSON bodies of each answer, up to maxBodyBytesPerAnswer in all,
	// and hashes what they hold.
	bodies map[answer][]string
	size   map[answer]int
	hashes map[[sha256.Size]byte]bool
}{seen: map[answer]string{}, bodies: map[answer][]string{}, size: map[answer]int{}, hashes: map[[sha256.Size]byte]bool{}}

// How much of the bodies the body check keeps: a body up to maxRecordedBody (a longer one is
// not checked), and up to maxBodyBytesPerAnswer of the distinct bodies of each answer.
const (
	maxRecordedBody       = 1 << 20
	maxBodyBytesPerAnswer = 4 << 20
)

// recordTraffic wraps a server's handler so that its answers are checked against the
// document at the end of the package run.
func recordTraffic(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &trafficWriter{ResponseWriter: w}
		var reqBody *cappedBody // for the Prism check (prism_test.go), with the target as sent
		uri := cmp.Or(r.RequestURI, r.URL.RequestURI())
		if r.Body != nil && r.Body != http.NoBody {
			reqBody = &cappedBody{ReadCloser: r.Body}
			r.Body = reqBody
		}
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
		if body := rec.body.Bytes(); rec.json && !rec.cut && len(body) > 0 && traffic.size[a]+len(body) <= maxBodyBytesPerAnswer {
			if h := sha256.Sum256(body); !traffic.hashes[h] {
				traffic.hashes[h] = true
				traffic.bodies[a] = append(traffic.bodies[a], string(body))
				traffic.size[a] += len(body)
			}
		}
		traffic.mu.Unlock()
		keepExchange(a, r, uri, reqBody, rec)
	})
}

// StatusClientClosed is api.StatusClientClosed (499).
const StatusClientClosed = api.StatusClientClosed

// trafficWriter remembers an answer's status, route and body (up to maxRecordedBody: cut
// tells it was longer), and whether the body is JSON.
type trafficWriter struct {
	http.ResponseWriter
	status int
	route  string
	body   bytes.Buffer
	cut    bool
	json   bool
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
	if w.body.Len() == 0 {
		mt, _, _ := mime.ParseMediaType(w.Header().Get("Content-Type"))
		w.json = mt == "application/json"
	}
	if w.body.Len()+len(b) <= maxRecordedBody {
		w.body.Write(b)
	} else {
		w.cut = true
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
	var bodies []bodyAnswer // the bodies of declared JSON responses, for the schema check
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
		if _, isJSON := resp.Content["application/json"]; isJSON {
			for _, b := range traffic.bodies[a] {
				bodies = append(bodies, bodyAnswer{Method: method, Route: a.route, Status: a.status, Body: b})
			}
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
	problems = append(problems, checkBodies(raw, bodies)...)
	problems = append(problems, checkPrism(raw)...)
	slices.Sort(problems)
	return problems
}

// bodyAnswer is a body to check against the schema of its response in the document.
type bodyAnswer struct {
	Method string `json:"method"`
	Route  string `json:"route"`
	Status int    `json:"status"`
	Body   string `json:"body"`
}

// ajvDir holds the pinned validator of the body check and its script.
const ajvDir = "testdata/ajv"

// checkBodies validates bodies against the document doc (JSON) with testdata/ajv/validate.mjs
// and returns one line per body the document's schema refuses. Without node it returns
// nothing, having said loudly that the check did not run.
func checkBodies(doc []byte, bodies []bodyAnswer) []string {
	if len(bodies) == 0 {
		return nil
	}
	node, err := exec.LookPath("node")
	if err != nil {
		fmt.Fprint(os.Stderr, "\n###########################################################################\n"+
			"## NO NODE: the check of response bodies against the OpenAPI document    ##\n"+
			"## (traffic_test.go) is SKIPPED. Install Node.js and npm to run it.       ##\n"+
			"###########################################################################\n")
		return nil
	}
	dir, err := filepath.Abs(ajvDir)
	if err != nil {
		return []string{"body check: " + err.Error()}
	}
	env := append(os.Environ(), "NO_UPDATE_NOTIFIER=1", "NPM_CONFIG_UPDATE_NOTIFIER=false", "NPM_CONFIG_FUND=false", "NPM_CONFIG_AUDIT=false")
	run := func(name string, args ...string) ([]byte, error) {
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Env = dir, env
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			err = fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, stderr.String())
		}
		return out, err
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "ajv")); err != nil {
		if _, err := run("npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"); err != nil {
			return []string{"body check: installing the pinned validator: " + err.Error()}
		}
	}
	tmp, err := os.MkdirTemp("", "traffic-bodies")
	if err != nil {
		return []string{"body check: " + err.Error()}
	}
	defer os.RemoveAll(tmp)
	answers, err := json.Marshal(bodies)
	if err != nil {
		return []string{"body check: " + err.Error()}
	}
	docPath, answersPath := filepath.Join(tmp, "openapi.json"), filepath.Join(tmp, "answers.json")
	if err := os.WriteFile(docPath, doc, 0o600); err != nil {
		return []string{"body check: " + err.Error()}
	}
	if err := os.WriteFile(answersPath, answers, 0o600); err != nil {
		return []string{"body check: " + err.Error()}
	}
	out, err := run(node, "validate.mjs", docPath, answersPath)
	if err != nil {
		return []string{"body check: " + err.Error()}
	}
	var refused []struct {
		bodyAnswer
		Errors []struct {
			InstancePath string `json:"instancePath"`
			SchemaPath   string `json:"schemaPath"`
			Message      string `json:"message"`
		} `json:"errors"`
	}
	if err := json.Unmarshal(out, &refused); err != nil {
		return []string{"body check: reading the validator's answer: " + err.Error()}
	}
	problems := make([]string, 0, len(refused))
	for _, r := range refused {
		var why []string
		for _, e := range r.Errors {
			why = append(why, fmt.Sprintf("%s %s (%s)", cmp.Or(e.InstancePath, "/"), e.Message, e.SchemaPath))
		}
		problems = append(problems, fmt.Sprintf("%s %s answered %d with a body its schema refuses: %s: %.300s",
			r.Method, r.Route, r.Status, strings.Join(why, "; "), r.Body))
	}
	return problems
}

// trafficSummary is the count of distinct answers checked, for the log.
func trafficSummary() int {
	traffic.mu.Lock()
	defer traffic.mu.Unlock()
	return len(traffic.seen)
}
