package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"assay.dev/pkg/outcome"
)

// Audit is who asked for an action on a work item, written in the
// action's own transaction.
type Audit struct {
	By, Action, Note string
}

// WorkAction is one action a person took on a work item: what, who and
// when.
type WorkAction struct {
	Action string    `json:"action"`
	By     string    `json:"by"`
	Note   string    `json:"note,omitempty"`
	At     time.Time `json:"at"`
}

// insertAudit records a (nil records nothing) for the work id.
func insertAudit(ctx context.Context, tx pgx.Tx, id string, a *Audit) error {
	if a == nil {
		return nil
	}
	_, err := tx.Exec(ctx, `INSERT INTO work_actions (work_id, action, by_name, note) VALUES ($1, $2, $3, $4)`,
		id, a.Action, a.By, a.Note)
	return err
}

// ActionsOf lists what people did to a work item, oldest first.
func (s *Store) ActionsOf(ctx context.Context, workID string) ([]WorkAction, error) {
	rows, err := s.pool.Query(ctx, `SELECT action, by_name, note, acted_at FROM work_actions WHERE work_id = $1 ORDER BY id`, workID)
	if err != nil {
		return nil, fmt.Errorf("store: actions of %s: %w", workID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (WorkAction, error) {
		var a WorkAction
		return a, r.Scan(&a.Action, &a.By, &a.Note, &a.At)
	})
	if err != nil {
		return nil, fmt.Errorf("store: actions of %s: %w", workID, err)
	}
	return out, nil
}

// ErrNotCancelable is CancelWork's refusal of work that has its outcome.
var ErrNotCancelable = errors.New("only queued or running work can be canceled")

// CancelWork ends queued or running work as canceled with reason, in one
// transaction with audit (may be nil) and the outbox rows cancel makes
// (told whether a worker held the work, whose call is to be stopped).
// Running work loses its lease: its answer, should it come, is recorded
// stale and never published, as a batch cancel's items are.
func (s *Store) CancelWork(ctx context.Context, id, reason string, cancel func(w *Work, running bool) ([]OutboxMsg, error),
	audit *Audit) (*Work, error) {
	var got *Work
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		w, err := scanWork(tx.QueryRow(ctx, `SELECT `+workColumns+` FROM work WHERE id = $1 FOR UPDATE`, id))
		if err != nil {
			return err
		}
		if w.State != outcome.Queued && w.State != outcome.Running {
			return fmt.Errorf("work %s is %s: %w", id, w.State, ErrNotCancelable)
		}
		if got, err = scanWork(tx.QueryRow(ctx, `UPDATE work SET state = $2, reason = $3, lease_token = NULL,
				lease_expires_at = NULL, updated_at = now()
			WHERE id = $1 RETURNING `+workColumns, id, outcome.Canceled, reason)); err != nil {
			return err
		}
		msgs, err := cancel(got, w.State == outcome.Running)
		if err != nil {
			return err
		}
		if err := insertAudit(ctx, tx, id, audit); err != nil {
			return err
		}
		return insertOutbox(ctx, tx, msgs)
	})
	if err != nil {
		return nil, fmt.Errorf("store: cancel %s: %w", id, err)
	}
	return got, nil
}
