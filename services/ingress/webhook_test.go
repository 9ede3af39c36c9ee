package ingress

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/contract"
	"assay.dev/pkg/devkit/storetest"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/event"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
	"assay.dev/pkg/telemetry/telemetrytest"
	"assay.dev/services/ingress/internal/webhook"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const (
	testSecret   = "whsec-4c1f0e7a9b2d"
	installation = "51234567" // installation.id in testdata
	headOpened   = "9f1c2a7d4e5b6c8a0f1e2d3c4b5a69788776655a"
	headSync     = "3b8e0c6f1a2d4e5f60718293a4b5c6d7e8f90a1b"
	prSource     = "shop/checkout#41"
)

func readPayload(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// mutate rewrites a testdata payload, as GitHub would send a variant of it.
func mutate(t testing.TB, name string, edit func(map[string]any)) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(readPayload(t, name), &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func pull(m map[string]any) map[string]any { return m["pull_request"].(map[string]any) }

// fakeGitHub serves pull-request diffs as the REST API does.
type fakeGitHub struct {
	srv     *httptest.Server
	mu      sync.Mutex
	diffs   map[string]string // "owner/repo#number"
	byRepo  map[string]string // "owner/repo": the diff set last
	unknown map[string]bool   // head SHAs GitHub does not have
	auth    []string
	paths   []string
	fail    atomic.Int32 // answer this many requests with 502
	delay   atomic.Int64 // nanoseconds before answering
	calls   atomic.Int32
}

func newFakeGitHub(t *testing.T) *fakeGitHub {
	g := &fakeGitHub{diffs: map[string]string{}, byRepo: map[string]string{}, unknown: map[string]bool{}}
	mux := http.NewServeMux()
	serve := func(w http.ResponseWriter, r *http.Request) {
		g.calls.Add(1)
		g.mu.Lock()
		g.auth = append(g.auth, r.Header.Get("Authorization"))
		g.paths = append(g.paths, r.URL.Path)
		var d string
		var ok bool
		if r.PathValue("basehead") != "" {
			// compare/{base}...{head}: the diff last set for the repository,
			// unless GitHub does not have the head.
			_, head, _ := strings.Cut(r.PathValue("basehead"), "...")
			d, ok = g.byRepo[r.PathValue("owner")+"/"+r.PathValue("repo")]
			ok = ok && !g.unknown[head]
		} else {
			d, ok = g.diffs[r.PathValue("owner")+"/"+r.PathValue("repo")+"#"+r.PathValue("number")]
		}
		g.mu.Unlock()
		if d := time.Duration(g.delay.Load()); d > 0 {
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return
			}
		}
		if g.fail.Load() > 0 {
			g.fail.Add(-1)
			http.Error(w, `{"message":"Server Error"}`, http.StatusBadGateway)
			return
		}
		if r.Header.Get("Accept") != "application/vnd.github.diff" || r.Header.Get("User-Agent") == "" {
			http.Error(w, `{"message":"Unsupported 'Accept' header"}`, http.StatusUnsupportedMediaType)
			return
		}
		if !ok {
			http.Error(w, `{"message":"Not Found"}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, d)
	}
	mux.HandleFunc("GET /repos/{owner}/{repo}/pulls/{number}", serve)
	mux.HandleFunc("GET /repos/{owner}/{repo}/compare/{basehead}", serve)
	g.srv = httptest.NewServer(mux)
	t.Cleanup(g.srv.Close)
	return g
}

func (g *fakeGitHub) setDiff(source, d string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.diffs[source] = d
	repo, _, _ := strings.Cut(source, "#")
	g.byRepo[repo] = d
}

func evalDiff(t testing.TB, name string) string {
	t.Helper()
	for _, it := range evalset.Items() {
		if it.Name == name {
			return it.Diff
		}
	}
	t.Fatalf("no evalset item %s", name)
	return ""
}

// lockedBuffer collects log lines from concurrent handlers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// decisions returns the decision log lines.
func (l *lockedBuffer) decisions(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range bytes.Split(l.b.Bytes(), []byte("\n")) {
		var m map[string]any
		if len(line) == 0 {
			continue
		}
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] == "decision" {
			out = append(out, m)
		}
	}
	return out
}

type webhookEnv struct {
	t   *testing.T
	svc *Service
	srv *httptest.Server
	st  *store.Store
	db  *pgxpool.Pool
	js  jetstream.JetStream
	gh  *fakeGitHub
	log *lockedBuffer
}

// newWebhookEnv runs ingress for region us on a fresh database and NATS,
// with tenants acme (us) and globex (eu) and a fake GitHub serving PR 41's
// diff. The testdata installation is linked to acme.
func newWebhookEnv(t *testing.T, edit func(*Config)) *webhookEnv {
	t.Helper()
	ctx := t.Context()
	st, dbURL := storetest.Migrated(t,
		store.TenantSeed{ID: "acme", HomeRegion: "us", Token: "tok-acme"},
		store.TenantSeed{ID: "globex", HomeRegion: "eu", Token: "tok-globex"},
	)
	if err := st.LinkSource(ctx, store.Link{Kind: store.SourceGitHubInstallation, Key: installation, Tenant: "acme", Repositories: []string{"shop/*"}}); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	tel := telemetrytest.Provider(t, "ingress", "us")
	reg, err := contract.Load()
	if err != nil {
		t.Fatal(err)
	}
	gh := newFakeGitHub(t)
	gh.setDiff(prSource, evalDiff(t, "05-checkout-state"))
	logs := &lockedBuffer{}
	cfg := Config{Region: "us", GitHubSecret: testSecret, GitHubAPI: gh.srv.URL, GitHubToken: "ghs_testtoken",
		GitHubTimeout: 2 * time.Second, MaxBodyBytes: 256 << 10}
	if edit != nil {
		edit(&cfg)
	}
	svc, err := New(cfg, Deps{Store: st, JS: js, Contracts: reg, Tel: tel,
		Log: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Stop(context.Background()) })
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)
	return &webhookEnv{t: t, svc: svc, srv: srv, st: st, db: testenv.Pool(t, dbURL), js: js, gh: gh, log: logs}
}

type answer struct {
	status int
	body   []byte
}

func (a answer) code() string {
	var b struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if json.Unmarshal(a.body, &b) != nil || b.Error.Message == "" {
		return ""
	}
	return b.Error.Code
}

func (a answer) work() WebhookResponse {
	var r WebhookResponse
	_ = json.Unmarshal(a.body, &r)
	return r
}

func (a answer) ignored() string {
	var r IgnoredResponse
	_ = json.Unmarshal(a.body, &r)
	return r.Ignored
}

// deliver posts body as GitHub does, signed with the configured secret
// unless sig is given.
func (e *webhookEnv) deliver(eventName, delivery string, body []byte, sig ...string) answer {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/webhooks/github", bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "GitHub-Hookshot/8e7a1c2")
	req.Header.Set("X-GitHub-Event", eventName)
	req.Header.Set("X-GitHub-Delivery", delivery)
	req.Header.Set("X-GitHub-Hook-ID", "498812345")
	req.Header.Set("X-GitHub-Hook-Installation-Target-Type", "integration")
	req.Header.Set("X-GitHub-Hook-Installation-Target-ID", "1034567")
	if len(sig) > 0 {
		if sig[0] != "" {
			req.Header.Set("X-Hub-Signature-256", sig[0])
		}
	} else {
		req.Header.Set("X-Hub-Signature-256", Sign(testSecret, body))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		e.t.Fatalf("answer %d has Content-Type %q: %s", resp.StatusCode, ct, b)
	}
	return answer{status: resp.StatusCode, body: b}
}

func (e *webhookEnv) link(l store.Link) {
	e.t.Helper()
	if err := e.st.LinkSource(e.t.Context(), l); err != nil {
		e.t.Fatal(err)
	}
}

func (e *webhookEnv) count(query string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.db.QueryRow(e.t.Context(), query, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
	return n
}

// nothingStored fails unless no work, outbox row or delivery exists.
func (e *webhookEnv) nothingStored() {
	e.t.Helper()
	for _, table := range []string{"work", "outbox", "webhook_deliveries"} {
		if n := e.count(`SELECT count(*) FROM ` + table); n != 0 {
			e.t.Fatalf("%d rows in %s, want none", n, table)
		}
	}
}

// published waits for the outbox to drain and returns the work messages on
// the cell's WORK stream.
func (e *webhookEnv) published() []event.Work {
	e.t.Helper()
	ctx := e.t.Context()
	deadline := time.Now().Add(30 * time.Second)
	for e.count(`SELECT count(*) FROM outbox WHERE published_at IS NULL`) > 0 {
		if time.Now().After(deadline) {
			e.t.Fatal("outbox not drained within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	st, err := e.js.Stream(ctx, (event.Names{Cell: "us"}).Stream(event.KindWork))
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []event.Work
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			e.t.Fatalf("get message %d: %v", seq, err)
		}
		var w event.Work
		if err := event.Decode(m.Data, &w); err != nil {
			e.t.Fatalf("message %d: %v", seq, err)
		}
		if want := (event.Names{Cell: "us"}).Work(w.Lane, w.TenantID); m.Subject != want {
			e.t.Fatalf("message %d on %s, want %s", seq, m.Subject, want)
		}
		out = append(out, w)
	}
	return out
}

func (e *webhookEnv) decision(key, outcome string) map[string]any {
	e.t.Helper()
	for _, d := range e.log.decisions(e.t) {
		if d["key"] == key && d["outcome"] == outcome {
			return d
		}
	}
	e.t.Fatalf("no decision %s for %s in the log: %v", outcome, key, e.log.decisions(e.t))
	return nil
}

func TestWebhookOpened(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, nil)
	a := e.deliver("pull_request", "72d3162e-cc78-11e3-81ab-4c9367dc0958", readPayload(t, "pull_request_opened.json"))
	if a.status != http.StatusAccepted {
		t.Fatalf("opened: %d %s, want 202", a.status, a.body)
	}
	r := a.work()
	wantID := WorkID("acme", WebhookContract, prSource, headOpened)
	if r.WorkID != wantID || r.State != "queued" || r.Duplicate || r.Region != "us" ||
		r.Delivery != "72d3162e-cc78-11e3-81ab-4c9367dc0958" || r.Links.Self != "/v1/work/"+wantID {
		t.Fatalf("answer %s, want work %s", a.body, wantID)
	}
	w, err := e.st.GetWork(t.Context(), wantID)
	if err != nil {
		t.Fatal(err)
	}
	if w.TenantID != "acme" || w.SourceID != prSource || w.Revision != headOpened || w.Contract != "code-review" ||
		w.Lane != event.Interactive || w.State != "queued" || w.Digest != Digest([]byte(w.Input)) {
		t.Fatalf("work row %+v", w)
	}
	var in struct{ Diff, Title string }
	if err := json.Unmarshal([]byte(w.Input), &in); err != nil {
		t.Fatal(err)
	}
	if in.Diff != evalDiff(t, "05-checkout-state") || in.Title != "Mark orders paid on confirmation and shipped from the warehouse" {
		t.Fatalf("input title %q, diff of %d bytes", in.Title, len(in.Diff))
	}
	c, _ := e.svc.D.Contracts.Get("code-review")
	if err := c.ValidateInput([]byte(w.Input)); err != nil {
		t.Fatalf("stored input does not validate: %v", err)
	}
	d, err := e.st.GetDelivery(t.Context(), r.Delivery)
	if err != nil || d.TenantID != "acme" || d.Event != "pull_request" || d.Action != "opened" ||
		d.Decision != store.DeliveryQueued || d.WorkID != wantID {
		t.Fatalf("delivery row %+v, %v", d, err)
	}
	msgs := e.published()
	if len(msgs) != 1 || msgs[0].WorkID != wantID || msgs[0].TenantID != "acme" || msgs[0].Region != "us" || msgs[0].Lane != event.Interactive {
		t.Fatalf("WORK stream holds %+v, want one message for %s", msgs, wantID)
	}
	e.gh.mu.Lock()
	auth := e.gh.auth
	e.gh.mu.Unlock()
	if len(auth) != 1 || auth[0] != "Bearer ghs_testtoken" {
		t.Fatalf("GitHub saw Authorization %q, want one fetch with the token", auth)
	}
	// The diff is the delivered revision's, base...head, and the delivery
	// keeps what publishing back needs.
	e.gh.mu.Lock()
	paths := e.gh.paths
	e.gh.mu.Unlock()
	if want := "/repos/shop/checkout/compare/c0ffee1234567890abcdef1234567890abcdef12..." + headOpened; len(paths) != 1 || paths[0] != want {
		t.Fatalf("GitHub saw %q, want %s", paths, want)
	}
	if n := e.count(`SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND installation_id::text = $2
		AND base_sha = 'c0ffee1234567890abcdef1234567890abcdef12'`, r.Delivery, installation); n != 1 {
		t.Fatalf("delivery row does not keep installation %s and the base SHA", installation)
	}
	if got := e.decision(wantID, "queued"); got["source"] != telemetry.Opaque(prSource) || got["revision"] != headOpened || got["via"] != "installation "+installation {
		t.Fatalf("decision %v", got)
	}

	// The work is the tenant's, through the ordinary API.
	req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/v1/work/"+wantID, nil)
	req.Header.Set("Authorization", "Bearer tok-acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/work/%s: %d", wantID, resp.StatusCode)
	}
}

func TestWebhookSignatureRefused(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, nil)
	body := readPayload(t, "pull_request_opened.json")
	tampered := bytes.Replace(body, []byte(headOpened), []byte(headSync), 1)
	for name, c := range map[string]struct {
		body []byte
		sig  string
	}{
		"missing":         {body, ""},
		"wrong secret":    {body, Sign("not-the-secret", body)},
		"tampered body":   {tampered, Sign(testSecret, body)},
		"sha1 only":       {body, "sha1=0123456789abcdef0123456789abcdef01234567"},
		"garbage":         {body, "sha256=xyz"},
		"empty signature": {body, "sha256="},
	} {
		a := e.deliver("pull_request", "d-"+strings.ReplaceAll(name, " ", "-"), c.body, c.sig)
		if a.status != http.StatusUnauthorized || a.code() != "invalid_signature" {
			t.Errorf("%s: %d %s, want 401 invalid_signature", name, a.status, a.body)
		}
	}
	e.nothingStored()
	if n := e.gh.calls.Load(); n != 0 {
		t.Fatalf("GitHub asked %d times for an unsigned delivery", n)
	}
}

func TestWebhookReplayedConcurrently(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, nil)
	body := readPayload(t, "pull_request_opened.json")
	const n = 50
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { answers[i] = e.deliver("pull_request", "5b4f9a10-0001-11f0-9e7c-0242ac120002", body) })
	}
	wg.Wait()
	accepted := 0
	want := WorkID("acme", WebhookContract, prSource, headOpened)
	for i, a := range answers {
		switch a.status {
		case http.StatusAccepted:
			accepted++
		case http.StatusOK:
			if !a.work().Duplicate {
				t.Errorf("answer %d: 200 not marked duplicate: %s", i, a.body)
			}
		default:
			t.Fatalf("answer %d: %d %s", i, a.status, a.body)
		}
		if got := a.work().WorkID; got != want {
			t.Fatalf("answer %d names work %q, want %q", i, got, want)
		}
	}
	if accepted != 1 {
		t.Fatalf("%d answers were 202, want exactly 1", accepted)
	}
	if w, d := e.count(`SELECT count(*) FROM work`), e.count(`SELECT count(*) FROM webhook_deliveries`); w != 1 || d != 1 {
		t.Fatalf("%d work rows and %d delivery rows, want 1 and 1", w, d)
	}
	if msgs := e.published(); len(msgs) != 1 || msgs[0].WorkID != want {
		t.Fatalf("WORK stream holds %+v, want one message", msgs)
	}
	// Sequential redelivery is answered from the record, without GitHub.
	calls := e.gh.calls.Load()
	if a := e.deliver("pull_request", "5b4f9a10-0001-11f0-9e7c-0242ac120002", body); a.status != http.StatusOK ||
		a.work().WorkID != want || a.work().State != "queued" {
		t.Fatalf("redelivery: %d %s", a.status, a.body)
	}
	if e.gh.calls.Load() != calls {
		t.Fatal("a recorded delivery fetched the diff again")
	}
	e.decision(webhook.DeliveryKey("5b4f9a10-0001-11f0-9e7c-0242ac120002"), "duplicate")
}

func TestWebhookSynchronizeSupersedes(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, nil)
	first := e.deliver("pull_request", "d-open", readPayload(t, "pull_request_opened.json"))
	if first.status != http.StatusAccepted {
		t.Fatalf("opened: %d %s", first.status, first.body)
	}
	e.gh.setDiff(prSource, evalDiff(t, "07-coupon-twice"))
	second := e.deliver("pull_request", "d-sync", readPayload(t, "pull_request_synchronize.json"))
	if second.status != http.StatusAccepted {
		t.Fatalf("synchronize: %d %s", second.status, second.body)
	}
	oldID, newID := first.work().WorkID, second.work().WorkID
	if newID != WorkID("acme", WebhookContract, prSource, headSync) || newID == oldID {
		t.Fatalf("synchronize made work %q (opened made %q)", newID, oldID)
	}
	old, err := e.st.GetWork(t.Context(), oldID)
	if err != nil {
		t.Fatal(err)
	}
	if old.State != "superseded" || old.Reason != "superseded by revision "+headSync {
		t.Fatalf("older revision: state %q reason %q, want superseded", old.State, old.Reason)
	}
	cur, err := e.st.GetWork(t.Context(), newID)
	if err != nil {
		t.Fatal(err)
	}
	if cur.State != "queued" || cur.Revision != headSync || !strings.Contains(cur.Input, "coupon") {
		t.Fatalf("new revision %+v", cur)
	}
	if msgs := e.published(); len(msgs) != 2 || msgs[1].WorkID != newID {
		t.Fatalf("WORK stream holds %+v", msgs)
	}
}

func TestWebhookReopened(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, nil)
	e.gh.setDiff(prSource, evalDiff(t, "07-coupon-twice"))
	a := e.deliver("pull_request", "d-reopen", readPayload(t, "pull_request_reopened.json"))
	want := WorkID("acme", WebhookContract, prSource, headSync)
	if a.status != http.StatusAccepted || a.work().WorkID != want {
		t.Fatalf("reopened: %d %s, want 202 for %s", a.status, a.body, want)
	}
	// Reopened again at the same head under another delivery: the ingress
	// fence answers with the same work and records the delivery.
	again := e.deliver("pull_request", "d-reopen-2", readPayload(t, "pull_request_reopened.json"))
	if again.status != http.StatusOK || again.work().WorkID != want || !again.work().Duplicate {
		t.Fatalf("second reopen: %d %s", again.status, again.body)
	}
	if d, err := e.st.GetDelivery(t.Context(), "d-reopen-2"); err != nil || d.Decision != store.DeliveryDuplicate || d.WorkID != want {
		t.Fatalf("second reopen delivery %+v, %v", d, err)
	}
	if n := e.count(`SELECT count(*) FROM work`); n != 1 {
		t.Fatalf("%d work rows, want 1", n)
	}
	e.decision(want, "duplicate")
}

func TestWebhookIgnored(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, nil)
	cases := []struct {
		event, delivery string
		body            []byte
		reason          string
	}{
		{"pull_request", "d-closed", readPayload(t, "pull_request_closed.json"), "pull_request action closed is not reviewed"},
		{"ping", "d-ping", readPayload(t, "ping.json"), "event ping is not reviewed"},
		{"issues", "d-issues", readPayload(t, "issues_opened.json"), "event issues is not reviewed"},
		{"pull_request", "d-labeled", mutate(t, "pull_request_opened.json", func(m map[string]any) {
			m["action"] = "labeled"
			m["label"] = map[string]any{"id": 1, "name": "orders"}
		}), "pull_request action labeled is not reviewed"},
	}
	for _, c := range cases {
		a := e.deliver(c.event, c.delivery, c.body)
		if a.status != http.StatusOK || a.ignored() != c.reason {
			t.Errorf("%s: %d %s, want 200 ignored %q", c.delivery, a.status, a.body, c.reason)
		}
		if d := e.decision(webhook.DeliveryKey(c.delivery), "ignored"); d["reason"] != c.reason || d["event"] != c.event {
			t.Errorf("%s: decision %v", c.delivery, d)
		}
	}
	e.nothingStored()
	if n := e.gh.calls.Load(); n != 0 {
		t.Fatalf("GitHub asked %d times for ignored deliveries", n)
	}
}

func TestWebhookTenantMapping(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, nil)
	unknown := mutate(t, "pull_request_opened.json", func(m map[string]any) { m["installation"].(map[string]any)["id"] = 999 })
	a := e.deliver("pull_request", "d-unknown", unknown)
	if a.status != http.StatusNotFound || a.code() != "unknown_installation" {
		t.Fatalf("unknown installation: %d %s, want 404 unknown_installation", a.status, a.body)
	}
	if d := e.decision(webhook.DeliveryKey("d-unknown"), "refused"); !strings.Contains(d["reason"].(string), "installation 999") {
		t.Fatalf("decision %v", d)
	}
	noInst := mutate(t, "pull_request_opened.json", func(m map[string]any) { delete(m, "installation") })
	if a := e.deliver("pull_request", "d-noinst", noInst); a.status != http.StatusNotFound || a.code() != "unknown_installation" {
		t.Fatalf("repository hook, unlinked: %d %s", a.status, a.body)
	}
	e.nothingStored()
	if n := e.gh.calls.Load(); n != 0 {
		t.Fatalf("GitHub asked %d times for unmapped deliveries", n)
	}

	// A repository webhook maps through the repository; so does an
	// installation nobody linked, when its repository is linked.
	if err := e.st.LinkSource(t.Context(), store.Link{Kind: store.SourceGitHubRepository, Key: "shop/checkout", Tenant: "acme"}); err != nil {
		t.Fatal(err)
	}
	want := WorkID("acme", WebhookContract, prSource, headOpened)
	if a := e.deliver("pull_request", "d-noinst", noInst); a.status != http.StatusAccepted || a.work().WorkID != want {
		t.Fatalf("repository hook, linked: %d %s", a.status, a.body)
	}
	if a := e.deliver("pull_request", "d-unknown", unknown); a.status != http.StatusOK || a.work().WorkID != want {
		t.Fatalf("unlinked installation, linked repository: %d %s", a.status, a.body)
	}
	if d := e.decision(want, "queued"); d["via"] != "repository shop/checkout" {
		t.Fatalf("decision %v", d)
	}

	// A tenant homed in another cell is refused here, with nothing stored.
	for _, l := range []store.Link{
		{Kind: store.SourceGitHubInstallation, Key: installation, Tenant: "globex", Repositories: []string{"shop/checkout"}},
		{Kind: store.SourceGitHubRepository, Key: "shop/checkout", Tenant: "globex"},
	} {
		if err := e.st.LinkSource(t.Context(), l); err != nil {
			t.Fatal(err)
		}
	}
	a = e.deliver("pull_request", "d-eu", readPayload(t, "pull_request_synchronize.json"))
	if a.status != http.StatusMisdirectedRequest || a.code() != "wrong_region" || !strings.Contains(string(a.body), "eu") {
		t.Fatalf("tenant in eu: %d %s, want 421 wrong_region", a.status, a.body)
	}
	if _, err := e.st.GetDelivery(t.Context(), "d-eu"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("wrong-region delivery recorded: %v", err)
	}
	if n := e.count(`SELECT count(*) FROM work WHERE tenant_id = 'globex'`); n != 0 {
		t.Fatalf("%d globex work rows in the us cell", n)
	}
}

func TestWebhookDiffFetchFailure(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, func(c *Config) { c.GitHubTimeout = 300 * time.Millisecond })
	body := readPayload(t, "pull_request_opened.json")
	const id = "9a0c77e2-3b1d-11f0-8a4e-0242ac120002"

	e.gh.fail.Store(1)
	a := e.deliver("pull_request", id, body)
	if a.status != http.StatusBadGateway || a.code() != "upstream_unavailable" {
		t.Fatalf("GitHub failing: %d %s, want 502 upstream_unavailable", a.status, a.body)
	}
	e.nothingStored()

	// GitHub hangs for a minute: the 300ms timeout answers long before,
	// however loaded the machine.
	e.gh.delay.Store(int64(time.Minute))
	start := time.Now()
	a = e.deliver("pull_request", id, body)
	if a.status != http.StatusBadGateway || a.code() != "upstream_unavailable" {
		t.Fatalf("GitHub hanging: %d %s, want 502 upstream_unavailable", a.status, a.body)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("a hanging GitHub held the webhook for %v", took)
	}
	e.nothingStored()

	// GitHub's redelivery carries the same id and now succeeds.
	e.gh.delay.Store(0)
	a = e.deliver("pull_request", id, body)
	if a.status != http.StatusAccepted || a.work().WorkID != WorkID("acme", WebhookContract, prSource, headOpened) {
		t.Fatalf("redelivery: %d %s, want 202", a.status, a.body)
	}
	if d, err := e.st.GetDelivery(t.Context(), id); err != nil || d.Decision != store.DeliveryQueued {
		t.Fatalf("delivery after redelivery %+v, %v", d, err)
	}

	// A revision GitHub does not know is no work either.
	const gone = "0000000000000000000000000000000000000404"
	e.gh.mu.Lock()
	e.gh.unknown[gone] = true
	e.gh.mu.Unlock()
	other := mutate(t, "pull_request_opened.json", func(m map[string]any) {
		m["number"] = 404
		pull(m)["number"] = 404
		pull(m)["head"].(map[string]any)["sha"] = gone
	})
	if a := e.deliver("pull_request", "d-404", other); a.status != http.StatusBadGateway || a.code() != "upstream_unavailable" {
		t.Fatalf("GitHub 404: %d %s", a.status, a.body)
	}
	if _, err := e.st.GetDelivery(t.Context(), "d-404"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("failed delivery recorded: %v", err)
	}
}

func TestWebhookDiffRefused(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, func(c *Config) { c.MaxDiffBytes = 1024 })
	body := readPayload(t, "pull_request_opened.json")
	if len(evalDiff(t, "05-checkout-state")) <= 1024 {
		t.Fatal("the test diff must be over the cap")
	}
	e.gh.setDiff(prSource, "this is not a unified diff\n")
	if a := e.deliver("pull_request", "d-garbage", body); a.status != http.StatusUnprocessableEntity || a.code() != "invalid_diff" {
		t.Fatalf("not a diff: %d %s, want 422 invalid_diff", a.status, a.body)
	}
	e.gh.setDiff(prSource, "")
	if a := e.deliver("pull_request", "d-empty", body); a.status != http.StatusOK || a.ignored() != "pull request has no changes" {
		t.Fatalf("empty diff: %d %s, want ignored", a.status, a.body)
	}
	e.nothingStored()
}

// A pull request whose diff is over the cap is stored dropped, without its
// diff, with a reason that says why and what would review it (the
// pull request's one comment); a redelivery, or another delivery of the
// same revision, finds it; the work cannot be run again as it is.
func TestWebhookDiffTooLarge(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, func(c *Config) { c.MaxDiffBytes = 1024 })
	body := readPayload(t, "pull_request_opened.json")
	a := e.deliver("pull_request", "d-big", body)
	if a.status != http.StatusAccepted {
		t.Fatalf("large diff: %d %s, want 202 with the work dropped", a.status, a.body)
	}
	var r WebhookResponse
	if err := json.Unmarshal(a.body, &r); err != nil {
		t.Fatal(err)
	}
	w, err := e.st.GetWork(t.Context(), r.WorkID)
	if err != nil {
		t.Fatal(err)
	}
	if w.State != "dropped" || !strings.HasPrefix(w.Reason, "diff_too_large: ") || !strings.Contains(w.Reason, "ASSAY_MAX_DIFF_BYTES") ||
		strings.Contains(w.Input, "diff --git") {
		t.Fatalf("work %s %q, input %d bytes; want dropped for its size, its diff not kept", w.State, w.Reason, len(w.Input))
	}
	for _, id := range []string{"d-big", "d-big-again"} {
		again := e.deliver("pull_request", id, body)
		var r2 WebhookResponse
		_ = json.Unmarshal(again.body, &r2)
		if again.status != http.StatusOK || r2.WorkID != r.WorkID || !r2.Duplicate {
			t.Fatalf("delivery %s: %d %s, want the same work, a duplicate", id, again.status, again.body)
		}
	}
	if _, err := e.st.Rerun(t.Context(), r.WorkID, time.Now().Add(time.Minute), func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil }); !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("rerun: %v, want ErrTooLarge", err)
	}
}

func TestWebhookRefusesMalformed(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, func(c *Config) { c.MaxBodyBytes = 64 << 10 })
	opened := readPayload(t, "pull_request_opened.json")

	big := mutate(t, "pull_request_opened.json", func(m map[string]any) { pull(m)["body"] = strings.Repeat("x", 70<<10) })
	if a := e.deliver("pull_request", "d-big", big); a.status != http.StatusRequestEntityTooLarge || a.code() != "payload_too_large" {
		t.Fatalf("oversize body: %d %s, want 413 payload_too_large", a.status, a.body)
	}
	badType := mutate(t, "pull_request_opened.json", func(m map[string]any) { m["number"] = "41" })
	if a := e.deliver("pull_request", "d-type", badType); a.status != http.StatusBadRequest || a.code() != "invalid_payload" {
		t.Fatalf("number as string: %d %s, want 400 invalid_payload", a.status, a.body)
	}
	if a := e.deliver("pull_request", "d-null", []byte("null")); a.status != http.StatusBadRequest || a.code() != "invalid_payload" {
		t.Fatalf("null body: %d %s, want 400 invalid_payload", a.status, a.body)
	}
	for _, id := range []string{"", "../../etc", "d 1", strings.Repeat("a", 101), "é"} {
		if a := e.deliver("pull_request", id, opened); a.status != http.StatusBadRequest || a.code() != "invalid_delivery" {
			t.Errorf("delivery %q: %d %s, want 400 invalid_delivery", id, a.status, a.body)
		}
	}
	for _, ev := range []string{"", "Pull_Request", "pull request", "x.y"} {
		if a := e.deliver(ev, "d-ev", opened); a.status != http.StatusBadRequest || a.code() != "invalid_event" {
			t.Errorf("event %q: %d %s, want 400 invalid_event", ev, a.status, a.body)
		}
	}
	form := []byte("payload=" + url.QueryEscape(string(opened)))
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/webhooks/github", bytes.NewReader(form))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-GitHub-Event", "pull_request")
	req.Header.Set("X-GitHub-Delivery", "d-form")
	req.Header.Set("X-Hub-Signature-256", Sign(testSecret, form))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if a := (answer{resp.StatusCode, b}); a.status != http.StatusUnsupportedMediaType || a.code() != "unsupported_media_type" {
		t.Fatalf("form-encoded: %d %s, want 415 unsupported_media_type", a.status, a.body)
	}
	e.nothingStored()
}

// A cell without a secret of its own takes only deliveries signed with a
// tenant's secret, for that tenant's repositories.
func TestWebhookWithoutCellSecret(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, func(c *Config) { c.GitHubSecret = "" })
	body := mutate(t, "pull_request_opened.json", func(m map[string]any) { delete(m, "installation") })
	if a := e.deliver("pull_request", "d-1", body, Sign("", body)); a.status != http.StatusUnauthorized || a.code() != "invalid_signature" {
		t.Fatalf("signed with nothing: %d %s, want 401 invalid_signature", a.status, a.body)
	}
	if a := e.deliver("pull_request", "d-1", body, Sign(testSecret, body)); a.status != http.StatusUnauthorized {
		t.Fatalf("signed with a secret the cell does not hold: %d %s, want 401", a.status, a.body)
	}
	e.nothingStored()
	secret := store.NewWebhookSecret()
	e.link(store.Link{Kind: store.SourceGitHubRepository, Key: "shop/checkout", Tenant: "acme"})
	if err := e.st.SetWebhookSecret(t.Context(), "acme", secret); err != nil {
		t.Fatal(err)
	}
	if a := e.deliver("pull_request", "d-1", body, Sign(secret, body)); a.status != http.StatusAccepted {
		t.Fatalf("signed with acme's secret: %d %s, want 202", a.status, a.body)
	}
}

// Deliveries can arrive out of order: a revision pushed earlier that is
// delivered after a later one is stored superseded and never announced, and
// the later revision stays live.
func TestWebhookLateOlderRevisionDoesNotSupersedeNewer(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, nil)
	e.gh.setDiff(prSource, evalDiff(t, "07-coupon-twice"))
	newer := e.deliver("pull_request", "d-sync-first", readPayload(t, "pull_request_synchronize.json"))
	if newer.status != http.StatusAccepted {
		t.Fatalf("synchronize: %d %s", newer.status, newer.body)
	}
	older := e.deliver("pull_request", "d-open-late", readPayload(t, "pull_request_opened.json"))
	if older.status != http.StatusAccepted {
		t.Fatalf("late opened: %d %s", older.status, older.body)
	}
	late, err := e.st.GetWork(t.Context(), older.work().WorkID)
	if err != nil {
		t.Fatal(err)
	}
	if late.State != "superseded" || !strings.Contains(late.Reason, headSync) {
		t.Fatalf("late older revision: state %q reason %q, want superseded naming %s", late.State, late.Reason, headSync)
	}
	cur, err := e.st.GetWork(t.Context(), newer.work().WorkID)
	if err != nil {
		t.Fatal(err)
	}
	if cur.State != "queued" {
		t.Fatalf("the newer revision is %s, want queued", cur.State)
	}
	var announced int
	if err := e.db.QueryRow(t.Context(), `SELECT count(*) FROM outbox WHERE msg_id LIKE $1 || '.%'`,
		late.ID).Scan(&announced); err != nil || announced != 0 {
		t.Fatalf("the late revision was announced %d times (%v)", announced, err)
	}
}

// The API holds a code review's diff to the webhooks' cap: one over it is
// refused 413 diff_too_large naming the setting, one at it is taken (over
// the input schema's old 262,144 characters), and nothing is stored for the
// refused one.
func TestSubmitDiffCap(t *testing.T) {
	t.Parallel()
	const limit = 300 << 10
	e := newWebhookEnv(t, func(c *Config) { c.MaxDiffBytes, c.MaxBodyBytes = limit, 0 })
	line := "+x := 1\n"
	body := func(n int, rev string) []byte {
		d := "diff --git a/a.go b/a.go\n--- a/a.go\n+++ b/a.go\n@@ -1,0 +1,1 @@\n"
		d += strings.Repeat(line, (n-len(d))/len(line))
		in, _ := json.Marshal(map[string]string{"diff": d})
		b, _ := json.Marshal(map[string]any{"contract": "code-review", "sourceId": "shop/app#9", "revision": rev, "input": json.RawMessage(in)})
		return b
	}
	if a := e.postRaw(body(limit+1024, "r-over")); a.status != http.StatusRequestEntityTooLarge || a.code() != "diff_too_large" ||
		!strings.Contains(string(a.body), "ASSAY_MAX_DIFF_BYTES") {
		t.Fatalf("over the cap: %d %s, want 413 diff_too_large naming the setting", a.status, a.body)
	}
	e.nothingStored()
	if a := e.postRaw(body(limit-1024, "r-at")); a.status != http.StatusAccepted {
		t.Fatalf("under the cap: %d %s, want 202", a.status, a.body)
	}
}
