package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// LaneFigures are one lane's unfinished work: how much waits, how much
// runs, and how long the oldest of it has been in the cell.
type LaneFigures struct {
	Lane    string
	Queued  int64
	Running int64
	Oldest  time.Duration
}

// lanes are the figures of every lane that has unfinished work, of one
// tenant or ("") of the whole cell, in lane order.
func lanes(ctx context.Context, q querier, tenant string) ([]LaneFigures, error) {
	rows, err := q.Query(ctx, `SELECT lane, count(*) FILTER (WHERE state = 'queued'), count(*) FILTER (WHERE state = 'running'),
			extract(epoch FROM now() - min(created_at))::float8
		FROM work WHERE state IN ('queued', 'running') AND ($1 = '' OR tenant_id = $1)
		GROUP BY lane ORDER BY lane`, tenant)
	if err != nil {
		return nil, fmt.Errorf("store: lanes: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (LaneFigures, error) {
		var l LaneFigures
		var secs float64
		err := r.Scan(&l.Lane, &l.Queued, &l.Running, &secs)
		l.Oldest = time.Duration(secs * float64(time.Second))
		return l, err
	})
}

// Decision is one work item that reached its outcome.
type Decision struct {
	WorkID   string
	TenantID string
	Contract string
	Lane     string
	Outcome  string
	Reason   string
	Finished time.Time
}

// recentDecisions are the last limit work items that reached an outcome,
// newest first, of one tenant or ("") of the whole cell.
func recentDecisions(ctx context.Context, q querier, tenant string, limit int) ([]Decision, error) {
	rows, err := q.Query(ctx, `SELECT id, tenant_id, contract, lane, state, coalesce(reason, ''), updated_at
		FROM work WHERE state NOT IN ('queued', 'running') AND ($1 = '' OR tenant_id = $1)
		ORDER BY updated_at DESC, id LIMIT $2`, tenant, limit)
	if err != nil {
		return nil, fmt.Errorf("store: recent decisions: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Decision, error) {
		var d Decision
		err := r.Scan(&d.WorkID, &d.TenantID, &d.Contract, &d.Lane, &d.Outcome, &d.Reason, &d.Finished)
		return d, err
	})
}

// Spend is one tenant's ledger since a time: its calls and what they cost,
// and the part of that cost that is estimated.
type Spend struct {
	TenantID            string
	Calls               int64
	CostMicros          int64
	EstimatedCostMicros int64
}

// spendSince totals the ledger per tenant over the attempts that occurred
// at or after since, of one tenant or ("") of every tenant, in tenant
// order.
func spendSince(ctx context.Context, q querier, since time.Time, tenant string) ([]Spend, error) {
	rows, err := q.Query(ctx, `SELECT tenant_id, count(*), coalesce(sum(cost_micros), 0),
			coalesce(sum(cost_micros) FILTER (WHERE estimated), 0)
		FROM ledger WHERE occurred_at >= $1 AND ($2 = '' OR tenant_id = $2)
		GROUP BY tenant_id ORDER BY tenant_id`, since, tenant)
	if err != nil {
		return nil, fmt.Errorf("store: spend: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Spend, error) {
		var sp Spend
		err := r.Scan(&sp.TenantID, &sp.Calls, &sp.CostMicros, &sp.EstimatedCostMicros)
		return sp, err
	})
}

// ConsoleFigures are the console's reads, all of one moment.
type ConsoleFigures struct {
	Views  map[string]int64
	Lanes  []LaneFigures
	Recent []Decision
	Spend  []Spend
	// Publications count the publications not made, by target and state;
	// Failed are the latest failed ones.
	Publications []PublicationCount
	Failed       []*Publication
	// Circuits are the cell's circuit per model (the provider's condition,
	// the same for every tenant).
	Circuits []Circuit
	// Rollouts are the routes that apply (every tenant's, and the
	// tenant's own) with their candidates' shadow runs of the last hour.
	Rollouts []RolloutFigures
}

// RolloutFigures are one route and its candidate's shadow runs of the
// last hour: how many, ended how.
type RolloutFigures struct {
	Route
	Runs, Open, Accepted, StructuralFailures int64
	// CostMicros is what the shadow runs' calls cost, LiveCostMicros what
	// their live twins' did.
	CostMicros, LiveCostMicros int64
	// History is the route's last changes, newest first.
	History []RouteChange
}

// consoleRouteChanges is how many of each route's last changes the
// console lists.
const consoleRouteChanges = 5

// rolloutFigures reads the routes that apply to tenant ("": all) and the
// shadow runs of their candidates created in the last hour.
func rolloutFigures(ctx context.Context, q querier, tenant string) ([]RolloutFigures, error) {
	rows, err := q.Query(ctx, `SELECT `+routeColumns("r")+`, coalesce(s.runs, 0), coalesce(s.open, 0), coalesce(s.accepted, 0), coalesce(s.rejected, 0),
			coalesce(s.cost, 0), coalesce(s.live_cost, 0)
		FROM contract_routes r
		LEFT JOIN LATERAL (
			SELECT count(*) AS runs, count(*) FILTER (WHERE w.state IN ('queued', 'running')) AS open,
				count(*) FILTER (WHERE w.state = 'accepted') AS accepted,
				count(*) FILTER (WHERE w.state = 'schema_rejected') AS rejected,
				sum((SELECT coalesce(sum(l.cost_micros), 0) FROM attempts a JOIN ledger l ON l.attempt_id = a.id
					WHERE a.work_id = w.id)) AS cost,
				sum((SELECT coalesce(sum(l.cost_micros), 0) FROM attempts a JOIN ledger l ON l.attempt_id = a.id
					WHERE a.work_id = w.shadow_of)) AS live_cost
			FROM work w
			WHERE w.shadow_of IS NOT NULL AND w.shadow_of NOT LIKE 'check:%' AND w.contract = r.contract
				AND w.schema_version = r.candidate_version AND w.created_at > now() - interval '1 hour'
				AND (CASE WHEN r.scope = '*' THEN true ELSE w.tenant_id = r.scope END)
				AND ($1 = '' OR w.tenant_id = $1)
		) s ON r.candidate_version IS NOT NULL
		WHERE $1 = '' OR r.scope IN ('*', $1)
		ORDER BY r.contract, r.scope`, tenant)
	if err != nil {
		return nil, fmt.Errorf("store: rollout figures: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RolloutFigures, error) {
		var f RolloutFigures
		var err error
		f.Route, err = scanRoute(r, &f.Runs, &f.Open, &f.Accepted, &f.StructuralFailures, &f.CostMicros, &f.LiveCostMicros)
		return f, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: rollout figures: %w", err)
	}
	changes, err := routeChanges(ctx, q, "", tenant, consoleRouteChanges)
	if err != nil {
		return nil, err
	}
	for i, f := range out {
		for _, c := range changes {
			if c.Scope == f.Scope && c.Contract == f.Contract {
				out[i].History = append(out[i].History, c)
			}
		}
	}
	return out, nil
}

// consoleFailed is how many failed publications the console lists.
const consoleFailed = 10

// publicationFigures are the console's publication reads: the counts of
// those not made, and the latest failed ones.
func publicationFigures(ctx context.Context, q querier, tenant string, f *ConsoleFigures) error {
	var err error
	if f.Publications, err = unfinishedPublications(ctx, q, tenant); err != nil {
		return err
	}
	f.Failed, err = collectPublications(q.Query(ctx, `SELECT `+publicationColumns+` FROM publications
		WHERE state = 'failed' AND ($1 = '' OR tenant_id = $1) ORDER BY updated_at DESC, work_id, target LIMIT $2`, tenant, consoleFailed))
	if err != nil {
		return fmt.Errorf("store: failed publications: %w", err)
	}
	f.Circuits, err = circuits(ctx, q)
	return err
}

// Console reads the views of the work created in the last window, the
// lanes, the last recent decisions and the spend since the window began,
// of one tenant or ("") of the whole cell, in one read-only snapshot: work
// that ends between two of the reads is counted running in none and
// finished in all, or the other way round, never both.
func (s *Store) Console(ctx context.Context, window time.Duration, tenant string, recent int, since time.Time) (ConsoleFigures, error) {
	var f ConsoleFigures
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		if f.Views, err = viewsOf(ctx, tx, window, tenant); err != nil {
			return err
		}
		if f.Lanes, err = lanes(ctx, tx, tenant); err != nil {
			return err
		}
		if f.Recent, err = recentDecisions(ctx, tx, tenant, recent); err != nil {
			return err
		}
		if f.Spend, err = spendSince(ctx, tx, since, tenant); err != nil {
			return err
		}
		if f.Rollouts, err = rolloutFigures(ctx, tx, tenant); err != nil {
			return err
		}
		return publicationFigures(ctx, tx, tenant, &f)
	})
	return f, err
}
