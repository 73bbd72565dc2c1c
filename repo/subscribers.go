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
	"github.com/subscriberd/subscriberd/outbox"
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
	// The 1.3 columns (docs/api-contract.md §19).
	Attributes attributesColumn `bun:"attributes"`
	Tags       tagsColumn       `bun:"tags"`
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
		Attributes:   r.Attributes.model(),
		Tags:         r.Tags.model(),
	}
}

type outboxRow struct {
	bun.BaseModel `bun:"table:email_outbox"`

	ID            uuid.UUID   `bun:"id,pk,type:uuid"`
	NewsletterID  uuid.UUID   `bun:"newsletter_id,type:uuid"`
	SubscriberID  uuid.UUID   `bun:"subscriber_id,type:uuid"`
	Kind          string      `bun:"kind"`
	Lane          outbox.Lane `bun:"lane"`
	State         string      `bun:"state"`
	Attempts      int         `bun:"attempts"`
	NextAttemptAt time.Time   `bun:"next_attempt_at"`
	LastError     string      `bun:"last_error"`
	Traceparent   string      `bun:"traceparent"`
	CreatedAt     time.Time   `bun:"created_at"`
	UpdatedAt     time.Time   `bun:"updated_at"`
	SentAt        *time.Time  `bun:"sent_at"`
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
func NewSubscribers(db *DB) *Subscribers {
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
		Attributes:   attributesOf(in.Attributes),
		Tags:         tagsOf(in.Tags),
	}
}

// Create stores one subscriber; a pending one gets its confirmation email queued in the same
// transaction. A suppressed address gives a *model.SuppressedError (docs/api-contract.md §13,
// checked first), an email already in the newsletter model.ErrEmailTaken.
func (s *Subscribers) Create(ctx context.Context, nl uuid.UUID, in model.NewSubscriber) (model.Subscriber, error) {
	row := s.newRow(nl, in, s.now())
	ev := model.NewEvent(model.EventCreated, row.toModel(), nil, model.SourceFrom(ctx), row.CreatedAt)
	pending := in.Status == model.StatusPending
	// docs/api-contract.md §13: the address's lock and the suppression check come first, as
	// in every write that subscribes an address (store.checkNotSuppressed); §10.1: the event
	// is part of the change.
	c := creation{ID: row.ID, NewsletterID: nl, Email: row.Email, EmailKey: row.EmailKey, FirstName: row.FirstName,
		LastName: row.LastName, Status: row.Status, CreatedAt: row.CreatedAt, UpdatedAt: row.UpdatedAt,
		Event: eventRows(ctx, []model.Event{ev})[0], LockKey: row.EmailKey,
		Attributes: string(row.Attributes), Tags: row.Tags}
	hashes := model.EmailHashes(row.Email)
	c.EmailHash, c.LegacyHash = hashes[0], hashes[len(hashes)-1]
	if pending {
		mail := confirmationRows(ctx, []subscriberRow{row})[0]
		c.MailID, c.MailTraceparent = &mail.ID, mail.Traceparent
	}
	delivering, err := s.db.eng.create(ctx, s.idb, c)
	if err != nil {
		return model.Subscriber{}, translate(err)
	}
	if pending {
		s.queued(emailQueue)
	}
	s.deliveriesQueued(delivering)
	return row.toModel(), nil
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
	joined := s.unit != nil
	pending, delivering, err := s.insertMany(ctx, rows, joined)
	if errors.Is(err, model.ErrEmailTaken) && !errors.Is(err, model.ErrEmailSuppressed) && !joined {
		pending, delivering, err = s.insertMany(ctx, rows, true)
	}
	if err != nil {
		return nil, translate(err)
	}
	if len(pending) > 0 {
		s.queued(emailQueue)
	}
	s.deliveriesQueued(delivering)
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
	if err := s.idb.NewSelect().Model((*subscriberRow)(nil)).Column("email_key").
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
	err := s.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		pending = nil
		// docs/api-contract.md §13: suppressed addresses, before the uniqueness rule.
		emails := make([]string, len(rows))
		for i := range rows {
			emails[i] = rows[i].Email
		}
		if err := s.checkNotSuppressed(ctx, tx, rows[0].NewsletterID, emails...); err != nil {
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
		if delivering, err = s.recordEvents(ctx, tx, evs, outbox.Interactive); err != nil {
			return err
		}
		return queueConfirmations(ctx, tx, pending, outbox.Interactive)
	})
	return pending, delivering, err
}

// insertNamingConflicts inserts sorted (rows in email-key order), skipping those whose email is
// taken; if any was skipped it returns a *model.EmailTakenError naming them by their position in
// rows, the client's order (and the caller's transaction rolls back). Rows are matched on the
// returned natural key, never by position.
func insertNamingConflicts(ctx context.Context, tx bun.IDB, sorted, rows []subscriberRow) error {
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
	// The total is the sum of the newsletter's counter rows (see the migration), read in the
	// same statement, hence the same snapshot, as the page.
	var rows []pageRow
	if err := s.db.eng.listPage(ctx, s.idb, &rows, nl, q); err != nil {
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

// pageRow is a row of a list page (engine.listPage): the total, or a subscriber, or both.
type pageRow struct {
	Total int64 `bun:"total"`
	subscriberRow
}

// lookupEmail is List with an email filter (docs/api-contract.md §9.1): one read of the unique
// index on (newsletter_id, email_key), the cost of a get. The total is 0 or 1, that of the
// filter; the page and the position then apply to that one row.
func (s *Subscribers) lookupEmail(ctx context.Context, nl uuid.UUID, q model.ListQuery) ([]model.Subscriber, int64, error) {
	var row subscriberRow
	err := s.db.eng.queryRow(ctx, s.idb, subscriberByEmail, &row, nl, model.EmailKey(q.Email))
	if errors.Is(err, sql.ErrNoRows) || err == nil && q.Status != "" && row.Status != string(q.Status) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, translate(err)
	}
	sub := row.toModel()
	if !q.Filter.Match(sub.Status, sub.CreatedAt, sub.Attributes, sub.Tags) { // §19.3's, ANDed
		return nil, 0, nil
	}
	switch {
	case q.After != nil && !model.Follows(q.After, sub):
		return nil, 1, nil
	case q.After == nil && q.Offset() > 0:
		return nil, 1, nil
	}
	return []model.Subscriber{sub}, 1, nil
}

// subscriberColumns are subscriberRow's columns, for the prepared statements that read it.
const subscriberColumns = `id, newsletter_id, email, email_key, first_name, last_name, status, created_at, updated_at, attributes, tags`

// lockSubscriber reads the newsletter's (?) subscriber id (?) and locks its row until the
// transaction ends: the first lock every writer of a subscriber takes.
const lockSubscriber = `SELECT ` + subscriberColumns + ` FROM subscribers WHERE newsletter_id = ? AND id = ? FOR UPDATE`

// The prepared reads of one subscriber (see statement): by id, and by email key through the
// unique index. Their spans are named as bun's query builder named them.
var (
	getSubscriber = newStatement("SELECT", "subscribers",
		`SELECT `+subscriberColumns+` FROM subscribers WHERE newsletter_id = $1 AND id = $2`)
	subscriberByEmail = newStatement("SELECT", "subscribers",
		`SELECT `+subscriberColumns+` FROM subscribers WHERE newsletter_id = $1 AND email_key = $2`)
)

// Get returns one subscriber of the newsletter, or model.ErrNotFound.
func (s *Subscribers) Get(ctx context.Context, nl, id uuid.UUID) (model.Subscriber, error) {
	var row subscriberRow
	err := s.db.eng.queryRow(ctx, s.idb, getSubscriber, &row, nl, id)
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
	if p.Email == nil && p.Status == nil && p.Attributes == nil && p.Tags == nil {
		if sub, done, err := s.rename(ctx, nl, id, p.Name); done || err != nil {
			return sub, err
		}
	}
	var row subscriberRow
	var queued, delivering bool
	src := model.SourceFrom(ctx)
	err := s.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		queued, delivering = false, false
		sel := s.db.eng.raw(tx, lockSubscriber, nl, id)
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
				if err := s.checkNotSuppressed(ctx, tx, nl, *p.Email); err != nil {
					return err
				}
				return fmt.Errorf("%w", model.ErrEmailTaken)
			}
		}
		err := sel.Scan(ctx, &row)
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
			if err := s.checkNotSuppressed(ctx, tx, nl, addr); err != nil {
				return err
			}
		}
		if p.Email == nil && p.Status != nil && *p.Status != model.StatusUnsubscribed &&
			strings.HasPrefix(row.EmailKey, duplicateKeyPrefix) {
			// It lost its address to an older subscriber in the 1.3 upgrade (Rekey,
			// docs/api-contract.md §18): that one holds the address.
			return fmt.Errorf("%w", model.ErrEmailTaken)
		}
		retire, queue := p.ConfirmationEffect(before)
		if queue && p.Status != nil && *p.Status == model.StatusPending {
			if err := checkResends(ctx, tx, row.ID, s.now()); err != nil {
				return err
			}
		}
		if p.Email != nil {
			row.Email, row.EmailKey = *p.Email, model.EmailKey(*p.Email)
		}
		if p.Name != nil {
			row.FirstName, row.LastName = model.SplitName(*p.Name)
		}
		if p.Status != nil {
			row.Status = string(*p.Status)
		}
		changed := map[string]any{}
		for k, v := range model.Changes(before, row.toModel()) {
			changed[k] = v
		}
		// docs/api-contract.md §19.2: the merge patch, applied to what the lock holds.
		if p.Attributes != nil {
			attrs, prev, verr := model.MergeAttributes(before.Attributes, p.Attributes, "attributes")
			if verr != nil {
				return verr
			}
			if len(prev) > 0 {
				row.Attributes, changed["attributes"] = attributesOf(attrs), prev
			}
		}
		if p.Tags != nil && !slices.Equal(p.Tags, before.Tags) {
			row.Tags, changed["tags"] = tagsOf(p.Tags), before.Tags
		}
		if len(changed) == 0 && !retire && !queue {
			return nil // the values already there: nothing to write, no event (§10.1)
		}
		row.UpdatedAt = s.now()
		if _, err := tx.NewUpdate().Model(&row).WherePK().
			Column("email", "email_key", "first_name", "last_name", "status", "attributes", "tags", "updated_at").Exec(ctx); err != nil {
			return translate(err)
		}
		if len(changed) > 0 {
			var err error
			delivering, err = s.recordEvents(ctx, tx, []model.Event{
				model.NewEventOf(model.EventUpdated, row.toModel(), changed, src, row.UpdatedAt)}, outbox.Interactive)
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
			return queueConfirmations(ctx, tx, []subscriberRow{row}, outbox.Interactive)
		}
		return nil
	})
	if err != nil {
		return model.Subscriber{}, translate(err)
	}
	if queued {
		s.queued(emailQueue)
	}
	s.deliveriesQueued(delivering)
	return row.toModel(), nil
}

// renameTries is how many times rename reads and writes again when the subscriber changed
// between the two, before it leaves the patch to Update's locking transaction.
const renameTries = 3

// rename applies a patch that sets at most the name without a transaction of its own: it
// reads the subscriber, then has the engine write the new name with its event and the
// event's deliveries only while the row still holds every value it read (the values the
// event records as the subscriber and its previous name; engine.rename). Such a patch has no
// confirmation effect and no email to keep unique, so it needs no lock: on PostgreSQL two
// round trips instead of a transaction's five. When another change came in between, it reads
// again; after renameTries misses it reports done false, and Update takes the locking path.
func (s *Subscribers) rename(ctx context.Context, nl, id uuid.UUID, name *string) (model.Subscriber, bool, error) {
	src := model.SourceFrom(ctx)
	for range renameTries {
		var before subscriberRow
		err := s.db.eng.queryRow(ctx, s.idb, getSubscriber, &before, nl, id)
		if errors.Is(err, sql.ErrNoRows) {
			return model.Subscriber{}, false, fmt.Errorf("%w", model.ErrNotFound)
		}
		if err != nil {
			return model.Subscriber{}, false, translate(err)
		}
		row := before
		if name != nil {
			row.FirstName, row.LastName = model.SplitName(*name)
		}
		changed := model.Changes(before.toModel(), row.toModel())
		if len(changed) == 0 {
			return before.toModel(), true, nil // the values already there: nothing to write, no event (§10.1)
		}
		row.UpdatedAt = s.now()
		ev := eventRows(ctx, []model.Event{model.NewEvent(model.EventUpdated, row.toModel(), changed, src, row.UpdatedAt)})[0]
		renamed, delivering, err := s.db.eng.rename(ctx, s.idb, renaming{NewsletterID: nl, ID: id,
			Email: before.Email, FirstName: before.FirstName, LastName: before.LastName, Status: before.Status,
			UpdatedAt: before.UpdatedAt, NewFirstName: row.FirstName, NewLastName: row.LastName, NewUpdatedAt: row.UpdatedAt,
			Event: ev})
		if err != nil {
			return model.Subscriber{}, false, translate(err)
		}
		if renamed {
			s.deliveriesQueued(delivering)
			return row.toModel(), true, nil
		}
	}
	return model.Subscriber{}, false, nil
}

// lockForEmailChange locks (where the engine has row locks; see engine.raw) the subscriber id and the newsletter's subscriber whose email key is key, in id order, and
// Upsert makes the newsletter's subscriber with in.Email what docs/api-contract.md §16.1 asks,
// in one unit of work under the address's lock (engine.lockEmailKeys): when no subscriber has
// the address (model.EmailKey) it is created as Create creates it, and created is true; else
// patch is applied to it as Update applies it, the subscriber's row locked from the read to
// the write. Concurrent upserts of one address therefore queue on the lock: the first creates,
// each other one updates what those before it committed. Bound to a unit of work (Tx), it runs
// in that unit's transaction.
func (s *Subscribers) Upsert(ctx context.Context, nl uuid.UUID, in model.NewSubscriber, patch model.SubscriberPatch) (sub model.Subscriber, created bool, err error) {
	key := model.EmailKey(in.Email)
	err = s.unitOfWork(ctx, func(u *Subscribers) error {
		sub, created = model.Subscriber{}, false
		if err := s.db.eng.lockEmailKeys(ctx, u.idb, nl, []string{key}); err != nil {
			return translate(err)
		}
		// A create without the upsert's lock (POST /subscribers) may take the address between
		// the read and the insert: the insert waits for it, and the read after sees it.
		for range 2 {
			var row subscriberRow
			err := s.db.eng.raw(u.idb, `SELECT `+subscriberColumns+` FROM subscribers
WHERE newsletter_id = ? AND email_key = ? FOR UPDATE`, nl, key).Scan(ctx, &row)
			switch {
			case err == nil:
				sub, err = u.Update(ctx, nl, row.ID, patch)
				return err
			case !errors.Is(err, sql.ErrNoRows):
				return translate(err)
			}
			sub, err = u.Create(ctx, nl, in)
			if !errors.Is(err, model.ErrEmailTaken) {
				created = err == nil
				return err
			}
		}
		return fmt.Errorf("%w", model.ErrEmailTaken)
	})
	if err != nil {
		return model.Subscriber{}, false, err
	}
	return sub, created, nil
}

// unitOfWork runs fn with the store bound to a unit of work: this store's own, or a new one
// (DB.InTx, run again on a deadlock or a busy database) when it is bound to the pool.
func (s *Subscribers) unitOfWork(ctx context.Context, fn func(u *Subscribers) error) error {
	if s.unit != nil {
		return fn(s)
	}
	return s.db.InTx(ctx, func(tx Tx) error { return fn(tx.Subscribers()) })
}

// lockForEmailChange locks (where the engine has row locks; see engine.forUpdate)
// the subscriber id and the newsletter's subscriber whose email key is key, in id order, and
// tells whether the subscriber exists and whether key belongs to another one. A row that
// changed its email while we waited for it is re-read by PostgreSQL and drops out if it no
// longer holds key.
func (s *Subscribers) lockForEmailChange(ctx context.Context, tx bun.IDB, nl, id uuid.UUID, key string) (found, taken bool, err error) {
	// Two changes to the same new email (that nobody holds yet, so no row to lock) queue here,
	// instead of the second failing on the unique key after the first commits.
	if err := s.db.eng.lockEmailKeys(ctx, tx, nl, []string{key}); err != nil {
		return false, false, translate(err)
	}
	var ids []uuid.UUID
	err = s.db.eng.raw(tx, `SELECT id FROM subscribers
WHERE newsletter_id = ? AND (id = ? OR email_key = ?)
ORDER BY id FOR UPDATE`, nl, id, key).Scan(ctx, &ids)
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
	err := s.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		delivering = false
		now := s.now()
		sel := s.db.eng.raw(tx, lockSubscriber, nl, id)
		err := sel.Scan(ctx, &row)
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
		if delivering, err = s.recordEvents(ctx, tx, []model.Event{model.NewEvent(model.EventUnsubscribed, row.toModel(),
			map[string]string{"status": before}, src, now)}, outbox.Interactive); err != nil {
			return err
		}
		return retireConfirmations(ctx, tx, row.ID, now)
	})
	if err != nil {
		return model.Subscriber{}, translate(err)
	}
	s.deliveriesQueued(delivering)
	return row.toModel(), nil
}

// queueConfirmations inserts one due outbox row per subscriber in lane (outbox.Interactive
// for what one API call or page caused, outbox.Bulk for imports and bulk actions), carrying
// the caller's trace context so the send can link to the request that asked for it.
func queueConfirmations(ctx context.Context, db bun.IDB, subs []subscriberRow, lane outbox.Lane) error {
	rows := confirmationRows(ctx, subs)
	for i := range rows {
		rows[i].Lane = lane
	}
	return insertOutbox(ctx, db, rows)
}

// confirmationRows are the outbox rows of subs' confirmation emails, carrying ctx's trace
// context.
func confirmationRows(ctx context.Context, subs []subscriberRow) []outboxRow {
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
	return rows
}

// insertOutbox stores rows, when there are any.
func insertOutbox(ctx context.Context, db bun.IDB, rows []outboxRow) error {
	if len(rows) == 0 {
		return nil
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

// checkResends refuses a confirmation email to subscriber when MaxConfirmationsPerWindow were
// queued for it within ConfirmationWindow (docs/api-contract.md §12.3), with the wait until the
// oldest of the last ones leaves the window.
func checkResends(ctx context.Context, db bun.IDB, subscriber uuid.UUID, now time.Time) error {
	var times []time.Time
	err := db.NewRaw(`SELECT created_at FROM email_outbox WHERE subscriber_id = ? AND kind = ? AND created_at > ?
ORDER BY created_at DESC LIMIT ?`, subscriber, model.EmailKindConfirmation, now.Add(-model.ConfirmationWindow),
		model.MaxConfirmationsPerWindow).Scan(ctx, &times)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return translate(err)
	}
	if len(times) < model.MaxConfirmationsPerWindow {
		return nil
	}
	oldest := times[len(times)-1]
	wait := oldest.Add(model.ConfirmationWindow).Sub(now)
	secs := int((wait + time.Second - 1) / time.Second)
	return &model.ResendLimitError{RetryAfter: max(secs, 1)}
}

// ChangeTags adds and removes tags (POST /subscribers/{id}/tags, docs/api-contract.md §19.2)
// under the subscriber's row lock, read and written as one unit (engine.changeTags: one
// statement on PostgreSQL, one transaction on SQLite), so that concurrent changes of different
// tags never lose each other's. Over model.MaxTags in the result is a *model.ValidationError
// (model.CheckTagCount) and changes nothing; a change that leaves the set as it is writes
// nothing and records no event. Bound to a unit of work (Tx), it runs in that unit's
// transaction.
func (s *Subscribers) ChangeTags(ctx context.Context, nl, id uuid.UUID, c model.TagsChange) (model.Subscriber, error) {
	src := model.SourceFrom(ctx)
	sub, delivering, err := s.db.eng.changeTags(ctx, s.idb, retagging{NewsletterID: nl, ID: id, Change: c,
		Now: s.now(), Traceparent: traceparent(ctx), Source: src, SourceJSON: eventSourceJSON(src)})
	if err != nil {
		return model.Subscriber{}, translate(err)
	}
	s.deliveriesQueued(delivering)
	return sub, nil
}

// tagCountRow is a row of ListTags.
type tagCountRow struct {
	Tag         string `bun:"tag"`
	Subscribers int64  `bun:"subscribers"`
}

// ListTags returns up to limit of the newsletter's tags that someone holds, sorted by code
// point, after the tag after ("" from the first), each with its exact count: the sum of its
// counter rows (see the migration), which the triggers keep in every write's transaction.
func (s *Subscribers) ListTags(ctx context.Context, nl uuid.UUID, after string, limit int) ([]model.TagCount, error) {
	var rows []tagCountRow
	err := s.idb.NewRaw(`SELECT tag, sum(n) AS subscribers FROM subscriber_tag_counts
WHERE newsletter_id = ? AND tag > ?
GROUP BY tag HAVING sum(n) > 0
ORDER BY tag LIMIT ?`, nl, after, limit).Scan(ctx, &rows)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, translate(err)
	}
	out := make([]model.TagCount, len(rows))
	for i, r := range rows {
		out[i] = model.TagCount{Tag: r.Tag, Subscribers: r.Subscribers}
	}
	return out, nil
}
