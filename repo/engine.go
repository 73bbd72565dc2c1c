package repo

// This file is the engine seam: the engine interface, and the values, rows and SQL that
// cross it or that both engines share (the queue names, what a create, a rename, a change of
// tags or an import's staging hands the engine, the subscriber a change of tags hands back,
// the event row and the deliveries' insert, the claims' rows and their endpoint query).

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/migrate"

	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/outbox"
)

// engine is the seam between the stores and the database engine: everything that differs
// between PostgreSQL (pg.go) and SQLite (sqlite.go), and nothing else. It runs one way: the
// stores call it with plain values (a connection, ids, times, and the values and rows this
// file declares) and get plain values back; each engine owns its statements whole and names
// nothing of the stores (TestSeamRunsOneWay). The stores never ask which engine runs.
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
	// raw is query, a statement the stores write once for both engines, with PostgreSQL's
	// row-lock clauses (FOR UPDATE, FOR NO KEY UPDATE, FOR SHARE, SKIP LOCKED) where it needs
	// them, as the engine runs it on db: as written on PostgreSQL, without those clauses on
	// SQLite, whose immediate transactions hold the database's write lock.
	raw(db bun.IDB, query string, args ...any) *bun.RawQuery

	// listPage reads one page of a newsletter's subscribers and the total matching q in one
	// statement (Subscribers.List) into dest, a pointer to a slice of rows with the columns
	// total, id, email, first_name, last_name, status and created_at: the first row carries
	// the total, rows without an id are not subscribers.
	listPage(ctx context.Context, db bun.IDB, dest any, nl uuid.UUID, q model.ListQuery) error
	// countMatching counts nl's subscribers that f selects (Segments.Get) in one statement
	// with the WHERE clause of the filtered list, and so its indexes.
	countMatching(ctx context.Context, db bun.IDB, nl uuid.UUID, f model.Filter) (int64, error)

	// create stores c's subscriber with its created event, the event's deliveries and its
	// confirmation email, all or nothing, after the suppression check of
	// docs/api-contract.md §13 under the address's lock (Subscribers.Create): a suppressed
	// address fails with a *model.SuppressedError, one the newsletter has with
	// model.ErrEmailTaken, and nothing is stored. It reports whether it queued a webhook
	// delivery, when the engine knows (its workers need waking).
	create(ctx context.Context, db bun.IDB, c creation) (delivering bool, err error)
	// rename sets the names of r's subscriber, with its updated event and the event's
	// deliveries, all or nothing, only while the row still holds every value r read
	// (Subscribers.rename): renamed is false, and nothing changed, when it did not. It reports
	// whether it queued a webhook delivery, when the engine knows.
	rename(ctx context.Context, db bun.IDB, r renaming) (renamed, delivering bool, err error)
	// changeTags applies t.Change to the tags of t's subscriber (Subscribers.ChangeTags,
	// docs/api-contract.md §19.2) under the subscriber's row lock, so that concurrent changes
	// of different tags never lose each other's, and returns the subscriber after it. When
	// the set changes, its update time and tags are written with its updated event (previous:
	// the tags before) and the event's deliveries in the interactive lane, all or nothing; when
	// it stays as it is, nothing is written and the subscriber comes back as it is. A missing
	// subscriber fails with model.ErrNotFound, a set past model.MaxTags with the
	// *model.ValidationError of model.CheckTagCount, and nothing changes. It reports whether it
	// queued a webhook delivery, when the engine knows.
	changeTags(ctx context.Context, db bun.IDB, t retagging) (sub model.Subscriber, delivering bool, err error)
	// insertEvents appends rows to the event log and queues their webhook deliveries in
	// lane (outbox.Lane), in the caller's transaction, and reports whether it queued any
	// delivery (when the engine knows: its workers need waking).
	insertEvents(ctx context.Context, db bun.IDB, rows []eventRow, lane outbox.Lane) (bool, error)
	// deleteResponsesContaining deletes, in one statement on db, nl's stored responses
	// (idempotency_keys) whose body contains the bytes of any of needles (Privacy.Erase).
	deleteResponsesContaining(ctx context.Context, db bun.IDB, nl uuid.UUID, needles [][]byte) error
	// dropEmptyTagCounts deletes, in the caller's transaction db, nl's tag counter rows
	// (subscriber_tag_counts) of those of tags that nobody holds, their count being 0
	// (Privacy.Erase: a tag's text can be personal data), without changing any tag's count
	// under concurrent writers of the same tags and without waiting for them: a tag they are
	// writing may keep rows summing to 0, for Privacy.SweepTagCounts.
	dropEmptyTagCounts(ctx context.Context, db bun.IDB, nl uuid.UUID, tags []string) error
	// stageImport stores a new import with every row st yields, durably, before it returns
	// (Imports.Stage), through the store's writes of the import st carries. When st.next
	// fails, nothing of the import remains and next's error is returned as it is.
	stageImport(ctx context.Context, db *bun.DB, st staging) error
	// markDuplicates marks, on db, each valid staged row of import id numbered after after
	// up to last whose address an earlier one of them has (stagedRow.Duplicate).
	markDuplicates(ctx context.Context, db bun.IDB, id uuid.UUID, after, last int64) error
	// importBatch applies batch b's staged rows in the transaction tx, the batch's address
	// locks held (Imports.Batch): the invalid rows' errors recorded; the suppressed ones,
	// then the duplicates, skipped; the others created unless the newsletter has the
	// address, with their created events, the events' deliveries and, for pending ones,
	// confirmation emails. It returns the counts, and whether it queued a webhook delivery
	// when the engine knows.
	importBatch(ctx context.Context, tx bun.IDB, b importBatch) (counts batchCounts, delivering bool, err error)
	// stageBulk stores, in tx, the ids of nl's subscribers that target selects now as the
	// targets of bulk action id (bulk_action_targets), numbered from 1 (on PostgreSQL in the
	// order its scan meets them: no sort, and batches that walk the table in its physical
	// order), in one INSERT … SELECT, and returns how many (docs/api-contract.md §20.2:
	// matched).
	stageBulk(ctx context.Context, tx bun.IDB, id, nl uuid.UUID, target model.BulkTarget) (matched int64, err error)
	// bulkBatch applies b's change to the targets numbered After+1 to Last of b.Action, in
	// tx, and removes those targets (BulkActions.Batch): each subscriber still in the
	// newsletter whose change gives another result (within the limits of
	// docs/api-contract.md §19.1) is changed as the single operation would change it, with its
	// event and the event's webhook deliveries in the bulk lane and, for unsubscribe, its
	// unsent confirmation emails cancelled and its links retired. It returns how many targets
	// it handled and changed, and whether it queued a webhook delivery when the engine knows.
	bulkBatch(ctx context.Context, tx bun.IDB, b bulkBatch) (counts bulkCounts, delivering bool, err error)

	// claimEmails and claimDeliveries lease due work to one worker (Outbox.Claim,
	// Deliveries.Claim) without waiting on another worker's claim. claimEmails takes the
	// emails of one lane: the interactive one's oldest due first, the bulk one's in turns
	// across newsletters (each one's oldest due, then each one's second, …); a claimed
	// endpoint's deliveries come interactive first.
	claimEmails(ctx context.Context, db bun.IDB, now time.Time, lane outbox.Lane, limit int, lease time.Duration) ([]claimedRow, error)
	claimDeliveries(ctx context.Context, db bun.IDB, now time.Time, c deliveryClaim) ([]claimRow, error)

	// lockEmailKeys makes transactions that write the same email keys of nl wait for each
	// other until commit, the keys taken in the order given (sorted by the caller): a new
	// email nobody holds yet (Subscribers.Update), the suppression check and the suppressions
	// themselves (docs/api-contract.md §13). A transaction holds a bounded number of locks
	// however many keys it locks (PostgreSQL: 64 buckets a newsletter, lock_email_keys).
	lockEmailKeys(ctx context.Context, tx bun.IDB, nl uuid.UUID, keys []string) error
	// lockIdempotencyKey takes, in the transaction tx of Idempotency.Run, the right to run
	// the request of (nl, key) until tx ends, or fails with model.ErrIdempotencyInUse while
	// another request with the key runs. A request with the key that finished first is
	// caught by the record's insert (Idempotency.Run), on both engines.
	lockIdempotencyKey(ctx context.Context, tx bun.IDB, nl uuid.UUID, key string) error

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

// creation is one subscriber to create (engine.create): the values of its row; its created
// event, whose newsletter and subscriber are the row's; its confirmation email when MailID
// is not nil, due at UpdatedAt; and, for the suppression check (docs/api-contract.md §13), the
// address's key, the one store.lockEmails locks (lockEmailKeys), and the hashes an entry of
// the list may hold for it (model.EmailHashes: its own key's, then its 1.2 key's, the first
// again when they are the same), its own preferred.
type creation struct {
	ID, NewsletterID            uuid.UUID
	Email, EmailKey             string
	FirstName, LastName, Status string
	CreatedAt, UpdatedAt        time.Time
	Event                       eventRow
	LockKey                     string
	EmailHash, LegacyHash       []byte
	MailID                      *uuid.UUID
	MailTraceparent             string
	Attributes                  string   // model.Attributes.JSON
	Tags                        []string // sorted, without duplicates
}

// renaming is a change of a subscriber's names (engine.rename): the subscriber, the values
// read that it must still hold (email, names, status and update time), its new names and
// update time, and its updated event.
type renaming struct {
	NewsletterID, ID                   uuid.UUID
	Email, FirstName, LastName, Status string
	UpdatedAt                          time.Time
	NewFirstName, NewLastName          string
	NewUpdatedAt                       time.Time
	Event                              eventRow
}

// retagging is a change of a subscriber's tags (engine.changeTags): the newsletter's subscriber
// ID, the tags Change adds and removes, at Now, with its event's traceparent and source, and
// that source as the JSON object model.NewEvent writes.
type retagging struct {
	NewsletterID, ID uuid.UUID
	Change           model.TagsChange
	Now              time.Time
	Traceparent      string
	Source           model.EventSource
	SourceJSON       string
}

// subscriberValues is a subscriber's row as an engine reads it to hand it back
// (engine.changeTags) or to write its event (SQLite's import batch), its attributes and tags
// in the stores' column types, which read either engine's forms.
type subscriberValues struct {
	ID           uuid.UUID        `bun:"id"`
	NewsletterID uuid.UUID        `bun:"newsletter_id"`
	Email        string           `bun:"email"`
	FirstName    string           `bun:"first_name"`
	LastName     string           `bun:"last_name"`
	Status       string           `bun:"status"`
	CreatedAt    time.Time        `bun:"created_at"`
	UpdatedAt    time.Time        `bun:"updated_at"`
	Attributes   attributesColumn `bun:"attributes"`
	Tags         tagsColumn       `bun:"tags"`
}

// model is the subscriber of v, as the stores' rows give it (subscriberRow.toModel).
func (v subscriberValues) model() model.Subscriber {
	return model.Subscriber{ID: v.ID, NewsletterID: v.NewsletterID, Email: v.Email, FirstName: v.FirstName,
		LastName: v.LastName, Status: model.Status(v.Status), CreatedAt: v.CreatedAt.UTC(), UpdatedAt: v.UpdatedAt.UTC(),
		Attributes: v.Attributes.model(), Tags: v.Tags.model()}
}

// staging is an import to stage (engine.stageImport): its id; the rows next yields, validated
// and numbered from 1 (io.EOF ends them), which the engine stores in import_rows; and the
// store's writes of the import's own row. insert stores it, hidden from the API while
// uploading (when the engine stages in several transactions); alive records that rows still
// arrive (an upload SweepUploads leaves alone); finish marks the duplicates and completes it
// with its row count; drop removes it with its rows.
type staging struct {
	id     uuid.UUID
	next   func() (stagedRow, error)
	insert func(ctx context.Context, db bun.IDB, uploading bool) error
	alive  func(ctx context.Context, db bun.IDB) error
	finish func(ctx context.Context, db bun.IDB, rows int64) error
	drop   func(ctx context.Context) error
}

// stagedRow is one row of an import, validated and typed at the upload: a valid row has its
// address (as given, its key, and the hashes an entry of the suppression list may hold for it:
// model.EmailHashes), names and status; an invalid one only its errors (the JSON object of its
// field messages). Duplicate marks a valid row whose address an earlier valid row of the file
// has (engine.markDuplicates). Data is a row staged by an older version as uploaded, still to
// be validated (Imports.Batch); nil otherwise.
type stagedRow struct {
	bun.BaseModel `bun:"table:import_rows"`

	ImportID   uuid.UUID `bun:"import_id,type:uuid"`
	RowNo      int64     `bun:"row_no"`
	Data       *string   `bun:"data"`
	Email      string    `bun:"email,nullzero"`
	EmailKey   string    `bun:"email_key,nullzero"`
	EmailHash  []byte    `bun:"email_hash,nullzero"`
	LegacyHash []byte    `bun:"legacy_hash,nullzero"`
	FirstName  string    `bun:"first_name"`
	LastName   string    `bun:"last_name"`
	Status     string    `bun:"status,nullzero"`
	Errors     string    `bun:"errors,nullzero"`
	Duplicate  bool      `bun:"duplicate"`
	// Extra is an NDJSON line's attributes and tags (docs/api-contract.md §19.2), as
	// model.SubscriberExtrasJSON writes them; "" when it has neither.
	Extra string `bun:"extra,nullzero"`
}

// importBatch is one batch of an import (engine.importBatch): the staged rows numbered After+1
// to Last of Import into Newsletter, at Now, with the events' traceparent (the batch's span)
// and source (the upload's key), and that source as the JSON object model.NewEvent writes.
type importBatch struct {
	Import, Newsletter uuid.UUID
	After, Last        int64
	Now                time.Time
	Traceparent        string
	Source             model.EventSource
	SourceJSON         string
}

// bulkBatch is one batch of a bulk action (engine.bulkBatch): its targets numbered After+1 to
// Last, in Newsletter, changed by Change at Now, with the events' traceparent (the batch's
// span) and source (the request's key), and that source as the JSON object model.NewEvent
// writes.
type bulkBatch struct {
	Action, Newsletter uuid.UUID
	After, Last        int64
	Now                time.Time
	Traceparent        string
	Source             model.EventSource
	SourceJSON         string
	Change             model.BulkChange
}

// bulkCounts are what a bulk action's batch counts: the targets it handled, and of them the
// subscribers it changed.
type bulkCounts struct {
	Processed int64 `bun:"processed"`
	Changed   int64 `bun:"changed"`
}

// batchCounts are what a batch's statements count; existing is what remains of processed.
type batchCounts struct {
	Processed  int64 `bun:"processed"`
	Invalid    int64 `bun:"invalid"`
	Suppressed int64 `bun:"suppressed"`
	Created    int64 `bun:"created"`
	Pending    int64 `bun:"pending"`
}

// The event log as the engines write it (engine.insertEvents, and the writes of one statement
// that record their event).

// eventRow is one row of the append-only event log.
type eventRow struct {
	bun.BaseModel `bun:"table:subscriber_events"`

	ID           uuid.UUID `bun:"id,pk,type:uuid"`
	NewsletterID uuid.UUID `bun:"newsletter_id,type:uuid"`
	SubscriberID uuid.UUID `bun:"subscriber_id,type:uuid"`
	Type         string    `bun:"type"`
	Payload      string    `bun:"payload"`
	Traceparent  string    `bun:"traceparent"`
	CreatedAt    time.Time `bun:"created_at"`
}

// queueDeliveriesFrom queues one delivery per event of ev (a set of id, newsletter_id, type and
// created_at) and enabled endpoint of its newsletter subscribed to its type, up to the
// engine's test of an endpoint's events (a JSON array of type names): see queueDeliveriesSQL
// (pg.go) and eventMatchSQLite (sqlite.go). The deliveries are interactive (outbox.Lane);
// queueDeliveriesIn queues them in another lane.
const queueDeliveriesFrom = queueDeliveriesHead + "0" + queueDeliveriesTail

const (
	queueDeliveriesHead = `INSERT INTO webhook_deliveries
    (endpoint_id, event_id, lane, state, attempts, next_attempt_at, last_error, last_status, created_at, updated_at)
SELECT w.id, ev.id, `
	queueDeliveriesTail = `, 'pending', 0, ev.created_at, '', 0, ev.created_at, ev.created_at
FROM ev JOIN webhook_endpoints AS w
    ON w.newsletter_id = ev.newsletter_id AND w.status = 'enabled'
    AND `
)

// queueDeliveriesIn is queueDeliveriesFrom with the deliveries in lane.
func queueDeliveriesIn(lane outbox.Lane) string {
	return queueDeliveriesHead + strconv.Itoa(int(lane)) + queueDeliveriesTail
}

// The claims of the workers (engine.claimEmails, engine.claimDeliveries): what they return,
// and what both engines' statements share.

// claimedRow is a claimed outbox row with what the email needs.
type claimedRow struct {
	ID             uuid.UUID `bun:"id,type:uuid"`
	NewsletterID   uuid.UUID `bun:"newsletter_id,type:uuid"`
	SubscriberID   uuid.UUID `bun:"subscriber_id,type:uuid"`
	Kind           string    `bun:"kind"`
	Attempts       int       `bun:"attempts"`
	Unanswered     int       `bun:"unanswered"`
	Traceparent    string    `bun:"traceparent"`
	CreatedAt      time.Time `bun:"created_at"`
	Email          string    `bun:"email"`
	FirstName      string    `bun:"first_name"`
	LastName       string    `bun:"last_name"`
	NewsletterName string    `bun:"newsletter_name"`
}

// claimRow is one due delivery of a claimed endpoint, with what its request needs.
type claimRow struct {
	EndpointID  uuid.UUID   `bun:"endpoint_id,type:uuid"`
	URL         string      `bun:"url"`
	Secret      string      `bun:"secret"`
	EventID     uuid.UUID   `bun:"event_id,type:uuid"`
	Attempts    int         `bun:"attempts"`
	Lane        outbox.Lane `bun:"lane"`
	Type        string      `bun:"type"`
	Payload     string      `bun:"payload"`
	Traceparent string      `bun:"traceparent"`
}

// dueEndpoint is the condition of an endpoint a claim may take: enabled, not leased, with a
// due delivery in either lane. The test reads the endpoint's first pending delivery of each
// lane from webhook_deliveries_endpoint_due_idx, one probe per lane and endpoint; an EXISTS
// here becomes a semi-join that PostgreSQL plans as a scan of the whole outbox, whose
// delivered rows stay until autovacuum comes, up to a minute of churn on every claim.
const dueEndpoint = `w.status = 'enabled' AND w.busy_until <= ?0 AND ((
    SELECT d.next_attempt_at FROM webhook_deliveries AS d
    WHERE d.endpoint_id = w.id AND d.state = 'pending' AND d.lane = 0
    ORDER BY d.next_attempt_at LIMIT 1) <= ?0 OR (
    SELECT d.next_attempt_at FROM webhook_deliveries AS d
    WHERE d.endpoint_id = w.id AND d.state = 'pending' AND d.lane = 1
    ORDER BY d.next_attempt_at LIMIT 1) <= ?0)`

// newsletterLeasedC and newsletterLeasedW count the endpoints of the newsletter of the
// endpoint row c or w that are leased now (?0).
const (
	newsletterLeasedC = `(SELECT count(*) FROM webhook_endpoints AS b
        WHERE b.newsletter_id = c.newsletter_id AND b.status = 'enabled' AND b.busy_until > ?0)`
	newsletterLeasedW = `(SELECT count(*) FROM webhook_endpoints AS b
        WHERE b.newsletter_id = w.newsletter_id AND b.status = 'enabled' AND b.busy_until > ?0)`
)

// claimableEndpoints is the query of the ids of the endpoints a claim takes (the arguments of
// deliveryClaim.args): up to ?1 due endpoints (dueEndpoint), the one claimed longest ago
// first, such that no newsletter holds more than ?4 leased at once. Among the first ?5 due
// endpoints of newsletters below their bound (the only rows it locks, FOR NO KEY UPDATE SKIP
// LOCKED: see pgEngine.claimDeliveries; SQLite runs it without), each newsletter gets what
// its bound leaves. A newsletter at its bound takes no candidate's place, so its endpoints,
// first in round-robin order since they are not claimed, cannot hide the others'.
const claimableEndpoints = `
    SELECT r.id FROM (
        SELECT c.id, c.last_claimed_at,
            row_number() OVER (PARTITION BY c.newsletter_id ORDER BY c.last_claimed_at) + ` + newsletterLeasedC + ` AS n
        FROM (
            SELECT w.id, w.newsletter_id, w.last_claimed_at FROM webhook_endpoints AS w
            WHERE ` + dueEndpoint + ` AND ` + newsletterLeasedW + ` < ?4
            ORDER BY w.last_claimed_at
            LIMIT ?5 FOR NO KEY UPDATE SKIP LOCKED
        ) AS c
    ) AS r
    WHERE r.n <= ?4
    ORDER BY r.last_claimed_at
    LIMIT ?1`

// deliveryClaim is what one claim asks for (Deliveries.Claim).
type deliveryClaim struct {
	endpoints, perEndpoint, perNewsletter int
	lease                                 time.Duration
}

// args are the claim's query arguments: ?0 now, ?1 endpoints, ?2 deliveries per endpoint, ?3
// the lease's end, ?4 endpoints per newsletter, ?5 candidates looked at (enough that one
// newsletter's endpoints, up to model.MaxWebhooks, cannot fill them), ?6 when the claim goes
// stale without a heartbeat.
func (c deliveryClaim) args(now time.Time) []any {
	return []any{now, c.endpoints, c.perEndpoint, now.Add(c.lease), c.perNewsletter, c.endpoints + model.MaxWebhooks,
		now.Add(outbox.StaleAfter(c.lease))}
}

// pgTextArray writes tags as a PostgreSQL array literal, each element quoted: {"a","b c"}.
func pgTextArray(tags []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, t := range tags {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for _, r := range t {
			if r == '"' || r == '\\' {
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// tagsJSON writes tags as SQLite stores them: a JSON array, nothing escaped that JSON does
// not require.
func tagsJSON(tags []string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode([]string(tagsOf(tags))) // strings always encode
	return strings.TrimSuffix(b.String(), "\n")
}

// filteredPage is the page part of a filtered list (both engines' listFiltered…): the WHERE
// clause where of the matches, narrowed to those after q's cursor when it has one, its LIMIT
// (and OFFSET without a cursor) clause, and the arguments of both after args.
func filteredPage(where string, args []any, q model.ListQuery) (page, limit string, pageArgs []any) {
	page, pageArgs = where, slices.Clone(args)
	if q.After != nil {
		page += " AND (created_at, id) < (?, ?)"
		pageArgs = append(pageArgs, q.After.CreatedAt.UTC(), q.After.ID)
	}
	pageArgs = append(pageArgs, q.Limit+1)
	limit = " LIMIT ?"
	if q.After == nil {
		limit += " OFFSET ?"
		pageArgs = append(pageArgs, q.Offset())
	}
	return page, limit, pageArgs
}

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
