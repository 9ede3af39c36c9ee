package store_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"assay.dev/pkg/store"
)

// Work past its deadline ends expired: queued work at once, running work
// once the grace has passed; a late answer then neither commits nor
// revives it, and the attempt is recorded stale.
func TestDeadlineExpiry(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	queued := newWork("acme", "octo/repo#20", "a")
	queued.DeadlineAt = time.Now().Add(-time.Second)
	queued = insert(t, ctx, s, queued)
	running := newWork("acme", "octo/repo#21", "a")
	running.DeadlineAt = time.Now().Add(time.Hour)
	running = insert(t, ctx, s, running)
	attempt, token := newUUID(), newUUID()
	running = claim(t, ctx, s, running.ID, attempt, token, time.Minute)
	live := insert(t, ctx, s, newWork("acme", "octo/repo#22", "a"))

	got, err := s.ExpireOverdue(ctx, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != queued.ID || got[0].State != "expired" {
		t.Fatalf("first pass expired %v, want only %s", got, queued.ID)
	}
	// The running work's deadline passes while its worker holds the lease:
	// moved into the past rather than waited for, so that the first pass
	// may take as long as a loaded machine makes it.
	if _, err := store.Pool(s).Exec(ctx, `UPDATE work SET deadline_at = now() - interval '1 millisecond' WHERE id = $1`, running.ID); err != nil {
		t.Fatal(err)
	}
	// Within the grace the worker may still report; nothing changes.
	if got, err := s.ExpireOverdue(ctx, time.Hour, 100); err != nil || len(got) != 0 {
		t.Fatalf("within the grace: %v %v", got, err)
	}
	// Its answer arrives after the deadline: the commit fence refuses it.
	if v, err := s.Commit(ctx, running, attempt, token, json.RawMessage(`{"findings":[]}`), 0, nil); err != nil || v != store.Late {
		t.Fatalf("late commit: verdict %v err %v, want not committed", v, err)
	}
	w, err := s.GetWork(ctx, running.ID)
	if err != nil || w.State != "expired" {
		t.Fatalf("after the late answer the work is %q (%v), want expired", w.State, err)
	}
	if got := attemptOutcome(t, ctx, s, attempt); got != "stale_lease" {
		t.Fatalf("late attempt outcome %q, want stale_lease", got)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM results WHERE work_id = $1`, running.ID); n != 0 {
		t.Fatalf("%d results for expired work", n)
	}
	// Expired is terminal: a claim cannot take it back.
	if _, ok, err := s.Claim(ctx, running.ID, newUUID(), newUUID(), time.Minute, 0); err != nil || ok {
		t.Fatalf("claim of expired work: ok=%v err=%v", ok, err)
	}
	if w, _ := s.GetWork(ctx, live.ID); w.State != "queued" {
		t.Fatalf("work inside its deadline is %q", w.State)
	}
}

// Dropped work is stored unannounced; asking again with the same key, or a
// rerun, queues it once and announces it.
func TestDroppedAndReadmitted(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	w := newWork("acme", "octo/repo#30", "a")
	w.DropReason = "over the rate"
	got, created, err := s.InsertWork(ctx, w, announce)
	if err != nil || !created || got.State != "dropped" || got.Reason != "over the rate" {
		t.Fatalf("dropped insert: %+v created=%v err=%v", got, created, err)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM outbox`); n != 0 {
		t.Fatalf("dropped work announced: %d outbox rows", n)
	}
	// Dropped again while still over the rate: unchanged.
	if again, created, err := s.InsertWork(ctx, w, announce); err != nil || created || again.State != "dropped" {
		t.Fatalf("second drop: %+v created=%v err=%v", again, created, err)
	}
	w.DropReason = ""
	got, created, err = s.InsertWork(ctx, w, announce)
	if err != nil || !created || got.State != "queued" || got.Reason != "" {
		t.Fatalf("asked again: %+v created=%v err=%v", got, created, err)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM outbox`); n != 1 {
		t.Fatalf("%d outbox rows after re-admission, want 1", n)
	}
	if _, err := s.Rerun(ctx, w.ID, time.Now().Add(time.Minute), announce); !errors.Is(err, store.ErrNotDropped) {
		t.Fatalf("rerun of queued work: %v, want ErrNotDropped", err)
	}
	if got, created, err = s.InsertWork(ctx, w, announce); err != nil || created {
		t.Fatalf("third ask: created=%v err=%v, want a plain duplicate", created, err)
	}

	// A rerun of an older dropped revision, once a newer one arrived, is
	// refused and names the newer one.
	old := newWork("acme", "octo/repo#31", "a")
	old.DropReason = "over the rate"
	insert(t, ctx, s, old)
	insert(t, ctx, s, newWork("acme", "octo/repo#31", "b"))
	if _, err := s.Rerun(ctx, old.ID, time.Now().Add(time.Minute), announce); !errors.Is(err, store.ErrSuperseded) ||
		!strings.Contains(err.Error(), "revision b") {
		t.Fatalf("rerun of a replaced revision: %v, want ErrSuperseded naming revision b", err)
	}
	if _, err := s.Rerun(ctx, "w_nope", time.Now(), announce); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("rerun of unknown work: %v, want ErrNotFound", err)
	}
}
