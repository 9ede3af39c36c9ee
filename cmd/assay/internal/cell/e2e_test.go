package cell_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/config"
	"assay.dev/pkg/consumer"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/event"
	"assay.dev/services/classifier"
	"assay.dev/services/ingress"
)

func TestMain(m *testing.M) { testenv.Main(m, apiCoverage) }

func TestConcurrentIdenticalSubmissions(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	req := celltest.CodeReview(evalset.Items()[0], "concurrent")
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		ids      = map[string]int{}
		statuses = map[int]int{}
	)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, raw := b.Post(t, b.Token, req)
			var r ingress.SubmitResponse
			_ = json.Unmarshal(raw, &r)
			mu.Lock()
			defer mu.Unlock()
			ids[r.WorkID]++
			statuses[status]++
		}()
	}
	wg.Wait()
	if len(ids) != 1 || statuses[http.StatusAccepted] != 1 || statuses[http.StatusOK] != 19 {
		t.Fatalf("ids %v statuses %v; want one id, one 202 and nineteen 200", ids, statuses)
	}
	var id string
	for k := range ids {
		id = k
	}
	if v := b.Wait(t, id); *v.Outcome != "accepted" {
		t.Fatalf("outcome %s (%s), want accepted", *v.Outcome, v.Reason)
	}
	b.WaitLedger(t, "acme", 1)
	if n := b.Count(t, `SELECT count(*) FROM work`); n != 1 {
		t.Errorf("work rows = %d, want 1", n)
	}
	if n := b.Count(t, `SELECT count(*) FROM results`); n != 1 {
		t.Errorf("result rows = %d, want 1", n)
	}
	if n := b.Calls("acme"); n != 1 {
		t.Errorf("model calls = %d, want 1", n)
	}
	// One trace spans ingress → classifier → committer and ledger: the
	// WORK and ATTEMPT messages carry the same trace id. Three messages
	// an item: the work, its attempt (with its result) and its outcome;
	// nothing on RESULT.
	traces := map[string]string{}
	for _, kind := range []string{event.KindWork, event.KindAttempt} {
		st, err := b.Cell.Env.JS.Stream(context.Background(), b.Names().Stream(kind))
		if err != nil {
			t.Fatal(err)
		}
		msg, err := st.GetMsg(context.Background(), 1)
		if err != nil {
			t.Fatalf("%s: first message: %v", kind, err)
		}
		if id := msg.Header.Get(jetstream.MsgIDHeader); id == "" {
			t.Errorf("%s message has no Nats-Msg-Id", kind)
		}
		parts := strings.Split(msg.Header.Get("traceparent"), "-")
		if len(parts) != 4 {
			t.Fatalf("%s message has no traceparent header: %v", kind, msg.Header)
		}
		traces[kind] = parts[1]
	}
	if traces[event.KindWork] != traces[event.KindAttempt] {
		t.Errorf("trace ids differ across the path: %v", traces)
	}
	for kind, want := range map[string]uint64{event.KindWork: 1, event.KindAttempt: 1, event.KindResult: 0, event.KindOutcome: 1} {
		st, err := b.Cell.Env.JS.Stream(context.Background(), b.Names().Stream(kind))
		if err != nil {
			t.Fatal(err)
		}
		if info, err := st.Info(context.Background()); err != nil {
			t.Fatal(err)
		} else if info.State.Msgs != want {
			t.Errorf("%s holds %d messages for one item, want %d", kind, info.State.Msgs, want)
		}
	}
}

func TestRevisionsAndRedelivery(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	it := evalset.Items()[1]
	status, first := b.Submit(t, celltest.CodeReview(it, "rev one"))
	if status != http.StatusAccepted {
		t.Fatalf("first submission: HTTP %d, want 202", status)
	}
	if v := b.Wait(t, first.WorkID); *v.Outcome != "accepted" || v.Result == nil {
		t.Fatalf("first: outcome %s, result %v", *v.Outcome, v.Result)
	}
	// The same webhook delivered again after completion costs nothing.
	status, again := b.Submit(t, celltest.CodeReview(it, "rev one"))
	if status != http.StatusOK || again.WorkID != first.WorkID || !again.Duplicate || again.State != "accepted" {
		t.Fatalf("redelivery: HTTP %d %+v; want 200, the first work id, accepted", status, again)
	}
	if n := b.Calls("acme"); n != 1 {
		t.Fatalf("model calls after redelivery = %d, want 1", n)
	}
	// A force-push is a new revision: a second work item.
	next := celltest.CodeReview(it, "rev two")
	next.Revision = strings.Repeat("b", 40)
	status, second := b.Submit(t, next)
	if status != http.StatusAccepted || second.WorkID == first.WorkID {
		t.Fatalf("new revision: HTTP %d id %s; want 202 and a new id", status, second.WorkID)
	}
	if v := b.Wait(t, second.WorkID); *v.Outcome != "accepted" {
		t.Fatalf("second: outcome %s", *v.Outcome)
	}
	if n := b.Calls("acme"); n != 2 {
		t.Errorf("model calls = %d, want 2", n)
	}
	if n := b.Count(t, `SELECT count(*) FROM work WHERE source_id = $1`, it.SourceID); n != 2 {
		t.Errorf("work rows for the source = %d, want 2", n)
	}
}

// Every way an answer can be wrong ends schema_rejected after one repair
// re-ask, with the reason recorded, the raw answers kept, and no result.
func TestGateFailuresEndRejected(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	cases := []struct {
		fault, code string
	}{
		{sim.FaultExtraProperty, "schema.violation"},
		{sim.FaultBadEnum, "schema.violation"},
		{sim.FaultWrongChangeID, "correlation.work_id"},
		{sim.FaultWrongSchemaVersion, "correlation.schema_version"},
		{sim.FaultUngroundedFile, "grounding.file_not_in_diff"},
		{sim.FaultLineOutsideHunk, "grounding.line_outside_hunk"},
		{sim.FaultEvidenceNotInDiff, "grounding.evidence_not_in_diff"},
		{sim.FaultTruncated, "syntax.invalid_json"},
		{sim.FaultInvalidJSON, "syntax.invalid_json"},
	}
	items := evalset.Items()
	ids := make([]string, len(cases))
	for i, tc := range cases {
		title := "gate case " + tc.fault
		// Twice: the first answer and the repair re-ask are both bad.
		if err := b.Sim.AddFault(sim.Fault{Kind: tc.fault, Tenant: "acme", Match: title, Times: 2}); err != nil {
			t.Fatal(err)
		}
		req := celltest.CodeReview(items[0], title)
		req.SourceID = fmt.Sprintf("shop/gate#%d", i+1)
		_, r := b.Submit(t, req)
		ids[i] = r.WorkID
	}
	for i, tc := range cases {
		t.Run(tc.fault, func(t *testing.T) {
			v := b.Wait(t, ids[i])
			if *v.Outcome != "schema_rejected" {
				t.Fatalf("outcome %s (%s), want schema_rejected", *v.Outcome, v.Reason)
			}
			if !strings.Contains(v.Reason, tc.code) {
				t.Errorf("reason %q does not name %s", v.Reason, tc.code)
			}
			if v.Result != nil {
				t.Errorf("a rejected work item has a result")
			}
			if len(v.Attempts) != 2 {
				t.Fatalf("attempts = %d, want 2 (one repair re-ask)", len(v.Attempts))
			}
			for _, a := range v.Attempts {
				if a.Outcome != "invalid_output" || !strings.Contains(a.Reason, tc.code) {
					t.Errorf("attempt %d: %s %q", a.Number, a.Outcome, a.Reason)
				}
			}
			if n := b.Count(t, `SELECT count(*) FROM attempts WHERE work_id = $1 AND coalesce(raw_response, '') <> ''`, ids[i]); n != 2 {
				t.Errorf("attempts with the raw answer kept = %d, want 2", n)
			}
			if n := b.Count(t, `SELECT count(*) FROM results WHERE work_id = $1`, ids[i]); n != 0 {
				t.Errorf("result rows = %d, want 0", n)
			}
		})
	}
	b.WaitLedger(t, "acme", 2*len(cases))
	if n := b.Calls("acme"); n != int64(2*len(cases)) {
		t.Errorf("model calls = %d, want %d", n, 2*len(cases))
	}
}

// Two classifiers, one work item: the first one's lease lapses while its
// model call runs; the second claims, answers and is committed; the first
// answer arrives late and is recorded stale_lease, never a second result.
func TestLateAnswerFromLostLease(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{NoClassifier: true})
	mk := b.HandClassifiers(t)
	// A stands for a worker that stalls: no heartbeat, a short lease.
	a := mk(classifier.Config{LeaseTTL: 500 * time.Millisecond, Heartbeat: -1})
	bb := mk(classifier.Config{})
	if err := b.Sim.AddFault(sim.Fault{Kind: sim.FaultLatency, Tenant: "acme", Latency: 3 * time.Second, Times: 1}); err != nil {
		t.Fatal(err)
	}
	_, r := b.Submit(t, celltest.CodeReview(evalset.Items()[2], "lease race"))
	ev := event.Work{WorkID: r.WorkID, TenantID: "acme", Region: "us", Lane: event.Interactive, Dispatch: 1}

	ctx := context.Background()
	first := make(chan consumer.Disposition, 1)
	go func() { first <- a.Process(ctx, ev, celltest.Delivery{}) }()
	// Wait for A's claim to lapse.
	deadline := time.Now().Add(30 * time.Second)
	for b.Count(t, `SELECT count(*) FROM work WHERE id = $1 AND attempts = 1 AND lease_expires_at < now()`, r.WorkID) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first claim never lapsed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if d := bb.Process(ctx, ev, celltest.Delivery{}); d.Settle != consumer.Ack {
		t.Fatalf("second worker: disposition %+v, want ack", d)
	}
	v := b.Wait(t, r.WorkID)
	if *v.Outcome != "accepted" {
		t.Fatalf("outcome %s (%s), want accepted", *v.Outcome, v.Reason)
	}
	if d := <-first; d.Settle != consumer.Ack {
		t.Fatalf("first worker: disposition %+v, want ack", d)
	}
	b.WaitLedger(t, "acme", 2)

	var late, winner string
	if err := b.DB.QueryRow(ctx, `SELECT id::text FROM attempts WHERE work_id = $1 AND number = 1`, r.WorkID).Scan(&late); err != nil {
		t.Fatal(err)
	}
	if err := b.DB.QueryRow(ctx, `SELECT attempt_id::text FROM results WHERE work_id = $1`, r.WorkID).Scan(&winner); err != nil {
		t.Fatal(err)
	}
	if winner == late {
		t.Fatal("the late answer became the result")
	}
	if n := b.Count(t, `SELECT count(*) FROM results WHERE work_id = $1`, r.WorkID); n != 1 {
		t.Errorf("result rows = %d, want 1", n)
	}
	if n := b.Count(t, `SELECT count(*) FROM attempts WHERE id = $1 AND outcome = 'stale_lease'`, late); n != 1 {
		t.Errorf("late attempt is not recorded stale_lease")
	}
	if n := b.Count(t, `SELECT count(*) FROM ledger WHERE work_id = $1 AND tenant_id = 'acme'`, r.WorkID); n != 2 {
		t.Errorf("ledger rows for the work with its tenant = %d, want 2", n)
	}
	if n := b.Count(t, `SELECT count(*) FROM ledger WHERE attempt_id = $1 AND outcome = 'stale_lease'`, late); n != 1 {
		t.Errorf("the late attempt's ledger row is not stale_lease")
	}
	if n := b.Calls("acme"); n != 2 {
		t.Errorf("model calls = %d, want 2", n)
	}
}

// Requests for a tenant homed elsewhere are refused with the right region
// named, and nothing is stored.
func TestWrongRegionAndBadInputAreRefused(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	req := celltest.CodeReview(evalset.Items()[0], "elsewhere")
	status, raw := b.Post(t, "globex-token", req)
	if status != http.StatusMisdirectedRequest || !strings.Contains(string(raw), `"wrong_region"`) || !strings.Contains(string(raw), "region eu") {
		t.Errorf("wrong region: HTTP %d %s", status, raw)
	}
	bad := []struct {
		body any
		code string
	}{
		{map[string]any{"contract": "code-review", "sourceId": "a/b#1", "revision": "r1", "input": map[string]any{"diff": "x"}, "tenant": "globex"}, "invalid_json"},
		{map[string]any{"contract": "nope", "sourceId": "a/b#1", "revision": "r1", "input": map[string]any{}}, "unknown_contract"},
		{map[string]any{"contract": "code-review", "sourceId": "a b", "revision": "r1", "input": map[string]any{"diff": "x"}}, "invalid_source_id"},
		{map[string]any{"contract": "code-review", "sourceId": "a/b#1", "revision": "r 1", "input": map[string]any{"diff": "x"}}, "invalid_revision"},
		{map[string]any{"contract": "code-review", "sourceId": "a/b#1", "revision": "r1", "lane": "fast", "input": map[string]any{"diff": "x"}}, "invalid_lane"},
		{map[string]any{"contract": "code-review", "sourceId": "a/b#1", "revision": "r1", "input": map[string]any{"diff": "not a diff"}}, "invalid_input"},
	}
	for _, tc := range bad {
		status, raw := b.Post(t, b.Token, tc.body)
		if status != http.StatusBadRequest || !strings.Contains(string(raw), `"code":"`+tc.code+`"`) {
			t.Errorf("%v: HTTP %d %s; want 400 %s", tc.body, status, raw, tc.code)
		}
	}
	status, raw = b.Post(t, "not-a-token", req)
	if status != http.StatusUnauthorized {
		t.Errorf("bad token: HTTP %d %s", status, raw)
	}
	if n := b.Count(t, `SELECT count(*) FROM work`); n != 0 {
		t.Errorf("work rows = %d after refused requests, want 0", n)
	}
}

// A RESULT redelivered after its work was decided: the accepted attempt
// keeps its verdict, any other answer is recorded stale, and no second
// result appears.
func TestCommitterRedelivery(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	ctx := context.Background()
	_, r := b.Submit(t, celltest.CodeReview(evalset.Items()[7], "redelivered result"))
	if v := b.Wait(t, r.WorkID); *v.Outcome != "accepted" {
		t.Fatalf("outcome %s", *v.Outcome)
	}
	var winner string
	if err := b.DB.QueryRow(ctx, `SELECT attempt_id::text FROM results WHERE work_id = $1`, r.WorkID).Scan(&winner); err != nil {
		t.Fatal(err)
	}
	ev := event.Result{AttemptID: winner, WorkID: r.WorkID, TenantID: "acme", Region: "us",
		LeaseToken: "00000000-0000-4000-8000-0000000000cc", Outcome: "ok", Final: true}
	if err := b.Cell.Committer.Commit(ctx, ev); err != nil {
		t.Fatal(err)
	}
	if n := b.Count(t, `SELECT count(*) FROM attempts WHERE id = $1 AND outcome = 'ok'`, winner); n != 1 {
		t.Errorf("a redelivered verdict relabelled the accepted attempt")
	}
	// A stray answer for the same work from an attempt that lost its lease.
	var stray string
	if err := b.DB.QueryRow(ctx, `INSERT INTO attempts (id, work_id, tenant_id, number, lease_token, outcome)
		VALUES (gen_random_uuid(), $1, 'acme', 99, gen_random_uuid(), 'ok') RETURNING id::text`, r.WorkID).Scan(&stray); err != nil {
		t.Fatal(err)
	}
	ev.AttemptID = stray
	for range 2 {
		if err := b.Cell.Committer.Commit(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.Count(t, `SELECT count(*) FROM attempts WHERE id = $1 AND outcome = 'stale_lease'`, stray); n != 1 {
		t.Errorf("the late answer is not recorded stale_lease")
	}
	if n := b.Count(t, `SELECT count(*) FROM results WHERE work_id = $1`, r.WorkID); n != 1 {
		t.Errorf("result rows = %d, want 1", n)
	}
}

// A region is configuration: a cell "ap" of an installation whose regions
// include it runs, names its streams after itself, and accepts work.
func TestCellByConfigurationAlone(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{Config: config.Config{Region: "ap", Regions: []string{"us", "eu", "ap"}}})
	_, r := b.Submit(t, celltest.CodeReview(evalset.Items()[3], "region ap"))
	if v := b.Wait(t, r.WorkID); *v.Outcome != "accepted" || v.Region != "ap" {
		t.Fatalf("outcome %s in region %s (%s), want accepted in ap", *v.Outcome, v.Region, v.Reason)
	}
	for _, kind := range event.Kinds {
		if _, err := b.Cell.Env.JS.Stream(context.Background(), "ASSAY_"+kind+"_AP"); err != nil {
			t.Errorf("stream of kind %s: %v", kind, err)
		}
	}
	b.WaitLedger(t, "acme", 1)
}
