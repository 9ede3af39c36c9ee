package cell_test

// The classic ugly paths, end to end on one cell (real Postgres, real
// JetStream, the simulated provider). Cases covered elsewhere:
//   - two workers, the first lease expiring after its model call:
//     TestLateAnswerFromLostLease (e2e_test.go);
//   - an extra JSON property, and the other gate failures on code review:
//     TestGateFailuresEndRejected (e2e_test.go);
//   - the identical webhook replayed 50× concurrently:
//     TestWebhookReplayedConcurrently (services/ingress/webhook_test.go);
//   - one API request sent 20× concurrently: TestConcurrentIdenticalSubmissions.
// make test runs those and these again, repeated, under -race.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/consumer"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/event"
	"assay.dev/pkg/model"
	"assay.dev/services/classifier"
	"assay.dev/services/ingress"
)

// bendFront rewrites the answers of the provider: bend gets the decoded
// structured output of each call whose input contains match and returns
// what the provider should have said instead, for the first times calls.
func bendFront(match string, times int, bend func(map[string]any)) func(http.Handler) http.Handler {
	var mu sync.Mutex
	left := times
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			mu.Lock()
			apply := left > 0 && bytes.Contains(body, []byte(match))
			if apply {
				left--
			}
			mu.Unlock()
			if !apply {
				next.ServeHTTP(w, r)
				return
			}
			rec := httptest.NewRecorder()
			next.ServeHTTP(rec, r)
			var resp model.ChatResponse
			if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil || len(resp.Choices) == 0 {
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
			var doc map[string]any
			if err := json.Unmarshal([]byte(resp.Choices[0].Message.Content), &doc); err != nil {
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
			bend(doc)
			out, _ := json.Marshal(doc)
			resp.Choices[0].Message.Content = string(out)
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(resp)
		})
	}
}

func changeReview(it evalset.Item, title string) ingress.SubmitRequest {
	in, _ := json.Marshal(map[string]string{"diff": it.Diff, "title": title})
	return ingress.SubmitRequest{Contract: "change-review", SourceID: it.SourceID, Revision: it.Revision, Input: in}
}

// A risk tag outside the closed set: the gate refuses it, the repair
// re-ask says so, and a second bad answer ends the work schema_rejected
// with no result; one bad answer and a good repair is accepted. Every call
// is an attempt with its ledger row.
func TestUglyTagOutsideEnum(t *testing.T) {
	t.Parallel()
	const bad = "tag outside the enum twice"
	b := celltest.SetupFront(t, cell.Options{}, bendFront(bad, 2, func(doc map[string]any) {
		doc["tags"] = []string{"payments", "blockchain"}
	}))
	_, r := b.Submit(t, changeReview(evalset.Items()[0], bad))
	v := b.Wait(t, r.WorkID)
	if *v.Outcome != "schema_rejected" || !strings.Contains(v.Reason, "schema") || v.Result != nil {
		t.Fatalf("outcome %s (%s), result %v; want schema_rejected on the schema, no result", *v.Outcome, v.Reason, v.Result)
	}
	if len(v.Attempts) != 2 || v.Attempts[0].Outcome != "invalid_output" || v.Attempts[1].Outcome != "invalid_output" {
		t.Fatalf("attempts %+v, want two invalid_output (one repair re-ask)", v.Attempts)
	}
	b.WaitLedger(t, "acme", 2)
	if n := b.Calls("acme"); n != 2 {
		t.Errorf("model calls = %d, want 2", n)
	}
	if n := b.Count(t, `SELECT count(*) FROM results`); n != 0 {
		t.Errorf("result rows = %d, want 0", n)
	}
}

// A work item queued under the previous taxonomy, the contract's taxonomy
// having moved on before a worker took it: no answer can be correlated to
// the current taxonomy, so it ends schema_rejected on correlation after one
// call (a repair re-ask cannot help), with no result and its ledger row.
func TestUglyStaleTaxonomyVersion(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{NoClassifier: true})
	_, r := b.Submit(t, celltest.CodeReview(evalset.Items()[3], "stale taxonomy"))
	if n := b.Count(t, `WITH u AS (UPDATE work SET taxonomy_version = '2025-01' WHERE id = $1 RETURNING 1)
		SELECT count(*) FROM u`, r.WorkID); n != 1 {
		t.Fatal("could not age the work's taxonomy")
	}
	startClassifier(t, b)
	v := b.Wait(t, r.WorkID)
	if *v.Outcome != "schema_rejected" || !strings.Contains(v.Reason, "correlation.taxonomy_version") || v.Result != nil {
		t.Fatalf("outcome %s (%s), result %v; want schema_rejected on correlation.taxonomy_version", *v.Outcome, v.Reason, v.Result)
	}
	// No repair re-ask: no answer can make the work's taxonomy current.
	if calls := b.Calls("acme"); calls != 1 || len(v.Attempts) != 1 {
		t.Errorf("model calls = %d, attempts %+v; want one call, no repair re-ask", calls, v.Attempts)
	}
	b.WaitLedger(t, "acme", 1)
}

// The change's content digest moves on. Before a worker takes the work, the
// worker reads the new content and its answer is accepted for it; while the
// model call runs, the answer is for content that is no longer current and
// is refused at the commit, with no result.
func TestUglyDigestUpdatedWhileQueued(t *testing.T) {
	t.Parallel()
	items := evalset.Items()
	b := celltest.Setup(t, cell.Options{NoClassifier: true})
	newer, _ := json.Marshal(map[string]string{"diff": items[6].Diff, "title": "force-pushed while queued"})
	_, queued := b.Submit(t, celltest.CodeReview(items[5], "digest moves while queued"))
	if n := b.Count(t, `WITH u AS (UPDATE work SET input = $2, content_digest = $3 WHERE id = $1 RETURNING 1)
		SELECT count(*) FROM u`, queued.WorkID, string(newer), ingress.Digest(newer)); n != 1 {
		t.Fatal("could not move the digest")
	}
	// The second item's call stalls long enough to move its digest under it.
	const stalled = "digest moves during the call"
	if err := b.Sim.AddFault(sim.Fault{Kind: sim.FaultLatency, Tenant: "acme", Match: stalled, Latency: 2 * time.Second, Times: 1}); err != nil {
		t.Fatal(err)
	}
	_, running := b.Submit(t, celltest.CodeReview(items[4], stalled))
	startClassifier(t, b)

	deadline := time.Now().Add(20 * time.Second)
	for b.Count(t, `SELECT count(*) FROM work WHERE id = $1 AND state = 'running'`, running.WorkID) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the stalled work never started")
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.Count(t, `WITH u AS (UPDATE work SET content_digest = 'sha256:moved' WHERE id = $1 RETURNING 1) SELECT count(*) FROM u`, running.WorkID)

	v := b.Wait(t, queued.WorkID)
	if *v.Outcome != "accepted" || v.Result == nil {
		t.Fatalf("updated while queued: outcome %s (%s); want accepted on the new content", *v.Outcome, v.Reason)
	}
	if !bytes.Contains(v.Result.Output, []byte("coupon")) {
		t.Errorf("the result is not a review of the content as updated: %s", v.Result.Output)
	}
	v = b.Wait(t, running.WorkID)
	if *v.Outcome != "schema_rejected" || !strings.Contains(v.Reason, "correlation.digest") || v.Result != nil {
		t.Fatalf("updated during the call: outcome %s (%s), result %v; want schema_rejected on correlation.digest", *v.Outcome, v.Reason, v.Result)
	}
	calls := b.Calls("acme")
	b.WaitLedger(t, "acme", int(calls))
	if n := b.Count(t, `SELECT count(*) FROM results`); n != 1 {
		t.Errorf("result rows = %d, want 1", n)
	}
}

// A worker dies after the provider answered (it never reports); the
// message is delivered again and a second worker claims once the lease
// lapses, answers and commits. One result; the ledger holds both calls,
// the dead worker's as an estimate charged its reservation, so ledger rows
// equal provider calls.
func TestUglyWorkerKilledAfterExtraction(t *testing.T) {
	t.Parallel()
	// The front answers the first call at the provider (which counts it)
	// and never hands the answer to the worker: to the rest of the system
	// that worker died right after extraction.
	dead := make(chan struct{})
	var once sync.Once
	b := celltest.SetupFront(t, cell.Options{NoClassifier: true}, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			first := false
			once.Do(func() { first = true })
			if !first {
				next.ServeHTTP(w, r)
				return
			}
			next.ServeHTTP(httptest.NewRecorder(), r)
			<-dead
		})
	})
	// Registered after the cell's, so it runs first: the provider's server
	// waits for this call to end before it closes.
	t.Cleanup(func() { close(dead) })
	mk := b.HandClassifiers(t)
	doomed := mk(classifier.Config{LeaseTTL: 300 * time.Millisecond, Heartbeat: -1, CallTimeout: time.Hour})
	survivor := mk(classifier.Config{})
	_, r := b.Submit(t, celltest.CodeReview(evalset.Items()[7], "killed after extraction"))
	ev := event.Work{WorkID: r.WorkID, TenantID: "acme", Region: "us", Lane: event.Interactive, Dispatch: 1}
	ctx := context.Background()
	go doomed.Process(ctx, ev, celltest.Delivery{})
	deadline := time.Now().Add(30 * time.Second)
	for b.Calls("acme") == 0 || b.Count(t, `SELECT count(*) FROM work WHERE id = $1 AND lease_expires_at < now()`, r.WorkID) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the doomed worker never called the model, or its lease never lapsed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The message, redelivered, reaches a live worker.
	if d := survivor.Process(ctx, ev, celltest.Delivery{}); d.Settle != consumer.Ack {
		t.Fatalf("redelivery: disposition %+v, want ack", d)
	}
	v := b.Wait(t, r.WorkID)
	if *v.Outcome != "accepted" || v.Result == nil {
		t.Fatalf("outcome %s (%s), want accepted", *v.Outcome, v.Reason)
	}
	if len(v.Attempts) != 2 || v.Attempts[0].Outcome != "lease_expired" || v.Attempts[1].Outcome != "ok" {
		t.Fatalf("attempts %+v, want the dead worker's lease_expired, then ok", v.Attempts)
	}
	b.WaitLedger(t, "acme", 1)
	// Time passes (the reaper waits a grace period before it decides a
	// worker is dead); then the ledger takes the dead worker's call.
	b.Count(t, `WITH u AS (UPDATE attempts SET started_at = now() - interval '10 minutes' WHERE work_id = $1 RETURNING 1)
		SELECT count(*) FROM u`, r.WorkID)
	if _, err := b.Cell.Ledger.Reap(ctx); err != nil {
		t.Fatal(err)
	}
	if got, calls := b.Count(t, `SELECT count(*) FROM ledger WHERE tenant_id = 'acme'`), b.Calls("acme"); int64(got) != calls || calls != 2 {
		t.Fatalf("ledger rows %d, provider calls %d; want 2 and 2", got, calls)
	}
	if n := b.Count(t, `SELECT count(*) FROM ledger WHERE work_id = $1 AND estimated AND outcome = 'lease_expired'`, r.WorkID); n != 1 {
		t.Errorf("the dead worker's call is not an estimated lease_expired ledger row")
	}
	if n := b.Count(t, `SELECT count(*) FROM results WHERE work_id = $1`, r.WorkID); n != 1 {
		t.Errorf("result rows = %d, want 1", n)
	}
}

// startClassifier starts the cell's classifier for a test that set up the
// cell without one.
func startClassifier(t *testing.T, b *celltest.Bundle) {
	t.Helper()
	if err := b.Cell.Classifier.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Cell.Classifier.Stop(context.Background()) })
}
