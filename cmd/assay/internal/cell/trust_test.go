package cell_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/host"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/price"
	"assay.dev/services/classifier"
	"assay.dev/services/ingress"
)

// A provider that answers under a dated name is priced at the model asked
// for, the one the budget was reserved at: with a table that prices unknown
// names forty times higher, spend stays within the budget, and the ledger
// keeps the served name beside the priced one.
func TestRenamingProviderStaysInBudget(t *testing.T) {
	t.Parallel()
	prices := price.Prices{sim.DefaultModel: {Input: 0.15, Output: 0.60}, "*": {Input: 10, Output: 40}}
	b := celltest.Setup(t, cell.Options{Prices: prices, Classifier: classifier.Config{MaxOutputUnits: 512, BytesPerUnit: 4}})
	ctx := context.Background()
	if err := b.Sim.AddFault(sim.Fault{Kind: sim.FaultRenamed, Tenant: "acme"}); err != nil {
		t.Fatal(err)
	}
	item := evalset.Items()[5]
	req := func(i int) ingress.SubmitRequest {
		r := celltest.CodeReview(item, "renamed")
		r.SourceID = fmt.Sprintf("shop/renamed#%d", i)
		return r
	}
	_, first := b.Submit(t, req(0))
	if v := b.Wait(t, first.WorkID); *v.Outcome != outcome.Accepted {
		t.Fatalf("first item: %s (%s)", *v.Outcome, v.Reason)
	}
	est := b.Count(t, `SELECT estimate_micros::int FROM attempts WHERE work_id = $1`, first.WorkID)
	b.WaitLedger(t, "acme", 1)
	// A budget period starts empty: room for three attempts at their
	// estimate, about eight at the price of the model asked for.
	limit := int64(3 * est)
	if err := b.Cell.Env.Store.SetBudget(ctx, "acme", &limit, "month"); err != nil {
		t.Fatal(err)
	}
	outcomes := map[string]int{}
	const n = 10
	for i := 1; i <= n; i++ {
		_, r := b.Submit(t, req(i))
		outcomes[*b.Wait(t, r.WorkID).Outcome]++
	}
	calls := b.Calls("acme")
	b.WaitLedger(t, "acme", int(calls))
	bud, err := b.Cell.Env.Store.CurrentBudget(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	excess := int64(b.Count(t, `SELECT coalesce(max(excess_micros), 0)::int FROM ledger WHERE tenant_id = 'acme'`))
	t.Logf("estimate %d µ$, budget %d µ$, %d calls, spent %d µ$, largest excess %d µ$, outcomes %v",
		est, limit, calls, bud.SpentMicros, excess, outcomes)
	if bud.SpentMicros > limit || excess != 0 || bud.ReservedMicros != 0 {
		t.Errorf("period %+v, largest excess %d µ$, against a budget of %d µ$", bud, excess, limit)
	}
	if outcomes[outcome.Accepted] != int(calls)-1 || outcomes[outcome.Accepted]+outcomes[outcome.BudgetExhausted] != n ||
		outcomes[outcome.BudgetExhausted] == 0 {
		t.Errorf("outcomes %v after %d calls, want every call accepted and the budget to run out", outcomes, calls)
	}
	if n := b.Count(t, `SELECT count(*) FROM ledger WHERE tenant_id = 'acme' AND model = $1 AND served_model = $2`,
		sim.DefaultModel, sim.DefaultModel+sim.DatedSuffix); n != int(calls) {
		t.Errorf("%d of %d ledger rows priced as %s with the served name beside it", n, calls, sim.DefaultModel)
	}
}

// An attempt that costs more than its reservation (a provider that ignores
// max_tokens) is spent in full with the excess recorded, and once the
// spend passes the limit the tenant's next reservation is refused: spend
// ends within the limit plus that one attempt's excess.
func TestExcessOverReservationIsRecordedAndRefusesTheNext(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{Classifier: classifier.Config{MaxOutputUnits: 512, BytesPerUnit: 4, MaxRepairs: 1}})
	ctx := context.Background()
	item := evalset.Items()[5]
	_, first := b.Submit(t, celltest.CodeReview(item, "calibrate"))
	if v := b.Wait(t, first.WorkID); *v.Outcome != outcome.Accepted {
		t.Fatalf("first item: %s (%s)", *v.Outcome, v.Reason)
	}
	b.WaitLedger(t, "acme", 1)
	est := int64(b.Count(t, `SELECT estimate_micros::int FROM attempts WHERE work_id = $1`, first.WorkID))
	// Room for three attempts at their estimate.
	limit := 3 * est
	if err := b.Cell.Env.Store.SetBudget(ctx, "acme", &limit, "month"); err != nil {
		t.Fatal(err)
	}
	// 256 KiB of answer is about 64 Ki units against a cap of 512.
	if err := b.Sim.AddFault(sim.Fault{Kind: sim.FaultHuge, Tenant: "acme", Match: "runs long", Times: 1, Size: 256 << 10}); err != nil {
		t.Fatal(err)
	}
	_, long := b.Submit(t, celltest.CodeReview(evalset.Items()[6], "runs long"))
	b.Wait(t, long.WorkID)
	_, next := b.Submit(t, celltest.CodeReview(evalset.Items()[7], "after the excess"))
	v := b.Wait(t, next.WorkID)
	calls := b.Calls("acme")
	b.WaitLedger(t, "acme", int(calls))
	var excess, cost int64
	if err := b.DB.QueryRow(ctx, `SELECT excess_micros, cost_micros FROM ledger WHERE work_id = $1 AND excess_micros > 0`,
		long.WorkID).Scan(&excess, &cost); err != nil {
		t.Fatalf("no ledger row of the long answer records an excess: %v", err)
	}
	bud, err := b.Cell.Env.Store.CurrentBudget(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	spent := bud.SpentMicros
	t.Logf("estimate %d µ$, budget %d µ$, long answer cost %d µ$ (excess %d µ$), spent %d µ$, next item %s",
		est, limit, cost, excess, spent, *v.Outcome)
	if *v.Outcome != outcome.BudgetExhausted || len(v.Attempts) != 0 {
		t.Errorf("the item after the excess: %s after %d attempts, want budget_exhausted without a call", *v.Outcome, len(v.Attempts))
	}
	if spent > limit+excess || bud.ReservedMicros != 0 {
		t.Errorf("spent %d µ$, period %+v, against a limit of %d µ$ plus one excess of %d µ$", spent, bud, limit, excess)
	}
}

// Usage no call can have (negative prompt units, a completion count past
// every bound) is not copied into the ATTEMPT event: the attempt gets its
// ledger row, marked estimated and charged its reservation's estimate, and
// the reservation is settled.
func TestImplausibleUsageIsChargedAsEstimated(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{Classifier: classifier.Config{MaxOutputUnits: 512, BytesPerUnit: 4}})
	ctx := context.Background()
	limit := int64(1_000_000)
	if err := b.Cell.Env.Store.SetBudget(ctx, "acme", &limit, "month"); err != nil {
		t.Fatal(err)
	}
	if err := b.Sim.AddFault(sim.Fault{Kind: sim.FaultBadUsage, Tenant: "acme", Times: 1}); err != nil {
		t.Fatal(err)
	}
	_, r := b.Submit(t, celltest.CodeReview(evalset.Items()[3], "bad usage"))
	if v := b.Wait(t, r.WorkID); *v.Outcome != outcome.Accepted {
		t.Fatalf("outcome %s (%s), want accepted: the answer itself is fine", *v.Outcome, v.Reason)
	}
	b.WaitLedger(t, "acme", 1)
	var in, out, cost, est int64
	var estimated bool
	if err := b.DB.QueryRow(ctx, `SELECT l.input_units, l.output_units, l.cost_micros, l.estimated, a.estimate_micros
		FROM ledger l JOIN attempts a ON a.id = l.attempt_id WHERE l.work_id = $1`, r.WorkID).
		Scan(&in, &out, &cost, &estimated, &est); err != nil {
		t.Fatal(err)
	}
	t.Logf("ledger: %d input units, %d output units, %d µ$ (estimate %d µ$), estimated %v", in, out, cost, est, estimated)
	if !estimated || in <= 0 || out != 512 || cost != est {
		t.Errorf("ledger row %d/%d units, %d µ$, estimated %v; want the estimate of %d µ$, marked estimated", in, out, cost, estimated, est)
	}
	bud, err := b.Cell.Env.Store.CurrentBudget(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if bud.ReservedMicros != 0 || bud.SpentMicros != cost {
		t.Errorf("period %+v: want nothing reserved and the estimate spent", bud)
	}
}

// slowRequest writes head, then body one byte per tick, and reports what
// came back, when the server answered or closed the connection, and how
// many bytes of body it had been sent by then.
func slowRequest(t *testing.T, addr, head string, body []byte, tick time.Duration) (string, time.Duration, int) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	answered := make(chan []byte, 1)
	go func() {
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		b, _ := io.ReadAll(conn)
		answered <- b
	}()
	sent := 0
	for _, c := range body {
		select {
		case b := <-answered:
			return string(b), time.Since(start), sent
		case <-time.After(tick):
		}
		if _, err := conn.Write([]byte{c}); err != nil {
			break
		}
		sent++
	}
	b := <-answered
	return string(b), time.Since(start), sent
}

// A client without a credential is answered before it sends its body, and
// one that sends its body a byte at a time is cut off at the server's read
// timeout, not held for as long as it likes.
func TestSlowBodiesAreCut(t *testing.T) {
	t.Parallel()
	const readTimeout = time.Second
	// Whether the server waited for a body is told by the bytes of it sent
	// before the answer, a byte every 20s; and a cut by the time it came,
	// with room for a loaded machine: uncut, the slow bodies below would
	// hold the connection for 300s.
	const (
		never = 20 * time.Second
		slack = 10 * time.Second
	)
	b := celltest.Setup(t, cell.Options{HTTP: host.Limits{Read: readTimeout}})
	addr := strings.TrimPrefix(b.Cell.URL, "http://")
	body := bytes.Repeat([]byte("x"), 1000)
	hook := func(extra string) string {
		return "POST /v1/webhooks/github HTTP/1.1\r\nHost: assay\r\nContent-Type: application/json\r\n" +
			"X-GitHub-Event: pull_request\r\nX-GitHub-Delivery: d-slow\r\n" + extra + "Content-Length: 1000000\r\n\r\n"
	}
	got, took, sent := slowRequest(t, addr, hook(""), body, never)
	t.Logf("no signature: answered in %s", took.Round(time.Millisecond))
	if !strings.HasPrefix(got, "HTTP/1.1 401") || sent != 0 {
		t.Errorf("a delivery without a signature was answered after %d bytes of its body with %.60q; want 401 before any", sent, got)
	}
	got, took, _ = slowRequest(t, addr, hook("X-Hub-Signature-256: sha256="+strings.Repeat("0", 64)+"\r\n"), body, 300*time.Millisecond)
	t.Logf("signed, slow body: ended after %s with %.40q", took.Round(time.Millisecond), got)
	if !strings.HasPrefix(got, "HTTP/1.1 408") {
		t.Errorf("a slow delivery was answered %.40q, want 408", got)
	}
	if took > readTimeout+slack {
		t.Errorf("a slow signed delivery held the connection %s, past the %s read timeout", took, readTimeout)
	}
	got, took, _ = slowRequest(t, addr, "POST /v1/work HTTP/1.1\r\nHost: assay\r\nContent-Type: application/json\r\n"+
		"Authorization: Bearer "+b.Token+"\r\nContent-Length: 900000\r\n\r\n", body, 300*time.Millisecond)
	t.Logf("API, slow body: ended after %s with %.40q", took.Round(time.Millisecond), got)
	if took > readTimeout+slack {
		t.Errorf("a slow API request held the connection %s, past the %s read timeout", took, readTimeout)
	}
	got, took, sent = slowRequest(t, addr, "POST /v1/work HTTP/1.1\r\nHost: assay\r\nContent-Type: application/json\r\n"+
		"Authorization: Bearer "+b.Token+"\r\nContent-Length: 5000000\r\n\r\n", body, never)
	if !strings.HasPrefix(got, "HTTP/1.1 413") || sent != 0 {
		t.Errorf("a body declared over the limit was answered after %s and %d bytes of it with %.60q; want 413 before any", took, sent, got)
	}
}
