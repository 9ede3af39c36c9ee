package store_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

// endedReview stores code-review work of pull request shop/app#pr, which
// something is published for, and ends it expired and announced: with an
// OUTCOME outbox row sent to the broker when rowed, else as a commit's
// outcome, which the work row alone says.
func endedReview(t *testing.T, ctx context.Context, s *store.Store, pr string, rowed bool) *store.Work {
	t.Helper()
	w := newWork("acme", "shop/app#"+pr, "r1")
	w.Contract = "code-review"
	w = insert(t, ctx, s, w)
	if ok, err := s.FinishUnleased(ctx, w.ID, outcome.Expired, "deadline passed"); err != nil || !ok {
		t.Fatalf("expire %s: %v %v", w.ID, ok, err)
	}
	db := store.Pool(s)
	if _, err := db.Exec(ctx, `UPDATE work SET outcome_announced_at = now() WHERE id = $1`, w.ID); err != nil {
		t.Fatal(err)
	}
	if rowed {
		id := event.OutcomeMsgID(w.ID, outcome.Expired)
		payload, _ := json.Marshal(event.Outcome{OutcomeID: id, WorkID: w.ID, TenantID: "acme", Region: "us", Outcome: outcome.Expired})
		if _, err := db.Exec(ctx, `INSERT INTO outbox (stream, subject, msg_id, payload, headers, published_at)
			VALUES ('OUTCOME', 'assay.us.outcome.acme', $1, $2, '{}', now())`, id, payload); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

// passTime moves everything the cell dated, its outcome mark included,
// back by d, as if d had passed since: every outbox row was sent when it
// was written.
func passTime(t *testing.T, ctx context.Context, s *store.Store, d time.Duration) {
	t.Helper()
	db := store.Pool(s)
	for _, q := range []string{
		`UPDATE outcome_mark SET at = at - $1 * interval '1 microsecond'`,
		`UPDATE work SET created_at = created_at - $1 * interval '1 microsecond', updated_at = updated_at - $1 * interval '1 microsecond',
			deadline_at = deadline_at - $1 * interval '1 microsecond',
			outcome_announced_at = outcome_announced_at - $1 * interval '1 microsecond'`,
		`UPDATE outbox SET created_at = created_at - $1 * interval '1 microsecond',
			published_at = coalesce(published_at, created_at) - $1 * interval '1 microsecond'`,
		`DELETE FROM outbox_waiting q USING outbox o WHERE o.id = q.id AND o.published_at < now() - $1 * interval '1 microsecond'`,
		`UPDATE publications SET created_at = created_at - $1 * interval '1 microsecond',
			updated_at = updated_at - $1 * interval '1 microsecond'`,
	} {
		if _, err := db.Exec(ctx, q, d.Microseconds()); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// readBack is the ids of the works whose outcomes the reaper reads back.
func readBack(t *testing.T, ctx context.Context, s *store.Store) []string {
	t.Helper()
	got, err := s.UnpublishedOutcomes(ctx, time.Second, 10)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, p := range got {
		o, err := event.Parse[event.Outcome](p)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, o.WorkID)
	}
	slices.Sort(ids)
	return ids
}

// markAge is how long ago, by the database's clock, the outcome mark is.
func markAge(t *testing.T, ctx context.Context, s *store.Store) time.Duration {
	t.Helper()
	var age time.Duration
	if err := store.Pool(s).QueryRow(ctx, `SELECT now() - at FROM outcome_mark`).Scan(&age); err != nil {
		t.Fatal(err)
	}
	return age
}

// Outcomes the broker lost just before the committer went down for 25
// hours are read back however long ago they were announced, from the
// outcome mark its last pass left: a commit's, rebuilt from its work row,
// and one from its OUTCOME row, which the outbox's retention of a day kept
// meanwhile. They hold the tenant's move and the mark until the publisher
// has recorded them; then the mark catches up with now.
func TestOutcomesOwedSinceAnOutageAreReadBack(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	if _, err := s.AdvanceOutcomeMark(ctx); err != nil {
		t.Fatal(err)
	}
	rowless, rowed := endedReview(t, ctx, s, "1", false), endedReview(t, ctx, s, "2", true)
	passTime(t, ctx, s, 25*time.Hour)
	p, err := s.Purge(ctx, store.Retention{Outbox: 24 * time.Hour, Data: 30 * 24 * time.Hour, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM outbox WHERE stream = 'OUTCOME'`); p.Outbox != 2 || n != 1 {
		t.Fatalf("purge removed %d rows and left %d OUTCOME rows; want the 2 WORK rows gone and the owed OUTCOME row kept", p.Outbox, n)
	}

	want := []string{rowless.ID, rowed.ID}
	slices.Sort(want)
	if got := readBack(t, ctx, s); !slices.Equal(got, want) {
		t.Fatalf("read back %v after 25 hours, want %v", got, want)
	}
	if u, err := s.TenantUnsettled(ctx, "acme"); err != nil || u.Unpublished != 2 {
		t.Fatalf("unsettled %+v (%v), want the 2 outcomes without a publication", u, err)
	}
	if _, err := s.AdvanceOutcomeMark(ctx); err != nil {
		t.Fatal(err)
	}
	if age := markAge(t, ctx, s); age < 25*time.Hour {
		t.Fatalf("the mark moved to %s ago past outcomes announced 25h ago and still owed", age)
	}

	for _, w := range []*store.Work{rowless, rowed} {
		if err := s.SkipPublication(ctx, w.ID, "none", "acme", outcome.Expired, "nowhere to publish"); err != nil {
			t.Fatal(err)
		}
	}
	if got := readBack(t, ctx, s); len(got) != 0 {
		t.Fatalf("read back %v once recorded, want none", got)
	}
	if u, err := s.TenantUnsettled(ctx, "acme"); err != nil || u.Unpublished != 0 {
		t.Fatalf("unsettled %+v (%v), want no outcome without a publication", u, err)
	}
	if _, err := s.AdvanceOutcomeMark(ctx); err != nil {
		t.Fatal(err)
	}
	if age := markAge(t, ctx, s); age > time.Minute {
		t.Fatalf("the mark stayed %s back with nothing owed, want it at now", age)
	}
}

// An outcome whose publication exists is not read back, however old, and
// does not hold the mark: neither a commit's nor one with an OUTCOME row,
// nor an OUTCOME row of an outcome its work has since left.
func TestOutcomeWithPublicationIsNotReadBack(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	if _, err := s.AdvanceOutcomeMark(ctx); err != nil {
		t.Fatal(err)
	}
	rowless, rowed := endedReview(t, ctx, s, "3", false), endedReview(t, ctx, s, "4", true)
	if err := s.RecordDryPublication(ctx, rowless.ID, "acme", outcome.Expired, json.RawMessage(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.SkipPublication(ctx, rowed.ID, "none", "acme", outcome.Expired, "nowhere to publish"); err != nil {
		t.Fatal(err)
	}
	// The work the row announced was run again and is queued.
	left := endedReview(t, ctx, s, "5", true)
	if _, err := store.Pool(s).Exec(ctx, `UPDATE work SET state = 'queued' WHERE id = $1`, left.ID); err != nil {
		t.Fatal(err)
	}
	passTime(t, ctx, s, 25*time.Hour)

	if got := readBack(t, ctx, s); len(got) != 0 {
		t.Fatalf("read back %v, want none: each has its publication or is no longer its work's outcome", got)
	}
	if u, err := s.TenantUnsettled(ctx, "acme"); err != nil || u.Unpublished != 0 {
		t.Fatalf("unsettled %+v (%v), want no outcome without a publication", u, err)
	}
	if _, err := s.AdvanceOutcomeMark(ctx); err != nil {
		t.Fatal(err)
	}
	if age := markAge(t, ctx, s); age > time.Minute {
		t.Fatalf("the mark stayed %s back with nothing owed, want it at now", age)
	}
}

// A result the broker lost a day ago is read back while its work still
// runs under the attempt's lease: no age bounds what the work has in hand.
func TestUncommittedResultsHaveNoHorizon(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	w := insert(t, ctx, s, newWork("acme", "octo/repo#21", "r1"))
	attempt, token := newUUID(), newUUID()
	claim(t, ctx, s, w.ID, attempt, token, time.Minute)
	payload := []byte(`{"attemptId":"` + attempt + `"}`)
	if _, err := s.RecordAttempt(ctx, store.AttemptRecord{AttemptID: attempt, WorkID: w.ID, LeaseToken: token,
		Outcome: "ok", Raw: []byte(`{"answer":1}`), Change: store.Handoff, HandoffTTL: time.Hour,
		Outbox: []store.OutboxMsg{{Stream: event.KindResult, Subject: "assay.us.result.acme", MsgID: attempt, Payload: payload}}}); err != nil {
		t.Fatal(err)
	}
	passTime(t, ctx, s, 25*time.Hour)
	got, err := s.UncommittedResults(ctx, event.KindResult, time.Second, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || string(got[0]) != string(payload) {
		t.Fatalf("read back %q, want the result published 25 hours ago", got)
	}
}
