package committer

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"assay.dev/pkg/consumer"
	"assay.dev/pkg/contract"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry/telemetrytest"
)

// newMemCommitter is a committer of region us on a memStore, whose
// decisions the returned log holds. It is not started and has no
// JetStream: the commit path publishes nothing itself, it hands the
// events it wrote to the outbox relay, which is not running.
func newMemCommitter(t *testing.T) (*Service, *memStore, *testenv.DecisionLog) {
	t.Helper()
	reg, err := contract.Load()
	if err != nil {
		t.Fatal(err)
	}
	tel := telemetrytest.Provider(t, "committer", "us")
	m, log := newMemStore(t), &testenv.DecisionLog{}
	s, err := New(Config{Region: "us"}, Deps{Store: m, Contracts: reg, Log: slog.New(slog.NewJSONHandler(log, nil)), Tel: tel})
	if err != nil {
		t.Fatal(err)
	}
	return s, m, log
}

// resultOf is the RESULT event the attempt's answer to the work travels
// in, as the classifier writes it.
func resultOf(w store.Work, attempt string) event.Result {
	return event.Result{AttemptID: attempt, WorkID: w.ID, TenantID: w.TenantID, Region: "us", Number: 1,
		LeaseToken: leaseToken(attempt), Contract: w.Contract, SchemaVersion: w.SchemaVersion,
		TaxonomyVersion: w.TaxonomyVersion, Digest: w.Digest, Outcome: outcome.AttemptOK, Final: true}
}

const (
	validAnswer   = `{"category":"spam","confidence":0.9,"needsHumanReview":false}`
	invalidAnswer = `{"category":"ads","confidence":0.9,"needsHumanReview":false}`
)

// Each RESULT delivery is settled by what the answer is and what the store
// answered: a final answer of work this cell holds for the tenant is
// gated, then committed under the lease it was made under (accepted, or
// expired past the deadline) or rejected, with the outcome's event
// written; one whose lease or work is gone is recorded stale, a
// redelivered verdict a duplicate; what is not a final answer is
// recorded only, another cell's or tenant's refused; when the store does
// not answer it is asked for again in a second.
func TestHandleDecidesEachResult(t *testing.T) {
	t.Parallel()
	a1, a2 := attemptN(1), attemptN(2)
	// reclaimed is attempt 1's lease run out and attempt 2's claim.
	reclaimed := func(m *memStore) { m.Lapse("w1"); m.Claim("w1", a2) }
	for _, c := range []struct {
		name string
		// work edits w1 before it is stored; answer is attempt 1's,
		// validAnswer when empty; given adds to a store in which attempt
		// 1 claimed w1 and answered.
		work       func(w *store.Work)
		answer     string
		given      func(m *memStore)
		edit       func(ev *event.Result)
		deliveries int // 1 when not set
		want       consumer.Disposition
		decisions  []string
		// state and reason are w1's after, attempt attempt 1's outcome;
		// result names the attempt whose answer is w1's result ("" none),
		// outcomes the OUTCOME events written, by state. An empty reason
		// is not checked.
		state, reason, attempt, result string
		outcomes                       []string
	}{
		{name: "accepted",
			want: consumer.Done(), decisions: []string{outcome.Accepted},
			state: outcome.Accepted, attempt: outcome.AttemptOK, result: a1, outcomes: []string{outcome.Accepted}},
		{name: "redelivered", deliveries: 2,
			want: consumer.Done(), decisions: []string{outcome.Accepted, "duplicate"},
			state: outcome.Accepted, attempt: outcome.AttemptOK, result: a1, outcomes: []string{outcome.Accepted}},
		{name: "answer fails the gate", answer: invalidAnswer,
			want: consumer.Done(), decisions: []string{outcome.SchemaRejected},
			state: outcome.SchemaRejected, reason: "gate: schema.violation", attempt: outcome.AttemptInvalidOutput,
			outcomes: []string{outcome.SchemaRejected}},
		{name: "answer to another input", edit: func(ev *event.Result) { ev.Digest = "sha256:ff" },
			want: consumer.Done(), decisions: []string{outcome.SchemaRejected},
			state: outcome.SchemaRejected, reason: "gate: correlation.digest", attempt: outcome.AttemptInvalidOutput,
			outcomes: []string{outcome.SchemaRejected}},
		{name: "final invalid answer", answer: invalidAnswer,
			edit: func(ev *event.Result) {
				ev.Outcome, ev.Reason = outcome.AttemptInvalidOutput, "the classifier's reason"
			},
			want: consumer.Done(), decisions: []string{outcome.SchemaRejected},
			state: outcome.SchemaRejected, reason: "the classifier's reason", attempt: outcome.AttemptInvalidOutput,
			outcomes: []string{outcome.SchemaRejected}},
		{name: "contract not known here", work: func(w *store.Work) { w.SchemaVersion = "moderation/0" },
			want: consumer.Done(), decisions: []string{outcome.SchemaRejected},
			state: outcome.SchemaRejected, reason: `contract "moderation" is not known to this committer`,
			attempt: outcome.AttemptInvalidOutput, outcomes: []string{outcome.SchemaRejected}},
		{name: "a repair follows", answer: invalidAnswer,
			edit: func(ev *event.Result) { ev.Outcome, ev.Final = outcome.AttemptInvalidOutput, false },
			want: consumer.Done(), decisions: []string{outcome.AttemptInvalidOutput},
			state: outcome.Running, attempt: outcome.AttemptOK},
		{name: "another region's", edit: func(ev *event.Result) { ev.Region = "eu" },
			want: consumer.Done(), decisions: []string{"refused"},
			state: outcome.Running, attempt: outcome.AttemptOK},
		{name: "work not in this cell", edit: func(ev *event.Result) { ev.WorkID = "w_elsewhere" },
			want: consumer.Done(), decisions: []string{"refused"},
			state: outcome.Running, attempt: outcome.AttemptOK},
		{name: "another tenant's work", edit: func(ev *event.Result) { ev.TenantID = "globex" },
			want: consumer.Done(), decisions: []string{"refused"},
			state: outcome.Running, attempt: outcome.AttemptOK},
		{name: "lease lost before the commit", given: reclaimed,
			want: consumer.Done(), decisions: []string{outcome.AttemptStaleLease},
			state: outcome.Running, attempt: outcome.AttemptStaleLease},
		{name: "lease lost before the rejection", answer: invalidAnswer, given: reclaimed,
			want: consumer.Done(), decisions: []string{outcome.AttemptStaleLease},
			state: outcome.Running, attempt: outcome.AttemptStaleLease},
		{name: "deadline passed", given: func(m *memStore) { m.Overdue("w1") },
			want: consumer.Done(), decisions: []string{outcome.Expired},
			state: outcome.Expired, attempt: outcome.AttemptStaleLease, outcomes: []string{outcome.Expired}},
		{name: "another attempt accepted first",
			given: func(m *memStore) {
				reclaimed(m)
				m.Answer(a2, []byte(validAnswer))
				w := m.work("w1")
				m.CommitGroup(context.Background(), []store.CommitReq{{Work: &w, AttemptID: a2, Token: leaseToken(a2),
					Output: json.RawMessage(validAnswer)}})
			},
			want: consumer.Done(), decisions: []string{outcome.AttemptStaleLease},
			state: outcome.Accepted, attempt: outcome.AttemptStaleLease, result: a2},
		{name: "shadow work", work: func(w *store.Work) { w.ShadowOf = "w0" },
			want: consumer.Done(), decisions: []string{outcome.Accepted},
			state: outcome.Accepted, attempt: outcome.AttemptOK, result: a1},
		{name: "store down", given: func(m *memStore) { m.Down() },
			want:  consumer.Retry(time.Second),
			state: outcome.Running, attempt: outcome.AttemptOK},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s, m, log := newMemCommitter(t)
			m.Tenant("acme")
			w := newWork("w1", "acme")
			if c.work != nil {
				c.work(&w)
			}
			m.Work(w)
			m.Claim("w1", a1)
			answer := c.answer
			if answer == "" {
				answer = validAnswer
			}
			m.Answer(a1, []byte(answer))
			if c.given != nil {
				c.given(m)
			}
			ev := resultOf(w, a1)
			if c.edit != nil {
				c.edit(&ev)
			}
			for i := range max(c.deliveries, 1) {
				if got := s.handle(t.Context(), ev, nil); got != c.want {
					t.Errorf("delivery %d: %+v, want %+v", i, got, c.want)
				}
			}
			if got := log.OutcomesOf(t, a1); !slices.Equal(got, c.decisions) {
				t.Errorf("decisions %q, want %q", got, c.decisions)
			}
			got := m.work("w1")
			if got.State != c.state || !strings.Contains(got.Reason, c.reason) {
				t.Errorf("work %s (%q), want %s with a reason naming %q", got.State, got.Reason, c.state, c.reason)
			}
			if o, _ := m.Attempt(a1); o != c.attempt {
				t.Errorf("attempt %q, want %q", o, c.attempt)
			}
			r, ok := m.Result("w1")
			switch {
			case c.result == "" && ok:
				t.Errorf("result %+v, want none", r)
			case c.result != "" && (!ok || r.Attempt != c.result || !sameJSON(r.Output, []byte(validAnswer))):
				t.Errorf("result %+v (%v), want attempt %s's answer", r, ok, c.result[24:])
			}
			var want []string
			for _, state := range c.outcomes {
				want = append(want, event.KindOutcome+" "+event.OutcomeMsgID("w1", state))
			}
			if got := msgIDs(m.Outbox()); !slices.Equal(got, want) {
				t.Errorf("outbox %q, want %q", got, want)
			}
		})
	}
}

// Results in hand at once are read and committed in groups, and each is
// decided on its own: an answer whose lease was lost is stale beside
// answers that commit.
func TestConcurrentResultsAreDecidedAlone(t *testing.T) {
	t.Parallel()
	s, m, log := newMemCommitter(t)
	m.Tenant("acme")
	const n = 24
	events := make([]event.Result, n)
	for i := range n {
		w := newWork(fmt.Sprintf("w%d", i), "acme")
		m.Work(w)
		m.Claim(w.ID, attemptN(i))
		m.Answer(attemptN(i), []byte(validAnswer))
		if i%3 == 0 {
			m.Lapse(w.ID)
			m.Claim(w.ID, attemptN(100+i))
		}
		events[i] = resultOf(w, attemptN(i))
	}
	var wg sync.WaitGroup
	for _, ev := range events {
		wg.Go(func() {
			if got := s.handle(t.Context(), ev, nil); got != consumer.Done() {
				t.Errorf("%s: %+v, want done", ev.WorkID, got)
			}
		})
	}
	wg.Wait()
	for i, ev := range events {
		want, state := outcome.Accepted, outcome.Accepted
		if i%3 == 0 {
			want, state = outcome.AttemptStaleLease, outcome.Running
		}
		if got := log.OutcomesOf(t, ev.AttemptID); !slices.Equal(got, []string{want}) {
			t.Errorf("%s: decisions %q, want %s", ev.WorkID, got, want)
		}
		if got := m.work(ev.WorkID).State; got != state {
			t.Errorf("%s: %s, want %s", ev.WorkID, got, state)
		}
	}
}
