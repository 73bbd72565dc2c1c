package repo

import (
	"context"
	"database/sql"
	"regexp"
	"strconv"
	"sync"

	"github.com/uptrace/bun"
	"go.opentelemetry.io/otel/trace"
)

// statement is one of the hot PostgreSQL statements that PostgreSQL parses and plans once per
// connection rather than on every call. bun's query builder has pgdriver send each statement
// over the simple protocol with its values inlined, so the server parses and plans every one,
// and for a get or a first list page planning is most of what the server does. A prepared
// statement sends only its values (Bind, Execute, Sync).
//
// The text is written with $1… placeholders and names its columns (never *), so a column added
// by a later migration changes neither its result nor its cached plan's shape. Every $n must
// appear in the text: PostgreSQL infers each parameter's type from where it is used. The text
// holds no value; its span's db.query.text is the text with its constant literals replaced by
// "?", as bun's statements' are.
//
// PostgreSQL runs a prepared statement's generic plan, made without the values, from its first
// call (plan_cache_mode is force_generic_plan, see openPostgres): check a new statement's with
// EXPLAIN (ANALYZE) EXECUTE on realistic volumes, and leave a statement whose generic plan is
// bad on bun's path (as the deep list page is, see listDeepPostgres).
//
// A statement whose text SQLite understands too runs there through bun (which has no prepared
// statements of its own; see sqliteEngine.queryRow), so one text serves both stores, and its
// span has the same name on both.
type statement struct {
	op, table string // the span's name and attributes, as bun's query hook names the same statement
	text      string
	bunText   string // text with bun's placeholders, ?0…, for SQLite
	spanText  string // db.query.text
}

// newStatement returns the statement text whose span is named "{op} {table}" (op alone when
// table is "").
func newStatement(op, table, text string) *statement {
	bunText := placeholder.ReplaceAllStringFunc(text, func(p string) string {
		n, _ := strconv.Atoi(p[1:])
		return "?" + strconv.Itoa(n-1)
	})
	return &statement{op: op, table: table, text: text, bunText: bunText, spanText: redactSQL(text)}
}

// placeholder matches PostgreSQL's $1… in a statement's text.
var placeholder = regexp.MustCompile(`\$[0-9]+`)

// preparedStatements holds, for one PostgreSQL pool, the pool, its query hook (so that
// prepared statements make the spans bun's statements make) and the statements prepared on it
// so far. database/sql's Stmt prepares a statement on one connection and, by itself, again on
// each other connection that runs it. The pool's DB owns it, through its engine.
type preparedStatements struct {
	db    *bun.DB
	hook  *queryHook
	stmts sync.Map // *statement → *sql.Stmt
}

// prepared returns st prepared on the pool, preparing it on first use. A failed prepare (the
// database down, say) is not kept: the next call prepares again.
func (p *preparedStatements) prepared(ctx context.Context, st *statement) (*sql.Stmt, error) {
	if s, ok := p.stmts.Load(st); ok {
		return s.(*sql.Stmt), nil
	}
	s, err := p.db.DB.PrepareContext(ctx, st.text)
	if err != nil {
		return nil, err
	}
	if kept, raced := p.stmts.LoadOrStore(st, s); raced {
		s.Close() //nolint:errcheck // another call prepared it first; this one was never used
		return kept.(*sql.Stmt), nil
	}
	return s, nil
}

// queryRow runs st with args on db (the pool, or one of its transactions) and scans its one
// row with bun into dest, a pointer to a struct with bun tags or to one value; no row gives
// sql.ErrNoRows. Errors are the driver's, for the caller to translate.
func (p *preparedStatements) queryRow(ctx context.Context, db bun.IDB, st *statement, dest any, args ...any) error {
	return p.runPrepared(ctx, db, st, args, func(ctx context.Context, rows *sql.Rows) error {
		if !rows.Next() {
			if err := rows.Err(); err != nil {
				return err
			}
			return sql.ErrNoRows
		}
		if err := p.db.ScanRow(ctx, rows, dest); err != nil {
			return err
		}
		return rows.Close()
	})
}

// queryRows is queryRow for every row st returns, scanned with bun into dest, a pointer to a
// slice; no row leaves it empty.
func (p *preparedStatements) queryRows(ctx context.Context, db bun.IDB, st *statement, dest any, args ...any) error {
	return p.runPrepared(ctx, db, st, args, func(ctx context.Context, rows *sql.Rows) error {
		return p.db.ScanRows(ctx, rows, dest)
	})
}

// runPrepared runs st in the span bun's query hook would make for it, and scan on its rows.
func (p *preparedStatements) runPrepared(ctx context.Context, db bun.IDB, st *statement, args []any,
	scan func(context.Context, *sql.Rows) error) error {
	var span trace.Span
	if p.hook != nil && traced(ctx) {
		ctx, span = p.hook.startSpan(ctx, st.op, st.table, st.spanText)
	}
	err := p.execPrepared(ctx, db, st, args, scan)
	if span != nil {
		endSpan(span, err)
	}
	return err
}

// execPrepared runs st with args on db and scan on its rows, under ctx like every other
// statement: when ctx ends, the statement stops and its connection is dropped (package pgconn).
func (p *preparedStatements) execPrepared(ctx context.Context, db bun.IDB, st *statement, args []any,
	scan func(context.Context, *sql.Rows) error) error {
	var stmt *sql.Stmt
	if tx, ok := db.(bun.Tx); ok {
		if s, ok := p.stmts.Load(st); ok {
			// The transaction's connection's own copy (prepared there if it is not yet),
			// closed with the transaction.
			stmt = tx.Tx.StmtContext(ctx, s.(*sql.Stmt))
		} else {
			// Never prepared on the pool yet: preparing it there would take a second
			// connection while the transaction holds one, and a pool whose every connection
			// is such a transaction would wait on itself. Prepared on the transaction's
			// connection for this call only.
			s, err := tx.Tx.PrepareContext(ctx, st.text)
			if err != nil {
				return err
			}
			defer s.Close()
			stmt = s
		}
	} else {
		var err error
		if stmt, err = p.prepared(ctx, st); err != nil {
			return err
		}
	}
	rows, err := stmt.QueryContext(ctx, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	return scan(ctx, rows)
}
