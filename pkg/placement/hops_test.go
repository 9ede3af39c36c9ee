package placement_test

import (
	"testing"
	"time"

	"assay.dev/pkg/placement"
)

// The hops recorded for a tenant are its history, oldest first; Histories
// has every tenant that moved, and no other key of the map.
func TestRecordHopAndHistories(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	kv, err := placement.Bucket(ctx, connect(t), "t_placement_hops", 1)
	if err != nil {
		t.Fatal(err)
	}
	all, err := placement.Histories(ctx, kv)
	if err != nil || len(all) != 0 {
		t.Fatalf("histories of an empty map: %v, %v", all, err)
	}
	if err := placement.Place(ctx, kv, "acme", "us-2"); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	hops := []placement.Hop{{From: "us", To: "us-2", At: at}, {From: "us-2", To: "us-3", At: at.Add(time.Hour)}}
	for _, h := range hops {
		if err := placement.RecordHop(ctx, kv, "acme", h); err != nil {
			t.Fatal(err)
		}
	}
	if err := placement.RecordHop(ctx, kv, "globex", hops[0]); err != nil {
		t.Fatal(err)
	}
	got, err := placement.History(ctx, kv, "acme")
	if err != nil || len(got) != 2 || got[0] != hops[0] || got[1] != hops[1] {
		t.Fatalf("history of acme: %+v, %v", got, err)
	}
	all, err = placement.Histories(ctx, kv)
	if err != nil || len(all) != 2 || len(all["acme"]) != 2 || len(all["globex"]) != 1 {
		t.Fatalf("histories: %+v, %v", all, err)
	}
}
