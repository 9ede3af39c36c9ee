package cell_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/devkit/evalset"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/services/ingress"
)

// Transport faults: each ends as its outcome says, every call is a ledger
// row, and a retry waits at least the Retry-After the provider gave.
func TestTransportFaults(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	cases := []struct {
		fault    sim.Fault
		outcome  string
		attempts []string // attempt outcomes in order
		deadline int
	}{
		{sim.Fault{Kind: sim.FaultRateLimit, RetryAfter: time.Second, Times: 1}, "accepted", []string{"rate_limited", "ok"}, 0},
		{sim.Fault{Kind: sim.FaultServerError, Times: 1}, "accepted", []string{"transport_error", "ok"}, 0},
		{sim.Fault{Kind: sim.FaultReject, Times: 1}, "transport_rejected", []string{"transport_rejected"}, 0},
		{sim.Fault{Kind: sim.FaultExtraProperty, Times: 1}, "accepted", []string{"invalid_output", "ok"}, 0},
		// The deadline is enforced on the caller's side: a hanging provider
		// is cut off when the work's deadline arrives.
		{sim.Fault{Kind: sim.FaultHang, Times: 1}, "retry_exhausted", []string{"timeout"}, 2},
	}
	ids := make([]string, len(cases))
	for i, tc := range cases {
		title := "transport case " + tc.fault.Kind
		tc.fault.Tenant, tc.fault.Match = "acme", title
		if err := b.Sim.AddFault(tc.fault); err != nil {
			t.Fatal(err)
		}
		req := celltest.CodeReview(evalset.Items()[3], title)
		req.SourceID = "shop/transport#" + tc.fault.Kind
		req.DeadlineSeconds = tc.deadline
		_, r := b.Submit(t, req)
		ids[i] = r.WorkID
	}
	total := 0
	for i, tc := range cases {
		t.Run(tc.fault.Kind, func(t *testing.T) {
			v := b.Wait(t, ids[i])
			if *v.Outcome != tc.outcome {
				t.Fatalf("outcome %s (%s), want %s", *v.Outcome, v.Reason, tc.outcome)
			}
			var got []string
			for _, a := range v.Attempts {
				got = append(got, a.Outcome)
			}
			if strings.Join(got, ",") != strings.Join(tc.attempts, ",") {
				t.Fatalf("attempts %v, want %v", got, tc.attempts)
			}
			if tc.fault.Kind == sim.FaultRateLimit {
				gap := v.Attempts[1].StartedAt.Sub(*v.Attempts[0].FinishedAt)
				if gap < tc.fault.RetryAfter {
					t.Errorf("retried %s after a 429 that asked for %s", gap, tc.fault.RetryAfter)
				}
			}
			if tc.fault.Kind == sim.FaultHang && !strings.Contains(v.Reason, "deadline") {
				t.Errorf("reason %q does not mention the deadline", v.Reason)
			}
		})
		total += len(tc.attempts)
	}
	b.WaitLedger(t, "acme", total)
	if n := b.Calls("acme"); n != int64(total) {
		t.Errorf("model calls %d, ledger rows %d", n, total)
	}
	if n := b.Count(t, `SELECT count(*) FROM ledger WHERE outcome = 'rate_limited'`); n != 1 {
		t.Errorf("rate-limited attempts in the ledger = %d, want 1", n)
	}
}

// A worker that claimed work and died: its lease lapses, the sweeper
// announces the work again under a new dispatch number, and another worker
// finishes it.
func TestSweeperRecoversAbandonedClaim(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{NoClassifier: true, Ingress: ingress.Config{
		SweepEvery: 100 * time.Millisecond, LeaseGrace: 100 * time.Millisecond}})
	_, r := b.Submit(t, celltest.CodeReview(evalset.Items()[4], "abandoned"))
	ctx := context.Background()
	// The dead worker: it took the lease and was never heard of again.
	if _, ok, err := b.Cell.Env.Store.Claim(ctx, r.WorkID, "00000000-0000-4000-8000-000000000001",
		"00000000-0000-4000-8000-000000000002", 2*time.Second, 0); err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	if err := b.Cell.Classifier.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Cell.Classifier.Stop(context.Background()) })
	v := b.Wait(t, r.WorkID)
	if *v.Outcome != "accepted" {
		t.Fatalf("outcome %s (%s), want accepted", *v.Outcome, v.Reason)
	}
	if n := b.Count(t, `SELECT dispatch FROM work WHERE id = $1`, r.WorkID); n < 2 {
		t.Errorf("dispatch = %d, want a re-announcement", n)
	}
	if n := b.Calls("acme"); n != 1 {
		t.Errorf("model calls = %d, want 1", n)
	}
	if len(v.Attempts) != 2 || v.Attempts[0].Outcome != "lease_expired" || v.Attempts[1].Outcome != "ok" {
		t.Errorf("attempts %+v, want the abandoned one lease_expired, then ok", v.Attempts)
	}
}
