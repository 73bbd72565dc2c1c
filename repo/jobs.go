package repo

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"
)

// jobTable is a table of background jobs that the workers of package importer process in
// batches, imports and bulk actions alike, by the same rules: a newsletter runs one job at a
// time and the others wait in created order; a worker claims a job with a lease, which its
// heartbeat renews (Extend) and a batch renews when it commits; a job whose worker stopped is
// claimed again once its lease has run out, and resumes after its last committed batch. The
// table has the columns id, newsletter_id, state ('queued', 'running', …), claim, lease_until,
// started_at, created_at and updated_at, and a unique index that lets one job per newsletter
// be running.
type jobTable string

const (
	importJobs jobTable = "imports"
	bulkJobs   jobTable = "bulk_actions"
)

// claimJob takes the oldest job of t that is due, for lease, into row (a row type of t): the
// oldest queued one of a newsletter with no job running (a newer one waits even while another
// worker is claiming the older), or a running one whose worker's lease ran out. Jobs another
// worker is claiming are skipped, not waited for. It returns the new claim; ok is false when
// none is due.
func claimJob[R any](ctx context.Context, s *store, t jobTable, lease time.Duration, row *R) (claim uuid.UUID, ok bool, err error) {
	now := s.now()
	claim = uuid.Must(uuid.NewV7())
	var rows []R
	err = s.db.eng.raw(s.idb, `UPDATE `+string(t)+` SET state = 'running', claim = ?, lease_until = ?,
    started_at = coalesce(started_at, ?), updated_at = ?
WHERE id = (
    SELECT j.id FROM `+string(t)+` AS j
    WHERE (j.state = 'queued'
           AND NOT EXISTS (SELECT 1 FROM `+string(t)+` AS r WHERE r.newsletter_id = j.newsletter_id AND r.state = 'running')
           AND NOT EXISTS (SELECT 1 FROM `+string(t)+` AS o WHERE o.newsletter_id = j.newsletter_id AND o.state = 'queued'
                               AND (o.created_at, o.id) < (j.created_at, j.id)))
       OR (j.state = 'running' AND j.lease_until < ?)
    ORDER BY j.created_at, j.id
    LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING *`, claim, now.Add(lease), now, now, now).Scan(ctx, &rows)
	switch {
	case sqlState(err) == "23505":
		// Another worker started a job of the same newsletter meanwhile: this one waits.
		return uuid.Nil, false, nil
	case err != nil && !errors.Is(err, sql.ErrNoRows):
		return uuid.Nil, false, translate(err)
	case len(rows) == 0:
		return uuid.Nil, false, nil
	}
	*row = rows[0]
	return claim, true, nil
}

// release gives up the claim of job id of t, so that another worker (or the next start)
// takes it up at once rather than after the lease.
func (t jobTable) release(ctx context.Context, s *store, id, claim uuid.UUID) error {
	_, err := s.idb.NewUpdate().Table(string(t)).Set("lease_until = ?", s.now()).
		Where("id = ? AND claim = ? AND state = 'running'", id, claim).Exec(ctx)
	return translate(err)
}

// extend renews the lease of the running jobs of t whose claims a worker still holds (its
// heartbeat, outbox.Heartbeat): their lease moves to now+lease. A job whose batch holds its
// row right now is skipped, not waited for: the batch renews the lease when it commits, and no
// other worker can claim the job meanwhile (the claim skips rows held too). Jobs no longer
// running, or claimed by another worker since, are left alone.
func (t jobTable) extend(ctx context.Context, s *store, claims []uuid.UUID, lease time.Duration) error {
	if len(claims) == 0 {
		return nil
	}
	_, err := s.db.eng.raw(s.idb, `UPDATE `+string(t)+` SET lease_until = ?0
WHERE id IN (SELECT id FROM `+string(t)+` WHERE claim IN (?1) AND state = 'running' FOR UPDATE SKIP LOCKED)`,
		s.now().Add(lease), bun.List(claims)).Exec(ctx)
	return translate(err)
}

// cancelJob cancels the newsletter's queued or running job id of t, in one transaction: its
// row, read into row (a row type of t) as it is after the cancel, becomes cancelled, finished
// now and unclaimed, and its staged work (the rows of targets whose column job names it) goes;
// what its batches did stays. where narrows the jobs a caller may see (an extra condition, or
// ""). An unknown job is notFound, a finished one finished.
func cancelJob[R any](ctx context.Context, s *store, t jobTable, targets, job, where string, nl, id uuid.UUID, row *R,
	notFound, finished error) error {
	cond := "id = ? AND newsletter_id = ?"
	if where != "" {
		cond += " AND " + where
	}
	return s.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		var state string
		err := s.db.eng.raw(tx, "SELECT state FROM "+string(t)+" WHERE "+cond+" FOR UPDATE", id, nl).Scan(ctx, &state)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("%w", notFound)
		case err != nil:
			return err
		case state != "queued" && state != "running":
			return fmt.Errorf("%w", finished)
		}
		now := s.now()
		var rows []R
		if err := tx.NewRaw(`UPDATE `+string(t)+` SET state = 'cancelled', finished_at = ?, claim = NULL, lease_until = NULL,
    updated_at = ? WHERE id = ? RETURNING *`, now, now, id).Scan(ctx, &rows); err != nil {
			return err
		}
		*row = rows[0]
		_, err = tx.NewDelete().Table(targets).Where(job+" = ?", id).Exec(ctx)
		return err
	})
}
