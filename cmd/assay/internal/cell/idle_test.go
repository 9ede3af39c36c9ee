package cell_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/services/ingress"
)

// An idle cell refuses no one. Twenty moderation items with a 20s
// deadline (so each may wait 2s), each submitted once the one before had
// ended, every other one first answered 503 with a 3s Retry-After (so it
// waited, parked, longer than that before it ran), beside another
// tenant's item parked for two minutes by a provider's Retry-After: not
// one is refused for capacity, since nothing waits in the lane when each
// arrives.
func TestIdleCellRefusesNoOne(t *testing.T) {
	t.Parallel()
	b := eventsCell(t, cell.Options{})
	other := otherTenant(t, b)
	faults := []sim.Fault{{Kind: sim.FaultRateLimit, Tenant: "initech", Match: "parked for two minutes", Times: 1, RetryAfter: 2 * time.Minute}}
	for i := 1; i < 20; i += 2 {
		faults = append(faults, sim.Fault{Kind: sim.FaultUnavailable, Tenant: "acme", Match: fmt.Sprintf("item %d, answered 503 first", i),
			Times: 1, RetryAfter: 3 * time.Second})
	}
	for _, f := range faults {
		if err := b.Sim.AddFault(f); err != nil {
			t.Fatal(err)
		}
	}
	in, _ := json.Marshal(map[string]string{"text": "parked for two minutes"})
	status, raw := call(t, b, http.MethodPost, "/v1/work", other, ingress.SubmitRequest{Contract: "moderation", SourceID: "parked", Revision: "r1", Input: in})
	if status != http.StatusAccepted {
		t.Fatalf("the parked item: %d %s", status, raw)
	}
	// Let it meet its Retry-After and be parked.
	parked := decode[ingress.SubmitResponse](t, raw).WorkID
	for end := time.Now().Add(30 * time.Second); b.Count(t, `SELECT count(*) FROM attempts WHERE work_id = $1 AND outcome = 'rate_limited'`, parked) == 0; {
		if time.Now().After(end) {
			t.Fatal("the other tenant's item was never parked")
		}
		time.Sleep(50 * time.Millisecond)
	}
	refused := 0
	for i := range 20 {
		text := fmt.Sprintf("item %d, answered at once", i)
		if i%2 == 1 {
			text = fmt.Sprintf("item %d, answered 503 first", i)
		}
		in, _ := json.Marshal(map[string]string{"text": text})
		status, raw := call(t, b, http.MethodPost, "/v1/work", b.Token, ingress.SubmitRequest{Contract: "moderation",
			SourceID: fmt.Sprintf("idle-%d", i), Revision: "r1", Input: in, DeadlineSeconds: 20})
		if status == http.StatusTooManyRequests {
			refused++
			t.Errorf("item %d refused: %s", i, raw)
			continue
		}
		if status != http.StatusAccepted {
			t.Fatalf("item %d: %d %s", i, status, raw)
		}
		if v := b.Wait(t, decode[ingress.SubmitResponse](t, raw).WorkID); *v.Outcome != "accepted" {
			t.Fatalf("item %d: %s (%s)", i, *v.Outcome, v.Reason)
		}
	}
	if n := b.Count(t, `SELECT count(*) FROM attempts a JOIN work w ON w.id = a.work_id
		WHERE w.tenant_id = 'acme' AND a.outcome = 'transport_error'`); n != 10 {
		t.Fatalf("%d of acme's attempts met a 503, want 10: the items did not wait as this test means them to", n)
	}
	if refused > 0 {
		t.Fatalf("%d of 20 items refused on an idle cell", refused)
	}
}
