package store_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

// endLeased claims w and ends it state, as a worker's verdict does.
func endLeased(t *testing.T, ctx context.Context, s *store.Store, id, state string) {
	t.Helper()
	token := newUUID()
	claim(t, ctx, s, id, newUUID(), token, time.Minute)
	if ok, err := store.FinishLeased(ctx, s, id, token, state, "the test ends it"); err != nil || !ok {
		t.Fatalf("end %s %s: %v %v", id, state, ok, err)
	}
}

// commitAnswer claims w and commits output as its accepted result.
func commitAnswer(t *testing.T, ctx context.Context, s *store.Store, w *store.Work, output string) {
	t.Helper()
	token, attempt := newUUID(), newUUID()
	claim(t, ctx, s, w.ID, attempt, token, time.Minute)
	if v, err := s.Commit(ctx, w, attempt, token, []byte(output), 0, nil); err != nil || v != store.Committed {
		t.Fatalf("commit %s: %v %v", w.ID, v, err)
	}
}

// rejectedThenRedriven is work that ended schema_rejected, whose review
// item is open, redriven: queued again.
func rejectedThenRedriven(t *testing.T, ctx context.Context, s *store.Store, source string) *store.Work {
	t.Helper()
	w := newWork("acme", source, "r1")
	w.SupersedeOlder = true
	w = insert(t, ctx, s, w)
	endLeased(t, ctx, s, w.ID, outcome.SchemaRejected)
	got, err := s.RedriveWork(ctx, w.ID, store.RedriveOptions{Deadline: time.Now().Add(time.Hour)}, announce)
	if err != nil || got.State != outcome.Queued {
		t.Fatalf("redrive %s: %+v %v", w.ID, got, err)
	}
	return got
}

// A redrive that ends accepted, superseded or canceled settles its work:
// the open review item is closed by the system, saying why, its hold let
// go, and the queue no longer lists it. A redrive that ends rejected again
// leaves it open; one whose accepted answer asks for a person keeps it
// open for that; an item a person resolved stays as they resolved it.
func TestRedriveThatSettlesWorkClosesItsReviewItem(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	accepted := rejectedThenRedriven(t, ctx, s, "accepted")
	if _, err := s.ClaimReview(ctx, "", accepted.ID, ana, time.Hour); err != nil {
		t.Fatal(err)
	}
	commitAnswer(t, ctx, s, accepted, `{"findings":[]}`)

	superseded := rejectedThenRedriven(t, ctx, s, "superseded")
	newer := newWork("acme", "superseded", "r2")
	newer.SupersedeOlder = true
	insert(t, ctx, s, newer)

	canceled := rejectedThenRedriven(t, ctx, s, "canceled")
	if _, err := s.CancelWork(ctx, canceled.ID, "the caller gave up", func(*store.Work, bool) ([]store.OutboxMsg, error) { return nil, nil },
		&store.Audit{By: bo, Action: "cancel"}); err != nil {
		t.Fatal(err)
	}
	again := rejectedThenRedriven(t, ctx, s, "again")
	endLeased(t, ctx, s, again.ID, outcome.SchemaRejected)
	human := rejectedThenRedriven(t, ctx, s, "human")
	commitAnswer(t, ctx, s, human, `{"category":"self_harm","confidence":0.9,"needsHumanReview":true}`)

	personal := newWork("acme", "personal", "r1")
	personal = insert(t, ctx, s, personal)
	endLeased(t, ctx, s, personal.ID, outcome.SchemaRejected)
	if _, err := s.ResolveReview(ctx, "acme", personal.ID, store.Resolution{By: acmeAPI, Verdict: store.VerdictRejected}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RedriveWork(ctx, personal.ID, store.RedriveOptions{Deadline: time.Now().Add(time.Hour)}, announce); err != nil {
		t.Fatal(err)
	}
	commitAnswer(t, ctx, s, personal, `{"findings":[]}`)

	for id, why := range map[string]string{
		accepted.ID:   "the work was redriven and its answer was accepted",
		superseded.ID: "the work ended superseded (superseded by revision r2)",
		canceled.ID:   "the work ended canceled (the caller gave up)",
	} {
		v, err := s.ReviewOfWork(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		who, ok := v.Resolver()
		if v.State != store.ReviewResolved || !v.ClosedBySystem() || v.Note != why || v.ResolvedAt.IsZero() || v.ClaimedBy != "" ||
			!ok || who.Kind != store.ResolverSystem || v.ResolvedBy != store.SystemID {
			t.Errorf("the item of %s: %s %s by %+v (%q), held by %q; want closed by the system: %s", id, v.State, v.Verdict, who,
				v.Note, v.ClaimedBy, why)
		}
	}
	if v, err := s.ReviewOfWork(ctx, human.ID); err != nil || v.State != store.ReviewOpen || v.Reason != store.ReviewNeedsHuman {
		t.Errorf("the item of an accepted answer that asks for a person: %+v %v; want it open, needs_human_review", v, err)
	}
	if v, err := s.ReviewOfWork(ctx, personal.ID); err != nil || v.Verdict != store.VerdictRejected || v.ResolvedBy != "acme" {
		t.Errorf("the item a person resolved: %+v %v; want their rejection kept", v, err)
	}
	open, err := s.ListReviews(ctx, store.ReviewFilter{State: store.ReviewOpen, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, v := range open {
		listed = append(listed, v.WorkID)
	}
	if want := []string{again.ID, human.ID}; !slices.Equal(slices.Sorted(slices.Values(listed)), slices.Sorted(slices.Values(want))) {
		t.Errorf("the open queue lists %v, want %v", listed, want)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM work_actions WHERE actor_kind NOT IN ('tenant', 'reviewer', 'operator')`); n != 0 {
		t.Errorf("%d work actions by the system: a close is the item's, not a person's act", n)
	}
}

// "needs review" counts what a person can act on: the open review items,
// the very set the queue lists, however old. An accepted answer with a
// blocking finding or a high severity has no review item and counts
// accepted; a resolved item counts as its resolution says; and one work's
// view (ViewOf, which the work API shows) is the view Views counts it in.
func TestNeedsReviewCountsOpenReviewItemsOnly(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	want := map[string]string{}
	add := func(source, view string) *store.Work {
		w := insert(t, ctx, s, newWork("acme", source, "r1"))
		want[w.ID] = view
		return w
	}
	commitAnswer(t, ctx, s, add("blocking", store.ViewAccepted), `{"findings":[{"file":"a.go","line":1,"severity":"blocking","summary":"s","evidence":"e"}]}`)
	commitAnswer(t, ctx, s, add("high", store.ViewAccepted), `{"schema_version":"change-review.v1","severity":"high","tags":["auth"],"findings":[]}`)
	commitAnswer(t, ctx, s, add("human", store.ViewNeedsReview), `{"category":"self_harm","confidence":0.9,"needsHumanReview":true}`)
	endLeased(t, ctx, s, add("rejected", store.ViewNeedsReview).ID, outcome.SchemaRejected)
	dismissed := add("dismissed", store.ViewRejected)
	endLeased(t, ctx, s, dismissed.ID, outcome.SchemaRejected)
	amended := add("amended", store.ViewAccepted)
	endLeased(t, ctx, s, amended.ID, outcome.SchemaRejected)
	endLeased(t, ctx, s, add("exhausted", store.ViewTerminal).ID, outcome.RetryExhausted)
	add("queued", store.ViewRunning)
	if _, err := s.ResolveReview(ctx, "acme", dismissed.ID, store.Resolution{By: acmeAPI, Verdict: store.VerdictDismissed}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ResolveReview(ctx, "", amended.ID, store.Resolution{By: ana, Verdict: store.VerdictAmended, Output: []byte(`{"findings":[]}`)}); err != nil {
		t.Fatal(err)
	}
	// An open item of work older than the window is still the queue's.
	old := add("old", store.ViewNeedsReview)
	endLeased(t, ctx, s, old.ID, outcome.SchemaRejected)
	if _, err := store.Pool(s).Exec(ctx, `UPDATE work SET created_at = now() - interval '3 days' WHERE id = $1`, old.ID); err != nil {
		t.Fatal(err)
	}

	counted := map[string]int64{store.ViewRunning: 0, store.ViewAccepted: 0, store.ViewNeedsReview: 0, store.ViewRejected: 0, store.ViewTerminal: 0}
	for id, view := range want {
		counted[view]++
		if got, err := s.ViewOf(ctx, id); err != nil || got != view {
			t.Errorf("the view of %s is %q (%v), want %q", id, got, err, view)
		}
	}
	views, err := s.ViewsOf(ctx, time.Hour, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(views, counted) {
		t.Errorf("views %v, want %v", views, counted)
	}
	open, err := s.ListReviews(ctx, store.ReviewFilter{Tenant: "acme", State: store.ReviewOpen, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(open)) != views[store.ViewNeedsReview] {
		t.Errorf("needs_review is %d, the queue lists %d open items", views[store.ViewNeedsReview], len(open))
	}
	if cell, err := s.Views(ctx, time.Hour); err != nil || !maps.Equal(cell, counted) {
		t.Errorf("the cell's views (the assay_work_views gauge) %v (%v), want %v", cell, err, counted)
	}
	if other, err := s.ViewsOf(ctx, time.Hour, "other"); err != nil || other[store.ViewNeedsReview] != 0 {
		t.Errorf("another tenant's views %v (%v): want none of acme's items", other, err)
	}
	if _, err := s.ViewOf(ctx, "w_nothing"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the view of no work: %v, want ErrNotFound", err)
	}
}
