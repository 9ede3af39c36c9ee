package store

import (
	"context"
	"errors"
	"fmt"
	"sort"
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
	err = s.pool.QueryRow(ctx, recordLedgerSQL, ledgerArgs(r)...).Scan(&inserted, &excess)
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

// recordLedgerSQL inserts a ledger row and settles its attempt's budget
// reservation, in one statement; it answers whether the row is new and
// what it cost beyond its reservation. A shadow work's row is marked
// shadow, and charged to the tenant like any other.
const recordLedgerSQL = `WITH ins AS (
			INSERT INTO ledger (attempt_id, tenant_id, work_id, model, served_model, outcome,
				upstream_attempts, input_units, output_units, cost_micros, latency_ms, occurred_at, estimated, shadow)
			VALUES ($1, $2, $3, $4, nullif($5, ''), $6, $7, $8, $9, $10, $11, $12, $13,
				coalesce((SELECT w.shadow_of IS NOT NULL FROM work w WHERE w.id = $3), false))
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
		SELECT EXISTS (SELECT 1 FROM ins), coalesce((SELECT greatest($10 - amount_micros, 0) FROM res), 0)`

func ledgerArgs(r LedgerRow) []any {
	return []any{r.AttemptID, r.TenantID, r.WorkID, Text(r.Model), Text(r.ServedModel), r.Outcome, r.UpstreamAttempts,
		r.InputUnits, r.OutputUnits, r.CostMicros, r.LatencyMS, r.OccurredAt, r.Estimated}
}

// LedgerResult is what recording one row of a batch did.
type LedgerResult struct {
	Recorded Recorded
	Excess   int64
	Err      error
}

// RecordLedgerBatch records rows as RecordLedger records each, new rows in
// one transaction sent in one round trip, so a batch of attempts costs one
// commit. When the transaction fails, each row is recorded on its own, so
// a row the database refuses for good fails alone.
func (s *Store) RecordLedgerBatch(ctx context.Context, rows []LedgerRow) []LedgerResult {
	out := make([]LedgerResult, len(rows))
	if len(rows) == 1 {
		out[0].Recorded, out[0].Excess, out[0].Err = s.RecordLedger(ctx, rows[0])
		return out
	}
	// Tenants in one order, so two batches settling the same budget
	// periods take their locks alike and never wait on each other in turn.
	order := make([]int, len(rows))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return rows[order[a]].TenantID < rows[order[b]].TenantID })
	inserted := make([]bool, len(rows))
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		for _, i := range order {
			b.Queue(recordLedgerSQL, ledgerArgs(rows[i])...)
		}
		br := tx.SendBatch(ctx, b)
		for _, i := range order {
			if err := br.QueryRow().Scan(&inserted[i], &out[i].Excess); err != nil {
				br.Close()
				return err
			}
		}
		if err := br.Close(); err != nil {
			return err
		}
		for i, r := range rows {
			if inserted[i] && out[i].Excess > 0 {
				if _, err := tx.Exec(ctx, `UPDATE ledger SET excess_micros = $2 WHERE attempt_id = $1`, r.AttemptID, out[i].Excess); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		for i, r := range rows {
			out[i] = LedgerResult{}
			out[i].Recorded, out[i].Excess, out[i].Err = s.RecordLedger(ctx, r)
		}
		return out
	}
	for i, r := range rows {
		switch {
		case inserted[i]:
			out[i].Recorded = Inserted
		case r.Estimated:
			out[i].Recorded = Duplicate
		default:
			// Already there: the real report may replace an estimate.
			out[i].Recorded, out[i].Excess, out[i].Err = s.RecordLedger(ctx, r)
		}
	}
	return out
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
