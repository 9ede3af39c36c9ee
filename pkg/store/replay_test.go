package store_test

import (
	"errors"
	"testing"
	"time"

	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

// Redrive queues failed work again once per ending, refuses every other
// state, a replaced revision and purged input, and a dry run writes
// nothing.
func TestRedriveWork(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	end := func(w *store.Work, state string) {
		t.Helper()
		if ok, err := s.FinishUnleased(ctx, w.ID, state, "ended by the test"); err != nil || !ok {
			t.Fatalf("finish %s %s: %v %v", w.ID, state, ok, err)
		}
	}
	opts := store.RedriveOptions{Deadline: time.Now().Add(time.Hour)}
	outbox := func() int { return count(t, ctx, s, `SELECT count(*) FROM outbox`) }

	failed := insert(t, ctx, s, newWork("acme", "r/1", "a"))
	end(failed, outcome.Expired)
	before := outbox()
	dry := opts
	dry.DryRun = true
	if w, err := s.RedriveWork(ctx, failed.ID, dry, announce); err != nil || w.State != outcome.Queued || w.Dispatch != 2 {
		t.Fatalf("dry run: %+v %v", w, err)
	}
	if got, _ := s.GetWork(ctx, failed.ID); got.State != outcome.Expired || outbox() != before ||
		count(t, ctx, s, `SELECT count(*) FROM redrives`) != 0 {
		t.Fatalf("the dry run wrote: %s, %d outbox rows (%d before)", got.State, outbox(), before)
	}
	w, err := s.RedriveWork(ctx, failed.ID, opts, announce)
	if err != nil || w.State != outcome.Queued || w.Dispatch != 2 || w.Reason != "" || outbox() != before+1 {
		t.Fatalf("redrive: %+v %v, %d outbox rows", w, err, outbox())
	}
	if _, err := s.RedriveWork(ctx, failed.ID, opts, announce); !errors.Is(err, store.ErrNotRedrivable) {
		t.Fatalf("redrive of the queued item: %v", err)
	}
	// It fails again: without Again it is left as it is.
	end(failed, outcome.Expired)
	before = outbox()
	if _, err := s.RedriveWork(ctx, failed.ID, opts, announce); !errors.Is(err, store.ErrRedriven) || outbox() != before {
		t.Fatalf("second redrive without again: %v", err)
	}
	again := opts
	again.Again = true
	if w, err := s.RedriveWork(ctx, failed.ID, again, announce); err != nil || w.Dispatch != 3 {
		t.Fatalf("redrive --again of a new ending: %+v %v", w, err)
	}

	for _, state := range []string{outcome.Accepted, outcome.Superseded, outcome.Canceled, outcome.Queued} {
		w := insert(t, ctx, s, newWork("acme", "r/state-"+state, "a"))
		if state != outcome.Queued {
			end(w, state)
		}
		if _, err := s.RedriveWork(ctx, w.ID, opts, announce); !errors.Is(err, store.ErrNotRedrivable) {
			t.Errorf("redrive of %s work: %v", state, err)
		}
	}

	old := insert(t, ctx, s, newWork("acme", "r/2", "a"))
	end(old, outcome.SchemaRejected)
	insert(t, ctx, s, newWork("acme", "r/2", "b"))
	if _, err := s.RedriveWork(ctx, old.ID, opts, announce); !errors.Is(err, store.ErrSuperseded) {
		t.Errorf("redrive of a replaced revision: %v", err)
	}

	purged := insert(t, ctx, s, newWork("acme", "r/3", "a"))
	end(purged, outcome.RetryExhausted)
	if _, err := s.Purge(ctx, store.Retention{Outbox: time.Hour, Data: 0, Limit: 10}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RedriveWork(ctx, purged.ID, opts, announce); !errors.Is(err, store.ErrNoInput) {
		t.Errorf("redrive of purged work: %v", err)
	}
	if _, err := s.RedriveWork(ctx, "w_none", opts, announce); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("redrive of no work: %v", err)
	}
}
