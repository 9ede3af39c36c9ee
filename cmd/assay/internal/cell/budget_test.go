package cell_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/store"
	"assay.dev/services/classifier"
)

// A budget for exactly K attempts, many concurrent workers, 3K work items:
// at most K model calls, the ledger total within the budget, and every item
// that could not be paid for ends budget_exhausted without a call.
func TestBudgetRace(t *testing.T) {
	t.Parallel()
	const k = 5
	// The simulated provider counts a unit per 4 bytes, so an estimate at 4
	// bytes a unit with the answer capped at 512 units bounds its real cost.
	cfg := classifier.Config{Concurrency: 8, MaxOutputUnits: 512, BytesPerUnit: 4}
	b := celltest.Setup(t, cell.Options{Classifier: cfg})
	ctx := context.Background()
	env := b.Cell.Env
	// A second classifier on the same durable: two processes' worth of
	// workers race for the same budget.
	cfg.Region, cfg.Model = "us", "assay-sim-1"
	second, err := classifier.New(cfg,
		classifier.Deps{Store: env.Store, JS: env.JS, Model: cell.ModelClient(env.Config), Contracts: env.Contracts, Log: env.Log, Tel: env.Tel})
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Stop(context.Background()) })

	// What one attempt costs: every item below has the same size, so the
	// same units and the same price.
	item := evalset.Items()[5]
	cal := celltest.CodeReview(item, "budget")
	cal.SourceID = "shop/budget#0"
	_, r := b.Submit(t, cal)
	if v := b.Wait(t, r.WorkID); *v.Outcome != "accepted" {
		t.Fatalf("calibration: %s", *v.Outcome)
	}
	b.WaitLedger(t, "acme", 1)
	one := int64(b.Count(t, `SELECT cost_micros::int FROM ledger WHERE work_id = $1`, r.WorkID))

	if err := env.Store.SeedTenants(ctx, []store.TenantSeed{{ID: "thrifty", HomeRegion: "us", Token: "thrifty-token"}}); err != nil {
		t.Fatal(err)
	}
	// Exactly K attempts fit: K-1 settled at their real cost, and the K-th
	// reserved at its estimate; a (K+1)-th can never be reserved.
	est := estimate(t, b, second, r.WorkID)
	if est < one {
		t.Fatalf("the estimate %d µ$ is below the real cost %d µ$", est, one)
	}
	budget := (k-1)*one + est
	if err := env.Store.SetBudget(ctx, "thrifty", &budget, "month"); err != nil {
		t.Fatal(err)
	}
	// Slow calls keep many reservations in flight at once.
	if err := b.Sim.AddFault(sim.Fault{Kind: sim.FaultLatency, Tenant: "thrifty", Latency: 150 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	b.Token = "thrifty-token"
	ids := make([]string, 3*k)
	for i := range ids {
		req := celltest.CodeReview(item, "budget")
		req.SourceID = fmt.Sprintf("shop/budget#%d", i+1)
		_, r := b.Submit(t, req)
		ids[i] = r.WorkID
	}
	outcomes := map[string]int{}
	for _, id := range ids {
		v := b.Wait(t, id)
		outcomes[*v.Outcome]++
		if *v.Outcome == "budget_exhausted" && len(v.Attempts) != 0 {
			t.Errorf("%s ended budget_exhausted after %d attempts", id, len(v.Attempts))
		}
	}
	calls := b.Calls("thrifty")
	b.WaitLedger(t, "thrifty", int(calls))
	spent := int64(b.Count(t, `SELECT coalesce(sum(cost_micros), 0)::int FROM ledger WHERE tenant_id = 'thrifty'`))
	bud, err := env.Store.CurrentBudget(ctx, "thrifty")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("K=%d, one attempt %d µ$, estimate %d µ$, budget %d µ$, 16 workers, %d items: %d calls, ledger %d µ$, outcomes %v",
		k, one, est, budget, len(ids), calls, spent, outcomes)
	if calls > k {
		t.Errorf("model calls = %d, more than the %d the budget covers", calls, k)
	}
	if calls < k {
		t.Errorf("model calls = %d: budget refused attempts it could cover (%d)", calls, k)
	}
	if spent > budget {
		t.Errorf("ledger total %d µ$ is over the budget of %d µ$", spent, budget)
	}
	if outcomes["accepted"] != int(calls) || outcomes["accepted"]+outcomes["budget_exhausted"] != 3*k {
		t.Errorf("outcomes %v with %d calls; want every call accepted and the rest budget_exhausted", outcomes, calls)
	}
	if bud.ReservedMicros != 0 || bud.SpentMicros != spent || bud.LimitMicros != budget {
		t.Errorf("period %+v; want nothing reserved, spent %d, limit %d", bud, spent, budget)
	}
}

func estimate(t *testing.T, b *celltest.Bundle, s *classifier.Service, workID string) int64 {
	t.Helper()
	w, err := b.Cell.Env.Store.GetWork(context.Background(), workID)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := b.Cell.Env.Contracts.Get(w.Contract)
	return s.Estimate(c, w)
}
