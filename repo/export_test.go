package repo

import (
	"go.opentelemetry.io/otel/trace"
)

// TraceQueries makes the spans of db's statements, bun's and prepared ones alike, with tp, for
// the external tests of the package. Call it before the pool runs anything.
func TraceQueries(db *DB, tp trace.TracerProvider) {
	db.hook.tracer = tp.Tracer("github.com/subscriberd/subscriberd/repo")
}

// GetSubscriberText is the text of Subscribers.Get's prepared statement.
var GetSubscriberText = getSubscriber.text
