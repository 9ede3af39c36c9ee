package cell_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/diff"
	"assay.dev/services/classifier"
	"assay.dev/services/ingress"
)

// mostAtOnce is the most calls of the work that ran at once, from their
// attempt rows: each from its record before the call to its record after.
func mostAtOnce(t *testing.T, b *celltest.Bundle, id string) int {
	t.Helper()
	rows, err := b.DB.Query(context.Background(), `SELECT started_at, finished_at FROM attempts
		WHERE work_id = $1 AND call IS NOT NULL`, id)
	if err != nil {
		t.Fatal(err)
	}
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for rows.Next() {
		var from, to time.Time
		if err := rows.Scan(&from, &to); err != nil {
			t.Fatal(err)
		}
		edges = append(edges, edge{from, 1}, edge{to, -1})
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// An end before a start at the same instant: touching calls did not
	// overlap.
	slices.SortFunc(edges, func(a, b edge) int { return cmpEdge(a.at, b.at, a.delta, b.delta) })
	most, now := 0, 0
	for _, e := range edges {
		now += e.delta
		most = max(most, now)
	}
	return most
}

func cmpEdge(a, b time.Time, da, db int) int {
	if c := a.Compare(b); c != 0 {
		return c
	}
	return da - db
}

// The forty-file diff with a model that takes 300ms a call and parts
// bounded at three calls at once: the parts' calls overlap, never more
// than three run at once, and every call is one attempt row, one ledger
// row and one model call; the review is whole and accepted.
func TestReviewInPartsConcurrently(t *testing.T) {
	t.Parallel()
	const bound = 3
	b := partsCell(t, classifier.Config{PartConcurrency: bound})
	if err := b.Sim.SetCapacity(sim.Capacity{Latency: sim.Latency{Base: 300 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	text := largeDiff(40)
	plan := planOf(t, text)
	v := submitLarge(t, b, text, "acme/shop#46")
	if *v.Outcome != "accepted" {
		t.Fatalf("outcome %s (%s), want accepted", *v.Outcome, v.Reason)
	}
	if cv := coverageOf(t, v); cv.Partial || len(cv.Reviewed) != len(plan.Parts) {
		t.Fatalf("coverage %+v; want all %d parts reviewed", cv, len(plan.Parts))
	}
	calls, cost := callsAndLedger(t, b, v.WorkID)
	if calls != len(plan.Parts) {
		t.Errorf("calls = %d, want one per part (%d)", calls, len(plan.Parts))
	}
	most := mostAtOnce(t, b, v.WorkID)
	t.Logf("%d parts, %d calls, ledger %d µ$, at most %d at once, %s from created to accepted", len(plan.Parts), calls, cost,
		most, v.UpdatedAt.Sub(v.CreatedAt))
	if most < 2 || most > bound {
		t.Errorf("at most %d calls ran at once; want the parts' calls to overlap, at most %d at once", most, bound)
	}
}

// bigFile is a diff of one new file of n lines, each its own text, with no
// issue the simulated reviewer finds.
func bigFile(name string, n int) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "diff --git a/%s b/%s\nnew file mode 100644\n--- /dev/null\n+++ b/%s\n@@ -0,0 +1,%d @@\n", name, name, name, n)
	for l := 1; l <= n; l++ {
		fmt.Fprintf(&sb, "+\tledger_line_%04d := settle(%d) // posts the entry\n", l, l)
	}
	return sb.String()
}

// lastLine is the last new line of path in part p.
func lastLine(t *testing.T, p diff.Part, path string) int {
	t.Helper()
	d, err := diff.Parse(p.Text)
	if err != nil {
		t.Fatal(err)
	}
	f := d.File(path)
	if f == nil {
		t.Fatalf("part %s has no %s", p.ID, path)
	}
	added := f.Added()
	return added[len(added)-1].NewLine
}

// withFinding adds to an answer a finding of file at line with summary,
// its evidence the line's text.
func withFinding(file string, line int, severity, summary string) func(map[string]any) {
	return func(doc map[string]any) {
		fs, _ := doc["findings"].([]any)
		doc["findings"] = append(fs, map[string]any{"file": file, "line": line, "severity": severity, "summary": summary,
			"evidence": fmt.Sprintf("ledger_line_%04d := settle(%d)", line, line)})
	}
}

// A file too large for one part is cut between two parts, and the model
// reports one issue at the cut from both sides, in other words and one
// line apart: the result holds it once — one comment, at the first
// finding's line, with both lines as evidence — and the check run says a
// finding made by two parts is shown once.
func TestReviewInPartsFoldsRewordedDuplicates(t *testing.T) {
	t.Parallel()
	const file = "svc/ledger.go"
	text := bigFile(file, 400)
	plan := planOf(t, text)
	if len(plan.Parts) < 2 {
		t.Fatalf("the file is cut into %d parts; the test wants two or more", len(plan.Parts))
	}
	cut := lastLine(t, plan.Parts[0], file)
	before := withFinding(file, cut, "warning", "Ledger entry posted without checking the settle error")
	after := withFinding(file, cut+1, "warning", "the error from settle is not checked before the entry is posted")
	b := celltest.SetupFront(t, cell.Options{Classifier: classifier.Config{PartUnits: partUnits}},
		func(next http.Handler) http.Handler {
			inner := bendFront(fmt.Sprintf("ledger_line_%04d ", cut+1), 10, after)(next)
			return bendFront(fmt.Sprintf("ledger_line_%04d ", cut), 10, before)(inner)
		})
	v := submitLarge(t, b, text, "acme/shop#47")
	if *v.Outcome != "accepted" {
		t.Fatalf("outcome %s (%s), want accepted", *v.Outcome, v.Reason)
	}
	cv := coverageOf(t, v)
	if cv.Partial || cv.Folded != 1 {
		t.Errorf("coverage %+v; want every part reviewed and one finding folded", cv)
	}
	p := dryPlan(t, b, v.WorkID)
	var near []string
	for _, c := range p.Comments {
		if c.Path == file && c.Line >= cut-3 && c.Line <= cut+4 {
			near = append(near, fmt.Sprintf("%d %s", c.Line, c.Body))
		}
	}
	if len(near) != 1 || !strings.HasPrefix(near[0], fmt.Sprintf("%d **warning**: Ledger entry", cut)) {
		t.Fatalf("comments at the cut: %q; want one, the first part's finding at line %d", near, cut)
	}
	if p.CheckRun == nil || !strings.Contains(p.CheckRun.Summary, "made by two parts are shown once") {
		t.Errorf("check run %+v; want it to say a finding two parts made is shown once", p.CheckRun)
	}
	var evidence string
	if err := b.DB.QueryRow(context.Background(), `SELECT f->>'evidence' FROM results r,
		jsonb_array_elements(r.output->'findings') f WHERE r.work_id = $1 AND f->>'file' = $2`, v.WorkID, file).Scan(&evidence); err != nil {
		t.Fatalf("the result's finding: %v", err)
	}
	if !strings.Contains(evidence, fmt.Sprintf("ledger_line_%04d", cut)) || !strings.Contains(evidence, fmt.Sprintf("ledger_line_%04d", cut+1)) {
		t.Errorf("evidence %q; want both lines", evidence)
	}
	calls, _ := callsAndLedger(t, b, v.WorkID)
	if calls != len(plan.Parts) {
		t.Errorf("calls = %d, want one per part (%d)", calls, len(plan.Parts))
	}
}

// A newer revision of a pull request being reviewed in parts cancels every
// part's call still running, not only the last one started: each is
// recorded at once (the provider never answers them), every call is in the
// ledger, and only the newer revision gets a result.
func TestReviewInPartsSupersededCancelsEveryCall(t *testing.T) {
	t.Parallel()
	// The lease's heartbeat, a third of its TTL, would find it gone 40 s
	// on: the cancel is what ends the calls.
	b := partsCell(t, classifier.Config{PartConcurrency: 3, LeaseTTL: 2 * time.Minute, CallTimeout: 2 * time.Minute})
	if err := b.Sim.AddFault(sim.Fault{Kind: sim.FaultHang, Tenant: "acme", Match: "the first push"}); err != nil {
		t.Fatal(err)
	}
	text := largeDiff(40)
	in, _ := json.Marshal(map[string]string{"diff": text, "title": "the first push"})
	_, first := b.Submit(t, ingress.SubmitRequest{Contract: "code-review", SourceID: "acme/shop#48", Revision: strings.Repeat("ab", 20), Input: in})
	running := `SELECT count(*) FROM attempts WHERE work_id = $1 AND call IS NOT NULL AND outcome IS NULL`
	poll(t, "three parts' calls reach the provider", 30*time.Second, func() bool {
		return b.Count(t, running, first.WorkID) == 3 && b.Calls("acme") == 3
	})
	in, _ = json.Marshal(map[string]string{"diff": text, "title": "the second push"})
	_, second := b.Submit(t, ingress.SubmitRequest{Contract: "code-review", SourceID: "acme/shop#48", Revision: strings.Repeat("cd", 20), Input: in})
	poll(t, "every running call is canceled and recorded", 20*time.Second, func() bool {
		return b.Count(t, running, first.WorkID) == 0
	})
	if v := b.Wait(t, first.WorkID); *v.Outcome != "superseded" || v.Result != nil {
		t.Fatalf("older revision: %s (%s), result %v; want superseded", *v.Outcome, v.Reason, v.Result)
	}
	if n := b.Count(t, `SELECT count(*) FROM attempts WHERE work_id = $1 AND call IS NOT NULL`, first.WorkID); n != 3 {
		t.Errorf("the older revision made %d calls, want the 3 that were running", n)
	}
	if v := b.Wait(t, second.WorkID); *v.Outcome != "accepted" {
		t.Fatalf("newer revision: %s (%s)", *v.Outcome, v.Reason)
	}
	callsAndLedger(t, b, second.WorkID)
}
