package cell_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/fakegithub"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/placement"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
	"assay.dev/services/ingress"
)

// The GitHub App delivery of testdata/pull_request_opened.json: PR 41 of
// shop/checkout from installation 51234567.
const (
	deliverySecret       = "region-hook-secret"
	deliveryToken        = "ghs_region_reads_every_diff"
	deliveryInstallation = 51234567
	deliveryHead         = "9f1c2a7d4e5b6c8a0f1e2d3c4b5a69788776655a"
	deliveryBase         = "c0ffee1234567890abcdef1234567890abcdef12"
)

// region2 is a region of two cells, us and us-2, on one NATS, each
// registered in the region's placement map where it listens; acme and
// initech have one token that both cells know.
type region2 struct {
	a, b    *celltest.Bundle
	acme    string
	initech string
	// lookups counts cell us's lookups of a delivery's tenant.
	lookups *linkLookups
	// gh is the GitHub both cells publish to.
	gh *fakegithub.Server
}

// linkLookups counts the lookups of a GitHub delivery's tenant that one
// cell's ingress finished: a test acts once a delivery reached that step,
// not after the time it usually takes to.
type linkLookups struct{ n atomic.Int64 }

type linkLookup struct{}

func (l *linkLookups) tracer(service string) pgx.QueryTracer {
	if service != "ingress" {
		return nil
	}
	return l
}

func (l *linkLookups) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "(src.kind = $1 AND src.key = $2) OR") { // store.WebhookLinks
		return context.WithValue(ctx, linkLookup{}, true)
	}
	return ctx
}

func (l *linkLookups) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(linkLookup{}) != nil {
		l.n.Add(1)
	}
}

// setupRegion2 starts the region; each of opts adjusts both cells'
// options (with the region's fake GitHub) before they start.
func setupRegion2(t *testing.T, opts ...func(*cell.Options, *fakegithub.Server)) *region2 {
	t.Helper()
	natsURL := testenv.NATS(t)
	gh := fakegithub.New()
	t.Cleanup(gh.Close)
	gh.Install(deliveryInstallation, "shop/*")
	gh.StaticToken(deliveryToken)
	gh.AddPull("shop/checkout", 41, deliveryBase, deliveryHead, evalset.Items()[0].Diff)
	github := ingress.Config{GitHubSecret: deliverySecret, GitHubAPI: gh.URL, GitHubToken: deliveryToken}
	lookups := &linkLookups{}
	ao := cell.Options{RegisterURL: true, Ingress: github, StoreTracer: lookups.tracer}
	bo := cell.Options{RegisterURL: true, Ingress: github, Config: config.Config{Region: "us", Regions: config.DefaultRegions, Cell: "us-2"}}
	for _, o := range opts {
		o(&ao, gh)
		o(&bo, gh)
	}
	a := celltest.SetupOn(t, ao, nil, natsURL)
	b := celltest.SetupOn(t, bo, nil, natsURL)
	ctx := context.Background()
	r := &region2{a: a, b: b, acme: a.Token, initech: "initech-token-both-cells", lookups: lookups, gh: gh}
	for _, c := range []*celltest.Bundle{a, b} {
		if err := c.Cell.Env.Store.LinkSource(ctx, store.Link{Kind: store.SourceGitHubInstallation, Key: fmt.Sprint(deliveryInstallation),
			Tenant: "acme", Repositories: []string{"shop/*"}}); err != nil {
			t.Fatal(err)
		}
	}
	// One credential per tenant that every cell recognises.
	if err := b.Cell.Env.Store.RotateToken(ctx, "acme", a.Token); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*celltest.Bundle{a, b} {
		if err := c.Cell.Env.Store.AddTenant(ctx, "initech", "us", r.initech); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// place puts tenant on cell and waits until cell a's ingress sends its
// requests there: its answers then name the cell that served them.
func (r *region2) place(t *testing.T, tenant, token, cellID string) {
	t.Helper()
	ctx := context.Background()
	kv, err := placement.Bucket(ctx, r.a.Cell.Env.JS, r.a.Names().PlacementBucket("us"), 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := placement.Place(ctx, kv, tenant, cellID); err != nil {
		t.Fatal(err)
	}
	want := cellID
	if cellID == "us" {
		want = "" // a's own: served there, not sent on
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, h, _ := r.get(t, r.a, token, "/v1/views")
		if h.Get(ingress.ServedBy) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cell us does not send %s's requests to %s within 20s (answers served by %q)", tenant, cellID, h.Get(ingress.ServedBy))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (r *region2) get(t *testing.T, c *celltest.Bundle, token, path string) (int, http.Header, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, c.Cell.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	var buf strings.Builder
	_, _ = bufio.NewReader(resp.Body).WriteTo(&buf)
	return resp.StatusCode, resp.Header, []byte(buf.String())
}

// A tenant placed on the region's second cell is served there whichever
// ingress of the region it asks: work submitted at the first cell is made
// in the second's database alone, read back and followed through the
// first, and a duplicate sent to either gets the same work. A request sent
// on once is not sent on again, and a tenant the first cell serves is
// reached through the second.
func TestARegionOfTwoCells(t *testing.T) {
	t.Parallel()
	r := setupRegion2(t)
	r.place(t, "acme", r.acme, "us-2")

	req := celltest.CodeReview(evalset.Items()[0], "two cells")
	req.SourceID = "shop/cells#1"
	status, raw := r.a.Post(t, r.acme, req)
	var sub ingress.SubmitResponse
	if status != http.StatusAccepted || json.Unmarshal(raw, &sub) != nil {
		t.Fatalf("POST /v1/work at cell us for a tenant of us-2: HTTP %d %s", status, raw)
	}
	if n := r.b.Count(t, `SELECT count(*) FROM work WHERE id = $1`, sub.WorkID); n != 1 {
		t.Errorf("the work is in us-2's database %d times, want once", n)
	}
	if n := r.a.Count(t, `SELECT count(*) FROM work WHERE tenant_id = 'acme'`); n != 0 {
		t.Errorf("cell us made %d work rows for a tenant it does not serve", n)
	}
	for _, c := range []*celltest.Bundle{r.a, r.b} {
		status, raw := c.Post(t, r.acme, req)
		var dup ingress.SubmitResponse
		if status != http.StatusOK || json.Unmarshal(raw, &dup) != nil || dup.WorkID != sub.WorkID {
			t.Errorf("the same request again at %s: HTTP %d %s; want 200 and %s", c.Cell.URL, status, raw, sub.WorkID)
		}
	}
	// Followed through the first cell to its outcome.
	deadline := time.Now().Add(60 * time.Second)
	var v ingress.WorkView
	for {
		status, h, raw := r.get(t, r.a, r.acme, "/v1/work/"+sub.WorkID)
		if status != http.StatusOK || h.Get(ingress.ServedBy) != "us-2" || json.Unmarshal(raw, &v) != nil {
			t.Fatalf("GET /v1/work/%s at cell us: HTTP %d (served by %q) %s", sub.WorkID, status, h.Get(ingress.ServedBy), raw)
		}
		if v.Outcome != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no outcome within 60s: %+v", v)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if *v.Outcome != "accepted" {
		t.Errorf("outcome %s (%s), want accepted", *v.Outcome, v.Reason)
	}
	// Its event stream, through the first cell, runs to its end.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sreq, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.a.Cell.URL+"/v1/work/"+sub.WorkID+"/events", nil)
	sreq.Header.Set("Authorization", "Bearer "+r.acme)
	resp, err := r.a.HTTP.Do(sreq)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	seen := false
	for sc.Scan() && !seen {
		seen = strings.HasPrefix(sc.Text(), "event: end")
	}
	resp.Body.Close()
	if !seen || resp.Header.Get(ingress.ServedBy) != "us-2" {
		t.Errorf("the event stream through cell us: end event seen %v, served by %q", seen, resp.Header.Get(ingress.ServedBy))
	}

	// A request sent on once is refused, not sent on again.
	hop, _ := http.NewRequest(http.MethodGet, r.a.Cell.URL+"/v1/views", nil)
	hop.Header.Set("Authorization", "Bearer "+r.acme)
	hop.Header.Set(ingress.ForwardedBy, "us-3")
	resp, err = r.a.HTTP.Do(hop)
	if err != nil {
		t.Fatal(err)
	}
	var e struct {
		Error struct{ Code, Message string }
	}
	_ = json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest || e.Error.Code != "wrong_cell" || !strings.Contains(e.Error.Message, "us-2") {
		t.Errorf("a request sent on already: HTTP %d %+v; want 421 wrong_cell naming us-2", resp.StatusCode, e.Error)
	}

	// A tenant of the first cell (unplaced: the cell named after the
	// region) is reached through the second.
	status, h, raw := r.get(t, r.b, r.initech, "/v1/views")
	if status != http.StatusOK || h.Get(ingress.ServedBy) != "us" {
		t.Errorf("initech at cell us-2: HTTP %d, served by %q: %s", status, h.Get(ingress.ServedBy), raw)
	}
	// A GitHub delivery for acme's installation, sent to the first cell, is
	// taken by the second.
	body, err := os.ReadFile("../../../../services/ingress/testdata/pull_request_opened.json")
	if err != nil {
		t.Fatal(err)
	}
	status, served, wr := r.deliver(t, body, "d-two-cells")
	if status != http.StatusAccepted || wr.WorkID == "" || served != "us-2" {
		t.Fatalf("a delivery for acme at cell us: HTTP %d (served by %q) %+v", status, served, wr)
	}
	if nb, na := r.b.Count(t, `SELECT count(*) FROM work WHERE id = $1`, wr.WorkID), r.a.Count(t, `SELECT count(*) FROM work WHERE tenant_id = 'acme'`); nb != 1 || na != 0 {
		t.Errorf("the delivery's work: %d rows in us-2, %d of acme's in us; want 1 and 0", nb, na)
	}
	// The same delivery again while acme is being moved waits for the move
	// rather than being refused, and finds its work.
	kv, err := placement.Bucket(context.Background(), r.a.Cell.Env.JS, r.a.Names().PlacementBucket("us"), 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.PutString(context.Background(), "moving.acme", "us-2"); err != nil {
		t.Fatal(err)
	}
	// A read during the cut is held, not refused: answered once it ends.
	viewed := make(chan int, 1)
	go func() {
		status, _, _ := r.get(t, r.a, r.acme, "/v1/views")
		viewed <- status
	}()
	// The move ends once cell us has looked up the delivery's tenant, the
	// move still on, so the delivery is sent during it however slowly it
	// travels.
	looked := r.lookups.n.Load()
	during := make(chan bool, 1)
	go func() {
		deadline := time.Now().Add(30 * time.Second)
		for r.lookups.n.Load() == looked && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		during <- r.lookups.n.Load() > looked
		_ = kv.Delete(context.Background(), "moving.acme")
	}()
	status, _, again := r.deliver(t, body, "d-two-cells-again")
	if !<-during {
		t.Fatal("cell us did not look up the delivery's tenant within 30s of it being sent: it shows nothing of a delivery during a move")
	}
	if status != http.StatusOK || again.WorkID != wr.WorkID {
		t.Errorf("the delivery again during a move: HTTP %d %+v; want 200 and its work %s", status, again, wr.WorkID)
	}
	if status := <-viewed; status != http.StatusOK {
		t.Errorf("a read of acme's views during the cut: HTTP %d, want 200 once the cut ended", status)
	}
	// Usage, too, is read where the tenant's ledger is.
	status, h, raw = r.get(t, r.a, r.acme, "/v1/usage")
	var u struct{ Calls int64 }
	if status != http.StatusOK || h.Get(ingress.ServedBy) != "us-2" || json.Unmarshal(raw, &u) != nil || u.Calls < 1 {
		t.Errorf("acme's usage at cell us: HTTP %d, served by %q: %s; want us-2's, with the accepted work's call", status, h.Get(ingress.ServedBy), raw)
	}
}

// deliver sends GitHub delivery id of body, signed, to the first cell,
// and returns the status, the cell that served it and the answer.
func (r *region2) deliver(t *testing.T, body []byte, id string) (int, string, ingress.WebhookResponse) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, r.a.Cell.URL+"/v1/webhooks/github", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", "pull_request")
	req.Header.Set("X-GitHub-Delivery", id)
	req.Header.Set("X-Hub-Signature-256", ingress.Sign(deliverySecret, body))
	resp, err := r.a.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var wr ingress.WebhookResponse
	if err := json.NewDecoder(resp.Body).Decode(&wr); err != nil {
		t.Fatalf("delivery %s: HTTP %d, no answer: %v", id, resp.StatusCode, err)
	}
	return resp.StatusCode, resp.Header.Get(ingress.ServedBy), wr
}

// submitRetrying posts req as token to c until it is taken or found (a
// tenant held for a move answers 503: try again), and returns the status
// and work id.
func submitRetrying(t *testing.T, c *celltest.Bundle, token string, req ingress.SubmitRequest) (int, string) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		status, raw := c.Post(t, token, req)
		if status == http.StatusServiceUnavailable && time.Now().Before(deadline) {
			continue
		}
		var sub ingress.SubmitResponse
		if (status != http.StatusAccepted && status != http.StatusOK) || json.Unmarshal(raw, &sub) != nil {
			t.Errorf("POST /v1/work %s: HTTP %d %s", req.SourceID, status, raw)
			return status, ""
		}
		return status, sub.WorkID
	}
}

// submitUnrefused posts req as token to c once, fails the test unless it
// is taken or found (a move refuses nothing), and returns the status and
// work id.
func submitUnrefused(t *testing.T, c *celltest.Bundle, token string, req ingress.SubmitRequest) (int, string) {
	t.Helper()
	status, raw := c.Post(t, token, req)
	var sub ingress.SubmitResponse
	if (status != http.StatusAccepted && status != http.StatusOK) || json.Unmarshal(raw, &sub) != nil {
		t.Errorf("POST /v1/work %s: HTTP %d %s", req.SourceID, status, raw)
		return status, ""
	}
	return status, sub.WorkID
}

// usageOf reads acme's usage through c.
func (r *region2) usageOf(t *testing.T, c *celltest.Bundle) (calls, cost int64, servedBy string) {
	t.Helper()
	status, h, raw := r.get(t, c, r.acme, "/v1/usage")
	var u struct{ Calls, CostMicros int64 }
	if status != http.StatusOK || json.Unmarshal(raw, &u) != nil {
		t.Fatalf("usage: HTTP %d %s", status, raw)
	}
	return u.Calls, u.CostMicros, h.Get(ingress.ServedBy)
}

// A tenant moved from one cell of the region to the other under a steady
// load of new work and duplicates, sent to both cells' ingress: nothing is
// lost (each request's work ends, in the cell that serves the tenant
// now), nothing is made twice (every duplicate, before, during or after
// the move, gets its first work), the model calls of both cells are the
// ledger rows of the cell that holds the tenant, and its usage reads the
// same before and after a move.
func TestMoveATenantUnderLoad(t *testing.T) {
	t.Parallel()
	r := setupRegion2(t)
	ctx := context.Background()
	// The load is steady, not a tenant over its rate: the rate follows the
	// tenant to the other cell.
	if err := r.a.Cell.Env.Store.SetRate(ctx, "acme", 60000, 1000); err != nil {
		t.Fatal(err)
	}
	kv, err := placement.Bucket(ctx, r.a.Cell.Env.JS, r.a.Names().PlacementBucket("us"), 1)
	if err != nil {
		t.Fatal(err)
	}
	items := evalset.Items()
	request := func(i int) ingress.SubmitRequest {
		req := celltest.CodeReview(items[i%len(items)], fmt.Sprintf("move %d", i))
		req.SourceID = fmt.Sprintf("shop/move#%d", i)
		return req
	}
	works := map[int]string{}
	var moved placement.MoveReport
	moveDone := make(chan error, 1)
	const n = 120
	for i := range n {
		if i == 30 {
			go func() {
				var err error
				moved, err = placement.Move(ctx, kv, "us", r.a.Cell.Env.Store, r.b.Cell.Env.Store, "acme", "us", "us-2",
					placement.MoveOptions{Settle: time.Minute, Quiet: 500 * time.Millisecond})
				moveDone <- err
			}()
		}
		at := []*celltest.Bundle{r.a, r.b}[i%2]
		_, id := submitUnrefused(t, at, r.acme, request(i))
		works[i] = id
		if i%4 == 3 {
			// A duplicate of an earlier request, to the other cell.
			j := i - 3
			if _, again := submitUnrefused(t, []*celltest.Bundle{r.a, r.b}[(i+1)%2], r.acme, request(j)); again != works[j] {
				t.Errorf("a duplicate of request %d got %s, want its first work %s", j, again, works[j])
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := <-moveDone; err != nil {
		t.Fatalf("move: %v", err)
	}
	t.Logf("moved: held %s, copied %v", moved.Held, moved.Copied)
	// Everything ends in the cell that serves acme now.
	deadline := time.Now().Add(90 * time.Second)
	for r.b.Count(t, `SELECT count(*) FROM work WHERE tenant_id = 'acme' AND state IN ('queued', 'running')`) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("acme's work has not ended within 90s of the move")
		}
		time.Sleep(100 * time.Millisecond)
	}
	distinct := map[string]bool{}
	for _, id := range works {
		distinct[id] = true
	}
	if len(distinct) != n {
		t.Errorf("%d requests got %d distinct work items", n, len(distinct))
	}
	if got := r.b.Count(t, `SELECT count(*) FROM work WHERE tenant_id = 'acme'`); got != n {
		t.Errorf("us-2 holds %d of acme's work items, want %d (none lost, none twice)", got, n)
	}
	if got := r.b.Count(t, `SELECT count(*) FROM work WHERE tenant_id = 'acme' AND state <> 'accepted'`); got != 0 {
		t.Errorf("%d of acme's work items did not end accepted", got)
	}
	if got := r.a.Count(t, `SELECT count(*) FROM work WHERE tenant_id = 'acme'`); got != 0 {
		t.Errorf("us still holds %d of acme's work items after the move", got)
	}
	calls := r.a.Calls("acme") + r.b.Calls("acme")
	r.b.WaitLedger(t, "acme", int(calls))
	if rows := r.b.Count(t, `SELECT count(*) FROM ledger WHERE tenant_id = 'acme'`); int64(rows) != calls {
		t.Errorf("model calls %d (us %d, us-2 %d), ledger rows in us-2 %d", calls, r.a.Calls("acme"), r.b.Calls("acme"), rows)
	}

	// Moved back while quiet: the usage reads the same before and after.
	c1, cost1, by1 := r.usageOf(t, r.a)
	if _, err := placement.Move(ctx, kv, "us", r.b.Cell.Env.Store, r.a.Cell.Env.Store, "acme", "us-2", "us",
		placement.MoveOptions{Settle: 30 * time.Second, Quiet: 200 * time.Millisecond}); err != nil {
		t.Fatalf("move back: %v", err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		c2, cost2, by2 := r.usageOf(t, r.b)
		if by2 == "us" {
			if c2 != c1 || cost2 != cost1 || by1 != "us-2" || c1 != calls {
				t.Errorf("usage before the move back %d calls, %d µ$ (served by %s); after %d calls, %d µ$ (served by %s); model calls %d",
					c1, cost1, by1, c2, cost2, by2, calls)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("usage through us-2 is not served by us within 20s of the move back (served by %q)", by2)
		}
	}
	if got := r.a.Count(t, `SELECT count(*) FROM work WHERE tenant_id = 'acme'`); got != n {
		t.Errorf("us holds %d of acme's work items after the move back, want %d", got, n)
	}
}

// A request sent on to the tenant's cell, which does not answer, is
// refused 421 wrong_cell naming that cell: never the cell's internal
// address or the dial error, which the log has, at Warn.
func TestAFailedForwardNamesTheCellAlone(t *testing.T) {
	t.Parallel()
	logs := &lockedBuffer{}
	b := celltest.Setup(t, cell.Options{Log: telemetry.NewLogger(logs, "test", "us", slog.LevelInfo)})
	// Cell us-3 "answers" at an address that takes each connection and
	// closes it at once.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	dead := ln.Addr().String()
	_, port, _ := net.SplitHostPort(dead)
	ctx := context.Background()
	kv, err := placement.Bucket(ctx, b.Cell.Env.JS, b.Names().PlacementBucket("us"), 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := placement.Register(ctx, kv, "us-3", "http://"+dead); err != nil {
		t.Fatal(err)
	}
	if err := placement.Place(ctx, kv, "acme", "us-3"); err != nil {
		t.Fatal(err)
	}
	var status int
	var e struct {
		Error struct{ Code, Message string }
	}
	var raw []byte
	for deadline := time.Now().Add(time.Minute); ; {
		req, _ := http.NewRequest(http.MethodGet, b.Cell.URL+"/v1/views", nil)
		req.Header.Set("Authorization", "Bearer "+b.Token)
		resp, err := b.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if status = resp.StatusCode; status == http.StatusMisdirectedRequest || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := json.Unmarshal(raw, &e); err != nil || status != http.StatusMisdirectedRequest || e.Error.Code != "wrong_cell" ||
		!strings.Contains(e.Error.Message, "cell us-3") {
		t.Fatalf("acme on a cell that does not answer: HTTP %d %s; want 421 wrong_cell naming us-3", status, raw)
	}
	for _, leak := range []string{dead, port, "127.0.0.1", "EOF", "dial", "connection", "http://"} {
		if strings.Contains(string(raw), leak) {
			t.Errorf("the 421 shows %q: %s", leak, raw)
		}
	}
	warned := false
	for line := range strings.Lines(logs.String()) {
		var l struct{ Level, Msg, URL, Err string }
		if json.Unmarshal([]byte(line), &l) == nil && l.Level == "WARN" && strings.HasPrefix(l.Msg, "a request for another cell") {
			warned = warned || (strings.Contains(l.URL, dead) && l.Err != "")
		}
	}
	if !warned {
		t.Errorf("the log has no Warn with the cell's address and the error:\n%.3000s", logs.String())
	}
}
