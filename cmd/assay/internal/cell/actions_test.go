package cell_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
	"assay.dev/services/ingress"
)

// An operator cancels running work from the console: it ends canceled, its
// call told to stop (a cancel message in the outbox) and no answer of it
// committed; the cancel is audited, and work that has its outcome is not
// canceled again.
func TestCancelFromTheConsole(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	ctx := context.Background()
	if err := b.Cell.Env.Store.AddOperatorToken(ctx, "ops", "ops-token"); err != nil {
		t.Fatal(err)
	}
	act := func(id, action string) (int, ingress.ActionResponse, string) {
		t.Helper()
		raw, _ := json.Marshal(ingress.ActionRequest{Action: action, Confirm: id})
		req, _ := http.NewRequest(http.MethodPost, b.Cell.URL+"/v1/console/work/"+id+"/actions", bytes.NewReader(raw))
		req.Header.Set("Authorization", "Bearer ops-token")
		resp, err := b.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out ingress.ActionResponse
		var e struct{ Error struct{ Code string } }
		body := new(bytes.Buffer)
		_, _ = body.ReadFrom(resp.Body)
		_ = json.Unmarshal(body.Bytes(), &out)
		_ = json.Unmarshal(body.Bytes(), &e)
		return resp.StatusCode, out, e.Error.Code
	}
	// A call that hangs holds its work running.
	if err := b.Sim.AddFault(sim.Fault{Kind: sim.FaultHang, Tenant: "acme", Match: "cancel me running", Times: 1}); err != nil {
		t.Fatal(err)
	}
	status, running := b.Submit(t, celltest.CodeReview(evalset.Items()[0], "cancel me running"))
	if status != 202 {
		t.Fatalf("submit: HTTP %d", status)
	}
	deadline := time.Now().Add(30 * time.Second)
	for b.Count(t, `SELECT count(*) FROM work WHERE id = $1 AND state = 'running'`, running.WorkID) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the work never ran")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if status, out, code := act(running.WorkID, "cancel"); status != 200 || out.State != "canceled" || out.By != "ops" {
		t.Fatalf("cancel of running work: HTTP %d %+v %s", status, out, code)
	}
	if n := b.Count(t, `SELECT count(*) FROM outbox WHERE msg_id = $1`, "cancel."+running.WorkID+".console"); n != 1 {
		t.Errorf("%d cancel messages for the running call, want 1", n)
	}
	if status, _, code := act(running.WorkID, "cancel"); status != http.StatusConflict || code != "not_actionable" {
		t.Errorf("a second cancel: HTTP %d %s, want 409 not_actionable", status, code)
	}
	if v := b.Wait(t, running.WorkID); v.State != "canceled" || v.Result != nil {
		t.Errorf("the canceled work: %s, result %v", v.State, v.Result)
	}
	if n := b.Count(t, `SELECT count(*) FROM work_actions WHERE work_id = $1 AND action = 'cancel' AND by_name = 'ops'`, running.WorkID); n != 1 {
		t.Errorf("%d audit rows of the cancel, want 1", n)
	}
	// The call is stopped: its attempt ends, and with no result committed.
	deadline = time.Now().Add(30 * time.Second)
	for b.Count(t, `SELECT count(*) FROM attempts WHERE work_id = $1 AND finished_at IS NOT NULL`, running.WorkID) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("30s after the cancel the hung call's attempt has not ended: the call was not stopped")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := b.Count(t, `SELECT count(*) FROM results WHERE work_id = $1`, running.WorkID); n != 0 {
		t.Errorf("the canceled work has %d results", n)
	}
}
