package cell_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto"
	"github.com/chromedp/chromedp"

	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/store"
	"assay.dev/services/ingress"
)

// workPageView is what the work page shows, read from its elements.
type workPageView struct {
	Loaded    string            `json:"loaded"`
	Fields    map[string]string `json:"fields"`
	Decisions []string          `json:"decisions"`
	Attempts  []string          `json:"attempts"`
	Shapes    []string          `json:"shapes"`
	Findings  []string          `json:"findings"`
	Ledger    int               `json:"ledger"`
	Error     string            `json:"error"`
	ActResult string            `json:"actResult"`
	Text      string            `json:"text"`
}

const readWorkPage = `JSON.stringify((() => {
	const all = (sel) => Array.from(document.querySelectorAll(sel));
	const fields = {};
	all("#work dd").forEach((dd) => { fields[dd.dataset.field] = dd.textContent; });
	return {
		loaded: document.body.dataset.loaded || "", fields: fields,
		decisions: all("#decisions tbody tr").map((tr) => tr.querySelector('[data-field="what"]').textContent),
		attempts: all("#attempts tbody tr").map((tr) => tr.dataset.outcome),
		shapes: all("#attempts [data-field=shape]").map((el) => el.textContent),
		findings: all("#findings tbody tr").map((tr) => tr.querySelector('[data-field="summary"]').textContent),
		ledger: all("#ledger tbody tr").length,
		error: document.getElementById("error").textContent,
		actResult: document.getElementById("act-result").textContent,
		text: document.body.innerText,
	};
})())`

// read reads a page with script, which returns its view as JSON.
func read[V any](t *testing.T, b *browser, script string) V {
	t.Helper()
	v, err := readNow[V](b, script)
	if err != nil {
		t.Fatalf("read the page: %v", err)
	}
	return v
}

func readNow[V any](b *browser, script string) (V, error) {
	var v V
	raw, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](script))
	if err != nil {
		return v, err
	}
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		return v, fmt.Errorf("%w: %s", err, raw)
	}
	return v, nil
}

// navigating reports whether err may be the page changing under the read:
// the browser saying the page went away (a navigation a click or a sign-in
// began, error -32000), or the script meeting a document not yet built
// (an exception). The next read meets the page that follows; a script that
// always throws still fails at the deadline, with its exception.
func navigating(err error) bool {
	var ce *cdproto.Error
	var ex *chromedp.ExceptionError
	return errors.As(err, &ce) && ce.Code == -32000 || errors.As(err, &ex)
}

// await reads a page with script until ok holds of its view, and fails
// with the last view when it still does not after 30s. A read the page
// navigated away from is read again.
func await[V any](t *testing.T, b *browser, script, what string, ok func(V) bool) V {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, err := readNow[V](b, script)
		switch {
		case err != nil && !navigating(err):
			t.Fatalf("%s: read the page: %v", what, err)
		case err == nil && ok(v):
			return v
		case time.Now().After(deadline):
			t.Fatalf("%s: after 30s the page shows %+v (last read: %v)", what, v, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (b *browser) workPage(t *testing.T) workPageView {
	t.Helper()
	return read[workPageView](t, b, readWorkPage)
}

// awaitWork reads the work page until ok holds of it.
func (b *browser) awaitWork(t *testing.T, what string, ok func(workPageView) bool) workPageView {
	t.Helper()
	return await(t, b, readWorkPage, what, ok)
}

// An operator follows a recent decision's link from the console to its work
// page, which tells the story GET /v1/console/work/{id} does: its state,
// each decision in time order, each attempt with its answer's shape (no
// word of the answer), its ledger row and its result's findings. A
// tenant's token opens its own work's page and is refused another
// tenant's, with the API's code.
func TestWorkPageInChromium(t *testing.T) {
	t.Parallel()
	c := setupConsole(t)
	id := c.finish(t, c.Token, "acme", 0, "work page acme")
	theirs := c.finish(t, c.Initech, "initech", 1, "work page initech")
	status, _, raw := c.get(t, c.Operator, "/v1/console/work/"+id)
	var story ingress.WorkStory
	if status != http.StatusOK || json.Unmarshal(raw, &story) != nil {
		t.Fatalf("GET /v1/console/work/%s as the operator: HTTP %d %s", id, status, raw)
	}
	var output struct {
		Findings []struct{ Summary string }
	}
	if story.Result == nil || json.Unmarshal(story.Result.Output, &output) != nil || len(output.Findings) == 0 {
		t.Fatalf("the story has no result with findings: %+v", story.Result)
	}
	for _, a := range story.Attempts {
		if a.Shape == "" || a.Excerpt != "" || strings.Contains(a.Shape, output.Findings[0].Summary) {
			t.Errorf("attempt %d's answer is shown as %q (excerpt %q): want its shape, no word of it", a.Number, a.Shape, a.Excerpt)
		}
	}
	if status, _, raw := c.get(t, c.Token, "/v1/console/work/"+theirs); status != http.StatusNotFound {
		t.Errorf("acme's token on initech's work: HTTP %d %s, want 404", status, raw)
	}

	b := chromium(t)
	b.do(t, "open /console", chromedp.Navigate(c.Cell.URL+"/console"))
	b.signIn(t, c.Operator)
	b.await(t, "the recent decisions", func(v pageView) bool { return v.Board && len(v.Recent) >= 2 })
	b.do(t, "follow the work's link", chromedp.Click(chromedp.CSS(`#recent a[href="/console/work/`+id+`"]`)),
		chromedp.WaitVisible(chromedp.ID("story")))
	v := b.workPage(t)
	if v.Loaded != id || v.Fields["state"] != story.Work.State || v.Fields["tenant"] != "acme (region us)" {
		t.Errorf("the work page shows %q, state %q, tenant %q; want %s, %s, acme", v.Loaded, v.Fields["state"], v.Fields["tenant"], id, story.Work.State)
	}
	if len(v.Decisions) != len(story.Decisions) || v.Decisions[0] != "admitted" {
		t.Errorf("the page's decisions %q; the API's are %d, admitted first", v.Decisions, len(story.Decisions))
	}
	if len(v.Attempts) != len(story.Attempts) || len(v.Shapes) != len(story.Attempts) || v.Shapes[0] != story.Attempts[0].Shape {
		t.Errorf("the page's attempts %q with shapes %q; the API's %d", v.Attempts, v.Shapes, len(story.Attempts))
	}
	if len(v.Findings) != len(output.Findings) || v.Findings[0] != output.Findings[0].Summary || v.Ledger != len(story.Ledger) {
		t.Errorf("the page's findings %q and %d ledger rows; the API's %d findings and %d rows", v.Findings, v.Ledger, len(output.Findings), len(story.Ledger))
	}
	b.screenshot(t, "assay-console-work.png")

	// A tenant's token: its own work, and not another tenant's.
	b.do(t, "sign out", chromedp.Click(chromedp.ID("signout")))
	b.do(t, "open initech's work", chromedp.Navigate(c.Cell.URL+"/console/work/"+theirs))
	b.signIn(t, c.Token)
	b.do(t, "the refusal", chromedp.WaitVisible(chromedp.ID("login")))
	v = b.awaitWork(t, "the refusal", func(v workPageView) bool { return v.Error != "" })
	if !strings.Contains(v.Error, "not_found") || v.Loaded != "" || strings.Contains(v.Text, "initech (region") {
		t.Errorf("acme's token on initech's work page: error %q, shown %q", v.Error, v.Loaded)
	}
	b.do(t, "open acme's work", chromedp.Navigate(c.Cell.URL+"/console/work/"+id), chromedp.WaitVisible(chromedp.ID("story")))
	if v := b.workPage(t); v.Loaded != id {
		t.Errorf("acme's token on its own work page shows %q", v.Loaded)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.exceptions) > 0 {
		t.Errorf("the page threw: %v", b.exceptions)
	}
}

// The console's search: an operator finds another tenant's work by its
// source id and follows it to its page; a tenant's search finds its own
// work alone, and naming another tenant is refused.
func TestFindWorkInChromium(t *testing.T) {
	t.Parallel()
	c := setupConsole(t)
	theirs := c.finish(t, c.Initech, "initech", 1, "find initech")
	mine := c.finish(t, c.Token, "acme", 0, "find acme")
	source := celltest.CodeReview(evalset.Items()[1], "").SourceID
	find := func(token, query string) (int, ingress.WorkList) {
		t.Helper()
		status, _, raw := c.get(t, token, "/v1/console/work?"+query)
		var l ingress.WorkList
		_ = json.Unmarshal(raw, &l)
		return status, l
	}
	if status, l := find(c.Operator, "source="+url.QueryEscape(source)); status != 200 || len(l.Items) != 1 ||
		l.Items[0].WorkID != theirs || l.Items[0].TenantID != "initech" {
		t.Errorf("the operator's search for %s: HTTP %d %+v; want initech's %s", source, status, l.Items, theirs)
	}
	if status, l := find(c.Token, "state=accepted"); status != 200 || len(l.Items) != 1 || l.Items[0].WorkID != mine {
		t.Errorf("acme's search: HTTP %d %+v; want its own %s alone", status, l.Items, mine)
	}
	if status, l := find(c.Token, "source="+url.QueryEscape(source)); status != 200 || len(l.Items) != 0 {
		t.Errorf("acme's search for initech's source: HTTP %d %+v; want nothing", status, l.Items)
	}
	if status, _ := find(c.Token, "tenant=initech"); status != http.StatusForbidden {
		t.Errorf("acme's search naming initech: HTTP %d, want 403", status)
	}

	b := chromium(t)
	b.do(t, "open /console", chromedp.Navigate(c.Cell.URL+"/console"))
	b.signIn(t, c.Operator)
	b.await(t, "the board", func(v pageView) bool { return v.Board })
	b.do(t, "find by source id", chromedp.SendKeys(chromedp.ID("find-q"), source), chromedp.Click(chromedp.ID("find")),
		chromedp.WaitVisible(chromedp.CSS(`#found a[href="/console/work/`+theirs+`"]`)))
	b.screenshot(t, "assay-console-find.png")
	b.do(t, "open the found work", chromedp.Click(chromedp.CSS(`#found a[href="/console/work/`+theirs+`"]`)),
		chromedp.WaitVisible(chromedp.ID("story")))
	if v := b.workPage(t); v.Loaded != theirs || v.Fields["tenant"] != "initech (region us)" {
		t.Errorf("the found work's page shows %q of %q, want %s of initech", v.Loaded, v.Fields["tenant"], theirs)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.exceptions) > 0 {
		t.Errorf("the page threw: %v", b.exceptions)
	}
}

// An operator finds a failed item by its source id, redrives it from its
// page after typing its id, and the page shows the action with who took
// it; the work then ends accepted. A reviewer's token is refused the
// action, on the page, with the API's code.
func TestRedriveFromTheWorkPage(t *testing.T) {
	t.Parallel()
	c := setupConsole(t)
	if err := c.Cell.Env.Store.AddOperatorTokenAs(context.Background(), "reader", store.RoleReviewer, "reader-token"); err != nil {
		t.Fatal(err)
	}
	req := celltest.CodeReview(evalset.Items()[2], "redrive from the page")
	req.SourceID = "shop/redrive#7"
	if err := c.Sim.AddFault(sim.Fault{Kind: sim.FaultInvalidJSON, Tenant: "acme", Match: "redrive from the page", Times: 2}); err != nil {
		t.Fatal(err)
	}
	status, sub := c.Submit(t, req)
	if status != http.StatusAccepted {
		t.Fatalf("submit: HTTP %d", status)
	}
	if v := c.Wait(t, sub.WorkID); v.State != "schema_rejected" {
		t.Fatalf("the work ended %s, want schema_rejected", v.State)
	}

	b := chromium(t)
	act := func(token string) string {
		t.Helper()
		b.do(t, "open /console", chromedp.Navigate(c.Cell.URL+"/console"))
		b.signIn(t, token)
		b.await(t, "the board", func(v pageView) bool { return v.Board })
		b.do(t, "find the failed work", chromedp.SendKeys(chromedp.ID("find-q"), req.SourceID), chromedp.Click(chromedp.ID("find")),
			chromedp.Click(chromedp.CSS(`#found a[href="/console/work/`+sub.WorkID+`"]`)), chromedp.WaitVisible(chromedp.ID("story")))
		b.do(t, "redrive it", chromedp.SendKeys(chromedp.ID("act-confirm"), sub.WorkID), chromedp.Click(chromedp.ID("act")))
		return b.awaitWork(t, "the action's answer", func(v workPageView) bool {
			return v.ActResult != "" && !strings.HasSuffix(v.ActResult, "…")
		}).ActResult
	}
	if got := act("reader-token"); !strings.HasPrefix(got, "forbidden:") {
		t.Errorf("a reviewer's redrive: the page says %q, want the API's forbidden", got)
	}
	b.do(t, "sign out", chromedp.Navigate(c.Cell.URL+"/console"), chromedp.Click(chromedp.ID("signout")))
	if got := act(c.Operator); got != "redrive done by ops: the work is queued" {
		t.Errorf("the operator's redrive: the page says %q", got)
	}
	if v := c.Wait(t, sub.WorkID); v.State != "accepted" {
		t.Errorf("the redriven work ended %s, want accepted", v.State)
	}
	b.do(t, "read the page again", chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("story")))
	got, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](
		`Array.from(document.querySelectorAll("#actions tbody tr")).map((tr) => tr.dataset.action + " by " + tr.querySelector('[data-field="by"]').textContent).join(";")`))
	if err != nil || got != "redrive by operator ops via the console" {
		t.Errorf("the page's actions %q (%v), want the operator's redrive alone", got, err)
	}
	if n := c.Count(t, `SELECT count(*) FROM work_actions WHERE work_id = $1 AND action = 'redrive' AND by_name = 'ops'`, sub.WorkID); n != 1 {
		t.Errorf("%d audit rows of the redrive, want 1", n)
	}
	b.screenshot(t, "assay-console-redrive.png")
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.exceptions) > 0 {
		t.Errorf("the page threw: %v", b.exceptions)
	}
}
