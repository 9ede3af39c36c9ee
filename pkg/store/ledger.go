package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// LedgerRow is one attempt as the ledger keeps it.
type LedgerRow struct {
	AttemptID string
	TenantID  string
	WorkID    string
	// Model is the model asked for, which prices the row; ServedModel the
	// name the provider answered with, when it differs.
	Model            string
	ServedModel      string
	Outcome          string
	UpstreamAttempts int
	InputUnits       int64
	OutputUnits      int64
	CostMicros       int64
	LatencyMS        int64
	OccurredAt       time.Time
	// Estimated marks a row the ledger wrote for an attempt whose worker
	// died before reporting: no units, the reservation as its cost. The
	// attempt's own event, should it still arrive, replaces it.
	Estimated bool
}

// Recorded says what RecordLedger did with a row.
type Recorded int

// What RecordLedger did.
const (
	// Duplicate: the attempt was already in the ledger; nothing changed.
	Duplicate Recorded = iota
	// Inserted: a new row.
	Inserted
	// Replaced: the attempt's report replaced the estimate the reaper
	// had written for it.
	Replaced
)

// AppendLedger records an attempt once; a redelivered event changes
// nothing. inserted=false means it was already there.
func (s *Store) AppendLedger(ctx context.Context, r LedgerRow) (inserted bool, err error) {
	rec, _, err := s.RecordLedger(ctx, r)
	return rec != Duplicate, err
}

// RecordLedger records an attempt once; a redelivered event changes
// nothing. The one exception is an estimated row: the attempt's real report
// replaces it (the row count stays one per attempt) and the budget is
// corrected by the difference. excess is what the attempt cost beyond its
// budget reservation, recorded on the row.
func (s *Store) RecordLedger(ctx context.Context, r LedgerRow) (rec Recorded, excess int64, err error) {
	// The row and the settlement of the attempt's budget reservation are
	// one statement, so a redelivery neither records nor settles twice.
	var inserted bool
	err = s.pool.QueryRow(ctx, `WITH ins AS (
			INSERT INTO ledger (attempt_id, tenant_id, work_id, model, served_model, outcome,
				upstream_attempts, input_units, output_units, cost_micros, latency_ms, occurred_at, estimated)
			VALUES ($1, $2, $3, $4, nullif($5, ''), $6, $7, $8, $9, $10, $11, $12, $13)
			ON CONFLICT (attempt_id) DO NOTHING RETURNING attempt_id),
		res AS (UPDATE budget_reservations SET settled_at = now()
			WHERE attempt_id = $1 AND settled_at IS NULL AND EXISTS (SELECT 1 FROM ins)
			RETURNING period_start, amount_micros),
		reserved AS (UPDATE budget_periods p SET reserved_micros = p.reserved_micros - res.amount_micros,
				spent_micros = p.spent_micros + $10
			FROM res WHERE p.tenant_id = $2 AND p.period_start = res.period_start RETURNING 1),
		unreserved AS (UPDATE budget_periods p SET spent_micros = greatest(p.spent_micros + $10, 0)
			FROM tenants t WHERE EXISTS (SELECT 1 FROM ins) AND NOT EXISTS (SELECT 1 FROM res)
				AND t.id = $2 AND t.budget_micros IS NOT NULL AND p.tenant_id = t.id
				AND p.period_start = budget_period_start(t.budget_period, now()) RETURNING 1)
		SELECT EXISTS (SELECT 1 FROM ins), coalesce((SELECT greatest($10 - amount_micros, 0) FROM res), 0)`,
		r.AttemptID, r.TenantID, r.WorkID, Text(r.Model), Text(r.ServedModel), r.Outcome, r.UpstreamAttempts, r.InputUnits,
		r.OutputUnits, r.CostMicros, r.LatencyMS, r.OccurredAt, r.Estimated).Scan(&inserted, &excess)
	if err != nil {
		return Duplicate, 0, fmt.Errorf("store: ledger %s: %w", r.AttemptID, err)
	}
	if inserted {
		if excess > 0 {
			if _, err := s.pool.Exec(ctx, `UPDATE ledger SET excess_micros = $2 WHERE attempt_id = $1`, r.AttemptID, excess); err != nil {
				return Inserted, excess, fmt.Errorf("store: ledger %s excess: %w", r.AttemptID, err)
			}
		}
		return Inserted, excess, nil
	}
	if r.Estimated {
		return Duplicate, 0, nil
	}
	// Already there: the attempt's real report replaces an estimate.
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rec = Duplicate
		var was int64
		err := tx.QueryRow(ctx, `UPDATE ledger l SET model = $2, served_model = nullif($10, ''), outcome = $3,
				upstream_attempts = $4, input_units = $5, output_units = $6, cost_micros = $7, latency_ms = $8,
				occurred_at = $9, estimated = false, recorded_at = now()
			FROM (SELECT attempt_id, cost_micros FROM ledger WHERE attempt_id = $1 AND estimated FOR UPDATE) old
			WHERE l.attempt_id = old.attempt_id RETURNING old.cost_micros`,
			r.AttemptID, Text(r.Model), r.Outcome, r.UpstreamAttempts, r.InputUnits, r.OutputUnits, r.CostMicros,
			r.LatencyMS, r.OccurredAt, Text(r.ServedModel)).Scan(&was)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		rec = Replaced
		return respend(ctx, tx, r.TenantID, r.AttemptID, r.CostMicros-was)
	})
	if err != nil {
		return Duplicate, 0, fmt.Errorf("store: ledger %s: %w", r.AttemptID, err)
	}
	return rec, 0, nil
}

// WorkCost sums the ledger for one work item: attempts and cost.
func (s *Store) WorkCost(ctx context.Context, workID string) (attempts int, costMicros int64, err error) {
	err = s.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(cost_micros), 0) FROM ledger WHERE work_id = $1`,
		workID).Scan(&attempts, &costMicros)
	return attempts, costMicros, err
}

// LedgerCountByTenant counts every ledger row per tenant.
func (s *Store) LedgerCountByTenant(ctx context.Context) (map[string]int64, error) {
	return s.LedgerCountByTenantSince(ctx, time.Time{})
}
