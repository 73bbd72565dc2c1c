package repo

import (
	"github.com/uptrace/bun"
	"go.opentelemetry.io/otel/trace"
)

// RunInTx exposes runInTx to the external tests of the package.
var RunInTx = runInTx

// TraceQueries makes the spans of db's statements, bun's and prepared ones alike, with tp, for
// the external tests of the package. Call it before the pool runs anything.
func TraceQueries(db *bun.DB, tp trace.TracerProvider) {
	preparerOf(db).hook.tracer = tp.Tracer("github.com/subscriberd/subscriberd/repo")
}

// GetSubscriberText is the text of Subscribers.Get's prepared statement.
var GetSubscriberText = getSubscriberPG.text
