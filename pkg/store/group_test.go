package store_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"assay.dev/pkg/store"
)

// A group of claims decides each row on its own: two requests for one
// work, one wins; work someone holds and work that does not exist are
// not claimed; the rest are, each with its attempt.
func TestClaimGroupDecidesEachRow(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	a := insert(t, ctx, s, newWork("acme", "group/a", "r1"))
	b := insert(t, ctx, s, newWork("acme", "group/b", "r1"))
	held := insert(t, ctx, s, newWork("acme", "group/held", "r1"))
	claim(t, ctx, s, held.ID, newUUID(), newUUID(), time.Minute)
	reqs := []store.ClaimReq{
		{WorkID: a.ID, AttemptID: newUUID(), Token: newUUID(), TTL: time.Minute},
		{WorkID: a.ID, AttemptID: newUUID(), Token: newUUID(), TTL: time.Minute},
		{WorkID: b.ID, AttemptID: newUUID(), Token: newUUID(), TTL: time.Minute, Estimate: 77},
		{WorkID: held.ID, AttemptID: newUUID(), Token: newUUID(), TTL: time.Minute},
		{WorkID: "w_missing", AttemptID: newUUID(), Token: newUUID(), TTL: time.Minute},
	}
	got := s.ClaimGroup(ctx, reqs)
	for i, g := range got {
		if g.Err != nil {
			t.Fatalf("request %d: %v", i, g.Err)
		}
	}
	if got[0].OK == got[1].OK {
		t.Fatalf("two claims of one work in a group: ok %v and %v, want exactly one", got[0].OK, got[1].OK)
	}
	win := 0
	if got[1].OK {
		win = 1
	}
	if w := got[win].Work; w.State != "running" || w.LeaseToken != reqs[win].Token || w.Attempts != 1 {
		t.Fatalf("the winner's work: %+v", w)
	}
	if !got[2].OK || got[2].Work.Input != b.Input || got[3].OK || got[4].OK {
		t.Fatalf("b ok %v, held ok %v, missing ok %v: want true, false, false", got[2].OK, got[3].OK, got[4].OK)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM attempts WHERE work_id = $1`, a.ID); n != 1 {
		t.Fatalf("%d attempts of the contested work, want 1", n)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM attempts WHERE id = $1 AND estimate_micros = 77`, reqs[2].AttemptID); n != 1 {
		t.Fatal("b's attempt is not recorded with its estimate")
	}
}

// A request the database refuses (an attempt id that is not a UUID,
// an expectation holding NUL) is refused alone, with the database's
// SQLSTATE, and the claim's one statement takes the others.
func TestClaimGroupRefusesARowAlone(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	a := insert(t, ctx, s, newWork("acme", "refuse/a", "r1"))
	b := insert(t, ctx, s, newWork("acme", "refuse/b", "r1"))
	c := insert(t, ctx, s, newWork("acme", "refuse/c", "r1"))
	nul := store.ExpectOf(c, false)
	nul.Model = "m\x00"
	reqs := []store.ClaimReq{
		{WorkID: a.ID, AttemptID: "not-a-uuid", Token: newUUID(), TTL: time.Minute},
		{WorkID: b.ID, AttemptID: newUUID(), Token: newUUID(), TTL: time.Minute},
		{WorkID: c.ID, AttemptID: newUUID(), Token: newUUID(), TTL: time.Minute, Expect: nul},
	}
	got := s.ClaimGroup(ctx, reqs)
	for _, i := range []int{0, 2} {
		if got[i].OK || !store.Permanent(got[i].Err) {
			t.Fatalf("request %d: ok %v, err %v; want a refusal no retry mends", i, got[i].OK, got[i].Err)
		}
	}
	if got[1].Err != nil || !got[1].OK {
		t.Fatalf("the request beside them: ok %v, err %v; want it claimed", got[1].OK, got[1].Err)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM attempts WHERE work_id IN ($1, $2)`, a.ID, c.ID); n != 0 {
		t.Fatalf("%d attempts of the refused requests' work, want 0", n)
	}
	// A group of one is the same statement: a single claim.
	if _, ok, err := s.Claim(ctx, a.ID, newUUID(), newUUID(), time.Minute, 0); err != nil || !ok {
		t.Fatalf("claim of a alone: ok %v, err %v", ok, err)
	}
}

// A group of attempt records with one stale lease, one superseded work
// and one duplicate among them records the others as RecordAttempt would
// and writes nothing at all for those three: no attempt outcome, no work
// change, no event.
func TestRecordAttemptGroupStaleSupersededDuplicate(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	ids := map[string]*store.Work{}
	for _, src := range []string{"handoff", "requeue", "finish", "stale", "superseded", "nochange"} {
		ids[src] = insert(t, ctx, s, newWork("acme", "rec/"+src, "r1"))
	}
	tokens, attempts := map[string]string{}, map[string]string{}
	for src, w := range ids {
		tokens[src], attempts[src] = newUUID(), newUUID()
		claim(t, ctx, s, w.ID, attempts[src], tokens[src], time.Minute)
	}
	// stale: its lease lapsed and another worker took it.
	if _, err := store.Pool(s).Exec(ctx, `UPDATE work SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, ids["stale"].ID); err != nil {
		t.Fatal(err)
	}
	claim(t, ctx, s, ids["stale"].ID, newUUID(), newUUID(), time.Minute)
	// superseded: a newer revision ended it while it ran.
	if _, err := store.Pool(s).Exec(ctx, `UPDATE work SET state = 'superseded', reason = 'a newer revision', lease_token = NULL,
		lease_expires_at = NULL WHERE id = $1`, ids["superseded"].ID); err != nil {
		t.Fatal(err)
	}
	ev := func(src string) []store.OutboxMsg {
		return []store.OutboxMsg{{Stream: "RESULT", Subject: "assay.us.result.acme", MsgID: attempts[src], Payload: []byte(`{}`)}}
	}
	rec := func(src string, change store.WorkChange) store.AttemptRecord {
		return store.AttemptRecord{AttemptID: attempts[src], WorkID: ids[src].ID, LeaseToken: tokens[src], Outcome: "ok",
			Raw: []byte(`{"answer":"` + src + `"}`), Change: change, HandoffTTL: time.Hour, RetryAfter: time.Minute,
			RepairNote: "fix it", WorkOutcome: "transport_rejected", WorkReason: "refused for good", Outbox: ev(src)}
	}
	recs := []store.AttemptRecord{
		rec("handoff", store.Handoff), rec("requeue", store.Requeue), rec("finish", store.Finish),
		rec("stale", store.Finish), rec("superseded", store.Handoff), rec("nochange", store.NoChange),
		rec("handoff", store.Handoff), // the same record again: a redelivery
	}
	got := s.RecordAttemptGroup(ctx, recs)
	want := []bool{true, true, true, false, false, true, true}
	for i, g := range got {
		if g.Err != nil || g.Applied != want[i] {
			t.Errorf("record %d (%s): applied %v err %v, want %v", i, recs[i].WorkID, g.Applied, g.Err, want[i])
		}
	}
	work := func(src string) *store.Work {
		w, err := s.GetWork(ctx, ids[src].ID)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	if w := work("handoff"); w.State != "running" || time.Until(w.LeaseExpiresAt) < 50*time.Minute {
		t.Errorf("handoff: %s, lease until %v, want running with the lease kept an hour", w.State, w.LeaseExpiresAt)
	}
	if w := work("requeue"); w.State != "queued" || w.LeaseToken != "" || w.Repairs != 1 || w.RepairNote != "fix it" ||
		time.Until(w.RetryAt) < 50*time.Second {
		t.Errorf("requeue: %+v", w)
	}
	if w := work("finish"); w.State != "transport_rejected" || w.Reason != "refused for good" || w.LeaseToken != "" {
		t.Errorf("finish: %s %q", w.State, w.Reason)
	}
	if w := work("stale"); w.State != "running" || w.LeaseToken == tokens["stale"] {
		t.Errorf("stale: %s under %s: the old lease changed it", w.State, w.LeaseToken)
	}
	if w := work("superseded"); w.State != "superseded" {
		t.Errorf("superseded: %s", w.State)
	}
	for src, recorded := range map[string]bool{"handoff": true, "requeue": true, "finish": true, "nochange": true, "stale": false, "superseded": false} {
		n := count(t, ctx, s, `SELECT count(*) FROM attempts WHERE id = $1 AND outcome = 'ok' AND finished_at IS NOT NULL
			AND raw_response = $2`, attempts[src], `{"answer":"`+src+`"}`)
		if (n == 1) != recorded {
			t.Errorf("%s: attempt recorded %v, want %v", src, n == 1, recorded)
		}
		events := count(t, ctx, s, `SELECT count(*) FROM outbox WHERE msg_id = $1`, attempts[src])
		if (events == 1) != recorded && !(src == "handoff" && events == 2) {
			t.Errorf("%s: %d events, want them only for what was recorded", src, events)
		}
	}
}

// A group of answers to commit with one stale lease, one duplicate (a
// redelivered verdict of work already accepted) and one superseded work
// among them commits the others — one result each, their outcome events —
// and records each of those three as Commit alone would: stale_lease,
// nothing new, and stale_lease.
func TestCommitGroupStaleDuplicateSuperseded(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	works, attempts, tokens := map[string]*store.Work{}, map[string]string{}, map[string]string{}
	for _, src := range []string{"ok-1", "ok-2", "stale", "dup", "superseded", "late"} {
		works[src] = insert(t, ctx, s, newWork("acme", "commit/"+src, "r1"))
		attempts[src], tokens[src] = newUUID(), newUUID()
		works[src] = claim(t, ctx, s, works[src].ID, attempts[src], tokens[src], time.Minute)
	}
	// stale: the lease lapsed and another worker holds it.
	if _, err := store.Pool(s).Exec(ctx, `UPDATE work SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, works["stale"].ID); err != nil {
		t.Fatal(err)
	}
	claim(t, ctx, s, works["stale"].ID, newUUID(), newUUID(), time.Minute)
	// dup: accepted already by this very attempt; its verdict comes again.
	if v, err := s.Commit(ctx, works["dup"], attempts["dup"], tokens["dup"], json.RawMessage(`{"n":0}`), 0, nil); err != nil || v != store.Committed {
		t.Fatalf("first commit of dup: %v %v", v, err)
	}
	// superseded: a newer revision ended it while it ran.
	if _, err := store.Pool(s).Exec(ctx, `UPDATE work SET state = 'superseded', lease_token = NULL, lease_expires_at = NULL
		WHERE id = $1`, works["superseded"].ID); err != nil {
		t.Fatal(err)
	}
	// late: its deadline passed before the verdict.
	if _, err := store.Pool(s).Exec(ctx, `UPDATE work SET deadline_at = now() - interval '1 second' WHERE id = $1`, works["late"].ID); err != nil {
		t.Fatal(err)
	}
	var reqs []store.CommitReq
	order := []string{"ok-1", "stale", "dup", "superseded", "late", "ok-2"}
	for i, src := range order {
		ev := func(state string) []store.OutboxMsg {
			return []store.OutboxMsg{{Stream: "OUTCOME", Subject: "assay.us.outcome.acme", MsgID: works[src].ID + "." + state, Payload: []byte(`{}`)}}
		}
		reqs = append(reqs, store.CommitReq{Work: works[src], AttemptID: attempts[src], Token: tokens[src],
			Output: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i+1)), Findings: i, Accepted: ev("accepted"), Expired: ev("expired"), Announce: true})
	}
	got := s.CommitGroup(ctx, reqs)
	want := map[string]store.Verdict{"ok-1": store.Committed, "ok-2": store.Committed, "stale": store.Lost, "dup": store.Lost,
		"superseded": store.Lost, "late": store.Late}
	for i, g := range got {
		if g.Err != nil || g.Verdict != want[order[i]] {
			t.Errorf("%s: verdict %v err %v, want %v", order[i], g.Verdict, g.Err, want[order[i]])
		}
	}
	for src, wantState := range map[string]string{"ok-1": "accepted", "ok-2": "accepted", "stale": "running", "dup": "accepted",
		"superseded": "superseded", "late": "expired"} {
		w, err := s.GetWork(ctx, works[src].ID)
		if err != nil || w.State != wantState {
			t.Errorf("%s: %v %v, want %s", src, w, err, wantState)
		}
	}
	for src, wantOutcome := range map[string]string{"ok-1": "ok", "ok-2": "ok", "stale": "stale_lease", "dup": "ok",
		"superseded": "stale_lease", "late": "stale_lease"} {
		if got := attemptOutcome(t, ctx, s, attempts[src]); got != wantOutcome {
			t.Errorf("%s: attempt %s, want %s", src, got, wantOutcome)
		}
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM results WHERE work_id = ANY($1)`, []string{works["ok-1"].ID, works["ok-2"].ID}); n != 2 {
		t.Errorf("%d results of the two accepted, want 2", n)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM results WHERE work_id = $1`, works["dup"].ID); n != 1 {
		t.Errorf("dup has %d results, want still 1", n)
	}
	for msg, want := range map[string]int{works["ok-1"].ID + ".accepted": 1, works["ok-2"].ID + ".accepted": 1, works["late"].ID + ".expired": 1,
		works["ok-1"].ID + ".expired": 0, works["dup"].ID + ".accepted": 0, works["stale"].ID + ".accepted": 0, works["superseded"].ID + ".accepted": 0} {
		if n := count(t, ctx, s, `SELECT count(*) FROM outbox WHERE msg_id = $1`, msg); n != want {
			t.Errorf("outbox %s: %d rows, want %d", msg, n, want)
		}
	}
}

// A group holding an answer the database refuses (an output it will not
// store), which fails the group's statement as a whole, is run again
// answer by answer: that one fails, the others commit.
func TestCommitGroupIsolatesARefusedRow(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	var reqs []store.CommitReq
	for i, src := range []string{"a", "bad", "b"} {
		w := insert(t, ctx, s, newWork("acme", "isolate/"+src, "r1"))
		attempt, token := newUUID(), newUUID()
		w = claim(t, ctx, s, w.ID, attempt, token, time.Minute)
		out := json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))
		if src == "bad" {
			// An output the database will not store as JSON.
			out = json.RawMessage(`{"n":`)
		}
		reqs = append(reqs, store.CommitReq{Work: w, AttemptID: attempt, Token: token, Output: out})
	}
	got := s.CommitGroup(ctx, reqs)
	if got[0].Err != nil || got[0].Verdict != store.Committed || got[2].Err != nil || got[2].Verdict != store.Committed {
		t.Fatalf("the good answers: %+v and %+v, want committed", got[0], got[2])
	}
	if got[1].Err == nil {
		t.Fatalf("the refused answer: %+v, want its error", got[1])
	}
}

// A record whose values the database refuses (an event subject holding
// NUL) fails alone: the record fence's one statement, run again on halves
// of the group, records the others and writes nothing of that one.
func TestRecordAttemptGroupIsolatesARefusedRecord(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	var recs []store.AttemptRecord
	for _, src := range []string{"a", "b", "bad", "c", "d"} {
		w := insert(t, ctx, s, newWork("acme", "recisolate/"+src, "r1"))
		attempt, token := newUUID(), newUUID()
		claim(t, ctx, s, w.ID, attempt, token, time.Minute)
		subject := "assay.us.attempt.acme"
		if src == "bad" {
			subject = "assay.us.attempt.\x00"
		}
		recs = append(recs, store.AttemptRecord{AttemptID: attempt, WorkID: w.ID, LeaseToken: token, Outcome: "ok",
			Change: store.Finish, WorkOutcome: "accepted",
			Outbox: []store.OutboxMsg{{Stream: "ASSAY_ATTEMPT_US", Subject: subject, MsgID: attempt, Payload: []byte(`{}`)}}})
	}
	got := s.RecordAttemptGroup(ctx, recs)
	for i, g := range got {
		if i == 2 {
			if !store.Permanent(g.Err) {
				t.Fatalf("the refused record: %+v, want a refusal no retry mends", g)
			}
			continue
		}
		if g.Err != nil || !g.Applied {
			t.Fatalf("record %d: %+v, want applied", i, g)
		}
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM work WHERE id = $1 AND state = 'running'`, recs[2].WorkID); n != 1 {
		t.Fatal("the refused record changed its work")
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM outbox WHERE msg_id = ANY($1)`,
		[]string{recs[0].AttemptID, recs[1].AttemptID, recs[3].AttemptID, recs[4].AttemptID}); n != 4 {
		t.Fatalf("%d events of the four records applied, want 4", n)
	}
}

// The publisher's reads and dry records in groups answer each row as the
// single calls do: a missing work is not found, the same work twice in
// one group is recorded (the group runs again record by record).
func TestPublicationGroups(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	a := insert(t, ctx, s, newWork("acme", "pubgroup/a", "r1"))
	b := insert(t, ctx, s, newWork("other", "pubgroup/b", "r1"))
	got := s.PublishFactsGroup(ctx, []string{b.ID, "w_missing", a.ID})
	if got[0].Err != nil || got[0].Work.ID != b.ID || got[0].Work.TenantID != "other" || got[2].Err != nil || got[2].Work.ID != a.ID {
		t.Fatalf("facts: %+v", got)
	}
	if !errors.Is(got[1].Err, store.ErrNotFound) {
		t.Fatalf("missing work: %v", got[1].Err)
	}
	single, err := s.PublishFacts(ctx, a.ID)
	if err != nil || single.CheckPolicy != got[2].CheckPolicy || single.Work.Input != got[2].Work.Input {
		t.Fatalf("single %+v %v against the group's %+v", single, err, got[2].PublishFacts)
	}
	errs := s.RecordDryPublicationGroup(ctx, []store.DryPublication{
		{WorkID: a.ID, Tenant: "acme", Outcome: "accepted", Plan: json.RawMessage(`{"n":1}`)},
		{WorkID: b.ID, Tenant: "other", Outcome: "accepted", Plan: json.RawMessage(`{"n":2}`)},
		{WorkID: a.ID, Tenant: "acme", Outcome: "accepted", Plan: json.RawMessage(`{"n":3}`)},
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("dry record %d: %v", i, err)
		}
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM publications WHERE target = 'dry' AND state = 'published' AND work_id = ANY($1)`,
		[]string{a.ID, b.ID}); n != 2 {
		t.Fatalf("%d dry publications, want one per work", n)
	}
}

// A claim made on an announcement's facts takes the lease only while the
// row still holds every one of them: one fact off, and the row is left as
// it was, with no attempt.
func TestClaimGroupChecksExpectations(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	rows := map[string]*store.Work{}
	for _, src := range []string{"match", "attempts", "input", "budget", "deadline", "plain"} {
		rows[src] = insert(t, ctx, s, newWork("acme", "expect/"+src, "r1"))
	}
	expect := func(src string, change func(e *store.Expect)) *store.Expect {
		e := store.ExpectOf(rows[src], false)
		change(e)
		return e
	}
	same := func(*store.Expect) {}
	reqs := []store.ClaimReq{
		{WorkID: rows["match"].ID, Expect: expect("match", same)},
		{WorkID: rows["attempts"].ID, Expect: expect("attempts", func(e *store.Expect) { e.Attempts = 1 })},
		{WorkID: rows["input"].ID, Expect: expect("input", func(e *store.Expect) { e.InputBytes++ })},
		{WorkID: rows["budget"].ID, Expect: expect("budget", func(e *store.Expect) { e.Budgeted = true })},
		{WorkID: rows["deadline"].ID, Expect: expect("deadline", func(e *store.Expect) { e.DeadlineAt = e.DeadlineAt.Add(time.Microsecond) })},
		{WorkID: rows["plain"].ID},
	}
	for i := range reqs {
		reqs[i].AttemptID, reqs[i].Token, reqs[i].TTL = newUUID(), newUUID(), time.Minute
	}
	got := s.ClaimGroup(ctx, reqs)
	for i, want := range []bool{true, false, false, false, false, true} {
		if got[i].Err != nil || got[i].OK != want {
			t.Fatalf("request %d (%s): ok %v, err %v; want ok %v", i, reqs[i].WorkID, got[i].OK, got[i].Err, want)
		}
	}
	if w := got[0].Work; w.Input != rows["match"].Input || w.State != "running" || w.LeaseToken != reqs[0].Token {
		t.Fatalf("the claim on facts returned %+v, want the whole row, running under its lease", w)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM work WHERE id = ANY($1) AND state = 'queued' AND attempts = 0`,
		[]string{rows["attempts"].ID, rows["input"].ID, rows["budget"].ID, rows["deadline"].ID}); n != 4 {
		t.Fatalf("%d of the 4 rows whose facts differ are untouched", n)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM attempts`); n != 2 {
		t.Fatalf("%d attempts, want 2 (the match and the plain claim)", n)
	}
}

// A group of inserts decides each request as InsertWork would: new work
// of different sources in one statement, each superseding its own older
// revision (and cancelling it when running); a key already taken gets
// the existing work; a second revision of a source in the group, and work
// to be dropped, are decided alone after the statement, in order.
func TestInsertWorkGroupDecidesEachRequest(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	taken := insert(t, ctx, s, newWork("acme", "octo/repo#1", "r1"))
	queuedOld := insert(t, ctx, s, newWork("acme", "octo/repo#2", "r1"))
	runningOld := insert(t, ctx, s, newWork("acme", "octo/repo#3", "r1"))
	if _, err := store.Pool(s).Exec(ctx, `UPDATE work SET state = 'running', lease_token = gen_random_uuid(),
		lease_expires_at = now() + interval '1 minute' WHERE id = $1`, runningOld.ID); err != nil {
		t.Fatal(err)
	}
	withCancels := func(w *store.Work) ([]store.OutboxMsg, error) {
		msgs, err := announce(w)
		for _, old := range w.SupersededRunning {
			msgs = append(msgs, store.OutboxMsg{Stream: "WORK", Subject: "assay.us.cancel.acme", MsgID: "cancel." + old + "." + w.ID,
				Payload: []byte(`{}`)})
		}
		return msgs, err
	}
	dropped := newWork("acme", "octo/repo#5", "r1")
	dropped.DropReason = "over_rate"
	// Work dropped before, asked for again in the group: its key is taken,
	// so it is decided alone and queued again under dispatch 2.
	earlier := newWork("acme", "octo/repo#6", "r1")
	earlier.DropReason = "over_rate"
	if _, created, err := s.InsertWork(ctx, earlier, withCancels); err != nil || !created {
		t.Fatalf("drop: created=%v %v", created, err)
	}
	reqs := []*store.Work{
		newWork("acme", "octo/repo#1", "r1"), // the key taken
		newWork("acme", "octo/repo#2", "r2"), // supersedes a queued revision
		newWork("acme", "octo/repo#3", "r2"), // supersedes a running one
		newWork("acme", "octo/repo#4", "r1"), // new
		newWork("acme", "octo/repo#4", "r2"), // a second revision of the same source
		dropped,
		newWork("acme", "octo/repo#6", "r1"), // the dropped work asked for again
	}
	var in []store.InsertReq
	for _, w := range reqs {
		w.SupersedeOlder = true
		in = append(in, store.InsertReq{Work: w, Announce: withCancels})
	}
	out := s.InsertWorkGroup(ctx, in)
	want := []struct {
		id      string
		created bool
		state   string
	}{
		{taken.ID, false, "queued"}, {reqs[1].ID, true, "queued"}, {reqs[2].ID, true, "queued"},
		{reqs[3].ID, true, "superseded"}, {reqs[4].ID, true, "queued"}, {dropped.ID, true, "dropped"},
		{earlier.ID, true, "queued"},
	}
	for i, w := range want {
		if out[i].Err != nil || out[i].Work == nil || out[i].Work.ID != w.id || out[i].Created != w.created {
			t.Fatalf("request %d: %+v, want %s created=%v", i, out[i], w.id, w.created)
		}
		if got := count(t, ctx, s, `SELECT count(*) FROM work WHERE id = $1 AND state = $2`, w.id, w.state); got != 1 {
			t.Fatalf("request %d: work %s not %s", i, w.id, w.state)
		}
	}
	// What each request says it wrote, to hand to the relay, is what is in
	// the outbox for its work, and nothing else.
	for i, o := range out {
		if !o.Created {
			continue
		}
		var ids []string
		for _, m := range o.Work.Announced {
			ids = append(ids, m.MsgID)
		}
		written := count(t, ctx, s, `SELECT count(*) FROM outbox WHERE msg_id LIKE $1 || '.%' OR msg_id LIKE 'cancel.%.' || $1`, o.Work.ID)
		if matched := count(t, ctx, s, `SELECT count(*) FROM outbox WHERE msg_id = ANY($1)`, ids); matched != len(ids) || written != len(ids) {
			t.Fatalf("request %d says it wrote %v; %d of them are in the outbox, which holds %d rows of its work", i, ids, matched, written)
		}
	}
	if got := out[6].Work.Announced; len(got) != 1 || got[0].MsgID != earlier.ID+".2" {
		t.Fatalf("the dropped work queued again says it wrote %+v, want its dispatch-2 announcement alone", got)
	}
	if got := out[2].Work.SupersededRunning; len(got) != 1 || got[0] != runningOld.ID {
		t.Fatalf("superseded running = %v, want %s", got, runningOld.ID)
	}
	for _, old := range []string{queuedOld.ID, runningOld.ID} {
		if got := count(t, ctx, s, `SELECT count(*) FROM work WHERE id = $1 AND state = 'superseded'`, old); got != 1 {
			t.Fatalf("older revision %s not superseded", old)
		}
	}
	// One announcement per queued or superseded-after new row, none for the
	// key taken or the dropped work, and one cancel for the running one.
	for _, c := range []struct {
		sql  string
		arg  string
		want int
	}{
		{`SELECT count(*) FROM outbox WHERE msg_id = $1 || '.1'`, reqs[1].ID, 1},
		{`SELECT count(*) FROM outbox WHERE msg_id = $1 || '.1'`, reqs[3].ID, 1},
		{`SELECT count(*) FROM outbox WHERE msg_id = $1 || '.1'`, dropped.ID, 0},
		{`SELECT count(*) FROM outbox WHERE msg_id = $1`, "cancel." + runningOld.ID + "." + reqs[2].ID, 1},
		{`SELECT count(*) FROM outbox WHERE msg_id LIKE $1 || '.%'`, taken.ID, 1},
	} {
		if got := count(t, ctx, s, c.sql, c.arg); got != c.want {
			t.Fatalf("%s [%s] = %d, want %d", c.sql, c.arg, got, c.want)
		}
	}
}

// TestWorkAnswerGroupKeepsEachRequestsWork: a group asking for an
// attempt's answer under its own work and, as a malformed event would,
// under another work gets each work's own row: the answer under the work
// that holds the attempt, none under the other.
func TestWorkAnswerGroupKeepsEachRequestsWork(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	a := insert(t, ctx, s, newWork("acme", "octo/repo#71", "r1"))
	b := insert(t, ctx, s, newWork("acme", "octo/repo#72", "r1"))
	attempt, token := newUUID(), newUUID()
	claim(t, ctx, s, a.ID, attempt, token, time.Minute)
	if _, err := s.RecordAttempt(ctx, store.AttemptRecord{AttemptID: attempt, WorkID: a.ID, LeaseToken: token,
		Outcome: "ok", Raw: []byte(`{"answer":1}`), Change: store.Handoff, HandoffTTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	for _, order := range [][]string{{a.ID, b.ID}, {b.ID, a.ID}} {
		got := s.WorkAnswerGroup(ctx, []store.AnswerReq{{WorkID: order[0], AttemptID: attempt}, {WorkID: order[1], AttemptID: attempt}})
		for i, g := range got {
			if g.Err != nil || g.Work == nil || g.Work.ID != order[i] {
				t.Fatalf("request %d for work %s: %+v", i, order[i], g)
			}
			if want := order[i] == a.ID; (string(g.Answer) == `{"answer": 1}` || string(g.Answer) == `{"answer":1}`) != want {
				t.Errorf("work %s: answer %q, want the attempt's answer only under the work that holds it", order[i], g.Answer)
			}
		}
	}
}

// The same key twice in one group, and a late revision beside an earlier
// one of its source: the first copy creates the work and the second finds
// it (one announcement); a revision whose source time is older than one
// already here is stored superseded, unannounced, and supersedes nothing.
func TestInsertWorkGroupCopiesAndLateRevisions(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	at := time.Now().Add(-time.Hour).Truncate(time.Second)
	newer := newWork("acme", "octo/late#1", "r2")
	newer.SupersedeOlder, newer.SourceUpdatedAt = true, at.Add(time.Minute)
	insert(t, ctx, s, newer)
	late := newWork("acme", "octo/late#1", "r1")
	late.SupersedeOlder, late.SourceUpdatedAt = true, at
	out := s.InsertWorkGroup(ctx, []store.InsertReq{
		{Work: newWork("acme", "octo/copy#1", "r1"), Announce: announce},
		{Work: late, Announce: announce},
		{Work: newWork("acme", "octo/copy#1", "r1"), Announce: announce},
	})
	for i, o := range out {
		if o.Err != nil {
			t.Fatalf("request %d: %v", i, o.Err)
		}
	}
	if !out[0].Created || out[2].Created || out[0].Work.ID != out[2].Work.ID {
		t.Fatalf("copies: %+v and %+v; want the first created and the second finding it", out[0], out[2])
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM outbox WHERE msg_id LIKE $1 || '.%'`, out[0].Work.ID); n != 1 {
		t.Fatalf("%d announcements of the copied key, want 1", n)
	}
	if w := out[1].Work; !out[1].Created || w.State != "superseded" || w.Reason != "revision r2 was pushed later" || len(w.Announced) != 0 {
		t.Fatalf("late revision: created %v, %+v; want it stored superseded by r2, unannounced", out[1].Created, w)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM work WHERE id = $1 AND state = 'queued'`, newer.ID); n != 1 {
		t.Fatal("the late revision superseded the newer one")
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM outbox WHERE msg_id LIKE $1 || '.%'`, late.ID); n != 0 {
		t.Fatalf("%d announcements of the late revision, want 0", n)
	}
}

// A request whose values the database refuses (an input holding NUL)
// fails alone: the others of its group are inserted and announced.
func TestInsertWorkGroupIsolatesARefusedRequest(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	bad := newWork("acme", "octo/nul#1", "r1")
	bad.Input = "{\"diff\":\"\x00\"}"
	reqs := []store.InsertReq{
		{Work: newWork("acme", "octo/nul#2", "r1"), Announce: announce},
		{Work: bad, Announce: announce},
		{Work: newWork("acme", "octo/nul#3", "r1"), Announce: announce},
	}
	out := s.InsertWorkGroup(ctx, reqs)
	if !store.Permanent(out[1].Err) {
		t.Fatalf("the refused request: %+v, want a refusal no retry mends", out[1])
	}
	for _, i := range []int{0, 2} {
		if out[i].Err != nil || !out[i].Created || len(out[i].Work.Announced) != 1 {
			t.Fatalf("request %d: %+v, want it created and announced", i, out[i])
		}
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM work WHERE source_id LIKE 'octo/nul#%'`); n != 2 {
		t.Fatalf("%d rows of the group, want 2", n)
	}
}

// A key already held under another id is found under that id: the
// request gets the row that holds its key, not a second row and not an
// error.
func TestInsertWorkFindsAKeyHeldUnderAnotherID(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	held := insert(t, ctx, s, newWork("acme", "octo/other-id#1", "r1"))
	again := newWork("acme", "octo/other-id#1", "r1")
	again.ID = "w_another_id"
	got, created, err := s.InsertWork(ctx, again, announce)
	if err != nil || created || got == nil || got.ID != held.ID {
		t.Fatalf("insert under another id: %+v created=%v err=%v; want %s found", got, created, err, held.ID)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM work WHERE source_id = 'octo/other-id#1'`); n != 1 {
		t.Fatalf("%d rows for the key, want 1", n)
	}
}
