package cell_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/pkg/devkit/fakegithub"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/placement"
	"assay.dev/pkg/store"
	"assay.dev/services/committer"
	"assay.dev/services/ingress"
)

// publishing has both cells publish to the region's fake GitHub as an
// App.
func publishing(t *testing.T) func(*cell.Options, *fakegithub.Server) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return func(o *cell.Options, gh *fakegithub.Server) {
		gh.App(5, &key.PublicKey)
		o.Committer = committer.Config{GitHubAPI: gh.URL, GitHubAppID: 5, GitHubKey: key}
	}
}

// moveBucket is region us's placement bucket.
func moveBucket(t *testing.T, r *region2) jetstream.KeyValue {
	t.Helper()
	kv, err := placement.Bucket(context.Background(), r.a.Cell.Env.JS, r.a.Names().PlacementBucket("us"), 1)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// awaitPhase waits until acme's move is in phase (or, for "", over).
func awaitPhase(t *testing.T, kv jetstream.KeyValue, phase string) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		snap, err := placement.Read(context.Background(), kv, "us")
		if err != nil {
			t.Fatal(err)
		}
		if snap.Moving["acme"].Phase == phase {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("acme's move is not in phase %q within 60s (it is in %q)", phase, snap.Moving["acme"].Phase)
		}
	}
}

// pullDelivery is a signed-ready pull_request delivery of shop/checkout
// pull request n, whose head is made from n; the fake GitHub knows the
// pull request.
func (r *region2) pullDelivery(t *testing.T, n int) ([]byte, string) {
	t.Helper()
	raw, err := os.ReadFile("../../../../services/ingress/testdata/pull_request_opened.json")
	if err != nil {
		t.Fatal(err)
	}
	var d map[string]any
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	head := fmt.Sprintf("%040x", 0xabc000+n)
	d["number"] = n
	pr := d["pull_request"].(map[string]any)
	pr["number"] = n
	pr["head"].(map[string]any)["sha"] = head
	r.gh.AddPull("shop/checkout", int64(n), deliveryBase, head, evalset.Items()[0].Diff)
	body, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return body, head
}

// A GitHub delivery sent at every phase of a move — before it (its call
// still running when the move starts), during the cut, during the tail,
// again for work the leaving cell still finishes, and after — is answered
// 2xx and gets its review exactly once.
func TestAWebhookAtEveryPhaseOfAMoveIsReviewedOnce(t *testing.T) {
	t.Parallel()
	r := setupRegion2(t, publishing(t))
	ctx := context.Background()
	kv := moveBucket(t, r)
	// acme's calls in us take seconds: work is in flight when the move
	// starts, and the tail lasts until it ends.
	if err := r.a.Sim.AddFault(sim.Fault{Kind: sim.FaultLatency, Tenant: "acme", Latency: 12 * time.Second}); err != nil {
		t.Fatal(err)
	}
	heads := map[string]string{} // phase → head
	works := map[string]string{} // phase → work
	deliver := func(phase string, n int) {
		t.Helper()
		body, head := r.pullDelivery(t, n)
		status, served, wr := r.deliver(t, body, "d-phase-"+phase)
		if status/100 != 2 || wr.WorkID == "" {
			t.Fatalf("delivery %s: HTTP %d (served by %q) %+v", phase, status, served, wr)
		}
		heads[phase], works[phase] = head, wr.WorkID
	}
	deliver("before", 101)
	for deadline := time.Now().Add(60 * time.Second); r.a.Count(t, `SELECT count(*) FROM work WHERE id = $1 AND state = 'running'`, works["before"]) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first delivery's work is not running in us within 60s")
		}
	}
	var moved placement.MoveReport
	var waited [][]store.Waiting
	var mu sync.Mutex
	done := make(chan error, 1)
	go func() {
		var err error
		moved, err = placement.Move(ctx, kv, "us", r.a.Cell.Env.Store, r.b.Cell.Env.Store, "acme", "us", "us-2",
			placement.MoveOptions{Quiet: 1500 * time.Millisecond, Settle: time.Minute, Waiting: func(w []store.Waiting) {
				mu.Lock()
				waited = append(waited, w)
				mu.Unlock()
			}})
		done <- err
	}()
	awaitPhase(t, kv, placement.PhaseCut)
	deliver("cut", 102)
	awaitPhase(t, kv, placement.PhaseTail)
	deliver("tail", 103)
	// The first pull request delivered again (a new delivery id): its work
	// is held for us, which still finishes it.
	body, _ := r.pullDelivery(t, 101)
	if status, _, wr := r.deliver(t, body, "d-phase-before-again"); status != http.StatusOK || wr.WorkID != works["before"] {
		t.Errorf("the first pull request delivered again during the tail: HTTP %d %+v; want 200 and its work %s", status, wr, works["before"])
	}
	// Asked of us-2, which holds it for us, the work and its event stream
	// are answered by us, which finishes it.
	if status, h, raw := r.get(t, r.b, r.acme, "/v1/work/"+works["before"]); status != http.StatusOK || h.Get(ingress.ServedBy) != "us" {
		t.Errorf("GET the first work at us-2 during the tail: HTTP %d, served by %q: %s; want us's answer", status, h.Get(ingress.ServedBy), raw)
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	sreq, _ := http.NewRequestWithContext(sctx, http.MethodGet, r.b.Cell.URL+"/v1/work/"+works["before"]+"/events", nil)
	sreq.Header.Set("Authorization", "Bearer "+r.acme)
	resp, err := r.b.HTTP.Do(sreq)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	event := false
	for n := 0; n < 20 && !event && sc.Scan(); n++ {
		event = strings.HasPrefix(sc.Text(), "id: ")
	}
	resp.Body.Close()
	cancel()
	if resp.StatusCode != http.StatusOK || resp.Header.Get(ingress.ServedBy) != "us" || !event {
		t.Errorf("the first work's events at us-2 during the tail: HTTP %d, served by %q, an event read %v; want us's stream",
			resp.StatusCode, resp.Header.Get(ingress.ServedBy), event)
	}
	if err := <-done; err != nil {
		t.Fatalf("move: %v", err)
	}
	deliver("after", 104)
	mu.Lock()
	named := len(waited) > 0 && len(waited[0]) > 0 && waited[0][0].WorkID == works["before"] && waited[0][0].Why != ""
	mu.Unlock()
	if !named || moved.Tail < 1 {
		t.Errorf("the move's tail: %d copied after the cut, waited for %v; want the first delivery's work %s named with why", moved.Tail, waited, works["before"])
	}
	// Each pull request gets one check run, completed; none a second.
	for phase, head := range heads {
		for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			runs := 0
			completed := false
			for _, c := range r.gh.CheckRuns() {
				if c.HeadSHA == head {
					runs++
					completed = c.Status == "completed"
				}
			}
			if runs > 1 {
				t.Fatalf("the %s delivery's pull request has %d check runs, want 1", phase, runs)
			}
			if runs == 1 && completed {
				break
			}
			if time.Now().After(deadline) {
				var state, pubs string
				_ = r.b.DB.QueryRow(ctx, `SELECT state || ' ' || coalesce(reason, '') FROM work WHERE id = $1`, works[phase]).Scan(&state)
				_ = r.b.DB.QueryRow(ctx, `SELECT coalesce(string_agg(outcome || ':' || state, ','), 'none') FROM publications WHERE work_id = $1`, works[phase]).Scan(&pubs)
				t.Fatalf("the %s delivery's pull request has no completed check run within 120s (%d runs; its work %s in us-2: %q, publications %s)",
					phase, runs, works[phase], state, pubs)
			}
		}
	}
	if nb, na := r.b.Count(t, `SELECT count(*) FROM work WHERE tenant_id = 'acme'`), r.a.Count(t, `SELECT count(*) FROM work WHERE tenant_id = 'acme'`); nb != 4 || na != 0 {
		t.Errorf("acme's work: %d rows in us-2, %d in us; want 4 and 0", nb, na)
	}
	calls := r.a.Calls("acme") + r.b.Calls("acme")
	r.b.WaitLedger(t, "acme", int(calls))
	if rows := r.b.Count(t, `SELECT count(*) FROM ledger WHERE tenant_id = 'acme'`); int64(rows) != calls {
		t.Errorf("model calls %d (us %d, us-2 %d), ledger rows in us-2 %d", calls, r.a.Calls("acme"), r.b.Calls("acme"), rows)
	}
}

// A tenant moves with a batch in flight: the items whose calls run finish
// in the cell they were admitted in and are copied over as they end, the
// items not begun by --settle are handed over and run in the receiving
// cell, and the batch completes there with every item ended, once, and
// every call in the ledger.
func TestMoveATenantWithABatchInFlight(t *testing.T) {
	t.Parallel()
	r := setupRegion2(t)
	ctx := context.Background()
	kv := moveBucket(t, r)
	if err := r.a.Sim.AddFault(sim.Fault{Kind: sim.FaultLatency, Tenant: "acme", Latency: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	texts := map[string]string{}
	for i := range 24 {
		texts[fmt.Sprintf("item-%02d", i)] = fmt.Sprintf("a comment to moderate, number %d", i)
	}
	status, raw := call(t, r.a, http.MethodPost, "/v1/batches", r.acme, ingress.BatchRequest{Contract: "moderation", Items: moderationItems(texts)})
	if status != http.StatusAccepted {
		t.Fatalf("POST /v1/batches: %d %s", status, raw)
	}
	sub := decode[ingress.BatchResponse](t, raw)
	for deadline := time.Now().Add(60 * time.Second); r.a.Count(t, `SELECT count(*) FROM work WHERE tenant_id = 'acme' AND state = 'running'`) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no item of the batch is running in us within 60s")
		}
	}
	moved, err := placement.Move(ctx, kv, "us", r.a.Cell.Env.Store, r.b.Cell.Env.Store, "acme", "us", "us-2",
		placement.MoveOptions{Quiet: 300 * time.Millisecond, Settle: time.Second})
	if err != nil {
		t.Fatalf("move: %v", err)
	}
	t.Logf("moved with the batch in flight: held %s, copied %v, %d copied after the cut, handed over %v", moved.Held, moved.Copied, moved.Tail, moved.Handed)
	if moved.Copied["work_held"] == 0 {
		t.Fatalf("the move held none of the batch's work for us: it was not in flight (copied %v)", moved.Copied)
	}
	var view ingress.BatchView
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		status, raw := call(t, r.a, http.MethodGet, "/v1/batches/"+sub.BatchID, r.acme, nil)
		if status != http.StatusOK {
			t.Fatalf("GET the batch through us after the move: %d %s", status, raw)
		}
		view = decode[ingress.BatchView](t, raw)
		if view.Complete {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the batch is not complete within 3 min of the move: %+v", view.Counts)
		}
	}
	if view.Accepted != len(texts) || view.Counts[outcome.Elsewhere] != 0 {
		t.Errorf("the batch after the move: %d of %d accepted, counts %v", view.Accepted, len(texts), view.Counts)
	}
	if nb, na := r.b.Count(t, `SELECT count(*) FROM batch_items i JOIN work w ON w.id = i.work_id WHERE i.batch_id = $1 AND w.state = 'accepted'`, sub.BatchID),
		r.a.Count(t, `SELECT count(*) FROM work WHERE tenant_id = 'acme'`); nb != len(texts) || na != 0 {
		t.Errorf("the batch's items: %d accepted in us-2, %d of acme's rows left in us; want %d and 0", nb, na, len(texts))
	}
	calls := r.a.Calls("acme") + r.b.Calls("acme")
	r.b.WaitLedger(t, "acme", int(calls))
	if rows := r.b.Count(t, `SELECT count(*) FROM ledger WHERE tenant_id = 'acme'`); int64(rows) != calls {
		t.Errorf("model calls %d (us %d, us-2 %d), ledger rows in us-2 %d", calls, r.a.Calls("acme"), r.b.Calls("acme"), rows)
	}
	if n := r.b.Count(t, `SELECT count(*) FROM work_held`); n != 0 {
		t.Errorf("us-2 still holds %d work rows for another cell", n)
	}
	if got := r.b.Count(t, `SELECT reserved_micros FROM budget_periods WHERE tenant_id = 'acme' UNION ALL SELECT 0 LIMIT 1`); got != 0 {
		t.Errorf("acme's budget in us-2 still holds %d µ$ reserved after every call ended", got)
	}
}
