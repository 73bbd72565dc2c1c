package repo

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	"github.com/subscriberd/subscriberd/model"
)

// importRow is one import (docs/api-contract.md §15).
type importRow struct {
	bun.BaseModel `bun:"table:imports"`

	ID            uuid.UUID  `bun:"id,pk,type:uuid"`
	NewsletterID  uuid.UUID  `bun:"newsletter_id,type:uuid"`
	State         string     `bun:"state"`
	Format        string     `bun:"format"`
	DefaultStatus string     `bun:"default_status"`
	KeyPrefix     string     `bun:"key_prefix"`
	Traceparent   string     `bun:"traceparent"`
	RowCount      int64      `bun:"row_count"`
	Processed     int64      `bun:"processed"`
	Created       int64      `bun:"created"`
	Existing      int64      `bun:"existing"`
	Suppressed    int64      `bun:"suppressed"`
	Invalid       int64      `bun:"invalid"`
	Claim         *uuid.UUID `bun:"claim,type:uuid"`
	LeaseUntil    *time.Time `bun:"lease_until"`
	CreatedAt     time.Time  `bun:"created_at"`
	UpdatedAt     time.Time  `bun:"updated_at"`
	StartedAt     *time.Time `bun:"started_at"`
	FinishedAt    *time.Time `bun:"finished_at"`
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func (r *importRow) toModel() model.Import {
	return model.Import{
		ID: r.ID, NewsletterID: r.NewsletterID, State: r.State, Format: r.Format,
		DefaultStatus: model.Status(r.DefaultStatus),
		Counts: model.ImportCounts{Rows: r.RowCount, Processed: r.Processed, Created: r.Created,
			Existing: r.Existing, Suppressed: r.Suppressed, Invalid: r.Invalid},
		CreatedAt: r.CreatedAt.UTC(), StartedAt: utcPtr(r.StartedAt), FinishedAt: utcPtr(r.FinishedAt),
	}
}

// newStagedRow is row n of import id as staged: the subscriber it validated as, or its
// errors.
func newStagedRow(id uuid.UUID, n int64, ns model.NewSubscriber, verr *model.ValidationError) stagedRow {
	r := stagedRow{ImportID: id, RowNo: n}
	if verr != nil {
		msgs, _ := json.Marshal(verr.Fields) // cannot fail: strings
		r.Errors = string(msgs)
		return r
	}
	r.Email, r.EmailKey, r.FirstName, r.LastName, r.Status = ns.Email, model.EmailKey(ns.Email), ns.FirstName, ns.LastName, string(ns.Status)
	hashes := model.EmailHashes(ns.Email)
	r.EmailHash = hashes[0]
	if len(hashes) > 1 {
		r.LegacyHash = hashes[1]
	}
	if len(ns.Attributes) > 0 || len(ns.Tags) > 0 {
		r.Extra = string(model.SubscriberExtrasJSON(ns.Attributes, ns.Tags))
	}
	return r
}

// importErrorRow is the errors of one invalid row.
type importErrorRow struct {
	bun.BaseModel `bun:"table:import_errors"`

	ImportID uuid.UUID `bun:"import_id,type:uuid"`
	RowNo    int64     `bun:"row_no"`
	Errors   string    `bun:"errors"`
}

// Imports stores imports: their staged rows, their progress and their row errors.
type Imports struct {
	store
}

// NewImports returns the import store on db.
func NewImports(db *DB) *Imports {
	return &Imports{store: newStore(db)}
}

// Stage stores a new import with every row next yields (a row's object: a CSV row's columns
// by name or an NDJSON line's; io.EOF ends them), durably, before it returns: each row
// validated (model.ParseImportObject) and staged typed, and the rows whose address an earlier
// row has marked (engine.markDuplicates: decided once for the whole file, so that no batch
// needs another's rows); on PostgreSQL in one transaction, the rows by COPY; on SQLite in
// short transactions, the import invisible ("uploading") until its last row is stored, so
// that a long upload never holds the database's write lock. When next fails (a malformed
// file, a limit, a client that went away) nothing of the import remains, and its error is
// returned as it is.
func (s *Imports) Stage(ctx context.Context, in model.NewImport, next func() (map[string]any, error)) (model.Import, error) {
	now := s.now()
	row := importRow{ID: uuid.Must(uuid.NewV7()), NewsletterID: in.NewsletterID, State: model.ImportQueued,
		Format: in.Format, DefaultStatus: string(in.DefaultStatus), KeyPrefix: in.KeyPrefix,
		Traceparent: in.Traceparent, CreatedAt: now, UpdatedAt: now}
	var n int64
	rows := func() (stagedRow, error) {
		obj, err := next()
		if err != nil {
			return stagedRow{}, err
		}
		n++
		ns, verr := model.ParseImportObject(obj, in.DefaultStatus)
		return newStagedRow(row.ID, n, ns, verr), nil
	}
	err := s.db.eng.stageImport(ctx, s.db.DB, staging{id: row.ID, next: rows,
		insert: func(ctx context.Context, db bun.IDB, uploading bool) error {
			if uploading {
				row.State = model.ImportUploading
			}
			_, err := db.NewInsert().Model(&row).Exec(ctx)
			return translate(err)
		},
		alive: func(ctx context.Context, db bun.IDB) error {
			_, err := db.NewUpdate().Table("imports").Set("updated_at = ?", s.now()).Where("id = ?", row.ID).Exec(ctx)
			return err
		},
		finish: func(ctx context.Context, db bun.IDB, n int64) error {
			if err := s.db.eng.markDuplicates(ctx, db, row.ID, 0, math.MaxInt64); err != nil {
				return translate(err)
			}
			finishStaged(&row, n, s.now())
			_, err := db.NewUpdate().Model(&row).Column("row_count", "state", "started_at", "finished_at").WherePK().Exec(ctx)
			return translate(err)
		},
		drop: func(ctx context.Context) error { return s.dropImport(ctx, row.ID) },
	})
	if err != nil {
		return model.Import{}, err
	}
	return row.toModel(), nil
}

// finishStaged sets the row count of a staged import; an empty one is complete at once.
func finishStaged(row *importRow, n int64, now time.Time) {
	row.RowCount = n
	row.State = model.ImportQueued
	if n == 0 {
		row.State = model.ImportCompleted
		row.StartedAt, row.FinishedAt = &now, &now
	}
}

// dropImport removes an import and its staged rows.
func (s *Imports) dropImport(ctx context.Context, id uuid.UUID) error {
	return translate(s.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		if _, err := tx.NewDelete().Table("import_rows").Where("import_id = ?", id).Exec(ctx); err != nil {
			return err
		}
		_, err := tx.NewDelete().Table("imports").Where("id = ?", id).Exec(ctx)
		return err
	}))
}

// SweepUploads drops the uploads (SQLite) that stopped arriving more than age ago: the
// process that received them ended before it could drop them itself.
func (s *Imports) SweepUploads(ctx context.Context, age time.Duration) error {
	var ids []uuid.UUID
	if err := s.idb.NewSelect().Table("imports").Column("id").
		Where("state = ? AND updated_at < ?", model.ImportUploading, s.now().Add(-age)).
		Scan(ctx, &ids); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return translate(err)
	}
	for _, id := range ids {
		if err := s.dropImport(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// visible is the condition of the imports the API shows: not an upload still arriving.
const visible = "state <> 'uploading'"

// Get returns the newsletter's import id; an unknown one is model.ErrImportNotFound.
func (s *Imports) Get(ctx context.Context, nl, id uuid.UUID) (model.Import, error) {
	var row importRow
	err := s.idb.NewSelect().Model(&row).Where("id = ? AND newsletter_id = ? AND "+visible, id, nl).Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return model.Import{}, fmt.Errorf("%w", model.ErrImportNotFound)
	}
	if err != nil {
		return model.Import{}, translate(err)
	}
	return row.toModel(), nil
}

// List returns up to limit+1 of the newsletter's imports, newest first, after the position
// after (nil: from the newest): one more than asked when another follows.
func (s *Imports) List(ctx context.Context, nl uuid.UUID, limit int, after *model.Position) ([]model.Import, error) {
	var rows []importRow
	q := s.idb.NewSelect().Model(&rows).Where("newsletter_id = ? AND "+visible, nl).
		OrderExpr("created_at DESC, id DESC").Limit(limit + 1)
	if after != nil {
		q = q.Where("(created_at < ? OR (created_at = ? AND id < ?))", after.CreatedAt.UTC(), after.CreatedAt.UTC(), after.ID)
	}
	if err := q.Scan(ctx); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, translate(err)
	}
	out := make([]model.Import, len(rows))
	for i := range rows {
		out[i] = rows[i].toModel()
	}
	return out, nil
}

// Errors returns up to limit+1 row errors of the newsletter's import id after the data row
// afterRow, in row order; an unknown import is model.ErrImportNotFound.
func (s *Imports) Errors(ctx context.Context, nl, id uuid.UUID, limit int, afterRow int64) ([]model.ImportRowError, error) {
	if _, err := s.Get(ctx, nl, id); err != nil {
		return nil, err
	}
	var rows []importErrorRow
	if err := s.idb.NewSelect().Model(&rows).Where("import_id = ? AND row_no > ?", id, afterRow).
		OrderExpr("row_no").Limit(limit + 1).Scan(ctx); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, translate(err)
	}
	out := make([]model.ImportRowError, len(rows))
	for i, r := range rows {
		out[i].Row = r.RowNo
		if err := json.Unmarshal([]byte(r.Errors), &out[i].Errors); err != nil {
			return nil, fmt.Errorf("row errors of import %s row %d: %w", id, r.RowNo, err)
		}
	}
	return out, nil
}

// Cancel cancels the newsletter's queued or running import id: rows already created stay,
// the others are dropped. A finished one is model.ErrImportFinished.
func (s *Imports) Cancel(ctx context.Context, nl, id uuid.UUID) (model.Import, error) {
	var row importRow
	if err := cancelJob(ctx, &s.store, importJobs, "import_rows", "import_id", visible, nl, id, &row,
		model.ErrImportNotFound, model.ErrImportFinished); err != nil {
		return model.Import{}, translate(err)
	}
	return row.toModel(), nil
}

// Claim takes the oldest import that is due for a worker, for lease (claimJob: one running
// per newsletter, in created order; one whose worker stopped resumes after its last committed
// batch). ok is false when none is due.
func (s *Imports) Claim(ctx context.Context, lease time.Duration) (job model.ImportJob, ok bool, err error) {
	var r importRow
	claim, ok, err := claimJob(ctx, &s.store, importJobs, lease, &r)
	if !ok {
		return model.ImportJob{}, false, err
	}
	return model.ImportJob{Import: r.toModel(), Claim: claim, KeyPrefix: r.KeyPrefix, Traceparent: r.Traceparent}, true, nil
}

// Release gives up job's claim, so that another worker (or the next start) takes the import
// up at once rather than after the lease.
func (s *Imports) Release(ctx context.Context, job model.ImportJob) error {
	return importJobs.release(ctx, &s.store, job.ID, job.Claim)
}

// Extend renews the lease of the running imports whose claims a worker still holds (its
// heartbeat; jobTable.extend).
func (s *Imports) Extend(ctx context.Context, claims []uuid.UUID, lease time.Duration) error {
	return importJobs.extend(ctx, &s.store, claims, lease)
}

// Batch processes the next up to size rows of job in one transaction: it creates the
// subscribers of the valid rows whose address the newsletter does not have yet (with their
// events, webhook deliveries and, for pending ones, confirmation emails), records the errors
// of the invalid rows, and advances the import's counts, extending the lease. The rows do not
// pass through the service: the engine's importBatch does it in set-based statements over the
// staged rows. It returns what this batch counted and whether the import is finished
// (completed). A worker that no longer holds the import gets model.ErrImportLost, and nothing
// of the batch is stored.
func (s *Imports) Batch(ctx context.Context, job model.ImportJob, size int, lease time.Duration) (model.ImportCounts, bool, error) {
	var (
		counts     model.ImportCounts
		done       bool
		pending    bool
		delivering bool
	)
	err := s.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		counts, done, pending, delivering = model.ImportCounts{}, false, false, false
		var cur importRow
		err := s.db.eng.raw(tx, "SELECT * FROM imports WHERE id = ? FOR NO KEY UPDATE", job.ID).Scan(ctx, &cur)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w", model.ErrImportLost)
		}
		if err != nil {
			return err
		}
		if cur.State != model.ImportRunning || cur.Claim == nil || *cur.Claim != job.Claim {
			return fmt.Errorf("%w", model.ErrImportLost)
		}
		now := s.now()
		// The rows are numbered 1 to row_count and removed once processed: the batch is the
		// next size of them.
		src := model.APISource(cur.KeyPrefix)
		b := importBatch{Import: cur.ID, Newsletter: cur.NewsletterID, After: cur.Processed,
			Last: cur.Processed + int64(size), Now: now, Traceparent: traceparent(ctx),
			Source: src, SourceJSON: eventSourceJSON(src)}
		if err := s.typeLegacyRows(ctx, tx, b, model.Status(cur.DefaultStatus)); err != nil {
			return err
		}
		if err := s.lockStagedKeys(ctx, tx, b); err != nil {
			return err
		}
		c, d, err := s.db.eng.importBatch(ctx, tx, b)
		if err != nil {
			return err
		}
		counts = model.ImportCounts{Processed: c.Processed, Created: c.Created, Suppressed: c.Suppressed,
			Invalid: c.Invalid, Existing: c.Processed - c.Invalid - c.Suppressed - c.Created}
		pending, delivering = c.Pending > 0, d
		cur.Processed += counts.Processed
		cur.Created += counts.Created
		cur.Existing += counts.Existing
		cur.Suppressed += counts.Suppressed
		cur.Invalid += counts.Invalid
		cur.UpdatedAt = now
		leaseUntil := now.Add(lease)
		cur.LeaseUntil = &leaseUntil
		if cur.Processed >= cur.RowCount || counts.Processed == 0 {
			done = true
			cur.State, cur.FinishedAt, cur.Claim, cur.LeaseUntil = model.ImportCompleted, &now, nil, nil
		}
		if _, err := tx.NewUpdate().Model(&cur).
			Column("state", "processed", "created", "existing", "suppressed", "invalid", "claim", "lease_until", "updated_at", "finished_at").
			WherePK().Exec(ctx); err != nil {
			return err
		}
		if counts.Processed > 0 {
			// The staged rows are not needed once their outcome is committed. Bounded below
			// too: the index's entries of the rows deleted before are dead but still there
			// until a vacuum, and "row_no <= last" walked all of them in every batch.
			if _, err := tx.NewDelete().Table("import_rows").
				Where("import_id = ? AND row_no > ? AND row_no <= ?", b.Import, b.After, b.Last).Exec(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return model.ImportCounts{}, false, translate(err)
	}
	if pending {
		s.queued(emailQueue)
	}
	s.deliveriesQueued(delivering)
	return counts, done, nil
}

// lockStagedKeys takes, in tx, the address locks of the batch's valid rows before the batch
// reads the suppression list, as every write that subscribes an address does (see
// store.checkNotSuppressed): a suppression committed while the batch waited is seen.
func (s *Imports) lockStagedKeys(ctx context.Context, tx bun.IDB, b importBatch) error {
	var keys []string
	if err := tx.NewRaw(`SELECT DISTINCT email_key FROM import_rows
WHERE import_id = ? AND row_no > ? AND row_no <= ? AND email_key IS NOT NULL`, b.Import, b.After, b.Last).
		Scan(ctx, &keys); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	return s.lockKeys(ctx, tx, b.Newsletter, keys)
}

// typeLegacyRows validates the batch's rows that an older version staged as uploaded (data)
// and stores them typed, then marks the duplicates among them (earlier batches' addresses are
// in the newsletter by now, and count as existing there).
func (s *Imports) typeLegacyRows(ctx context.Context, tx bun.IDB, b importBatch, def model.Status) error {
	var legacy []stagedRow
	if err := tx.NewSelect().Model(&legacy).Column("row_no", "data").
		Where("import_id = ? AND row_no > ? AND row_no <= ? AND data IS NOT NULL", b.Import, b.After, b.Last).
		Scan(ctx); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	if len(legacy) == 0 {
		return nil
	}
	typed := make([]stagedRow, len(legacy))
	for i, r := range legacy {
		ns, verr := model.ParseImportRow([]byte(*r.Data), def)
		typed[i] = newStagedRow(b.Import, r.RowNo, ns, verr)
	}
	if _, err := tx.NewDelete().Table("import_rows").
		Where("import_id = ? AND row_no > ? AND row_no <= ? AND data IS NOT NULL", b.Import, b.After, b.Last).Exec(ctx); err != nil {
		return err
	}
	// Returning("NULL"): bun would read the nullzero columns back from every row.
	if _, err := tx.NewInsert().Model(&typed).Returning("NULL").Exec(ctx); err != nil {
		return err
	}
	return s.db.eng.markDuplicates(ctx, tx, b.Import, b.After, b.Last)
}

// eventSourceJSON is the "source" object of the events model.NewEvent makes for src: the
// events a batch builds in SQL carry it as it is.
func eventSourceJSON(src model.EventSource) string {
	ev := model.NewEvent(model.EventCreated, model.Subscriber{}, nil, src, time.Time{})
	var w struct {
		Data struct {
			Source json.RawMessage `json:"source"`
		} `json:"data"`
	}
	_ = json.Unmarshal(ev.Payload, &w) // model.NewEvent's own JSON
	return string(w.Data.Source)
}
