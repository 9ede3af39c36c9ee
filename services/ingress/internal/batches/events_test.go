package batches

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"assay.dev/pkg/api"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

// fact names what one event tells, so two deliveries can be compared.
func fact(ev sseEvent) string {
	switch d := ev.Data.(type) {
	case api.WorkEvent:
		return fmt.Sprintf("%s/%d/%s", ev.Name, d.Attempt, d.Outcome)
	case api.BatchEvent:
		return ev.Name + "/" + d.ItemID
	}
	return ev.Name
}

func facts(evs []sseEvent) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = fact(ev)
	}
	return out
}

// The rows of one work item as a live subscriber sees them change, out of
// order included: attempt 1's worker reports after attempt 2 began, the
// work ends, is run again and ends again, and enters the review queue.
func workSnapshots() []workHistory {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	fin := func(s int) *time.Time { x := at(s); return &x }
	w := func(state string, updated int) *store.Work {
		return &store.Work{ID: "w_1", State: state, CreatedAt: t0, UpdatedAt: at(updated)}
	}
	a1 := store.Attempt{ID: "a1", Number: 1, Outcome: "running", StartedAt: at(1)}
	a1done := a1
	a1done.Outcome, a1done.FinishedAt = outcome.AttemptStaleLease, fin(9)
	a2 := store.Attempt{ID: "a2", Number: 2, Outcome: "running", StartedAt: at(5)}
	a2done := a2
	a2done.Outcome, a2done.FinishedAt = outcome.AttemptInvalidOutput, fin(6)
	a3 := store.Attempt{ID: "a3", Number: 3, Outcome: "running", StartedAt: at(20)}
	a3done := a3
	a3done.Outcome, a3done.FinishedAt = outcome.AttemptInvalidOutput, fin(21)
	review := &store.Review{ID: 7, Reason: store.ReviewSchemaRejected, State: store.ReviewOpen, CreatedAt: at(21)}
	resolved := *review
	resolved.State, resolved.Verdict, resolved.ResolvedBy, resolved.ResolvedAt = store.ReviewResolved, "dismissed", "ana", at(30)
	return []workHistory{
		{Work: w(outcome.Queued, 0)},
		{Work: w(outcome.Running, 1), Attempts: []store.Attempt{a1}},
		{Work: w(outcome.Running, 5), Attempts: []store.Attempt{a1, a2}},
		{Work: w(outcome.SchemaRejected, 6), Attempts: []store.Attempt{a1, a2done}},
		{Work: w(outcome.SchemaRejected, 6), Attempts: []store.Attempt{a1done, a2done}},
		{Work: w(outcome.Queued, 15), Attempts: []store.Attempt{a1done, a2done}},
		{Work: w(outcome.SchemaRejected, 21), Attempts: []store.Attempt{a1done, a2done, a3done}, Review: review},
		{Work: w(outcome.SchemaRejected, 21), Attempts: []store.Attempt{a1done, a2done, a3done}, Review: &resolved},
	}
}

// A subscriber that resumes from any event it had gets every fact it had
// not, once, whatever the rows did meanwhile; a live one never gets a fact
// twice.
func TestWorkEventsResumeWithoutGapOrDuplicate(t *testing.T) {
	t.Parallel()
	snaps := workSnapshots()
	var live []sseEvent
	var mark *workMark
	for _, h := range snaps {
		var evs []sseEvent
		evs, mark = workEvents(mark, h)
		live = append(live, evs...)
	}
	want := []string{"queued/0/", "running/1/", "running/2/", "attempt/2/invalid_output", "schema_rejected/0/schema_rejected",
		"attempt/1/stale_lease", "queued/0/", "running/3/", "attempt/3/invalid_output", "schema_rejected/0/schema_rejected",
		"review/0/", "resolved/0/"}
	if got := facts(live); !slices.Equal(got, want) {
		t.Fatalf("live events\n %v\nwant\n %v", got, want)
	}
	seen := map[string]bool{}
	for _, ev := range live {
		if seen[ev.ID] {
			t.Fatalf("id %s twice", ev.ID)
		}
		seen[ev.ID] = true
	}
	final := snaps[len(snaps)-1]
	for k, ev := range live {
		m, err := parseWorkMark(ev.ID)
		if err != nil {
			t.Fatalf("parse %s: %v", ev.ID, err)
		}
		if m.String() != ev.ID {
			t.Fatalf("id %s reads back as %s", ev.ID, m.String())
		}
		rest, _ := workEvents(m, final)
		// The facts after k that the final rows still hold: a re-run
		// replaces an ending the resumed subscriber never saw.
		var wantRest []string
		for _, later := range live[k+1:] {
			wantRest = append(wantRest, fact(later))
		}
		got := facts(rest)
		for _, f := range got {
			if !slices.Contains(wantRest, f) {
				t.Errorf("resumed at %d (%s): got %s, which it had", k, ev.ID, f)
			}
		}
		// Every attempt fact and the last ending, review and resolution
		// after k come again.
		for _, f := range wantRest {
			if f == "queued/0/" || (f == "schema_rejected/0/schema_rejected" && !slices.Contains(got, f)) {
				continue
			}
			if !slices.Contains(got, f) {
				t.Errorf("resumed at %d (%s): %s missing; got %v", k, ev.ID, f, got)
			}
		}
		if len(rest) > 0 && rest[len(rest)-1].ID != live[len(live)-1].ID {
			t.Errorf("resumed at %d: ends at %s, the live stream at %s", k, rest[len(rest)-1].ID, live[len(live)-1].ID)
		}
	}
	// Nothing is sent again to a subscriber that had everything.
	if again, _ := workEvents(mark, final); len(again) != 0 {
		t.Fatalf("caught-up subscriber gets %v", facts(again))
	}
}

func TestParseWorkMarkRefusesWhatItDidNotMake(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"x", "w1", "w1.1.1.-", "w2.0.0.-.0", "w1.-1.0.-.0", "w1.01.0.-.0", "w1.1.1+1.-.0",
		"w1.1.1+2.-.0", "w1.1.0.zz.0", "w1.1.0.0123456.0", "w1.1.0.-.3", "w1.99999.0.-.0", "w1.1.0.-.0.1"} {
		if _, err := parseWorkMark(id); err == nil {
			t.Errorf("%q parsed", id)
		}
	}
	for _, id := range []string{"w1.0.0.-.0", "w1.3.1+3.0a1b2c3dq.1", "w1.2.2.0a1b2c3d.2"} {
		m, err := parseWorkMark(id)
		if err != nil || m.String() != id {
			t.Errorf("%q: %v, %v", id, m, err)
		}
	}
}

func TestBatchEventsResume(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := &store.Batch{ID: "b_1", ItemCount: 10, CreatedAt: t0}
	items := make([]store.BatchItem, 10)
	for i := range items {
		items[i] = store.BatchItem{ItemID: fmt.Sprintf("i%02d", i), WorkID: fmt.Sprintf("w%d", i), State: outcome.Queued}
	}
	var live []sseEvent
	var mark *batchMark
	var marks []*batchMark
	// Items end out of item order.
	for _, i := range []int{7, 0, 9, 3, 1, 2, 4, 5, 6, 8} {
		items[i].State = outcome.Accepted
		if i == 4 {
			items[i].State = outcome.SchemaRejected
		}
		var evs []sseEvent
		evs, mark = batchEvents(mark, b, items)
		live = append(live, evs...)
		marks = append(marks, mark)
	}
	if len(live) != 12 || live[0].Name != outcome.Queued || live[11].Name != "complete" {
		t.Fatalf("live %v", facts(live))
	}
	for k, ev := range live {
		m, err := parseBatchMark(ev.ID, b.ItemCount)
		if err != nil || m.String() != ev.ID {
			t.Fatalf("id %s: %v", ev.ID, err)
		}
		rest, _ := batchEvents(m, b, items)
		var want []string
		for _, later := range live[k+1:] {
			want = append(want, fact(later))
		}
		slices.Sort(want)
		got := facts(rest)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("resumed at %d: %v, want %v", k, got, want)
		}
		if d := ev.Data.(api.BatchEvent); k > 0 && d.Ended != m.count() {
			t.Errorf("event %d says %d ended, its id %d", k, d.Ended, m.count())
		}
	}
	for _, id := range []string{"b1", "b1.AAAA.", "b1.AAA.x", "b2.AAA.", "b1.!!.c"} {
		if _, err := parseBatchMark(id, b.ItemCount); err == nil {
			t.Errorf("%q parsed", id)
		}
	}
}
