package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// LedgerRow is one attempt as the ledger keeps it.
type LedgerRow struct {
	AttemptID        string
	TenantID         string
	WorkID           string
	Model            string
	Outcome          string
	UpstreamAttempts int
	InputUnits       int64
	OutputUnits      int64
	CostMicros       int64
	LatencyMS        int64
	OccurredAt       time.Time
}

// AppendLedger records an attempt once; a redelivered event changes
// nothing. inserted=false means it was already there.
func (s *Store) AppendLedger(ctx context.Context, r LedgerRow) (inserted bool, err error) {
	// The row and the settlement of the attempt's budget reservation are
	// one transaction, so a redelivery neither records nor settles twice.
	err = pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO ledger (attempt_id, tenant_id, work_id, model, outcome,
				upstream_attempts, input_units, output_units, cost_micros, latency_ms, occurred_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (attempt_id) DO NOTHING`,
			r.AttemptID, r.TenantID, r.WorkID, r.Model, r.Outcome, r.UpstreamAttempts, r.InputUnits,
			r.OutputUnits, r.CostMicros, r.LatencyMS, r.OccurredAt)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		inserted = true
		return settle(ctx, tx, r.TenantID, r.AttemptID, r.CostMicros)
	})
	if err != nil {
		return false, fmt.Errorf("store: ledger %s: %w", r.AttemptID, err)
	}
	return inserted, nil
}

// WorkCost sums the ledger for one work item: attempts and cost.
func (s *Store) WorkCost(ctx context.Context, workID string) (attempts int, costMicros int64, err error) {
	err = s.Pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(cost_micros), 0) FROM ledger WHERE work_id = $1`,
		workID).Scan(&attempts, &costMicros)
	return attempts, costMicros, err
}

// LedgerCountByTenant counts every ledger row per tenant.
func (s *Store) LedgerCountByTenant(ctx context.Context) (map[string]int64, error) {
	return s.LedgerCountByTenantSince(ctx, time.Time{})
}
