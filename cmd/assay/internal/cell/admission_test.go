package cell_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/event"
	"assay.dev/pkg/store"
	"assay.dev/services/classifier"
)

// decisionLog collects the JSON log lines of a cell.
type decisionLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (d *decisionLog) Write(p []byte) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.buf.Write(p)
}

// find returns the decision with the key and outcome whose reason holds
// text, or nil.
func (d *decisionLog) find(key, outcome, text string) map[string]any {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, line := range strings.Split(d.buf.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["key"] == key && m["outcome"] == outcome {
			if r, _ := m["reason"].(string); strings.Contains(r, text) {
				return m
			}
		}
	}
	return nil
}

// poll waits for cond with a deadline.
func poll(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A newer revision cancels the model call running for the older one: the
// call ends at once (not at the next heartbeat, 20 s away, nor at the call
// timeout), its attempt is recorded stale, and only the newer revision
// gets a result.
func TestSupersedeCancelsRunningCall(t *testing.T) {
	t.Parallel()
	logs := &decisionLog{}
	b := celltest.Setup(t, cell.Options{Log: slog.New(slog.NewJSONHandler(logs, nil)),
		Classifier: classifier.Config{LeaseTTL: time.Minute, CallTimeout: time.Minute}})
	it := evalset.Items()[2]
	if err := b.Sim.AddFault(sim.Fault{Kind: sim.FaultHang, Tenant: "acme", Match: "rev one", Times: 1}); err != nil {
		t.Fatal(err)
	}
	_, first := b.Submit(t, celltest.CodeReview(it, "rev one"))
	poll(t, "the first revision's call reaches the provider", 20*time.Second, func() bool { return b.Calls("acme") == 1 })

	next := celltest.CodeReview(it, "rev two")
	next.Revision = strings.Repeat("c", 40)
	_, second := b.Submit(t, next)
	poll(t, "the hanging call is canceled and recorded", 30*time.Second, func() bool {
		return b.Count(t, `SELECT count(*) FROM attempts WHERE work_id = $1 AND outcome = 'stale_lease'`, first.WorkID) == 1
	})
	if logs.find(first.WorkID, "superseded", "model call canceled") == nil {
		t.Fatalf("no supersede decision of the classifier naming the canceled call")
	}
	if v := b.Wait(t, second.WorkID); *v.Outcome != "accepted" {
		t.Fatalf("newer revision: %s (%s)", *v.Outcome, v.Reason)
	}
	if v := b.Wait(t, first.WorkID); *v.Outcome != "superseded" || v.Result != nil {
		t.Fatalf("older revision: %s, result %v", *v.Outcome, v.Result)
	}
	if n := b.Count(t, `SELECT count(*) FROM results WHERE work_id = $1`, first.WorkID); n != 0 {
		t.Fatalf("%d results for superseded work", n)
	}
	// The canceled call is still an attempt the tenant's ledger holds.
	b.WaitLedger(t, "acme", 2)
}

// A 429 with Retry-After sends the message back with that delay: while it
// waits no permit and no slot is held, so other work runs on the only
// permit, and the retry comes no earlier than the provider asked.
func TestRetryAfterHoldsNoPermit(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{Classifier: classifier.Config{Concurrency: 1, FixedConcurrency: true}})
	// Long enough for other work to be taken and answered within it on a
	// loaded machine: the throttled work must still be waiting after that.
	const retryAfter = 10 * time.Second
	if err := b.Sim.AddFault(sim.Fault{Kind: sim.FaultRateLimit, Tenant: "acme", Match: "throttled", RetryAfter: retryAfter, Times: 1}); err != nil {
		t.Fatal(err)
	}
	_, slow := b.Submit(t, celltest.CodeReview(evalset.Items()[4], "throttled"))
	poll(t, "the 429 is recorded", 20*time.Second, func() bool {
		return b.Count(t, `SELECT count(*) FROM attempts WHERE work_id = $1 AND outcome = 'rate_limited'`, slow.WorkID) == 1
	})
	lim := b.Cell.Classifier.Limiter()
	poll(t, "the permit and the slot are given back within the Retry-After", retryAfter, func() bool {
		s := lim.Stats()
		return s.InFlight == 0 && s.InHand == 0
	})
	if s := lim.Stats(); s.Limit != 1 {
		t.Fatalf("limit %d, want the fixed 1", s.Limit)
	}
	_, fast := b.Submit(t, celltest.CodeReview(evalset.Items()[5], "not throttled"))
	if v := b.Wait(t, fast.WorkID); *v.Outcome != "accepted" {
		t.Fatalf("other work: %s", *v.Outcome)
	}
	if n := b.Count(t, `SELECT count(*) FROM work WHERE id = $1 AND state = 'queued'`, slow.WorkID); n != 1 {
		t.Fatalf("the throttled work finished before its Retry-After, while other work ran")
	}
	if v := b.Wait(t, slow.WorkID); *v.Outcome != "accepted" {
		t.Fatalf("throttled work: %s", *v.Outcome)
	}
	var gap float64
	if err := b.DB.QueryRow(context.Background(), `SELECT extract(epoch FROM max(started_at) - min(finished_at))
		FROM attempts WHERE work_id = $1`, slow.WorkID).Scan(&gap); err != nil {
		t.Fatal(err)
	}
	if gap < retryAfter.Seconds() {
		t.Fatalf("retry %.3f s after the 429, want at least the %s Retry-After", gap, retryAfter)
	}
	if st := b.Sim.Stats(); st.Early != 0 {
		t.Fatalf("%d calls before the Retry-After", st.Early)
	}
}

// Work whose deadline passes ends expired, and a late answer does not
// revive it: the sweeper expires the claimed work, the committer then
// records the answer stale and publishes nothing.
func TestDeadlineExpiresAndLateResultIsNotRevived(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{NoClassifier: true})
	ctx := context.Background()
	req := celltest.CodeReview(evalset.Items()[6], "short deadline")
	req.DeadlineSeconds = 1
	_, r := b.Submit(t, req)
	st := b.Cell.Env.Store
	attempt, token := "00000000-0000-4000-8000-0000000000a1", "00000000-0000-4000-8000-0000000000b1"
	w, ok, err := st.Claim(ctx, r.WorkID, attempt, token, time.Minute, 0)
	if err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	// The worker holds a live lease, but the deadline is the caller's.
	poll(t, "the sweeper expires the work", 20*time.Second, func() bool {
		if err := b.Cell.Ingress.SweepOnce(ctx); err != nil {
			t.Fatal(err)
		}
		cur, err := st.GetWork(ctx, r.WorkID)
		return err == nil && cur.State == "expired"
	})
	out := `{"changeId":"` + w.ID + `","schemaVersion":"` + w.SchemaVersion + `","findings":[]}`
	if _, err := st.RecordAttempt(ctx, store.AttemptRecord{AttemptID: attempt, WorkID: w.ID, LeaseToken: token,
		Outcome: "ok", Raw: []byte(out)}); err != nil {
		t.Fatal(err)
	}
	ev := event.Result{AttemptID: attempt, WorkID: w.ID, TenantID: "acme", Region: "us", Number: 1, LeaseToken: token,
		Contract: w.Contract, SchemaVersion: w.SchemaVersion, TaxonomyVersion: w.TaxonomyVersion, Digest: w.Digest,
		Outcome: "ok", Final: true}
	if err := b.Cell.Committer.Commit(ctx, ev); err != nil {
		t.Fatal(err)
	}
	v := b.Wait(t, r.WorkID)
	if *v.Outcome != "expired" || v.Result != nil {
		t.Fatalf("after the late answer: %s, result %v", *v.Outcome, v.Result)
	}
	if n := b.Count(t, `SELECT count(*) FROM attempts WHERE id = $1 AND outcome = 'stale_lease'`, attempt); n != 1 {
		t.Fatalf("late answer not recorded stale")
	}
}
