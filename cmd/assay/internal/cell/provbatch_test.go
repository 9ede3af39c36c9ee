package cell_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/price"
	"assay.dev/pkg/store"
	"assay.dev/services/classifier"
	"assay.dev/services/ingress"
)

// batchPrices tell a batch line's charge from a call's: a line costs half.
var batchPrices = func() price.Prices {
	in, out := 0.5, 1.0
	return price.Prices{"*": {Input: 1, Output: 2, BatchInput: &in, BatchOutput: &out}}
}()

// providerBatch is the batch lane through the simulated provider's Batch
// API: a batch forms when lines lines wait, or a second after the oldest
// when fewer do, and is polled every 20ms. Requeued work is announced again
// by the sweeper within a few hundred milliseconds. Which lines share a
// batch depends on when they arrive, so the tests count lines over every
// batch and do not assume a grouping.
func providerBatch(lines int) classifier.ProviderBatch {
	return classifier.ProviderBatch{On: true, MaxLines: lines, Flush: time.Second, PollEvery: 20 * time.Millisecond}
}

// batchCell is a cell whose batch lane goes through the provider's Batch
// API; acme has a budget, so every line is reserved and settled.
func batchCell(t *testing.T, pb classifier.ProviderBatch, maxAttempts int) *celltest.Bundle {
	t.Helper()
	return batchCellFront(t, pb, maxAttempts, nil)
}

// batchCellFront is batchCell with front wrapped around the provider.
func batchCellFront(t *testing.T, pb classifier.ProviderBatch, maxAttempts int, front func(http.Handler) http.Handler) *celltest.Bundle {
	t.Helper()
	b := celltest.SetupFront(t, cell.Options{Prices: batchPrices,
		Classifier: classifier.Config{ProviderBatch: pb, MaxAttempts: maxAttempts,
			BackoffBase: 10 * time.Millisecond, BackoffCap: 20 * time.Millisecond},
		Ingress: ingress.Config{SweepEvery: 50 * time.Millisecond, QueuedFor: 100 * time.Millisecond}}, front)
	if _, err := b.DB.Exec(context.Background(), `UPDATE tenants SET budget_micros = 1000000000000 WHERE id = 'acme'`); err != nil {
		t.Fatal(err)
	}
	return b
}

// submitBatchLane posts one batch-lane code review per title.
func submitBatchLane(t *testing.T, b *celltest.Bundle, titles ...string) []string {
	t.Helper()
	items := evalset.Items()
	var ids []string
	for i, title := range titles {
		req := celltest.CodeReview(items[i%len(items)], title)
		req.SourceID, req.Lane = fmt.Sprintf("shop/batch#%d", i+1), event.Batch
		_, r := b.Submit(t, req)
		ids = append(ids, r.WorkID)
	}
	return ids
}

// attemptsOf are a work item's attempt outcomes in order.
func attemptsOf(t *testing.T, b *celltest.Bundle, workID string) []string {
	t.Helper()
	as, err := b.Cell.Env.Store.Attempts(context.Background(), workID)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range as {
		out = append(out, a.Outcome)
	}
	return out
}

// waitBatches waits until want provider batches (any number when want is
// negative) are all reconciled and returns them, oldest first.
func waitBatches(t *testing.T, b *celltest.Bundle, want int) []store.ProviderBatchRow {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		rows, err := b.Cell.Env.Store.ProviderBatches(context.Background(), 100)
		if err != nil {
			t.Fatal(err)
		}
		done := len(rows) == want || (want < 0 && len(rows) > 0)
		for _, r := range rows {
			done = done && r.State == store.BatchReconciled
		}
		if done {
			slices.Reverse(rows)
			return rows
		}
		if (want >= 0 && len(rows) > want) || time.Now().After(deadline) {
			t.Fatalf("provider batches %+v, want %d reconciled", rows, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkLedger checks what every provider batch test must hold: one ledger
// row per line (each a batch line's attempt, none twice), each priced at
// the batch price, the answered lines' units those the provider billed,
// and estimated rows exactly the missing lines'.
func checkLedger(t *testing.T, b *celltest.Bundle, lines int) {
	t.Helper()
	b.WaitLedger(t, "acme", lines)
	if n := b.Count(t, `SELECT count(*) FROM provider_batch_lines WHERE state = 'reconciled'`); n != lines {
		t.Errorf("%d lines reconciled, want %d", n, lines)
	}
	if n := b.Count(t, `SELECT count(*) FROM ledger l JOIN provider_batch_lines p ON p.attempt_id = l.attempt_id`); n != lines {
		t.Errorf("%d ledger rows are batch lines', want all %d", n, lines)
	}
	if n := b.Count(t, `SELECT count(*) FROM ledger WHERE cost_micros <> round(0.5 * input_units + 1.0 * output_units)`); n != 0 {
		t.Errorf("%d ledger rows not at the batch price", n)
	}
	if n := b.Count(t, `SELECT count(*) FROM ledger l JOIN provider_batch_lines p ON p.attempt_id = l.attempt_id
		WHERE l.estimated <> (p.outcome = 'missing')`); n != 0 {
		t.Errorf("%d ledger rows estimated unless missing, or missing and not estimated", n)
	}
	// Reserved at the batch price and settled from the same price: no
	// line cost more than its reservation, none is left held, and what
	// the budget spent is what the ledger charged.
	if n := b.Count(t, `SELECT count(*) FROM ledger WHERE excess_micros > 0`); n != 0 {
		t.Errorf("%d lines cost more than their reservation", n)
	}
	if n := b.Count(t, `SELECT count(*) FROM budget_reservations WHERE settled_at IS NULL`); n != 0 {
		t.Errorf("%d reservations left unsettled", n)
	}
	if n := b.Count(t, `SELECT count(*) FROM budget_reservations`); n != lines {
		t.Errorf("%d reservations, want one per line (%d)", n, lines)
	}
	if n := b.Count(t, `SELECT count(*) FROM budget_periods p WHERE p.tenant_id = 'acme' AND (p.reserved_micros <> 0
		OR p.spent_micros <> (SELECT sum(cost_micros) FROM ledger WHERE tenant_id = 'acme'))`); n != 0 {
		t.Errorf("the budget's spend is not the ledger's")
	}
	st := b.Sim.Stats().Tenants["acme"]
	var in, out int64
	if err := b.DB.QueryRow(context.Background(), `SELECT coalesce(sum(input_units), 0), coalesce(sum(output_units), 0)
		FROM ledger l JOIN provider_batch_lines p ON p.attempt_id = l.attempt_id WHERE p.outcome = 'answered'`).Scan(&in, &out); err != nil {
		t.Fatal(err)
	}
	if missing := b.Count(t, `SELECT count(*) FROM provider_batch_lines WHERE outcome = 'missing'`); missing == 0 {
		if in != st.PromptUnits || out != st.CompletionUnits {
			t.Errorf("answered lines charged %d/%d units, the provider billed %d/%d", in, out, st.PromptUnits, st.CompletionUnits)
		}
		return
	}
	// A missing line may have run and been billed: it is charged its
	// reservation, so the ledger covers at least what the provider billed.
	if err := b.DB.QueryRow(context.Background(), `SELECT coalesce(sum(input_units), 0), coalesce(sum(output_units), 0)
		FROM ledger l JOIN provider_batch_lines p ON p.attempt_id = l.attempt_id WHERE p.outcome IN ('answered', 'missing')`).Scan(&in, &out); err != nil {
		t.Fatal(err)
	}
	if in < st.PromptUnits || out < st.CompletionUnits {
		t.Errorf("answered and missing lines charged %d/%d units, under the %d/%d the provider billed", in, out, st.PromptUnits, st.CompletionUnits)
	}
}

// reconciled sums how the lines of every batch were reconciled.
func reconciled(rows []store.ProviderBatchRow) (c store.LineCounts, lines int) {
	for _, r := range rows {
		c.Answered += r.Reconciled.Answered
		c.Failed += r.Reconciled.Failed
		c.Expired += r.Reconciled.Expired
		c.Missing += r.Reconciled.Missing
		lines += r.Lines
	}
	return c, lines
}

// waitBatched waits until lines lines are in submitted batches and none
// waits, and returns how many batches hold them.
func waitBatched(t *testing.T, b *celltest.Bundle, lines int) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		batched := b.Count(t, `SELECT count(*) FROM provider_batch_lines l JOIN provider_batches p ON p.id = l.batch_id
			WHERE l.state = 'batched' AND p.state = 'submitted'`)
		if batched == lines && b.Count(t, `SELECT count(*) FROM provider_batch_lines WHERE state = 'pending'`) == 0 {
			return b.Count(t, `SELECT count(*) FROM provider_batches`)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d lines in submitted batches, want %d", batched, lines)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestProviderBatchAcceptsEveryLine(t *testing.T) {
	t.Parallel()
	b := batchCell(t, providerBatch(3), 0)
	ids := submitBatchLane(t, b, "batch one", "batch two", "batch three")
	for _, id := range ids {
		if v := b.Wait(t, id); *v.Outcome != outcome.Accepted {
			t.Fatalf("%s: %s (%s), want accepted", id, *v.Outcome, v.Reason)
		}
		if got := attemptsOf(t, b, id); !slices.Equal(got, []string{outcome.AttemptOK}) {
			t.Errorf("%s: attempts %v", id, got)
		}
	}
	rows := waitBatches(t, b, -1)
	if c, lines := reconciled(rows); c != (store.LineCounts{Answered: 3}) || lines != 3 {
		t.Errorf("batches %+v", rows)
	}
	for _, r := range rows {
		if r.Status != "completed" || r.Requests.Total != r.Lines || r.Requests.Completed != r.Lines {
			t.Errorf("batch %+v", r)
		}
	}
	if st := b.Sim.BatchStats(); st.Batches != len(rows) || st.Lines != 3 || st.Files != len(rows) {
		t.Errorf("provider saw %+v, want the %d batches (one input file each) of three lines", st, len(rows))
	}
	// Once reconciled, the provider keeps no copy of inputs or answers.
	for deadline := time.Now().Add(30 * time.Second); b.Sim.BatchStats().Held != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the provider still holds %d files", b.Sim.BatchStats().Held)
		}
	}
	// Every call was a line: nothing went the interactive way.
	if n := b.Calls("acme"); n != 3 {
		t.Errorf("%d calls, want 3", n)
	}
	checkLedger(t, b, 3)
	if n := b.Count(t, `SELECT count(*) FROM ledger WHERE cost_micros = 0`); n != 0 {
		t.Errorf("%d answered lines charged nothing", n)
	}
}

// The provider writes its answers in the reverse order of the lines: a
// matching by position would hand each work another's review, which the
// gate's correlation refuses. By custom_id each gets its own.
func TestProviderBatchLinesOutOfOrder(t *testing.T) {
	t.Parallel()
	b := batchCell(t, providerBatch(3), 0)
	if err := b.Sim.AddBatchFault(sim.BatchFault{Kind: sim.BatchOutOfOrder}); err != nil {
		t.Fatal(err)
	}
	ids := submitBatchLane(t, b, "order one", "order two", "order three")
	for _, id := range ids {
		if v := b.Wait(t, id); *v.Outcome != outcome.Accepted {
			t.Fatalf("%s: %s (%s), want accepted", id, *v.Outcome, v.Reason)
		}
	}
	// Out of order needs company: at least one batch held several lines.
	if n := b.Count(t, `SELECT coalesce(max(lines), 0) FROM provider_batches`); n < 2 {
		t.Fatalf("the largest batch had %d line; nothing was out of order", n)
	}
	// Each result is the answer of its own work's line.
	if n := b.Count(t, `SELECT count(*) FROM results r JOIN provider_batch_lines p ON p.attempt_id = r.attempt_id
		WHERE p.work_id = r.work_id AND r.output->>'changeId' = r.work_id`); n != 3 {
		t.Errorf("%d of 3 results are their own line's answer", n)
	}
	waitBatches(t, b, -1)
	checkLedger(t, b, 3)
}

// A completed batch without a line for one attempt: that attempt is
// recorded batch_missing and charged its reservation, estimated (it may
// have run and been billed), and its work is tried once more in a batch
// of its own, where it is accepted.
func TestProviderBatchMissingLine(t *testing.T) {
	t.Parallel()
	b := batchCell(t, providerBatch(3), 0)
	if err := b.Sim.AddBatchFault(sim.BatchFault{Kind: sim.BatchMissingLine, Match: "goes missing", Times: 1}); err != nil {
		t.Fatal(err)
	}
	ids := submitBatchLane(t, b, "kept one", "goes missing", "kept two")
	for _, id := range ids {
		if v := b.Wait(t, id); *v.Outcome != outcome.Accepted {
			t.Fatalf("%s: %s (%s), want accepted", id, *v.Outcome, v.Reason)
		}
	}
	if got := attemptsOf(t, b, ids[1]); !slices.Equal(got, []string{outcome.AttemptBatchMissing, outcome.AttemptOK}) {
		t.Errorf("missing line's work: attempts %v", got)
	}
	if c, lines := reconciled(waitBatches(t, b, -1)); c != (store.LineCounts{Answered: 3, Missing: 1}) || lines != 4 {
		t.Errorf("lines reconciled %+v of %d, want 3 answered and 1 missing", c, lines)
	}
	checkLedger(t, b, 4)
	// The missing line's charge is its reservation, at the batch price.
	var cost, reserved int64
	if err := b.DB.QueryRow(context.Background(), `SELECT l.cost_micros, a.estimate_micros FROM ledger l
		JOIN attempts a ON a.id = l.attempt_id WHERE a.outcome = 'batch_missing'`).Scan(&cost, &reserved); err != nil {
		t.Fatal(err)
	}
	if cost != reserved || cost == 0 {
		t.Errorf("missing line charged %d, reserved %d", cost, reserved)
	}
}

// Lines the provider answered with an error: a 500 is retried in a later
// batch and accepted, a 400 ends its work transport_rejected. Each failed
// line is its own ledger row.
func TestProviderBatchFailedLines(t *testing.T) {
	t.Parallel()
	b := batchCell(t, providerBatch(3), 0)
	for _, f := range []sim.Fault{{Kind: sim.FaultServerError, Match: "fails once", Times: 1}, {Kind: sim.FaultReject, Match: "refused line"}} {
		if err := b.Sim.AddFault(f); err != nil {
			t.Fatal(err)
		}
	}
	ids := submitBatchLane(t, b, "fine line", "fails once", "refused line")
	want := []struct {
		outcome  string
		attempts []string
	}{
		{outcome.Accepted, []string{outcome.AttemptOK}},
		{outcome.Accepted, []string{outcome.AttemptTransportError, outcome.AttemptOK}},
		{outcome.TransportRejected, []string{outcome.AttemptTransportRejected}},
	}
	for i, id := range ids {
		if v := b.Wait(t, id); *v.Outcome != want[i].outcome {
			t.Fatalf("%s: %s (%s), want %s", id, *v.Outcome, v.Reason, want[i].outcome)
		}
		if got := attemptsOf(t, b, id); !slices.Equal(got, want[i].attempts) {
			t.Errorf("%s: attempts %v, want %v", id, got, want[i].attempts)
		}
	}
	rows := waitBatches(t, b, -1)
	if c, lines := reconciled(rows); c != (store.LineCounts{Answered: 2, Failed: 2}) || lines != 4 {
		t.Errorf("lines reconciled %+v of %d, want 2 answered and 2 failed", c, lines)
	}
	failedRequests := 0
	for _, r := range rows {
		failedRequests += r.Requests.Failed
	}
	if failedRequests != 2 {
		t.Errorf("the provider counted %d failed requests, want 2", failedRequests)
	}
	checkLedger(t, b, 4)
	if n := b.Calls("acme"); n != 4 {
		t.Errorf("%d calls, want 4 (every line the provider ran)", n)
	}
}

// The provider's batch expires before one line runs, in every batch: that
// line is recorded batch_expired and charged nothing each time, its work
// is tried again within its attempts and then ends retry_exhausted, naming
// the expiry; the other lines of the expired batch are accepted.
func TestProviderBatchExpired(t *testing.T) {
	t.Parallel()
	b := batchCell(t, providerBatch(3), 2)
	if err := b.Sim.AddBatchFault(sim.BatchFault{Kind: sim.BatchExpire, Match: "runs late"}); err != nil {
		t.Fatal(err)
	}
	ids := submitBatchLane(t, b, "on time", "runs late", "also on time")
	for i, id := range ids {
		v := b.Wait(t, id)
		if i != 1 {
			if *v.Outcome != outcome.Accepted {
				t.Fatalf("%s: %s (%s), want accepted", id, *v.Outcome, v.Reason)
			}
			continue
		}
		if *v.Outcome != outcome.RetryExhausted || !strings.Contains(v.Reason, outcome.AttemptBatchExpired) {
			t.Fatalf("late line's work: %s (%s), want retry_exhausted naming batch_expired", *v.Outcome, v.Reason)
		}
		if got := attemptsOf(t, b, id); !slices.Equal(got, []string{outcome.AttemptBatchExpired, outcome.AttemptBatchExpired}) {
			t.Errorf("late line's work: attempts %v", got)
		}
	}
	rows := waitBatches(t, b, -1)
	if c, lines := reconciled(rows); c != (store.LineCounts{Answered: 2, Expired: 2}) || lines != 4 {
		t.Errorf("lines reconciled %+v of %d, want 2 answered and 2 not run", c, lines)
	}
	for _, r := range rows {
		if r.Status != "expired" {
			t.Errorf("batch %+v, want expired", r)
		}
	}
	checkLedger(t, b, 4)
	if n := b.Count(t, `SELECT count(*) FROM ledger l JOIN attempts a ON a.id = l.attempt_id
		WHERE a.outcome = 'batch_expired' AND l.cost_micros = 0 AND NOT l.estimated`); n != 2 {
		t.Errorf("%d expired lines charged nothing, want 2", n)
	}
	if n := b.Calls("acme"); n != 2 {
		t.Errorf("%d calls, want 2: an expired line never ran", n)
	}
}

// The provider created the batch but its answer to the creation was lost:
// the next pass finds it by the row id in its metadata instead of sending
// the lines again.
func TestProviderBatchLostCreationIsFoundNotResent(t *testing.T) {
	t.Parallel()
	b := batchCell(t, providerBatch(2), 0)
	if err := b.Sim.AddBatchFault(sim.BatchFault{Kind: sim.BatchLostCreate, Times: 1}); err != nil {
		t.Fatal(err)
	}
	ids := submitBatchLane(t, b, "lost one", "lost two")
	for _, id := range ids {
		if v := b.Wait(t, id); *v.Outcome != outcome.Accepted {
			t.Fatalf("%s: %s (%s), want accepted", id, *v.Outcome, v.Reason)
		}
	}
	rows := waitBatches(t, b, -1)
	if c, lines := reconciled(rows); c != (store.LineCounts{Answered: 2}) || lines != 2 || rows[0].SubmitTries != 1 {
		t.Errorf("batches %+v, want the first tried twice and two answered lines", rows)
	}
	// One provider batch per row: the lost one was found, not created
	// again.
	if st := b.Sim.BatchStats(); st.Batches != len(rows) || st.Lines != 2 {
		t.Errorf("provider saw %+v, want %d batches of two lines", st, len(rows))
	}
	checkLedger(t, b, 2)
}

// The classifier stops after its batch was submitted and before it was
// reconciled; another classifier of the cell polls the batch from what the
// database holds and reconciles it: nothing is sent again, every line is
// charged once.
func TestProviderBatchResumesAfterRestart(t *testing.T) {
	t.Parallel()
	// The first classifier submits and then would wait an hour to poll.
	slow := providerBatch(3)
	slow.PollEvery = time.Hour
	b := batchCell(t, slow, 0)
	ids := submitBatchLane(t, b, "restart one", "restart two", "restart three")
	batches := waitBatched(t, b, 3)
	ctx := context.Background()
	b.Cell.Classifier.Stop(ctx)
	if n := b.Count(t, `SELECT count(*) FROM provider_batch_lines WHERE state = 'batched'`); n != 3 {
		t.Fatalf("%d lines in submitted batches after the stop, want 3", n)
	}
	// The hour passes.
	if _, err := b.DB.Exec(ctx, `UPDATE provider_batches SET next_poll_at = now()`); err != nil {
		t.Fatal(err)
	}
	env := b.Cell.Env
	next, err := classifier.New(classifier.Config{Region: "us", Names: b.Names(), Streams: env.Config.Streams, Model: env.Config.Model,
		Prices: batchPrices, ProviderBatch: providerBatch(3)},
		classifier.Deps{Store: env.Store, JS: env.JS, Model: cell.ModelClient(env.Config), Contracts: env.Contracts, Log: env.Log, Tel: env.Tel})
	if err != nil {
		t.Fatal(err)
	}
	if err := next.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { next.Stop(context.Background()) })
	for _, id := range ids {
		if v := b.Wait(t, id); *v.Outcome != outcome.Accepted {
			t.Fatalf("%s: %s (%s), want accepted", id, *v.Outcome, v.Reason)
		}
		if got := attemptsOf(t, b, id); !slices.Equal(got, []string{outcome.AttemptOK}) {
			t.Errorf("%s: attempts %v", id, got)
		}
	}
	waitBatches(t, b, batches)
	if st := b.Sim.BatchStats(); st.Batches != batches || st.Lines != 3 {
		t.Errorf("provider saw %+v, want the %d batches submitted before the restart, three lines", st, batches)
	}
	checkLedger(t, b, 3)
}

// The provider fails a batch's validation: none of its lines ran, each is
// recorded batch_expired and charged nothing, and the work is sent again
// in a later batch and accepted.
func TestProviderBatchFailedValidation(t *testing.T) {
	t.Parallel()
	b := batchCell(t, providerBatch(2), 0)
	if err := b.Sim.AddBatchFault(sim.BatchFault{Kind: sim.BatchFail, Times: 1}); err != nil {
		t.Fatal(err)
	}
	ids := submitBatchLane(t, b, "refused batch one", "refused batch two")
	for _, id := range ids {
		if v := b.Wait(t, id); *v.Outcome != outcome.Accepted {
			t.Fatalf("%s: %s (%s), want accepted", id, *v.Outcome, v.Reason)
		}
	}
	rows := waitBatches(t, b, -1)
	if rows[0].Status != "failed" || rows[0].Errors != "invalid_request" || rows[0].Reconciled.Expired != rows[0].Lines {
		t.Errorf("first batch %+v, want failed naming invalid_request with every line not run", rows[0])
	}
	c, lines := reconciled(rows)
	if c != (store.LineCounts{Answered: 2, Expired: rows[0].Lines}) {
		t.Errorf("lines reconciled %+v of %d", c, lines)
	}
	// The lines of the failed batch were tried twice, any other once.
	retried := 0
	for _, id := range ids {
		switch got := attemptsOf(t, b, id); {
		case slices.Equal(got, []string{outcome.AttemptBatchExpired, outcome.AttemptOK}):
			retried++
		case !slices.Equal(got, []string{outcome.AttemptOK}):
			t.Errorf("%s: attempts %v", id, got)
		}
	}
	if retried != rows[0].Lines {
		t.Errorf("%d works tried again, want the failed batch's %d", retried, rows[0].Lines)
	}
	checkLedger(t, b, lines)
	if n := b.Calls("acme"); n != 2 {
		t.Errorf("%d calls, want 2: the failed batch ran nothing", n)
	}
}

// Off, the default: batch-lane work is called one attempt at a time, and
// nothing reaches the Batch API.
func TestProviderBatchOffCallsDirectly(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	ids := submitBatchLane(t, b, "direct")
	if v := b.Wait(t, ids[0]); *v.Outcome != outcome.Accepted {
		t.Fatalf("%s (%s), want accepted", *v.Outcome, v.Reason)
	}
	if st := b.Sim.BatchStats(); st != (sim.BatchStats{}) {
		t.Errorf("the Batch API was used: %+v", st)
	}
	if n := b.Count(t, `SELECT count(*) FROM provider_batch_lines`); n != 0 {
		t.Errorf("%d batch lines written", n)
	}
	if n := b.Calls("acme"); n != 1 {
		t.Errorf("%d calls, want 1", n)
	}
}

// A Batch API that refuses the upload for good: nothing was sent, so each
// line's work ends transport_rejected with its attempt charged nothing,
// and the batch says why it was never submitted.
func TestProviderBatchRefusedUpload(t *testing.T) {
	t.Parallel()
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error":{"message":"Unknown request URL","type":"invalid_request_error"}}`))
	}))
	t.Cleanup(refuse.Close)
	pb := providerBatch(2)
	pb.URL = refuse.URL
	b := batchCell(t, pb, 0)
	ids := submitBatchLane(t, b, "refused upload one", "refused upload two")
	for _, id := range ids {
		if v := b.Wait(t, id); *v.Outcome != outcome.TransportRejected || !strings.Contains(v.Reason, "HTTP 404") {
			t.Fatalf("%s: %s (%s), want transport_rejected naming the 404", id, *v.Outcome, v.Reason)
		}
	}
	rows := waitBatches(t, b, -1)
	for _, r := range rows {
		if r.ProviderID != "" || !strings.Contains(r.Errors, "HTTP 404") {
			t.Errorf("batch %+v, want never submitted, naming the 404", r)
		}
	}
	b.WaitLedger(t, "acme", 2)
	if n := b.Count(t, `SELECT count(*) FROM ledger WHERE cost_micros = 0 AND NOT estimated`); n != 2 {
		t.Errorf("%d of 2 unsent lines charged nothing", n)
	}
	if n := b.Count(t, `SELECT count(*) FROM provider_batch_lines WHERE outcome = 'unsent'`); n != 2 {
		t.Errorf("%d of 2 lines recorded unsent", n)
	}
	if n := b.Calls("acme"); n != 0 {
		t.Errorf("%d calls, want none", n)
	}
}

// Two classifiers of the cell poll and reconcile the same batches at once:
// every line is sent once and recorded once.
func TestProviderBatchTwoClassifiersReconcileOnce(t *testing.T) {
	t.Parallel()
	b := batchCell(t, providerBatch(4), 0)
	if err := b.Sim.AddBatchFault(sim.BatchFault{Kind: sim.BatchOutOfOrder}); err != nil {
		t.Fatal(err)
	}
	env, ctx := b.Cell.Env, context.Background()
	second, err := classifier.New(classifier.Config{Region: "us", Names: b.Names(), Streams: env.Config.Streams, Model: env.Config.Model,
		Prices: batchPrices, ProviderBatch: providerBatch(4)},
		classifier.Deps{Store: env.Store, JS: env.JS, Model: cell.ModelClient(env.Config), Contracts: env.Contracts, Log: env.Log, Tel: env.Tel})
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Stop(context.Background()) })
	ids := submitBatchLane(t, b, "pair one", "pair two", "pair three", "pair four", "pair five", "pair six", "pair seven", "pair eight")
	for _, id := range ids {
		if v := b.Wait(t, id); *v.Outcome != outcome.Accepted {
			t.Fatalf("%s: %s (%s), want accepted", id, *v.Outcome, v.Reason)
		}
		if got := attemptsOf(t, b, id); !slices.Equal(got, []string{outcome.AttemptOK}) {
			t.Errorf("%s: attempts %v", id, got)
		}
	}
	rows := waitBatches(t, b, -1)
	if c, lines := reconciled(rows); c != (store.LineCounts{Answered: 8}) || lines != 8 {
		t.Errorf("lines reconciled %+v of %d", c, lines)
	}
	if st := b.Sim.BatchStats(); st.Batches != len(rows) || st.Lines != 8 {
		t.Errorf("provider saw %+v, want %d batches of 8 lines in all", st, len(rows))
	}
	checkLedger(t, b, 8)
}

// The provider's answer to a creation is lost and its list of batches
// cannot be read: the batch may exist and run, and cannot be found. Its
// lines are charged their reservations as missing, never as unsent, and
// their work goes in a new batch.
func TestProviderBatchUnfoundCreationIsChargedAsMissing(t *testing.T) {
	t.Parallel()
	noList := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && r.URL.Path == "/v1/batches" {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadGateway)
				_, _ = w.Write([]byte(`{"error":{"message":"upstream unavailable","type":"server_error"}}`))
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	pb := providerBatch(2)
	pb.SubmitTries = 2
	b := batchCellFront(t, pb, 0, noList)
	if err := b.Sim.AddBatchFault(sim.BatchFault{Kind: sim.BatchLostCreate, Times: 1}); err != nil {
		t.Fatal(err)
	}
	ids := submitBatchLane(t, b, "unfound one", "unfound two")
	for _, id := range ids {
		if v := b.Wait(t, id); *v.Outcome != outcome.Accepted {
			t.Fatalf("%s: %s (%s), want accepted", id, *v.Outcome, v.Reason)
		}
	}
	rows := waitBatches(t, b, -1)
	if !strings.HasPrefix(rows[0].Errors, "it may have been created") || rows[0].ProviderID != "" || rows[0].Reconciled.Missing != rows[0].Lines {
		t.Errorf("first batch %+v, want abandoned with every line missing", rows[0])
	}
	c, lines := reconciled(rows)
	if c != (store.LineCounts{Answered: 2, Missing: rows[0].Lines}) {
		t.Errorf("lines reconciled %+v of %d", c, lines)
	}
	checkLedger(t, b, lines)
	if n := b.Count(t, `SELECT count(*) FROM ledger l JOIN attempts a ON a.id = l.attempt_id
		WHERE a.outcome = 'batch_missing' AND l.estimated AND l.cost_micros = a.estimate_micros AND l.cost_micros > 0`); n != rows[0].Lines {
		t.Errorf("%d abandoned lines charged their reservation, want %d", n, rows[0].Lines)
	}
	// The lost batch was created once and never again.
	if st := b.Sim.BatchStats(); st.Batches != len(rows) {
		t.Errorf("provider saw %+v, want %d batches", st, len(rows))
	}
}
