// Package limits decides whether a request may proceed: per-key rate limits over several
// windows (with extra windows for bulk requests), a per-client-IP lockout after repeated
// authentication failures and a per-key lockout after repeated failed writes (docs/api-contract.md §5).
//
// The counters live in a Backend: Memory in the process, or Redis shared by every instance,
// usually behind a Failover that decides in process while Redis is unreachable. The Limiter
// turns a backend's answer into a Decision that carries what HTTP needs (Retry-After and
// RateLimit-* values) and records each decision as a metric and a span, never with the key
// or the client address. The package imports no other project package but internal/outage,
// which logs a Redis outage as every outage is logged.
package limits

import (
	"context"
	"log/slog"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Scopes and outcomes of decisions, the label values of rate_limit_decisions_total.
const (
	ScopeKey           = "key"            // a request's rate windows
	ScopeBulk          = "bulk"           // a bulk request's rate windows (general and bulk)
	ScopeClientLockout = "client_lockout" // the client IP's authentication lockout
	ScopeKeyLockout    = "key_lockout"    // the key's write lockout
	ScopeConfirm       = "confirm"        // the client IP's windows on the confirmation pages

	OutcomeAllowed = "allowed"
	OutcomeLimited = "limited" // a rate window is empty
	OutcomeLocked  = "locked"  // a lockout holds
)

// Subjects of lockouts, the label values of lockouts_total.
const (
	LockoutClient = "client" // a client IP, after repeated authentication failures
	LockoutKey    = "key"    // an API key, after repeated failed writes
)

// Recorder receives what the limiter does, for metrics. Implementations must be safe for
// concurrent use; labels are the constants above, never a key or an address.
type Recorder interface {
	// Decision counts one decision of scope with outcome.
	Decision(scope, outcome string)
	// Lockout counts one lockout imposed on a LockoutClient or a LockoutKey.
	Lockout(subject string)
	// BackendUp reports whether the shared (Redis) backend is in use.
	BackendUp(up bool)
}

type nopRecorder struct{}

func (nopRecorder) Decision(string, string) {}
func (nopRecorder) Lockout(string)          {}
func (nopRecorder) BackendUp(bool)          {}

// Decision is the answer for one request.
type Decision struct {
	// Allowed is false when the request must get 429.
	Allowed bool
	// RetryAfter is, when not Allowed, the whole seconds (≥ 1, rounded up) until a retry can
	// succeed.
	RetryAfter int
	// Limit, Remaining and Reset describe the window closest to running out, for the
	// RateLimit-* headers; Limit is 0 when no rate window applies (no headers).
	Limit, Remaining, Reset int
	// Locked is true when the refusal is a lockout (the client's or the key's) rather than
	// an empty rate window; the 429's message says which (docs/api-contract.md §5).
	Locked bool
}

// SetHeaders writes the RateLimit-* headers when a window applies, and Retry-After when the
// request is not allowed.
func (d Decision) SetHeaders(h http.Header) {
	if d.Limit > 0 {
		h.Set("RateLimit-Limit", strconv.Itoa(d.Limit))
		h.Set("RateLimit-Remaining", strconv.Itoa(d.Remaining))
		h.Set("RateLimit-Reset", strconv.Itoa(d.Reset))
	}
	if !d.Allowed {
		h.Set("Retry-After", strconv.Itoa(d.RetryAfter))
	}
}

// Limiter applies a Config with a Backend. It is safe for concurrent use.
type Limiter struct {
	cfg    Config
	b      Backend
	rec    Recorder
	log    *slog.Logger
	tracer trace.Tracer
}

// Option configures a Limiter.
type Option func(*Limiter)

// WithRecorder sends decisions to rec.
func WithRecorder(rec Recorder) Option { return func(l *Limiter) { l.rec = rec } }

// WithLogger logs backend errors to log.
func WithLogger(log *slog.Logger) Option { return func(l *Limiter) { l.log = log } }

// WithTracerProvider creates decision spans with tp instead of the global provider.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(l *Limiter) { l.tracer = tp.Tracer(tracerName) }
}

const tracerName = "github.com/subscriberd/subscriberd/limits"

// New returns a Limiter applying cfg with the counters in b.
func New(cfg Config, b Backend, opts ...Option) *Limiter {
	l := &Limiter{cfg: cfg, b: b, rec: nopRecorder{}, log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(l)
	}
	if l.tracer == nil {
		l.tracer = otel.GetTracerProvider().Tracer(tracerName)
	}
	return l
}

// Config returns the policy the limiter applies.
func (l *Limiter) Config() Config { return l.cfg }

// clientSubject is whom a client address's lockout and confirmation-page limits count: the
// address, or for IPv6 its /64 network, which one host or one customer's line holds whole (a
// client changing its address within it counts as one).
func clientSubject(ip netip.Addr) string {
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// Backend keys. The subject sits in a Redis Cluster hash tag, so every key one script touches
// lives in one slot. Client subjects and key ids are stored as given: they never leave the
// backend (no log, label or span carries them).
func clientLockKey(ip netip.Addr) string { return "{" + clientSubject(ip) + "}:client_lock" }
func clientLogKey(ip netip.Addr) string  { return "{" + clientSubject(ip) + "}:auth_failures" }
func keyLockKey(id string) string        { return "{" + id + "}:key_lock" }
func keyLogKey(id string) string         { return "{" + id + "}:write_errors" }

// confirmLockKey is never set: no lockout applies to the confirmation pages.
func confirmLockKey(ip netip.Addr) string { return "{" + clientSubject(ip) + "}:confirm_lock" }
func bucketKey(id, kind string, w Window) string {
	return "{" + id + "}:" + kind + ":" + strconv.Itoa(w.Limit) + "/" + formatMicros(w.Period)
}

// CheckClient answers step 1 of docs/api-contract.md §5: is the client at ip locked out?
func (l *Limiter) CheckClient(ctx context.Context, ip netip.Addr) Decision {
	if !l.cfg.AuthLockout.Enabled() {
		return Decision{Allowed: true}
	}
	parent := trace.SpanFromContext(ctx)
	ctx, span := l.tracer.Start(ctx, "limits.client_lockout")
	defer span.End()
	left, err := l.b.LockedFor(ctx, clientLockKey(ip))
	if err != nil {
		l.backendError(ctx, span, err)
		return Decision{Allowed: true}
	}
	d := Decision{Allowed: left <= 0}
	outcome := OutcomeAllowed
	if !d.Allowed {
		d.RetryAfter, d.Locked = seconds(left), true
		outcome = OutcomeLocked
	}
	l.record(parent, span, ScopeClientLockout, outcome, d, "")
	return d
}

// AuthFailed records an authentication failure from ip, before its 401 is answered; the
// failure that fills the AuthLockout rule starts the lock and still gets its 401. When the
// client is locked already (a failure that ran at the same time as the one that started the
// lock, past CheckClient before the lock existed), it records nothing and the Decision is the
// lockout's: the request gets the 429 CheckClient would now give it.
func (l *Limiter) AuthFailed(ctx context.Context, ip netip.Addr) Decision {
	return l.fail(ctx, "limits.auth_failure", ScopeClientLockout, LockoutClient, clientLogKey(ip), clientLockKey(ip), l.cfg.AuthLockout, true)
}

// WriteFailed records a failed write (a 4xx other than 401, 403 and 429 to POST, PUT or
// DELETE) of the key keyID, after it was answered; the failure that fills the WriteLockout
// rule starts the lock. A failure while the lock holds is not recorded.
func (l *Limiter) WriteFailed(ctx context.Context, keyID string) {
	l.fail(ctx, "limits.write_failure", ScopeKeyLockout, LockoutKey, keyLogKey(keyID), keyLockKey(keyID), l.cfg.WriteLockout, false)
}

// CountsAsWriteFailure reports whether a response with status to a request with method
// counts toward the write lockout. A request whose client went away before its answer ends
// with 499 (statusClientClosed): no response reached the client, and a client that gives up
// waiting on a busy service has sent nothing wrong.
func CountsAsWriteFailure(method string, status int) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodDelete:
	default:
		return false
	}
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusTooManyRequests, statusClientClosed:
		return false
	}
	return status >= 400 && status < 500
}

// statusClientClosed is api.StatusClientClosed (nginx's 499), the end of a request whose client
// went away.
const statusClientClosed = 499

// fail records a failure under rule. The Decision refuses only when the lock already held,
// and then nothing was recorded. With answers, the failure is recorded before its request is
// answered, and that refusal becomes the request's decision, counted as the lockout's.
func (l *Limiter) fail(ctx context.Context, name, scope, subject, logKey, lockKey string, rule Lockout, answers bool) Decision {
	if !rule.Enabled() {
		return Decision{Allowed: true}
	}
	parent := trace.SpanFromContext(ctx)
	ctx, span := l.tracer.Start(ctx, name)
	defer span.End()
	started, held, err := l.b.Fail(ctx, logKey, lockKey, rule)
	if err != nil {
		l.backendError(ctx, span, err)
		return Decision{Allowed: true}
	}
	if span.IsRecording() {
		span.SetAttributes(attribute.String("limits.scope", scope), attribute.Bool("limits.lock_started", started),
			attribute.String("limits.backend", l.b.Name()))
	}
	if started {
		l.rec.Lockout(subject)
		l.log.InfoContext(ctx, "rate limiter: lockout started", slog.String("scope", scope),
			slog.Duration("lock", rule.Lock))
	}
	if held > 0 {
		d := Decision{RetryAfter: seconds(held), Locked: true}
		if answers {
			l.record(parent, span, scope, OutcomeLocked, d, "")
		}
		return d
	}
	return Decision{Allowed: true}
}

// CheckKey answers step 4 of docs/api-contract.md §5 for the key keyID: its write lockout, then its rate
// windows — and the bulk windows too when bulk is true. A request that is not allowed takes
// nothing from any window.
func (l *Limiter) CheckKey(ctx context.Context, keyID string, bulk bool) Decision {
	var bbuf [8]Bucket
	buckets := bbuf[:0]
	for _, w := range l.cfg.Rate {
		buckets = append(buckets, Bucket{Key: bucketKey(keyID, "rate", w), Window: w})
	}
	if bulk {
		for _, w := range l.cfg.Bulk {
			buckets = append(buckets, Bucket{Key: bucketKey(keyID, "bulk", w), Window: w})
		}
	}
	if len(buckets) == 0 && !l.cfg.WriteLockout.Enabled() {
		return Decision{Allowed: true}
	}
	parent := trace.SpanFromContext(ctx)
	ctx, span := l.tracer.Start(ctx, "limits.key")
	defer span.End()
	out, err := l.b.Take(ctx, keyLockKey(keyID), buckets)
	if err != nil {
		l.backendError(ctx, span, err)
		return Decision{Allowed: true}
	}
	if out.Locked > 0 {
		d := Decision{RetryAfter: seconds(out.Locked), Locked: true}
		if len(buckets) > 0 {
			// Nothing can be used until the lock ends: say so in the headers too.
			d.Limit, d.Reset = buckets[0].Window.Limit, d.RetryAfter
		}
		l.record(parent, span, ScopeKeyLockout, OutcomeLocked, d, "")
		return d
	}
	scope := ScopeKey
	if bulk {
		scope = ScopeBulk
	}
	if len(buckets) == 0 {
		d := Decision{Allowed: true}
		l.record(parent, span, ScopeKeyLockout, OutcomeAllowed, d, "")
		return d
	}
	return l.windows(parent, span, scope, out, buckets)
}

// CheckConfirm answers whether the client at ip may open a confirmation page (GET or POST
// /confirm/{token}): its Confirm windows, per client address. Each request costs a token
// lookup in the database, so a client guessing tokens is slowed down; the authentication
// lockout does not apply (a person confirming from a shared address is not blocked by a
// misbehaving integration on that network).
func (l *Limiter) CheckConfirm(ctx context.Context, ip netip.Addr) Decision {
	if len(l.cfg.Confirm) == 0 {
		return Decision{Allowed: true}
	}
	var bbuf [4]Bucket
	buckets := bbuf[:0]
	for _, w := range l.cfg.Confirm {
		buckets = append(buckets, Bucket{Key: bucketKey(clientSubject(ip), "confirm", w), Window: w})
	}
	parent := trace.SpanFromContext(ctx)
	ctx, span := l.tracer.Start(ctx, "limits.confirm")
	defer span.End()
	out, err := l.b.Take(ctx, confirmLockKey(ip), buckets)
	if err != nil {
		l.backendError(ctx, span, err)
		return Decision{Allowed: true}
	}
	if len(out.Windows) != len(buckets) { // a lock, which nothing sets for the pages
		return Decision{Allowed: true}
	}
	return l.windows(parent, span, ScopeConfirm, out, buckets)
}

// windows turns a backend's answer for buckets (no lock held) into the Decision of scope.
func (l *Limiter) windows(parent, span trace.Span, scope string, out Outcome, buckets []Bucket) Decision {
	i := closest(out)
	st := out.Windows[i]
	d := Decision{Allowed: out.Allowed, Limit: buckets[i].Window.Limit, Remaining: st.Remaining, Reset: seconds(st.ResetAfter)}
	outcome := OutcomeAllowed
	if !out.Allowed {
		outcome = OutcomeLimited
		d.RetryAfter = seconds(st.RetryAfter)
	}
	l.record(parent, span, scope, outcome, d, buckets[i].Window.String())
	return d
}

// closest picks the window to report. Denied: the empty window that frees up last (its
// retry-after is the request's). Allowed: the fewest requests left, and of those the one that
// takes longest to refill.
func closest(out Outcome) int {
	best := 0
	for i, st := range out.Windows {
		b := out.Windows[best]
		switch {
		case !out.Allowed:
			if !st.Allowed && (b.Allowed || st.RetryAfter > b.RetryAfter) {
				best = i
			}
		case st.Remaining < b.Remaining || st.Remaining == b.Remaining && st.ResetAfter > b.ResetAfter:
			best = i
		}
	}
	return best
}

// record counts a decision and describes it on its own span, and in brief on the request's
// span (app.ratelimit.decision and app.ratelimit.policy, overwritten by a later check of the
// same request), so a trace search finds refused requests without opening children.
func (l *Limiter) record(parent, span trace.Span, scope, outcome string, d Decision, window string) {
	l.rec.Decision(scope, outcome)
	if parent.IsRecording() {
		policy := scope
		if window != "" {
			policy += " " + window
		}
		parent.SetAttributes(attribute.String("app.ratelimit.decision", outcome), attribute.String("app.ratelimit.policy", policy))
	}
	if !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{
		attribute.String("limits.scope", scope),
		attribute.String("limits.decision", outcome),
		attribute.String("limits.backend", l.b.Name()),
	}
	if window != "" {
		attrs = append(attrs, attribute.String("limits.window", window),
			attribute.Int("limits.limit", d.Limit), attribute.Int("limits.remaining", d.Remaining))
	}
	if !d.Allowed {
		attrs = append(attrs, attribute.Int("limits.retry_after", d.RetryAfter))
	}
	span.SetAttributes(attrs...)
}

// backendError fails open: a limiter that cannot decide lets the request through.
func (l *Limiter) backendError(ctx context.Context, span trace.Span, err error) {
	span.RecordError(err)
	span.SetStatus(codes.Error, "limiter backend failed; request allowed")
	if ctx.Err() == nil {
		l.log.WarnContext(ctx, "rate limiter: backend failed; request allowed", slog.String("error", err.Error()))
	}
}

// seconds rounds d up to whole seconds, at least 1.
func seconds(d time.Duration) int {
	s := int(math.Ceil(d.Seconds()))
	return max(s, 1)
}
