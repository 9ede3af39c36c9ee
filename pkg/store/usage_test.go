package store_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"assay.dev/pkg/store"
)

func TestUsageByModel(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	w := insert(t, ctx, s, newWork("acme", "octo/repo#9", "abc"))
	from := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)
	for _, r := range []struct {
		model    string
		in, cost int64
		at       time.Time
	}{
		{"gpt-4o-mini", 100, 10, from},
		{"gpt-4o-mini", 200, 20, from.Add(time.Minute)},
		{"assay-sim-1", 50, 5, from.Add(time.Hour)},
		{"assay-sim-1", 999, 999, from.Add(48 * time.Hour)}, // after the period
	} {
		if _, err := s.AppendLedger(ctx, store.LedgerRow{AttemptID: newUUID(), TenantID: "acme", WorkID: w.ID,
			Model: r.model, Outcome: "ok", InputUnits: r.in, OutputUnits: 1, CostMicros: r.cost, OccurredAt: r.at}); err != nil {
			t.Fatal(err)
		}
	}
	// A timeout charged its estimate counts apart as estimated.
	if _, err := s.AppendLedger(ctx, store.LedgerRow{AttemptID: newUUID(), TenantID: "acme", WorkID: w.ID,
		Model: "gpt-4o-mini", Outcome: "timeout", InputUnits: 400, CostMicros: 40, OccurredAt: from, Estimated: true}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Usage(ctx, "acme", from, from.Add(24*time.Hour), store.ByModel)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.UsageLine{
		{Key: "assay-sim-1", Calls: 1, InputUnits: 50, OutputUnits: 1, CostMicros: 5},
		{Key: "gpt-4o-mini", Calls: 3, InputUnits: 700, OutputUnits: 2, CostMicros: 70, EstimatedCalls: 1, EstimatedCostMicros: 40},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("by model %+v, want %+v", got, want)
	}
	if other, err := s.Usage(ctx, "other", from, from.Add(24*time.Hour), store.ByModel); err != nil || len(other) != 0 {
		t.Fatalf("another tenant's usage: %+v %v", other, err)
	}
}

func TestReconcile(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	w := insert(t, ctx, s, newWork("acme", "octo/repo#10", "abc"))
	attempt, token := newUUID(), newUUID()
	cw := claim(t, ctx, s, w.ID, attempt, token, time.Minute)
	if v, err := s.Commit(ctx, cw, attempt, token, json.RawMessage(`{"findings":[]}`), 0, nil); err != nil || v != store.Committed {
		t.Fatalf("commit: verdict %v err %v", v, err)
	}
	if _, err := s.AppendLedger(ctx, store.LedgerRow{AttemptID: attempt, TenantID: "acme", WorkID: w.ID,
		Model: "m", Outcome: "ok", OccurredAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	checks, err := s.Reconcile(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range checks {
		if !c.OK() {
			t.Errorf("%s: %d differ %v", c.Name, c.Differ, c.Offenders)
		}
	}
	if checks[0].Checked != 1 {
		t.Errorf("accepted work checked = %d, want 1", checks[0].Checked)
	}

	if _, err := store.Pool(s).Exec(ctx, `DELETE FROM ledger WHERE attempt_id = $1`, attempt); err != nil {
		t.Fatal(err)
	}
	stray := newUUID()
	if _, err := s.AppendLedger(ctx, store.LedgerRow{AttemptID: stray, TenantID: "acme", WorkID: w.ID,
		Model: "m", Outcome: "ok", OccurredAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	checks, err = s.Reconcile(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string][]string{}
	for _, c := range checks {
		if !c.OK() {
			bad[c.Name] = c.Offenders
		}
	}
	if len(bad) != 2 || !slices.Equal(bad["attempt_one_ledger_row"], []string{attempt}) || !slices.Equal(bad["ledger_has_attempt"], []string{stray}) {
		t.Fatalf("differences %v", bad)
	}
	// Work created after since is out of scope.
	if checks, err = s.Reconcile(ctx, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	for _, c := range checks {
		if c.Checked != 0 || !c.OK() {
			t.Errorf("%s after since: %+v", c.Name, c)
		}
	}
}
