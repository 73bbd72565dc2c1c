// Package baseline runs the naive SQL that any correct implementation of the subscriber API has
// to run, directly through the service's own database stack (bun with pgdialect and pgdriver),
// so that the service's figures can be set against what the database allows in the same run.
//
// Writes go into the benchmarked newsletter's subscribers table with unique emails and satisfy
// the whole schema, so the subscriber_counts triggers fire exactly as they do for the service.
package baseline

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/driver/pgdriver"

	"github.com/subscriberd/subscriberd/cmd/subscriber-bench/load"
)

// Subscriber is a row of the subscribers table, every column of it.
type Subscriber struct {
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

// OutboxEntry is a row of email_outbox: the confirmation email a pending create queues.
type OutboxEntry struct {
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

// listColumns are the columns a list or get needs to build the API's Subscriber.
const listColumns = "id, email, first_name, last_name, status, created_at"

// PageSize is the list page size every list scenario uses (the API's default limit).
const PageSize = 25

// DeepPage is the page number of the deep-list scenarios.
const DeepPage = 2000

// ApplicationName is what the baseline's connections call themselves in pg_stat_activity.
const ApplicationName = "subscriber-bench"

// Open connects to dsn through pgdriver and bun with a pool of poolSize connections, all kept
// idle between operations (the database/sql default of 2 idle connections would churn).
func Open(dsn string, poolSize int) (*bun.DB, error) {
	if poolSize < 1 {
		poolSize = 1
	}
	sqldb := sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(dsn), pgdriver.WithApplicationName(ApplicationName)))
	sqldb.SetMaxOpenConns(poolSize)
	sqldb.SetMaxIdleConns(poolSize)
	db := bun.NewDB(sqldb, pgdialect.New())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("baseline database: %w", err)
	}
	return db, nil
}

// NewsletterOf returns the newsletter a subscriber belongs to.
func NewsletterOf(ctx context.Context, db *bun.DB, subscriberID uuid.UUID) (uuid.UUID, error) {
	var nl uuid.UUID
	err := db.NewSelect().TableExpr("subscribers").Column("newsletter_id").
		Where("id = ?", subscriberID).Scan(ctx, &nl)
	return nl, err
}

// Runner holds what the baseline operations share.
type Runner struct {
	DB         *bun.DB
	Newsletter uuid.UUID
	// IDs are existing subscribers of Newsletter that the by-id operations pick from.
	IDs []uuid.UUID
	// Timeout bounds each operation (0 = 15 s).
	Timeout time.Duration

	prefix string
	seq    atomic.Int64
}

// NewRunner returns a Runner whose emails are unique to runID.
func NewRunner(db *bun.DB, newsletter uuid.UUID, ids []uuid.UUID, runID string) *Runner {
	return &Runner{DB: db, Newsletter: newsletter, IDs: ids, prefix: "base-" + runID + "-"}
}

// Scenario is one named baseline operation.
type Scenario struct {
	Name string
	Desc string
	Op   load.Op
}

// Scenario names.
const (
	InsertOne     = "insert_one"
	InsertPending = "insert_pending_tx"
	Insert100     = "insert_100_tx"
	PageCount     = "page_count"
	Page          = "page_nocount"
	PageDeepCount = "page_deep_count"
	PageDeep      = "page_deep_nocount"
	PageStatus    = "page_status_nocount"
	SelectByID    = "select_by_id"
	UpdateByID    = "update_by_id"
)

// StatusFiltered is the status the filtered-list scenarios ask for.
const StatusFiltered = "active"

// Scenarios lists every baseline operation in running order.
func (r *Runner) Scenarios() []Scenario {
	return []Scenario{
		{InsertOne, "INSERT … RETURNING of one subscriber", r.wrap(r.InsertOne)},
		{InsertPending, "INSERT subscriber + INSERT outbox row, in one transaction", r.wrap(r.InsertPending)},
		{Insert100, "100-row INSERT in a transaction", r.wrap(r.Insert100)},
		{PageCount, "first page SELECT … LIMIT 25 OFFSET 0 plus COUNT(*)", r.wrapPage(1, "", true)},
		{Page, "first page SELECT … LIMIT 25 OFFSET 0", r.wrapPage(1, "", false)},
		{PageDeepCount, "page 2000 SELECT … LIMIT 25 OFFSET 49975 plus COUNT(*)", r.wrapPage(DeepPage, "", true)},
		{PageDeep, "page 2000 SELECT … LIMIT 25 OFFSET 49975", r.wrapPage(DeepPage, "", false)},
		{PageStatus, "first page of status=active SELECT … LIMIT 25", r.wrapPage(1, StatusFiltered, false)},
		{SelectByID, "SELECT one subscriber by id", r.wrap(r.SelectByID)},
		{UpdateByID, "UPDATE one subscriber's name by id … RETURNING", r.wrap(r.UpdateByID)},
	}
}

// wrapPage is a page read counted as one row per request, like the service's list scenarios.
func (r *Runner) wrapPage(page int, status string, withCount bool) load.Op {
	return r.wrap(func(ctx context.Context) (int, error) {
		_, _, err := r.Page(ctx, page, status, withCount)
		return 1, err
	})
}

func (r *Runner) wrap(f func(ctx context.Context) (int, error)) load.Op {
	return func(ctx context.Context, _ int, _ int64) load.Result {
		timeout := r.Timeout
		if timeout <= 0 {
			timeout = 15 * time.Second
		}
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		rows, err := f(ctx)
		if err != nil {
			kind := "db"
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
				kind = "timeout"
			}
			return load.Result{Err: kind, Detail: err.Error()}
		}
		return load.Result{Rows: rows}
	}
}

// newRow returns a new subscriber with an email unique to this runner.
func (r *Runner) newRow(status string, now time.Time) Subscriber {
	n := r.seq.Add(1)
	email := fmt.Sprintf("%s%d@Bench.Example.com", r.prefix, n)
	return Subscriber{
		ID:           uuid.Must(uuid.NewV7()),
		NewsletterID: r.Newsletter,
		Email:        email,
		EmailKey:     strings.ToLower(email),
		FirstName:    "Baseline",
		LastName:     fmt.Sprintf("User %d", n),
		Status:       status,
		CreatedAt:    now,
		UpdatedAt:    now,
	}
}

// InsertOne inserts one active subscriber, returning its id and creation time.
func (r *Runner) InsertOne(ctx context.Context) (int, error) {
	row := r.newRow("active", time.Now().UTC())
	if _, err := r.DB.NewInsert().Model(&row).Returning("id, created_at").Exec(ctx); err != nil {
		return 0, err
	}
	return 1, nil
}

// InsertPending inserts one pending subscriber and its confirmation email in the outbox, in
// one transaction: what a pending create must do.
func (r *Runner) InsertPending(ctx context.Context) (int, error) {
	now := time.Now().UTC()
	row := r.newRow("pending", now)
	mail := OutboxEntry{
		ID: uuid.Must(uuid.NewV7()), NewsletterID: r.Newsletter, SubscriberID: row.ID,
		Kind: "confirmation", State: "pending", NextAttemptAt: now, CreatedAt: now, UpdatedAt: now,
	}
	err := r.DB.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		if _, err := tx.NewInsert().Model(&row).Returning("id, created_at").Exec(ctx); err != nil {
			return err
		}
		_, err := tx.NewInsert().Model(&mail).Exec(ctx)
		return err
	})
	if err != nil {
		return 0, err
	}
	return 1, nil
}

// Insert100 inserts 100 active subscribers with one multi-row INSERT in a transaction.
func (r *Runner) Insert100(ctx context.Context) (int, error) {
	now := time.Now().UTC()
	rows := make([]Subscriber, 100)
	for i := range rows {
		rows[i] = r.newRow("active", now)
	}
	err := r.DB.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		_, err := tx.NewInsert().Model(&rows).Exec(ctx)
		return err
	})
	if err != nil {
		return 0, err
	}
	return len(rows), nil
}

// Page reads page page (of PageSize, newest first) of the newsletter, of one status when status
// is not empty, followed by the COUNT(*) of the same filter when withCount is set. It returns
// the rows and the total (-1 without a count).
func (r *Runner) Page(ctx context.Context, page int, status string, withCount bool) ([]Subscriber, int, error) {
	var rows []Subscriber
	q := r.DB.NewSelect().Model(&rows).Column("id", "email", "first_name", "last_name", "status", "created_at").
		Where("newsletter_id = ?", r.Newsletter)
	if status != "" {
		q = q.Where("status = ?", status)
	}
	err := q.OrderExpr("created_at DESC, id DESC").Limit(PageSize).Offset((page - 1) * PageSize).Scan(ctx)
	if err != nil {
		return nil, 0, err
	}
	total := -1
	if withCount {
		cq := r.DB.NewSelect().Model((*Subscriber)(nil)).Where("newsletter_id = ?", r.Newsletter)
		if status != "" {
			cq = cq.Where("status = ?", status)
		}
		if total, err = cq.Count(ctx); err != nil {
			return nil, 0, err
		}
	}
	return rows, total, nil
}

func (r *Runner) pickID() (uuid.UUID, error) {
	if len(r.IDs) == 0 {
		return uuid.Nil, errors.New("no subscriber ids to pick from")
	}
	return r.IDs[rand.IntN(len(r.IDs))], nil
}

// SelectByID reads one random known subscriber by id within the newsletter.
func (r *Runner) SelectByID(ctx context.Context) (int, error) {
	id, err := r.pickID()
	if err != nil {
		return 0, err
	}
	var row Subscriber
	err = r.DB.NewSelect().Model(&row).Column("id", "email", "first_name", "last_name", "status", "created_at").
		Where("id = ?", id).Where("newsletter_id = ?", r.Newsletter).Scan(ctx)
	if err != nil {
		return 0, err
	}
	return 1, nil
}

// UpdateByID renames one random known subscriber and returns the updated row.
func (r *Runner) UpdateByID(ctx context.Context) (int, error) {
	id, err := r.pickID()
	if err != nil {
		return 0, err
	}
	var row Subscriber
	n := r.seq.Add(1)
	res, err := r.DB.NewUpdate().Model(&row).
		Set("first_name = ?", "Updated").
		Set("last_name = ?", fmt.Sprintf("Baseline %d", n)).
		Set("updated_at = ?", time.Now().UTC()).
		Where("id = ?", id).Where("newsletter_id = ?", r.Newsletter).
		Returning(listColumns).Exec(ctx)
	if err != nil {
		return 0, err
	}
	if affected, err := res.RowsAffected(); err != nil || affected != 1 {
		return 0, fmt.Errorf("update by id: %d rows affected (%v)", affected, err)
	}
	return 1, nil
}
