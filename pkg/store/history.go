package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"assay.dev/pkg/outcome"
)

// History is what the rows tell of one work item at one moment: the work,
// its attempts in order, its result when accepted, its review item when it
// has one.
type History struct {
	Work     *Work
	Attempts []Attempt
	Result   *Result
	Review   *Review
}

// WorkHistory reads a work item's history from one snapshot, so that what
// one transaction wrote together (an outcome, its result, its review item)
// is seen together or not at all.
func (s *Store) WorkHistory(ctx context.Context, id string) (*History, error) {
	h := &History{}
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		if h.Work, err = scanWork(tx.QueryRow(ctx, `SELECT `+workColumns+` FROM work WHERE id = $1`, id)); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT id::text, work_id, tenant_id, number, coalesce(outcome, '`+outcome.Running+`'),
				coalesce(reason, ''), started_at, finished_at
			FROM attempts WHERE work_id = $1 ORDER BY number`, id)
		if err != nil {
			return err
		}
		if h.Attempts, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Attempt, error) {
			var a Attempt
			err := r.Scan(&a.ID, &a.WorkID, &a.TenantID, &a.Number, &a.Outcome, &a.Reason, &a.StartedAt, &a.FinishedAt)
			return a, err
		}); err != nil {
			return err
		}
		var r Result
		err = tx.QueryRow(ctx, `SELECT work_id, schema_version, attempt_id::text, output, findings, created_at
			FROM results WHERE work_id = $1`, id).Scan(&r.WorkID, &r.SchemaVersion, &r.AttemptID, &r.Output, &r.Findings, &r.CreatedAt)
		switch {
		case err == nil:
			h.Result = &r
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		h.Review, err = scanReview(tx.QueryRow(ctx, `SELECT `+reviewColumns+` FROM reviews v JOIN work w ON w.id = v.work_id
			WHERE v.work_id = $1`, id))
		if errors.Is(err, ErrNotFound) {
			err = nil
		}
		return err
	})
	if errors.Is(err, ErrNotFound) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("store: work history %s: %w", id, err)
	}
	return h, nil
}
