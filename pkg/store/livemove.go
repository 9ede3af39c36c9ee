package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"assay.dev/pkg/outcome"
)

// A live move. From its cut-over the receiving cell serves the tenant and
// the sending cell admits none of its new work (FenceTenant); work the
// sending cell admitted before then finishes there and is copied over as
// it ends (TailTenant); what has not started by the time the move stops
// waiting is handed over and runs in the receiving cell (HandOver).

// ErrMovedOut is the error of work of a tenant asked for in a cell it has
// moved out of: its request belongs to the cell the placement map names.
var ErrMovedOut = errors.New("store: the tenant has moved to another cell")

// movedOutState is the SQLSTATE the work_moved_out trigger raises.
const movedOutState = "AS421"

// MovedOut reports whether err is the refusal of work of a tenant that
// moved out of the cell.
func MovedOut(err error) bool {
	return errors.Is(err, ErrMovedOut) || SQLState(err) == movedOutState
}

// FenceTenant makes this cell admit no new work of tenant, which moves to
// cell to: it waits for every statement writing work to end, so none
// admitted before the fence commits after it. A request for work the cell
// holds already (its key) is still answered with that work.
func (s *Store) FenceTenant(ctx context.Context, tenant, to string) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '10s'`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE work IN SHARE ROW EXCLUSIVE MODE`); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `UPDATE tenants SET moved_to = $2 WHERE id = $1`, tenant, to)
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("tenant %s is not known here", tenant)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("store: fence %s: %w", tenant, err)
	}
	return nil
}

// UnfenceTenant lifts FenceTenant: a move given up before its cut-over.
func (s *Store) UnfenceTenant(ctx context.Context, tenant string) error {
	if _, err := s.pool.Exec(ctx, `UPDATE tenants SET moved_to = NULL WHERE id = $1`, tenant); err != nil {
		return fmt.Errorf("store: lift the fence of %s: %w", tenant, err)
	}
	return nil
}

// heldWork is work the cell that admitted it has not finished at a cut:
// what the receiving cell's budget counts for it from the copy.
type heldWork struct {
	WorkID         string
	SpentMicros    int64
	ReservedMicros int64
	PeriodStart    *time.Time
}

// unfinished is the condition on work w, in the cell that admitted it,
// that the cell still does something for it, as a reason (” when
// nothing): it runs or waits to; its outcome is not announced; an event
// of it is not sent; a call is not in the ledger or holds budget; a
// publication is being tried or is owed. A review a person resolved is
// owed nothing more.
const unfinished = `CASE
		WHEN w.state IN ('queued', 'running') THEN w.state
		WHEN w.state = 'elsewhere' THEN ''
		WHEN w.outcome_announced_at IS NULL THEN 'its outcome is not announced'
		WHEN EXISTS (SELECT 1 FROM outbox_waiting q JOIN outbox o ON o.id = q.id
				WHERE q.set_aside_at IS NULL AND split_part(o.msg_id, '.', 1) = w.id) THEN 'an event is not sent'
		WHEN EXISTS (SELECT 1 FROM attempts a WHERE a.work_id = w.id AND NOT EXISTS (SELECT 1 FROM ledger l WHERE l.attempt_id = a.id)
				AND (a.outcome IS NULL OR a.event_call OR EXISTS (SELECT 1 FROM outbox o WHERE o.msg_id = a.id::text)))
			THEN 'a call is not in the ledger'
		WHEN EXISTS (SELECT 1 FROM budget_reservations r JOIN attempts a ON a.id = r.attempt_id
				WHERE a.work_id = w.id AND r.settled_at IS NULL) THEN 'a call holds budget'
		WHEN EXISTS (SELECT 1 FROM publications p WHERE p.work_id = w.id AND p.state = 'pending') THEN 'a publication is being tried'
		WHEN EXISTS (SELECT 1 FROM reviews r WHERE r.work_id = w.id AND r.state = 'resolved') THEN ''
		WHEN (` + unpublishedCommit + `) THEN 'its outcome is not published'
		WHEN EXISTS (SELECT 1 FROM ` + outboxOutcomes + ` WHERE w.id = split_part(o.msg_id, '.', 1) AND ` + owedInOutbox + `)
			THEN 'its outcome is not published'
		ELSE '' END`

// heldAtCut reads, in the snapshot of the cut, tenant's work that this
// cell has not finished, with what its budget counted for each.
func heldAtCut(ctx context.Context, tx pgx.Tx, tenant string) ([]heldWork, error) {
	rows, err := tx.Query(ctx, `SELECT w.id,
			coalesce((SELECT sum(l.cost_micros) FROM ledger l WHERE l.work_id = w.id), 0)::bigint,
			coalesce((SELECT sum(r.amount_micros) FROM budget_reservations r JOIN attempts a ON a.id = r.attempt_id
				WHERE a.work_id = w.id AND r.settled_at IS NULL), 0)::bigint,
			(SELECT max(r.period_start) FROM budget_reservations r JOIN attempts a ON a.id = r.attempt_id
				WHERE a.work_id = w.id AND r.settled_at IS NULL)
		FROM work w WHERE w.tenant_id = $1 AND w.state <> 'elsewhere' AND (`+unfinished+`) <> ''`, tenant)
	if err != nil {
		return nil, fmt.Errorf("work not finished: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (heldWork, error) {
		var h heldWork
		err := r.Scan(&h.WorkID, &h.SpentMicros, &h.ReservedMicros, &h.PeriodStart)
		return h, err
	})
}

// holdElsewhere makes the copied rows of held work rows held for cell
// from: in state elsewhere, announced (nothing here owes them an
// outcome), with what the budget counted for them.
func holdElsewhere(ctx context.Context, tx pgx.Tx, tenant, from string, held []heldWork) error {
	if len(held) == 0 {
		return nil
	}
	ids, spent, reserved := make([]string, len(held)), make([]int64, len(held)), make([]int64, len(held))
	periods := make([]*time.Time, len(held))
	for i, h := range held {
		ids[i], spent[i], reserved[i], periods[i] = h.WorkID, h.SpentMicros, h.ReservedMicros, h.PeriodStart
	}
	if _, err := tx.Exec(ctx, `UPDATE work SET state = 'elsewhere', lease_token = NULL, lease_expires_at = NULL,
			outcome_announced_at = coalesce(outcome_announced_at, now())
		WHERE tenant_id = $1 AND id = ANY($2)`, tenant, ids); err != nil {
		return fmt.Errorf("work held elsewhere: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO work_held (work_id, tenant_id, cell, spent_micros, reserved_micros, period_start)
		SELECT id, $1, $2, s, r, p FROM unnest($3::text[], $4::bigint[], $5::bigint[], $6::timestamptz[]) AS x(id, s, r, p)`,
		tenant, from, ids, spent, reserved, periods); err != nil {
		return fmt.Errorf("work held elsewhere: %w", err)
	}
	return nil
}

// Waiting is one work item a move waits for, and why.
type Waiting struct {
	WorkID, Cell, Why string
}

// HeldIn is the cell that finishes work id, which this cell holds for it;
// "" when this cell finishes it (or does not know it).
func (s *Store) HeldIn(ctx context.Context, id string) (string, error) {
	var cell string
	err := s.pool.QueryRow(ctx, `SELECT cell FROM work_held WHERE work_id = $1`, id).Scan(&cell)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("store: where %s is finished: %w", id, err)
	}
	return cell, nil
}

// TailTenant copies to this cell, the one that serves tenant now, the
// work cell from (its store) finished since the cut, each item's rows in
// one transaction, and returns how many it copied and what is left, each
// with why. With handOver, work from has not started is taken from it
// first and queued here.
func (s *Store) TailTenant(ctx context.Context, from *Store, tenant string, handOver bool) (int, []Waiting, error) {
	held, err := s.heldFor(ctx, tenant)
	if err != nil || len(held) == 0 {
		return 0, nil, err
	}
	ids := make([]string, 0, len(held))
	for id := range held {
		ids = append(ids, id)
	}
	var handed []string
	if handOver {
		rows, err := from.pool.Query(ctx, `UPDATE work SET state = 'elsewhere', outcome_announced_at = coalesce(outcome_announced_at, now()),
				updated_at = now()
			WHERE tenant_id = $1 AND id = ANY($2) AND state = 'queued' RETURNING id`, tenant, ids)
		if err != nil {
			return 0, nil, fmt.Errorf("store: hand over %s's queued work: %w", tenant, err)
		}
		if handed, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return 0, nil, fmt.Errorf("store: hand over %s's queued work: %w", tenant, err)
		}
	}
	rows, err := from.pool.Query(ctx, `SELECT w.id, w.state, `+unfinished+` FROM work w WHERE w.tenant_id = $1 AND w.id = ANY($2)`, tenant, ids)
	if err != nil {
		return 0, nil, fmt.Errorf("store: what %s's move waits for: %w", tenant, err)
	}
	var done []string
	var waiting []Waiting
	isHanded := map[string]bool{}
	for _, id := range handed {
		isHanded[id] = true
	}
	seen := map[string]bool{}
	for rows.Next() {
		var id, state, why string
		if err := rows.Scan(&id, &state, &why); err != nil {
			rows.Close()
			return 0, nil, err
		}
		seen[id] = true
		switch {
		case state == outcome.Running:
			why = "its call is running"
		case state == outcome.Queued:
			why = "it waits for its first call"
		}
		if why == "" {
			// Work the sending cell marks elsewhere was handed over,
			// now or by an earlier pass.
			isHanded[id] = state == "elsewhere"
			done = append(done, id)
			continue
		}
		waiting = append(waiting, Waiting{WorkID: id, Cell: held[id].cell, Why: why})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, nil, err
	}
	for _, id := range ids {
		if !seen[id] {
			waiting = append(waiting, Waiting{WorkID: id, Cell: held[id].cell, Why: "the cell that finishes it does not hold it"})
		}
	}
	copied := 0
	for len(done) > 0 {
		n := min(len(done), 200)
		if err := s.takeOver(ctx, from, tenant, done[:n], held, isHanded); err != nil {
			return copied, waiting, err
		}
		copied += n
		done = done[n:]
	}
	return copied, waiting, nil
}

// held is a row of work_held.
type held struct {
	cell            string
	spent, reserved int64
	period          *time.Time
}

func (s *Store) heldFor(ctx context.Context, tenant string) (map[string]held, error) {
	rows, err := s.pool.Query(ctx, `SELECT work_id, cell, spent_micros, reserved_micros, period_start FROM work_held WHERE tenant_id = $1`, tenant)
	if err != nil {
		return nil, fmt.Errorf("store: work held for %s: %w", tenant, err)
	}
	out := map[string]held{}
	for rows.Next() {
		var id string
		var h held
		if err := rows.Scan(&id, &h.cell, &h.spent, &h.reserved, &h.period); err != nil {
			rows.Close()
			return nil, err
		}
		out[id] = h
	}
	return out, rows.Err()
}

// takeOver copies work ids' rows from from in one snapshot and makes them
// this cell's in one transaction: the held rows take the finished ones'
// values (handed-over work is queued here, for the sweeper to announce),
// the other tables' rows are added, and the budget counts what the work
// spent since the cut and no longer holds what it reserved then.
func (s *Store) takeOver(ctx context.Context, from *Store, tenant string, ids []string, h map[string]held, handed map[string]bool) error {
	src, err := from.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("store: take over %s's work: %w", tenant, err)
	}
	defer func() { _ = src.Rollback(context.WithoutCancel(ctx)) }()
	spent := map[string]int64{}
	rows, err := src.Query(ctx, `SELECT work_id, sum(cost_micros)::bigint FROM ledger WHERE work_id = ANY($1) GROUP BY work_id`, ids)
	if err != nil {
		return fmt.Errorf("store: take over %s's work: %w", tenant, err)
	}
	for rows.Next() {
		var id string
		var c int64
		if err := rows.Scan(&id, &c); err != nil {
			rows.Close()
			return err
		}
		spent[id] = c
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	var queued []string
	for _, id := range ids {
		if handed[id] {
			queued = append(queued, id)
		}
	}
	err = pgx.BeginFunc(ctx, s.pool, func(dst pgx.Tx) error {
		// Reviews first: a finished row's state would open a review item
		// of its own where the sending cell's is already.
		order := append([]movedTable{}, movedTables...)
		slices.SortStableFunc(order, func(a, b movedTable) int { return cmpBool(a.table != "reviews", b.table != "reviews") })
		for _, t := range order {
			switch {
			case t.table == "provider_batches":
				if _, err := copyRows(ctx, src, dst, t, "id IN (SELECT batch_id FROM provider_batch_lines WHERE work_id = ANY($2))",
					copyAdd, tenant, ids); err != nil {
					return fmt.Errorf("%s: %w", t.table, err)
				}
				continue
			case t.table == "budget_periods":
				// A period the sending cell began since the cut.
				if _, err := copyRows(ctx, src, dst, t, t.where, copyAdd, tenant, ids); err != nil {
					return fmt.Errorf("%s: %w", t.table, err)
				}
				continue
			case t.work == "":
				continue
			}
			mode := copyAdd
			if t.table == "work" {
				mode = copyReplace
			}
			if _, err := copyRows(ctx, src, dst, t, t.where+" AND "+t.work+" = ANY($2)", mode, tenant, ids); err != nil {
				return fmt.Errorf("%s: %w", t.table, err)
			}
		}
		if len(queued) > 0 {
			// Handed over before its first call: queued here, dated back
			// so the sweeper's next pass announces it.
			if _, err := dst.Exec(ctx, `UPDATE work SET state = 'queued', outcome_announced_at = NULL, updated_at = created_at
				WHERE id = ANY($1)`, queued); err != nil {
				return fmt.Errorf("handed-over work: %w", err)
			}
		}
		if err := rebudget(ctx, dst, tenant, ids, h, spent); err != nil {
			return fmt.Errorf("budget: %w", err)
		}
		_, err := dst.Exec(ctx, `DELETE FROM work_held WHERE work_id = ANY($1)`, ids)
		return err
	})
	if err != nil {
		return fmt.Errorf("store: take over %s's work: %w", tenant, err)
	}
	return nil
}

// rebudget makes the tenant's budget here count what work ids spent since
// the cut (spent, less what the copy counted) and no longer hold what they
// had reserved then: a statement per period reserved in, one for the spend.
func rebudget(ctx context.Context, tx pgx.Tx, tenant string, ids []string, h map[string]held, spent map[string]int64) error {
	released := map[time.Time]int64{}
	var delta int64
	for _, id := range ids {
		x := h[id]
		if x.reserved > 0 && x.period != nil {
			released[*x.period] += x.reserved
		}
		delta += spent[id] - x.spent
	}
	for period, amount := range released {
		if _, err := tx.Exec(ctx, `UPDATE budget_periods SET reserved_micros = greatest(reserved_micros - $3, 0)
			WHERE tenant_id = $1 AND period_start = $2`, tenant, period, amount); err != nil {
			return err
		}
	}
	if delta == 0 {
		return nil
	}
	return spendNow(ctx, tx, tenant, delta)
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}
