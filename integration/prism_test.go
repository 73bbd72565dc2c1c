package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The same traffic through Stoplight Prism (traffic_test.go records it): the exchanges the
// suite's servers had with the document's operations, requests and responses whole (up to the
// bounds below), are replayed at the end of the package run through `prism proxy`, the
// validating proxy an integrator would put in front of the service, to a replay server that
// answers each request with the response the service gave it. Prism validates both against
// the document and lists what it refuses in the sl-violations header; this check makes each
// violation fatal: any about a response, and any about a request the service accepted (an
// answer below 400; a request the service refused is one the document may refuse too), but for
// the two mistakes of Prism's own that prismMistake names. A request whose JSON body does not
// parse is not replayed: Prism hangs on it (the service's 400 is checked by traffic_test.go).
// Prism is pinned in testdata/prism and installed there with npm ci when missing; without node,
// or when npm cannot install it, the check is skipped, loudly.

// exchange is one recorded request and the answer the service gave it.
type exchange struct {
	method, route string
	url           string // path and query
	reqHeader     http.Header
	reqBody       []byte
	status        int
	header        http.Header
	body          []byte
}

// How many exchanges are kept: per kind of answer and set of query parameters, and in all
// (count and bytes of bodies).
const (
	exchangesPerKind = 1000
	maxExchanges     = 50000
	maxExchangeBytes = 256 << 20
)

var exchanges = struct {
	mu     sync.Mutex
	kinds  map[string]int
	sample []exchange
	size   int
	seen   int // every exchange offered, kept or not
}{kinds: map[string]int{}}

// cappedBody records what the handler reads of a request body, up to maxRecordedBody.
type cappedBody struct {
	io.ReadCloser
	buf bytes.Buffer
	cut bool
}

func (c *cappedBody) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	if c.buf.Len()+n <= maxRecordedBody {
		c.buf.Write(p[:n])
	} else {
		c.cut = true
	}
	return n, err
}

// keepExchange keeps the exchange of r and its answer a (written through w) for the Prism
// check, unless enough of its kind are kept or a body was too long to record whole.
// uri is the request's target as the client sent it (the handlers may change r.URL).
func keepExchange(a answer, r *http.Request, uri string, reqBody *cappedBody, w *trafficWriter) {
	if w.cut || (reqBody != nil && reqBody.cut) || r.Method == http.MethodHead {
		return
	}
	params := slices.Sorted(func(yield func(string) bool) {
		for k := range r.URL.Query() {
			if !yield(k) {
				return
			}
		}
	})
	kind := fmt.Sprintf("%v %s %s", a, r.Header.Get("Content-Type"), strings.Join(params, "&"))
	exchanges.mu.Lock()
	defer exchanges.mu.Unlock()
	exchanges.seen++
	size := w.body.Len()
	if reqBody != nil {
		size += reqBody.buf.Len()
	}
	if exchanges.kinds[kind] >= exchangesPerKind || len(exchanges.sample) >= maxExchanges || exchanges.size+size > maxExchangeBytes {
		return
	}
	exchanges.kinds[kind]++
	exchanges.size += size
	x := exchange{method: r.Method, route: a.route, url: asciiURI(uri), reqHeader: r.Header.Clone(), status: w.status,
		header: w.Header().Clone(), body: bytes.Clone(w.body.Bytes())}
	if reqBody != nil {
		x.reqBody = bytes.Clone(reqBody.buf.Bytes())
	}
	exchanges.sample = append(exchanges.sample, x)
}

// asciiURI percent-encodes the bytes of uri that a request line cannot carry as they are (a
// client sends an address with Unicode in a query encoded; Prism refuses it raw).
func asciiURI(uri string) string {
	var b strings.Builder
	for i := 0; i < len(uri); i++ {
		if c := uri[i]; c <= ' ' || c >= 0x7f {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// prismDir holds the pinned Prism.
const prismDir = "testdata/prism"

// replayHeader numbers the exchange a replayed request is, for the replay server.
const replayHeader = "X-Replay-Exchange"

// checkPrism replays the kept exchanges through `prism proxy` with the document doc (JSON)
// and returns one line per violation that counts (see above).
func checkPrism(doc []byte) []string {
	var paths struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(doc, &paths); err != nil {
		return []string{"prism: decoding the document: " + err.Error()}
	}
	exchanges.mu.Lock()
	seen := exchanges.seen
	var sample []exchange
	for _, x := range exchanges.sample {
		// The document's operations only (not the confirmation pages or the document
		// itself), and only requests Prism can read: it hangs on a JSON body that does not
		// parse, which the service refuses with 400 (traffic_test.go checks that answer).
		if _, ok := paths.Paths[x.route][strings.ToLower(x.method)]; !ok ||
			(strings.HasPrefix(x.reqHeader.Get("Content-Type"), "application/json") && len(x.reqBody) > 0 && !json.Valid(x.reqBody)) {
			continue
		}
		sample = append(sample, x)
	}
	exchanges.mu.Unlock()
	if len(sample) == 0 {
		return nil
	}
	skip := func(why string) []string {
		fmt.Fprintf(os.Stderr, "\n###########################################################################\n"+
			"## NO PRISM: %s\n"+
			"## The replay of the suite's traffic through Prism (prism_test.go) is     ##\n"+
			"## SKIPPED.                                                              ##\n"+
			"###########################################################################\n", why)
		return nil
	}
	if _, err := exec.LookPath("node"); err != nil {
		return skip("node is not installed.")
	}
	dir, err := filepath.Abs(prismDir)
	if err != nil {
		return []string{"prism: " + err.Error()}
	}
	env := append(os.Environ(), "NO_UPDATE_NOTIFIER=1", "NPM_CONFIG_UPDATE_NOTIFIER=false", "NPM_CONFIG_FUND=false", "NPM_CONFIG_AUDIT=false")
	prism := filepath.Join(dir, "node_modules", ".bin", "prism")
	if _, err := os.Stat(prism); err != nil {
		cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--prefer-offline")
		cmd.Dir, cmd.Env = dir, env
		if out, err := cmd.CombinedOutput(); err != nil {
			return skip(fmt.Sprintf("npm ci in %s failed (offline?): %v\n%s", prismDir, err, out))
		}
	}

	replay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i, err := strconv.Atoi(r.Header.Get(replayHeader))
		if err != nil || i < 0 || i >= len(sample) {
			http.Error(w, "no such exchange", http.StatusTeapot)
			return
		}
		x := sample[i]
		for k, v := range x.header {
			if k != "Content-Length" && k != "Transfer-Encoding" && k != "Connection" {
				w.Header()[k] = v
			}
		}
		w.WriteHeader(x.status)
		_, _ = w.Write(x.body)
	}))
	defer replay.Close()

	tmp, err := os.MkdirTemp("", "prism")
	if err != nil {
		return []string{"prism: " + err.Error()}
	}
	defer os.RemoveAll(tmp)
	docPath := filepath.Join(tmp, "openapi.json")
	if err := os.WriteFile(docPath, doc, 0o600); err != nil {
		return []string{"prism: " + err.Error()}
	}
	// Two proxies: one validates requests and responses, for the requests the service
	// accepted; one (--validate-request=false) responses only, for those it refused: their
	// request violations do not count, and Prism cuts a long list of violations short
	// ("Too many violations!"), the response's last.
	var proxies [2]*prismProxy
	for i, extra := range [][]string{nil, {"--validate-request=false"}} {
		p, err := startPrism(prism, dir, env, docPath, replay.URL, extra...)
		if err != nil {
			return []string{"prism: " + err.Error()}
		}
		defer p.stop()
		proxies[i] = p
	}

	client := &http.Client{Timeout: 30 * time.Second}
	start := time.Now()
	var (
		mu       sync.Mutex
		problems []string
		wg       sync.WaitGroup
		next     = make(chan int)
	)
	for range 4 {
		wg.Go(func() {
			for i := range next {
				proxy := proxies[0]
				if sample[i].status >= 400 {
					proxy = proxies[1]
				}
				if p := replayOne(client, "http://"+proxy.addr, i, sample[i]); p != "" {
					mu.Lock()
					problems = append(problems, p)
					mu.Unlock()
				}
			}
		})
	}
	for i := range sample {
		next <- i
	}
	close(next)
	wg.Wait()
	for _, p := range proxies {
		select {
		case <-p.exited:
			problems = append(problems, fmt.Sprintf("prism: the proxy exited during the replay; its log ends:\n%s", tail(p.log.String(), 4000)))
		default:
		}
	}
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "prism: %d exchanges (of %d recorded) replayed through prism proxy in %.1fs, %d refused\n",
			len(sample), seen, time.Since(start).Seconds(), len(problems))
	}
	return problems
}

// replayOne sends exchange x (number i) through the proxy at base and returns what Prism
// refused of it that counts, or "".
func replayOne(client *http.Client, base string, i int, x exchange) string {
	req, err := http.NewRequest(x.method, base+x.url, bytes.NewReader(x.reqBody))
	if err != nil {
		return fmt.Sprintf("prism: %s %s: %v", x.method, x.url, err)
	}
	for k, v := range x.reqHeader {
		switch k {
		case "Content-Length", "Connection", "Accept-Encoding", "Transfer-Encoding":
		default:
			req.Header[k] = v
		}
	}
	req.Header.Set(replayHeader, strconv.Itoa(i))
	res, err := client.Do(req)
	if err != nil {
		return fmt.Sprintf("prism: %s %s (%s, %.200q): %v", x.method, x.url, x.reqHeader.Get("Content-Type"), x.reqBody, err)
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, res.Body)
	if res.StatusCode != x.status {
		return fmt.Sprintf("prism: %s %s answered %d through the proxy, %d recorded", x.method, x.url, res.StatusCode, x.status)
	}
	var violations []struct {
		Location []any  `json:"location"`
		Severity string `json:"severity"`
		Message  string `json:"message"`
	}
	if v := res.Header.Get("sl-violations"); v != "" {
		if err := json.Unmarshal([]byte(v), &violations); err != nil {
			return fmt.Sprintf("prism: %s %s: reading sl-violations %q: %v", x.method, x.url, v, err)
		}
	}
	var why []string
	for _, v := range violations {
		if len(v.Location) > 0 && v.Location[0] == "request" && x.status >= 400 {
			continue // a request the service refused (the authorization, with validation off)
		}
		if !prismMistake(x, v.Message) {
			why = append(why, fmt.Sprintf("%s %s (%v)", v.Severity, v.Message, v.Location))
		}
	}
	if len(why) == 0 {
		return ""
	}
	return fmt.Sprintf("prism: %s %s → %d: %s; request body %.200s; response body %.300s", x.method, x.url, x.status,
		strings.Join(why, "; "), x.reqBody, x.body)
}

// prismProxy is a running `prism proxy`.
type prismProxy struct {
	addr   string
	cmd    *exec.Cmd
	log    bytes.Buffer
	exited chan struct{}
}

// startPrism starts `prism proxy doc upstream` with the extra flags and waits until it listens.
func startPrism(prism, dir string, env []string, doc, upstream string, extra ...string) (*prismProxy, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	p := &prismProxy{addr: "127.0.0.1:" + strconv.Itoa(port), exited: make(chan struct{})}
	p.cmd = exec.Command(prism, append([]string{"proxy", doc, upstream, "--host", "127.0.0.1", "--port", strconv.Itoa(port)}, extra...)...)
	// ascii-violations.cjs: without it, Prism crashes on a violation that quotes Unicode.
	p.cmd.Env = append(env, "NODE_OPTIONS=--require="+filepath.Join(dir, "ascii-violations.cjs"))
	p.cmd.Dir, p.cmd.Stdout, p.cmd.Stderr = dir, &p.log, &p.log
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		if c, err := net.Dial("tcp", p.addr); err == nil {
			c.Close()
			return p, nil
		}
		if time.Since(start) > 2*time.Minute {
			p.stop()
			return nil, fmt.Errorf("the proxy did not listen within 2 minutes:\n%s", p.log.String())
		}
	}
}

func (p *prismProxy) stop() { _ = p.cmd.Process.Kill(); <-p.exited }

func tail(s string, n int) string { return s[max(0, len(s)-n):] }

// prismMistake reports the violations Prism 5.16.0 finds where the service keeps to the
// document, or goes past what OpenAPI can say:
//   - "Invalid security scheme used" for "Authorization: bearer <key>": an authentication
//     scheme is case-insensitive (RFC 9110 §11.1), and the service takes it so;
//   - an int64 above 2^53 - 1, such as the page 9223372036854775807 the contract allows and
//     echoes (docs/api-contract.md §4.3): JavaScript's numbers stop there, int64 does not;
//   - "Selected route not found" for an address with a raw "/" in PUT /subscribers/by-email/…,
//     which the service takes as well as the documented %2F: an OpenAPI path parameter is one
//     segment, so the document can only show the encoded form (which Prism passes).
func prismMistake(x exchange, message string) bool {
	switch {
	case message == "Selected route not found":
		return x.route == "/api/v1/subscribers/by-email/{email}" && strings.Contains(strings.TrimPrefix(x.url, "/api/v1/subscribers/by-email/"), "/")
	case message == "Invalid security scheme used":
		scheme, _, _ := strings.Cut(x.reqHeader.Get("Authorization"), " ")
		return strings.EqualFold(scheme, "Bearer") && scheme != "Bearer"
	}
	return strings.HasSuffix(message, "must be <= 9007199254740991")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
