package store_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

// TestRevisionOrderIsOneRule: which revision of a source comes after which
// is decided alike by every insert's supersede and by the check that
// refuses to run a replaced revision again: by the source's time, and by
// arrival where the source's times are equal or missing; revisions that
// arrived together in one batch are neither after the other.
func TestRevisionOrderIsOneRule(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	state := func(id string) *store.Work {
		t.Helper()
		w, err := s.GetWork(ctx, id)
		if err != nil {
			t.Fatalf("read %s: %v", id, err)
		}
		return w
	}
	pushed := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	revision := func(source, rev string, at time.Time) *store.Work {
		w := newWork("acme", source, rev)
		w.SupersedeOlder, w.SourceUpdatedAt = true, at
		return w
	}

	t.Run("same push time: the later arrival supersedes", func(t *testing.T) {
		a := insert(t, ctx, s, revision("octo/shop#1", "a", pushed))
		b := insert(t, ctx, s, revision("octo/shop#1", "b", pushed))
		if got := state(a.ID); got.State != outcome.Superseded || got.Reason != "superseded by revision b" {
			t.Fatalf("a: %s %q, want superseded by revision b", got.State, got.Reason)
		}
		if got := state(b.ID); got.State != outcome.Queued || !slices.Equal(b.Superseded, []string{a.ID}) {
			t.Fatalf("b: %s, superseded %v; want queued, having superseded a", got.State, b.Superseded)
		}
	})

	t.Run("same push time: the later arrival replaces a dropped one", func(t *testing.T) {
		a := revision("octo/shop#2", "a", pushed)
		a.DropReason = "over the rate"
		insert(t, ctx, s, a)
		insert(t, ctx, s, revision("octo/shop#2", "b", pushed))
		if _, err := s.Rerun(ctx, a.ID, time.Now().Add(time.Minute), announce); !errors.Is(err, store.ErrSuperseded) ||
			!strings.Contains(err.Error(), "revision b") {
			t.Fatalf("rerun of a: %v, want ErrSuperseded naming revision b", err)
		}
	})

	t.Run("pushed earlier, delivered later: stored superseded", func(t *testing.T) {
		a := insert(t, ctx, s, revision("octo/shop#3", "a", pushed))
		b := insert(t, ctx, s, revision("octo/shop#3", "b", pushed.Add(-time.Minute)))
		if got := state(b.ID); got.State != outcome.Superseded || got.Reason != "revision a was pushed later" {
			t.Fatalf("b: %s %q, want superseded: revision a was pushed later", got.State, got.Reason)
		}
		if got := state(a.ID); got.State != outcome.Queued {
			t.Fatalf("a: %s, want queued", got.State)
		}
	})

	t.Run("one batch, two revisions: neither supersedes the other", func(t *testing.T) {
		es := []*store.BatchEntry{
			{ItemID: "item-a", Work: newWork("acme", "octo/shop#4", "a")},
			{ItemID: "item-b", Work: newWork("acme", "octo/shop#4", "b")},
		}
		b := &store.Batch{ID: "b_revisions", TenantID: "acme", Contract: "pr-review", ItemsDigest: "d",
			DeadlineAt: time.Now().Add(time.Hour)}
		if _, _, err := s.InsertBatch(ctx, b, es, announce); err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			if got := state(e.Got.ID); got.State != outcome.Queued || len(e.Got.Superseded) != 0 {
				t.Fatalf("%s: %s, superseded %v; want queued, having superseded nothing", e.ItemID, got.State, e.Got.Superseded)
			}
		}
		// The check agrees: neither replaced the other.
		if _, err := store.Pool(s).Exec(ctx, `UPDATE work SET state = 'dropped', reason = 'over the rate' WHERE id = $1`,
			es[0].Got.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Rerun(ctx, es[0].Got.ID, time.Now().Add(time.Minute), announce); err != nil {
			t.Fatalf("rerun of a: %v, want it queued again", err)
		}
		// A revision that arrives later supersedes both.
		c := insert(t, ctx, s, revision("octo/shop#4", "c", time.Time{}))
		if want := []string{es[0].Got.ID, es[1].Got.ID}; !slices.Equal(c.Superseded, want) {
			t.Fatalf("c superseded %v, want %v", c.Superseded, want)
		}
	})
}
