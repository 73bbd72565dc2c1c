package repo

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	"github.com/subscriberd/subscriberd/model"
)

type segmentRow struct {
	bun.BaseModel `bun:"table:segments"`

	ID           uuid.UUID `bun:"id,pk,type:uuid"`
	NewsletterID uuid.UUID `bun:"newsletter_id,type:uuid"`
	Name         string    `bun:"name"`
	NameKey      string    `bun:"name_key"`
	Filter       string    `bun:"filter"`
	CreatedAt    time.Time `bun:"created_at"`
	UpdatedAt    time.Time `bun:"updated_at"`
}

func (r *segmentRow) toModel() (model.Segment, error) {
	f, err := model.DecodeFilter([]byte(r.Filter))
	if err != nil {
		return model.Segment{}, err
	}
	return model.Segment{ID: r.ID, NewsletterID: r.NewsletterID, Name: r.Name, Filter: f,
		CreatedAt: r.CreatedAt.UTC(), UpdatedAt: r.UpdatedAt.UTC()}, nil
}

// Segments stores newsletters' segments, saved filters (docs/api-contract.md §20.1).
type Segments struct {
	store
}

// NewSegments returns the segment store on db.
func NewSegments(db *DB) *Segments {
	return &Segments{store: newStore(db)}
}

// Segments returns the segment store bound to the transaction.
func (t Tx) Segments() *Segments { return &Segments{store: t.store()} }

// lockSegments makes the transaction's segment writes of nl wait for each other's until it
// ends (the newsletter's row, FOR NO KEY UPDATE: subscribers' inserts, whose foreign key
// takes KEY SHARE on it, do not wait), so that the limit and the name's uniqueness are
// judged on what is committed. SQLite's immediate transaction holds the write lock already.
func (s *Segments) lockSegments(ctx context.Context, tx bun.IDB, nl uuid.UUID) error {
	_, err := s.db.eng.raw(tx, "SELECT 1 FROM newsletters WHERE id = ? FOR NO KEY UPDATE", nl).Exec(ctx)
	return err
}

// nameTaken reports whether another segment of nl than id has the name key.
func nameTaken(ctx context.Context, tx bun.IDB, nl, id uuid.UUID, key string) (bool, error) {
	var n int
	err := tx.NewRaw("SELECT count(*) FROM segments WHERE newsletter_id = ? AND name_key = ? AND id <> ?", nl, key, id).
		Scan(ctx, &n)
	return n > 0, err
}

func nameTakenError() error {
	return (*model.ValidationError)(nil).Add("name", model.MsgSegmentNameTaken)
}

// Create stores a new segment. A name the newsletter has already (case-insensitively) is a
// *model.ValidationError keyed name; a newsletter with model.MaxSegments segments gets one keyed
// body. Both are judged under the newsletter's lock (lockSegments), so that concurrent creates
// cannot pass them together; the unique index stands behind the first.
func (s *Segments) Create(ctx context.Context, nl uuid.UUID, in model.NewSegment) (model.Segment, error) {
	now := s.now().Truncate(time.Microsecond) // as stored: the answer is what a read returns
	row := segmentRow{ID: uuid.Must(uuid.NewV7()), NewsletterID: nl, Name: in.Name, NameKey: model.SegmentNameKey(in.Name),
		Filter: string(in.Filter.JSON()), CreatedAt: now, UpdatedAt: now}
	err := s.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		if err := s.lockSegments(ctx, tx, nl); err != nil {
			return translate(err)
		}
		var n int
		if err := tx.NewRaw("SELECT count(*) FROM segments WHERE newsletter_id = ?", nl).Scan(ctx, &n); err != nil {
			return translate(err)
		}
		if n >= model.MaxSegments {
			return (*model.ValidationError)(nil).Add("body", model.MsgSegmentLimit)
		}
		switch taken, err := nameTaken(ctx, tx, nl, row.ID, row.NameKey); {
		case err != nil:
			return translate(err)
		case taken:
			return nameTakenError()
		}
		_, err := tx.NewInsert().Model(&row).Exec(ctx)
		return translate(err)
	})
	if err != nil {
		return model.Segment{}, err
	}
	return row.toModel()
}

// List returns up to limit of the newsletter's segments sorted by name (compared as
// model.SegmentNameKey, by code point), those after the name key after when it is not "".
func (s *Segments) List(ctx context.Context, nl uuid.UUID, after string, limit int) ([]model.Segment, error) {
	var rows []segmentRow
	q := s.idb.NewSelect().Model(&rows).Where("newsletter_id = ?", nl)
	if after != "" {
		q = q.Where("name_key > ?", after)
	}
	if err := q.OrderExpr("name_key").Limit(limit).Scan(ctx); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, translate(err)
	}
	out := make([]model.Segment, len(rows))
	for i := range rows {
		seg, err := rows[i].toModel()
		if err != nil {
			return nil, err
		}
		out[i] = seg
	}
	return out, nil
}

func (s *Segments) get(ctx context.Context, db bun.IDB, nl, id uuid.UUID) (model.Segment, error) {
	var row segmentRow
	err := db.NewSelect().Model(&row).Where("newsletter_id = ? AND id = ?", nl, id).Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return model.Segment{}, fmt.Errorf("%w", model.ErrSegmentNotFound)
	}
	if err != nil {
		return model.Segment{}, translate(err)
	}
	return row.toModel()
}

// Get returns one segment of the newsletter with its exact member count now: the subscribers
// its filter selects, counted in one statement with the filtered list's conditions (and
// indexes). An unknown id is model.ErrSegmentNotFound.
func (s *Segments) Get(ctx context.Context, nl, id uuid.UUID) (model.Segment, int64, error) {
	seg, err := s.get(ctx, s.idb, nl, id)
	if err != nil {
		return model.Segment{}, 0, err
	}
	n, err := s.db.eng.countMatching(ctx, s.idb, nl, seg.Filter)
	if err != nil {
		return model.Segment{}, 0, translate(err)
	}
	return seg, n, nil
}

// Filter returns the filter of one segment of the newsletter, or model.ErrSegmentNotFound:
// what a list or a bulk action selecting by the segment evaluates now.
func (s *Segments) Filter(ctx context.Context, nl, id uuid.UUID) (model.Filter, error) {
	seg, err := s.get(ctx, s.idb, nl, id)
	if err != nil {
		return model.Filter{}, err
	}
	return seg.Filter, nil
}

// Update applies p: a name given renames (uniqueness as in Create, under the same lock), a
// filter given replaces the stored one. It returns the segment as it is now, or
// model.ErrSegmentNotFound.
func (s *Segments) Update(ctx context.Context, nl, id uuid.UUID, p model.SegmentPatch) (model.Segment, error) {
	var out model.Segment
	err := s.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		if p.Name != nil {
			if err := s.lockSegments(ctx, tx, nl); err != nil {
				return translate(err)
			}
		}
		var row segmentRow
		err := s.db.eng.raw(tx, "SELECT * FROM segments WHERE newsletter_id = ? AND id = ? FOR NO KEY UPDATE", nl, id).Scan(ctx, &row)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w", model.ErrSegmentNotFound)
		}
		if err != nil {
			return translate(err)
		}
		cur, err := row.toModel()
		if err != nil {
			return err
		}
		changed := false
		if p.Name != nil {
			key := model.SegmentNameKey(*p.Name)
			switch taken, err := nameTaken(ctx, tx, nl, id, key); {
			case err != nil:
				return translate(err)
			case taken:
				return nameTakenError()
			}
			changed = *p.Name != row.Name
			row.Name, row.NameKey = *p.Name, key
		}
		if p.Filter != nil {
			changed = changed || p.Filter.Key() != cur.Filter.Key()
			row.Filter = string(p.Filter.JSON())
		}
		if !changed { // the values already there: nothing is written, not even updated_at
			out = cur
			return nil
		}
		row.UpdatedAt = s.now().Truncate(time.Microsecond)
		if _, err := tx.NewUpdate().Model(&row).Column("name", "name_key", "filter", "updated_at").WherePK().Exec(ctx); err != nil {
			return translate(err)
		}
		seg, err := row.toModel()
		out = seg
		return err
	})
	if err != nil {
		return model.Segment{}, err
	}
	return out, nil
}

// Delete removes one segment of the newsletter and returns it as it was, or
// model.ErrSegmentNotFound.
func (s *Segments) Delete(ctx context.Context, nl, id uuid.UUID) (model.Segment, error) {
	var row segmentRow
	err := s.atomic(ctx, func(ctx context.Context) error {
		return s.idb.NewDelete().Model(&row).Where("newsletter_id = ? AND id = ?", nl, id).Returning("*").Scan(ctx)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return model.Segment{}, fmt.Errorf("%w", model.ErrSegmentNotFound)
	}
	if err != nil {
		return model.Segment{}, translate(err)
	}
	return row.toModel()
}
