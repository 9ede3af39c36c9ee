package store

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// movedTable is one table of a tenant's history: the tenant's rows (where,
// with the tenant as $1) and the columns copied. work names the row's work
// (a column or an expression), for the tables whose rows belong to one
// work item. shared rows (prompts, provider batches, the tenant's
// credentials and links) may be in the receiving cell already and are kept
// there; a serial id, and a ledger row's place in the export's order
// (xact), are the receiving cell's own. held: the table's rows of work the
// sending cell still finishes are copied at the cut too (the work row, as
// a row held elsewhere; its batch items and deliveries); the other tables'
// rows of that work are copied when it ends.
type movedTable struct {
	table, where, work string
	shared, held       bool
	skip               []string
}

// movedTables are in the order they are copied: each after the rows it
// refers to. Reviews go before results, whose insert would open a review
// item of its own.
var movedTables = []movedTable{
	{table: "tenant_tokens", where: "tenant_id = $1", shared: true, skip: []string{"id"}},
	{table: "tenant_sources", where: "tenant_id = $1", shared: true},
	{table: "tenant_callbacks", where: "tenant_id = $1", shared: true},
	{table: "tenant_webhook_secrets", where: "tenant_id = $1", shared: true},
	{table: "contract_prompts", where: "digest IN (SELECT prompt_digest FROM work WHERE tenant_id = $1)", shared: true},
	{table: "budget_periods", where: "tenant_id = $1"},
	{table: "batches", where: "tenant_id = $1"},
	{table: "work", where: "tenant_id = $1", work: "id", held: true},
	{table: "attempts", where: "tenant_id = $1", work: "work_id"},
	{table: "reviews", where: "tenant_id = $1", work: "work_id", skip: []string{"id"}},
	{table: "results", where: "tenant_id = $1", work: "work_id"},
	{table: "ledger", where: "tenant_id = $1", work: "work_id", skip: []string{"xact"}},
	{table: "budget_reservations", where: "tenant_id = $1", work: "(SELECT a.work_id FROM attempts a WHERE a.id = attempt_id)"},
	{table: "batch_items", where: "tenant_id = $1", work: "work_id", held: true},
	{table: "publications", where: "tenant_id = $1", work: "work_id"},
	{table: "redrives", where: "work_id IN (SELECT id FROM work WHERE tenant_id = $1)", work: "work_id"},
	{table: "webhook_deliveries", where: "tenant_id = $1", work: "work_id", held: true},
	{table: "work_actions", where: "work_id IN (SELECT id FROM work WHERE tenant_id = $1)", work: "work_id", skip: []string{"id"}},
	{table: "provider_batches", where: "id IN (SELECT batch_id FROM provider_batch_lines WHERE tenant_id = $1)", shared: true},
	{table: "provider_batch_lines", where: "tenant_id = $1", work: "work_id"},
}

// tenantSettings are the tenants row's columns that follow the tenant to
// another cell: its budget, rates, weight, policy and cost cap.
var tenantSettings = []string{"status", "budget_micros", "budget_period", "rate_per_minute", "burst", "check_policy", "weight",
	"work_cost_cap_micros"}

// Unsettled is what a cell still does for a tenant: work without an
// outcome, events not sent, attempts sent to the ledger and not recorded,
// budget held for calls, outcomes without their publication, and
// publications being tried. A tenant moves once all are zero, so nothing
// in flight is left behind.
type Unsettled struct {
	Work, Outbox, Unrecorded, Reserved, Unannounced, Unpublished, Publishing int
}

// Zero reports whether nothing is unsettled.
func (u Unsettled) Zero() bool { return u == Unsettled{} }

func (u Unsettled) String() string {
	return fmt.Sprintf("%d work without an outcome, %d events not sent, %d attempts not in the ledger, %d budget reservations, "+
		"%d outcomes not announced, %d outcomes without a publication, %d publications being tried",
		u.Work, u.Outbox, u.Unrecorded, u.Reserved, u.Unannounced, u.Unpublished, u.Publishing)
}

// TenantUnsettled counts what this cell still does for tenant. Its
// outcomes without a publication are those the committer's reaper would
// read back, counted from the same point before the cell's outcome mark,
// however old: each holds the move until it is published.
func (s *Store) TenantUnsettled(ctx context.Context, tenant string) (Unsettled, error) {
	var u Unsettled
	since, err := s.readBackSince(ctx)
	if err != nil {
		return u, err
	}
	err = s.pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM work WHERE tenant_id = $1 AND state IN ('queued', 'running')),
			(SELECT count(*) FROM outbox_waiting q JOIN outbox o ON o.id = q.id
				WHERE q.set_aside_at IS NULL AND o.subject LIKE '%.' || $1),
			(SELECT count(*) FROM attempts a WHERE a.tenant_id = $1 AND NOT EXISTS (SELECT 1 FROM ledger l WHERE l.attempt_id = a.id)
				AND (a.outcome IS NULL OR a.event_call OR EXISTS (SELECT 1 FROM outbox o WHERE o.msg_id = a.id::text))),
			(SELECT count(*) FROM budget_reservations WHERE tenant_id = $1 AND settled_at IS NULL),
			(SELECT count(*) FROM work WHERE tenant_id = $1 AND state NOT IN ('queued', 'running') AND outcome_announced_at IS NULL),
			(SELECT count(*) FROM `+outboxOutcomes+`
				WHERE o.created_at > $2 AND o.published_at IS NOT NULL AND w.tenant_id = $1
					AND `+owedInOutbox+`)
			+ (SELECT count(*) FROM work w WHERE w.tenant_id = $1 AND w.updated_at > $2
					AND `+unpublishedCommit+`),
			(SELECT count(*) FROM publications WHERE tenant_id = $1 AND state = 'pending')`, tenant, since).
		Scan(&u.Work, &u.Outbox, &u.Unrecorded, &u.Reserved, &u.Unannounced, &u.Unpublished, &u.Publishing)
	if err != nil {
		return u, fmt.Errorf("store: what is unsettled for %s: %w", tenant, err)
	}
	return u, nil
}

// ErrTenantHere is returned by CopyTenant when the receiving cell holds
// work of the tenant already.
var ErrTenantHere = fmt.Errorf("store: the receiving cell holds work of the tenant already")

// ErrTenantBusy is returned by CopyTenant when work of the tenant was made
// in the sending cell while it was copied; nothing was copied.
var ErrTenantBusy = fmt.Errorf("store: work of the tenant was made while it was copied")

// CopyTenant copies tenant's history — its work, attempts, results, ledger,
// budget periods, reviews, batches, publications, deliveries and actions —
// and its settings, credentials and links from this cell, the cell named
// from, to to, read in one snapshot and written in one transaction, and
// returns the rows copied per table. The receiving cell must know the
// tenant and hold none of its work. Work this cell has not finished (see
// HeldWork) is copied as a row held elsewhere, with its batch items and
// deliveries: the receiving cell answers its key and runs nothing of it,
// and TailTenant copies the rest once it ends here. This cell must admit
// no new work of the tenant by then (FenceTenant).
func (s *Store) CopyTenant(ctx context.Context, to *Store, tenant, from string) (map[string]int, error) {
	copied := map[string]int{}
	// The snapshot is read on a connection of its own, so the pool (of a
	// single connection, maybe) is free for the count of work made since.
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, fmt.Errorf("store: move %s: %w", tenant, err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	src, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("store: move %s: %w", tenant, err)
	}
	defer func() { _ = src.Rollback(context.WithoutCancel(ctx)) }()
	held, err := heldAtCut(ctx, src, tenant)
	if err != nil {
		return nil, fmt.Errorf("store: move %s: %w", tenant, err)
	}
	ids := make([]string, len(held))
	for i, h := range held {
		ids[i] = h.WorkID
	}
	err = pgx.BeginFunc(ctx, to.pool, func(dst pgx.Tx) error {
		var here bool
		if err := dst.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM work WHERE tenant_id = $1)`, tenant).Scan(&here); err != nil {
			return err
		}
		if here {
			return ErrTenantHere
		}
		if err := copySettings(ctx, src, dst, tenant); err != nil {
			return err
		}
		for _, t := range movedTables {
			where := t.where
			if t.work != "" && !t.held {
				where += " AND NOT (coalesce(" + t.work + ", '') = ANY($2))"
			}
			n, err := copyRows(ctx, src, dst, t, where, copyInsert, tenant, ids)
			if err != nil {
				return fmt.Errorf("%s: %w", t.table, err)
			}
			copied[t.table] = n
		}
		if err := holdElsewhere(ctx, dst, tenant, from, held); err != nil {
			return err
		}
		copied["work_held"] = len(held)
		// Work made after the snapshot (a request admitted before the
		// fence) would be left behind: the copy is not committed, and the
		// move tries again.
		var now int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM work WHERE tenant_id = $1`, tenant).Scan(&now); err != nil {
			return err
		}
		if now != copied["work"] {
			return ErrTenantBusy
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: move %s: %w", tenant, err)
	}
	return copied, nil
}

// copySettings gives the receiving cell's tenants row the settings of the
// sending cell's, and lifts a fence an earlier move out of it left.
func copySettings(ctx context.Context, src, dst pgx.Tx, tenant string) error {
	vals := make([]any, len(tenantSettings))
	ptrs := make([]any, len(vals))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := src.QueryRow(ctx, `SELECT `+strings.Join(tenantSettings, ", ")+` FROM tenants WHERE id = $1`, tenant).Scan(ptrs...); err != nil {
		return fmt.Errorf("tenants: %w", err)
	}
	sets := make([]string, len(tenantSettings))
	for i, c := range tenantSettings {
		sets[i] = fmt.Sprintf("%s = $%d", c, i+2)
	}
	tag, err := dst.Exec(ctx, `UPDATE tenants SET moved_to = NULL, `+strings.Join(sets, ", ")+` WHERE id = $1`, append([]any{tenant}, vals...)...)
	if err != nil {
		return fmt.Errorf("tenants: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("tenants: the receiving cell does not know tenant %s (add it there first: assay tenant add)", tenant)
	}
	return nil
}

// How copyRows writes what it read.
const (
	copyInsert  = iota // insert the rows (a shared table's: those not there)
	copyAdd            // insert those not there
	copyReplace        // update the rows there (work held elsewhere) with them
)

// copyRows copies t's rows matching where (with args) from src to dst.
func copyRows(ctx context.Context, src, dst pgx.Tx, t movedTable, where string, mode int, args ...any) (int, error) {
	rows, err := src.Query(ctx, `SELECT column_name FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position`, t.table)
	if err != nil {
		return 0, err
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, err
	}
	cols = slices.DeleteFunc(cols, func(c string) bool { return slices.Contains(t.skip, c) })
	list := strings.Join(cols, ", ")
	// $2, when the where does not use it, is still sent: a statement may
	// not leave a parameter without a type, so it is named once.
	rows, err = src.Query(ctx, `SELECT `+list+` FROM `+t.table+` WHERE (`+where+`) AND $1::text IS NOT NULL AND $2::text[] IS NOT NULL`, args...)
	if err != nil {
		return 0, err
	}
	var data [][]any
	for rows.Next() {
		v, err := rows.Values()
		if err != nil {
			rows.Close()
			return 0, err
		}
		data = append(data, v)
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(data) == 0 {
		return 0, nil
	}
	if t.shared && mode == copyInsert {
		mode = copyAdd
	}
	into := t.table
	if mode != copyInsert {
		into = "moving_" + t.table
		if _, err := dst.Exec(ctx, `CREATE TEMP TABLE IF NOT EXISTS `+into+` (LIKE `+t.table+` INCLUDING DEFAULTS) ON COMMIT DROP`); err != nil {
			return 0, err
		}
		if _, err := dst.Exec(ctx, `TRUNCATE `+into); err != nil {
			return 0, err
		}
	}
	n, err := dst.CopyFrom(ctx, pgx.Identifier{into}, cols, pgx.CopyFromRows(data))
	if err != nil || mode == copyInsert {
		return int(n), err
	}
	if mode == copyReplace {
		sets := make([]string, 0, len(cols))
		for _, c := range cols {
			if c != "id" {
				sets = append(sets, c+" = m."+c)
			}
		}
		tag, err := dst.Exec(ctx, `UPDATE `+t.table+` x SET `+strings.Join(sets, ", ")+` FROM `+into+` m WHERE x.id = m.id`)
		return int(tag.RowsAffected()), err
	}
	tag, err := dst.Exec(ctx, `INSERT INTO `+t.table+` (`+list+`) SELECT `+list+` FROM `+into+` ON CONFLICT DO NOTHING`)
	return int(tag.RowsAffected()), err
}

// DropTenant removes tenant's history from this cell, once it has been
// copied to the cell that serves the tenant now: the rows CopyTenant
// copies, but for those another tenant may share. It returns the rows
// removed per table.
func (s *Store) DropTenant(ctx context.Context, tenant string) (map[string]int, error) {
	dropped := map[string]int{}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		for _, t := range slices.Backward(movedTables) {
			if t.shared {
				continue
			}
			tag, err := tx.Exec(ctx, `DELETE FROM `+t.table+` WHERE `+t.where, tenant)
			if err != nil {
				return fmt.Errorf("%s: %w", t.table, err)
			}
			dropped[t.table] = int(tag.RowsAffected())
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: drop %s: %w", tenant, err)
	}
	return dropped, nil
}
