package store_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"assay.dev/pkg/store"
)

// partCall records one call of a review in parts of w under token, reserved
// at estimate, ended oc, and its ledger row asked of model, charged cost,
// estimated or not.
func partCall(t *testing.T, ctx context.Context, s *store.Store, w *store.Work, token string, call int, estimate int64,
	oc, model string, cost int64, estimated bool) {
	t.Helper()
	id := newUUID()
	ok, err := s.StartPart(ctx, store.PartCall{ID: id, WorkID: w.ID, Token: token, Part: fmt.Sprintf("p%d", call), Call: call,
		Estimate: estimate, TTL: time.Minute})
	if err != nil || !ok {
		t.Fatalf("start part call %d: %v %v", call, ok, err)
	}
	if err := s.RecordPart(ctx, store.PartRecord{ID: id, Outcome: oc}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendLedger(ctx, store.LedgerRow{AttemptID: id, TenantID: w.TenantID, WorkID: w.ID, Model: model, Outcome: oc,
		UpstreamAttempts: 1, CostMicros: cost, OccurredAt: time.Now(), Estimated: estimated}); err != nil {
		t.Fatal(err)
	}
}

// The calls a review in parts calibrates its cap on: the last n calls of
// reviews in parts of the contract asked of the model that the model
// answered and the provider billed (not a call without an answer, an
// estimated row, another model's or another contract's), newest first.
func TestPartCallCosts(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	w := insert(t, ctx, s, newWork("acme", "acme/shop#1", "r1"))
	token := newUUID()
	claim(t, ctx, s, w.ID, newUUID(), token, time.Minute)
	partCall(t, ctx, s, w, token, 1, 4000, "ok", "m1", 300, false)
	partCall(t, ctx, s, w, token, 2, 4000, "invalid_output", "m1", 310, false)
	partCall(t, ctx, s, w, token, 3, 4000, "rate_limited", "m1", 0, false)
	partCall(t, ctx, s, w, token, 4, 4000, "timeout", "m1", 4000, true)
	partCall(t, ctx, s, w, token, 5, 4000, "ok", "m2", 200, false)
	partCall(t, ctx, s, w, token, 6, 3000, "ok", "m1", 250, false)
	other := newWork("acme", "acme/shop#2", "r1")
	other.Contract = "change-review"
	other = insert(t, ctx, s, other)
	otherToken := newUUID()
	claim(t, ctx, s, other.ID, newUUID(), otherToken, time.Minute)
	partCall(t, ctx, s, other, otherToken, 1, 4000, "ok", "m1", 900, false)

	got, err := s.PartCallCosts(ctx, "pr-review", "m1", 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.CallCost{{Estimate: 3000, Cost: 250}, {Estimate: 4000, Cost: 310}, {Estimate: 4000, Cost: 300}}
	if !slices.Equal(got, want) {
		t.Fatalf("costs %+v, want %+v", got, want)
	}
	if got, err := s.PartCallCosts(ctx, "pr-review", "m1", 1); err != nil || !slices.Equal(got, want[:1]) {
		t.Fatalf("the last call: %+v %v, want %+v", got, err, want[:1])
	}
}
