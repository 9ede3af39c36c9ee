package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"assay.dev/pkg/api"
	"assay.dev/pkg/outcome"
)

// Actor kinds: whose credential an act on a work item was made with.
// work_actions and reviews allow the same words. The API names them, so
// they live in package api.
const (
	ActorTenant   = api.ActorTenant
	ActorReviewer = api.ActorReviewer
	ActorOperator = api.ActorOperator
)

// ActorKinds lists every actor kind.
var ActorKinds = api.ActorKinds

// Routes an act comes through.
const (
	RouteAPI     = api.RouteAPI
	RouteConsole = api.RouteConsole
)

// Routes lists every route.
var Routes = api.Routes

// Actor is who did something to a work item and the route it came
// through: api.Actor, which reviews show.
type Actor = api.Actor

// Audit is who asked for an action on a work item, written in the
// action's own transaction.
type Audit struct {
	By           Actor
	Action, Note string
}

// Actions recorded besides the console's redrive, rerun and cancel: a
// review item claimed, and resolved with its verdict.
const (
	ActionClaim   = "claim"
	ActionResolve = "resolve"
)

// WorkAction is one act on a work item: what, who (kind, id and route)
// and when. A resolution's note is its verdict; the resolver's own note
// stays on the review item.
type WorkAction struct {
	Action string    `json:"action"`
	By     string    `json:"by"`
	Kind   string    `json:"kind"`
	Route  string    `json:"route"`
	Note   string    `json:"note,omitempty"`
	At     time.Time `json:"at"`
}

// Actor is who took the action.
func (a WorkAction) Actor() Actor { return Actor{Kind: a.Kind, ID: a.By, Route: a.Route} }

// insertAudit records a (nil records nothing) for the work id.
func insertAudit(ctx context.Context, tx pgx.Tx, id string, a *Audit) error {
	if a == nil {
		return nil
	}
	if !a.By.Valid() {
		return fmt.Errorf("store: the %s of %s names no actor: %+v", a.Action, id, a.By)
	}
	_, err := tx.Exec(ctx, `INSERT INTO work_actions (work_id, action, by_name, actor_kind, route, note) VALUES ($1, $2, $3, $4, $5, $6)`,
		id, a.Action, a.By.ID, a.By.Kind, a.By.Route, a.Note)
	return err
}

// ActionsOf lists what was done to a work item, oldest first.
func (s *Store) ActionsOf(ctx context.Context, workID string) ([]WorkAction, error) {
	rows, err := s.pool.Query(ctx, `SELECT action, by_name, actor_kind, route, note, acted_at FROM work_actions WHERE work_id = $1 ORDER BY id`, workID)
	if err != nil {
		return nil, fmt.Errorf("store: actions of %s: %w", workID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (WorkAction, error) {
		var a WorkAction
		return a, r.Scan(&a.Action, &a.By, &a.Kind, &a.Route, &a.Note, &a.At)
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
