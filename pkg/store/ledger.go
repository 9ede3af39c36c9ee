package store

import (
	"context"
	"fmt"
	"time"
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
	tag, err := s.Pool.Exec(ctx, `INSERT INTO ledger (attempt_id, tenant_id, work_id, model, outcome,
			upstream_attempts, input_units, output_units, cost_micros, latency_ms, occurred_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (attempt_id) DO NOTHING`,
		r.AttemptID, r.TenantID, r.WorkID, r.Model, r.Outcome, r.UpstreamAttempts, r.InputUnits,
		r.OutputUnits, r.CostMicros, r.LatencyMS, r.OccurredAt)
	if err != nil {
		return false, fmt.Errorf("store: ledger %s: %w", r.AttemptID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// UsageLine is one outcome's totals.
type UsageLine struct {
	Outcome     string `json:"outcome"`
	Calls       int64  `json:"calls"`
	InputUnits  int64  `json:"inputUnits"`
	OutputUnits int64  `json:"outputUnits"`
	CostMicros  int64  `json:"costMicros"`
}

// Usage totals a tenant's ledger by outcome over [from, to).
func (s *Store) Usage(ctx context.Context, tenant string, from, to time.Time) ([]UsageLine, error) {
	rows, err := s.Pool.Query(ctx, `SELECT outcome, count(*),
			coalesce(sum(input_units), 0), coalesce(sum(output_units), 0), coalesce(sum(cost_micros), 0)
		FROM ledger WHERE tenant_id = $1 AND occurred_at >= $2 AND occurred_at < $3
		GROUP BY outcome ORDER BY outcome`, tenant, from, to)
	if err != nil {
		return nil, fmt.Errorf("store: usage: %w", err)
	}
	defer rows.Close()
	var out []UsageLine
	for rows.Next() {
		var u UsageLine
		if err := rows.Scan(&u.Outcome, &u.Calls, &u.InputUnits, &u.OutputUnits, &u.CostMicros); err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, rows.Err()
}

// WorkCost sums the ledger for one work item: attempts and cost.
func (s *Store) WorkCost(ctx context.Context, workID string) (attempts int, costMicros int64, err error) {
	err = s.Pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(cost_micros), 0) FROM ledger WHERE work_id = $1`,
		workID).Scan(&attempts, &costMicros)
	return attempts, costMicros, err
}

// LedgerCountByTenant counts ledger rows per tenant.
func (s *Store) LedgerCountByTenant(ctx context.Context) (map[string]int64, error) {
	rows, err := s.Pool.Query(ctx, `SELECT tenant_id, count(*) FROM ledger GROUP BY tenant_id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var t string
		var n int64
		if err := rows.Scan(&t, &n); err != nil {
			return nil, err
		}
		out[t] = n
	}
	return out, rows.Err()
}
