package store_test

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"testing"
	"time"

	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

// checkWords lists the words a table's CHECK constraint allows.
func checkWords(t *testing.T, ctx context.Context, s *store.Store, table, constraint string) []string {
	t.Helper()
	var def string
	if err := store.Pool(s).QueryRow(ctx, `SELECT pg_get_constraintdef(oid) FROM pg_constraint
		WHERE conrelid = $1::regclass AND conname = $2`, table, constraint).Scan(&def); err != nil {
		t.Fatalf("%s.%s: %v", table, constraint, err)
	}
	var words []string
	for _, m := range regexp.MustCompile(`'([a-z_]+)'::text`).FindAllStringSubmatch(def, -1) {
		words = append(words, m[1])
	}
	return slices.Sorted(slices.Values(words))
}

// The review queue's words and the actors' kinds and routes are the
// database's, and the outcome a canceled batch item ends with is a work
// state the database allows.
func TestReviewVocabularyMatchesTheDatabase(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	for _, c := range []struct {
		table, constraint string
		want              []string
	}{
		{"reviews", "reviews_reason_check", store.ReviewReasons},
		{"reviews", "reviews_state_check", store.ReviewStates},
		{"reviews", "reviews_verdict_check", store.ResolvedVerdicts},
		{"reviews", "reviews_resolved_kind_check", store.ResolverKinds},
		{"reviews", "reviews_resolved_route_check", store.ResolverRoutes},
		{"work_actions", "work_actions_actor_kind_check", store.ActorKinds},
		{"work_actions", "work_actions_route_check", store.Routes},
	} {
		if got := checkWords(t, ctx, s, c.table, c.constraint); !slices.Equal(got, slices.Sorted(slices.Values(c.want))) {
			t.Errorf("%s allows %v; package store names %v", c.constraint, got, c.want)
		}
	}
	// A review reason that names a work outcome is that outcome's word.
	for _, r := range []string{store.ReviewSchemaRejected, store.ReviewRetryExhausted} {
		if !outcome.IsTerminal(r) {
			t.Errorf("review reason %s is not a work outcome", r)
		}
	}
	if !slices.Contains(checkWords(t, ctx, s, "work", "work_state_check"), outcome.Canceled) {
		t.Errorf("work_state_check does not allow %s", outcome.Canceled)
	}
}

// The actors of the tests: acme's token through the API, and two people
// on the console's review screen.
var (
	acmeAPI = store.Actor{Kind: store.ActorTenant, ID: "acme", Route: store.RouteAPI}
	ana     = store.Actor{Kind: store.ActorReviewer, ID: "ana", Route: store.RouteConsole}
	bo      = store.Actor{Kind: store.ActorOperator, ID: "bo", Route: store.RouteConsole}
)

func reviews(t *testing.T, ctx context.Context, s *store.Store, workID string) int {
	t.Helper()
	return count(t, ctx, s, `SELECT count(*) FROM reviews WHERE work_id = $1`, workID)
}

// Work that ends needing a person gets one review item, whatever ends it
// and however often; other work gets none.
func TestReviewQueueEntries(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	end := func(w *store.Work, state string) {
		t.Helper()
		token := newUUID()
		claim(t, ctx, s, w.ID, newUUID(), token, time.Minute)
		if ok, err := store.FinishLeased(ctx, s, w.ID, token, state, "the test ends it"); err != nil || !ok {
			t.Fatalf("finish %s %s: %v %v", w.ID, state, ok, err)
		}
	}
	interactive := func(source string) *store.Work {
		w := newWork("acme", source, "r1")
		w.Lane = "interactive"
		return insert(t, ctx, s, w)
	}

	rejected := insert(t, ctx, s, newWork("acme", "rejected", "r1"))
	end(rejected, outcome.SchemaRejected)
	exhausted := interactive("exhausted")
	end(exhausted, outcome.RetryExhausted)
	batchExhausted := insert(t, ctx, s, newWork("acme", "batch-exhausted", "r1"))
	end(batchExhausted, outcome.RetryExhausted)
	unleased := interactive("unleased")
	if ok, err := s.FinishUnleased(ctx, unleased.ID, outcome.RetryExhausted, "deadline"); err != nil || !ok {
		t.Fatalf("finish unleased: %v %v", ok, err)
	}
	expired := interactive("expired")
	end(expired, outcome.Expired)

	for _, c := range []struct {
		w      *store.Work
		want   int
		reason string
	}{
		{rejected, 1, store.ReviewSchemaRejected},
		{exhausted, 1, store.ReviewRetryExhausted},
		{unleased, 1, store.ReviewRetryExhausted},
		{batchExhausted, 0, ""},
		{expired, 0, ""},
	} {
		if n := reviews(t, ctx, s, c.w.ID); n != c.want {
			t.Errorf("%s: %d review items, want %d", c.w.SourceID, n, c.want)
			continue
		}
		if c.want == 1 {
			v, err := s.ReviewOfWork(ctx, c.w.ID)
			if err != nil || v.Reason != c.reason || v.State != store.ReviewOpen || v.TenantID != "acme" || v.Lane != c.w.Lane {
				t.Errorf("%s: review %+v, %v; want an open %s item", c.w.SourceID, v, err, c.reason)
			}
		}
	}

	// A re-run (an operator's redrive puts the work back in the queue) that
	// ends the same way again adds no second item.
	if _, err := store.Pool(s).Exec(ctx, `UPDATE work SET state = 'queued', reason = NULL, dispatch = dispatch + 1
		WHERE id = $1`, rejected.ID); err != nil {
		t.Fatal(err)
	}
	end(rejected, outcome.SchemaRejected)
	if n := reviews(t, ctx, s, rejected.ID); n != 1 {
		t.Fatalf("after a re-run: %d review items, want 1", n)
	}

	// An accepted moderation answer that asks for a person, committed
	// twice (a redelivered verdict): one item. One that does not ask: none.
	commit := func(w *store.Work, output string) {
		t.Helper()
		token, attempt := newUUID(), newUUID()
		claim(t, ctx, s, w.ID, attempt, token, time.Minute)
		if v, err := s.Commit(ctx, w, attempt, token, []byte(output), 0, nil); err != nil || v != store.Committed {
			t.Fatalf("commit: %v %v", v, err)
		}
		if v, err := s.Commit(ctx, w, attempt, token, []byte(output), 0, nil); err != nil || v != store.Lost {
			t.Fatalf("second commit: %v %v", v, err)
		}
	}
	human := insert(t, ctx, s, newWork("acme", "human", "r1"))
	commit(human, `{"category":"self_harm","confidence":0.9,"needsHumanReview":true}`)
	fine := insert(t, ctx, s, newWork("acme", "fine", "r1"))
	commit(fine, `{"category":"other","confidence":0.9,"needsHumanReview":false}`)
	if n := reviews(t, ctx, s, human.ID); n != 1 {
		t.Errorf("needsHumanReview: %d review items, want 1", n)
	}
	if v, err := s.ReviewOfWork(ctx, human.ID); err != nil || v.Reason != store.ReviewNeedsHuman || v.WorkState != outcome.Accepted {
		t.Errorf("needsHumanReview: %+v, %v", v, err)
	}
	if n := reviews(t, ctx, s, fine.ID); n != 0 {
		t.Errorf("no review asked: %d review items, want 0", n)
	}
	// The views count the answer as needing review until a person
	// resolves its item; then as the verdict says. Needing review is the
	// open items: the three ended ones above, and this one.
	views := func() map[string]int64 {
		t.Helper()
		v, err := s.ViewsOf(ctx, time.Hour, "acme")
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := views()
	if before[store.ViewNeedsReview] != 4 {
		t.Fatalf("views before the resolution: %v, want needs_review 4", before)
	}
	if _, err := s.ResolveReview(ctx, "acme", human.ID, store.Resolution{By: ana, Verdict: store.VerdictApproved}); err != nil {
		t.Fatal(err)
	}
	after := views()
	if after[store.ViewNeedsReview] != 3 || after[store.ViewAccepted] != before[store.ViewAccepted]+1 {
		t.Errorf("views after the answer's review item was approved: %v (before %v), want it accepted", after, before)
	}
	// The unique key itself refuses a second item, however it is written.
	_, err := store.Pool(s).Exec(ctx, `INSERT INTO reviews (work_id, tenant_id, contract, lane, reason)
		VALUES ($1, 'acme', 'pr-review', 'batch', 'schema_rejected')`, human.ID)
	if sqlState(err) != "23505" {
		t.Fatalf("a second item for one work: %v, want a unique violation", err)
	}
}

func TestResolveReview(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	for _, src := range []string{"a", "b", "c"} {
		w := insert(t, ctx, s, newWork("acme", src, "r1"))
		token := newUUID()
		claim(t, ctx, s, w.ID, newUUID(), token, time.Minute)
		if _, err := store.FinishLeased(ctx, s, w.ID, token, outcome.SchemaRejected, "schema"); err != nil {
			t.Fatal(err)
		}
	}
	page, err := s.ListReviews(ctx, store.ReviewFilter{Tenant: "acme", Limit: 2})
	if err != nil || len(page) != 2 {
		t.Fatalf("first page: %d items, %v", len(page), err)
	}
	at, id, err := store.ParseReviewCursor(store.ReviewCursor(page[1]))
	if err != nil {
		t.Fatal(err)
	}
	rest, err := s.ListReviews(ctx, store.ReviewFilter{Tenant: "acme", Limit: 2, AfterCreated: at, AfterWork: id})
	if err != nil || len(rest) != 1 || rest[0].ID == page[0].ID || rest[0].ID == page[1].ID {
		t.Fatalf("second page: %+v, %v", rest, err)
	}
	if other, err := s.ListReviews(ctx, store.ReviewFilter{Tenant: "other", Limit: 10}); err != nil || len(other) != 0 {
		t.Fatalf("another tenant lists %d items, %v", len(other), err)
	}
	target := page[0].WorkID
	if _, err := s.ResolveReview(ctx, "other", target, store.Resolution{By: store.Actor{Kind: store.ActorTenant, ID: "other", Route: store.RouteAPI}, Verdict: store.VerdictApproved}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another tenant resolves: %v, want ErrNotFound", err)
	}
	v, err := s.ResolveReview(ctx, "acme", target, store.Resolution{By: acmeAPI, Verdict: store.VerdictRejected, Note: "wrong file"})
	if err != nil || v.State != store.ReviewResolved || v.ResolvedBy != "acme" || v.Verdict != store.VerdictRejected || v.Note != "wrong file" || v.ResolvedAt.IsZero() {
		t.Fatalf("resolve: %+v, %v", v, err)
	}
	if who, ok := v.Resolver(); !ok || who != acmeAPI || who.String() != "tenant acme via the API" {
		t.Errorf("the resolver: %+v (%v), want acme's token through the API", who, ok)
	}
	again, err := s.ResolveReview(ctx, "acme", target, store.Resolution{By: bo, Verdict: store.VerdictApproved})
	if !errors.Is(err, store.ErrResolved) || again.ResolvedBy != "acme" || again.Verdict != store.VerdictRejected {
		t.Fatalf("resolve twice: %+v, %v; want ErrResolved with the first resolution", again, err)
	}
	open, err := s.ListReviews(ctx, store.ReviewFilter{Tenant: "acme", State: store.ReviewOpen, Limit: 10})
	if err != nil || len(open) != 2 {
		t.Fatalf("open items: %d, %v", len(open), err)
	}
}

// Two people never hold the same item: a second claim while the first
// holds is ErrClaimed naming the holder, and so is anyone else's
// resolution; the holder's own resolution with an answer writes its outbox
// rows in the same transaction, and a lapsed hold is anyone's.
func TestReviewClaims(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	var ids []string
	for _, src := range []string{"held", "lapsed"} {
		w := insert(t, ctx, s, newWork("acme", src, "r1"))
		token := newUUID()
		claim(t, ctx, s, w.ID, newUUID(), token, time.Minute)
		if _, err := store.FinishLeased(ctx, s, w.ID, token, outcome.SchemaRejected, "schema"); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, w.ID)
	}
	held := ids[0]
	if _, err := s.ClaimReview(ctx, "other", held, ana, time.Minute); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a claim scoped to another tenant: %v, want ErrNotFound", err)
	}
	if _, err := s.ClaimReview(ctx, "", held, acmeAPI, time.Minute); err == nil {
		t.Fatal("a tenant's claim was taken: a claim is a person's on the console")
	}
	v, err := s.ClaimReview(ctx, "", held, ana, time.Minute)
	if err != nil || v.HeldBy(time.Now()) != "ana" || v.ClaimedKind != store.ActorReviewer {
		t.Fatalf("ana's claim: %+v, %v", v, err)
	}
	if again, err := s.ClaimReview(ctx, "", held, ana, 2*time.Minute); err != nil || !again.ClaimedUntil.After(v.ClaimedUntil) {
		t.Fatalf("ana's claim again: %+v, %v; want it extended", again, err)
	}
	if got, err := s.ClaimReview(ctx, "", held, bo, time.Minute); !errors.Is(err, store.ErrClaimed) || got.ClaimedBy != "ana" {
		t.Fatalf("bo's claim while ana holds: %+v, %v; want ErrClaimed naming ana", got, err)
	}
	for _, r := range []store.Resolution{{By: bo, Verdict: store.VerdictRejected, Holder: "bo"},
		{By: acmeAPI, Verdict: store.VerdictApproved}} {
		if got, err := s.ResolveReview(ctx, "", held, r); !errors.Is(err, store.ErrClaimed) || got.ClaimedBy != "ana" {
			t.Fatalf("%s resolves while ana holds: %+v, %v; want ErrClaimed", r.By, got, err)
		}
	}
	before := count(t, ctx, s, `SELECT count(*) FROM outbox WHERE msg_id = $1`, held+".reviewed")
	out := []byte(`{"findings": []}`) // as jsonb prints it
	resolved, err := s.ResolveReview(ctx, "", held, store.Resolution{By: ana, Verdict: store.VerdictAmended, Holder: "ana", Output: out,
		Announce: func(v *store.Review) ([]store.OutboxMsg, error) {
			return []store.OutboxMsg{{Stream: "OUTCOME", Subject: "x.outcome." + v.TenantID, MsgID: v.WorkID + ".reviewed", Payload: []byte(`{}`)}}, nil
		}})
	if err != nil || resolved.Verdict != store.VerdictAmended || string(resolved.Output) != string(out) || resolved.ClaimedBy != "" {
		t.Fatalf("ana resolves: %+v, %v", resolved, err)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM outbox WHERE msg_id = $1`, held+".reviewed"); n != before+1 {
		t.Errorf("outbox rows of the reviewed outcome: %d, want %d", n, before+1)
	}
	if who, ok := resolved.Resolver(); !ok || who != ana {
		t.Errorf("the resolver: %+v (%v), want ana on the console", who, ok)
	}
	// Each claim and the resolution are recorded with who and the route;
	// the claims and resolutions refused record nothing.
	acts, err := s.ActionsOf(ctx, held)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range acts {
		got = append(got, a.Action+" by "+a.Actor().String())
	}
	if want := []string{"claim by reviewer ana via the console", "claim by reviewer ana via the console",
		"resolve by reviewer ana via the console"}; !slices.Equal(got, want) || acts[2].Note != store.VerdictAmended {
		t.Errorf("the item's actions: %q (last note %q), want %q", got, acts[len(acts)-1].Note, want)
	}
	// The answer a person published counts as accepted; the other item is
	// still open, for a person.
	if views, err := s.ViewsOf(ctx, time.Hour, "acme"); err != nil || views[store.ViewAccepted] != 1 || views[store.ViewNeedsReview] != 1 {
		t.Errorf("views after the amendment: %v, %v; want one accepted, one needing review", views, err)
	}
	if _, err := s.ClaimReview(ctx, "", held, bo, time.Minute); !errors.Is(err, store.ErrResolved) {
		t.Errorf("a claim of a resolved item: %v, want ErrResolved", err)
	}
	// A hold that has run out is anyone's.
	lapsed := ids[1]
	if _, err := s.ClaimReview(ctx, "", lapsed, ana, time.Microsecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	if v, err := s.ClaimReview(ctx, "acme", lapsed, bo, time.Minute); err != nil || v.ClaimedBy != "bo" || v.ClaimedKind != store.ActorOperator {
		t.Fatalf("bo's claim after ana's lapsed: %+v, %v", v, err)
	}
}

func TestBatchInsertAndCancel(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	entries := func(sources ...string) []*store.BatchEntry {
		var out []*store.BatchEntry
		for _, src := range sources {
			out = append(out, &store.BatchEntry{ItemID: "item-" + src, Work: newWork("acme", src, "r1")})
		}
		return out
	}
	b := &store.Batch{ID: "b_test", TenantID: "acme", Contract: "pr-review", ItemsDigest: "d1", DeadlineAt: time.Now().Add(time.Hour)}
	// One item's work exists already, asked for on its own: the ingress
	// fence gives it back, and the batch's cancel leaves it to its request.
	existing := insert(t, ctx, s, newWork("acme", "x", "r1"))
	// An older revision of y, still queued, is superseded by the batch's.
	older := insert(t, ctx, s, newWork("acme", "y", "r0"))
	outboxBefore := count(t, ctx, s, `SELECT count(*) FROM outbox`)
	es := entries("x", "y", "z")
	got, created, err := s.InsertBatch(ctx, b, es, announce)
	if err != nil || !created || got.ItemCount != 3 {
		t.Fatalf("insert batch: %+v %v %v", got, created, err)
	}
	if es[0].Got.ID != existing.ID || es[0].Created || !es[1].Created || !es[2].Created {
		t.Fatalf("entries: %+v %+v %+v", es[0], es[1], es[2])
	}
	if w, err := s.GetWork(ctx, older.ID); err != nil || w.State != outcome.Superseded || w.Reason != "superseded by revision r1" {
		t.Fatalf("older revision: %+v, %v", w, err)
	}
	if !slices.Equal(es[1].Got.Superseded, []string{older.ID}) {
		t.Fatalf("y superseded %v", es[1].Got.Superseded)
	}
	// The two new items are announced, the existing one is not again.
	if n := count(t, ctx, s, `SELECT count(*) FROM outbox`) - outboxBefore; n != 2 {
		t.Fatalf("%d outbox rows for two new items", n)
	}
	// Dropped work named by a batch is queued again.
	dropped := newWork("acme", "d", "r1")
	dropped.DropReason = "over the rate"
	if _, _, err := s.InsertWork(ctx, dropped, announce); err != nil {
		t.Fatal(err)
	}
	de := entries("d")
	if _, _, err := s.InsertBatch(ctx, &store.Batch{ID: "b_drop", TenantID: "acme", Contract: "pr-review", ItemsDigest: "dd",
		DeadlineAt: time.Now().Add(time.Hour)}, de, announce); err != nil || !de[0].Created || de[0].Got.State != outcome.Queued {
		t.Fatalf("dropped item: %+v, %v", de[0], err)
	}
	if _, created, err := s.InsertBatch(ctx, b, entries("x", "y", "z"), announce); err != nil || created {
		t.Fatalf("same batch again: created=%v %v", created, err)
	}
	other := *b
	other.ItemsDigest = "d2"
	if _, _, err := s.InsertBatch(ctx, &other, entries("x", "q"), announce); !errors.Is(err, store.ErrBatchConflict) {
		t.Fatalf("batch id with other items: %v, want ErrBatchConflict", err)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM work WHERE source_id = 'q'`); n != 0 {
		t.Fatalf("a refused batch stored %d work rows", n)
	}
	if _, err := s.GetBatch(ctx, "other", b.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another tenant reads the batch: %v", err)
	}

	// y runs, z ends accepted; the cancel ends y, stops its call, and
	// leaves x, which its own request asked for.
	tokenY := newUUID()
	claim(t, ctx, s, es[1].Got.ID, newUUID(), tokenY, time.Minute)
	tokenZ, attemptZ := newUUID(), newUUID()
	claim(t, ctx, s, es[2].Got.ID, attemptZ, tokenZ, time.Minute)
	if v, err := s.Commit(ctx, es[2].Got, attemptZ, tokenZ, []byte(`{}`), 0, nil); err != nil || v != store.Committed {
		t.Fatalf("commit z: %v %v", v, err)
	}
	var stopped []store.CanceledItem
	cb, ended, err := s.CancelBatch(ctx, "acme", b.ID, func(items []store.CanceledItem) ([]store.OutboxMsg, error) {
		stopped = items
		return nil, nil
	})
	if err != nil || cb.CanceledAt.IsZero() || len(ended) != 1 || ended[0].WorkID != es[1].Got.ID {
		t.Fatalf("cancel: %+v %v %v", cb, ended, err)
	}
	if w, err := s.GetWork(ctx, existing.ID); err != nil || w.State != outcome.Queued {
		t.Fatalf("work asked for on its own, canceled with the batch: %+v %v", w, err)
	}
	running := 0
	for _, c := range stopped {
		if c.Running {
			running++
			if c.WorkID != es[1].Got.ID {
				t.Errorf("running item %s, want %s", c.WorkID, es[1].Got.ID)
			}
		}
	}
	if running != 1 {
		t.Errorf("%d running items stopped, want 1", running)
	}
	o, err := s.BatchOverview(ctx, b.ID, 1)
	if err != nil || o.Counts[outcome.Canceled] != 1 || o.Counts[outcome.Accepted] != 1 || len(o.Pending) != 1 ||
		len(o.Failed) != 1 || o.Failed[0].ItemID != "item-y" || o.Pending[0].ItemID != "item-x" {
		t.Fatalf("overview %+v, %v", o, err)
	}
	// y's late answer finds its lease gone.
	if ok, err := store.FinishLeased(ctx, s, es[1].Got.ID, tokenY, outcome.Accepted, ""); err != nil || ok {
		t.Fatalf("a canceled item's worker finished it: %v %v", ok, err)
	}
	if _, ended, err := s.CancelBatch(ctx, "acme", b.ID, nil); err != nil || len(ended) != 0 {
		t.Fatalf("second cancel: %v %v", ended, err)
	}
	if _, _, err := s.CancelBatch(ctx, "other", b.ID, nil); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another tenant cancels: %v", err)
	}
	items, err := s.BatchItems(ctx, store.BatchItemFilter{BatchID: b.ID, NotAccepted: true, Limit: 10})
	if err != nil || len(items) != 2 || items[0].ItemID != "item-x" || items[1].ItemID != "item-y" || items[1].Reason != "batch b_test was canceled" {
		t.Fatalf("not accepted items: %+v, %v", items, err)
	}
	all, err := s.BatchItems(ctx, store.BatchItemFilter{BatchID: b.ID, WithOutput: true, After: "item-x", Limit: 10})
	if err != nil || len(all) != 2 || all[1].ItemID != "item-z" || string(all[1].Output) != `{}` || all[0].Output != nil {
		t.Fatalf("items after item-x: %+v, %v", all, err)
	}

	// A batch whose items all ended has nothing to cancel.
	done := &store.Batch{ID: "b_done", TenantID: "acme", Contract: "pr-review", ItemsDigest: "d3", DeadlineAt: time.Now().Add(time.Hour)}
	if _, _, err := s.InsertBatch(ctx, done, entries("z"), announce); err != nil {
		t.Fatal(err)
	}
	if db, ended, err := s.CancelBatch(ctx, "acme", done.ID, nil); err != nil || len(ended) != 0 || !db.CanceledAt.IsZero() {
		t.Fatalf("cancel of an ended batch: %+v %v %v", db, ended, err)
	}
}

// A batch's cancel reaches only what the batch alone asked for: an item
// the tenant also posts on its own, before or after the batch (the same
// key, so the same work), is left to that request.
func TestBatchCancelLeavesWorkAskedForOnItsOwn(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	es := []*store.BatchEntry{{ItemID: "only", Work: newWork("acme", "only", "r1")}, {ItemID: "later", Work: newWork("acme", "later", "r1")}}
	b := &store.Batch{ID: "b_scope", TenantID: "acme", Contract: "pr-review", ItemsDigest: "ds", DeadlineAt: time.Now().Add(time.Hour)}
	if _, _, err := s.InsertBatch(ctx, b, es, announce); err != nil {
		t.Fatal(err)
	}
	// The same key posted on its own after the batch: a duplicate, the
	// same work.
	if got, created, err := s.InsertWork(ctx, newWork("acme", "later", "r1"), announce); err != nil || created || got.ID != es[1].Got.ID {
		t.Fatalf("the later request: %+v created=%v %v", got, created, err)
	}
	_, ended, err := s.CancelBatch(ctx, "acme", b.ID, nil)
	if err != nil || len(ended) != 1 || ended[0].WorkID != es[0].Got.ID {
		t.Fatalf("cancel ended %+v (%v), want only the batch's own item %s", ended, err, es[0].Got.ID)
	}
	if w, err := s.GetWork(ctx, es[1].Got.ID); err != nil || w.State != outcome.Queued {
		t.Fatalf("work also asked for on its own: %+v %v, want it queued", w, err)
	}
}

// An OUTCOME event the broker lost is read back for the outcome the work
// publishes now: once a person published an answer from the review
// screen, its reviewed event, never the work's own outcome again, and
// neither once the publisher has a row for it.
func TestReviewedOutcomeIsReadBack(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	w := newWork("acme", "shop-app-5", "r1")
	w.Contract, w.SourceID = "code-review", "shop/app#5"
	w = insert(t, ctx, s, w)
	token := newUUID()
	claim(t, ctx, s, w.ID, newUUID(), token, time.Minute)
	if _, err := store.FinishLeased(ctx, s, w.ID, token, outcome.SchemaRejected, "schema"); err != nil {
		t.Fatal(err)
	}
	outcomeRow := func(oc string) []store.OutboxMsg {
		return []store.OutboxMsg{{Stream: "OUTCOME", Subject: "x.outcome.acme", MsgID: w.ID + "." + oc, Payload: []byte(`{"outcome":"` + oc + `"}`)}}
	}
	readBack := func() []string {
		t.Helper()
		if _, err := store.Pool(s).Exec(ctx, `UPDATE outbox SET published_at = now() - interval '1 minute' WHERE msg_id LIKE $1 || '.%'`, w.ID); err != nil {
			t.Fatal(err)
		}
		got, err := s.UnpublishedOutcomes(ctx, time.Second, 10)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, p := range got {
			out = append(out, string(p))
		}
		return out
	}
	if _, err := store.Pool(s).Exec(ctx, `INSERT INTO outbox (stream, subject, msg_id, payload, headers) VALUES ('OUTCOME', 'x', $1, $2, '{}')`,
		w.ID+".schema_rejected", []byte(`{"outcome":"schema_rejected"}`)); err != nil {
		t.Fatal(err)
	}
	if got := readBack(); len(got) != 1 || got[0] != `{"outcome":"schema_rejected"}` {
		t.Fatalf("read back before the review: %q", got)
	}
	if _, err := s.ResolveReview(ctx, "acme", w.ID, store.Resolution{By: ana, Verdict: store.VerdictAmended, Output: []byte(`{"findings": []}`),
		Announce: func(*store.Review) ([]store.OutboxMsg, error) { return outcomeRow(outcome.Reviewed), nil }}); err != nil {
		t.Fatal(err)
	}
	if got := readBack(); len(got) != 1 || got[0] != `{"outcome":"reviewed"}` {
		t.Fatalf("read back after the review: %q; want the reviewed event alone", got)
	}
	now := time.Now()
	if _, err := s.OpenPublications(ctx, w.ID, "acme", outcome.Reviewed, []string{"github"}, now, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got := readBack(); len(got) != 0 {
		t.Fatalf("read back once the publisher has it: %q; want nothing", got)
	}
}

// A batch's items go through the ingress fence's one statement: an item
// whose key work under another id already holds gets that work (the batch
// used to fail), a new item is not direct, a found direct row stays direct,
// and work a batch made becomes direct when asked for on its own.
func TestBatchItemsTakeTheIngressFence(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	held := newWork("acme", "held", "r1")
	held.ID = "w_other_id_for_held"
	held = insert(t, ctx, s, held)
	direct := insert(t, ctx, s, newWork("acme", "mine", "r1"))
	es := []*store.BatchEntry{
		{ItemID: "a", Work: newWork("acme", "held", "r1")},
		{ItemID: "b", Work: newWork("acme", "mine", "r1")},
		{ItemID: "c", Work: newWork("acme", "fresh", "r1")},
	}
	b := &store.Batch{ID: "b_fence", TenantID: "acme", Contract: "pr-review", ItemsDigest: "df", DeadlineAt: time.Now().Add(time.Hour)}
	if _, created, err := s.InsertBatch(ctx, b, es, announce); err != nil || !created {
		t.Fatalf("insert batch: created=%v %v", created, err)
	}
	if es[0].Got.ID != held.ID || es[0].Created || es[1].Got.ID != direct.ID || es[1].Created || !es[2].Created {
		t.Fatalf("entries: %+v / %+v / %+v", es[0], es[1], es[2])
	}
	isDirect := func(id string) bool {
		return count(t, ctx, s, `SELECT count(*) FROM work WHERE id = $1 AND direct`, id) == 1
	}
	if !isDirect(held.ID) || !isDirect(direct.ID) || isDirect(es[2].Got.ID) {
		t.Fatalf("direct: held %v, mine %v, fresh %v; want true, true, false", isDirect(held.ID), isDirect(direct.ID), isDirect(es[2].Got.ID))
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM batch_items WHERE batch_id = $1 AND work_id = $2`, b.ID, held.ID); n != 1 {
		t.Fatalf("the manifest names the held work %d times", n)
	}
	if got, created, err := s.InsertWork(ctx, newWork("acme", "fresh", "r1"), announce); err != nil || created || got.ID != es[2].Got.ID {
		t.Fatalf("asking for the batch's work on its own: %+v created=%v %v", got, created, err)
	}
	if !isDirect(es[2].Got.ID) {
		t.Fatal("work a batch made stays not direct after it is asked for on its own")
	}
}
