package store

import (
	"context"
	"fmt"
	"time"
)

// PacePublication schedules a pending publication's next try at next
// without counting a try: nothing was sent, since the installation's
// GitHub write budget had no room. Its backoff does not grow, and msg says
// why it waits.
func (s *Store) PacePublication(ctx context.Context, workID, target, msg string, next time.Time) error {
	return s.recordPublication(ctx, `UPDATE publications SET last_error = $3, next_try_at = $4, updated_at = now()
		WHERE work_id = $1 AND target = $2 AND state = 'pending'`, workID, target, Text(msg), next)
}

// SupersedePublication ends a publication of outcome that was not made as
// superseded, with reason naming the revision that replaces it; one made
// already is left as it is.
func (s *Store) SupersedePublication(ctx context.Context, workID, target, tenant, outcome, reason string) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO publications (work_id, target, tenant_id, outcome, state, reason)
		VALUES ($1, $2, $3, $4, 'superseded', $5)
		ON CONFLICT (work_id, target) DO UPDATE SET outcome = $4, state = 'superseded', reason = $5, next_try_at = NULL,
			updated_at = now()
		WHERE publications.state <> 'published' OR publications.outcome <> $4`,
		workID, target, tenant, outcome, Text(reason))
	if err != nil {
		return fmt.Errorf("store: publication %s/%s: %w", workID, target, err)
	}
	return nil
}
