package cell_test

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"assay.dev/pkg/store"
	"assay.dev/services/ingress"
)

// pageView is what the console page shows, read from its elements' ids and
// data attributes.
type pageView struct {
	Seq             int              `json:"seq"`
	Board           bool             `json:"board"`
	Scope           string           `json:"scope"`
	Tenant          string           `json:"tenant"`
	Status          string           `json:"status"`
	Error           string           `json:"error"`
	States          map[string]int64 `json:"states"`
	Recent          []string         `json:"recent"`
	Spend           map[string]int64 `json:"spend"`
	Consumers       []string         `json:"consumers"`
	ConsumersHidden bool             `json:"consumersHidden"`
	Lanes           map[string]int64 `json:"lanes"`
	// Publications are "pending/failed" per target; Circuits the state per
	// model.
	Publications map[string]string `json:"publications"`
	Circuits     map[string]string `json:"circuits"`
}

const readPage = `JSON.stringify((() => {
	const $ = (id) => document.getElementById(id);
	const all = (sel) => Array.from(document.querySelectorAll(sel));
	const states = {};
	all("#states .state").forEach((el) => { if (el.dataset.count !== "") states[el.id.slice(6)] = Number(el.dataset.count); });
	const spend = {};
	all("#spend tbody tr").forEach((tr) => { spend[tr.dataset.tenant] = Number(tr.dataset.costMicros); });
	const lanes = {};
	all("#lanes tbody tr").forEach((tr) => { lanes[tr.dataset.lane] = Number(tr.querySelector('[data-field="depth"]').textContent); });
	const publications = {};
	all("#publications tbody tr").forEach((tr) => { publications[tr.dataset.target] = tr.dataset.pending + "/" + tr.dataset.failed; });
	const circuits = {};
	all("#circuits tbody tr").forEach((tr) => { circuits[tr.dataset.model] = tr.dataset.state; });
	return {
		publications: publications, circuits: circuits,
		seq: Number($("board").dataset.seq), board: !$("board").hidden,
		scope: $("scope").dataset.scope || "", tenant: $("scope").dataset.tenant || "",
		status: $("status").textContent, error: $("error").textContent,
		states: states, recent: all("#recent tbody tr").map((tr) => tr.dataset.workId),
		spend: spend, consumers: all("#consumers tbody tr").map((tr) => tr.dataset.durable),
		consumersHidden: $("consumers-section").hidden, lanes: lanes,
	};
})())`

// browser is one headless Chromium tab.
type browser struct {
	ctx        context.Context
	mu         sync.Mutex
	exceptions []string
}

// chromium starts Debian's Chromium, headless, on a fresh profile.
func chromium(t *testing.T) *browser {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("the console test drives headless Chromium and none is installed: install Debian's chromium package (apt-get install -y chromium)")
	}
	dir, err := os.MkdirTemp("", "assay-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Chromium's helpers may write to the profile a moment after the
		// browser is gone.
		for range 50 {
			if os.RemoveAll(dir) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	base, cancelBase := context.WithTimeout(context.Background(), 3*time.Minute)
	alloc, cancelAlloc := chromedp.NewExecAllocator(base, chromedp.ExecPath(path),
		chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.NoFirstRun, chromedp.Flag("disable-sync", true), chromedp.UserDataDir(dir),
		chromedp.WindowSize(1280, 1000))
	ctx, cancelTab := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
		cancelBase()
	})
	b := &browser{ctx: ctx}
	if err := chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*runtime.EventExceptionThrown); ok {
			b.mu.Lock()
			b.exceptions = append(b.exceptions, (&chromedp.ExceptionError{ExceptionDetails: e.ExceptionDetails}).Error())
			b.mu.Unlock()
		}
	}); err != nil {
		t.Fatalf("start chromium (%s): %v", path, err)
	}
	return b
}

func (b *browser) do(t *testing.T, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(b.ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func (b *browser) page(t *testing.T) pageView { t.Helper(); return read[pageView](t, b, readPage) }

// await reads the console until ok holds of it.
func (b *browser) await(t *testing.T, what string, ok func(pageView) bool) pageView {
	t.Helper()
	return await(t, b, readPage, what, ok)
}

// signIn enters token into the page's form.
func (b *browser) signIn(t *testing.T, token string) {
	t.Helper()
	b.do(t, "sign in", chromedp.WaitVisible(chromedp.ID("token")), chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.ID("connect")))
}

// screenshot saves the page as name in $ASSAY_SCREENSHOT_DIR, else the
// temporary directory.
func (b *browser) screenshot(t *testing.T, name string) {
	t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	dir := cmp.Or(os.Getenv("ASSAY_SCREENSHOT_DIR"), os.TempDir())
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	t.Logf("screenshot of the console: %s (%d bytes)", path, len(png))
}

// tableFitScript says whether the table whose id is given stays inside its
// card (the section it is in): it fits, or it scrolls across inside a box
// of the card, and the card does not run past the page.
const tableFitScript = `JSON.stringify(((id) => {
	const table = document.getElementById(id);
	if (!table) { return { ok: false, why: "no table " + id }; }
	const card = table.closest("section"), box = table.parentElement.closest(".scroll");
	const c = card.getBoundingClientRect(), page = document.documentElement.clientWidth;
	const seen = " (table " + table.scrollWidth + "px, card " + card.clientWidth + "px at " + Math.round(c.left) + "-" + Math.round(c.right) + ", page " + page + "px)";
	if (c.right > page + 1) { return { ok: false, why: "the card runs past the page" + seen }; }
	if (table.getBoundingClientRect().right <= c.right + 1) { return { ok: true, how: "fits" + seen }; }
	const scrolls = box && card.contains(box) && ["auto", "scroll"].includes(getComputedStyle(box).overflowX) &&
		box.getBoundingClientRect().right <= c.right + 1 && box.scrollWidth >= table.scrollWidth && box.scrollWidth > box.clientWidth;
	return scrolls ? { ok: true, how: "scrolls inside its card" + seen } : { ok: false, why: "it runs past its card, hiding columns" + seen };
})(%q))`

// tablesFit checks that each table stays inside its card: it fits, or it
// scrolls across inside it.
func (b *browser) tablesFit(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		v := read[struct {
			OK       bool
			How, Why string
		}](t, b, fmt.Sprintf(tableFitScript, id))
		if !v.OK {
			t.Errorf("table %s: %s", id, v.Why)
		} else {
			t.Logf("table %s %s", id, v.How)
		}
	}
}

func total(m map[string]int64) (n int64) {
	for _, v := range m {
		n += v
	}
	return n
}

func spendOf(c ingress.Console) map[string]int64 {
	out := map[string]int64{}
	for _, s := range c.Spend {
		out[s.TenantID] = s.CostMicros
	}
	return out
}

func recentOf(c ingress.Console) []string {
	out := []string{}
	for _, d := range c.Recent {
		out = append(out, d.WorkID)
	}
	return out
}

// samePage checks that the page shows the API's figures.
func samePage(t *testing.T, v pageView, api ingress.Console) {
	t.Helper()
	if !maps.Equal(v.States, api.States) {
		t.Errorf("the page's states %v, the API's %v", v.States, api.States)
	}
	if !slices.Equal(v.Recent, recentOf(api)) {
		t.Errorf("the page's recent decisions %v, the API's %v", v.Recent, recentOf(api))
	}
	if !maps.Equal(v.Spend, spendOf(api)) {
		t.Errorf("the page's spend %v, the API's %v", v.Spend, spendOf(api))
	}
	var durables []string
	for _, k := range api.Consumers {
		durables = append(durables, k.Stream+"/"+k.Durable)
	}
	if !slices.Equal(v.Consumers, durables) && !(len(v.Consumers) == 0 && len(durables) == 0) {
		t.Errorf("the page's consumers %v, the API's %v", v.Consumers, durables)
	}
	for _, l := range api.Lanes {
		if v.Lanes[l.Lane] != l.Depth {
			t.Errorf("the page's %s depth %d, the API's %d", l.Lane, v.Lanes[l.Lane], l.Depth)
		}
	}
	pubs, circuits := map[string]string{}, map[string]string{}
	for _, p := range api.Publications {
		pubs[p.Target] = fmt.Sprintf("%d/%d", p.Pending, p.Failed)
	}
	for _, c := range api.Circuits {
		circuits[c.Model] = c.State
	}
	if !maps.Equal(v.Publications, pubs) || len(pubs) == 0 {
		t.Errorf("the page's publications %v, the API's %v", v.Publications, pubs)
	}
	if !maps.Equal(v.Circuits, circuits) {
		t.Errorf("the page's circuits %v, the API's %v", v.Circuits, circuits)
	}
}

// The console in a real browser on a whole cell: the operator's token
// shows the cell's figures, equal to the API's; finished work appears on
// the page without a reload; a tenant's token shows that tenant's spend
// alone. The token stays out of the URL.
func TestConsoleInChromium(t *testing.T) {
	t.Parallel()
	c := setupConsole(t)
	c.finish(t, c.Token, "acme", 0, "browser acme 1")
	c.finish(t, c.Initech, "initech", 1, "browser initech")
	// A route whose row is wider than its card: an override with its reason.
	if _, err := c.Cell.Env.Store.SetLive(context.Background(), "*", "moderation", store.Variant{Version: "moderation/1", Model: "a-model-with-a-rather-long-name-2026-11"},
		store.Shipped{Default: "moderation/1"}, "the provider's moderation model was withdrawn overnight; this one stands in until the rollout check passes", "ops"); err != nil {
		t.Fatal(err)
	}
	b := chromium(t)

	b.do(t, "open /console", chromedp.Navigate(c.Cell.URL+"/console"))
	b.signIn(t, c.Operator)
	first := b.await(t, "the operator's figures", func(v pageView) bool {
		return v.Board && v.Scope == "cell" && len(v.States) == 5 && v.Status == "live"
	})
	api := c.console(t, c.Operator)
	c.wantFigures(t, api, "")
	samePage(t, first, api)
	if len(first.Spend) != 2 || len(first.Consumers) != len(c.Names().Durables()) || first.ConsumersHidden {
		t.Errorf("the operator's page: spend %v, consumers %v (hidden %v); want two tenants and every durable of the cell",
			first.Spend, first.Consumers, first.ConsumersHidden)
	}
	where, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](`location.href + " " + document.cookie + " " + JSON.stringify(localStorage)`))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(where, c.Operator) {
		t.Errorf("the token is in the URL, a cookie or local storage: %s", where)
	}
	held, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](`sessionStorage.getItem("assay.console.token") || ""`))
	if err != nil || held != c.Operator {
		t.Errorf("the token is not kept in session storage (%v)", err)
	}

	// Work that finishes now shows on the open page.
	id := c.finish(t, c.Token, "acme", 2, "browser acme 2")
	want := c.Count(t, `SELECT coalesce(sum(cost_micros), 0)::int FROM ledger WHERE tenant_id = 'acme'`)
	updated := b.await(t, "the page after "+id+" finished", func(v pageView) bool {
		return v.Seq > first.Seq && len(v.Recent) > 0 && v.Recent[0] == id && v.Spend["acme"] == int64(want)
	})
	samePage(t, updated, c.console(t, c.Operator))
	if total(updated.States) != total(first.States)+1 {
		t.Errorf("states went from %v to %v; want one more work item", first.States, updated.States)
	}
	b.tablesFit(t, "rollouts", "recent", "consumers", "failed")
	b.screenshot(t, "assay-console.png")

	// A tenant's token: its own figures.
	b.do(t, "sign out", chromedp.Click(chromedp.ID("signout")))
	b.signIn(t, c.Token)
	mine := b.await(t, "acme's figures", func(v pageView) bool {
		return v.Board && v.Scope == "tenant" && v.Tenant == "acme" && v.Status == "live"
	})
	tenantAPI := c.console(t, c.Token)
	c.wantFigures(t, tenantAPI, "acme")
	samePage(t, mine, tenantAPI)
	if len(mine.Spend) != 1 || mine.Spend["acme"] != int64(want) {
		t.Errorf("acme's page shows spend %v; want acme's %d µ$ alone", mine.Spend, want)
	}
	if !mine.ConsumersHidden || len(mine.Consumers) != 0 {
		t.Errorf("acme's page shows the cell's consumers: %v", mine.Consumers)
	}
	b.screenshot(t, "assay-console-tenant.png")

	// A token the cell does not know is refused on the page, with the
	// API's code.
	b.do(t, "sign out", chromedp.Click(chromedp.ID("signout")))
	b.signIn(t, "not-a-token-this-cell-knows")
	b.await(t, "the refusal of an unknown token", func(v pageView) bool {
		return !v.Board && strings.HasPrefix(v.Error, "unauthenticated:")
	})

	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.exceptions) > 0 {
		t.Errorf("the page threw: %s", fmt.Sprint(b.exceptions))
	}
}
