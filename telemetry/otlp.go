package telemetry

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protowire"
)

// OTLPExporter sends spans to an OTLP/HTTP collector as protobuf
// (opentelemetry-proto collector/trace/v1 ExportTraceServiceRequest). Use it with
// sdktrace.WithBatcher, like otlptracehttp's exporter, which it replaces: that one converts
// every span into a tree of generated protobuf structs (several allocations per attribute) and
// then marshals the tree, about 11 µs of CPU per request of ours. This one writes the wire
// format straight from the ReadOnlySpans into a buffer reused across exports, and allocates
// nothing per span in the steady state (slice-valued attributes and non-empty trace states
// excepted: reading them from the SDK copies).
//
// It sends what otlptracehttp v1.47.0 sends, field for field, plus the trace state of links,
// which the official transform leaves out although OTLP has the field.
type OTLPExporter struct {
	cfg     otlpConfig
	client  *http.Client
	stopped context.Context // cancelled by Shutdown
	stop    context.CancelFunc

	// backoff is the first retry delay; sleep waits between attempts. Tests shorten both.
	backoff time.Duration
	sleep   func(ctx context.Context, d time.Duration) error

	mu   sync.Mutex // one export at a time: the buffers below are reused
	enc  spanEncoder
	gz   *gzip.Writer
	zbuf bytes.Buffer
	resp []byte
}

var _ sdktrace.SpanExporter = (*OTLPExporter)(nil)

// errExporterShutdown is returned by ExportSpans after Shutdown.
var errExporterShutdown = errors.New("OTLP trace exporter is shut down")

const (
	otlpDefaultEndpoint = "http://localhost:4318/v1/traces"
	otlpDefaultTimeout  = 10 * time.Second
	otlpFirstBackoff    = time.Second
	otlpMaxBackoff      = 30 * time.Second
	otlpUserAgent       = "subscriberd OTLP trace exporter"
	// maxRetainedBuffer is the capacity above which an export's buffers are dropped rather
	// than kept for the next one: a burst must not pin its memory for good.
	maxRetainedBuffer = 8 << 20
	// maxResponseBody is how much of a response is read; the rest is discarded.
	maxResponseBody = 64 << 10
)

// NewOTLPExporter returns an exporter configured by the standard OTLP/HTTP trace variables,
// read through getenv: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (used as is) or
// OTEL_EXPORTER_OTLP_ENDPOINT (+ "/v1/traces"), and OTEL_EXPORTER_OTLP_[TRACES_]HEADERS,
// TIMEOUT, COMPRESSION, CERTIFICATE, CLIENT_CERTIFICATE, CLIENT_KEY and PROTOCOL (only
// http/protobuf), the signal-specific variable winning over the generic one. An invalid value
// is an error that names its variable (and never quotes a header value).
func NewOTLPExporter(getenv func(string) string) (*OTLPExporter, error) {
	cfg, err := otlpConfigFromEnv(getenv, os.ReadFile)
	if err != nil {
		return nil, err
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	if cfg.tls != nil {
		transport.TLSClientConfig = cfg.tls
	}
	stopped, stop := context.WithCancel(context.Background())
	return &OTLPExporter{
		cfg:     cfg,
		client:  &http.Client{Transport: transport}, // bounded per export by cfg.timeout
		stopped: stopped,
		stop:    stop,
		backoff: otlpFirstBackoff,
		sleep:   sleepContext,
	}, nil
}

// ExportSpans encodes spans into one request and posts it, retrying 429, 502, 503, 504 and
// transport errors with exponential backoff (Retry-After honoured) until the export timeout
// or ctx ends.
func (e *OTLPExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	return e.export(ctx, readOnlySpans(spans))
}

// export encodes the spans of src into one request and posts it, as ExportSpans says.
func (e *OTLPExporter) export(ctx context.Context, src spanSource) error {
	if e.stopped.Err() != nil {
		return errExporterShutdown
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped.Err() != nil {
		return errExporterShutdown
	}
	body := e.enc.encode(src)
	defer e.enc.release()
	if body == nil {
		return nil
	}
	if e.cfg.gzip {
		body = e.compress(body)
		defer e.releaseCompressed()
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.timeout)
	defer cancel()
	defer context.AfterFunc(e.stopped, cancel)()
	return e.send(ctx, body)
}

// Shutdown stops the exporter: an export in flight is cancelled and later ones fail at once.
// It flushes nothing (the batcher has flushed before calling it) and may be called again.
func (e *OTLPExporter) Shutdown(ctx context.Context) error {
	e.stop()
	e.client.CloseIdleConnections()
	return ctx.Err()
}

func (e *OTLPExporter) compress(body []byte) []byte {
	e.zbuf.Reset()
	if e.gz == nil {
		e.gz = gzip.NewWriter(&e.zbuf)
	} else {
		e.gz.Reset(&e.zbuf)
	}
	// Writing to a bytes.Buffer cannot fail.
	_, _ = e.gz.Write(body)
	_ = e.gz.Close()
	return e.zbuf.Bytes()
}

func (e *OTLPExporter) releaseCompressed() {
	if e.zbuf.Cap() > maxRetainedBuffer {
		e.zbuf = bytes.Buffer{}
	}
}

// send posts body until it is accepted, fails for good, or ctx ends.
func (e *OTLPExporter) send(ctx context.Context, body []byte) error {
	backoff := e.backoff
	for attempt := 1; ; attempt++ {
		retry, after, err := e.post(ctx, body)
		if err == nil || !retry {
			return err
		}
		if ctx.Err() != nil {
			return e.giveUp(ctx, attempt, err)
		}
		// ±50 % jitter around the current step: [backoff/2, backoff*3/2).
		wait := backoff
		if backoff > 0 {
			wait = backoff/2 + rand.N(backoff)
		}
		backoff = min(2*backoff, otlpMaxBackoff)
		wait = max(wait, after)
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
			return fmt.Errorf("%w (gave up after %d attempts: the next retry, in %v, would pass the export deadline)",
				err, attempt, wait.Round(time.Millisecond))
		}
		if e.sleep(ctx, wait) != nil {
			return e.giveUp(ctx, attempt, err)
		}
	}
}

func (e *OTLPExporter) giveUp(ctx context.Context, attempts int, err error) error {
	why := "export timeout or caller's deadline"
	if e.stopped.Err() != nil {
		why = "exporter shut down"
	} else if errors.Is(context.Cause(ctx), context.Canceled) {
		why = "export cancelled"
	}
	return fmt.Errorf("%w (gave up after %d attempts: %s)", err, attempts, why)
}

func sleepContext(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// post makes one attempt. retry says whether the failure is worth another; after is the
// server's Retry-After, if any.
func (e *OTLPExporter) post(ctx context.Context, body []byte) (retry bool, after time.Duration, err error) {
	src := &bodySource{b: body}
	// The transport may still hold the body after Do returns; body's memory is reused by the
	// next export, so cut every reader off from it first.
	defer src.detach()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.cfg.url, src.reader())
	if err != nil {
		return false, 0, fmt.Errorf("OTLP trace export: %w", err)
	}
	req.ContentLength = int64(len(body))
	req.GetBody = func() (io.ReadCloser, error) { return src.reader(), nil }
	req.Header = e.cfg.headers.Clone()
	req.Header.Set("Content-Type", "application/x-protobuf")
	if e.cfg.gzip {
		req.Header.Set("Content-Encoding", "gzip")
	}
	res, err := e.client.Do(req)
	if err != nil {
		// The *url.Error names the URL without its password; the error never holds headers.
		return ctx.Err() == nil, 0, fmt.Errorf("OTLP trace export: %w", err)
	}
	defer res.Body.Close()
	switch code := res.StatusCode; {
	case code >= 200 && code <= 299:
		e.resp = readLimited(e.resp[:0], res.Body)
		if ct := res.Header.Get("Content-Type"); strings.HasPrefix(ct, "application/x-protobuf") {
			if n, msg := partialSuccess(e.resp); n != 0 || msg != "" {
				otel.Handle(fmt.Errorf("OTLP trace export: partial success: %d spans rejected: %s", n, msg))
			}
		}
		if cap(e.resp) > maxResponseBody {
			e.resp = nil
		}
		return false, 0, nil
	case code == http.StatusTooManyRequests, code == http.StatusBadGateway,
		code == http.StatusServiceUnavailable, code == http.StatusGatewayTimeout:
		drain(res.Body)
		return true, retryAfter(res.Header.Get("Retry-After")), fmt.Errorf("OTLP trace export to %s: %s", e.cfg.display, res.Status)
	default:
		e.resp = readLimited(e.resp[:0], res.Body)
		return false, 0, fmt.Errorf("OTLP trace export to %s: %s%s", e.cfg.display, res.Status, e.bodyExcerpt(e.resp))
	}
}

// bodyExcerpt is the start of an error response, for the error message, with every configured
// header value blanked out: some gateways echo the request.
func (e *OTLPExporter) bodyExcerpt(b []byte) string {
	const maxExcerpt = 256
	if len(b) > maxExcerpt {
		b = b[:maxExcerpt]
	}
	s := strings.TrimSpace(strings.ToValidUTF8(string(b), "?"))
	if s == "" {
		return ""
	}
	for _, vs := range e.cfg.headers {
		for _, v := range vs {
			if v != "" {
				s = strings.ReplaceAll(s, v, "[redacted]")
			}
		}
	}
	return ": " + s
}

// readLimited appends up to maxResponseBody bytes of r to b and discards the rest (so that
// the connection can be reused).
func readLimited(b []byte, r io.Reader) []byte {
	for len(b) < maxResponseBody {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):min(cap(b), maxResponseBody)])
		b = b[:len(b)+n]
		if err != nil {
			return b
		}
	}
	drain(r)
	return b
}

func drain(r io.Reader) {
	_, _ = io.Copy(io.Discard, io.LimitReader(r, 4*maxResponseBody))
}

// retryAfter parses a Retry-After header: seconds or an HTTP date; 0 when absent or invalid.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s <= 0 {
			return 0
		}
		return time.Duration(min(s, int64(math.MaxInt64/time.Second))) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}

// partialSuccess reads ExportTraceServiceResponse.partial_success (rejected_spans,
// error_message) from a protobuf response body.
func partialSuccess(b []byte) (rejected int64, msg string) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, ""
		}
		b = b[n:]
		if num == 1 && typ == protowire.BytesType {
			ps, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return 0, ""
			}
			b = b[n:]
			for len(ps) > 0 {
				num, typ, n := protowire.ConsumeTag(ps)
				if n < 0 {
					return 0, ""
				}
				ps = ps[n:]
				switch {
				case num == 1 && typ == protowire.VarintType:
					v, n := protowire.ConsumeVarint(ps)
					if n < 0 {
						return 0, ""
					}
					rejected, ps = int64(v), ps[n:]
				case num == 2 && typ == protowire.BytesType:
					v, n := protowire.ConsumeBytes(ps)
					if n < 0 {
						return 0, ""
					}
					msg, ps = string(v), ps[n:]
				default:
					n := protowire.ConsumeFieldValue(num, typ, ps)
					if n < 0 {
						return 0, ""
					}
					ps = ps[n:]
				}
			}
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, ""
		}
		b = b[n:]
	}
	return rejected, msg
}

// bodySource is a request body over memory the exporter reuses: detach cuts every reader
// made from it off, so a transport still reading after Do has returned gets an error instead
// of the next export's bytes.
type bodySource struct {
	mu       sync.Mutex
	b        []byte
	detached bool
}

func (s *bodySource) reader() io.ReadCloser { return &bodyReader{src: s} }

func (s *bodySource) detach() {
	s.mu.Lock()
	s.b, s.detached = nil, true
	s.mu.Unlock()
}

type bodyReader struct {
	src *bodySource
	off int
}

func (r *bodyReader) Read(p []byte) (int, error) {
	r.src.mu.Lock()
	defer r.src.mu.Unlock()
	if r.src.detached {
		return 0, errors.New("OTLP request body read after the export ended")
	}
	if r.off >= len(r.src.b) {
		return 0, io.EOF
	}
	n := copy(p, r.src.b[r.off:])
	r.off += n
	return n, nil
}

func (r *bodyReader) Close() error { return nil }

// otlpConfig is the exporter's configuration, from the environment.
type otlpConfig struct {
	url     string // where to POST
	display string // url without its password, for messages
	headers http.Header
	timeout time.Duration
	gzip    bool
	tls     *tls.Config // nil: the system's defaults
}

const (
	otlpPrefix       = "OTEL_EXPORTER_OTLP_"
	otlpTracesPrefix = "OTEL_EXPORTER_OTLP_TRACES_"
)

// otlpConfigFromEnv reads the OTLP/HTTP trace exporter variables as the OpenTelemetry
// specification defines them; readFile reads the PEM files.
func otlpConfigFromEnv(getenv func(string) string, readFile func(string) ([]byte, error)) (otlpConfig, error) {
	// lookup returns the signal-specific variable if set, else the generic one, and its name.
	lookup := func(suffix string) (string, string) {
		if v := strings.TrimSpace(getenv(otlpTracesPrefix + suffix)); v != "" {
			return v, otlpTracesPrefix + suffix
		}
		return strings.TrimSpace(getenv(otlpPrefix + suffix)), otlpPrefix + suffix
	}
	cfg := otlpConfig{timeout: otlpDefaultTimeout, headers: http.Header{}}

	if v, name := lookup("PROTOCOL"); v != "" && !strings.EqualFold(v, "http/protobuf") {
		return cfg, fmt.Errorf("%s: %q is not supported: subscriberd exports traces over http/protobuf only", name, v)
	}

	var u *url.URL
	if v := strings.TrimSpace(getenv(otlpTracesPrefix + "ENDPOINT")); v != "" {
		var err error
		if u, err = parseEndpoint(otlpTracesPrefix+"ENDPOINT", v); err != nil {
			return cfg, err
		}
	} else if v := strings.TrimSpace(getenv(otlpPrefix + "ENDPOINT")); v != "" {
		base, err := parseEndpoint(otlpPrefix+"ENDPOINT", v)
		if err != nil {
			return cfg, err
		}
		u = base.JoinPath("v1", "traces") // keeps one slash whether base ends with one or not
	} else {
		u, _ = url.Parse(otlpDefaultEndpoint)
	}
	cfg.url, cfg.display = u.String(), u.Redacted()

	if v, name := lookup("HEADERS"); v != "" {
		h, err := parseOTLPHeaders(name, v)
		if err != nil {
			return cfg, err
		}
		cfg.headers = h
	}
	if cfg.headers.Get("User-Agent") == "" {
		cfg.headers.Set("User-Agent", otlpUserAgent)
	}

	if v, name := lookup("TIMEOUT"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms <= 0 || ms > math.MaxInt64/int64(time.Millisecond) {
			return cfg, fmt.Errorf("%s: %q is not a positive whole number of milliseconds", name, v)
		}
		cfg.timeout = time.Duration(ms) * time.Millisecond
	}

	if v, name := lookup("COMPRESSION"); v != "" {
		switch strings.ToLower(v) {
		case "gzip":
			cfg.gzip = true
		case "none":
		default:
			return cfg, fmt.Errorf("%s: %q is not one of gzip, none", name, v)
		}
	}

	tlsCfg, err := otlpTLSFromEnv(lookup, readFile)
	if err != nil {
		return cfg, err
	}
	if tlsCfg != nil {
		if u.Scheme != "https" {
			return cfg, fmt.Errorf("OTEL_EXPORTER_OTLP_[TRACES_]CERTIFICATE, CLIENT_CERTIFICATE or CLIENT_KEY is set, but the endpoint %s is not https", cfg.display)
		}
		cfg.tls = tlsCfg
	}
	return cfg, nil
}

// parseEndpoint checks that v, the value of variable name, is an absolute http(s) URL.
func parseEndpoint(name, v string) (*url.URL, error) {
	u, err := url.Parse(v)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL, which may hold a password
		}
		return nil, fmt.Errorf("%s: not a valid URL: %w", name, err)
	}
	u.Scheme = strings.ToLower(u.Scheme)
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%s: %q is not an http:// or https:// URL with a host", name, u.Redacted())
	}
	return u, nil
}

// parseOTLPHeaders parses "key1=value1,key2=value2" with URL-encoded values (the W3C Baggage
// format the specification refers to). Errors name the entry by position, never by content:
// it holds credentials.
func parseOTLPHeaders(name, v string) (http.Header, error) {
	h := http.Header{}
	for i, entry := range strings.Split(v, ",") {
		if strings.TrimSpace(entry) == "" {
			continue
		}
		k, val, ok := strings.Cut(entry, "=")
		if !ok {
			return nil, fmt.Errorf("%s: entry %d has no '=' (want key=value pairs separated by commas)", name, i+1)
		}
		k = strings.TrimSpace(k)
		if !validHeaderKey(k) {
			return nil, fmt.Errorf("%s: the key of entry %d is not a valid HTTP header name", name, i+1)
		}
		dec, err := url.PathUnescape(val)
		if err != nil {
			return nil, fmt.Errorf("%s: the value of entry %d is not URL-encoded properly (a %% must start an escape such as %%20)", name, i+1)
		}
		dec = strings.TrimSpace(dec)
		if strings.ContainsAny(dec, "\r\n\x00") {
			return nil, fmt.Errorf("%s: the value of entry %d holds a line break or NUL", name, i+1)
		}
		h.Set(k, dec)
	}
	return h, nil
}

func validHeaderKey(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// otlpTLSFromEnv builds the TLS configuration from the CERTIFICATE (trusted roots),
// CLIENT_CERTIFICATE and CLIENT_KEY variables; nil when none is set.
func otlpTLSFromEnv(lookup func(string) (string, string), readFile func(string) ([]byte, error)) (*tls.Config, error) {
	ca, caName := lookup("CERTIFICATE")
	cert, certName := lookup("CLIENT_CERTIFICATE")
	key, keyName := lookup("CLIENT_KEY")
	if ca == "" && cert == "" && key == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := readFile(ca)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", caName, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: %s holds no PEM certificate", caName, ca)
		}
		cfg.RootCAs = pool
	}
	if (cert == "") != (key == "") {
		return nil, fmt.Errorf("%s and %s must be set together", certName, keyName)
	}
	if cert != "" {
		certPEM, err := readFile(cert)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", certName, err)
		}
		keyPEM, err := readFile(key)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", keyName, err)
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("%s, %s: %w", certName, keyName, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// spanEncoder writes ExportTraceServiceRequests. Its slices are reused from one export to the
// next.
type spanEncoder struct {
	buf    []byte
	groups []spanGroup
	next   []int32 // next[i]: the span after span i in its group, or -1
}

// spanGroup is the spans of one resource and one instrumentation scope, in export order, as
// a list threaded through spanEncoder.next.
type spanGroup struct {
	resKey      attribute.Distinct
	res         *resource.Resource
	scope       instrumentation.Scope
	first, last int32
	done        bool
}

// Reserved length bytes for nested messages, by the size they usually have, so that closing
// one seldom has to move its contents (it stays correct when the guess is wrong).
const (
	reserveSmall = 1 // < 128 bytes: attributes, status, scope
	reserveSpan  = 2 // < 16 KiB: a span, a resource
	reserveBatch = 3 // < 2 MiB: the spans of a scope, of a resource
)

// spanSource is the spans of one export: n spans, each with its resource and scope, each
// appended as a ScopeSpans.spans field by appendSpan.
type spanSource interface {
	len() int
	// key is span i's resource and scope; ok is false for a span to leave out.
	key(i int) (res *resource.Resource, scope instrumentation.Scope, ok bool)
	appendSpan(b []byte, i int) []byte
}

// readOnlySpans is the SDK's ended spans, encoded at export.
type readOnlySpans []sdktrace.ReadOnlySpan

func (s readOnlySpans) len() int { return len(s) }

func (s readOnlySpans) key(i int) (*resource.Resource, instrumentation.Scope, bool) {
	if s[i] == nil {
		return nil, instrumentation.Scope{}, false
	}
	sd := readSpan(s[i]) // in place, as appendSpan reads it
	return sd.resource, sd.instrumentationScope, true
}

func (s readOnlySpans) appendSpan(b []byte, i int) []byte {
	return appendSpan(b, s[i])
}

// encode returns the ExportTraceServiceRequest for the spans of src, or nil when there is no
// span. The result is valid until the next call.
func (e *spanEncoder) encode(src spanSource) []byte {
	e.group(src)
	if len(e.groups) == 0 {
		return nil
	}
	b := e.buf[:0]
	// Like the official transform: one ResourceSpans per distinct resource, holding one
	// ScopeSpans per scope, in the order each first appears.
	for gi := range e.groups {
		g := &e.groups[gi]
		if g.done {
			continue
		}
		var rs int
		b, rs = openMsg(b, 1, reserveBatch) // ExportTraceServiceRequest.resource_spans
		if g.res != nil {
			var r int
			b, r = openMsg(b, 1, reserveSpan) // ResourceSpans.resource
			for it := g.res.Iter(); it.Next(); {
				b = appendKeyValue(b, 1, it.Attribute()) // Resource.attributes
			}
			b = closeMsg(b, r, reserveSpan)
		}
		for hi := gi; hi < len(e.groups); hi++ {
			h := &e.groups[hi]
			if h.done || h.resKey != g.resKey {
				continue
			}
			h.done = true
			var ss int
			b, ss = openMsg(b, 2, reserveBatch) // ResourceSpans.scope_spans
			b = appendScope(b, h.scope)
			for i := h.first; i >= 0; i = e.next[i] {
				b = src.appendSpan(b, int(i))
			}
			b = appendString(b, 3, h.scope.SchemaURL) // ScopeSpans.schema_url
			b = closeMsg(b, ss, reserveBatch)
		}
		b = appendString(b, 3, g.res.SchemaURL()) // ResourceSpans.schema_url
		b = closeMsg(b, rs, reserveBatch)
	}
	e.buf = b
	return b
}

// release drops the buffers after an export that made them unusually large.
func (e *spanEncoder) release() {
	if cap(e.buf) > maxRetainedBuffer {
		e.buf = nil
	}
	if cap(e.next) > 1<<16 {
		e.next = nil
	}
	clear(e.groups) // let go of the resources and scope attribute sets
	e.groups = e.groups[:0]
}

// group sorts the spans of src into e.groups by (resource, scope), keyed like the official
// transform: resource by its attribute set's identity, scope by value.
func (e *spanEncoder) group(src spanSource) {
	e.groups = e.groups[:0]
	e.next = e.next[:0]
	last := -1
	for i := range src.len() {
		e.next = append(e.next, -1)
		res, scope, ok := src.key(i)
		if !ok {
			continue
		}
		key := res.Equivalent()
		g := -1
		if last >= 0 && e.groups[last].resKey == key && e.groups[last].scope == scope {
			g = last
		} else {
			for j := range e.groups {
				if e.groups[j].resKey == key && e.groups[j].scope == scope {
					g = j
					break
				}
			}
		}
		if g < 0 {
			e.groups = append(e.groups, spanGroup{resKey: key, res: res, scope: scope, first: int32(i), last: int32(i)})
			g = len(e.groups) - 1
		} else {
			e.next[e.groups[g].last] = int32(i)
			e.groups[g].last = int32(i)
		}
		last = g
	}
}

// appendScope appends ScopeSpans.scope, absent for the zero scope (as in the official
// transform).
func appendScope(b []byte, s instrumentation.Scope) []byte {
	if s == (instrumentation.Scope{}) {
		return b
	}
	b, m := openMsg(b, 1, reserveSmall)
	b = appendString(b, 1, s.Name)
	b = appendString(b, 2, s.Version)
	for it := s.Attributes.Iter(); it.Next(); {
		b = appendKeyValue(b, 3, it.Attribute())
	}
	return closeMsg(b, m, reserveSmall)
}

// OTLP SpanFlags bits above the 8 bits of W3C trace flags.
const (
	spanFlagsHasIsRemote = 0x100 // SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
	spanFlagsIsRemote    = 0x200 // SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
)

// spanFlags is what the official transform sends: the trace flags, "we know whether the
// parent is remote", and whether it is.
func spanFlags(tf trace.TraceFlags, parent trace.SpanContext) uint32 {
	f := uint32(tf) | spanFlagsHasIsRemote
	if parent.IsRemote() {
		f |= spanFlagsIsRemote
	}
	return f
}

// appendSpan appends ScopeSpans.spans (field 2) for s.
func appendSpan(b []byte, s sdktrace.ReadOnlySpan) []byte {
	return appendSpanData(b, readSpan(s))
}

// appendSpanData is appendSpan of the span's data.
func appendSpanData(b []byte, sd *spanData) []byte {
	sc := sd.spanContext
	b, m := openMsg(b, 2, reserveSpan)
	tid, sid := sc.TraceID(), sc.SpanID()
	b = appendBytes(b, 1, tid[:])
	b = appendBytes(b, 2, sid[:])
	b = appendTraceState(b, 3, sc.TraceState())
	parent := sd.parent
	if psid := parent.SpanID(); psid.IsValid() {
		b = appendBytes(b, 4, psid[:])
	}
	b = appendString(b, 5, sd.name)
	b = appendVarint(b, 6, uint64(otlpSpanKind(sd.spanKind)))
	b = appendFixed64(b, 7, unixNano(sd.startTime))
	b = appendFixed64(b, 8, unixNano(sd.endTime))
	for _, kv := range sd.attributes {
		b = appendKeyValue(b, 9, kv)
	}
	b = appendVarint(b, 10, uint64(clampUint32(sd.droppedAttributeCount)))
	for i, events := 0, sd.events; i < len(events); i++ {
		ev := &events[i]
		var em int
		b, em = openMsg(b, 11, reserveSmall)
		b = appendFixed64(b, 1, unixNano(ev.Time))
		b = appendString(b, 2, ev.Name)
		for _, kv := range ev.Attributes {
			b = appendKeyValue(b, 3, kv)
		}
		b = appendVarint(b, 4, uint64(clampUint32(ev.DroppedAttributeCount)))
		b = closeMsg(b, em, reserveSmall)
	}
	b = appendVarint(b, 12, uint64(clampUint32(sd.droppedEventCount)))
	for i, links := 0, sd.links; i < len(links); i++ {
		l := &links[i]
		var lm int
		b, lm = openMsg(b, 13, reserveSmall)
		ltid, lsid := l.SpanContext.TraceID(), l.SpanContext.SpanID()
		b = appendBytes(b, 1, ltid[:])
		b = appendBytes(b, 2, lsid[:])
		b = appendTraceState(b, 3, l.SpanContext.TraceState()) // not sent by the official exporter
		for _, kv := range l.Attributes {
			b = appendKeyValue(b, 4, kv)
		}
		b = appendVarint(b, 5, uint64(clampUint32(l.DroppedAttributeCount)))
		b = appendFixed32(b, 6, spanFlags(l.SpanContext.TraceFlags(), l.SpanContext))
		b = closeMsg(b, lm, reserveSmall)
	}
	b = appendVarint(b, 14, uint64(clampUint32(sd.droppedLinkCount)))
	st := sd.status
	var sm int
	b, sm = openMsg(b, 15, reserveSmall) // always present, as in the official transform
	b = appendString(b, 2, st.Description)
	b = appendVarint(b, 3, uint64(otlpStatusCode(st.Code)))
	b = closeMsg(b, sm, reserveSmall)
	b = appendSpanFlags(b, spanFlags(sc.TraceFlags(), parent))
	return closeMsg(b, m, reserveSpan)
}

func appendTraceState(b []byte, num protowire.Number, ts trace.TraceState) []byte {
	if ts.Len() == 0 {
		return b
	}
	return appendString(b, num, ts.String())
}

// otlpStatusCode maps a span status code as the official transform does.
func otlpStatusCode(c codes.Code) int32 {
	switch c {
	case codes.Ok:
		return 1 // STATUS_CODE_OK
	case codes.Error:
		return 2 // STATUS_CODE_ERROR
	default:
		return 0 // STATUS_CODE_UNSET
	}
}

// otlpSpanKind maps a span kind as the official transform does.
func otlpSpanKind(k trace.SpanKind) int32 {
	switch k {
	case trace.SpanKindInternal:
		return 1
	case trace.SpanKindServer:
		return 2
	case trace.SpanKindClient:
		return 3
	case trace.SpanKindProducer:
		return 4
	case trace.SpanKindConsumer:
		return 5
	default:
		return 0 // SPAN_KIND_UNSPECIFIED
	}
}

func unixNano(t time.Time) uint64 { return uint64(max(0, t.UnixNano())) }

func clampUint32(v int) uint32 {
	if v < 0 {
		return 0
	}
	if int64(v) > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(v)
}

// appendKeyValue appends a KeyValue message as field num.
//
// A string, integer or boolean value (all of our spans' attributes) has its lengths worked
// out first and written in order; only other values go through openMsg and closeMsg, whose
// reserve-and-shift cost about half of the encoder's instructions per attribute.
func appendKeyValue(b []byte, num protowire.Number, kv attribute.KeyValue) []byte {
	var value int // the length of the AnyValue's contents
	switch kv.Value.Type() {
	case attribute.STRING:
		if k, v := string(kv.Key), kv.Value.AsString(); k != "" && 6+len(k)+len(v) < 0x80 {
			// Most attributes: a key and a short text, so that every length is one byte.
			// KeyValue{key = k (field 1), value (field 2) = AnyValue{string_value = v (1)}}.
			b = append(b, byte(num&15)<<3|byte(protowire.BytesType), byte(6+len(k)+len(v)), 1<<3|2, byte(len(k)))
			b = append(b, k...)
			b = append(b, 2<<3|2, byte(2+len(v)), 1<<3|2, byte(len(v)))
			return append(b, v...)
		}
		value = 1 + protowire.SizeBytes(len(kv.Value.AsString()))
	case attribute.INT64:
		value = 1 + protowire.SizeVarint(uint64(kv.Value.AsInt64()))
	case attribute.BOOL:
		value = 2
	default:
		return appendKeyValueNested(b, num, kv)
	}
	n := 1 + protowire.SizeBytes(value) // the value field, always present
	if kv.Key != "" {
		n += 1 + protowire.SizeBytes(len(kv.Key))
	}
	b = appendTag(b, num, protowire.BytesType)
	b = appendUvarint(b, uint64(n))
	b = appendString(b, 1, string(kv.Key))
	b = appendTag(b, 2, protowire.BytesType)
	b = appendUvarint(b, uint64(value))
	return appendAnyValue(b, kv.Value)
}

// appendKeyValueNested is appendKeyValue for the values whose size is not worked out first.
func appendKeyValueNested(b []byte, num protowire.Number, kv attribute.KeyValue) []byte {
	b, m := openMsg(b, num, reserveSmall)
	b = appendString(b, 1, string(kv.Key))
	var v int
	b, v = openMsg(b, 2, reserveSmall) // always present, even for an EMPTY value
	b = appendAnyValue(b, kv.Value)
	b = closeMsg(b, v, reserveSmall)
	return closeMsg(b, m, reserveSmall)
}

// appendAnyValue appends the contents of an AnyValue for v. The oneof fields are written
// even when they hold a zero value: presence is what tells the type.
func appendAnyValue(b []byte, v attribute.Value) []byte {
	switch v.Type() {
	case attribute.STRING:
		b = appendTag(b, 1, protowire.BytesType)
		return appendLen(b, v.AsString())
	case attribute.BOOL:
		b = appendTag(b, 2, protowire.VarintType)
		return appendUvarint(b, protowire.EncodeBool(v.AsBool()))
	case attribute.INT64:
		b = appendTag(b, 3, protowire.VarintType)
		return appendUvarint(b, uint64(v.AsInt64()))
	case attribute.FLOAT64:
		b = appendTag(b, 4, protowire.Fixed64Type)
		return protowire.AppendFixed64(b, math.Float64bits(v.AsFloat64()))
	case attribute.BYTESLICE:
		b = appendTag(b, 7, protowire.BytesType)
		return appendLen(b, v.AsByteSlice())
	case attribute.BOOLSLICE:
		return appendArray(b, v.AsBoolSlice(), attribute.BoolValue)
	case attribute.INT64SLICE:
		return appendArray(b, v.AsInt64Slice(), attribute.Int64Value)
	case attribute.FLOAT64SLICE:
		return appendArray(b, v.AsFloat64Slice(), attribute.Float64Value)
	case attribute.STRINGSLICE:
		return appendArray(b, v.AsStringSlice(), attribute.StringValue)
	case attribute.SLICE:
		return appendArray(b, v.AsSlice(), func(x attribute.Value) attribute.Value { return x })
	case attribute.MAP:
		b, kl := openMsg(b, 6, reserveSmall)
		for _, kv := range v.AsMap() {
			b = appendKeyValue(b, 1, kv) // KeyValueList.values
		}
		return closeMsg(b, kl, reserveSmall)
	case attribute.EMPTY:
		return b
	default:
		b = appendTag(b, 1, protowire.BytesType)
		return appendLen(b, "INVALID")
	}
}

// appendArray appends an ArrayValue (AnyValue field 5) of the elements xs, each made a Value
// by value.
func appendArray[T any](b []byte, xs []T, value func(T) attribute.Value) []byte {
	b, a := openMsg(b, 5, reserveSmall)
	for _, x := range xs {
		b = appendArrayElem(b, value(x))
	}
	return closeMsg(b, a, reserveSmall)
}

// appendArrayElem appends ArrayValue.values (field 1) for v.
func appendArrayElem(b []byte, v attribute.Value) []byte {
	b, m := openMsg(b, 1, reserveSmall)
	b = appendAnyValue(b, v)
	return closeMsg(b, m, reserveSmall)
}

// Scalar fields, omitted when zero as proto3 does.

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = appendTag(b, num, protowire.BytesType)
	return appendLen(b, s)
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = appendTag(b, num, protowire.BytesType)
	return appendLen(b, v)
}

// appendUvarint is protowire.AppendVarint with the one-byte case inlined. Almost every tag
// and length of a span is below 128, and the calls into the general function were about a
// third of the encoder's instructions (callgrind, BenchmarkEncode).
func appendUvarint(b []byte, v uint64) []byte {
	if v < 0x80 {
		return append(b, byte(v))
	}
	return protowire.AppendVarint(b, v)
}

// appendTag is protowire.AppendTag for field numbers below 16, whose tags are one byte: every
// field the encoder writes but Span.flags (appendSpanFlags). Without a test of the size it is
// small enough to be inlined, and tags were a tenth of the encoder's instructions.
func appendTag(b []byte, num protowire.Number, typ protowire.Type) []byte {
	return append(b, byte(num&15)<<3|byte(typ&7))
}

// appendSpanFlags appends Span.flags (field 16, a two-byte tag), omitted when zero.
func appendSpanFlags(b []byte, flags uint32) []byte {
	if flags == 0 {
		return b
	}
	b = protowire.AppendTag(b, 16, protowire.Fixed32Type)
	return protowire.AppendFixed32(b, flags)
}

// appendLen is protowire.AppendString or AppendBytes through appendUvarint: v's length,
// then v.
func appendLen[T ~string | ~[]byte](b []byte, v T) []byte {
	return append(appendUvarint(b, uint64(len(v))), v...)
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = appendTag(b, num, protowire.VarintType)
	return appendUvarint(b, v)
}

func appendFixed64(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = appendTag(b, num, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, v)
}

func appendFixed32(b []byte, num protowire.Number, v uint32) []byte {
	if v == 0 {
		return b
	}
	b = appendTag(b, num, protowire.Fixed32Type)
	return protowire.AppendFixed32(b, v)
}

// openMsg appends the tag of the length-delimited field num and reserve bytes for its length,
// and returns where the length goes; closeMsg writes it once the contents are appended.
func openMsg(b []byte, num protowire.Number, reserve int) ([]byte, int) {
	b = appendTag(b, num, protowire.BytesType)
	at := len(b)
	var zeros [reserveBatch]byte
	return append(b, zeros[:reserve]...), at
}

// closeMsg writes the length of the message opened at `at` with reserve bytes for it, moving
// the contents when the length needs a different number of bytes.
func closeMsg(b []byte, at, reserve int) []byte {
	n := len(b) - at - reserve
	size := protowire.SizeVarint(uint64(n))
	switch {
	case size < reserve:
		copy(b[at+size:], b[at+reserve:])
		b = b[:len(b)-(reserve-size)]
	case size > reserve:
		var zeros [10]byte
		b = append(b, zeros[:size-reserve]...)
		copy(b[at+size:], b[at+reserve:at+reserve+n])
	}
	appendUvarint(b[at:at], uint64(n)) // in place: the room is there
	return b
}
