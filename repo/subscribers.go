package repo

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"
	"go.opentelemetry.io/otel/propagation"

	"github.com/subscriberd/subscriberd/model"
)

type subscriberRow struct {
	bun.BaseModel `bun:"table:subscribers"`

	ID           uuid.UUID `bun:"id,pk,type:uuid"`
	NewsletterID uuid.UUID `bun:"newsletter_id,type:uuid"`
	Email        string    `bun:"email"`
	EmailKey     string    `bun:"email_key"`
	FirstName    string    `bun:"first_name"`
	LastName     string    `bun:"last_name"`
	Status       string    `bun:"status"`
	CreatedAt    time.Time `bun:"created_at"`
	UpdatedAt    time.Time `bun:"updated_at"`
}

func (r *subscriberRow) toModel() model.Subscriber {
	return model.Subscriber{
		ID:           r.ID,
		NewsletterID: r.NewsletterID,
		Email:        r.Email,
		FirstName:    r.FirstName,
		LastName:     r.LastName,
		Status:       model.Status(r.Status),
		CreatedAt:    r.CreatedAt.UTC(),
		UpdatedAt:    r.UpdatedAt.UTC(),
	}
}

type outboxRow struct {
	bun.BaseModel `bun:"table:email_outbox"`

	ID            uuid.UUID  `bun:"id,pk,type:uuid"`
	NewsletterID  uuid.UUID  `bun:"newsletter_id,type:uuid"`
	SubscriberID  uuid.UUID  `bun:"subscriber_id,type:uuid"`
	Kind          string     `bun:"kind"`
	State         string     `bun:"state"`
	Attempts      int        `bun:"attempts"`
	NextAttemptAt time.Time  `bun:"next_attempt_at"`
	LastError     string     `bun:"last_error"`
	Traceparent   string     `bun:"traceparent"`
	CreatedAt     time.Time  `bun:"created_at"`
	UpdatedAt     time.Time  `bun:"updated_at"`
	SentAt        *time.Time `bun:"sent_at"`
}

// Outbox states.
const (
	StatePending   = "pending"
	StateCancelled = "cancelled"
)

// Subscribers stores subscribers and queues their confirmation emails.
type Subscribers struct {
	store
}

// NewSubscribers returns the subscriber store on db.
func NewSubscribers(db *bun.DB) *Subscribers {
	return &Subscribers{store: newStore(db)}
}

func (s *Subscribers) newRow(nl uuid.UUID, in model.NewSubscriber, now time.Time) subscriberRow {
	return subscriberRow{
		ID:           uuid.Must(uuid.NewV7()),
		NewsletterID: nl,
		Email:        in.Email,
		EmailKey:     model.EmailKey(in.Email),
		FirstName:    in.FirstName,
		LastName:     in.LastName,
		Status:       string(in.Status),
		CreatedAt:    now,
		UpdatedAt:    now,
	}
}

// Create stores one subscriber; a pending one gets its confirmation email queued in the same
// transaction. An email already in the newsletter gives model.ErrEmailTaken.
func (s *Subscribers) Create(ctx context.Context, nl uuid.UUID, in model.NewSubscriber) (model.Subscriber, error) {
	row := s.newRow(nl, in, s.now())
	src := model.SourceFrom(ctx)
	var delivering bool
	pending := in.Status == model.StatusPending
	insert := func(ctx context.Context, db bun.IDB) error {
		// docs/api-contract.md §13: a suppressed address, before the uniqueness rule.
		if err := CheckNotSuppressed(ctx, db, nl, row.Email); err != nil {
			return err
		}
		if !pending && !isSQLite(db) {
			stored, err := s.insertWithEventPG(ctx, db, &row,
				model.NewEvent(model.EventCreated, row.toModel(), nil, src, row.CreatedAt))
			if err == nil && !stored {
				err = fmt.Errorf("%w", model.ErrEmailTaken)
			}
			return err
		}
		res, err := db.NewInsert().Model(&row).
			On("CONFLICT (newsletter_id, email_key) DO NOTHING").Exec(ctx)
		if err != nil {
			return translate(err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("%w", model.ErrEmailTaken)
		}
		// docs/api-contract.md §10.1: the event is part of the change.
		delivering, err = recordEvents(ctx, db, []model.Event{
			model.NewEvent(model.EventCreated, row.toModel(), nil, src, row.CreatedAt)})
		if err != nil {
			return err
		}
		if in.Status == model.StatusPending {
			return queueConfirmations(ctx, db, []subscriberRow{row})
		}
		return nil
	}
	// Always a transaction: the suppression check's lock must hold until the insert commits.
	if err := s.atomically(ctx, true, insert); err != nil {
		return model.Subscriber{}, translate(err)
	}
	if pending {
		emailsQueued(s.db)
	}
	deliveriesQueued(s.db, delivering)
	return row.toModel(), nil
}

// atomically runs fn, whose statements must take effect together or not at all: in a
// transaction when needTx is set or on SQLite (where runInTx retries a busy database), else
// straight on the database, for fn's single statement.
func (s *Subscribers) atomically(ctx context.Context, needTx bool, fn func(context.Context, bun.IDB) error) error {
	// In an idempotent request, its transaction (Idempotency.Run).
	if joined, err := runJoined(ctx, s.db, func(ctx context.Context, tx bun.Tx) error { return fn(ctx, tx) }); joined {
		return err
	}
	if needTx || s.sqlite {
		return runInTx(ctx, s.db, func(ctx context.Context, tx bun.Tx) error { return fn(ctx, tx) })
	}
	return retry(ctx, func(ctx context.Context) error { return fn(ctx, s.db) })
}

// CreateMany stores 1 to 100 subscribers all or nothing, in one transaction with one multi-row
// insert, and queues a confirmation email for each pending one. When any email already exists
// in the newsletter nothing is stored and the error is a *model.EmailTakenError naming the
// input positions that collided.
func (s *Subscribers) CreateMany(ctx context.Context, nl uuid.UUID, in []model.NewSubscriber) ([]model.Subscriber, error) {
	now := s.now()
	rows := make([]subscriberRow, len(in))
	for i := range in {
		rows[i] = s.newRow(nl, in[i], now)
	}
	// Most bulks collide with nothing. "ON CONFLICT DO NOTHING RETURNING email_key", which names
	// the colliding rows, costs PostgreSQL clearly more per 100 rows than an insert without
	// RETURNING. So an insert that only counts what it stored goes first;
	// only when it stored fewer rows than given (and rolls back) does the insert that names the
	// taken emails run. Neither raises a unique violation, so a client's duplicate never makes
	// the database server log the statement, addresses and all.
	// In an idempotent request's transaction (Idempotency.Run) the first insert's rows could
	// not be undone on their own, so the insert that names conflicts goes first there.
	_, joined := joinTx(ctx, s.db)
	pending, delivering, err := s.insertMany(ctx, rows, joined)
	if errors.Is(err, model.ErrEmailTaken) && !errors.Is(err, model.ErrEmailSuppressed) && !joined {
		pending, delivering, err = s.insertMany(ctx, rows, true)
	}
	if err != nil {
		return nil, translate(err)
	}
	if len(pending) > 0 {
		emailsQueued(s.db)
	}
	deliveriesQueued(s.db, delivering)
	out := make([]model.Subscriber, len(rows))
	for i := range rows {
		out[i] = rows[i].toModel()
	}
	return out, nil
}

// TakenEmails tells which of emails the newsletter already has, keyed by model.EmailKey.
func (s *Subscribers) TakenEmails(ctx context.Context, nl uuid.UUID, emails []string) (map[string]bool, error) {
	keys := make([]string, len(emails))
	for i, e := range emails {
		keys[i] = model.EmailKey(e)
	}
	var found []string
	if err := s.db.NewSelect().Model((*subscriberRow)(nil)).Column("email_key").
		Where("newsletter_id = ? AND email_key IN (?)", nl, bun.List(keys)).Scan(ctx, &found); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, translate(err)
	}
	taken := make(map[string]bool, len(found))
	for _, k := range found {
		taken[k] = true
	}
	return taken, nil
}

// insertMany inserts rows, records their events (in one statement) and queues the pending
// ones' confirmations in one transaction, and returns the pending rows and whether webhook
// deliveries were queued. A taken email fails it with model.ErrEmailTaken, or, when
// nameConflicts is set, with a *model.EmailTakenError naming every row that collided.
func (s *Subscribers) insertMany(ctx context.Context, rows []subscriberRow, nameConflicts bool) ([]subscriberRow, bool, error) {
	// The rows go in in email-key order, whatever the client's order: two bulks sharing emails
	// then wait for each other's rows in the same order and never deadlock (each insert waits,
	// on a key the other holds, only for keys that come before all it holds itself).
	sorted := slices.Clone(rows)
	slices.SortFunc(sorted, func(a, b subscriberRow) int { return strings.Compare(a.EmailKey, b.EmailKey) })
	var pending []subscriberRow
	var delivering bool
	src := model.SourceFrom(ctx)
	err := runInTx(ctx, s.db, func(ctx context.Context, tx bun.Tx) error {
		pending = nil
		// docs/api-contract.md §13: suppressed addresses, before the uniqueness rule.
		emails := make([]string, len(rows))
		for i := range rows {
			emails[i] = rows[i].Email
		}
		if err := CheckNotSuppressed(ctx, tx, rows[0].NewsletterID, emails...); err != nil {
			var se *model.SuppressedError
			if errors.As(err, &se) {
				se.Bulk = true
			}
			return err
		}
		if !nameConflicts {
			res, err := tx.NewInsert().Model(&sorted).On("CONFLICT (newsletter_id, email_key) DO NOTHING").Exec(ctx)
			if err != nil {
				return translate(err)
			}
			if n, _ := res.RowsAffected(); n != int64(len(sorted)) {
				return fmt.Errorf("%w", model.ErrEmailTaken)
			}
		} else if err := insertNamingConflicts(ctx, tx, sorted, rows); err != nil {
			return err
		}
		evs := make([]model.Event, len(rows))
		for i, r := range rows {
			if r.Status == string(model.StatusPending) {
				pending = append(pending, r)
			}
			evs[i] = model.NewEvent(model.EventCreated, r.toModel(), nil, src, r.CreatedAt)
		}
		var err error
		if delivering, err = recordEvents(ctx, tx, evs); err != nil {
			return err
		}
		return queueConfirmations(ctx, tx, pending)
	})
	return pending, delivering, err
}

// insertNamingConflicts inserts sorted (rows in email-key order), skipping those whose email is
// taken; if any was skipped it returns a *model.EmailTakenError naming them by their position in
// rows, the client's order (and the caller's transaction rolls back). Rows are matched on the
// returned natural key, never by position.
func insertNamingConflicts(ctx context.Context, tx bun.Tx, sorted, rows []subscriberRow) error {
	var inserted []string
	if err := tx.NewInsert().Model(&sorted).
		On("CONFLICT (newsletter_id, email_key) DO NOTHING").
		Returning("email_key").Scan(ctx, &inserted); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return translate(err)
	}
	if len(inserted) == len(rows) {
		return nil // the colliding rows went away meanwhile
	}
	got := make(map[string]bool, len(inserted))
	for _, k := range inserted {
		got[k] = true
	}
	taken := &model.EmailTakenError{}
	for i, r := range rows {
		if !got[r.EmailKey] {
			taken.Indexes = append(taken.Indexes, i)
		}
	}
	return taken
}

// List returns one page of a newsletter's subscribers, newest first, and the total that
// matches the filter. Page and total come from one statement, so they agree (on both stores).
//
// It returns up to q.Limit+1 subscribers: one more than the page when another follows it in
// the order, so that the caller knows whether there is a next page (docs/api-contract.md
// §9.2). With q.After the page starts after that position (keyset: every such page costs what
// the first costs); with q.Email it holds the subscriber with that address, if any. A page
// read by position leaves UpdatedAt zero: no answer shows it, and every timestamp of every row
// is text the driver parses.
func (s *Subscribers) List(ctx context.Context, nl uuid.UUID, q model.ListQuery) ([]model.Subscriber, int64, error) {
	if q.Email != "" {
		return s.lookupEmail(ctx, nl, q)
	}
	type pageRow struct {
		Total int64 `bun:"total"`
		subscriberRow
	}
	// The total is the sum of the newsletter's counter rows (see the migration), read in the
	// same statement, hence the same snapshot, as the page.
	var rows []pageRow
	var err error
	var afterTime, afterID any
	if q.After != nil {
		afterTime, afterID = q.After.CreatedAt.UTC(), q.After.ID
	}
	switch {
	case s.sqlite:
		var statusFilter any
		if q.Status != "" {
			statusFilter = string(q.Status)
		}
		stmt := listSQLite
		if q.After != nil {
			stmt = listAfterSQLite
		}
		err = s.db.NewRaw(stmt, nl, statusFilter, q.Limit+1, q.Offset(), afterTime, afterID).Scan(ctx, &rows)
	case q.After == nil && q.Offset() > listDirectMaxOffset:
		// Not prepared: see listDeepPostgres.
		err = s.db.NewRaw(listDeepPostgres(q.Status), nl, string(q.Status), q.Limit+1, q.Offset()).Scan(ctx, &rows)
	default:
		st, args := listPostgres(nl, q)
		err = s.queryRows(ctx, s.db, st, &rows, args...)
	}
	if err != nil {
		return nil, 0, translate(err)
	}
	if len(rows) == 0 {
		return nil, 0, nil
	}
	// The first row carries the total: on PostgreSQL it is a row of its own, with no id; on
	// SQLite every row has it, and an empty page is that one row with no id.
	out := make([]model.Subscriber, 0, len(rows))
	for i := range rows {
		if rows[i].ID == uuid.Nil {
			continue
		}
		rows[i].NewsletterID = nl // not read: every row is the newsletter's
		out = append(out, rows[i].toModel())
	}
	return out, rows[0].Total, nil
}

// listDirectMaxOffset is the largest offset at which a page is read straight from the list
// index. Beyond it, the page's ids come from an index-only walk and only those rows are read,
// which is cheaper to execute but costlier to plan: on the bench's data the two cost the same
// a little beyond this offset.
const listDirectMaxOffset = 2000

// listPostgres is the statement of a list page that is not deep (see listDeepPostgres),
// prepared (see statement), and its arguments: the counter sum as one row whose id is NULL (it
// sorts first), and the page, in one statement and so in one snapshot. A UNION ALL plans in
// about half the time a join of the two did. Separate statements with and without the status
// filter save the planner an "IS NULL OR". Each statement has its own
// arguments, since every parameter must appear in its text. Their spans are named "SELECT", as
// bun named the raw statements.
func listPostgres(nl uuid.UUID, q model.ListQuery) (*statement, []any) {
	limit := q.Limit + 1
	switch {
	case q.After != nil && q.Status == "":
		return listAfterPostgres, []any{nl, limit, q.After.CreatedAt.UTC(), q.After.ID}
	case q.After != nil:
		return listAfterStatusPostgres, []any{nl, string(q.Status), limit, q.After.CreatedAt.UTC(), q.After.ID}
	case q.Status == "":
		return listFirstPostgres, []any{nl, limit, q.Offset()}
	}
	return listFirstStatusPostgres, []any{nl, string(q.Status), limit, q.Offset()}
}

// The prepared list statements. $1 is the newsletter id and, where filtered, $2 the status;
// then the limit, and the offset or the created_at and id of the position a keyset page starts
// after. A keyset page reads the list index from that position on, like a first page.
const (
	listTotalPostgres = `SELECT coalesce(sum(n), 0)::bigint AS total, NULL::uuid AS id, NULL AS email,
    NULL AS first_name, NULL AS last_name, NULL AS status, NULL::timestamptz AS created_at
FROM subscriber_counts WHERE newsletter_id = $1`
	listOrderPostgres = `
ORDER BY created_at DESC, id DESC`
)

var (
	listFirstPostgres = listStatement(listTotalPostgres + `
UNION ALL (
    SELECT NULL, id, email, first_name, last_name, status, created_at FROM subscribers
    WHERE newsletter_id = $1
    ORDER BY created_at DESC, id DESC LIMIT $2 OFFSET $3
)` + listOrderPostgres)

	listFirstStatusPostgres = listStatement(listTotalPostgres + ` AND status = $2
UNION ALL (
    SELECT NULL, id, email, first_name, last_name, status, created_at FROM subscribers
    WHERE newsletter_id = $1 AND status = $2
    ORDER BY created_at DESC, id DESC LIMIT $3 OFFSET $4
)` + listOrderPostgres)

	listAfterPostgres = listStatement(listTotalPostgres + `
UNION ALL (
    SELECT NULL, id, email, first_name, last_name, status, created_at FROM subscribers
    WHERE newsletter_id = $1 AND (created_at, id) < ($3, $4)
    ORDER BY created_at DESC, id DESC LIMIT $2
)` + listOrderPostgres)

	listAfterStatusPostgres = listStatement(listTotalPostgres + ` AND status = $2
UNION ALL (
    SELECT NULL, id, email, first_name, last_name, status, created_at FROM subscribers
    WHERE newsletter_id = $1 AND status = $2 AND (created_at, id) < ($4, $5)
    ORDER BY created_at DESC, id DESC LIMIT $3
)` + listOrderPostgres)
)

func listStatement(text string) *statement { return newStatement("SELECT", "", text) }

// listDeepPostgres is the statement of a page beyond listDirectMaxOffset, with or without the
// status filter: the page's ids come from an index-only walk and only those rows are read. Its
// arguments: ?0 newsletter id, ?1 status (only where filtered), ?2 limit, ?3 offset.
//
// It is not prepared, but sent through bun with its values inlined and planned on every call:
// its generic plan (which a prepared one would run, see statement) reads the page's rows by
// a sequential scan of every newsletter's subscribers and a hash join, 17-23 ms instead of
// the custom plan's nested loop over the page's 26 ids (100k subscribers, offsets 50,000 to
// 95,000).
func listDeepPostgres(status model.Status) string {
	if status == "" {
		return listDeepAllPostgres
	}
	return listDeepStatusPostgres
}

const (
	listDeepTotalPostgres = `SELECT coalesce(sum(n), 0)::bigint AS total, NULL::uuid AS id, NULL AS email,
    NULL AS first_name, NULL AS last_name, NULL AS status, NULL::timestamptz AS created_at
FROM subscriber_counts WHERE newsletter_id = ?0`

	listDeepAllPostgres = listDeepTotalPostgres + `
UNION ALL
SELECT NULL, s.id, s.email, s.first_name, s.last_name, s.status, s.created_at FROM (
    SELECT id FROM subscribers
    WHERE newsletter_id = ?0
    ORDER BY created_at DESC, id DESC LIMIT ?2 OFFSET ?3
) AS p JOIN subscribers AS s USING (id)` + listOrderPostgres

	listDeepStatusPostgres = listDeepTotalPostgres + ` AND status = ?1
UNION ALL
SELECT NULL, s.id, s.email, s.first_name, s.last_name, s.status, s.created_at FROM (
    SELECT id FROM subscribers
    WHERE newsletter_id = ?0 AND status = ?1
    ORDER BY created_at DESC, id DESC LIMIT ?2 OFFSET ?3
) AS p JOIN subscribers AS s USING (id)` + listOrderPostgres
)

// listSQLite reads the total and the page in one statement (SQLite lacks LATERAL, so the
// page is a plain subquery). One statement reads one snapshot, so page and total agree.
const listSQLite = `
SELECT t.total, s.id, s.email, s.first_name, s.last_name, s.status, s.created_at
FROM (SELECT coalesce(sum(n), 0) AS total FROM subscriber_counts
      WHERE newsletter_id = ?0 AND (?1 IS NULL OR status = ?1)) AS t
LEFT JOIN (
    SELECT s.id, s.email, s.first_name, s.last_name, s.status, s.created_at FROM (
        SELECT id FROM subscribers
        WHERE newsletter_id = ?0 AND (?1 IS NULL OR status = ?1)
        ORDER BY created_at DESC, id DESC
        LIMIT ?2 OFFSET ?3
    ) AS p JOIN subscribers AS s USING (id)
) AS s ON true
ORDER BY s.created_at DESC, s.id DESC`

// listAfterSQLite is listSQLite for a keyset page: the rows after (?4, ?5) in the order.
const listAfterSQLite = `
SELECT t.total, s.id, s.email, s.first_name, s.last_name, s.status, s.created_at
FROM (SELECT coalesce(sum(n), 0) AS total FROM subscriber_counts
      WHERE newsletter_id = ?0 AND (?1 IS NULL OR status = ?1)) AS t
LEFT JOIN (
    SELECT s.id, s.email, s.first_name, s.last_name, s.status, s.created_at FROM (
        SELECT id FROM subscribers
        WHERE newsletter_id = ?0 AND (?1 IS NULL OR status = ?1) AND (created_at, id) < (?4, ?5)
        ORDER BY created_at DESC, id DESC
        LIMIT ?2
    ) AS p JOIN subscribers AS s USING (id)
) AS s ON true
ORDER BY s.created_at DESC, s.id DESC`

// lookupEmail is List with an email filter (docs/api-contract.md §9.1): one read of the unique
// index on (newsletter_id, email_key), the cost of a get. The total is 0 or 1, that of the
// filter; the page and the position then apply to that one row.
func (s *Subscribers) lookupEmail(ctx context.Context, nl uuid.UUID, q model.ListQuery) ([]model.Subscriber, int64, error) {
	var row subscriberRow
	var err error
	if s.sqlite {
		err = s.db.NewSelect().Model(&row).Where("newsletter_id = ? AND email_key = ?", nl, model.EmailKey(q.Email)).Scan(ctx)
	} else {
		err = s.queryRow(ctx, s.db, subscriberByEmailPG, &row, nl, model.EmailKey(q.Email))
	}
	if errors.Is(err, sql.ErrNoRows) || err == nil && q.Status != "" && row.Status != string(q.Status) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, translate(err)
	}
	sub := row.toModel()
	switch {
	case q.After != nil && !model.Follows(q.After, sub):
		return nil, 1, nil
	case q.After == nil && q.Offset() > 0:
		return nil, 1, nil
	}
	return []model.Subscriber{sub}, 1, nil
}

// subscriberColumns are subscriberRow's columns, for the prepared statements that read it.
const subscriberColumns = `id, newsletter_id, email, email_key, first_name, last_name, status, created_at, updated_at`

// The prepared reads of one subscriber (see statement): by id, and by email key through the
// unique index. Their spans are named as bun's query builder named them.
var (
	getSubscriberPG = newStatement("SELECT", "subscribers",
		`SELECT `+subscriberColumns+` FROM subscribers WHERE newsletter_id = $1 AND id = $2`)
	subscriberByEmailPG = newStatement("SELECT", "subscribers",
		`SELECT `+subscriberColumns+` FROM subscribers WHERE newsletter_id = $1 AND email_key = $2`)
)

// Get returns one subscriber of the newsletter, or model.ErrNotFound.
func (s *Subscribers) Get(ctx context.Context, nl, id uuid.UUID) (model.Subscriber, error) {
	var row subscriberRow
	var err error
	if s.sqlite { // the builder names the span "SELECT subscribers", as on PostgreSQL
		err = s.db.NewSelect().Model(&row).Where("newsletter_id = ? AND id = ?", nl, id).Scan(ctx)
	} else {
		err = s.queryRow(ctx, s.db, getSubscriberPG, &row, nl, id)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return model.Subscriber{}, fmt.Errorf("%w", model.ErrNotFound)
	}
	if err != nil {
		return model.Subscriber{}, translate(err)
	}
	return row.toModel(), nil
}

// Update applies a patch; what it does to confirmations is model.SubscriberPatch.ConfirmationEffect.
// A new email already used in the newsletter gives model.ErrEmailTaken.
func (s *Subscribers) Update(ctx context.Context, nl, id uuid.UUID, p model.SubscriberPatch) (model.Subscriber, error) {
	if !s.sqlite && p.Email == nil && p.Status == nil {
		if sub, done, err := s.rename(ctx, nl, id, p.Name); done || err != nil {
			return sub, err
		}
	}
	var row subscriberRow
	var queued, delivering bool
	src := model.SourceFrom(ctx)
	err := runInTx(ctx, s.db, func(ctx context.Context, tx bun.Tx) error {
		queued, delivering = false, false
		sel := tx.NewSelect().Model(&row).Where("newsletter_id = ? AND id = ?", nl, id)
		if !s.sqlite { // SQLite's immediate transaction already holds the write lock
			sel = sel.For("UPDATE")
		}
		if p.Email != nil {
			// Lock, in id order, the subscriber and whoever holds the new email now, before
			// writing either: two PUTs swapping two subscribers' emails then queue on the same
			// first row instead of each waiting on the other's unique key (a deadlock). Hold
			// the taken email ourselves, without a unique violation that would log the
			// statement, the address in it, on the database server.
			found, taken, err := s.lockForEmailChange(ctx, tx, nl, id, model.EmailKey(*p.Email))
			switch {
			case err != nil:
				return err
			case !found:
				return fmt.Errorf("%w", model.ErrNotFound)
			case taken:
				// docs/api-contract.md §13: a suppressed address before the uniqueness rule.
				if err := CheckNotSuppressed(ctx, tx, nl, *p.Email); err != nil {
					return err
				}
				return fmt.Errorf("%w", model.ErrEmailTaken)
			}
		}
		err := sel.Scan(ctx)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w", model.ErrNotFound)
		}
		if err != nil {
			return translate(err)
		}
		before := row.toModel()
		// docs/api-contract.md §13: subscribing a suppressed address (a new email, or the
		// status active or pending) changes nothing.
		newEmail := p.Email != nil && model.EmailKey(*p.Email) != model.EmailKey(before.Email)
		if newEmail || (p.Status != nil && *p.Status != model.StatusUnsubscribed) {
			addr := before.Email
			if p.Email != nil {
				addr = *p.Email
			}
			if err := CheckNotSuppressed(ctx, tx, nl, addr); err != nil {
				return err
			}
		}
		retire, queue := p.ConfirmationEffect(before)
		if p.Email != nil {
			row.Email, row.EmailKey = *p.Email, model.EmailKey(*p.Email)
		}
		if p.Name != nil {
			row.FirstName, row.LastName = model.SplitName(*p.Name)
		}
		if p.Status != nil {
			row.Status = string(*p.Status)
		}
		changed := model.Changes(before, row.toModel())
		if len(changed) == 0 && !retire && !queue {
			return nil // the values already there: nothing to write, no event (§10.1)
		}
		row.UpdatedAt = s.now()
		if _, err := tx.NewUpdate().Model(&row).WherePK().
			Column("email", "email_key", "first_name", "last_name", "status", "updated_at").Exec(ctx); err != nil {
			return translate(err)
		}
		if len(changed) > 0 {
			var err error
			delivering, err = recordEvents(ctx, tx, []model.Event{
				model.NewEvent(model.EventUpdated, row.toModel(), changed, src, row.UpdatedAt)})
			if err != nil {
				return err
			}
		}
		if retire {
			if err := retireConfirmations(ctx, tx, row.ID, row.UpdatedAt); err != nil {
				return err
			}
		}
		if queue {
			queued = true
			return queueConfirmations(ctx, tx, []subscriberRow{row})
		}
		return nil
	})
	if err != nil {
		return model.Subscriber{}, translate(err)
	}
	if queued {
		emailsQueued(s.db)
	}
	deliveriesQueued(s.db, delivering)
	return row.toModel(), nil
}

// renameTries is how many times rename reads and writes again when the subscriber changed
// between the two, before it leaves the patch to Update's locking transaction.
const renameTries = 3

// rename applies, on PostgreSQL, a patch that sets at most the name, without a transaction of
// its own: it reads the subscriber, then writes the new name with its event and the event's
// deliveries in one statement that matches only while the row still holds every value it read
// (the values the event records as the subscriber and its previous name). Such a patch has no
// confirmation effect and no email to keep unique, so it needs no lock: two round trips instead
// of a transaction's five. When another change came in between, it reads again; after
// renameTries misses it reports done false, and Update takes the locking path.
func (s *Subscribers) rename(ctx context.Context, nl, id uuid.UUID, name *string) (sub model.Subscriber, done bool, err error) {
	src := model.SourceFrom(ctx)
	err = s.atomically(ctx, false, func(ctx context.Context, db bun.IDB) error {
		for range renameTries {
			var before subscriberRow
			err := s.queryRow(ctx, db, getSubscriberPG, &before, nl, id)
			if errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("%w", model.ErrNotFound)
			}
			if err != nil {
				return err
			}
			row := before
			if name != nil {
				row.FirstName, row.LastName = model.SplitName(*name)
			}
			changed := model.Changes(before.toModel(), row.toModel())
			if len(changed) == 0 {
				sub, done = before.toModel(), true
				return nil // the values already there: nothing to write, no event (§10.1)
			}
			row.UpdatedAt = s.now()
			ev := eventRows(ctx, []model.Event{model.NewEvent(model.EventUpdated, row.toModel(), changed, src, row.UpdatedAt)})[0]
			var n int
			if err := s.queryRow(ctx, db, renameWithEventStmt, &n,
				nl, id, before.Email, before.FirstName, before.LastName, before.Status, before.UpdatedAt,
				row.FirstName, row.LastName, row.UpdatedAt, ev.ID, ev.Type, ev.Payload, ev.Traceparent); err != nil {
				return err
			}
			if n == 1 {
				sub, done = row.toModel(), true
				return nil
			}
		}
		return nil
	})
	if err != nil {
		return model.Subscriber{}, false, translate(err)
	}
	return sub, done, nil
}

// renameWithEventStmt is rename's write, prepared (see statement): $1 and $2 the subscriber,
// $3 to $7 the email, names, status and update time read, $8 to $10 the new names and update
// time, then the event's id, type, payload and traceparent. It returns 1 when the row still
// held what was read and was changed, with its event and deliveries, else 0 and changes
// nothing. Its span is named for its main change, "UPDATE subscribers".
var renameWithEventStmt = newStatement("UPDATE", "subscribers", `WITH s AS (
    UPDATE subscribers SET first_name = $8, last_name = $9, updated_at = $10
    WHERE newsletter_id = $1 AND id = $2 AND email = $3 AND first_name = $4 AND last_name = $5
        AND status = $6 AND updated_at = $7
    RETURNING id, newsletter_id),
ev AS (
    INSERT INTO subscriber_events (id, newsletter_id, subscriber_id, type, payload, traceparent, created_at)
    SELECT $11::uuid, s.newsletter_id, s.id, $12::text, $13::text, $14::text, $10::timestamptz FROM s
    RETURNING id, newsletter_id, type, created_at),
d AS (`+queueDeliveriesSQL+`)
SELECT count(*) FROM s`)

// lockForEmailChange locks (on PostgreSQL; SQLite's transaction holds the write lock already)
// the subscriber id and the newsletter's subscriber whose email key is key, in id order, and
// tells whether the subscriber exists and whether key belongs to another one. A row that
// changed its email while we waited for it is re-read by PostgreSQL and drops out if it no
// longer holds key.
func (s *Subscribers) lockForEmailChange(ctx context.Context, tx bun.Tx, nl, id uuid.UUID, key string) (found, taken bool, err error) {
	if !s.sqlite {
		// Two changes to the same new email (that nobody holds yet, so no row to lock) queue
		// here, on a transaction-scoped advisory lock of the newsletter's key, instead of the
		// second failing on the unique key after the first commits. A hash collision only
		// makes two unrelated changes wait for each other.
		if _, err := tx.NewRaw("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", nl.String()+"/"+key).Exec(ctx); err != nil {
			return false, false, translate(err)
		}
	}
	var ids []uuid.UUID
	err = tx.NewRaw(`SELECT id FROM subscribers
WHERE newsletter_id = ? AND (id = ? OR email_key = ?)
ORDER BY id`+forUpdate(s.sqlite), nl, id, key).Scan(ctx, &ids)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return false, false, translate(err)
	}
	for _, other := range ids {
		if other == id {
			found = true
		} else {
			taken = true
		}
	}
	return found, taken, nil
}

// Unsubscribe sets the subscriber unsubscribed, cancels its unsent confirmation emails and
// retires its confirmation links. Unsubscribing again changes nothing and succeeds.
func (s *Subscribers) Unsubscribe(ctx context.Context, nl, id uuid.UUID) (model.Subscriber, error) {
	var row subscriberRow
	var delivering bool
	src := model.SourceFrom(ctx)
	err := runInTx(ctx, s.db, func(ctx context.Context, tx bun.Tx) error {
		delivering = false
		now := s.now()
		sel := tx.NewSelect().Model(&row).Where("newsletter_id = ? AND id = ?", nl, id)
		if !s.sqlite { // SQLite's immediate transaction already holds the write lock
			sel = sel.For("UPDATE")
		}
		err := sel.Scan(ctx)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w", model.ErrNotFound)
		}
		if err != nil {
			return translate(err)
		}
		if row.Status == string(model.StatusUnsubscribed) {
			return nil // unsubscribed already: nothing changes, no event (§10.1)
		}
		before := row.Status
		row.Status, row.UpdatedAt = string(model.StatusUnsubscribed), now
		if _, err := tx.NewUpdate().Model(&row).WherePK().Column("status", "updated_at").Exec(ctx); err != nil {
			return translate(err)
		}
		if delivering, err = recordEvents(ctx, tx, []model.Event{model.NewEvent(model.EventUnsubscribed, row.toModel(),
			map[string]string{"status": before}, src, now)}); err != nil {
			return err
		}
		return retireConfirmations(ctx, tx, row.ID, now)
	})
	if err != nil {
		return model.Subscriber{}, translate(err)
	}
	deliveriesQueued(s.db, delivering)
	return row.toModel(), nil
}

// queueConfirmations inserts one due outbox row per subscriber, carrying the caller's trace
// context so the send can link to the request that asked for it.
func queueConfirmations(ctx context.Context, db bun.IDB, subs []subscriberRow) error {
	if len(subs) == 0 {
		return nil
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	rows := make([]outboxRow, len(subs))
	for i, sub := range subs {
		rows[i] = outboxRow{
			ID:            uuid.Must(uuid.NewV7()),
			NewsletterID:  sub.NewsletterID,
			SubscriberID:  sub.ID,
			Kind:          model.EmailKindConfirmation,
			State:         StatePending,
			NextAttemptAt: sub.UpdatedAt,
			Traceparent:   carrier.Get("traceparent"),
			CreatedAt:     sub.UpdatedAt,
			UpdatedAt:     sub.UpdatedAt,
		}
	}
	_, err := db.NewInsert().Model(&rows).Exec(ctx)
	return translate(err)
}

// retireConfirmations cancels a subscriber's unsent confirmation emails and makes its
// confirmation links invalid, the one that confirmed included: after a status change through
// the API, an old link neither changes the subscriber nor claims to have subscribed them.
func retireConfirmations(ctx context.Context, db bun.IDB, subscriberID uuid.UUID, now time.Time) error {
	if _, err := db.NewUpdate().Table("email_outbox").
		Set("state = ?", StateCancelled).Set("updated_at = ?", now).
		Where("subscriber_id = ? AND state = ?", subscriberID, StatePending).Exec(ctx); err != nil {
		return translate(err)
	}
	_, err := db.NewUpdate().Table("confirmation_tokens").
		Set("retired_at = ?", now).
		Where("subscriber_id = ? AND retired_at IS NULL", subscriberID).Exec(ctx)
	return translate(err)
}
