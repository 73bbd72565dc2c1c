package repo

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/migrate"

	"github.com/subscriberd/subscriberd/model"
)

// engine is the seam between the stores and the database engine: everything that differs
// between PostgreSQL (pg.go) and SQLite (sqlite.go), and nothing else. The stores call it and
// never ask which engine runs.
type engine interface {
	// migrations are the engine's schema migrations; migrationsTableExists is a statement
	// that reads whether bun's table of applied migrations exists.
	migrations() (*migrate.Migrations, error)
	migrationsTableExists() string

	// queryRow runs st with args on db (the pool or a transaction of it) and scans its one
	// row into dest (sql.ErrNoRows when there is none); queryRows scans every row into dest,
	// a pointer to a slice. Errors are the driver's, for the caller to translate.
	queryRow(ctx context.Context, db bun.IDB, st *statement, dest any, args ...any) error
	queryRows(ctx context.Context, db bun.IDB, st *statement, dest any, args ...any) error

	// listPage reads one page of a newsletter's subscribers and the total matching q in one
	// statement (Subscribers.List): the first row carries the total, rows without an id are
	// not subscribers.
	listPage(ctx context.Context, db bun.IDB, nl uuid.UUID, q model.ListQuery) ([]pageRow, error)

	// create stores row, after the suppression check under the address's lock, with its
	// created event, the event's deliveries and mail (when not nil), in one statement on s's
	// connection (Subscribers.Create); done is false when the engine has no such statement,
	// and the caller then writes them in a transaction.
	create(ctx context.Context, s *store, row *subscriberRow, ev model.Event, mail *outboxRow) (done bool, err error)
	// rename applies a patch that sets at most the name without a transaction, when the
	// engine can (see Subscribers.rename); done is false when it did not.
	rename(ctx context.Context, s *Subscribers, nl, id uuid.UUID, name *string) (sub model.Subscriber, done bool, err error)
	// insertEvents appends rows to the event log and queues their webhook deliveries, in
	// the caller's transaction, and reports whether it queued any delivery (when the engine
	// knows: its workers need waking).
	insertEvents(ctx context.Context, db bun.IDB, rows []eventRow) (bool, error)

	// claimEmails and claimDeliveries lease due work to one worker (Outbox.Claim,
	// Deliveries.Claim) without waiting on another worker's claim.
	claimEmails(ctx context.Context, s *store, now time.Time, limit int, lease time.Duration) ([]claimedRow, error)
	claimDeliveries(ctx context.Context, s *store, now time.Time, c deliveryClaim) ([]claimRow, error)
	// stageImport stores a new import with the rows next yields (Imports.Stage).
	stageImport(ctx context.Context, s *Imports, row *importRow, next func() ([]byte, error)) error

	// raw is query, a statement the stores write once for both engines, with PostgreSQL's
	// row-lock clauses (FOR UPDATE, FOR NO KEY UPDATE, FOR SHARE, SKIP LOCKED) where it needs
	// them, as the engine runs it on db: as written on PostgreSQL, without those clauses on
	// SQLite, whose immediate transactions hold the database's write lock.
	raw(db bun.IDB, query string, args ...any) *bun.RawQuery
	// deleteResponsesContaining deletes, in one statement on db, nl's stored responses
	// (idempotency_keys) whose body contains the bytes of any of needles (Privacy.Erase).
	deleteResponsesContaining(ctx context.Context, db bun.IDB, nl uuid.UUID, needles [][]byte) error
	// lockEmailKeys makes transactions that write the same email keys of nl wait for each
	// other until commit, the keys taken in the order given (sorted by the caller): a new
	// email nobody holds yet (Subscribers.Update), the suppression check and the suppressions
	// themselves (docs/api-contract.md §13).
	lockEmailKeys(ctx context.Context, tx bun.IDB, nl uuid.UUID, keys []string) error
	// lockIdempotencyKey takes, in the transaction of Idempotency.Run, the right to run the
	// request of (nl, key): it returns the stored response of a request with the key that
	// finished first, or model.ErrIdempotencyInUse while one still runs.
	lockIdempotencyKey(ctx context.Context, s *Idempotency, tx bun.IDB, nl uuid.UUID, key string) (*model.StoredResponse, error)

	// listen returns a channel signalled (coalesced) after each commit of this process that
	// queued into queue, until ctx ends, or nil when the workers poll; wake signals it.
	listen(ctx context.Context, queue string) <-chan struct{}
	wake(queue string)
}

// The queues with wakers (engine.listen).
const (
	emailQueue   = "email"
	webhookQueue = "webhook"
)
