package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/evalset"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outbox"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/services/classifier"
	"assay.dev/services/ingress"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// bundle is one cell on real Postgres and real JetStream, with the
// simulated provider and one tenant.
type bundle struct {
	cell   *cell
	sim    *sim.Server
	token  string
	tenant string
	http   *http.Client
}

func setup(t *testing.T, o cellOptions) *bundle { return setupFront(t, o, nil) }

// setupFront is setup with front, when not nil, wrapped around the simulated
// provider: every model call of the cell passes through it.
func setupFront(t *testing.T, o cellOptions, front func(http.Handler) http.Handler) *bundle {
	t.Helper()
	ctx := context.Background()
	s := sim.New(sim.Options{})
	t.Cleanup(func() { _ = s.Close() })
	var simURL string
	if front == nil {
		var err error
		if simURL, err = s.Start("127.0.0.1:0"); err != nil {
			t.Fatalf("sim: %v", err)
		}
	} else {
		srv := httptest.NewServer(front(s))
		t.Cleanup(srv.Close)
		simURL = srv.URL
	}
	o.Config = config.Config{Region: "us", DatabaseURL: testenv.Database(t), NATSURL: testenv.NATS(t),
		ModelBaseURL: simURL, Model: "assay-sim-1", HTTPAddr: "127.0.0.1:0"}
	if o.Log == nil {
		o.Log = telemetry.NewLogger(io.Discard, "test", "us", slog.LevelInfo)
	}
	c, err := startCell(ctx, o)
	if err != nil {
		t.Fatalf("start cell: %v", err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Stop(sctx)
	})
	b := &bundle{cell: c, sim: s, tenant: "acme", token: store.NewToken(), http: &http.Client{Timeout: 20 * time.Second}}
	if err := c.Env.Store.SeedTenants(ctx, []store.TenantSeed{
		{ID: "acme", HomeRegion: "us", Token: b.token},
		{ID: "globex", HomeRegion: "eu", Token: "globex-token"},
	}); err != nil {
		t.Fatalf("seed: %v", err)
	}
	return b
}

func codeReview(it evalset.Item, title string) ingress.SubmitRequest {
	in, _ := json.Marshal(map[string]string{"diff": it.Diff, "title": title})
	return ingress.SubmitRequest{Contract: "code-review", SourceID: it.SourceID, Revision: it.Revision, Input: in}
}

func (b *bundle) post(t *testing.T, token string, body any) (int, []byte) {
	t.Helper()
	raw, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, b.cell.URL+"/v1/work", bytes.NewReader(raw))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := b.http.Do(req)
	if err != nil {
		t.Fatalf("POST /v1/work: %v", err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

func (b *bundle) submit(t *testing.T, req ingress.SubmitRequest) (int, ingress.SubmitResponse) {
	t.Helper()
	status, raw := b.post(t, b.token, req)
	var r ingress.SubmitResponse
	if status != http.StatusAccepted && status != http.StatusOK {
		t.Fatalf("POST /v1/work: HTTP %d: %s", status, raw)
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatalf("decode: %v: %s", err, raw)
	}
	return status, r
}

// wait polls GET /v1/work/{id} until the work has an outcome.
func (b *bundle) wait(t *testing.T, id string) ingress.WorkView {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		req, _ := http.NewRequest(http.MethodGet, b.cell.URL+"/v1/work/"+id, nil)
		req.Header.Set("Authorization", "Bearer "+b.token)
		resp, err := b.http.Do(req)
		if err != nil {
			t.Fatalf("GET: %v", err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /v1/work/%s: HTTP %d: %s", id, resp.StatusCode, raw)
		}
		var v ingress.WorkView
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatalf("decode: %v", err)
		}
		if v.Outcome != nil {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("work %s still %s after 60s", id, v.State)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (b *bundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.cell.Env.Store.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// waitLedger waits until the ledger holds want rows for the tenant: attempt
// events are recorded asynchronously.
func (b *bundle) waitLedger(t *testing.T, tenant string, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := b.count(t, `SELECT count(*) FROM ledger WHERE tenant_id = $1`, tenant)
		if got == want {
			return
		}
		if got > want || time.Now().After(deadline) {
			t.Fatalf("ledger rows for %s = %d, want %d", tenant, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// handClassifiers returns a maker of classifiers of the cell that are not
// started, for tests that drive Process by hand, and relays their outbox
// rows (a started classifier runs its own relay).
func (b *bundle) handClassifiers(t *testing.T) func(classifier.Config) *classifier.Service {
	t.Helper()
	env := b.cell.Env
	relay := &outbox.Relay{Store: env.Store, JS: env.JS, Log: env.Log, Every: 20 * time.Millisecond,
		Subjects: []string{event.StreamPrefix(event.KindResult, "us"), event.StreamPrefix(event.KindAttempt, "us")}}
	relay.Start(context.Background())
	t.Cleanup(relay.Stop)
	return func(cfg classifier.Config) *classifier.Service {
		t.Helper()
		cfg.Region, cfg.Model = "us", "assay-sim-1"
		s, err := classifier.New(cfg, classifier.Deps{Store: env.Store, JS: env.JS, Model: modelClient(env.Config),
			Contracts: env.Contracts, Log: env.Log, Tel: env.Tel})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
}

func (b *bundle) calls(tenant string) int64 { return b.sim.Stats().Tenants[tenant].Calls }

func TestConcurrentIdenticalSubmissions(t *testing.T) {
	t.Parallel()
	b := setup(t, cellOptions{})
	req := codeReview(evalset.Items()[0], "concurrent")
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
			status, raw := b.post(t, b.token, req)
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
	if v := b.wait(t, id); *v.Outcome != "accepted" {
		t.Fatalf("outcome %s (%s), want accepted", *v.Outcome, v.Reason)
	}
	b.waitLedger(t, "acme", 1)
	if n := b.count(t, `SELECT count(*) FROM work`); n != 1 {
		t.Errorf("work rows = %d, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM results`); n != 1 {
		t.Errorf("result rows = %d, want 1", n)
	}
	if n := b.calls("acme"); n != 1 {
		t.Errorf("model calls = %d, want 1", n)
	}
	// One trace spans ingress → classifier → committer and ledger: the
	// WORK, RESULT and ATTEMPT messages carry the same trace id.
	traces := map[string]string{}
	for _, kind := range []string{event.KindWork, event.KindResult, event.KindAttempt} {
		st, err := b.cell.Env.JS.Stream(context.Background(), event.StreamName(kind, "us"))
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
	if traces[event.KindWork] != traces[event.KindResult] || traces[event.KindWork] != traces[event.KindAttempt] {
		t.Errorf("trace ids differ across the path: %v", traces)
	}
}

func TestRevisionsAndRedelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, cellOptions{})
	it := evalset.Items()[1]
	status, first := b.submit(t, codeReview(it, "rev one"))
	if status != http.StatusAccepted {
		t.Fatalf("first submission: HTTP %d, want 202", status)
	}
	if v := b.wait(t, first.WorkID); *v.Outcome != "accepted" || v.Result == nil {
		t.Fatalf("first: outcome %s, result %v", *v.Outcome, v.Result)
	}
	// The same webhook delivered again after completion costs nothing.
	status, again := b.submit(t, codeReview(it, "rev one"))
	if status != http.StatusOK || again.WorkID != first.WorkID || !again.Duplicate || again.State != "accepted" {
		t.Fatalf("redelivery: HTTP %d %+v; want 200, the first work id, accepted", status, again)
	}
	if n := b.calls("acme"); n != 1 {
		t.Fatalf("model calls after redelivery = %d, want 1", n)
	}
	// A force-push is a new revision: a second work item.
	next := codeReview(it, "rev two")
	next.Revision = strings.Repeat("b", 40)
	status, second := b.submit(t, next)
	if status != http.StatusAccepted || second.WorkID == first.WorkID {
		t.Fatalf("new revision: HTTP %d id %s; want 202 and a new id", status, second.WorkID)
	}
	if v := b.wait(t, second.WorkID); *v.Outcome != "accepted" {
		t.Fatalf("second: outcome %s", *v.Outcome)
	}
	if n := b.calls("acme"); n != 2 {
		t.Errorf("model calls = %d, want 2", n)
	}
	if n := b.count(t, `SELECT count(*) FROM work WHERE source_id = $1`, it.SourceID); n != 2 {
		t.Errorf("work rows for the source = %d, want 2", n)
	}
}

// Every way an answer can be wrong ends schema_rejected after one repair
// re-ask, with the reason recorded, the raw answers kept, and no result.
func TestGateFailuresEndRejected(t *testing.T) {
	t.Parallel()
	b := setup(t, cellOptions{})
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
		if err := b.sim.AddFault(sim.Fault{Kind: tc.fault, Tenant: "acme", Match: title, Times: 2}); err != nil {
			t.Fatal(err)
		}
		req := codeReview(items[0], title)
		req.SourceID = fmt.Sprintf("shop/gate#%d", i+1)
		_, r := b.submit(t, req)
		ids[i] = r.WorkID
	}
	for i, tc := range cases {
		t.Run(tc.fault, func(t *testing.T) {
			v := b.wait(t, ids[i])
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
			if n := b.count(t, `SELECT count(*) FROM attempts WHERE work_id = $1 AND coalesce(raw_response, '') <> ''`, ids[i]); n != 2 {
				t.Errorf("attempts with the raw answer kept = %d, want 2", n)
			}
			if n := b.count(t, `SELECT count(*) FROM results WHERE work_id = $1`, ids[i]); n != 0 {
				t.Errorf("result rows = %d, want 0", n)
			}
		})
	}
	b.waitLedger(t, "acme", 2*len(cases))
	if n := b.calls("acme"); n != int64(2*len(cases)) {
		t.Errorf("model calls = %d, want %d", n, 2*len(cases))
	}
}

// Two classifiers, one work item: the first one's lease lapses while its
// model call runs; the second claims, answers and is committed; the first
// answer arrives late and is recorded stale_lease, never a second result.
func TestLateAnswerFromLostLease(t *testing.T) {
	t.Parallel()
	b := setup(t, cellOptions{NoClassifier: true})
	mk := b.handClassifiers(t)
	// A stands for a worker that stalls: no heartbeat, a short lease.
	a := mk(classifier.Config{LeaseTTL: 500 * time.Millisecond, Heartbeat: -1})
	bb := mk(classifier.Config{})
	if err := b.sim.AddFault(sim.Fault{Kind: sim.FaultLatency, Tenant: "acme", Latency: 3 * time.Second, Times: 1}); err != nil {
		t.Fatal(err)
	}
	_, r := b.submit(t, codeReview(evalset.Items()[2], "lease race"))
	ev := event.Work{WorkID: r.WorkID, TenantID: "acme", Region: "us", Lane: event.Interactive, Dispatch: 1}

	ctx := context.Background()
	first := make(chan classifier.Disposition, 1)
	go func() { first <- a.Process(ctx, ev, func() {}) }()
	// Wait for A's claim to lapse.
	deadline := time.Now().Add(10 * time.Second)
	for b.count(t, `SELECT count(*) FROM work WHERE id = $1 AND attempts = 1 AND lease_expires_at < now()`, r.WorkID) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first claim never lapsed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if d := bb.Process(ctx, ev, func() {}); d.Kind != classifier.Ack {
		t.Fatalf("second worker: disposition %+v, want ack", d)
	}
	v := b.wait(t, r.WorkID)
	if *v.Outcome != "accepted" {
		t.Fatalf("outcome %s (%s), want accepted", *v.Outcome, v.Reason)
	}
	if d := <-first; d.Kind != classifier.Ack {
		t.Fatalf("first worker: disposition %+v, want ack", d)
	}
	b.waitLedger(t, "acme", 2)

	var late, winner string
	if err := b.cell.Env.Store.Pool.QueryRow(ctx, `SELECT id::text FROM attempts WHERE work_id = $1 AND number = 1`, r.WorkID).Scan(&late); err != nil {
		t.Fatal(err)
	}
	if err := b.cell.Env.Store.Pool.QueryRow(ctx, `SELECT attempt_id::text FROM results WHERE work_id = $1`, r.WorkID).Scan(&winner); err != nil {
		t.Fatal(err)
	}
	if winner == late {
		t.Fatal("the late answer became the result")
	}
	if n := b.count(t, `SELECT count(*) FROM results WHERE work_id = $1`, r.WorkID); n != 1 {
		t.Errorf("result rows = %d, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM attempts WHERE id = $1 AND outcome = 'stale_lease'`, late); n != 1 {
		t.Errorf("late attempt is not recorded stale_lease")
	}
	if n := b.count(t, `SELECT count(*) FROM ledger WHERE work_id = $1 AND tenant_id = 'acme'`, r.WorkID); n != 2 {
		t.Errorf("ledger rows for the work with its tenant = %d, want 2", n)
	}
	if n := b.count(t, `SELECT count(*) FROM ledger WHERE attempt_id = $1 AND outcome = 'stale_lease'`, late); n != 1 {
		t.Errorf("the late attempt's ledger row is not stale_lease")
	}
	if n := b.calls("acme"); n != 2 {
		t.Errorf("model calls = %d, want 2", n)
	}
}

// The whole demo on the test database server: every work item reaches an
// outcome and the ledger matches the provider's count per tenant.
func TestDemoReconciles(t *testing.T) {
	t.Setenv("ASSAY_DATABASE_URL", testenv.PostgresURL(t))
	t.Setenv("ASSAY_MODEL_BASE_URL", "")
	ctx := context.Background()
	e, err := startDev(ctx, devOptions{LogTo: io.Discard})
	if e != nil {
		defer e.Stop()
	}
	if err != nil {
		t.Fatalf("start dev: %v", err)
	}
	var out bytes.Buffer
	if err := runDemo(ctx, e, &out); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	calls, rows, err := e.waitLedger(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	items := len(evalset.Items())
	for _, tenant := range []string{"acme", "globex"} {
		if calls[tenant] == 0 || calls[tenant] != rows[tenant] {
			t.Errorf("%s: provider calls %d, ledger rows %d", tenant, calls[tenant], rows[tenant])
		}
	}
	// acme: every item once; globex: one item answered twice (the forced
	// invalid output and its repair).
	if calls["acme"] != int64(items+2) || calls["globex"] != int64(items+3) {
		t.Errorf("calls %v, want acme %d and globex %d", calls, items+2, items+3)
	}
	for _, want := range []string{"schema_rejected", "accepted", "same id: true"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestBadSettingsStopStartup(t *testing.T) {
	cases := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"ASSAY_REGION": "us", "ASSAY_DATABASE_URL": "postgres://%zz"}, "ASSAY_DATABASE_URL"},
		{map[string]string{"ASSAY_REGION": "mars", "ASSAY_DATABASE_URL": "postgres://postgres@127.0.0.1/x"}, `ASSAY_REGION: unknown region "mars"`},
		{map[string]string{"ASSAY_REGION": "", "ASSAY_DATABASE_URL": "postgres://postgres@127.0.0.1/x"}, "ASSAY_REGION: required"},
	}
	for _, tc := range cases {
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		var stderr bytes.Buffer
		if code := run([]string{"migrate"}, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", tc.env, code, stderr.String())
		}
		if !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: message %q does not name %s", tc.env, stderr.String(), tc.want)
		}
	}
}

// Requests for a tenant homed elsewhere are refused with the right region
// named, and nothing is stored.
func TestWrongRegionAndBadInputAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, cellOptions{})
	req := codeReview(evalset.Items()[0], "elsewhere")
	status, raw := b.post(t, "globex-token", req)
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
		status, raw := b.post(t, b.token, tc.body)
		if status != http.StatusBadRequest || !strings.Contains(string(raw), `"code":"`+tc.code+`"`) {
			t.Errorf("%v: HTTP %d %s; want 400 %s", tc.body, status, raw, tc.code)
		}
	}
	status, raw = b.post(t, "not-a-token", req)
	if status != http.StatusUnauthorized {
		t.Errorf("bad token: HTTP %d %s", status, raw)
	}
	if n := b.count(t, `SELECT count(*) FROM work`); n != 0 {
		t.Errorf("work rows = %d after refused requests, want 0", n)
	}
}

// A RESULT redelivered after its work was decided: the accepted attempt
// keeps its verdict, any other answer is recorded stale, and no second
// result appears.
func TestCommitterRedelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, cellOptions{})
	ctx := context.Background()
	_, r := b.submit(t, codeReview(evalset.Items()[7], "redelivered result"))
	if v := b.wait(t, r.WorkID); *v.Outcome != "accepted" {
		t.Fatalf("outcome %s", *v.Outcome)
	}
	var winner string
	if err := b.cell.Env.Store.Pool.QueryRow(ctx, `SELECT attempt_id::text FROM results WHERE work_id = $1`, r.WorkID).Scan(&winner); err != nil {
		t.Fatal(err)
	}
	ev := event.Result{AttemptID: winner, WorkID: r.WorkID, TenantID: "acme", Region: "us",
		LeaseToken: "00000000-0000-4000-8000-0000000000cc", Outcome: "ok", Final: true, Output: "{}"}
	if err := b.cell.Committer.Commit(ctx, ev); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM attempts WHERE id = $1 AND outcome = 'ok'`, winner); n != 1 {
		t.Errorf("a redelivered verdict relabelled the accepted attempt")
	}
	// A stray answer for the same work from an attempt that lost its lease.
	var stray string
	if err := b.cell.Env.Store.Pool.QueryRow(ctx, `INSERT INTO attempts (id, work_id, tenant_id, number, lease_token, outcome)
		VALUES (gen_random_uuid(), $1, 'acme', 99, gen_random_uuid(), 'ok') RETURNING id::text`, r.WorkID).Scan(&stray); err != nil {
		t.Fatal(err)
	}
	ev.AttemptID = stray
	for range 2 {
		if err := b.cell.Committer.Commit(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM attempts WHERE id = $1 AND outcome = 'stale_lease'`, stray); n != 1 {
		t.Errorf("the late answer is not recorded stale_lease")
	}
	if n := b.count(t, `SELECT count(*) FROM results WHERE work_id = $1`, r.WorkID); n != 1 {
		t.Errorf("result rows = %d, want 1", n)
	}
}
