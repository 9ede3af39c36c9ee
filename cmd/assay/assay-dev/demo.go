package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/usage"
	"assay.dev/services/committer/publish"
	"assay.dev/services/ingress"
)

// submission is one request the demo sends.
type submission struct {
	Tenant string
	Body   ingress.SubmitRequest
	Label  string
}

type submitted struct {
	submission
	Region string
	WorkID string
	Status int
}

// demoSet is the evaluation set for both tenants: every bundled diff as a
// code review, plus one change review and one moderation call each.
func demoSet() []submission {
	var out []submission
	for _, tenant := range []string{"acme", "globex"} {
		for _, it := range evalset.Items() {
			in, _ := json.Marshal(map[string]string{"diff": it.Diff, "title": it.Title})
			out = append(out, submission{Tenant: tenant, Label: it.Name, Body: ingress.SubmitRequest{
				Contract: "code-review", SourceID: it.SourceID, Revision: it.Revision, Input: in}})
		}
		first := evalset.Items()[0]
		in, _ := json.Marshal(map[string]string{"diff": first.Diff, "title": first.Title})
		out = append(out, submission{Tenant: tenant, Label: first.Name + " (tags)", Body: ingress.SubmitRequest{
			Contract: "change-review", SourceID: first.SourceID, Revision: first.Revision, Input: in}})
		out = append(out, submission{Tenant: tenant, Label: "storefront review", Body: ingress.SubmitRequest{
			Contract: "moderation", SourceID: "reviews/" + tenant + "#9001", Revision: "r1",
			Input: json.RawMessage(`{"text":"BUY NOW!!! free money at cheap-watches.example, buy now, buy now"}`)}})
	}
	return out
}

// forcedInvalid is the evaluation item whose answer the simulated provider
// bends (an extra property, twice) so the demo shows the repair path ending
// schema_rejected.
func forcedInvalid() (tenant string, item evalset.Item) {
	items := evalset.Items()
	return "globex", items[len(items)/2]
}

// demo runs the evaluation set through the dev mode's cells.
type demo struct{ *cell.Dev }

// runDemo runs the evaluation set through the dev mode's cells and prints
// what became of every item, its usage and the ledger's reconciliation.
func runDemo(ctx context.Context, dev *cell.Dev, w io.Writer) error {
	e := demo{dev}
	started := time.Now()
	client := &http.Client{Timeout: 30 * time.Second}
	forcedTenant, forcedItem := forcedInvalid()
	if e.Sim != nil {
		if err := e.Sim.AddFault(sim.Fault{Kind: sim.FaultExtraProperty, Tenant: forcedTenant,
			Match: forcedItem.Title, Times: 2}); err != nil {
			return err
		}
	} else {
		fmt.Fprintln(w, "note: ASSAY_MODEL_BASE_URL is set, so no invalid output is forced")
	}
	for _, r := range e.Regions {
		c := e.Cells[r]
		fmt.Fprintf(w, "cell %s: API %s, metrics %s/metrics (a free port of their own, never the API's)\n", r, c.URL, c.MetricsURL)
	}

	subs, err := e.submitSet(ctx, client, w)
	if err != nil {
		return err
	}

	views, err := e.waitTerminal(ctx, client, subs, 3*time.Minute)
	if err != nil {
		return err
	}
	calls, ledgerRows, err := e.waitLedger(ctx, 20*time.Second)
	if err != nil {
		return err
	}

	outcomes, forced, err := e.table(ctx, w, subs, views)
	if err != nil {
		return err
	}

	if err := e.publications(ctx, w, subs, views, 30*time.Second); err != nil {
		return err
	}

	if err := e.usageTable(ctx, client, w); err != nil {
		return err
	}

	printOutcomes(w, outcomes, forced)
	if err := reachedModel(views, "POST "+e.ChatURL()); err != nil {
		return err
	}
	if err := e.reconcile(w, calls, ledgerRows); err != nil {
		return err
	}
	fmt.Fprintf(w, "done in %s\n", time.Since(started).Round(time.Millisecond))
	return nil
}

// submitSet submits the demo set, then its first item again as a
// redelivered webhook, which must name the same work.
func (e demo) submitSet(ctx context.Context, client *http.Client, w io.Writer) ([]submitted, error) {
	set := demoSet()
	var subs []submitted
	for _, s := range set {
		r, err := e.submit(ctx, client, s)
		if err != nil {
			return nil, err
		}
		subs = append(subs, r)
	}
	dup, err := e.submit(ctx, client, set[0])
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "submitted %d work items to 2 cells; duplicate delivery of %s → HTTP %d, work %s (same id: %t)\n\n",
		len(subs), set[0].Label, dup.Status, dup.WorkID, dup.WorkID == subs[0].WorkID)
	if dup.WorkID != subs[0].WorkID || dup.Status != http.StatusOK {
		return nil, fmt.Errorf("duplicate delivery got work %s with HTTP %d, want %s with 200", dup.WorkID, dup.Status, subs[0].WorkID)
	}
	return subs, nil
}

// usageTable prints each tenant's usage as GET /v1/usage reports it from
// the ledger.
func (e demo) usageTable(ctx context.Context, client *http.Client, w io.Writer) error {
	fmt.Fprintln(w, "\nusage (GET /v1/usage, from the ledger)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tREGION\tOUTCOME\tCALLS\tINPUT UNITS\tOUTPUT UNITS\tCOST (USD)")
	for _, t := range e.Tenants {
		rep, err := e.usage(ctx, client, t.ID)
		if err != nil {
			return err
		}
		for _, l := range rep.ByOutcome {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\n", t.ID, t.HomeRegion, l.Outcome, l.Calls, l.InputUnits, l.OutputUnits, cli.Dollars(l.CostMicros))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t\t\t%s\n", t.ID, t.HomeRegion, "total", rep.Calls, cli.Dollars(rep.CostMicros))
	}
	tw.Flush()
	return nil
}

// printOutcomes prints the outcomes counted, the one forced on purpose
// marked.
func printOutcomes(w io.Writer, outcomes map[string]int, forced string) {
	var keys []string
	for k := range outcomes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		part := fmt.Sprintf("%s %d", k, outcomes[k])
		if k == outcome.SchemaRejected && forced != "" {
			part += " (1 on purpose*)"
		}
		parts = append(parts, part)
	}
	fmt.Fprintf(w, "\noutcomes: %s\n", strings.Join(parts, ", "))
}

// reconcile prints the simulated provider's calls beside the ledger's
// attempt rows, per tenant, and fails when they differ; with a real
// provider it does nothing.
func (e demo) reconcile(w io.Writer, calls, ledgerRows map[string]int64) error {
	if e.Sim == nil {
		return nil
	}
	fmt.Fprintln(w, "model calls (simulated provider) vs ledger attempt rows, per tenant:")
	ok := true
	for _, t := range e.Tenants {
		fmt.Fprintf(w, "  %-7s provider %d  ledger %d\n", t.ID, calls[t.ID], ledgerRows[t.ID])
		ok = ok && calls[t.ID] == ledgerRows[t.ID]
	}
	if !ok {
		return errors.New("the ledger does not reconcile with the provider's call count")
	}
	return nil
}

// table prints one row per work item and returns the outcomes counted and
// the item the provider was told to break ("" when none was).
func (e demo) table(ctx context.Context, w io.Writer, subs []submitted, views []ingress.WorkView) (map[string]int, string, error) {
	forcedTenant, forcedItem := forcedInvalid()
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WORK ID\tTENANT\tREGION\tCONTRACT\tSOURCE\tOUTCOME\tFINDINGS\tATTEMPTS\tCOST (USD)\tREASON")
	outcomes := map[string]int{}
	forced := ""
	for i, s := range subs {
		v := views[i]
		attempts, cost, err := e.Cells[s.Region].Env.Store.WorkCost(ctx, s.WorkID)
		if err != nil {
			return nil, "", err
		}
		findings := "-"
		if v.Result != nil {
			findings = fmt.Sprint(v.Result.Findings)
		}
		outcomes[*v.Outcome]++
		shown := *v.Outcome
		if e.Sim != nil && s.Tenant == forcedTenant && s.Body.SourceID == forcedItem.SourceID && s.Body.Contract == "code-review" {
			shown, forced = shown+" (expected*)", s.WorkID
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", s.WorkID, s.Tenant, s.Region, s.Body.Contract,
			s.Body.SourceID, shown, findings, attempts, cli.Dollars(cost), short(v.Reason, 60))
	}
	tw.Flush()
	if forced != "" {
		fmt.Fprintf(w, "* on purpose: the simulated provider was told to break %s's answer for %q twice, so %s shows a repair re-ask and then schema_rejected\n",
			forcedTenant, forcedItem.Title, forced)
	}
	return outcomes, forced, nil
}

// reachedModel fails the demo when no item got an answer from the model:
// every attempt a transport fault means the endpoint, its name or its key
// is wrong, and the first attempt's reason says which.
func reachedModel(views []ingress.WorkView, at string) error {
	first := ""
	for _, v := range views {
		for _, a := range v.Attempts {
			switch a.Outcome {
			case outcome.AttemptTransportError, outcome.AttemptTransportRejected, outcome.AttemptTimeout, outcome.AttemptRateLimited:
				if first == "" {
					first = a.Reason
				}
			default:
				return nil
			}
		}
	}
	if first == "" {
		return nil
	}
	return fmt.Errorf("no work item reached the model at %s; the first attempt says: %s (check ASSAY_MODEL_BASE_URL or ASSAY_MODEL_ENDPOINT, ASSAY_MODEL and ASSAY_MODEL_API_KEY)", at, first)
}

func (e demo) submit(ctx context.Context, client *http.Client, s submission) (submitted, error) {
	t := e.tenantSeed(s.Tenant)
	c := e.Cells[t.HomeRegion]
	body, _ := json.Marshal(s.Body)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.URL+"/v1/work", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+t.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return submitted{}, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusAccepted && resp.StatusCode != http.StatusOK {
		return submitted{}, fmt.Errorf("submit %s for %s: HTTP %d: %s", s.Label, s.Tenant, resp.StatusCode, raw)
	}
	var r ingress.SubmitResponse
	if err := json.Unmarshal(raw, &r); err != nil {
		return submitted{}, err
	}
	return submitted{submission: s, Region: t.HomeRegion, WorkID: r.WorkID, Status: resp.StatusCode}, nil
}

func (e demo) tenantSeed(id string) struct{ ID, HomeRegion, Token string } {
	for _, t := range e.Tenants {
		if t.ID == id {
			return struct{ ID, HomeRegion, Token string }{t.ID, t.HomeRegion, t.Token}
		}
	}
	panic("unknown demo tenant " + id)
}

func (e demo) getJSON(ctx context.Context, client *http.Client, url, token string, v any) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d: %s", url, resp.StatusCode, raw)
	}
	return json.Unmarshal(raw, v)
}

func (e demo) waitTerminal(ctx context.Context, client *http.Client, subs []submitted, limit time.Duration) ([]ingress.WorkView, error) {
	views := make([]ingress.WorkView, len(subs))
	deadline := time.Now().Add(limit)
	for {
		pending := 0
		for i, s := range subs {
			if views[i].Outcome != nil {
				continue
			}
			t := e.tenantSeed(s.Tenant)
			if err := e.getJSON(ctx, client, e.Cells[s.Region].URL+"/v1/work/"+s.WorkID, t.Token, &views[i]); err != nil {
				return nil, err
			}
			if views[i].Outcome == nil {
				pending++
			}
		}
		if pending == 0 {
			return views, nil
		}
		if err := e.modelDown(ctx, views); err != nil {
			return nil, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d work items did not reach an outcome within %s", pending, limit)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// modelDown fails the wait when a cell's circuit for its model is open and
// no work item has reached the model yet: the work would wait out its
// deadline for a model that does not answer, so the demo says why now.
func (e demo) modelDown(ctx context.Context, views []ingress.WorkView) error {
	for _, c := range e.Cells {
		circ, err := c.Env.Store.GetCircuit(ctx, c.Env.Config.Model)
		if err != nil {
			return err
		}
		if circ.State != store.CircuitOpen {
			continue
		}
		if err := reachedModel(views, "POST "+e.ChatURL()); err != nil {
			return fmt.Errorf("the model %s does not answer (cell %s's circuit is open); %w", c.Env.Config.Model, c.Region, err)
		}
	}
	return nil
}

// waitLedger waits until the ledger has caught up with the provider's count
// (attempt events are recorded asynchronously), then returns both.
func (e demo) waitLedger(ctx context.Context, limit time.Duration) (calls, rows map[string]int64, err error) {
	deadline := time.Now().Add(limit)
	for {
		rows = map[string]int64{}
		for _, c := range e.Cells {
			m, err := c.Env.Store.LedgerCountByTenant(ctx)
			if err != nil {
				return nil, nil, err
			}
			for k, v := range m {
				rows[k] += v
			}
		}
		calls = map[string]int64{}
		if e.Sim == nil {
			return calls, rows, nil
		}
		for k, v := range e.Sim.Stats().Tenants {
			calls[k] = v.Calls
		}
		same := len(calls) == len(rows)
		for k, v := range calls {
			same = same && rows[k] == v
		}
		if same || time.Now().After(deadline) {
			return calls, rows, nil
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (e demo) usage(ctx context.Context, client *http.Client, tenant string) (usage.Report, error) {
	t := e.tenantSeed(tenant)
	var rep usage.Report
	err := e.getJSON(ctx, client, e.Cells[t.HomeRegion].URL+"/v1/usage?tenant="+tenant, t.Token, &rep)
	return rep, err
}

func short(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

// publications shows, per code-review work, what the committer's publisher
// published (to GitHub, with an app configured) or would publish (dry),
// waiting for each to be recorded.
func (e demo) publications(ctx context.Context, w io.Writer, subs []submitted, views []ingress.WorkView, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	type row struct {
		s   submitted
		pub *store.Publication
	}
	var rows []row
	for i, s := range subs {
		if s.Body.Contract != publish.ReviewContract || views[i].Outcome == nil {
			continue
		}
		st := e.Cells[s.Region].Env.Store
		for {
			var pub *store.Publication
			var err error
			for _, target := range []string{publish.TargetGitHub, publish.TargetDry} {
				if pub, err = st.GetPublication(ctx, s.WorkID, target); err == nil && !pub.PublishedAt.IsZero() {
					break
				}
			}
			if err == nil && !pub.PublishedAt.IsZero() {
				rows = append(rows, row{s, pub})
				break
			}
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return err
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("no publication recorded for %s (%s) within %s", s.WorkID, *views[i].Outcome, limit)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	fmt.Fprintln(w, "\npublication (dry: no GitHub App configured, so what would be published; github: what was)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WORK ID\tTARGET\tPULL REQUEST\tOUTCOME\tCHECK RUN\tREVIEW COMMENTS\tRERUN COMMENT")
	for _, r := range rows {
		var p publish.Plan
		if err := json.Unmarshal(r.pub.Plan, &p); err != nil {
			return fmt.Errorf("publication of %s: %w", r.s.WorkID, err)
		}
		check := "-"
		if p.CheckRun != nil {
			check = p.CheckRun.Conclusion + ": " + p.CheckRun.Title
		}
		var at []string
		for _, c := range p.Comments {
			at = append(at, fmt.Sprintf("%s:%d", c.Path, c.Line))
		}
		comments := fmt.Sprintf("%d", len(p.Comments))
		if len(at) > 0 {
			comments += " (" + short(strings.Join(at, " "), 50) + ")"
		}
		rerun := "-"
		if p.Rerun != "" {
			rerun = "1"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s#%d@%s\t%s\t%s\t%s\t%s\n", r.s.WorkID, r.pub.Target, p.Repository, p.Number,
			p.HeadSHA[:min(7, len(p.HeadSHA))], p.Outcome, check, comments, rerun)
	}
	return tw.Flush()
}
