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
	// CachedInputUnits are the part of InputUnits read from the provider's
	// prompt cache, priced at the cached-input price; ReasoningUnits the
	// part of OutputUnits spent on hidden reasoning.
	CachedInputUnits int64
	ReasoningUnits   int64
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
				occurred_at = $9, cached_input_units = $11, reasoning_units = $12, estimated = false, recorded_at = now()
			FROM (SELECT attempt_id, cost_micros FROM ledger WHERE attempt_id = $1 AND estimated FOR UPDATE) old
			WHERE l.attempt_id = old.attempt_id RETURNING old.cost_micros`,
			r.AttemptID, Text(r.Model), r.Outcome, r.UpstreamAttempts, r.InputUnits, r.OutputUnits, r.CostMicros,
			r.LatencyMS, r.OccurredAt, Text(r.ServedModel), r.CachedInputUnits, r.ReasoningUnits).Scan(&was)
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
				upstream_attempts, input_units, output_units, cost_micros, latency_ms, occurred_at, estimated, shadow,
				cached_input_units, reasoning_units)
			VALUES ($1, $2, $3, $4, nullif($5, ''), $6, $7, $8, $9, $10, $11, $12, $13,
				coalesce((SELECT w.shadow_of IS NOT NULL FROM work w WHERE w.id = $3), false), $14, $15)
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
		r.InputUnits, r.OutputUnits, r.CostMicros, r.LatencyMS, r.OccurredAt, r.Estimated, r.CachedInputUnits, r.ReasoningUnits}
}

// LedgerResult is what recording one row of a batch did.
type LedgerResult struct {
	Recorded Recorded
	Excess   int64
	Err      error
}

// RecordLedgerBatch records rows as RecordLedger records each, new rows in
// one statement: a batch of attempts costs one statement and one commit.
// Each row is decided alone — inserted, or already there — and the budget
// periods are settled by the sums of their rows. When the statement
// fails, each row is recorded on its own, so a row the database refuses for
// good fails alone.
func (s *Store) RecordLedgerBatch(ctx context.Context, rows []LedgerRow) []LedgerResult {
	out := make([]LedgerResult, len(rows))
	if len(rows) == 1 {
		out[0].Recorded, out[0].Excess, out[0].Err = s.RecordLedger(ctx, rows[0])
		return out
	}
	inserted, excess, err := s.recordLedgerGroup(ctx, rows)
	if err != nil {
		for i, r := range rows {
			out[i].Recorded, out[i].Excess, out[i].Err = s.RecordLedger(ctx, r)
		}
		return out
	}
	first := map[string]int{} // an attempt named twice in one batch is inserted once
	for i, r := range rows {
		j, seen := first[r.AttemptID]
		if !seen {
			first[r.AttemptID] = i
		}
		switch {
		case !seen && inserted[r.AttemptID]:
			out[i] = LedgerResult{Recorded: Inserted, Excess: excess[r.AttemptID]}
		case r.Estimated || (seen && out[j].Recorded == Inserted && !rows[j].Estimated):
			// An estimate never replaces a row, and a report named twice
			// counts once; a report after this group's estimate of its
			// attempt replaces that estimate below.
			out[i].Recorded = Duplicate
		default:
			// Already there: the real report may replace an estimate.
			out[i].Recorded, out[i].Excess, out[i].Err = s.RecordLedger(ctx, r)
		}
	}
	return out
}

// recordLedgerGroup inserts the rows that are new and settles their
// reservations, in one statement, and records each new row's excess. It
// answers which attempts it inserted and what each cost beyond its
// reservation.
func (s *Store) recordLedgerGroup(ctx context.Context, rows []LedgerRow) (map[string]bool, map[string]int64, error) {
	var a struct {
		attempt, tenant, work, model, served, outcome []string
		upstream                                      []int32
		in, out, cost, latency, cached, reasoning     []int64
		at                                            []time.Time
		estimated                                     []bool
	}
	for _, r := range rows {
		a.attempt, a.tenant, a.work = append(a.attempt, r.AttemptID), append(a.tenant, r.TenantID), append(a.work, r.WorkID)
		a.model, a.served, a.outcome = append(a.model, Text(r.Model)), append(a.served, Text(r.ServedModel)), append(a.outcome, r.Outcome)
		a.upstream = append(a.upstream, int32(r.UpstreamAttempts))
		a.in, a.out, a.cost, a.latency = append(a.in, r.InputUnits), append(a.out, r.OutputUnits), append(a.cost, r.CostMicros), append(a.latency, r.LatencyMS)
		a.at, a.estimated = append(a.at, r.OccurredAt), append(a.estimated, r.Estimated)
		a.cached, a.reasoning = append(a.cached, r.CachedInputUnits), append(a.reasoning, r.ReasoningUnits)
	}
	inserted, excess := map[string]bool{}, map[string]int64{}
	var over []string
	var overBy []int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		got, err := tx.Query(ctx, recordLedgerGroupSQL, a.attempt, a.tenant, a.work, a.model, a.served, a.outcome, a.upstream,
			a.in, a.out, a.cost, a.latency, a.at, a.estimated, a.cached, a.reasoning)
		if err != nil {
			return err
		}
		var id string
		var e int64
		if _, err := pgx.ForEachRow(got, []any{&id, &e}, func() error {
			inserted[id], excess[id] = true, e
			if e > 0 {
				over, overBy = append(over, id), append(overBy, e)
			}
			return nil
		}); err != nil {
			return err
		}
		if len(over) > 0 {
			_, err = tx.Exec(ctx, `UPDATE ledger l SET excess_micros = x.e FROM unnest($1::uuid[], $2::bigint[]) AS x(id, e)
				WHERE l.attempt_id = x.id`, over, overBy)
		}
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("store: ledger group: %w", err)
	}
	return inserted, excess, nil
}

// recordLedgerGroupSQL is recordLedgerSQL for many rows: it inserts the new
// ones, settles their reservations, moves each budget period by the sums
// of its rows (a period is updated once per statement), and answers each
// inserted attempt with what it cost beyond its reservation.
const recordLedgerGroupSQL = `WITH x AS (
			SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int[],
				$8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[], $12::timestamptz[], $13::bool[], $14::bigint[], $15::bigint[])
				AS x(attempt_id, tenant_id, work_id, model, served, outcome, upstream, input_units, output_units, cost, latency, at, estimated,
					cached, reasoning)
		), ins AS (
			INSERT INTO ledger (attempt_id, tenant_id, work_id, model, served_model, outcome,
				upstream_attempts, input_units, output_units, cost_micros, latency_ms, occurred_at, estimated, shadow,
				cached_input_units, reasoning_units)
			SELECT x.attempt_id, x.tenant_id, x.work_id, x.model, nullif(x.served, ''), x.outcome, x.upstream, x.input_units,
				x.output_units, x.cost, x.latency, x.at, x.estimated,
				coalesce((SELECT w.shadow_of IS NOT NULL FROM work w WHERE w.id = x.work_id), false), x.cached, x.reasoning
			FROM x
			ON CONFLICT (attempt_id) DO NOTHING RETURNING attempt_id, tenant_id, cost_micros
		), res AS (
			UPDATE budget_reservations r SET settled_at = now() FROM ins
			WHERE r.attempt_id = ins.attempt_id AND r.settled_at IS NULL
			RETURNING r.attempt_id, r.period_start, r.amount_micros
		), reserved AS (
			UPDATE budget_periods p SET reserved_micros = p.reserved_micros - g.amount, spent_micros = p.spent_micros + g.cost
			FROM (SELECT ins.tenant_id, res.period_start, sum(res.amount_micros) AS amount, sum(ins.cost_micros) AS cost
				FROM res JOIN ins ON ins.attempt_id = res.attempt_id GROUP BY 1, 2) g
			WHERE p.tenant_id = g.tenant_id AND p.period_start = g.period_start RETURNING 1
		), unreserved AS (
			UPDATE budget_periods p SET spent_micros = greatest(p.spent_micros + g.cost, 0)
			FROM (SELECT ins.tenant_id, sum(ins.cost_micros) AS cost FROM ins
				WHERE NOT EXISTS (SELECT 1 FROM res WHERE res.attempt_id = ins.attempt_id) GROUP BY 1) g,
				tenants t
			WHERE t.id = g.tenant_id AND t.budget_micros IS NOT NULL AND p.tenant_id = t.id
				AND p.period_start = budget_period_start(t.budget_period, now()) RETURNING 1
		)
		SELECT ins.attempt_id::text, coalesce(greatest(ins.cost_micros - res.amount_micros, 0), 0)
		FROM ins LEFT JOIN res ON res.attempt_id = ins.attempt_id`

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
