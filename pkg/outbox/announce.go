package outbox

import (
	"context"
	"encoding/json"

	"assay.dev/pkg/event"
	"assay.dev/pkg/store"
)

// Announce makes the outbox rows of newly queued work in the cell n names:
// its announcement, and a cancel for each older revision a worker is
// running.
func Announce(ctx context.Context, n event.Names) func(*store.Work) ([]store.OutboxMsg, error) {
	return func(w *store.Work) ([]store.OutboxMsg, error) {
		m, err := WorkMessage(ctx, n, w, w.Dispatch)
		if err != nil {
			return nil, err
		}
		msgs := []store.OutboxMsg{m}
		// A worker running an older revision stops paying for its answer.
		for _, old := range w.SupersededRunning {
			c, err := Msg(ctx, event.KindWork, n.Cancel(w.TenantID), "cancel."+old+"."+w.ID,
				event.Cancel{WorkID: old, TenantID: w.TenantID, Region: w.Region, Reason: "revision " + w.Revision + " superseded it"})
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, c)
		}
		return msgs, nil
	}
}

// WorkMessage is the outbox row that announces w with a dispatch number,
// its facts in a header (event.FactsHeader).
func WorkMessage(ctx context.Context, n event.Names, w *store.Work, dispatch int) (store.OutboxMsg, error) {
	m, err := Msg(ctx, event.KindWork, n.Work(w.Lane, w.TenantID), event.WorkMsgID(w.ID, dispatch),
		event.Work{WorkID: w.ID, TenantID: w.TenantID, Region: w.Region, Lane: w.Lane, Dispatch: dispatch, DeadlineAt: w.DeadlineAt})
	if err != nil {
		return m, err
	}
	ready := w.UpdatedAt
	if w.RetryAt.After(ready) {
		ready = w.RetryAt
	}
	facts, err := json.Marshal(event.WorkFacts{Contract: w.Contract, SchemaVersion: w.SchemaVersion,
		TaxonomyVersion: w.TaxonomyVersion, PromptDigest: w.PromptDigest, Model: w.Model, InputBytes: len(w.Input),
		Attempts: w.Attempts, OutageAttempts: w.OutageAttempts, Repairs: w.Repairs, OutputCap: w.OutputCap,
		DeadlineAt: w.DeadlineAt, ReadyAt: ready})
	if err != nil {
		return m, err
	}
	m.Headers[event.FactsHeader] = string(facts)
	return m, nil
}
