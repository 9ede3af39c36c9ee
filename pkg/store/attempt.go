package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Attempt is one claim and one model call.
type Attempt struct {
	ID         string     `json:"attemptId"`
	WorkID     string     `json:"workId"`
	TenantID   string     `json:"tenantId"`
	Number     int        `json:"number"`
	Outcome    string     `json:"outcome"`
	Reason     string     `json:"reason,omitempty"`
	StartedAt  time.Time  `json:"startedAt"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
}

// Tx runs fn in one transaction.
func (s *Store) Tx(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.Pool, fn)
}

// FinishAttempt records how an attempt ended. The raw response stays in the
// cell for diagnosis.
func (s *Store) FinishAttempt(ctx context.Context, tx pgx.Tx, attemptID, outcome, reason, raw string) error {
	_, err := tx.Exec(ctx, `UPDATE attempts SET outcome = $2, reason = nullif($3, ''),
			raw_response = coalesce(nullif($4, ''), raw_response), finished_at = coalesce(finished_at, now())
		WHERE id = $1`, attemptID, outcome, reason, raw)
	if err != nil {
		return fmt.Errorf("store: finish attempt %s: %w", attemptID, err)
	}
	return nil
}

// Attempts lists a work item's attempts in order.
func (s *Store) Attempts(ctx context.Context, workID string) ([]Attempt, error) {
	rows, err := s.Pool.Query(ctx, `SELECT id::text, work_id, tenant_id, number, coalesce(outcome, 'running'),
			coalesce(reason, ''), started_at, finished_at
		FROM attempts WHERE work_id = $1 ORDER BY number`, workID)
	if err != nil {
		return nil, fmt.Errorf("store: attempts %s: %w", workID, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Attempt, error) {
		var a Attempt
		err := r.Scan(&a.ID, &a.WorkID, &a.TenantID, &a.Number, &a.Outcome, &a.Reason, &a.StartedAt, &a.FinishedAt)
		return a, err
	})
}

// MarkStale records that an attempt's answer came from a lease that is no
// longer the work's. The attempt that decided the work keeps its verdict,
// and an attempt already marked is left alone: marked says whether this
// call changed it.
func (s *Store) MarkStale(ctx context.Context, attemptID string) (marked bool, err error) {
	return markLost(ctx, s.Pool, attemptID)
}
