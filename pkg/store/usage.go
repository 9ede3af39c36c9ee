package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// UsageLine totals a tenant's ledger rows that share one key: an outcome
// or a model.
type UsageLine struct {
	Key         string
	Calls       int64
	InputUnits  int64
	OutputUnits int64
	// CachedInputUnits are the input units read from the provider's prompt
	// cache, ReasoningUnits the output units spent on hidden reasoning:
	// parts of InputUnits and OutputUnits.
	CachedInputUnits int64
	ReasoningUnits   int64
	CostMicros       int64
	// Estimated counts the rows, and their cost, that are estimates: calls
	// that left and brought no usage back, and attempts whose worker died.
	EstimatedCalls      int64
	EstimatedCostMicros int64
}

// Usage groupings.
const (
	ByOutcome = "outcome"
	ByModel   = "model"
)

// Usage totals a tenant's ledger over [from, to) grouped by ByOutcome or
// ByModel, in key order.
func (s *Store) Usage(ctx context.Context, tenant string, from, to time.Time, by string) ([]UsageLine, error) {
	if by != ByOutcome && by != ByModel {
		return nil, fmt.Errorf("store: usage by %q", by)
	}
	rows, err := s.pool.Query(ctx, `SELECT `+by+`, count(*),
			coalesce(sum(input_units), 0), coalesce(sum(output_units), 0), coalesce(sum(cost_micros), 0),
			count(*) FILTER (WHERE estimated), coalesce(sum(cost_micros) FILTER (WHERE estimated), 0),
			coalesce(sum(cached_input_units), 0), coalesce(sum(reasoning_units), 0)
		FROM ledger WHERE tenant_id = $1 AND occurred_at >= $2 AND occurred_at < $3
		GROUP BY 1 ORDER BY 1`, tenant, from, to)
	if err != nil {
		return nil, fmt.Errorf("store: usage by %s: %w", by, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (UsageLine, error) {
		var u UsageLine
		err := r.Scan(&u.Key, &u.Calls, &u.InputUnits, &u.OutputUnits, &u.CostMicros, &u.EstimatedCalls, &u.EstimatedCostMicros,
			&u.CachedInputUnits, &u.ReasoningUnits)
		return u, err
	})
}

// MaxOffenders bounds the ids a reconciliation check lists.
const MaxOffenders = 10

// Check is one reconciliation check: how many rows it looked at, how many
// differ from what the fences promise, and the first offending ids.
type Check struct {
	Name      string   // stable, for scripts
	What      string   // what holds when the check passes
	Checked   int64    // rows examined
	Unit      string   // what Checked counts
	Differ    int64    // rows that break the rule
	Offenders []string // up to MaxOffenders ids, sorted
}

// OK reports whether the check found no difference.
func (c Check) OK() bool { return c.Differ == 0 }

// reconcileQueries pair a count of the rows a check examines with the ids
// that break its rule. Work-scoped checks look at work created at or after
// $1; the ledger-scoped one at ledger rows that occurred at or after $1.
var reconcileQueries = []struct {
	name, what, unit string
	checked, bad     string
}{
	{"accepted_one_result", "every accepted work has exactly one result", "accepted work",
		`SELECT count(*) FROM work WHERE state = 'accepted' AND created_at >= $1`,
		`SELECT w.id FROM work w WHERE w.state = 'accepted' AND w.created_at >= $1
			AND (SELECT count(*) FROM results r WHERE r.work_id = w.id) <> 1`},
	{"result_only_accepted", "no result for work that is not accepted", "results",
		`SELECT count(*) FROM results r JOIN work w ON w.id = r.work_id WHERE w.created_at >= $1`,
		`SELECT DISTINCT r.work_id FROM results r JOIN work w ON w.id = r.work_id
			WHERE w.created_at >= $1 AND w.state <> 'accepted'`},
	{"result_attempt_ok", "every result's attempt ended ok, for the same work and tenant", "results",
		`SELECT count(*) FROM results r JOIN work w ON w.id = r.work_id WHERE w.created_at >= $1`,
		`SELECT DISTINCT r.work_id FROM results r JOIN work w ON w.id = r.work_id
			LEFT JOIN attempts a ON a.id = r.attempt_id
			WHERE w.created_at >= $1 AND (a.id IS NULL OR a.outcome IS DISTINCT FROM 'ok'
				OR a.work_id <> r.work_id OR a.tenant_id <> r.tenant_id)`},
	// A lease_expired attempt's worker never reported back, so nobody
	// observed its usage and no ATTEMPT event exists for it; every other
	// finished attempt, canceled ones included, went through the worker's
	// settle step, which emits one. Running attempts (no outcome) are not
	// finished yet; the claimed attempt of a review in parts made no call
	// (its calls are attempts of their own).
	{"attempt_one_ledger_row", "every finished attempt that called the model (outcome set, not lease_expired) has one ledger row with its tenant and work", "finished attempts",
		`SELECT count(*) FROM attempts a JOIN work w ON w.id = a.work_id
			WHERE w.created_at >= $1 AND a.outcome IS NOT NULL AND a.outcome <> 'lease_expired'
				AND a.part IS DISTINCT FROM '*'`,
		`SELECT a.id::text FROM attempts a JOIN work w ON w.id = a.work_id
			WHERE w.created_at >= $1 AND a.outcome IS NOT NULL AND a.outcome <> 'lease_expired'
				AND a.part IS DISTINCT FROM '*'
				AND NOT EXISTS (SELECT 1 FROM ledger l WHERE l.attempt_id = a.id
					AND l.tenant_id = a.tenant_id AND l.work_id = a.work_id)`},
	{"ledger_has_attempt", "no ledger row without its attempt", "ledger rows",
		`SELECT count(*) FROM ledger WHERE occurred_at >= $1`,
		`SELECT l.attempt_id::text FROM ledger l WHERE l.occurred_at >= $1
			AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.id = l.attempt_id)`},
}

// Reconcile runs the consistency checks between work, attempts, results and
// the ledger. Attempts finished moments ago may not be in the ledger yet
// (their event is on its way), so run it on a quiet cell or expect
// transient differences.
func (s *Store) Reconcile(ctx context.Context, since time.Time) ([]Check, error) {
	out := make([]Check, 0, len(reconcileQueries))
	for _, q := range reconcileQueries {
		c := Check{Name: q.name, What: q.what, Unit: q.unit}
		if err := s.pool.QueryRow(ctx, q.checked, since).Scan(&c.Checked); err != nil {
			return nil, fmt.Errorf("store: reconcile %s: %w", q.name, err)
		}
		rows, err := s.pool.Query(ctx, `SELECT id, count(*) OVER () FROM (`+q.bad+`) AS bad (id) ORDER BY id LIMIT $2`,
			since, MaxOffenders)
		if err != nil {
			return nil, fmt.Errorf("store: reconcile %s: %w", q.name, err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id, &c.Differ); err != nil {
				rows.Close()
				return nil, fmt.Errorf("store: reconcile %s: %w", q.name, err)
			}
			c.Offenders = append(c.Offenders, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("store: reconcile %s: %w", q.name, err)
		}
		out = append(out, c)
	}
	return out, nil
}

// LedgerCountByTenantSince counts ledger rows per tenant that occurred at or
// after since.
func (s *Store) LedgerCountByTenantSince(ctx context.Context, since time.Time) (map[string]int64, error) {
	rows, err := s.pool.Query(ctx, `SELECT tenant_id, count(*) FROM ledger WHERE occurred_at >= $1 GROUP BY tenant_id`, since)
	if err != nil {
		return nil, fmt.Errorf("store: ledger count: %w", err)
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

// RegionCheck finds work of another region in this cell's database, which
// the cell boundary says cannot exist.
func (s *Store) RegionCheck(ctx context.Context, region string, since time.Time) (Check, error) {
	c := Check{Name: "work_in_region", What: "all work belongs to region " + region, Unit: "work"}
	err := s.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE region <> $1) FROM work WHERE created_at >= $2`,
		region, since).Scan(&c.Checked, &c.Differ)
	if err != nil {
		return c, fmt.Errorf("store: region check: %w", err)
	}
	if c.Differ == 0 {
		return c, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT id FROM work WHERE created_at >= $2 AND region <> $1 ORDER BY id LIMIT $3`,
		region, since, MaxOffenders)
	if err != nil {
		return c, fmt.Errorf("store: region check: %w", err)
	}
	c.Offenders, err = pgx.CollectRows(rows, pgx.RowTo[string])
	return c, err
}
