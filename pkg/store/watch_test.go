package store_test

import (
	"testing"
	"time"

	"assay.dev/pkg/store"
)

// The samples behind the watch gauges: oldest unfinished work per lane,
// the five views, and the outbox backlog per stream, read from what is in
// the tables.
func TestWatchSamples(t *testing.T) {
	s, ctx := setup(t)
	empty, err := s.Outbox(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"WORK", "RESULT", "ATTEMPT"} {
		if b, ok := empty[k]; !ok || b != (store.OutboxBacklog{}) {
			t.Fatalf("outbox of an empty cell: %s = %+v (present %v), want zero", k, b, ok)
		}
	}
	insert(t, ctx, s, newWork("acme", "a", "r1"))
	interactive := newWork("acme", "b", "r1")
	interactive.Lane = "interactive"
	insert(t, ctx, s, interactive)
	if _, err := store.Pool(s).Exec(ctx, `UPDATE work SET created_at = now() - interval '90 seconds' WHERE id = $1`, interactive.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Pool(s).Exec(ctx, `UPDATE outbox SET created_at = now() - interval '40 seconds'
		WHERE id = (SELECT min(id) FROM outbox)`); err != nil {
		t.Fatal(err)
	}

	oldest, err := s.Oldest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := oldest["interactive"]; d < 90*time.Second || d > 100*time.Second {
		t.Errorf("oldest interactive = %s, want about 90s", d)
	}
	if d := oldest["batch"]; d <= 0 || d > 10*time.Second {
		t.Errorf("oldest batch = %s, want a few seconds at most", d)
	}
	views, err := s.Views(ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if views[store.ViewRunning] != 2 || views[store.ViewAccepted] != 0 || len(views) != 5 {
		t.Errorf("views = %v, want 2 running and the other four at 0", views)
	}
	backlog, err := s.Outbox(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := backlog["WORK"]
	if w.Pending != 2 || w.SetAside != 0 || w.Oldest < 40*time.Second || w.Oldest > 50*time.Second {
		t.Errorf("WORK backlog = %+v, want 2 pending, the oldest about 40s, none set aside", w)
	}
	if _, err := store.Pool(s).Exec(ctx, `UPDATE outbox_waiting SET set_aside_at = now() WHERE id = (SELECT min(id) FROM outbox_waiting)`); err != nil {
		t.Fatal(err)
	}
	if backlog, err = s.Outbox(ctx); err != nil {
		t.Fatal(err)
	}
	if w := backlog["WORK"]; w.Pending != 1 || w.SetAside != 1 || w.Oldest > 10*time.Second {
		t.Errorf("WORK backlog after one row set aside = %+v, want 1 pending (young), 1 set aside", w)
	}
}
