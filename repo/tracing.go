package repo

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/uptrace/bun"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// queryHook makes one OpenTelemetry CLIENT span per query run inside a sampled trace (a
// request, an email send), named "{operation} {table}" as the database semantic conventions
// ask ("INSERT subscribers", "SELECT api_keys"), with the stable attributes db.system.name,
// db.namespace, db.operation.name, db.collection.name and db.query.text, and server.address
// and server.port (the port only when it is not 5432) for a server. Queries outside any
// traced work (health checks, polling) make no spans.
//
// db.query.text never holds a bound value: bun formats arguments into the statement, so the
// text is the statement with every literal replaced by "?" (redactSQL), or the template of a
// raw query. Emails, names and key hashes are literals, so none reaches a trace. A prepared
// statement (see statement, engine.go) has its values apart from its text, which is then its
// db.query.text.
//
// It replaces bunotel, which cost about twice as much per query: it walked the stack for
// code.* attributes on every query and recorded a histogram nobody reads.
type queryHook struct {
	tracer trace.Tracer
	attrs  []attribute.KeyValue // db.system.name, db.namespace, server.address and .port
}

func newQueryHook(dsn, system string) *queryHook {
	var dbName string
	var server []attribute.KeyValue
	if IsSQLite(dsn) { // the namespace is the file's name
		if p, err := SQLitePath(dsn); err == nil {
			dbName = filepath.Base(p)
		}
	} else if u, err := url.Parse(dsn); err == nil && u.Hostname() != "" {
		dbName = strings.TrimPrefix(u.Path, "/")
		server = append(server, attribute.String("server.address", u.Hostname()))
		// Only a port other than PostgreSQL's own, as the conventions ask: an attribute
		// fewer on every query span, where each costs about a quarter of a microsecond.
		if port, err := strconv.Atoi(u.Port()); err == nil && port != postgresPort {
			server = append(server, attribute.Int("server.port", port))
		}
	}
	return &queryHook{
		tracer: otel.Tracer("github.com/subscriberd/subscriberd/repo"),
		attrs: append([]attribute.KeyValue{attribute.String("db.system.name", system), attribute.String("db.namespace", dbName)},
			server...),
	}
}

// postgresPort is PostgreSQL's default port, which query spans leave out.
const postgresPort = 5432

// BeforeQuery implements bun.QueryHook. The span gets its name and every attribute here, at
// once: the statement is already formatted when bun calls the hook.
func (h *queryHook) BeforeQuery(ctx context.Context, e *bun.QueryEvent) context.Context {
	if !traced(ctx) {
		return ctx
	}
	if st, ok := ctx.Value(statementKey{}).(*statement); ok {
		ctx, _ = h.startSpan(ctx, st.op, st.table, st.spanText)
		return ctx
	}
	ctx, _ = h.startSpan(ctx, e.Operation(), tableName(e), queryText(e))
	return ctx
}

// statementKey is the context key of the statement bun runs for sqliteEngine.queryRow, which
// names its span.
type statementKey struct{}

// withStatement makes the span of the one bun statement run in ctx the span of st.
func withStatement(ctx context.Context, st *statement) context.Context {
	if !traced(ctx) {
		return ctx
	}
	return context.WithValue(ctx, statementKey{}, st)
}

// traced reports whether statements run in ctx make spans: in a sampled trace. Sampled rather
// than recording: bun runs COMMIT in the context of BEGIN, whose span has ended by then but
// belongs to the same sampled trace.
func traced(ctx context.Context) bool { return trace.SpanContextFromContext(ctx).IsSampled() }

// startSpan starts the span of one statement, bun's (BeforeQuery) or a prepared one
// (pgEngine.runPrepared), in a traced ctx: named "{op} {table}", or op alone without a table,
// with the hook's attributes, db.operation.name, db.query.text (text, which holds no value)
// and db.collection.name when there is a table.
func (h *queryHook) startSpan(ctx context.Context, op, table, text string) (context.Context, trace.Span) {
	name := op
	if table != "" { // "SELECT subscribers": a few dozen names, made once each
		var stack [64]byte
		name = spanNames.get(append(append(append(stack[:0], op...), ' '), table...))
	}
	ctx, span := h.tracer.Start(ctx, name, clientStart...)
	// Set after the start rather than passed as a start option, which the SDK would copy
	// twice; the SDK copies the values, so the slice goes back to the pool.
	buf := attrPool.Get().(*[]attribute.KeyValue)
	attrs := append((*buf)[:0], h.attrs...)
	attrs = append(attrs, attribute.String("db.operation.name", op), attribute.String("db.query.text", text))
	if table != "" {
		attrs = append(attrs, attribute.String("db.collection.name", table))
	}
	span.SetAttributes(attrs...)
	clear(attrs)
	*buf = attrs[:0]
	attrPool.Put(buf)
	return ctx, span
}

// clientStart are the start options of every query span, made once rather than per query (the
// SDK only reads them).
var clientStart = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}

// attrPool holds the attribute slices startSpan fills.
var attrPool = sync.Pool{New: func() any { s := make([]attribute.KeyValue, 0, 8); return &s }}

// AfterQuery implements bun.QueryHook. The span in ctx is recording only when BeforeQuery
// started it.
func (h *queryHook) AfterQuery(ctx context.Context, e *bun.QueryEvent) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	endSpan(span, e.Err)
}

// endSpan ends a statement's span, marked failed when err is a failure (no row, or a
// transaction already ended, is not).
func endSpan(span trace.Span, err error) {
	if err != nil && !errors.Is(err, sql.ErrNoRows) && !errors.Is(err, sql.ErrTxDone) {
		span.SetStatus(codes.Error, "query failed")
		span.SetAttributes(attribute.String("error.type", errorType(err)))
	}
	span.End()
}

// queryText is the statement with no bound value in it: a raw query's own template, or the
// formatted statement with its literals redacted.
func queryText(e *bun.QueryEvent) string {
	if e.IQuery == nil && e.QueryTemplate != "" {
		return e.QueryTemplate
	}
	return redactSQL(e.Query)
}

// redactSQL replaces every literal of a statement formatted by bun's PostgreSQL or SQLite
// dialect by "?": quoted strings (which is how both dialects write text, bytes, UUIDs, times,
// arrays and JSON) and numbers. Quoted identifiers, keywords and placeholders ($1) are kept.
// Redacting is one pass over the text, several times cheaper than asking bun for the query
// again with placeholders, and it leaves nothing a value could hide in: a string ends only at
// a quote that is not doubled.
//
// A service runs a few dozen statement shapes, so most statements have the shape of one
// redacted before: the same text around literals in the same places. The last shape of each
// length is kept (sqlShapes), and a statement that has it is recognised by comparing its text
// around the literals and finding each literal's end, without scanning it again; the result is
// then the text redacted before. What is redacted in full is interned (internedSQL), so that a
// shape that misses the cache still costs no new string.
func redactSQL(q string) string {
	slot := &sqlShapes[len(q)%len(sqlShapes)]
	sh := slot.Load()
	if sh != nil && sh.match(q) {
		return sh.text
	}
	// One more than a shape keeps: a statement that fills it has too many to keep.
	var stack [maxShapeLiterals + 1]literal
	text, lits, whole := scanSQL(q, stack[:0])
	// A statement whose literals vary in length (an insert of emails) meets its own text at
	// other places in the slot: keeping that shape rather than making a new one on every
	// such query hits as often and allocates nothing.
	if whole && len(lits) <= maxShapeLiterals && (sh == nil || sh.text != text) {
		slot.Store(&sqlShape{text: text, n: len(q), lits: slices.Clone(lits)})
	}
	return text
}

// scanSQL is redactSQL in full: the redacted text, where the literals it replaced were in q
// (appended to lits up to its capacity, so that a bulk insert's hundreds of literals, which no
// shape keeps, cost no allocation), and whether the text is whole (not cut at maxQueryText).
func scanSQL(q string, lits []literal) (string, []literal, bool) {
	var stack [512]byte
	b := stack[:0]
	plain := 0 // start of the text not yet copied
	i := 0
	for lim := min(len(q), maxQueryText); i < len(q); {
		for i < lim && !sqlSpecial[q[i]] {
			i++ // most of a statement: keywords, punctuation, unquoted names
		}
		if i >= len(q) {
			break
		}
		if i >= maxQueryText {
			// Cut between tokens (a literal is consumed whole below), so nothing of a
			// value is left.
			b = append(b, q[plain:i]...)
			b = append(b, truncated...)
			return internedSQL.get(b), lits, false
		}
		switch c := q[i]; {
		case c == '"':
			i = skipQuoted(q, i, '"') // identifiers are copied with the plain text
		case c != '\'' && i > 0 && isIdentByte(q[i-1]):
			i++ // a digit inside a name or a placeholder
		default: // a string or a number
			b = append(b, q[plain:i]...)
			end := literalEnd(q, i)
			if len(lits) < cap(lits) {
				lits = append(lits, literal{int32(i), int32(end)})
			}
			b = append(b, '?')
			i, plain = end, end
		}
	}
	if plain == 0 {
		return q, lits, true // nothing redacted: the statement is its own text
	}
	return internedSQL.get(append(b, q[plain:]...)), lits, true
}

// literalEnd is the index just past the literal that starts at q[i]: a quoted string (see
// skipQuoted) or a number, digits with a decimal point and an exponent; -1 when q[i] starts
// neither.
func literalEnd(q string, i int) int {
	switch {
	case q[i] == '\'':
		return skipQuoted(q, i, '\'')
	case !isDigit(q[i]):
		return -1
	}
	for i < len(q) && (isDigit(q[i]) || q[i] == '.' ||
		((q[i] == 'e' || q[i] == 'E') && i+1 < len(q) && (isDigit(q[i+1]) || q[i+1] == '-' || q[i+1] == '+'))) {
		if q[i] == 'e' || q[i] == 'E' {
			i++ // the exponent's sign or first digit
		}
		i++
	}
	return i
}

// literal is where a literal was in a statement: q[start:end].
type literal struct{ start, end int32 }

// sqlShape is a statement's shape: its redacted text, its length and where its literals were.
// It holds no value: text has "?" where they were.
type sqlShape struct {
	text string
	n    int
	lits []literal
}

// match reports whether q has the shape: the same length, the same text around the literals,
// and at each literal's place a literal ending where it ended. redactSQL(q) is then sh.text:
// scanning q would copy the same text, and find the same literals, since what it decides
// at a byte depends only on the text before it in the same run of plain text (or on the
// literal's own first byte) and on that literal's end.
func (sh *sqlShape) match(q string) bool {
	if len(q) != sh.n {
		return false
	}
	prev, at := 0, 0 // where the plain text before the next literal starts, in q and in text
	for _, l := range sh.lits {
		start, end := int(l.start), int(l.end)
		n := start - prev
		if q[prev:start] != sh.text[at:at+n] || literalEnd(q, start) != end {
			return false
		}
		prev, at = end, at+n+1 // past the literal, and past its "?"
	}
	return q[prev:] == sh.text[at:]
}

// sqlShapes holds the last statement shape of each length (modulo its size) that redactSQL
// redacted in full; a slot is replaced whole, so reading one takes no lock.
var sqlShapes [256]atomic.Pointer[sqlShape]

// maxShapeLiterals is the most literals a cached shape has: a statement with more (a bulk
// insert) is redacted in full each time, which its own cost dwarfs.
const maxShapeLiterals = 16

// sqlSpecial marks the bytes where redactSQL has something to decide: quotes and digits.
var sqlSpecial = func() (t [256]bool) {
	t['\''], t['"'] = true, true
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	return t
}()

// internedSQL holds the redacted statements made so far, up to 256 KiB of them; beyond that,
// new texts are made per query and not kept (a statement's shape can vary with its rows, as a
// bulk insert's does, so the set is bounded but can be large).
var internedSQL = &internTable{m: map[string]string{}, max: 256 << 10}

// spanNames holds the query spans' names, "{operation} {table}".
var spanNames = &internTable{m: map[string]string{}, max: 16 << 10}

// internTable keeps one copy of each string made from bytes, up to max bytes in all.
type internTable struct {
	mu    sync.RWMutex
	m     map[string]string
	bytes int
	max   int
}

// get returns b as a string, the one kept if there is one. Looking a []byte up as
// m[string(b)] does not allocate.
func (t *internTable) get(b []byte) string {
	t.mu.RLock()
	s, ok := t.m[string(b)]
	t.mu.RUnlock()
	if ok {
		return s
	}
	s = string(b)
	t.mu.Lock()
	if t.bytes+len(s) <= t.max {
		if _, ok := t.m[s]; !ok {
			t.m[s] = s
			t.bytes += len(s)
		}
	}
	t.mu.Unlock()
	return s
}

// maxQueryText is about where db.query.text is cut: a bulk insert of 100 rows is a 20 KB
// statement whose text is the same tuple a hundred times, and redacting all of it cost 60 µs
// (5 % of the request) for a span attribute nobody reads to the end.
const maxQueryText = 2048

// truncated ends a cut db.query.text.
const truncated = " …"

// skipQuoted returns the index just past the quoted text that starts at q[i] == quote; a
// doubled quote inside is part of the text. An unterminated quote runs to the end.
func skipQuoted(q string, i int, quote byte) int {
	for i++; ; i += 2 { // past the opening quote, then past each doubled one
		j := strings.IndexByte(q[i:], quote)
		if j < 0 {
			return len(q)
		}
		i += j
		if i+1 >= len(q) || q[i+1] != quote {
			return i + 1
		}
	}
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// isIdentByte: a byte that can continue an unquoted identifier or a placeholder ($1).
func isIdentByte(c byte) bool {
	return c == '_' || c == '$' || isDigit(c) || (c|0x20 >= 'a' && c|0x20 <= 'z') || c >= 0x80
}

// errorType names a failure without its text, which can quote values.
func errorType(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	if code := sqlState(err); code != "" {
		return code
	}
	if e, ok := asSQLiteError(err); ok { // SQLite's (extended) result code, e.g. 2067, 5
		return strconv.Itoa(e.Code())
	}
	return "other"
}

// tableName is the table a query-builder statement works on, or "".
func tableName(e *bun.QueryEvent) string {
	if e.IQuery == nil {
		return ""
	}
	return strings.Trim(e.IQuery.GetTableName(), `"`)
}
