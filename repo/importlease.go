package repo

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"
)

// Extend renews the lease of the running imports whose claims a worker still holds (its
// heartbeat, outbox.Heartbeat): their lease moves to now+lease. An import whose batch holds its
// row right now is skipped, not waited for: the batch renews the lease when it commits, and no
// other worker can claim the import meanwhile (the claim skips rows held too). Imports no
// longer running, or claimed by another worker since, are left alone.
func (s *Imports) Extend(ctx context.Context, claims []uuid.UUID, lease time.Duration) error {
	if len(claims) == 0 {
		return nil
	}
	_, err := s.db.eng.raw(s.idb, `UPDATE imports SET lease_until = ?0
WHERE id IN (SELECT id FROM imports WHERE claim IN (?1) AND state = 'running' FOR UPDATE SKIP LOCKED)`,
		s.now().Add(lease), bun.List(claims)).Exec(ctx)
	return translate(err)
}
