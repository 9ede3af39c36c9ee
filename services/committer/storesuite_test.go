package committer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"assay.dev/pkg/devkit/storetest"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

// storeFacts puts into one implementation of Store what the rest of the
// cell writes before a RESULT event reaches the committer, and reads back
// what the commit path wrote that Store itself does not read.
type storeFacts interface {
	// Tenant adds a tenant.
	Tenant(id string)
	// Work stores new, queued work, as ingress does.
	Work(w store.Work)
	// Claim takes the lease of queued work, or of running work whose lease
	// ran out, for an attempt with the lease token leaseToken(attempt), as
	// the classifier does before its model call. An earlier attempt of the
	// work still without an outcome becomes lease_expired.
	Claim(work, attempt string)
	// Lapse makes the running work's lease run out.
	Lapse(work string)
	// Overdue moves the work's deadline into the past.
	Overdue(work string)
	// Answer records a claimed attempt's answer as ok and keeps the lease
	// for the committer, as the classifier does when it hands an answer
	// over; empty raw keeps no answer. The attempt must still hold its
	// work.
	Answer(attempt string, raw []byte)
	// Down makes the store stop answering; the readers below still read.
	Down()

	// Attempt is the attempt's outcome ("" while its call runs) and reason.
	Attempt(id string) (outcome, reason string)
	// Result is the work's result, if it has one.
	Result(work string) (resultFact, bool)
	// Outbox is every row of the outbox, in the order written.
	Outbox() []store.OutboxMsg
	// Announced reports whether the work's outcome is marked announced,
	// which keeps the announcer from announcing it again.
	Announced(work string) bool
}

// resultFact is a work's result.
type resultFact struct {
	Attempt  string
	Output   json.RawMessage
	Findings int
}

// attemptN is the attempt id numbered n.
func attemptN(n int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", n) }

// leaseToken is the lease token an attempt claims with.
func leaseToken(attempt string) string { return "00000000-0000-4000-9000-" + attempt[24:] }

// newWork is moderation work of the tenant, due in an hour.
func newWork(id, tenant string) store.Work {
	return store.Work{ID: id, TenantID: tenant, Region: "us", Contract: "moderation", SchemaVersion: "moderation/1",
		TaxonomyVersion: "2026-11", SourceID: "src/" + id, Revision: "r1", Lane: event.Interactive,
		Input: `{"text":"hello"}`, Digest: "sha256:00", DeadlineAt: time.Now().Add(time.Hour)}
}

// outcomeMsg is an OUTCOME event of the tenant's work, as the committer
// writes it to the outbox.
func outcomeMsg(tenant, work, state string) store.OutboxMsg {
	id := event.OutcomeMsgID(work, state)
	return store.OutboxMsg{Stream: event.KindOutcome, Subject: event.Names{Cell: "us"}.Outcome(tenant), MsgID: id,
		Payload: fmt.Appendf(nil, `{"outcomeId":%q}`, id)}
}

// TestStoreConformance holds *store.Store and memStore, on which the
// committer's decision tests run, to the one behaviour the commit path
// relies on.
func TestStoreConformance(t *testing.T) {
	t.Parallel()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		storeSuite(t, openPostgresStore)
	})
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		storeSuite(t, func(t *testing.T) (Store, storeFacts) {
			m := newMemStore(t)
			return m, m
		})
	})
}

// workView is what a case compares of a work row: its state and lease.
type workView struct{ State, Reason, LeaseToken string }

// storeSuite checks what the commit path relies on of its Store: the
// group read of work and answer, the commit fence, MarkStale and Reject.
// open makes, for each case, an empty store of the implementation under
// test and the means to put facts into it.
func storeSuite(t *testing.T, open func(t *testing.T) (Store, storeFacts)) {
	const output = `{"category":"spam","confidence":0.9,"needsHumanReview":false}`
	answers := func(t *testing.T, st Store, reqs ...store.AnswerReq) []store.Answer {
		t.Helper()
		got := st.WorkAnswerGroup(t.Context(), reqs)
		if len(got) != len(reqs) {
			t.Fatalf("%d answers for %d requests", len(got), len(reqs))
		}
		return got
	}
	// read is the work as the store holds it.
	read := func(t *testing.T, st Store, work string) *store.Work {
		t.Helper()
		got := answers(t, st, store.AnswerReq{WorkID: work, AttemptID: attemptN(999)})[0]
		if got.Err != nil {
			t.Fatalf("read %s: %v", work, got.Err)
		}
		return got.Work
	}
	view := func(t *testing.T, st Store, work string) workView {
		t.Helper()
		w := read(t, st, work)
		return workView{w.State, w.Reason, w.LeaseToken}
	}
	// req commits the attempt's answer to the work as it is now, with
	// the lease token the attempt claimed with and its OUTCOME events.
	req := func(t *testing.T, st Store, work, attempt string) store.CommitReq {
		t.Helper()
		w := read(t, st, work)
		return store.CommitReq{Work: w, AttemptID: attempt, Token: leaseToken(attempt), Output: json.RawMessage(output),
			Findings: 2, Accepted: []store.OutboxMsg{outcomeMsg(w.TenantID, w.ID, outcome.Accepted)},
			Expired: []store.OutboxMsg{outcomeMsg(w.TenantID, w.ID, outcome.Expired)}, Announce: true}
	}
	commit := func(t *testing.T, st Store, reqs ...store.CommitReq) []store.CommitVerdict {
		t.Helper()
		got := st.CommitGroup(t.Context(), reqs)
		if len(got) != len(reqs) {
			t.Fatalf("%d verdicts for %d requests", len(got), len(reqs))
		}
		return got
	}
	// given commits answers a case starts from, each of which must be
	// committed.
	given := func(t *testing.T, st Store, reqs ...store.CommitReq) {
		t.Helper()
		for i, v := range commit(t, st, reqs...) {
			if v != (store.CommitVerdict{Verdict: store.Committed}) {
				t.Fatalf("given commit %d: %+v, want committed", i, v)
			}
		}
	}
	checkWork := func(t *testing.T, st Store, work string, want workView) {
		t.Helper()
		if got := view(t, st, work); got != want {
			t.Errorf("work %s: %+v, want %+v", work, got, want)
		}
	}
	checkAttempt := func(t *testing.T, f storeFacts, attempt, wantOutcome, wantReason string) {
		t.Helper()
		if o, r := f.Attempt(attempt); o != wantOutcome || r != wantReason {
			t.Errorf("attempt %s: %q (%q), want %q (%q)", attempt[24:], o, r, wantOutcome, wantReason)
		}
	}
	// checkResult checks the work's result is the attempt's answer; ""
	// for none.
	checkResult := func(t *testing.T, f storeFacts, work, attempt string) {
		t.Helper()
		got, ok := f.Result(work)
		switch {
		case attempt == "" && ok:
			t.Errorf("work %s has the result %+v, want none", work, got)
		case attempt == "":
		case !ok:
			t.Errorf("work %s has no result, want attempt %s's", work, attempt[24:])
		case got.Attempt != attempt || got.Findings != 2 || !sameJSON(got.Output, []byte(output)):
			t.Errorf("work %s's result: %+v, want attempt %s's with 2 findings and %s", work, got, attempt[24:], output)
		}
	}
	checkOutbox := func(t *testing.T, f storeFacts, want ...store.OutboxMsg) {
		t.Helper()
		got := f.Outbox()
		if !slices.EqualFunc(got, want, func(a, b store.OutboxMsg) bool {
			return a.Stream == b.Stream && a.Subject == b.Subject && a.MsgID == b.MsgID && bytes.Equal(a.Payload, b.Payload)
		}) {
			t.Errorf("outbox %s, want %s", msgIDs(got), msgIDs(want))
		}
	}
	checkAnnounced := func(t *testing.T, f storeFacts, work string, want bool) {
		t.Helper()
		if got := f.Announced(work); got != want {
			t.Errorf("work %s announced: %v, want %v", work, got, want)
		}
	}
	// claimed stores the tenant's work and has the attempt claim it and
	// answer.
	claimed := func(f storeFacts, tenant, work, attempt string) {
		f.Work(newWork(work, tenant))
		f.Claim(work, attempt)
		f.Answer(attempt, []byte(output))
	}
	accepted := func(work string) store.OutboxMsg { return outcomeMsg("acme", work, outcome.Accepted) }
	run := func(name string, f func(t *testing.T, st Store, facts storeFacts)) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			st, facts := open(t)
			f(t, st, facts)
		})
	}
	a := attemptN

	// The work is read with the attempt's answer byte for byte; the lease
	// holder's answer becomes the one result, its work accepted and its
	// outcome announced with the accepted event; a second commit of the
	// same attempt changes nothing. A lease whose time ran out still holds
	// while no other attempt has claimed the work.
	run("CommitsForTheLeaseHolder", func(t *testing.T, st Store, f storeFacts) {
		f.Tenant("acme")
		w1 := newWork("w1", "acme")
		f.Work(w1)
		f.Claim("w1", a(1))
		raw := []byte("{\"category\":\"spam\",\"note\":\"\xff\xfe not text\"}")
		f.Answer(a(1), raw)
		got := answers(t, st, store.AnswerReq{WorkID: "w1", AttemptID: a(1)})[0]
		if got.Err != nil || !bytes.Equal(got.Answer, raw) {
			t.Fatalf("answer %q (%v), want %q", got.Answer, got.Err, raw)
		}
		r := got.Work
		if r.ID != w1.ID || r.TenantID != w1.TenantID || r.Region != w1.Region || r.Contract != w1.Contract ||
			r.SchemaVersion != w1.SchemaVersion || r.TaxonomyVersion != w1.TaxonomyVersion || r.Lane != w1.Lane ||
			r.Input != w1.Input || r.Digest != w1.Digest || r.ShadowOf != "" ||
			(workView{r.State, r.Reason, r.LeaseToken}) != (workView{outcome.Running, "", leaseToken(a(1))}) {
			t.Errorf("work read %+v, want %+v running under attempt 1's lease", r, w1)
		}
		first := req(t, st, "w1", a(1))
		for i, want := range []store.Verdict{store.Committed, store.Lost} {
			if v := commit(t, st, first); v[0] != (store.CommitVerdict{Verdict: want}) {
				t.Errorf("commit %d: %+v, want verdict %d", i+1, v[0], want)
			}
			checkWork(t, st, "w1", workView{outcome.Accepted, "", ""})
			checkAttempt(t, f, a(1), outcome.AttemptOK, "")
			checkResult(t, f, "w1", a(1))
			checkOutbox(t, f, accepted("w1"))
			checkAnnounced(t, f, "w1", true)
		}

		claimed(f, "acme", "w2", a(2))
		f.Lapse("w2")
		if v := commit(t, st, req(t, st, "w2", a(2))); v[0] != (store.CommitVerdict{Verdict: store.Committed}) {
			t.Errorf("commit under a lease run out, not claimed again: %+v, want committed", v[0])
		}
		checkResult(t, f, "w2", a(2))
	})

	// An answer from a lease that is no longer the work's is lost: the
	// attempt is recorded stale_lease, and the work, its holder and the
	// outbox are left as they were.
	run("MarksALostLeaseStale", func(t *testing.T, st Store, f storeFacts) {
		f.Tenant("acme")
		claimed(f, "acme", "w1", a(1))
		f.Lapse("w1")
		f.Claim("w1", a(2))
		if v := commit(t, st, req(t, st, "w1", a(1))); v[0] != (store.CommitVerdict{Verdict: store.Lost}) {
			t.Fatalf("commit of the lost lease: %+v, want lost", v[0])
		}
		checkWork(t, st, "w1", workView{outcome.Running, "", leaseToken(a(2))})
		checkAttempt(t, f, a(1), outcome.AttemptStaleLease, reasonLost)
		checkAttempt(t, f, a(2), "", "")
		checkResult(t, f, "w1", "")
		checkOutbox(t, f)
		checkAnnounced(t, f, "w1", false)

		f.Answer(a(2), []byte(output))
		given(t, st, req(t, st, "w1", a(2)))
		checkResult(t, f, "w1", a(2))
		checkAttempt(t, f, a(1), outcome.AttemptStaleLease, reasonLost)
	})

	// The lease holder's answer after the deadline expires the work and
	// announces it with the expired event; the attempt is stale, and stays
	// so when committed again.
	run("ExpiresWorkPastItsDeadline", func(t *testing.T, st Store, f storeFacts) {
		f.Tenant("acme")
		claimed(f, "acme", "w1", a(1))
		f.Overdue("w1")
		late := req(t, st, "w1", a(1))
		for i, want := range []store.Verdict{store.Late, store.Lost} {
			if v := commit(t, st, late); v[0] != (store.CommitVerdict{Verdict: want}) {
				t.Errorf("commit %d: %+v, want verdict %d", i+1, v[0], want)
			}
			checkWork(t, st, "w1", workView{outcome.Expired, reasonExpired, ""})
			checkAttempt(t, f, a(1), outcome.AttemptStaleLease, reasonLate)
			checkResult(t, f, "w1", "")
			checkOutbox(t, f, outcomeMsg("acme", "w1", outcome.Expired))
			checkAnnounced(t, f, "w1", true)
		}
	})

	// MarkStale records stale_lease, once, on an attempt still running,
	// answered or lapsed, keeping the reason a lapsed one has; the
	// attempt that holds the result and an unknown one are left alone.
	// The work is never touched.
	run("MarksAnAnswerStaleOnce", func(t *testing.T, st Store, f storeFacts) {
		f.Tenant("acme")
		f.Work(newWork("w1", "acme"))
		f.Claim("w1", a(1)) // lapses without an answer
		f.Lapse("w1")
		f.Claim("w1", a(2))
		f.Answer(a(2), []byte(output))
		f.Lapse("w1")
		f.Claim("w1", a(3))
		f.Answer(a(3), []byte(output))
		given(t, st, req(t, st, "w1", a(3)))
		f.Work(newWork("w2", "acme"))
		f.Claim("w2", a(4)) // running
		checkAttempt(t, f, a(1), outcome.AttemptLeaseExpired, reasonLapsed)
		for pass, want := range []map[string]bool{
			{a(1): true, a(2): true, a(3): false, a(4): true, a(99): false},
			{a(1): false, a(2): false, a(3): false, a(4): false, a(99): false},
		} {
			for _, id := range []string{a(1), a(2), a(3), a(4), a(99)} {
				if marked, err := st.MarkStale(t.Context(), id); err != nil || marked != want[id] {
					t.Errorf("pass %d, attempt %s: marked %v (%v), want %v", pass+1, id[24:], marked, err, want[id])
				}
			}
			checkAttempt(t, f, a(1), outcome.AttemptStaleLease, reasonLapsed)
			checkAttempt(t, f, a(2), outcome.AttemptStaleLease, reasonLost)
			checkAttempt(t, f, a(3), outcome.AttemptOK, "")
			checkAttempt(t, f, a(4), outcome.AttemptStaleLease, reasonLost)
		}
		checkWork(t, st, "w1", workView{outcome.Accepted, "", ""})
		checkWork(t, st, "w2", workView{outcome.Running, "", leaseToken(a(4))})
		checkResult(t, f, "w1", a(3))
		checkOutbox(t, f, accepted("w1"))
	})

	// The lease holder's rejection ends the work schema_rejected with the
	// reason as text, records the attempt invalid_output, and writes what
	// announce made for schema_rejected; again, it is lost and changes
	// nothing. A lost lease's rejection marks the attempt stale; a failed
	// announcement leaves everything as it was.
	run("RejectsForTheLeaseHolder", func(t *testing.T, st Store, f storeFacts) {
		f.Tenant("acme")
		for i, w := range []string{"w1", "w2", "w3", "w4"} {
			claimed(f, "acme", w, a(i+1))
		}
		f.Lapse("w2")
		f.Claim("w2", a(5))
		var asked []string
		announce := func(w *store.Work, state string) ([]store.OutboxMsg, error) {
			asked = append(asked, w.ID+" "+state)
			return []store.OutboxMsg{outcomeMsg(w.TenantID, w.ID, state)}, nil
		}
		reason := "gate: schema.violation: \xff and \x00"
		reject := func(work, attempt string, announce store.Announce) (bool, error) {
			t.Helper()
			return st.Reject(t.Context(), read(t, st, work), attempt, leaseToken(attempt), reason, announce)
		}
		rejected := outcomeMsg("acme", "w1", outcome.SchemaRejected)

		for i, want := range []bool{true, false} {
			if ok, err := reject("w1", a(1), announce); err != nil || ok != want {
				t.Errorf("rejection %d: %v (%v), want %v", i+1, ok, err, want)
			}
			checkWork(t, st, "w1", workView{outcome.SchemaRejected, store.Text(reason), ""})
			checkAttempt(t, f, a(1), outcome.AttemptInvalidOutput, store.Text(reason))
			checkOutbox(t, f, rejected)
			checkAnnounced(t, f, "w1", true)
			if !slices.Equal(asked, []string{"w1 schema_rejected"}) {
				t.Errorf("announcements asked for %q, want w1's schema_rejected", asked)
			}
		}
		if marked, err := st.MarkStale(t.Context(), a(1)); err != nil || marked {
			t.Errorf("the rejected attempt marked stale: %v (%v), want left alone", marked, err)
		}

		if ok, err := reject("w2", a(2), announce); err != nil || ok {
			t.Errorf("rejection of a lost lease: %v (%v), want lost", ok, err)
		}
		checkWork(t, st, "w2", workView{outcome.Running, "", leaseToken(a(5))})
		checkAttempt(t, f, a(2), outcome.AttemptStaleLease, reasonLost)

		if ok, err := reject("w3", a(3), nil); err != nil || !ok {
			t.Errorf("rejection with nothing to announce: %v (%v), want rejected", ok, err)
		}
		checkWork(t, st, "w3", workView{outcome.SchemaRejected, store.Text(reason), ""})
		checkAnnounced(t, f, "w3", false)

		boom := errors.New("no announcement")
		failing := func(*store.Work, string) ([]store.OutboxMsg, error) { return nil, boom }
		if ok, err := reject("w4", a(4), failing); !errors.Is(err, boom) || ok {
			t.Errorf("rejection whose announcement failed: %v (%v), want its error", ok, err)
		}
		checkWork(t, st, "w4", workView{outcome.Running, "", leaseToken(a(4))})
		checkAttempt(t, f, a(4), outcome.AttemptOK, "")
		checkAnnounced(t, f, "w4", false)
		checkOutbox(t, f, rejected)
		if len(asked) != 1 {
			t.Errorf("announcements asked for %q, want w1's alone", asked)
		}
	})

	// In one group each row is decided as it would be alone: the lease
	// holder's answer commits, a lost lease's is stale, an answer already
	// committed changes nothing and a late one expires its work; a group
	// holding one answer twice commits it once and the rest all the same.
	// A group read answers each work with its own attempt's answer, not
	// found, or no answer.
	run("DecidesEachRowOfAGroupAlone", func(t *testing.T, st Store, f storeFacts) {
		f.Tenant("acme")
		claimed(f, "acme", "w1", a(1))
		claimed(f, "acme", "w2", a(2))
		f.Lapse("w2")
		f.Claim("w2", a(3))
		claimed(f, "acme", "w3", a(4))
		given(t, st, req(t, st, "w3", a(4)))
		claimed(f, "acme", "w4", a(5))
		f.Overdue("w4")

		got := commit(t, st, req(t, st, "w1", a(1)), req(t, st, "w2", a(2)), req(t, st, "w3", a(4)), req(t, st, "w4", a(5)))
		want := []store.CommitVerdict{{Verdict: store.Committed}, {Verdict: store.Lost}, {Verdict: store.Lost}, {Verdict: store.Late}}
		if !slices.Equal(got, want) {
			t.Errorf("group: %+v, want %+v", got, want)
		}
		checkWork(t, st, "w1", workView{outcome.Accepted, "", ""})
		checkWork(t, st, "w2", workView{outcome.Running, "", leaseToken(a(3))})
		checkWork(t, st, "w3", workView{outcome.Accepted, "", ""})
		checkWork(t, st, "w4", workView{outcome.Expired, reasonExpired, ""})
		checkAttempt(t, f, a(1), outcome.AttemptOK, "")
		checkAttempt(t, f, a(2), outcome.AttemptStaleLease, reasonLost)
		checkAttempt(t, f, a(3), "", "")
		checkAttempt(t, f, a(4), outcome.AttemptOK, "")
		checkAttempt(t, f, a(5), outcome.AttemptStaleLease, reasonLate)
		checkResult(t, f, "w1", a(1))
		checkResult(t, f, "w2", "")
		checkResult(t, f, "w3", a(4))
		checkResult(t, f, "w4", "")
		checkOutbox(t, f, accepted("w3"), accepted("w1"), outcomeMsg("acme", "w4", outcome.Expired))

		claimed(f, "acme", "w5", a(6))
		claimed(f, "acme", "w6", a(7))
		twin := req(t, st, "w5", a(6))
		got = commit(t, st, twin, twin, req(t, st, "w6", a(7)))
		want = []store.CommitVerdict{{Verdict: store.Committed}, {Verdict: store.Lost}, {Verdict: store.Committed}}
		if !slices.Equal(got, want) {
			t.Errorf("group with one answer twice: %+v, want %+v", got, want)
		}
		checkAttempt(t, f, a(6), outcome.AttemptOK, "")
		checkResult(t, f, "w5", a(6))
		checkResult(t, f, "w6", a(7))
		checkOutbox(t, f, accepted("w3"), accepted("w1"), outcomeMsg("acme", "w4", outcome.Expired), accepted("w5"), accepted("w6"))

		answered := answers(t, st, store.AnswerReq{WorkID: "w1", AttemptID: a(1)}, store.AnswerReq{WorkID: "w_elsewhere", AttemptID: a(8)},
			store.AnswerReq{WorkID: "w2", AttemptID: a(7)}, store.AnswerReq{WorkID: "w2", AttemptID: a(3)})
		for i, c := range []struct {
			work   string // "" for not found
			answer []byte
		}{{"w1", []byte(output)}, {"", nil}, {"w2", nil}, {"w2", nil}} {
			g := answered[i]
			switch {
			case c.work == "" && (!errors.Is(g.Err, store.ErrNotFound) || g.Work != nil):
				t.Errorf("read %d: %+v, want not found", i, g)
			case c.work != "" && (g.Err != nil || g.Work == nil || g.Work.ID != c.work || !bytes.Equal(g.Answer, c.answer) ||
				(g.Answer == nil) != (c.answer == nil)):
				t.Errorf("read %d: %+v, want work %s with the answer %q", i, g, c.work, c.answer)
			}
		}
	})

	// A store that does not answer fails every call of the commit path
	// with an error that is neither not found nor a refusal for good, so
	// the committer retries.
	run("FailsWhileDown", func(t *testing.T, st Store, f storeFacts) {
		f.Tenant("acme")
		claimed(f, "acme", "w1", a(1))
		r := req(t, st, "w1", a(1))
		f.Down()
		ctx := t.Context()
		for i, g := range answers(t, st, store.AnswerReq{WorkID: "w1", AttemptID: a(1)}, store.AnswerReq{WorkID: "w2", AttemptID: a(2)}) {
			if g.Err == nil || errors.Is(g.Err, store.ErrNotFound) || store.Permanent(g.Err) {
				t.Errorf("read %d: %v, want an error worth retrying", i, g.Err)
			}
		}
		if v := commit(t, st, r); v[0].Err == nil || store.Permanent(v[0].Err) {
			t.Errorf("commit: %+v, want an error worth retrying", v[0])
		}
		if _, err := st.MarkStale(ctx, a(1)); err == nil {
			t.Error("mark stale answered")
		}
		if _, err := st.Reject(ctx, r.Work, a(1), leaseToken(a(1)), "gate: x", nil); err == nil {
			t.Error("reject answered")
		}
		checkAttempt(t, f, a(1), outcome.AttemptOK, "")
		checkResult(t, f, "w1", "")
		checkOutbox(t, f)
	})
}

// sameJSON reports whether a and b are the same JSON document.
func sameJSON(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

// msgIDs names outbox rows by stream and message id.
func msgIDs(msgs []store.OutboxMsg) []string {
	out := []string{}
	for _, m := range msgs {
		out = append(out, m.Stream+" "+m.MsgID)
	}
	return out
}

// pgFacts puts facts into the database through *store.Store, as the rest
// of the cell writes them, moves leases and deadlines with SQL, and reads
// back with SQL.
type pgFacts struct {
	t  *testing.T
	st *store.Store
	db *pgxpool.Pool
}

var _ storeFacts = (*pgFacts)(nil)

// openPostgresStore is a fresh, migrated database.
func openPostgresStore(t *testing.T) (Store, storeFacts) {
	t.Helper()
	st, url := storetest.Migrated(t)
	return st, &pgFacts{t: t, st: st, db: testenv.Pool(t, url)}
}

// exec runs sql, which must change one row.
func (f *pgFacts) exec(sql string, args ...any) {
	f.t.Helper()
	tag, err := f.db.Exec(f.t.Context(), sql, args...)
	if err != nil || tag.RowsAffected() != 1 {
		f.t.Fatalf("%s: %v, %d rows", sql, err, tag.RowsAffected())
	}
}

func (f *pgFacts) Tenant(id string) {
	f.t.Helper()
	if err := f.st.SeedTenants(f.t.Context(), []store.TenantSeed{{ID: id, HomeRegion: "us", Token: "tok-" + id}}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *pgFacts) Work(w store.Work) {
	f.t.Helper()
	if _, created, err := f.st.InsertWork(f.t.Context(), &w, func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil }); err != nil || !created {
		f.t.Fatalf("insert %s: %v %v", w.ID, created, err)
	}
}

func (f *pgFacts) Claim(work, attempt string) {
	f.t.Helper()
	if _, ok, err := f.st.Claim(f.t.Context(), work, attempt, leaseToken(attempt), time.Minute, 0); err != nil || !ok {
		f.t.Fatalf("claim %s for %s: %v %v", work, attempt, ok, err)
	}
}

func (f *pgFacts) Lapse(work string) {
	f.t.Helper()
	f.exec(`UPDATE work SET lease_expires_at = now() - interval '1 second' WHERE id = $1 AND state = 'running'`, work)
}

func (f *pgFacts) Overdue(work string) {
	f.t.Helper()
	f.exec(`UPDATE work SET deadline_at = now() - interval '1 second' WHERE id = $1`, work)
}

func (f *pgFacts) Answer(attempt string, raw []byte) {
	f.t.Helper()
	ctx := f.t.Context()
	var work string
	if err := f.db.QueryRow(ctx, `SELECT work_id FROM attempts WHERE id = $1`, attempt).Scan(&work); err != nil {
		f.t.Fatalf("attempt %s: %v", attempt, err)
	}
	if applied, err := f.st.RecordAttempt(ctx, store.AttemptRecord{AttemptID: attempt, WorkID: work, LeaseToken: leaseToken(attempt),
		Outcome: outcome.AttemptOK, Raw: raw, Change: store.Handoff, HandoffTTL: time.Minute}); err != nil || !applied {
		f.t.Fatalf("answer of %s: %v %v", attempt, applied, err)
	}
}

func (f *pgFacts) Down() { f.st.Close() }

func (f *pgFacts) Attempt(id string) (string, string) {
	f.t.Helper()
	var o, r string
	if err := f.db.QueryRow(f.t.Context(), `SELECT coalesce(outcome, ''), coalesce(reason, '') FROM attempts WHERE id = $1`,
		id).Scan(&o, &r); err != nil {
		f.t.Fatalf("attempt %s: %v", id, err)
	}
	return o, r
}

func (f *pgFacts) Result(work string) (resultFact, bool) {
	f.t.Helper()
	var r resultFact
	var output string
	err := f.db.QueryRow(f.t.Context(), `SELECT attempt_id::text, output::text, findings FROM results WHERE work_id = $1`,
		work).Scan(&r.Attempt, &output, &r.Findings)
	if errors.Is(err, pgx.ErrNoRows) {
		return resultFact{}, false
	}
	if err != nil {
		f.t.Fatalf("result of %s: %v", work, err)
	}
	r.Output = json.RawMessage(output)
	return r, true
}

func (f *pgFacts) Outbox() []store.OutboxMsg {
	f.t.Helper()
	rows, err := f.db.Query(f.t.Context(), `SELECT stream, subject, msg_id, payload FROM outbox ORDER BY id`)
	if err != nil {
		f.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.OutboxMsg, error) {
		var m store.OutboxMsg
		err := r.Scan(&m.Stream, &m.Subject, &m.MsgID, &m.Payload)
		return m, err
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return out
}

func (f *pgFacts) Announced(work string) bool {
	f.t.Helper()
	var announced bool
	if err := f.db.QueryRow(f.t.Context(), `SELECT outcome_announced_at IS NOT NULL FROM work WHERE id = $1`, work).Scan(&announced); err != nil {
		f.t.Fatalf("work %s: %v", work, err)
	}
	return announced
}
