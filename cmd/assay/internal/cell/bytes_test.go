package cell_test

import (
	"bytes"
	"strings"
	"testing"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/outcome"
)

// A provider that answers 200 with bytes that are not UTF-8 and a NUL: the
// attempt is recorded on the first try with the answer kept byte for byte,
// it ends invalid_output (syntax.invalid_encoding), the repair policy
// allows one re-ask, and the work ends schema_rejected after exactly two
// calls, both in the ledger and charged.
func TestAnswerThatIsNotTextEndsRejected(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	if err := b.Sim.AddFault(sim.Fault{Kind: sim.FaultBadBytes, Tenant: "acme", Match: "bad bytes", Times: 2}); err != nil {
		t.Fatal(err)
	}
	_, r := b.Submit(t, celltest.CodeReview(evalset.Items()[4], "bad bytes"))
	v := b.Wait(t, r.WorkID)
	if *v.Outcome != outcome.SchemaRejected || !strings.Contains(v.Reason, "syntax.invalid_encoding") {
		t.Fatalf("outcome %s (%s), want schema_rejected syntax.invalid_encoding", *v.Outcome, v.Reason)
	}
	if len(v.Attempts) != 2 {
		t.Fatalf("%d attempts, want 2 (one repair re-ask)", len(v.Attempts))
	}
	for _, a := range v.Attempts {
		if a.Outcome != outcome.AttemptInvalidOutput {
			t.Errorf("attempt %d: %s %s", a.Number, a.Outcome, a.Reason)
		}
	}
	if n := b.Calls("acme"); n != 2 {
		t.Fatalf("provider calls = %d, want 2", n)
	}
	b.WaitLedger(t, "acme", 2)
	if n := b.Count(t, `SELECT count(*) FROM ledger WHERE work_id = $1 AND cost_micros > 0`, r.WorkID); n != 2 {
		t.Fatalf("%d of 2 ledger rows charged", n)
	}
	var raw []byte
	if err := b.DB.QueryRow(t.Context(), `SELECT raw_response FROM attempts WHERE work_id = $1 AND number = 1`, r.WorkID).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(raw, []byte("\xff\xfe<html>upstream \x00 error\xc0\xaf</html>")) {
		t.Fatalf("raw answer kept as %q, want the provider's bytes exactly", raw)
	}
}
