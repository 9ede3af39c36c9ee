package cell_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/contract"
	"assay.dev/pkg/diff"
	"assay.dev/pkg/event"
	"assay.dev/pkg/store"
	"assay.dev/services/classifier"
	"assay.dev/services/committer/publish"
	"assay.dev/services/ingress"
)

// partUnits is the part size the tests cut their diffs at: a few kilobytes,
// so a diff of forty files is about ten parts.
const partUnits = 1500

// largeDiff is a pull request of n new Go files of twenty-four lines each;
// every third file builds SQL by concatenation on its line 12 (the reviewer's
// blocking finding), every tenth is a test, and a go.sum change comes last.
func largeDiff(n int) string {
	var b strings.Builder
	for i := range n {
		name := fmt.Sprintf("svc/orders%02d.go", i)
		if i%10 == 9 {
			name = fmt.Sprintf("svc/orders%02d_test.go", i)
		}
		fmt.Fprintf(&b, "diff --git a/%s b/%s\nnew file mode 100644\n--- /dev/null\n+++ b/%s\n@@ -0,0 +1,24 @@\n", name, name, name)
		for l := 1; l <= 24; l++ {
			if l == 12 && i%3 == 0 {
				fmt.Fprintf(&b, "+\tq := \"SELECT * FROM orders WHERE id = \" + id%d\n", i)
				continue
			}
			fmt.Fprintf(&b, "+\tcount%d_%d := step(%d, %d) // moves the order along\n", i, l, i, l)
		}
	}
	b.WriteString("diff --git a/go.sum b/go.sum\n--- a/go.sum\n+++ b/go.sum\n@@ -1,1 +1,2 @@\n example.com/a v1.0.0 h1:abc=\n+example.com/b v1.2.0 h1:def=\n")
	return b.String()
}

// partsCell is a cell whose classifier cuts code reviews at partUnits,
// with c's other settings.
func partsCell(t *testing.T, c classifier.Config) *celltest.Bundle {
	t.Helper()
	c.PartUnits = partUnits
	return celltest.Setup(t, cell.Options{Classifier: c})
}

// planOf is how a cell cuts text.
func planOf(t *testing.T, text string) *diff.Plan {
	t.Helper()
	r, err := contract.Load()
	if err != nil {
		t.Fatal(err)
	}
	c, _ := r.Get("code-review")
	d, err := diff.Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	p, err := diff.Split(d, partUnits, c.Parts.BytesPerUnit)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func submitLarge(t *testing.T, b *celltest.Bundle, text, source string) ingress.WorkView {
	t.Helper()
	in, _ := json.Marshal(map[string]string{"diff": text, "title": "a large change"})
	status, r := b.Submit(t, ingress.SubmitRequest{Contract: "code-review", SourceID: source, Revision: strings.Repeat("ab", 20), Input: in})
	if status >= 300 {
		t.Fatalf("submit: status %d", status)
	}
	return b.Wait(t, r.WorkID)
}

// dryPlan waits for the work's dry publication and returns its plan.
func dryPlan(t *testing.T, b *celltest.Bundle, id string) publish.Plan {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var raw []byte
		err := b.DB.QueryRow(context.Background(), `SELECT plan FROM publications WHERE work_id = $1 AND target = 'dry'`, id).Scan(&raw)
		if err == nil {
			var p publish.Plan
			if err := json.Unmarshal(raw, &p); err != nil {
				t.Fatal(err)
			}
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("no dry publication of %s: %v", id, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func coverageOf(t *testing.T, v ingress.WorkView) diff.Coverage {
	t.Helper()
	if v.Result == nil || len(v.Result.Coverage) == 0 {
		t.Fatalf("result %+v has no coverage", v.Result)
	}
	var cv diff.Coverage
	if err := json.Unmarshal(v.Result.Coverage, &cv); err != nil {
		t.Fatal(err)
	}
	return cv
}

// callsAndLedger checks that every call of the work is one attempt row and
// one ledger row, and the tenant's model calls its attempt rows with a
// call (its work is reviewed in parts), and returns how many calls the
// work made and what the ledger charged for them.
func callsAndLedger(t *testing.T, b *celltest.Bundle, id string) (calls int, cost int64) {
	t.Helper()
	calls = b.Count(t, `SELECT count(*) FROM attempts WHERE work_id = $1 AND call IS NOT NULL`, id)
	all := b.Count(t, `SELECT count(*) FROM attempts WHERE tenant_id = $1 AND call IS NOT NULL`, b.Tenant)
	b.WaitLedger(t, b.Tenant, all)
	if n := b.Calls(b.Tenant); int(n) != all {
		t.Errorf("model calls = %d, attempt rows with a call = %d", n, all)
	}
	if n := b.Count(t, `SELECT count(*) FROM ledger WHERE work_id = $1`, id); n != calls {
		t.Errorf("ledger rows = %d, calls = %d", n, calls)
	}
	if err := b.DB.QueryRow(context.Background(), `SELECT coalesce(sum(cost_micros), 0) FROM ledger WHERE work_id = $1`, id).Scan(&cost); err != nil {
		t.Fatal(err)
	}
	return calls, cost
}

// A forty-file diff over the part size is reviewed in parts, riskiest files
// first and the lock file skipped: one call per part, one result whose
// findings are every part's, one check run and a comment at each finding's
// line.
func TestReviewInParts(t *testing.T) {
	t.Parallel()
	b := partsCell(t, classifier.Config{})
	text := largeDiff(40)
	plan := planOf(t, text)
	if len(plan.Parts) < 8 {
		t.Fatalf("the diff is cut into %d parts; the test wants many", len(plan.Parts))
	}
	v := submitLarge(t, b, text, "acme/shop#41")
	if *v.Outcome != "accepted" {
		t.Fatalf("outcome %s (%s), want accepted", *v.Outcome, v.Reason)
	}
	cv := coverageOf(t, v)
	if cv.Partial || cv.Parts != len(plan.Parts) || len(cv.Reviewed) != len(plan.Parts) || len(cv.Left) != 0 {
		t.Fatalf("coverage %+v; want all %d parts reviewed", cv, len(plan.Parts))
	}
	if len(cv.Skipped) != 1 || cv.Skipped[0].Path != "go.sum" {
		t.Errorf("skipped %+v, want go.sum", cv.Skipped)
	}
	if len(cv.Files) != 40 || strings.HasSuffix(cv.Files[0], "_test.go") || !strings.HasSuffix(cv.Files[len(cv.Files)-1], "_test.go") {
		t.Errorf("files reviewed %v; want the 40 files, sources before tests", cv.Files)
	}
	calls, cost := callsAndLedger(t, b, v.WorkID)
	t.Logf("%d parts, %d calls, ledger %d µ$, %s from created to accepted", len(plan.Parts), calls, cost, v.UpdatedAt.Sub(v.CreatedAt))
	if calls != len(plan.Parts) {
		t.Errorf("calls = %d, want one per part (%d)", calls, len(plan.Parts))
	}
	if n := b.Count(t, `SELECT count(*) FROM results WHERE work_id = $1`, v.WorkID); n != 1 {
		t.Errorf("results = %d, want 1", n)
	}
	if v.Result.Findings != 14 {
		t.Errorf("findings = %d, want 14 (every third file's SQL)", v.Result.Findings)
	}
	p := dryPlan(t, b, v.WorkID)
	if p.CheckRun == nil || !strings.Contains(p.CheckRun.Summary, fmt.Sprintf("reviewed in %d parts", len(plan.Parts))) ||
		strings.HasPrefix(p.CheckRun.Title, "Partial") {
		t.Errorf("check run %+v; want a whole review that says it was made in parts", p.CheckRun)
	}
	var at []string
	for _, c := range p.Comments {
		at = append(at, fmt.Sprintf("%s:%d", c.Path, c.Line))
	}
	var want []string
	for i := 0; i < 40; i += 3 {
		name := fmt.Sprintf("svc/orders%02d.go", i)
		if i%10 == 9 {
			name = fmt.Sprintf("svc/orders%02d_test.go", i)
		}
		want = append(want, name+":12")
	}
	slices.Sort(at)
	slices.Sort(want)
	if !slices.Equal(at, want) {
		t.Errorf("comments at %v, want %v", at, want)
	}
	whole := 0
	for _, a := range v.Attempts {
		if a.Part == store.WholeAttempt {
			whole++
		}
	}
	if whole != 1 || len(v.Attempts) != calls+1 {
		t.Errorf("attempts %+v; want the claimed one and one per call", v.Attempts)
	}
}

// partialReview submits the forty-file diff to b and checks what a partial
// review stopped by why is: accepted, some parts and not all reviewed, one
// call for each, and the files left exactly those of the parts not
// reviewed. It returns the work, the files left and what the ledger
// charged.
func partialReview(t *testing.T, b *celltest.Bundle, source, why string) (v ingress.WorkView, left []string, cost int64) {
	t.Helper()
	text := largeDiff(40)
	plan := planOf(t, text)
	v = submitLarge(t, b, text, source)
	if *v.Outcome != "accepted" {
		t.Fatalf("outcome %s (%s), want accepted", *v.Outcome, v.Reason)
	}
	cv := coverageOf(t, v)
	if !cv.Partial || len(cv.Reviewed) == 0 || len(cv.Reviewed) >= len(plan.Parts) || !strings.Contains(cv.Why, why) {
		t.Fatalf("coverage %+v; want a partial review stopped by the %s", cv, why)
	}
	for _, p := range plan.Parts[len(cv.Reviewed):] {
		left = append(left, p.Files...)
	}
	left = slices.Compact(left)
	if !slices.Equal(cv.Left, left) {
		t.Errorf("left %v, want the files of the parts not reviewed %v", cv.Left, left)
	}
	calls, cost := callsAndLedger(t, b, v.WorkID)
	t.Logf("%s: %d of %d parts reviewed in %d calls, ledger %d µ$", why, len(cv.Reviewed), len(plan.Parts), calls, cost)
	if calls != len(cv.Reviewed) {
		t.Errorf("calls %d for %d parts reviewed", calls, len(cv.Reviewed))
	}
	return v, left, cost
}

// wholeUnderACap reviews the forty-file diff without a cap, which gives
// the cap's calibration the calls of its parts and the diff's real cost,
// then again under a tenant cap of 1.2× that cost, which reviews it whole
// within the cap. It returns the calls made and the real cost.
func wholeUnderACap(t *testing.T, b *celltest.Bundle) (calls int, full int64) {
	t.Helper()
	first := submitLarge(t, b, largeDiff(40), "acme/shop#40")
	calls, full = callsAndLedger(t, b, first.WorkID)
	roomy := full * 12 / 10
	if err := b.Cell.Env.Store.SetWorkCostCap(context.Background(), b.Tenant, roomy); err != nil {
		t.Fatal(err)
	}
	whole := submitLarge(t, b, largeDiff(40), "acme/shop#41")
	if cv := coverageOf(t, whole); *whole.Outcome != "accepted" || cv.Partial || len(cv.Reviewed) != cv.Parts {
		t.Fatalf("at a cap of 1.2× the real cost (%d µ$ of %d): %s, coverage %+v; want the whole diff reviewed", roomy, full, *whole.Outcome, cv)
	}
	n, cost := callsAndLedger(t, b, whole.WorkID)
	if cost > roomy {
		t.Errorf("ledger %d µ$ against the cap of %d µ$", cost, roomy)
	}
	t.Logf("real cost %d µ$; at a cap of %d µ$ reviewed whole for %d µ$", full, roomy, cost)
	return calls + n, full
}

// partialText checks what partial review v publishes: a check run that
// does not read as a pass, says how many parts were reviewed and names the
// files left, and a comment that, as the check run, gives the command
// that reviews the rest with the rest's estimated cost as its cap.
func partialText(t *testing.T, b *celltest.Bundle, v ingress.WorkView, left []string) publish.Plan {
	t.Helper()
	cv := coverageOf(t, v)
	p := dryPlan(t, b, v.WorkID)
	covered := fmt.Sprintf("%d of the %d parts were reviewed", len(cv.Reviewed), cv.Parts)
	if p.CheckRun == nil || !strings.HasPrefix(p.CheckRun.Title, "Partial review") || p.CheckRun.Conclusion == "success" ||
		!strings.Contains(p.CheckRun.Summary, left[len(left)-1]) || !strings.Contains(p.CheckRun.Summary, covered) {
		t.Errorf("check run %+v; want a partial review saying %q and naming %s", p.CheckRun, covered, left[len(left)-1])
	}
	command := fmt.Sprintf("assay work rest %s --region us --cost-cap %d", v.WorkID, cv.LeftCost)
	if cv.LeftCost <= 0 || !strings.Contains(p.Rerun, "only in part") || !strings.Contains(p.Rerun, command) ||
		!strings.Contains(p.CheckRun.Summary, command) || !strings.Contains(p.Rerun, "the parts left are estimated at $") {
		t.Fatalf("comment %q, check run %q; want both to give %q and the rest's estimated cost", p.Rerun, p.CheckRun.Summary, command)
	}
	return p
}

// The same diff under its tenant's cost cap, which the cap counts at what
// the provider billed recent calls for the parts of this contract (a first
// review of the diff, uncapped, gives those calls and the diff's real
// cost): at 1.2× the real cost the diff is reviewed whole; at half of it a
// partial review, accepted, that stops at the part that would cross the
// cap — about half of them — names the files it left, in a check run that
// does not read as a pass and one comment with the command that reviews
// the rest at its estimated cost; the calls cost no more than the cap. The
// rest, asked for twice with the cap the comment gives, is one work item
// that calls only for the parts left and publishes only their findings:
// every part reviewed once, every finding published once, calls = ledger
// rows over both.
func TestReviewInPartsUnderACap(t *testing.T) {
	t.Parallel()
	b := partsCell(t, classifier.Config{})
	ctx := context.Background()
	before, full := wholeUnderACap(t, b)
	limit := full / 2
	if err := b.Cell.Env.Store.SetWorkCostCap(ctx, b.Tenant, limit); err != nil {
		t.Fatal(err)
	}
	v, left, cost := partialReview(t, b, "acme/shop#42", "cost cap")
	t.Logf("at a cap of %d µ$, half the real cost, the review cost %d µ$", limit, cost)
	if cost > limit {
		t.Errorf("ledger %d µ$ against the cap of %d µ$", cost, limit)
	}
	cv := coverageOf(t, v)
	if 3*len(cv.Reviewed) < cv.Parts || 3*len(cv.Reviewed) > 2*cv.Parts {
		t.Errorf("at half the real cost %d of %d parts were reviewed; want about half", len(cv.Reviewed), cv.Parts)
	}
	p := partialText(t, b, v, left)
	if want := full - cost; cv.LeftCost < want || cv.LeftCost > want*12/10 {
		t.Errorf("the rest is estimated at %d µ$; what it left cost %d µ$ in the first review", cv.LeftCost, want)
	}

	deadline := time.Now().Add(2 * time.Minute)
	rest, created, err := b.Cell.Env.Store.ReviewRest(ctx, v.WorkID, cv.LeftCost, deadline, ingress.WorkID, ingress.Announce(ctx, b.Names()))
	if err != nil || !created || rest.Revision != strings.Repeat("ab", 20)+"+rest1" {
		t.Fatalf("rest: %+v created %v, %v; want new work of revision …+rest1", rest, created, err)
	}
	// Asked again: the same rest while it runs, or, once it has reviewed
	// every part, nothing left to review; never a second one.
	again, created, err := b.Cell.Env.Store.ReviewRest(ctx, v.WorkID, cv.LeftCost, deadline, ingress.WorkID, ingress.Announce(ctx, b.Names()))
	switch {
	case errors.Is(err, store.ErrNotPartial):
	case err != nil:
		t.Fatalf("the rest asked for again: %v", err)
	case created || again.ID != rest.ID:
		t.Fatalf("the rest asked for again: %s created %v, want %s", again.ID, created, rest.ID)
	}
	rv := b.Wait(t, rest.ID)
	if *rv.Outcome != "accepted" {
		t.Fatalf("rest outcome %s (%s), want accepted", *rv.Outcome, rv.Reason)
	}
	rcv := coverageOf(t, rv)
	if rcv.Partial || rcv.Of != v.WorkID || !slices.Equal(rcv.Earlier, cv.Reviewed) || len(rcv.Reviewed)+len(cv.Reviewed) != cv.Parts {
		t.Fatalf("rest coverage %+v; want the %d parts the first left, after its %v", rcv, cv.Parts-len(cv.Reviewed), cv.Reviewed)
	}
	if n := b.Count(t, `SELECT count(*) FROM work WHERE rest_of = $1`, v.WorkID); n != 1 {
		t.Errorf("%d continuations, want 1", n)
	}
	calls := b.Count(t, `SELECT count(*) FROM attempts WHERE work_id = $1 AND call IS NOT NULL`, rest.ID)
	if calls != len(rcv.Reviewed) {
		t.Errorf("rest calls %d for its %d parts", calls, len(rcv.Reviewed))
	}
	b.WaitLedger(t, b.Tenant, before+cv.Parts)
	if n := b.Calls(b.Tenant); int(n) != before+cv.Parts {
		t.Errorf("model calls %d over both, want one per part (%d) after the %d before", int(n)-before, cv.Parts, before)
	}
	var restCost int64
	if err := b.DB.QueryRow(ctx, `SELECT coalesce(sum(cost_micros), 0) FROM ledger WHERE work_id = $1`, rest.ID).Scan(&restCost); err != nil {
		t.Fatal(err)
	}
	if restCost > cv.LeftCost {
		t.Errorf("the rest cost %d µ$ against its cap of %d µ$", restCost, cv.LeftCost)
	}
	rp := dryPlan(t, b, rest.ID)
	if rp.CheckRun == nil || strings.HasPrefix(rp.CheckRun.Title, "Partial") || !strings.Contains(rp.CheckRun.Summary, "continues that of work "+v.WorkID) || rp.Rerun != "" {
		t.Errorf("rest check run %+v, comment %q; want a whole review that says what it continues", rp.CheckRun, rp.Rerun)
	}
	at := map[string]int{}
	for _, c := range append(p.Comments, rp.Comments...) {
		at[fmt.Sprintf("%s:%d", c.Path, c.Line)]++
	}
	if len(at) != 14 || len(p.Comments)+len(rp.Comments) != 14 {
		t.Errorf("comments %d and %d at %v; want the 14 findings, each published once", len(p.Comments), len(rp.Comments), at)
	}
	t.Logf("rest: %d parts in %d calls, %d µ$ of its cap of %d µ$; comments %d then %d", len(rcv.Reviewed), calls, restCost,
		cv.LeftCost, len(p.Comments), len(rp.Comments))
	if _, _, err := b.Cell.Env.Store.ReviewRest(ctx, rest.ID, 1000, deadline, ingress.WorkID, ingress.Announce(ctx, b.Names())); !errors.Is(err, store.ErrNotPartial) {
		t.Errorf("a rest once every part is reviewed: %v, want ErrNotPartial", err)
	}
}

// A part whose answer fails the gate, and again when asked with what
// failed, ends the work schema_rejected naming the part; it was called
// twice, every other part at most once (the parts running beside it
// finish), and every call is in the ledger.
func TestReviewInPartsRejectsAFailingPart(t *testing.T) {
	t.Parallel()
	text := largeDiff(40)
	// The third part's first file: its answers name a file the diff
	// does not have.
	target := planOf(t, text).Parts[2].Files[0]
	b := celltest.SetupFront(t, cell.Options{Classifier: classifier.Config{PartUnits: partUnits}},
		bendFront("+++ b/"+target, 2, func(doc map[string]any) {
			doc["findings"] = []any{map[string]any{"file": "nowhere.go", "line": 1, "severity": "info",
				"summary": "not in the diff", "evidence": "x"}}
		}))
	v := submitLarge(t, b, text, "acme/shop#43")
	if *v.Outcome != "schema_rejected" || !strings.Contains(v.Reason, "part p3") || v.Result != nil {
		t.Fatalf("outcome %s (%s); want schema_rejected naming part p3 (%s)", *v.Outcome, v.Reason, target)
	}
	calls, _ := callsAndLedger(t, b, v.WorkID)
	rows, err := b.DB.Query(context.Background(), `SELECT part, count(*) FROM attempts WHERE work_id = $1 AND call IS NOT NULL GROUP BY part`, v.WorkID)
	if err != nil {
		t.Fatal(err)
	}
	byPart := map[string]int{}
	for rows.Next() {
		var part string
		var n int
		if err := rows.Scan(&part, &n); err != nil {
			t.Fatal(err)
		}
		byPart[part] = n
	}
	t.Logf("%d calls: %v", calls, byPart)
	for part, n := range byPart {
		if (part == "p3") != (n == 2) || n > 2 {
			t.Errorf("part %s called %d times; want p3 twice, the others once", part, n)
		}
	}
	if byPart["p1"] != 1 || byPart["p2"] != 1 {
		t.Errorf("calls by part %v; want p1 and p2 called", byPart)
	}
}

// A tenant whose budget covers a few of the parts gets a partial review
// that says the budget stopped it, and the ledger stays within the budget:
// each part's call reserves for itself as it is made.
func TestReviewInPartsWithinBudget(t *testing.T) {
	t.Parallel()
	b := partsCell(t, classifier.Config{})
	budget := int64(5000)
	if err := b.Cell.Env.Store.SetBudget(context.Background(), b.Tenant, &budget, "month"); err != nil {
		t.Fatal(err)
	}
	if _, _, cost := partialReview(t, b, "acme/shop#44", "budget"); cost > budget {
		t.Errorf("ledger %d µ$ over the budget of %d µ$", cost, budget)
	}
	if n := b.Count(t, `SELECT count(*) FROM budget_reservations WHERE settled_at IS NULL`); n != 0 {
		t.Errorf("%d reservations left unsettled", n)
	}
}

// A batch-lane review whose diff is over one part is not made a line of a
// provider batch, whose one request would carry the diff whole: it is
// reviewed in parts, a call each, and no provider batch is formed.
func TestReviewInPartsInTheBatchLane(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{Prices: batchPrices,
		Classifier: classifier.Config{ProviderBatch: providerBatch(10), PartUnits: partUnits}})
	text := largeDiff(40)
	plan := planOf(t, text)
	in, _ := json.Marshal(map[string]string{"diff": text, "title": "a large change"})
	status, r := b.Submit(t, ingress.SubmitRequest{Contract: "code-review", SourceID: "acme/shop#45",
		Revision: strings.Repeat("cd", 20), Lane: event.Batch, Input: in})
	if status >= 300 {
		t.Fatalf("submit: status %d", status)
	}
	v := b.Wait(t, r.WorkID)
	if *v.Outcome != "accepted" {
		t.Fatalf("outcome %s (%s), want accepted", *v.Outcome, v.Reason)
	}
	if cv := coverageOf(t, v); cv.Partial || len(cv.Reviewed) != len(plan.Parts) {
		t.Errorf("coverage %+v; want all %d parts reviewed", cv, len(plan.Parts))
	}
	if calls, _ := callsAndLedger(t, b, v.WorkID); calls != len(plan.Parts) {
		t.Errorf("calls = %d, want one per part (%d)", calls, len(plan.Parts))
	}
	rows, err := b.Cell.Env.Store.ProviderBatches(context.Background(), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 0 {
		t.Errorf("provider batches %+v, want none", rows)
	}
}
