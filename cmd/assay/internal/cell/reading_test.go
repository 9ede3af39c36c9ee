package cell_test

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"assay.dev/pkg/gate"
	"assay.dev/services/ingress"
)

// A reviewer's amendment through the console's API with the moved
// finding's line written N.0 is one reading of the answer from the desk to
// the pull request: beside the same finding at line N it is refused as a
// duplicate; alone it is stored as the gate's canonical JSON (line N) and
// published as a comment on line N.
func TestAmendedLineWrittenAsFloatPublishedOnItsLine(t *testing.T) {
	t.Parallel()
	d := setupDesk(t)
	path := "/v1/console/reviews/" + reviewIDOf(d.rejected)
	status, _, raw := d.send(t, "POST", path+"/claim", d.ana, nil)
	var c ingress.ReviewCase
	if status != 200 || json.Unmarshal(raw, &c) != nil {
		t.Fatalf("ana claims: HTTP %d %s", status, raw)
	}
	findings, moved := amend(t, c)
	// Each finding as JSON, the moved one's line written N.0.
	var spelled []json.RawMessage
	var movedAt int
	for i, f := range findings {
		b, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		if f["summary"] == "moved to the changed line by a reviewer" {
			b = bytes.Replace(b, []byte(`"line":`+strconv.Itoa(moved)+`,`), []byte(`"line":`+strconv.Itoa(moved)+`.0,`), 1)
			movedAt = i
		}
		spelled = append(spelled, b)
	}
	if !bytes.Contains(spelled[movedAt], []byte(strconv.Itoa(moved)+".0")) {
		t.Fatalf("the moved finding %s has no line written %d.0", spelled[movedAt], moved)
	}
	same, _ := json.Marshal(findings[movedAt])
	status, code, raw := d.send(t, "POST", path+"/resolve", d.ana, map[string]any{"verdict": "amended",
		"findings": append(append([]json.RawMessage{}, spelled...), same)})
	if status != 400 || code != "invalid_findings" || !bytes.Contains(raw, []byte(gate.CodeDuplicateFinding)) {
		t.Fatalf("line %d.0 beside line %d: HTTP %d %s; want 400 invalid_findings, a duplicate", moved, moved, status, raw)
	}

	status, _, raw = d.send(t, "POST", path+"/resolve", d.ana, map[string]any{"verdict": "amended", "note": "line moved",
		"findings": spelled})
	var done ingress.ReviewView
	if status != 200 || json.Unmarshal(raw, &done) != nil || !done.Published {
		t.Fatalf("ana amends: HTTP %d %s", status, raw)
	}
	d.await(t, "the amended review on the pull request", func() bool {
		runs := d.runsOf(d.rejected)
		return len(runs) == 1 && runs[0].Edits == 1 && len(d.commentsOf(d.rejected)) == len(findings)
	})
	at := 0
	for _, cm := range d.commentsOf(d.rejected) {
		if strings.Contains(cm.Body, "moved to the changed line by a reviewer") {
			at = cm.Line
		}
	}
	if at != moved {
		t.Fatalf("the moved finding is on line %d of the pull request, want %d: %+v", at, moved, d.commentsOf(d.rejected))
	}

	// What was stored and published is the gate's canonical JSON.
	status, _, raw = d.send(t, "GET", path, d.ana, nil)
	if status != 200 || json.Unmarshal(raw, &c) != nil || c.Output == nil {
		t.Fatalf("the resolved case: HTTP %d %s", status, raw)
	}
	acc, err := gate.Read(c.Output)
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Findings []struct{ Line json.Number } `json:"findings"`
	}
	dec := json.NewDecoder(bytes.NewReader(c.Output))
	dec.UseNumber()
	if err := dec.Decode(&out); err != nil || len(out.Findings) != len(findings) {
		t.Fatalf("stored output %s: %v", c.Output, err)
	}
	if got := string(out.Findings[movedAt].Line); got != strconv.Itoa(moved) || acc.Findings[movedAt].Line != moved {
		t.Fatalf("the stored output spells the moved line %s (%s); want %d", got, c.Output, moved)
	}
}
