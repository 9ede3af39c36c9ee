package cell_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/usage"
	"assay.dev/services/classifier"
)

// One answer of 5 MiB ends its work schema_rejected with its real size in
// the reason, and the next item in the same cell is accepted in normal
// time: no event carries the answer, so none is too large to publish, and
// nothing is set aside.
func TestHugeAnswerDoesNotStopTheCell(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	const size = 5 << 20
	if err := b.Sim.AddFault(sim.Fault{Kind: sim.FaultHuge, Tenant: "acme", Match: "huge answer", Times: 2, Size: size}); err != nil {
		t.Fatal(err)
	}
	items := evalset.Items()
	_, huge := b.Submit(t, celltest.CodeReview(items[0], "huge answer"))
	v := b.Wait(t, huge.WorkID)
	if *v.Outcome != outcome.SchemaRejected || !strings.Contains(v.Reason, "syntax.too_large") {
		t.Fatalf("huge answer: %s (%s), want schema_rejected syntax.too_large", *v.Outcome, v.Reason)
	}
	// The real size, not the 1 MiB the adapter read.
	if !strings.Contains(v.Reason, "output is 52") {
		t.Fatalf("reason %q does not give the real size of about %d bytes", v.Reason, size)
	}
	start := time.Now()
	_, next := b.Submit(t, celltest.CodeReview(items[1], "the next item"))
	if v := b.Wait(t, next.WorkID); *v.Outcome != outcome.Accepted {
		t.Fatalf("next item: %s (%s), want accepted", *v.Outcome, v.Reason)
	}
	t.Logf("the next item was accepted %s after it was submitted", time.Since(start).Round(time.Millisecond))
	if n := b.Count(t, `SELECT count(*) FROM outbox_waiting WHERE set_aside_at IS NOT NULL OR tries > 0`); n != 0 {
		t.Fatalf("%d outbox rows failed to publish", n)
	}
	if n := b.Count(t, `SELECT max(length(payload)) FROM outbox`); n > 4096 {
		t.Fatalf("an event of %d bytes: events carry no answers", n)
	}
	b.WaitLedger(t, "acme", 3)
}

// A call that left and never answered is charged the request's estimate,
// marked estimated in the ledger and in GET /v1/usage; one that never left
// costs nothing.
func TestUnansweredCallIsChargedItsEstimate(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{Classifier: classifier.Config{CallTimeout: 300 * time.Millisecond, MaxAttempts: 1}})
	if err := b.Sim.AddFault(sim.Fault{Kind: sim.FaultHang, Tenant: "acme", Match: "never answers", Times: 1}); err != nil {
		t.Fatal(err)
	}
	_, r := b.Submit(t, celltest.CodeReview(evalset.Items()[2], "never answers"))
	if v := b.Wait(t, r.WorkID); *v.Outcome != outcome.RetryExhausted {
		t.Fatalf("outcome %s (%s), want retry_exhausted", *v.Outcome, v.Reason)
	}
	b.WaitLedger(t, "acme", 1)
	var units, cost int64
	var estimated bool
	var o string
	if err := b.DB.QueryRow(t.Context(), `SELECT outcome, input_units, cost_micros, estimated FROM ledger WHERE work_id = $1`,
		r.WorkID).Scan(&o, &units, &cost, &estimated); err != nil {
		t.Fatal(err)
	}
	if o != outcome.AttemptTimeout || units <= 0 || cost <= 0 || !estimated {
		t.Fatalf("ledger row: %s, %d units, %d micros, estimated %v; want a timeout charged its estimate", o, units, cost, estimated)
	}
	rep := usageOf(t, b)
	if rep.EstimatedCalls != 1 || rep.EstimatedCostMicros != cost || rep.CostMicros != cost {
		t.Fatalf("usage %+v, want the estimate counted apart", rep)
	}
}

func usageOf(t *testing.T, b *celltest.Bundle) usage.Report {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, b.Cell.URL+"/v1/usage", nil)
	req.Header.Set("Authorization", "Bearer "+b.Token)
	resp, err := b.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rep usage.Report
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("usage: HTTP %d %v", resp.StatusCode, err)
	}
	return rep
}
