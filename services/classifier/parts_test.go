package classifier

import (
	"encoding/json"
	"fmt"
	"testing"

	"assay.dev/pkg/contract"
)

// The parts' findings become one answer: a finding two parts both made is
// kept once, and past the contract's cap the most severe are kept, most
// severe first.
func TestMergeParts(t *testing.T) {
	t.Parallel()
	f := func(file string, line int, sev string) map[string]any {
		return map[string]any{"file": file, "line": line, "severity": sev, "summary": "s " + file, "evidence": "e"}
	}
	r := &partsRun{c: &contract.Contract{MaxFindings: 3}, doc: map[string]any{"changeId": "w1", "schemaVersion": 1}}
	r.findings = [][]any{
		{f("a.go", 1, "info"), f("a.go", 2, "blocking")},
		{f("a.go", 2, "blocking"), f("b.go", 5, "warning")},
		{f("c.go", 9, "info"), f("d.go", 3, "blocking")},
	}
	out, err := r.merged()
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		ChangeID string `json:"changeId"`
		Findings []struct {
			File string `json:"file"`
			Line int    `json:"line"`
		} `json:"findings"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, x := range doc.Findings {
		got = append(got, fmt.Sprintf("%s:%d", x.File, x.Line))
	}
	if fmt.Sprint(got) != "[a.go:2 d.go:3 b.go:5]" || doc.ChangeID != "w1" || r.cov.Folded != 1 || r.cov.Dropped != 2 {
		t.Fatalf("merged %v (change %q), folded %d, dropped %d; want [a.go:2 d.go:3 b.go:5], w1, 1, 2", got, doc.ChangeID, r.cov.Folded, r.cov.Dropped)
	}
	empty := &partsRun{c: &contract.Contract{}, doc: map[string]any{"changeId": "w2"}, findings: [][]any{nil, nil}}
	if out, _ := empty.merged(); string(out) != `{"changeId":"w2","findings":[]}` {
		t.Fatalf("no findings merged to %s", out)
	}
}
