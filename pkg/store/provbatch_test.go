package store_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"assay.dev/pkg/store"
)

// A line is written with its claim's lease held for the batch; a batch
// takes only lines whose lease is live; each line is reconciled once, so
// its attempt is recorded and its events written once, however many
// workers try.
func TestProviderBatchLines(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	var lines []store.BatchLine
	for _, src := range []string{"octo/repo#1", "octo/repo#2", "octo/repo#3"} {
		w := insert(t, ctx, s, newWork("acme", src, "abc"))
		l := store.BatchLine{AttemptID: newUUID(), WorkID: w.ID, TenantID: "acme", LeaseToken: newUUID(), Request: []byte(`{"n":1}`)}
		if _, ok, err := s.Claim(ctx, w.ID, l.AttemptID, l.LeaseToken, time.Minute, 10); err != nil || !ok {
			t.Fatalf("claim: %v %v", ok, err)
		}
		if ok, err := s.EnqueueBatchLine(ctx, l, 24*time.Hour); err != nil || !ok {
			t.Fatalf("enqueue: %v %v", ok, err)
		}
		lines = append(lines, l)
	}
	// The lease is held for the batch, not the claim's minute.
	if n := count(t, ctx, s, `SELECT count(*) FROM work WHERE lease_expires_at > now() + interval '23 hours'`); n != 3 {
		t.Fatalf("%d leases held for the batch, want 3", n)
	}
	// A line whose lease is not its own is not written.
	if ok, err := s.EnqueueBatchLine(ctx, store.BatchLine{AttemptID: newUUID(), WorkID: lines[0].WorkID, TenantID: "acme",
		LeaseToken: newUUID()}, time.Hour); err != nil || ok {
		t.Fatalf("enqueue under another's lease: %v %v", ok, err)
	}
	// The third line's work ends while it waits.
	if _, err := store.Pool(s).Exec(ctx, `UPDATE work SET state = 'superseded', lease_token = NULL WHERE id = $1`, lines[2].WorkID); err != nil {
		t.Fatal(err)
	}
	n, _, err := s.PendingLines(ctx)
	if err != nil || n != 3 {
		t.Fatalf("pending %d, %v; want 3", n, err)
	}
	b, dead, err := s.FormProviderBatch(ctx, newUUID(), 10, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if b == nil || b.Lines != 2 || len(b.Open) != 2 || len(dead) != 1 || dead[0].AttemptID != lines[2].AttemptID {
		t.Fatalf("batch %+v, dead %+v; want the two live lines batched and the third dead", b, dead)
	}
	// Held by its former: no one else takes it.
	if taken, err := s.TakeProviderBatches(ctx, 10, time.Minute); err != nil || len(taken) != 0 {
		t.Fatalf("took %d held batches, %v", len(taken), err)
	}
	if err := s.UpdateProviderBatch(ctx, b.ID, store.ProviderBatchUpdate{InputFileID: "file-1", ProviderID: "batch-1", Status: "validating"}); err != nil {
		t.Fatal(err)
	}
	taken, err := s.TakeProviderBatches(ctx, 10, time.Minute)
	if err != nil || len(taken) != 1 || taken[0].State != store.BatchSubmitted || taken[0].ProviderID != "batch-1" || taken[0].OpenCount != 2 {
		t.Fatalf("taken %+v, %v", taken, err)
	}
	if err := s.OpenLines(ctx, taken[0]); err != nil || len(taken[0].Open) != 2 || string(taken[0].Open[0].Request) != `{"n":1}` {
		t.Fatalf("open lines %+v, %v", taken[0].Open, err)
	}

	// Four workers reconcile the same line at once: one records it.
	rec := func(l store.BatchLine) store.AttemptRecord {
		return store.AttemptRecord{AttemptID: l.AttemptID, WorkID: l.WorkID, LeaseToken: l.LeaseToken, Outcome: "ok",
			Change: store.Handoff, HandoffTTL: time.Minute,
			Outbox: []store.OutboxMsg{{Stream: "ATTEMPT", Subject: "assay.us.attempt.acme", MsgID: l.AttemptID, Payload: []byte(`{}`)}}}
	}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { _, errs[i] = s.RecordBatchLine(ctx, store.LineAnswered, rec(lines[0])) })
	}
	wg.Wait()
	recorded := 0
	for _, err := range errs {
		switch {
		case err == nil:
			recorded++
		case !errors.Is(err, store.ErrLineReconciled):
			t.Fatalf("reconcile: %v", err)
		}
	}
	if recorded != 1 {
		t.Fatalf("line recorded %d times, want once", recorded)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM outbox WHERE msg_id = $1`, lines[0].AttemptID); n != 1 {
		t.Fatalf("%d events for the line, want 1", n)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM provider_batch_lines WHERE attempt_id = $1 AND request IS NULL AND outcome = 'answered'`, lines[0].AttemptID); n != 1 {
		t.Fatal("the reconciled line keeps its request, or no outcome")
	}
	if _, done, err := s.FinishProviderBatch(ctx, b.ID); err != nil || done {
		t.Fatalf("finished with a line open: %v %v", done, err)
	}
	// A change whose lease is gone writes nothing: recorded stale
	// instead, with no change.
	gone := rec(lines[1])
	gone.LeaseToken = newUUID()
	if applied, err := s.RecordBatchLine(ctx, store.LineMissing, gone); err != nil || applied {
		t.Fatalf("recorded under a lease that is gone: %v %v", applied, err)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM outbox WHERE msg_id = $1`, lines[1].AttemptID); n != 0 {
		t.Fatalf("%d events written for a change that did not apply", n)
	}
	if applied, err := s.RecordBatchLine(ctx, store.LineMissing, rec(lines[1])); err != nil || !applied {
		t.Fatalf("record: %v %v", applied, err)
	}
	c, done, err := s.FinishProviderBatch(ctx, b.ID)
	if err != nil || !done || c != (store.LineCounts{Answered: 1, Missing: 1}) {
		t.Fatalf("finish: %+v %v %v", c, done, err)
	}
	rows, err := s.ProviderBatches(ctx, 10)
	if err != nil || len(rows) != 1 || rows[0].State != store.BatchReconciled || rows[0].Reconciled != c {
		t.Fatalf("batches %+v, %v", rows, err)
	}
}
