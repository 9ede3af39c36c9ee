package store

import (
	"context"
	"fmt"
)

// MaxWeight is the largest fair-share weight a tenant may have.
const MaxWeight = 1000

// SetWeight sets the tenant's weight in its lanes' fair share, 1 to
// MaxWeight.
func (s *Store) SetWeight(ctx context.Context, tenantID string, weight int) error {
	if weight < 1 || weight > MaxWeight {
		return fmt.Errorf("store: set weight: weight must be 1 to %d", MaxWeight)
	}
	tag, err := s.pool.Exec(ctx, `UPDATE tenants SET weight = $2 WHERE id = $1`, tenantID, weight)
	if err != nil {
		return fmt.Errorf("store: set weight: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// Weights are the fair-share weights of the tenants whose weight is not
// the default 1.
func (s *Store) Weights(ctx context.Context) (map[string]int, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, weight FROM tenants WHERE weight <> 1`)
	if err != nil {
		return nil, fmt.Errorf("store: weights: %w", err)
	}
	defer rows.Close()
	m := map[string]int{}
	for rows.Next() {
		var id string
		var w int
		if err := rows.Scan(&id, &w); err != nil {
			return nil, fmt.Errorf("store: weights: %w", err)
		}
		m[id] = w
	}
	return m, rows.Err()
}

// OpenWork counts the tenant's work in lane still queued or running, up to
// limit: the cost of the count is bounded by the limit, not the backlog.
func (s *Store) OpenWork(ctx context.Context, tenantID, lane string, limit int) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM work
		WHERE tenant_id = $1 AND lane = $2 AND state IN ('queued', 'running') LIMIT $3) o`,
		tenantID, lane, limit).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("store: open work: %w", err)
	}
	return n, nil
}
