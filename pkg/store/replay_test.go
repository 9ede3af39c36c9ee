package store_test

import (
	"errors"
	"fmt"
	"sync"
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

// A confirmed redrive is all or nothing: of two at once over the same set,
// one redrives every item and the other writes nothing; a confirmed count
// the selection no longer holds writes nothing either.
func TestRedriveSetIsAllOrNothing(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	var ids []string
	for i := range 6 {
		w := insert(t, ctx, s, newWork("acme", fmt.Sprintf("set/%d", i), "a"))
		if ok, err := s.FinishUnleased(ctx, w.ID, outcome.Expired, "ended by the test"); err != nil || !ok {
			t.Fatal(ok, err)
		}
		ids = append(ids, w.ID)
	}
	ids = append(ids, "w_none")
	opts := store.RedriveOptions{Deadline: time.Now().Add(time.Hour)}
	dry := opts
	dry.DryRun = true
	got, err := s.RedriveSet(ctx, ids, dry, -1, announce)
	if err != nil || len(got) != 7 || !errors.Is(got[6].Err, store.ErrNotFound) || got[0].Work == nil || got[0].Was != outcome.Expired {
		t.Fatalf("dry run: %+v %v", got, err)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM redrives`); n != 0 {
		t.Fatalf("the dry run wrote %d redrives", n)
	}
	// The count confirmed is not what the selection holds: nothing.
	if _, err := s.RedriveSet(ctx, ids, opts, 5, announce); !errors.Is(err, store.ErrSelectionChanged) ||
		count(t, ctx, s, `SELECT count(*) FROM redrives`) != 0 || count(t, ctx, s, `SELECT count(*) FROM work WHERE state = 'queued'`) != 0 {
		t.Fatalf("confirm 5 of 6: %v, and something was written", err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Go(func() { _, errs[i] = s.RedriveSet(ctx, ids, opts, 6, announce) })
	}
	wg.Wait()
	ok, changed := 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, store.ErrSelectionChanged):
			changed++
		default:
			t.Fatalf("concurrent redrive: %v", err)
		}
	}
	if ok != 1 || changed != 1 {
		t.Fatalf("two confirmed redrives at once: %d succeeded, %d found the selection changed (%v)", ok, changed, errs)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM redrives`); n != 6 {
		t.Errorf("%d redrive rows, want one per work item", n)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM work WHERE state = 'queued' AND dispatch = 2`); n != 6 {
		t.Errorf("%d work items queued as dispatch 2, want 6", n)
	}
}

// The first announcement of work is its dispatch number, as the row and
// every later announcement count: msg id .1 for dispatch 1.
func TestFirstAnnouncementIsDispatchOne(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	w := insert(t, ctx, s, newWork("acme", "dispatch/1", "a"))
	var msgID string
	if err := store.Pool(s).QueryRow(ctx, `SELECT msg_id FROM outbox WHERE msg_id LIKE $1 || '.%'`, w.ID).Scan(&msgID); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%s.%d", w.ID, w.Dispatch); w.Dispatch != 1 || msgID != want {
		t.Fatalf("work at dispatch %d announced as %s, want %s.1", w.Dispatch, msgID, w.ID)
	}
}
