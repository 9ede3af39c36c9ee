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
	// one transaction, so a redelivery neither records nor settles twice.
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rec = Duplicate
		tag, err := tx.Exec(ctx, `INSERT INTO ledger (attempt_id, tenant_id, work_id, model, served_model, outcome,
				upstream_attempts, input_units, output_units, cost_micros, latency_ms, occurred_at, estimated)
			VALUES ($1, $2, $3, $4, nullif($5, ''), $6, $7, $8, $9, $10, $11, $12, $13) ON CONFLICT (attempt_id) DO NOTHING`,
			r.AttemptID, r.TenantID, r.WorkID, Text(r.Model), Text(r.ServedModel), r.Outcome, r.UpstreamAttempts, r.InputUnits,
			r.OutputUnits, r.CostMicros, r.LatencyMS, r.OccurredAt, r.Estimated)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 1 {
			rec = Inserted
			if excess, err = settle(ctx, tx, r.TenantID, r.AttemptID, r.CostMicros); err != nil || excess == 0 {
				return err
			}
			_, err = tx.Exec(ctx, `UPDATE ledger SET excess_micros = $2 WHERE attempt_id = $1`, r.AttemptID, excess)
			return err
		}
		if r.Estimated {
			return nil
		}
		var was int64
		err = tx.QueryRow(ctx, `UPDATE ledger l SET model = $2, served_model = nullif($10, ''), outcome = $3,
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
	return rec, excess, nil
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
