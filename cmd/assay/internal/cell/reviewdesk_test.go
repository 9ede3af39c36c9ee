package cell_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/devkit/fakegithub"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/services/committer"
	"assay.dev/services/ingress"
)

// deskCell is a cell that publishes to a fake GitHub as an App installed
// on acme's shop/* repositories, with two reviewers (ana and bo) and a
// second tenant, initech.
type deskCell struct {
	*consoleCell
	gh       *fakegithub.Server
	ana, bo  string // the reviewers' operator tokens
	rejected string // acme's code review the gate refused: its review item is open
}

func setupDesk(t *testing.T) *deskCell {
	t.Helper()
	gh := fakegithub.New()
	t.Cleanup(gh.Close)
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	gh.App(5, &key.PublicKey)
	gh.Install(7, "shop/*")
	b := celltest.Setup(t, cell.Options{Ingress: ingress.Config{ConsoleEvery: 200 * time.Millisecond},
		Committer: committer.Config{GitHubAPI: gh.URL, GitHubAppID: 5, GitHubKey: key}})
	d := &deskCell{consoleCell: &consoleCell{Bundle: b, Operator: store.NewToken(), Initech: store.NewToken()}, gh: gh,
		ana: store.NewToken(), bo: store.NewToken()}
	ctx := context.Background()
	st := b.Cell.Env.Store
	if err := st.AddTenant(ctx, "initech", "us", d.Initech); err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]string{"ana": d.ana, "bo": d.bo} {
		if err := st.AddOperatorTokenAs(ctx, name, store.RoleReviewer, tok); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.LinkSource(ctx, store.Link{Kind: store.SourceGitHubInstallation, Key: "7", Tenant: "acme", Repositories: []string{"shop/*"}}); err != nil {
		t.Fatal(err)
	}
	// The answer and the repair re-ask both put a finding at a line outside
	// every changed hunk: the work ends schema_rejected, for a person.
	const title = "desk: a finding off the diff"
	if err := b.Sim.AddFault(sim.Fault{Kind: sim.FaultLineOutsideHunk, Tenant: "acme", Match: title, Times: 2}); err != nil {
		t.Fatal(err)
	}
	req := celltest.CodeReview(evalset.Items()[0], title)
	req.SourceID = "shop/app#77"
	_, r := b.Submit(t, req)
	if v := b.Wait(t, r.WorkID); *v.Outcome != outcome.SchemaRejected {
		t.Fatalf("the work ended %s (%s), want schema_rejected", *v.Outcome, v.Reason)
	}
	d.rejected = r.WorkID
	// Its own outcome is published first: a check run that says there is
	// no review.
	d.await(t, "the schema_rejected check run", func() bool { return len(d.runsOf(r.WorkID)) == 1 })
	return d
}

// reviewID is the review item of work id.
func reviewIDOf(workID string) string { return "rv_" + strings.TrimPrefix(workID, "w_") }

// runsOf are the check runs made for work id.
func (d *deskCell) runsOf(id string) []fakegithub.CheckRun {
	var out []fakegithub.CheckRun
	for _, r := range d.gh.CheckRuns() {
		if r.ExternalID == id {
			out = append(out, r)
		}
	}
	return out
}

// commentsOf are the review comments made for work id.
func (d *deskCell) commentsOf(id string) []fakegithub.Comment {
	var out []fakegithub.Comment
	for _, c := range d.gh.Comments() {
		if strings.Contains(c.Body, "<!-- assay:work="+id+" ") {
			out = append(out, c)
		}
	}
	return out
}

func (d *deskCell) await(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// send sends method path with token and a JSON body (nil for none), and
// returns the status, the error code and the body.
func (d *deskCell) send(t *testing.T, method, path, token string, body any) (int, string, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		rd = bytes.NewReader(raw)
	}
	req, _ := http.NewRequest(method, d.Cell.URL+path, rd)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := d.HTTP.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var e struct {
		Error struct{ Code, Message string }
	}
	_ = json.Unmarshal(raw, &e)
	return resp.StatusCode, e.Error.Code, raw
}

// amend is the case's findings with the one off the diff moved to the first
// added line of its file, and its summary changed: what a reviewer would
// publish.
func amend(t *testing.T, c ingress.ReviewCase) (findings []map[string]any, moved int) {
	t.Helper()
	moved = -1
	for _, cf := range c.Findings {
		var f map[string]any
		if err := json.Unmarshal(cf.Finding, &f); err != nil {
			t.Fatal(err)
		}
		if cf.Placed == "outside_hunk" {
			moved = firstAdded(c, cf.File)
			f["line"] = moved
			f["summary"] = "moved to the changed line by a reviewer"
		}
		findings = append(findings, f)
	}
	if moved <= 0 {
		t.Fatalf("the case has no finding off the diff to move: %+v", c.Findings)
	}
	return findings, moved
}

// firstAdded is the first added line of file in the case's diff.
func firstAdded(c ingress.ReviewCase, file string) int {
	for _, f := range c.Files {
		if f.Path != file {
			continue
		}
		for _, h := range f.Hunks {
			for _, l := range h.Lines {
				if l.Kind == "+" {
					return l.New
				}
			}
		}
	}
	return 0
}

// The review desk's fences, through the API: each tenant sees its own
// queue; a reviewer's claim holds the item against the other reviewer and
// against the tenant's own API; an answer that fails the gate is not
// approved; an amended one is published to the pull request once — its
// check run edited once, one comment per finding — and neither a
// redelivered reviewed outcome nor a redelivered earlier outcome publishes
// anything again.
func TestReviewDeskFences(t *testing.T) {
	t.Parallel()
	d := setupDesk(t)
	item := reviewIDOf(d.rejected)
	list := func(token, query string) (int, ingress.ReviewList) {
		status, _, raw := d.send(t, "GET", "/v1/console/reviews"+query, token, nil)
		var l ingress.ReviewList
		_ = json.Unmarshal(raw, &l)
		return status, l
	}
	if status, l := list(d.Token, "?state=open"); status != 200 || len(l.Items) != 1 || l.Items[0].ReviewID != item || l.Items[0].TenantID != "acme" {
		t.Errorf("acme's queue: HTTP %d %+v; want its item %s alone", status, l.Items, item)
	}
	if status, l := list(d.Initech, ""); status != 200 || len(l.Items) != 0 {
		t.Errorf("initech's queue: HTTP %d %+v; want nothing", status, l.Items)
	}
	if status, _ := list(d.Initech, "?tenant=acme"); status != http.StatusForbidden {
		t.Errorf("initech naming acme: HTTP %d, want 403", status)
	}
	if status, l := list(d.ana, "?tenant=acme&reason=schema_rejected"); status != 200 || len(l.Items) != 1 {
		t.Errorf("ana's view of acme's queue: HTTP %d %+v", status, l.Items)
	}
	path := "/v1/console/reviews/" + item
	if status, code, _ := d.send(t, "GET", path, d.Initech, nil); status != 404 || code != "not_found" {
		t.Errorf("initech reads acme's item: HTTP %d %s, want 404", status, code)
	}
	if status, code, _ := d.send(t, "POST", path+"/claim", d.Token, nil); status != 403 || code != "forbidden" {
		t.Errorf("a tenant's token claims: HTTP %d %s, want 403 forbidden", status, code)
	}
	if status, code, _ := d.send(t, "POST", path+"/resolve", d.Token, map[string]string{"verdict": "dismissed"}); status != 403 || code != "forbidden" {
		t.Errorf("a tenant's token resolves from the console: HTTP %d %s, want 403 forbidden", status, code)
	}

	status, _, raw := d.send(t, "POST", path+"/claim", d.ana, nil)
	var c ingress.ReviewCase
	if status != 200 || json.Unmarshal(raw, &c) != nil {
		t.Fatalf("ana claims: HTTP %d %s", status, raw)
	}
	if c.Review.HeldBy != "ana" || c.Answer == "" || !strings.Contains(c.Gate, "grounding.line_outside_hunk") || len(c.Files) == 0 {
		t.Errorf("ana's case: held by %q, answer %q, gate %q, %d files", c.Review.HeldBy, c.Answer, c.Gate, len(c.Files))
	}
	if len(c.Attempts) != 2 || !strings.Contains(c.Attempts[1].Reason, "line_outside_hunk") {
		t.Errorf("the case's attempts %+v: want two, the gate's reason on each", c.Attempts)
	}
	status, code, raw := d.send(t, "POST", path+"/claim", d.bo, nil)
	if status != 409 || code != "claimed" || !bytes.Contains(raw, []byte("held by reviewer ana")) {
		t.Errorf("bo claims what ana holds: HTTP %d %s", status, raw)
	}
	if status, code, _ := d.send(t, "POST", path+"/resolve", d.bo, map[string]string{"verdict": "rejected"}); status != 409 || code != "claimed" {
		t.Errorf("bo resolves what ana holds: HTTP %d %s, want 409 claimed", status, code)
	}
	if status, code, _ := d.send(t, "POST", "/v1/reviews/"+item+"/resolve", d.Token,
		map[string]string{"verdict": "dismissed"}); status != 409 || code != "claimed" {
		t.Errorf("acme's API resolves what ana holds: HTTP %d %s, want 409 claimed", status, code)
	}
	if status, code, raw := d.send(t, "POST", path+"/resolve", d.ana, map[string]string{"verdict": "approved"}); status != 400 ||
		code != "invalid_findings" || !bytes.Contains(raw, []byte("line_outside_hunk")) {
		t.Errorf("ana approves an answer the gate refuses: HTTP %d %s", status, raw)
	}
	if status, code, _ := d.send(t, "POST", path+"/resolve", d.ana, map[string]any{"verdict": "rejected", "findings": []any{}}); status != 400 || code != "invalid_findings" {
		t.Errorf("findings with a rejection: HTTP %d %s, want 400 invalid_findings", status, code)
	}
	findings, moved := amend(t, c)
	status, _, raw = d.send(t, "POST", path+"/resolve", d.ana, map[string]any{"verdict": "amended", "note": "line moved", "findings": findings})
	var done ingress.ReviewView
	if status != 200 || json.Unmarshal(raw, &done) != nil || done.Verdict != "amended" || done.ResolvedBy != "ana" || !done.Published ||
		done.Resolution != "amended by reviewer ana via the console" {
		t.Fatalf("ana amends: HTTP %d %s", status, raw)
	}
	d.await(t, "the amended review on the pull request", func() bool {
		runs := d.runsOf(d.rejected)
		return len(runs) == 1 && runs[0].Edits == 1 && len(d.commentsOf(d.rejected)) == len(findings)
	})
	run := d.runsOf(d.rejected)[0]
	if !strings.HasPrefix(run.Output.Title, "Reviewed by a person") {
		t.Errorf("the check run reads %q, want the person's review", run.Output.Title)
	}
	placed := false
	for _, cm := range d.commentsOf(d.rejected) {
		placed = placed || (cm.Line == moved && strings.Contains(cm.Body, "moved to the changed line by a reviewer"))
	}
	if !placed {
		t.Errorf("no comment at line %d with the reviewer's summary: %+v", moved, d.commentsOf(d.rejected))
	}
	if status, code, _ := d.send(t, "POST", path+"/resolve", d.bo, map[string]string{"verdict": "dismissed"}); status != 409 || code != "already_resolved" {
		t.Errorf("bo resolves it again: HTTP %d %s, want 409 already_resolved", status, code)
	}
	if status, code, _ := d.send(t, "POST", path+"/claim", d.bo, nil); status != 409 || code != "already_resolved" {
		t.Errorf("bo claims the resolved item: HTTP %d %s, want 409 already_resolved", status, code)
	}

	// Both outcomes delivered again, under new message ids so the stream
	// keeps them: the publisher takes each and publishes nothing.
	writes := func() int {
		n := 0
		for _, r := range d.gh.Requests() {
			if r.Method != "GET" && !strings.Contains(r.Path, "access_tokens") {
				n++
			}
		}
		return n
	}
	before := writes()
	names := d.Names()
	js := d.Cell.Env.JS
	var last uint64
	for _, oc := range []string{outcome.Reviewed, outcome.SchemaRejected} {
		payload, _ := json.Marshal(event.Outcome{OutcomeID: event.OutcomeMsgID(d.rejected, oc), WorkID: d.rejected, TenantID: "acme",
			Region: "us", Outcome: oc, At: time.Now()})
		msg := &nats.Msg{Subject: names.Outcome("acme"), Data: payload, Header: nats.Header{}}
		msg.Header.Set("Nats-Msg-Id", "again."+oc+"."+d.rejected)
		ack, err := js.PublishMsg(context.Background(), msg)
		if err != nil {
			t.Fatal(err)
		}
		last = ack.Sequence
	}
	d.await(t, "the publisher to take both again", func() bool {
		cons, err := js.Consumer(context.Background(), names.Stream(event.KindOutcome), names.OutcomeConsumer())
		if err != nil {
			return false
		}
		info, err := cons.Info(context.Background())
		return err == nil && info.AckFloor.Stream >= last
	})
	if n := writes(); n != before {
		t.Errorf("GitHub got %d more writes after both outcomes came again, want none", n-before)
	}
	if run := d.runsOf(d.rejected); len(run) != 1 || run[0].Edits != 1 || len(d.commentsOf(d.rejected)) != len(findings) {
		t.Errorf("after the redeliveries: %d check runs (edits %d), %d comments", len(run), run[0].Edits, len(d.commentsOf(d.rejected)))
	}
}

// reviewScreen is what the review screen shows, read from its elements.
type reviewScreen struct {
	Loaded string   `json:"loaded"`
	State  string   `json:"state"`
	Queue  []string `json:"queue"`
	// Rows are the queue's rows: source, tenant and contract.
	Rows []string `json:"rows"`
	// Item is the item's fields, by name.
	Item     map[string]string `json:"item"`
	Held     string            `json:"held"`
	Claim    string            `json:"claim"`
	Resolve  bool              `json:"resolve"`
	Findings []string          `json:"findings"`
	Result   string            `json:"result"`
	Verdict  string            `json:"verdict"`
	Error    string            `json:"error"`
	Text     string            `json:"text"`
}

const readReviewScreen = `JSON.stringify((() => {
	const all = (sel) => Array.from(document.querySelectorAll(sel));
	const $ = (id) => document.getElementById(id);
	if (!document.body || !$("claim")) { return {}; } // between pages
	const item = {};
	all("#item dd").forEach((dd) => { item[dd.dataset.field] = dd.textContent; });
	const text = (tr, f) => { const el = tr.querySelector('[data-field="' + f + '"]'); return el ? el.textContent : ""; };
	return {
		loaded: document.body.dataset.loaded || "", state: document.body.dataset.state || "", item: item,
		rows: all("#queue tbody tr").map((tr) => [text(tr, "source"), text(tr, "tenant"), text(tr, "contract")].join("|")),
		queue: document.body.dataset.queue === undefined ? null : all("#queue tbody tr").map((tr) => tr.dataset.review),
		held: $("claim").dataset.held || "", claim: $("claim").textContent,
		resolve: !$("resolve-form").hidden,
		findings: all("tr.finding").map((tr) => tr.dataset.placed),
		result: $("resolve-result").textContent, verdict: $("resolve-result").dataset.verdict || "",
		error: $("desk-error").textContent + $("error").textContent,
		text: document.body.innerText,
	};
})())`

// reviewScreen reads the review screen until ok holds of it.
func (b *browser) reviewScreen(t *testing.T, what string, ok func(reviewScreen) bool) reviewScreen {
	t.Helper()
	return await(t, b, readReviewScreen, what, ok)
}

// tab opens another tab of the same browser: a page of its own, with its
// own session storage, as a second person at another desk would have.
func (b *browser) tab(t *testing.T) *browser {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b.ctx)
	t.Cleanup(cancel)
	nb := &browser{ctx: ctx}
	if err := chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*runtime.EventExceptionThrown); ok {
			nb.mu.Lock()
			nb.exceptions = append(nb.exceptions, (&chromedp.ExceptionError{ExceptionDetails: e.ExceptionDetails}).Error())
			nb.mu.Unlock()
		}
	}); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	return nb
}

func (b *browser) noExceptions(t *testing.T) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.exceptions) > 0 {
		t.Errorf("the page threw: %v", b.exceptions)
	}
}

// A reviewer opens an item from the queue, which holds nothing, and holds
// it with Claim; a second reviewer who opens it is told who holds it and
// cannot resolve; the first moves a
// finding to its changed line, rewrites its summary and resolves the item
// amended; the fake GitHub gets exactly one publication of the amended
// review. A tenant's token sees its own queue alone, and not another
// tenant's item.
func TestReviewScreenInChromium(t *testing.T) {
	t.Parallel()
	d := setupDesk(t)
	item := reviewIDOf(d.rejected)

	ana := chromium(t)
	ana.do(t, "open the review screen", chromedp.Navigate(d.Cell.URL+"/console/reviews"))
	ana.signIn(t, d.ana)
	q := ana.reviewScreen(t, "ana's queue", func(v reviewScreen) bool { return len(v.Queue) == 1 && v.Queue[0] == item })
	if want := "shop/app PR #77|acme|code-review"; len(q.Rows) != 1 || q.Rows[0] != want {
		t.Errorf("the queue's row reads %q, want its pull request, tenant and contract: %q", q.Rows, want)
	}
	ana.do(t, "open the item", chromedp.Click(chromedp.CSS(`#queue a[href="/console/reviews?item=`+item+`"]`)))
	v := ana.reviewScreen(t, "the item, held by nobody", func(v reviewScreen) bool { return v.Loaded == item })
	if v.Held != "none" || v.Resolve || !strings.Contains(strings.Join(v.Findings, " "), "outside_hunk") {
		t.Fatalf("ana's screen before Claim: held %q (%q), resolve form %v, findings %q", v.Held, v.Claim, v.Resolve, v.Findings)
	}
	if n := d.Count(t, `SELECT count(*) FROM reviews WHERE work_id = $1 AND claimed_by IS NULL`, d.rejected); n != 1 {
		t.Fatalf("opening the item claimed it")
	}
	ana.do(t, "claim it", chromedp.Click(chromedp.ID("claim-button")))
	v = ana.reviewScreen(t, "ana holds the item", func(v reviewScreen) bool { return v.Held == "you" })
	if !v.Resolve || !strings.Contains(v.Claim, "Held by you") {
		t.Fatalf("ana's screen after Claim: held %q (%q), resolve form %v", v.Held, v.Claim, v.Resolve)
	}

	bo := ana.tab(t)
	bo.do(t, "bo opens the same item", chromedp.Navigate(d.Cell.URL+"/console/reviews?item="+item))
	bo.signIn(t, d.bo)
	w := bo.reviewScreen(t, "bo is told ana holds it", func(v reviewScreen) bool { return v.Loaded == item })
	if w.Held != "other" || !strings.Contains(w.Claim, "Held by reviewer ana") || w.Resolve {
		t.Errorf("bo's screen: held %q (%q), resolve form %v; want ana's hold named and no resolve form", w.Held, w.Claim, w.Resolve)
	}
	bo.do(t, "bo presses Claim", chromedp.Click(chromedp.ID("claim-button")))
	w = bo.reviewScreen(t, "bo's claim refused", func(v reviewScreen) bool { return strings.HasPrefix(v.Claim, "claimed:") })
	if w.Held != "other" || !strings.Contains(w.Claim, "held by reviewer ana") || w.Resolve {
		t.Errorf("bo's screen after Claim: held %q (%q), resolve form %v; want the refusal naming ana", w.Held, w.Claim, w.Resolve)
	}
	bo.noExceptions(t)

	// Ana moves the finding off the diff to its file's first added line.
	status, _, raw := d.send(t, "GET", "/v1/console/reviews/"+item, d.ana, nil)
	var c ingress.ReviewCase
	if status != 200 || json.Unmarshal(raw, &c) != nil {
		t.Fatalf("read the case: HTTP %d %s", status, raw)
	}
	findings, moved := amend(t, c)
	formFieldsAreTheSchemas(t, ana, c)
	edit := `(() => {
		const tr = document.querySelector('tr.finding[data-placed="outside_hunk"]');
		const set = (field, value, kind) => { const el = tr.querySelector('[data-field="' + field + '"]'); el.value = value; el.dispatchEvent(new Event(kind)); };
		set("line", "` + jsonNumber(moved) + `", "change");
		set("summary", "moved to the changed line by a reviewer", "input");
		document.getElementById("verdict").value = "amended";
		document.getElementById("note").value = "line moved to the change";
		return true;
	})()`
	if _, err := chromedp.Run(ana.ctx, chromedp.Evaluate[bool](edit)); err != nil {
		t.Fatalf("amend the finding: %v", err)
	}
	ana.screenshot(t, "assay-console-review.png")
	ana.do(t, "resolve", chromedp.Click(chromedp.ID("resolve")))
	v = ana.reviewScreen(t, "the resolution", func(v reviewScreen) bool { return v.Verdict != "" || strings.Contains(v.Result, ":") })
	if v.Verdict != "amended" || !strings.Contains(v.Result, "amended by reviewer ana via the console") || !strings.Contains(v.Result, "published") {
		t.Fatalf("ana's resolution: %q", v.Result)
	}
	d.await(t, "the amended review on the pull request", func() bool {
		runs := d.runsOf(d.rejected)
		return len(runs) == 1 && runs[0].Edits == 1 && len(d.commentsOf(d.rejected)) == len(findings)
	})
	placed := 0
	for _, cm := range d.commentsOf(d.rejected) {
		if cm.Edits != 0 {
			t.Errorf("comment %d was edited %d times: one publication makes each once", cm.ID, cm.Edits)
		}
		if cm.Line == moved && strings.Contains(cm.Body, "moved to the changed line by a reviewer") {
			placed++
		}
	}
	if placed != 1 {
		t.Errorf("%d comments at line %d with the reviewer's summary, want 1", placed, moved)
	}
	var by, verdict string
	if err := d.DB.QueryRow(context.Background(), `SELECT resolved_by, verdict FROM reviews WHERE work_id = $1`, d.rejected).Scan(&by, &verdict); err != nil ||
		by != "ana" || verdict != "amended" {
		t.Errorf("the review row: %s by %s (%v)", verdict, by, err)
	}
	resolvedItemAndItsWork(t, d, ana, item)
	ana.noExceptions(t)

	// A tenant's token: its own queue, and not another tenant's item.
	other := ana.tab(t)
	other.do(t, "initech opens the review screen", chromedp.Navigate(d.Cell.URL+"/console/reviews"))
	other.signIn(t, d.Initech)
	if v := other.reviewScreen(t, "initech's queue", func(v reviewScreen) bool { return v.Queue != nil }); len(v.Queue) != 0 {
		t.Errorf("initech's queue shows %q, want nothing", v.Queue)
	}
	other.do(t, "initech opens acme's item", chromedp.Navigate(d.Cell.URL+"/console/reviews?item="+item))
	if v := other.reviewScreen(t, "the refusal", func(v reviewScreen) bool { return v.Error != "" }); !strings.Contains(v.Error, "not_found") ||
		v.Loaded != "" || strings.Contains(v.Text, d.rejected) {
		t.Errorf("initech on acme's item: error %q, loaded %q", v.Error, v.Loaded)
	}
	other.noExceptions(t)
}

func jsonNumber(n int) string { b, _ := json.Marshal(n); return string(b) }

// formFieldsAreTheSchemas checks that the amend form edits each finding by
// every field of its contract version's schema, and nothing else but drop.
func formFieldsAreTheSchemas(t *testing.T, b *browser, c ingress.ReviewCase) {
	t.Helper()
	var schema struct {
		Properties struct {
			Findings struct {
				Items struct {
					Properties map[string]json.RawMessage `json:"properties"`
				} `json:"items"`
			} `json:"findings"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(c.Schema, &schema); err != nil {
		t.Fatalf("the case's schema: %v", err)
	}
	want := append(slices.Sorted(maps.Keys(schema.Properties.Findings.Items.Properties)), "drop")
	got := read[[]string](t, b, `JSON.stringify(Array.from(document.querySelectorAll('tr.finding[data-placed="outside_hunk"] [data-field]')).map((e) => e.dataset.field))`)
	slices.Sort(got)
	if len(want) < 3 || !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Errorf("the amend form edits a finding by %q; %s's schema has %q", got, c.Work.SchemaVersion, want)
	}
}

// resolvedItemAndItsWork checks the item page once ana resolved it: it says
// resolved, and by whom, and no longer that she holds it; its work's page
// links to it and it to its work, says the work counts as accepted with
// ana's amendment and shows what was published, its tables inside their
// cards.
func resolvedItemAndItsWork(t *testing.T, d *deskCell, ana *browser, item string) {
	t.Helper()
	v := ana.reviewScreen(t, "the item after its resolution", func(v reviewScreen) bool { return v.State == "resolved" })
	if v.Item["state"] != "resolved" || v.Held == "you" || v.Resolve || strings.Contains(v.Text, "Held by you") ||
		!strings.HasPrefix(v.Claim, "Resolved: amended by reviewer ana via the console") || !strings.HasPrefix(v.Item["verdict"], "amended by reviewer ana") {
		t.Errorf("the item page after ana resolved it: state %q, held %q (%q), resolve form %v, verdict %q",
			v.Item["state"], v.Held, v.Claim, v.Resolve, v.Item["verdict"])
	}
	ana.do(t, "follow the item's link to its work", chromedp.Click(chromedp.CSS(`#item a[href="/console/work/`+d.rejected+`"]`)),
		chromedp.WaitVisible(chromedp.ID("story")))
	w := ana.awaitWork(t, "the work page", func(v workPageView) bool { return v.Loaded == d.rejected })
	if !strings.HasPrefix(w.Fields["counts as"], "accepted (review "+item+" amended by reviewer ana via the console)") ||
		!strings.Contains(w.Text, "published by a person, amended by reviewer ana via the console") || len(w.Findings) == 0 {
		t.Errorf("the work page: counts as %q, findings %q; want accepted by ana's amendment, what she published shown", w.Fields["counts as"], w.Findings)
	}
	links, err := chromedp.Run(ana.ctx, chromedp.Evaluate[int](`document.querySelectorAll('#story a[href="/console/reviews?item=`+item+`"]').length`))
	if err != nil || links < 2 {
		t.Errorf("the work page has %d links to its review item (%v), want the review field's and the review section's", links, err)
	}
	ana.tablesFit(t, "ledger", "decisions", "attempts", "publications")
	ana.do(t, "follow the work's link to its review item", chromedp.Click(chromedp.CSS(`#review a[href="/console/reviews?item=`+item+`"]`)))
	ana.reviewScreen(t, "the item again, from its work", func(v reviewScreen) bool { return v.Loaded == item && v.State == "resolved" })
}

// Who resolves or claims a review item is read from the credential, never
// from the body: acme's token cannot sign a resolution with a reviewer's
// name (dev), and its own resolution is recorded as the tenant's, via the
// API; a reviewer's claim and resolution from the console are recorded as
// that reviewer's. Reading an item, or opening the review screen on it,
// claims nothing. The work's story, as the work page and assay work show
// read it, says who did what and through which route.
func TestReviewActorsFromTheCredential(t *testing.T) {
	t.Parallel()
	d := setupDesk(t)
	ctx := context.Background()
	dev := store.NewToken()
	if err := d.Cell.Env.Store.AddOperatorTokenAs(ctx, "dev", store.RoleReviewer, dev); err != nil {
		t.Fatal(err)
	}
	// A second item the gate refused, for the console.
	const title = "desk: a second finding off the diff"
	if err := d.Sim.AddFault(sim.Fault{Kind: sim.FaultLineOutsideHunk, Tenant: "acme", Match: title, Times: 2}); err != nil {
		t.Fatal(err)
	}
	req := celltest.CodeReview(evalset.Items()[0], title)
	req.SourceID = "shop/app#78"
	_, sub := d.Submit(t, req)
	if v := d.Wait(t, sub.WorkID); *v.Outcome != outcome.SchemaRejected {
		t.Fatalf("the second work ended %s (%s), want schema_rejected", *v.Outcome, v.Reason)
	}
	byAPI, byConsole := d.rejected, sub.WorkID

	// The tenant's API: a name in the body is refused, whoever it names,
	// and the item stays open.
	resolve := "/v1/reviews/" + reviewIDOf(byAPI) + "/resolve"
	status, code, raw := d.send(t, "POST", resolve, d.Token, map[string]string{"by": "dev", "verdict": "dismissed"})
	if status != http.StatusBadRequest || code != "invalid_resolver" || !bytes.Contains(raw, []byte("by is not accepted")) {
		t.Errorf("acme resolves as dev: HTTP %d %s; want 400 invalid_resolver naming by", status, raw)
	}
	if n := d.Count(t, `SELECT count(*) FROM reviews WHERE work_id = $1 AND state = 'open'`, byAPI); n != 1 {
		t.Fatalf("the refused resolution resolved the item")
	}
	status, _, raw = d.send(t, "POST", resolve, d.Token, map[string]string{"verdict": "dismissed", "note": "not ours to fix"})
	var rv ingress.ReviewView
	tenantAPI := store.Actor{Kind: store.ActorTenant, ID: "acme", Route: store.RouteAPI}
	if status != http.StatusOK || json.Unmarshal(raw, &rv) != nil || rv.Resolver == nil || *rv.Resolver != tenantAPI ||
		rv.ResolvedBy != "acme" || rv.Resolution != "dismissed by tenant acme via the API" {
		t.Fatalf("acme resolves: HTTP %d %s", status, raw)
	}

	// The console: the review screen's page, and the item read, hold
	// nothing; Claim does.
	item := reviewIDOf(byConsole)
	page, err := d.HTTP.Get(d.Cell.URL + "/console/reviews?item=" + item)
	if err != nil {
		t.Fatal(err)
	}
	page.Body.Close()
	var c ingress.ReviewCase
	status, _, raw = d.send(t, "GET", "/v1/console/reviews/"+item, dev, nil)
	if page.StatusCode != http.StatusOK || status != http.StatusOK || json.Unmarshal(raw, &c) != nil || c.Review.HeldBy != "" {
		t.Fatalf("the page (HTTP %d) and dev's read of the item: HTTP %d %s; want it held by nobody", page.StatusCode, status, raw)
	}
	if n := d.Count(t, `SELECT count(*) FROM reviews WHERE work_id = $1 AND claimed_by IS NULL`, byConsole); n != 1 {
		t.Fatal("opening the item claimed it")
	}
	status, _, raw = d.send(t, "POST", "/v1/console/reviews/"+item+"/claim", dev, nil)
	if status != http.StatusOK || json.Unmarshal(raw, &c) != nil || c.Review.HeldBy != "dev" || c.Review.HeldByKind != store.ActorReviewer {
		t.Fatalf("dev claims: HTTP %d %s", status, raw)
	}
	status, _, raw = d.send(t, "GET", "/v1/console/reviews/"+item, d.ana, nil)
	if status != http.StatusOK || json.Unmarshal(raw, &c) != nil || c.Review.HeldBy != "dev" || c.Review.HeldByKind != store.ActorReviewer {
		t.Errorf("ana reads the item dev holds: HTTP %d %s; want dev named", status, raw)
	}
	status, _, raw = d.send(t, "POST", "/v1/console/reviews/"+item+"/resolve", dev, map[string]string{"verdict": "rejected"})
	reviewerConsole := store.Actor{Kind: store.ActorReviewer, ID: "dev", Route: store.RouteConsole}
	if status != http.StatusOK || json.Unmarshal(raw, &rv) != nil || rv.Resolver == nil || *rv.Resolver != reviewerConsole ||
		rv.Resolution != "rejected by reviewer dev via the console" {
		t.Fatalf("dev resolves: HTTP %d %s", status, raw)
	}
	for id, want := range map[string]string{byAPI: "acme tenant api", byConsole: "dev reviewer console"} {
		var by, kind, route string
		if err := d.DB.QueryRow(ctx, `SELECT resolved_by, resolved_kind, resolved_route FROM reviews WHERE work_id = $1`, id).Scan(&by, &kind, &route); err != nil ||
			by+" "+kind+" "+route != want {
			t.Errorf("the review row of %s: %s %s %s (%v), want %s", id, by, kind, route, err, want)
		}
	}

	// The story: the work page's (GET /v1/console/work/{id}) and assay work
	// show's (ingress.ReadStory) alike.
	for id, want := range map[string][]string{
		byAPI:     {"resolve dismissed by tenant acme via the API"},
		byConsole: {"claim by reviewer dev via the console", "resolve rejected by reviewer dev via the console"},
	} {
		status, _, raw := d.send(t, "GET", "/v1/console/work/"+id, d.ana, nil)
		var page ingress.WorkStory
		if status != http.StatusOK || json.Unmarshal(raw, &page) != nil {
			t.Fatalf("the work page's story of %s: HTTP %d %s", id, status, raw)
		}
		show, err := ingress.ReadStory(ctx, d.Cell.Env.Store, id, ingress.AnswerNone)
		if err != nil {
			t.Fatal(err)
		}
		for name, s := range map[string]*ingress.WorkStory{"the work page": &page, "assay work show": show} {
			var got []string
			for _, a := range s.Actions {
				if a.Action == store.ActionResolve {
					got = append(got, a.Action+" "+a.Note+" by "+a.Actor().String())
				} else {
					got = append(got, a.Action+" by "+a.Actor().String())
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("%s: the actions of %s are %q, want %q", name, id, got, want)
			}
			resolved := slices.ContainsFunc(s.Decisions, func(dc ingress.Decision) bool {
				return strings.HasPrefix(dc.What, "review item ") && dc.Reason == "by "+strings.SplitN(want[len(want)-1], " by ", 2)[1]
			})
			if !resolved || s.Review == nil || !strings.HasSuffix(want[len(want)-1], strings.SplitN(s.Review.Resolution, " by ", 2)[1]) {
				t.Errorf("%s: the story of %s does not say who resolved it: review %+v, decisions %+v", name, id, s.Review, s.Decisions)
			}
		}
	}
}
