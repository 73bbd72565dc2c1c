package repo

import (
	"context"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/subscriberd/subscriberd/repo/pgconn"
)

// TraceQueries makes the spans of db's statements, bun's and prepared ones alike, with tp, for
// the external tests of the package. Call it before the pool runs anything.
func TraceQueries(db *DB, tp trace.TracerProvider) {
	db.hook.tracer = tp.Tracer("github.com/subscriberd/subscriberd/repo")
}

// GetSubscriberText is the text of Subscribers.Get's prepared statement.
var GetSubscriberText = getSubscriber.text

// QueryRows runs text, a statement with $1… placeholders, through the engine's queryRows.
func QueryRows(ctx context.Context, db *DB, text string, dest any, args ...any) error {
	return db.eng.queryRows(ctx, db.DB, newStatement("SELECT", "", text), dest, args...)
}

// QueryRowsTx is QueryRows in the unit of work tx.
func QueryRowsTx(ctx context.Context, tx Tx, text string, dest any, args ...any) error {
	return tx.db.eng.queryRows(ctx, tx.tx, newStatement("SELECT", "", text), dest, args...)
}

// CopyFrom is pgconn.CopyFrom: pgdriver.CopyFrom on a connection of a pool Open made.
var CopyFrom = pgconn.CopyFrom

// Translate is translate, the mapping of driver errors onto model errors.
var Translate = translate

// LockEmails takes, in the unit of work tx, the address locks a suppression takes.
func LockEmails(ctx context.Context, tx Tx, nl uuid.UUID, emails []string) error {
	s := tx.store()
	return s.lockEmails(ctx, tx.tx, nl, emails)
}

// AttributeNamesPG is the expression of has_attr's index on PostgreSQL.
const AttributeNamesPG = attributeNamesPG
