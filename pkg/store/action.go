package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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
