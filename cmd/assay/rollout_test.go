package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/config"
	"assay.dev/pkg/contract"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/event"
	"assay.dev/pkg/store"
	"assay.dev/schemas"
	"assay.dev/services/ingress"
)

// routesRead is the statement ingress reads the routes with: a read begun
// after a change has it, and once the next read begins, new work follows
// it.
const routesRead = "FROM contract_routes ORDER BY"

// outcomeEvents are the message ids of the OUTCOME events b's cell
// published, read from its stream.
func outcomeEvents(t *testing.T, b *celltest.Bundle) map[string]bool {
	t.Helper()
	ctx := t.Context()
	st, err := b.Cell.Env.JS.Stream(ctx, b.Names().Stream(event.KindOutcome))
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	if info.State.Msgs == 0 {
		return out
	}
	c, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for range info.State.Msgs {
		m, err := c.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("reading the OUTCOME stream: %v", err)
		}
		out[m.Headers().Get(jetstream.MsgIDHeader)] = true
	}
	return out
}

// outcomesOf are the OUTCOME message ids the work of sql would have.
func outcomesOf(t *testing.T, b *celltest.Bundle, sql string, args ...any) []string {
	t.Helper()
	rows, err := b.DB.Query(t.Context(), `SELECT id || '.' || state FROM work WHERE `+sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// rollout runs assay rollout against b's cell.
func rollout(t *testing.T, b *celltest.Bundle, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	args = append(args, "--region", b.Cell.Region, "--database-url", b.Cell.Env.Config.DatabaseURL)
	err := rolloutCmd(context.Background(), args, &out)
	return out.String(), err
}

// candidatePrompt writes code-review/2's prompt with a directive the
// simulated reviewer obeys, as a candidate prompt file.
func candidatePrompt(t *testing.T, directive string) string {
	t.Helper()
	base, err := schemas.FS.ReadFile("prompts/code-review-2.txt")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "prompt.txt")
	if err := os.WriteFile(p, append(base, []byte("\n"+directive+"\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func readReport(t *testing.T, dir string, out string) checkReport {
	t.Helper()
	var id int64
	if _, err := fmt.Sscanf(out[strings.Index(out, "rollout check #"):], "rollout check #%d", &id); err != nil {
		t.Fatalf("no check id in %q: %v", out, err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rollout-check-%d.json", id)))
	if err != nil {
		t.Fatal(err)
	}
	var r checkReport
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, fmt.Sprintf("rollout-check-%d.md", id))); err != nil {
		t.Fatal(err)
	}
	return r
}

// A candidate is checked on the evaluation set through the cell: the
// simulator's code-review/2 passes, a prompt that drops the evidence fails
// structurally, one that finds nothing fails on usefulness; promote takes
// only a candidate whose last check, of exactly its prompt, passed. None of
// the check's work is published or opens a review item; every call is
// ledgered as shadow.
func TestRolloutCheckAndPromote(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{Ingress: ingress.Config{RoutesEvery: 200 * time.Millisecond}})
	dir := t.TempDir()

	out, err := rollout(t, b, "check", "--contract", "code-review", "--version", "code-review/2", "--tenant", "acme", "--out", dir)
	if err != nil {
		t.Fatalf("check of code-review/2: %v\n%s", err, out)
	}
	good := readReport(t, dir, out)
	items := len(evalset.Items())
	if !good.Passed || good.Candidate.Transport != 1 || good.Candidate.Structural != 1 || good.Candidate.Items != items {
		t.Fatalf("good candidate: %+v", good)
	}
	if good.Candidate.mean("recall") != good.Live.mean("recall") || good.Live.mean("recall") < 0.7 || good.Candidate.mean("precision") != 1 {
		t.Errorf("usefulness: candidate %.3f/%.3f, live %.3f/%.3f", good.Candidate.mean("recall"), good.Candidate.mean("precision"),
			good.Live.mean("recall"), good.Live.mean("precision"))
	}
	if good.Live.Variant.Version != "code-review/1" {
		t.Errorf("the baseline ran %+v, want the default code-review/1", good.Live.Variant)
	}
	// The candidate's answers carry code-review/2's fields.
	var withCategory int
	if err := b.DB.QueryRow(context.Background(), `SELECT count(*) FROM results r JOIN work w ON w.id = r.work_id
		WHERE w.shadow_of = $1 AND r.schema_version = 'code-review/2' AND r.output->'findings'->0 ? 'category'`,
		fmt.Sprintf("check:%d", good.ID)).Scan(&withCategory); err != nil {
		t.Fatal(err)
	}
	if withCategory < 8 {
		t.Errorf("%d code-review/2 results with categorized findings, want at least 8", withCategory)
	}

	out, err = rollout(t, b, "check", "--contract", "code-review", "--version", "code-review/2", "--tenant", "acme", "--out", dir,
		"--prompt", candidatePrompt(t, sim.DirectiveOmitEvidence))
	if err == nil || !strings.Contains(err.Error(), "structural acceptance 16.7% is under 100.0%") {
		t.Fatalf("a prompt that drops the evidence: %v\n%s", err, out)
	}
	// Only the two clean items, with no finding to drop evidence from,
	// pass the gate.
	noEvidence := readReport(t, dir, out)
	if noEvidence.Passed || noEvidence.Candidate.Transport != 1 || noEvidence.Candidate.Structural != 2.0/12 {
		t.Errorf("no-evidence candidate: transport %.2f (the provider answered every call), structural %.3f, passed %v",
			noEvidence.Candidate.Transport, noEvidence.Candidate.Structural, noEvidence.Passed)
	}

	out, err = rollout(t, b, "check", "--contract", "code-review", "--version", "code-review/2", "--tenant", "acme", "--out", dir,
		"--prompt", candidatePrompt(t, sim.DirectiveNoFindings))
	// The two clean items, with nothing to find, keep their recall of 1.
	if err == nil || !strings.Contains(err.Error(), "recall 0.167 is below the live variant's") {
		t.Fatalf("a prompt that finds nothing: %v\n%s", err, out)
	}
	if r := readReport(t, dir, out); r.Candidate.Structural != 1 || r.Passed {
		t.Errorf("find-nothing candidate: structural %.2f, passed %v", r.Candidate.Structural, r.Passed)
	}

	// Promote: the candidate whose last check failed is refused, and so is
	// a prompt whose check passed elsewhere (the version's own prompt's
	// check does not vouch for another prompt).
	if _, err := rollout(t, b, "set-candidate", "--contract", "code-review", "--version", "code-review/2", "--share", "0",
		"--prompt", candidatePrompt(t, sim.DirectiveNoFindings)); err != nil {
		t.Fatal(err)
	}
	if out, err := rollout(t, b, "promote", "--contract", "code-review"); !errors.Is(err, store.ErrCheckNotPassed) {
		t.Fatalf("promote of a failed candidate: %v\n%s", err, out)
	}
	if _, err := rollout(t, b, "set-candidate", "--contract", "code-review", "--version", "code-review/2", "--share", "0",
		"--prompt", candidatePrompt(t, "Be thorough.")); err != nil {
		t.Fatal(err)
	}
	if out, err := rollout(t, b, "promote", "--contract", "code-review"); !errors.Is(err, store.ErrCheckNotPassed) ||
		!strings.Contains(err.Error(), "was never checked") {
		t.Fatalf("promote of a prompt never checked: %v\n%s", err, out)
	}
	if _, err := rollout(t, b, "set-candidate", "--contract", "code-review", "--version", "code-review/2", "--share", "0"); err != nil {
		t.Fatal(err)
	}
	if out, err := rollout(t, b, "promote", "--contract", "code-review"); err != nil || !strings.Contains(out, "code-review/2") {
		t.Fatalf("promote of the passed candidate: %v\n%s", err, out)
	}
	out, err = rollout(t, b, "status", "--contract", "code-review")
	if err != nil || !strings.Contains(out, "code-review/2, the cell's model") || !strings.Contains(out, "failed") {
		t.Fatalf("status: %v\n%s", err, out)
	}

	// Nothing of the checks was published or reviewed; every call is a
	// ledger row marked shadow, charged to acme.
	checks := b.Count(t, `SELECT count(*) FROM work WHERE shadow_of LIKE 'check:%'`)
	// Three checks, two variants, three samples (the default) of each item.
	if checks != 3*2*3*items {
		t.Errorf("%d check work items, want %d", checks, 3*2*3*items)
	}
	published := outcomeEvents(t, b)
	for _, id := range outcomesOf(t, b, `shadow_of IS NOT NULL`) {
		if published[id] {
			t.Errorf("OUTCOME event %s of shadow work", id)
		}
	}
	if n := b.Count(t, `SELECT count(*) FROM reviews r JOIN work w ON w.id = r.work_id WHERE w.shadow_of IS NOT NULL`); n != 0 {
		t.Errorf("%d review items for shadow work", n)
	}
	calls := b.Count(t, `SELECT count(*) FROM attempts a JOIN work w ON w.id = a.work_id WHERE w.shadow_of IS NOT NULL`)
	b.WaitLedger(t, "acme", int(b.Calls("acme")))
	if n := b.Count(t, `SELECT count(*) FROM ledger WHERE shadow AND tenant_id = 'acme'`); n != calls || int64(n) != b.Calls("acme") {
		t.Errorf("%d shadow ledger rows, %d shadow attempts, %d provider calls", n, calls, b.Calls("acme"))
	}
}

// A share of 20 % of live work also runs with the candidate: exactly the
// sampled items get a twin, which publishes nothing and whose every call
// is a shadow ledger row; live work keeps its version.
func TestRolloutShadowShare(t *testing.T) {
	t.Parallel()
	reads := &statements{service: "ingress", fragment: routesRead}
	b := celltest.Setup(t, cell.Options{Ingress: ingress.Config{RoutesEvery: 200 * time.Millisecond}, StoreTracer: reads.tracer})
	if _, err := rollout(t, b, "set-candidate", "--contract", "code-review", "--version", "code-review/2", "--share", "0.2"); err != nil {
		t.Fatal(err)
	}
	reads.waitNext(t, 2) // the routes are read again every 200 ms
	items := evalset.Items()
	var live []string
	sampled := 0
	for i := range 40 {
		req := celltest.CodeReview(items[i%len(items)], "shadow share")
		req.SourceID = fmt.Sprintf("shop/shadow#%d", i)
		_, r := b.Submit(t, req)
		live = append(live, r.WorkID)
		if ingress.ShadowSampled(r.WorkID, 0.2) {
			sampled++
		}
	}
	for _, id := range live {
		if v := b.Wait(t, id); *v.Outcome != "accepted" || v.SchemaVersion != "code-review/1" {
			t.Fatalf("live work %s: %s, version %s", id, *v.Outcome, v.SchemaVersion)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for b.Count(t, `SELECT count(*) FROM work WHERE shadow_of IS NOT NULL AND state IN ('queued', 'running')`) > 0 ||
		b.Count(t, `SELECT count(*) FROM work WHERE shadow_of IS NOT NULL`) < sampled {
		if time.Now().After(deadline) {
			t.Fatal("shadow work did not end")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if sampled < 3 || sampled > 16 {
		t.Fatalf("%d of 40 sampled at 20%%", sampled)
	}
	shadows := b.Count(t, `SELECT count(*) FROM work WHERE shadow_of IS NOT NULL`)
	twins := b.Count(t, `SELECT count(*) FROM work WHERE shadow_of = ANY($1) AND schema_version = 'code-review/2'
		AND state = 'accepted' AND lane = 'batch'`, live)
	if shadows != sampled || twins != sampled {
		t.Fatalf("%d shadow work items, %d accepted code-review/2 twins of live work, want %d", shadows, twins, sampled)
	}
	published := outcomeEvents(t, b)
	for _, id := range outcomesOf(t, b, `shadow_of IS NOT NULL`) {
		if published[id] {
			t.Errorf("OUTCOME event %s of shadow work", id)
		}
	}
	for _, id := range outcomesOf(t, b, `id = ANY($1)`, live) {
		if !published[id] {
			t.Errorf("no OUTCOME event %s of live work", id)
		}
	}
	if n := b.Count(t, `SELECT count(*) FROM publications p JOIN work w ON w.id = p.work_id WHERE w.shadow_of IS NOT NULL`); n != 0 {
		t.Errorf("%d publications of shadow work", n)
	}
	b.WaitLedger(t, "acme", int(b.Calls("acme")))
	calls := b.Count(t, `SELECT count(*) FROM attempts a JOIN work w ON w.id = a.work_id WHERE w.shadow_of IS NOT NULL`)
	if n := b.Count(t, `SELECT count(*) FROM ledger WHERE shadow`); n != calls || calls < sampled {
		t.Errorf("%d shadow ledger rows for %d shadow calls", n, calls)
	}
	if n := b.Count(t, `SELECT count(*) FROM ledger l JOIN work w ON w.id = l.work_id WHERE l.shadow <> (w.shadow_of IS NOT NULL)`); n != 0 {
		t.Errorf("%d ledger rows marked against their work", n)
	}
	f, err := b.Cell.Env.Store.Console(context.Background(), time.Hour, "acme", 5, time.Now().Add(-time.Hour))
	if err != nil || len(f.Rollouts) != 1 {
		t.Fatalf("console rollouts: %+v %v", f.Rollouts, err)
	}
	if r := f.Rollouts[0]; r.Runs != int64(sampled) || r.Accepted != int64(sampled) || r.Open != 0 || r.Candidate.Version != "code-review/2" ||
		r.ShadowShare < 0.19 || r.ShadowShare > 0.21 {
		t.Errorf("console rollout %+v", r)
	}
	// The tenant's list of its work has its 40 items, not their twins.
	req, _ := http.NewRequest(http.MethodGet, b.Cell.URL+"/v1/work?limit=1000", nil)
	req.Header.Set("Authorization", "Bearer "+b.Token)
	resp, err := b.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var list ingress.WorkList
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || err != nil || len(list.Items) != len(live) {
		t.Fatalf("GET /v1/work: %d, %d items, want %d: %v", resp.StatusCode, len(list.Items), len(live), err)
	}
	out, err := rollout(t, b, "compare", "--contract", "code-review", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var cs []comparison
	if err := json.Unmarshal([]byte(out), &cs); err != nil || len(cs) != 1 {
		t.Fatalf("compare: %v\n%s", err, out)
	}
	if c := cs[0]; c.Runs != sampled || c.Accepted != sampled || c.Compared != sampled || c.Agreement != 1 || c.StructuralFailures != 0 {
		t.Errorf("comparison %+v", c)
	}
}

// Switching the live version from 1 to 2 with work in flight: work made
// before the switch finishes as code-review/1 (its result, its output's
// schemaVersion), work made after as code-review/2, and none is lost.
func TestRolloutSwitchInFlight(t *testing.T) {
	t.Parallel()
	reads := &statements{service: "ingress", fragment: routesRead}
	b := celltest.Setup(t, cell.Options{Ingress: ingress.Config{RoutesEvery: 100 * time.Millisecond}, StoreTracer: reads.tracer})
	if err := b.Sim.SetCapacity(sim.Capacity{Concurrency: 2, Latency: sim.Latency{Base: 300 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	items := evalset.Items()
	submit := func(prefix string, n int) []string {
		var ids []string
		for i := range n {
			req := celltest.CodeReview(items[i%len(items)], "switch")
			req.SourceID = fmt.Sprintf("shop/%s#%d", prefix, i)
			_, r := b.Submit(t, req)
			ids = append(ids, r.WorkID)
		}
		return ids
	}
	before := submit("before", 12)
	if _, err := rollout(t, b, "set-live", "--contract", "code-review", "--version", "code-review/2",
		"--override", "--reason", "a switch with work in flight"); err != nil {
		t.Fatal(err)
	}
	reads.waitNext(t, 2)
	inFlight := b.Count(t, `SELECT count(*) FROM work WHERE id = ANY($1) AND state IN ('queued', 'running')`, before)
	after := submit("after", 12)
	check := func(ids []string, version string, value float64, category bool) {
		for _, id := range ids {
			v := b.Wait(t, id)
			if *v.Outcome != "accepted" || v.SchemaVersion != version || v.Result == nil || v.Result.SchemaVersion != version {
				t.Fatalf("%s: %s, made for %s, result %+v; want accepted %s", id, *v.Outcome, v.SchemaVersion, v.Result, version)
			}
			var out struct {
				SchemaVersion float64 `json:"schemaVersion"`
				Findings      []map[string]any
			}
			if err := json.Unmarshal(v.Result.Output, &out); err != nil || out.SchemaVersion != value {
				t.Fatalf("%s: output %s", id, v.Result.Output)
			}
			for _, f := range out.Findings {
				if _, has := f["category"]; has != category {
					t.Fatalf("%s (%s): finding %v", id, version, f)
				}
			}
		}
	}
	check(before, "code-review/1", 1, false)
	check(after, "code-review/2", 2, true)
	if inFlight == 0 {
		t.Errorf("no code-review/1 work was still in flight at the switch")
	}
	t.Logf("%d of %d code-review/1 items were in flight at the switch", inFlight, len(before))
}

// rolloutExit runs assay rollout against b's cell as the command line
// does: its exit code and what it wrote to stderr.
func rolloutExit(t *testing.T, b *celltest.Bundle, args ...string) (int, string) {
	t.Helper()
	var stderr bytes.Buffer
	args = append(append([]string{"rollout"}, args...), "--region", b.Cell.Region, "--database-url", b.Cell.Env.Config.DatabaseURL)
	code := run(args, &stderr)
	return code, stderr.String()
}

// Live traffic moves only to a variant whose last check, of exactly its
// version, model and prompt, passed, or to the contract's default as
// shipped, whatever command moves it; an override moves anyway, with a
// reason, and status and the console mark it with who and why. Every
// change is in the route's history.
func TestRolloutFence(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	reg, err := contract.Load()
	if err != nil {
		t.Fatal(err)
	}
	v2, _ := reg.Of("code-review", "code-review/2")
	passed := func(model, digest string) int64 {
		t.Helper()
		st := b.Cell.Env.Store
		id, err := st.StartCheck(t.Context(), store.RolloutCheck{Contract: "code-review", SchemaVersion: "code-review/2",
			Model: model, PromptDigest: digest, TenantID: "acme"})
		if err == nil {
			err = st.EndCheck(t.Context(), id, true, json.RawMessage(`{"passed":true}`))
		}
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	routes := func() []store.Route {
		t.Helper()
		rs, err := b.Cell.Env.Store.Routes(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}

	// Never checked: refused with exit 2, naming the variant and the check
	// to run; nothing moves.
	code, stderr := rolloutExit(t, b, "set-live", "--contract", "code-review", "--version", "code-review/2")
	for _, want := range []string{"not moved", "code-review/2 with the cell's model and prompt " + v2.PromptDigest + " was never checked",
		"run assay rollout check --contract code-review --version code-review/2 --tenant TENANT", "--override --reason TEXT"} {
		if code != 2 || !strings.Contains(stderr, want) {
			t.Fatalf("set-live never checked: exit %d, want 2 and %q in\n%s", code, want, stderr)
		}
	}
	if rs := routes(); len(rs) != 0 {
		t.Fatalf("a refused set-live left routes %+v", rs)
	}
	// Passed checks of the same version with another model, or another
	// prompt, do not count for it.
	other := candidatePrompt(t, "Be brief.")
	otherText, err := os.ReadFile(other)
	if err != nil {
		t.Fatal(err)
	}
	passed("gpt-other", v2.PromptDigest)
	passed("", contract.PromptDigest(string(otherText)))
	_, err = rollout(t, b, "set-live", "--contract", "code-review", "--version", "code-review/2")
	var cerr cli.ConfigError
	if !errors.Is(err, store.ErrCheckNotPassed) || !errors.As(err, &cerr) {
		t.Fatalf("set-live with checks of other variants: %v", err)
	}
	_, err = rollout(t, b, "set-live", "--contract", "code-review", "--version", "code-review/2", "--model", "gpt-x",
		"--prompt", other, "--tenant", "acme")
	if !errors.Is(err, store.ErrCheckNotPassed) ||
		!strings.Contains(err.Error(), "--version code-review/2 --model gpt-x --prompt "+other+" --tenant acme") {
		t.Fatalf("set-live of another model with a prompt: %v", err)
	}
	// --override needs a reason, and a reason needs --override.
	for _, args := range [][]string{{"--override"}, {"--override", "--reason", " "}, {"--reason", "why"}} {
		code, stderr := rolloutExit(t, b, append([]string{"set-live", "--contract", "code-review", "--version", "code-review/2"}, args...)...)
		if code != 2 || !strings.Contains(stderr, "--reason") {
			t.Fatalf("set-live %v: exit %d\n%s", args, code, stderr)
		}
	}
	if rs := routes(); len(rs) != 0 {
		t.Fatalf("a refused override left routes %+v", rs)
	}
	// An override moves, and status says who and why.
	out, err := rollout(t, b, "set-live", "--contract", "code-review", "--version", "code-review/2", "--override", "--reason", "incident 7")
	if err != nil || !strings.Contains(out, "new work gets code-review/2") || !strings.Contains(out, "override by assay rollout set-live: incident 7") {
		t.Fatalf("set-live --override: %v\n%s", err, out)
	}
	out, err = rollout(t, b, "status", "--contract", "code-review")
	if err != nil || !strings.Contains(out, "OVERRIDE: code-review/2, the cell's model") ||
		!strings.Contains(out, "by assay rollout set-live at") || !strings.Contains(out, ": incident 7") {
		t.Fatalf("status after the override: %v\n%s", err, out)
	}
	status := func() statusView {
		t.Helper()
		out, err := rollout(t, b, "status", "--contract", "code-review", "--json")
		var v statusView
		if err == nil {
			err = json.Unmarshal([]byte(out), &v)
		}
		if err != nil {
			t.Fatalf("status --json: %v\n%s", err, out)
		}
		return v
	}
	if v := status(); len(v.Routes) != 1 || v.Routes[0].Override == nil || v.Routes[0].Override.Reason != "incident 7" ||
		v.Routes[0].Override.By != "assay rollout set-live" || len(v.History) != 1 || v.History[0].Verb != store.ChangeOverride {
		t.Fatalf("status --json after the override: %+v", v)
	}
	// A passed check of exactly the variant allows it: the mark goes.
	check := passed("", v2.PromptDigest)
	out, err = rollout(t, b, "set-live", "--contract", "code-review", "--version", "code-review/2")
	if err != nil || !strings.Contains(out, fmt.Sprintf("(check #%d passed)", check)) {
		t.Fatalf("set-live after a passed check: %v\n%s", err, out)
	}
	if out, err := rollout(t, b, "status", "--contract", "code-review"); err != nil || strings.Contains(out, "OVERRIDE") {
		t.Fatalf("status after the check: %v\n%s", err, out)
	}
	// The contract's default as shipped needs no check.
	out, err = rollout(t, b, "set-live", "--contract", "code-review", "--version", "code-review/1")
	if err != nil || !strings.Contains(out, "the contract's default as shipped") {
		t.Fatalf("set-live of the default: %v\n%s", err, out)
	}
	// Promote is fenced the same way, and overridden the same way.
	if _, err := rollout(t, b, "set-candidate", "--contract", "code-review", "--version", "code-review/2", "--model", "gpt-y",
		"--share", "0"); err != nil {
		t.Fatal(err)
	}
	code, stderr = rolloutExit(t, b, "promote", "--contract", "code-review")
	if code != 2 || !strings.Contains(stderr, "code-review/2 with model gpt-y") ||
		!strings.Contains(stderr, "assay rollout check --contract code-review --version code-review/2 --model gpt-y --tenant TENANT") {
		t.Fatalf("promote never checked: exit %d\n%s", code, stderr)
	}
	out, err = rollout(t, b, "promote", "--contract", "code-review", "--override", "--reason", "gpt-y is cheaper")
	if err != nil || !strings.Contains(out, "override by assay rollout promote: gpt-y is cheaper") {
		t.Fatalf("promote --override: %v\n%s", err, out)
	}

	v := status()
	type row struct{ verb, from, to, reason string }
	var got []row
	for _, c := range v.History {
		got = append(got, row{c.Verb, c.From.Label(), c.To.Label(), c.Reason})
	}
	want := []row{
		{store.ChangeOverride, "code-review/1", "code-review/2 gpt-y", "gpt-y is cheaper"},
		{store.ChangeSetCandidate, "", "code-review/2 gpt-y", ""},
		{store.ChangeSetLive, "code-review/2", "code-review/1", ""},
		{store.ChangeSetLive, "code-review/2", "code-review/2", ""},
		{store.ChangeOverride, "code-review/1", "code-review/2", "incident 7"},
	}
	if !slices.Equal(got, want) || v.History[3].CheckID != check {
		t.Fatalf("history, newest first:\n got %+v\nwant %+v", got, want)
	}
	if o := v.Routes[0].Override; o == nil || o.By != "assay rollout promote" || o.Reason != "gpt-y is cheaper" {
		t.Fatalf("status --json after promote --override: %+v", v.Routes[0])
	}

	// The console marks the override and lists the route's changes.
	req, _ := http.NewRequest(http.MethodGet, b.Cell.URL+"/v1/console", nil)
	req.Header.Set("Authorization", "Bearer "+b.Token)
	resp, err := b.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var c ingress.Console
	err = json.NewDecoder(resp.Body).Decode(&c)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || err != nil || len(c.Rollouts) != 1 {
		t.Fatalf("GET /v1/console: %d, %+v, %v", resp.StatusCode, c.Rollouts, err)
	}
	r := c.Rollouts[0]
	if r.Override == nil || r.Override.By != "assay rollout promote" || r.Override.Reason != "gpt-y is cheaper" ||
		len(r.Changes) != 5 || r.Changes[0].Verb != store.ChangeOverride || r.Changes[3].CheckID != check {
		t.Fatalf("console rollout %+v", r)
	}
}

// twoCells starts cells us and eu of one installation, each reading its
// routes every 200 ms, with each one's database in its
// ASSAY_DATABASE_URL_<CELL> and the single-cell settings unset.
func twoCells(t *testing.T) (map[string]*celltest.Bundle, map[string]*statements) {
	t.Helper()
	natsURL := testenv.NATS(t)
	cells := map[string]*celltest.Bundle{}
	reads := map[string]*statements{}
	for _, region := range []string{"us", "eu"} {
		reads[region] = &statements{service: "ingress", fragment: routesRead}
		cells[region] = celltest.SetupOn(t, cell.Options{Config: config.Config{Region: region, Regions: config.DefaultRegions,
			DatabasePool: 2}, Ingress: ingress.Config{RoutesEvery: 200 * time.Millisecond}, StoreTracer: reads[region].tracer},
			nil, natsURL)
		t.Setenv(cellDatabaseVar(region), cells[region].Cell.Env.Config.DatabaseURL)
	}
	for _, k := range []string{"ASSAY_REGION", "ASSAY_DATABASE_URL", "ASSAY_CELL", "ASSAY_CELLS", "ASSAY_REGIONS"} {
		t.Setenv(k, "")
	}
	return cells, reads
}

// liveOf is the live variant of every tenant's code-review route in st,
// "-" without one.
func liveOf(t *testing.T, st *store.Store) string {
	t.Helper()
	rs, err := st.Routes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Scope == store.RouteAll && r.Contract == "code-review" {
			return r.Live.Label()
		}
	}
	return "-"
}

// Rollouts are per cell, and --cells and --all-cells make one in every
// cell named: each cell is gated by its own last check and keeps its own
// history. A cell with no passed check is reported not moved, the cells
// after it still move, and the command exits 2 naming both; with
// --override every cell moves, and new work in each cell gets the version.
func TestRolloutAcrossCellsGatesEachCell(t *testing.T) {
	cells, reads := twoCells(t)
	us, eu := cells["us"].Cell.Env.Store, cells["eu"].Cell.Env.Store
	ctx := t.Context()
	run := func(args ...string) (string, error) {
		t.Helper()
		var out bytes.Buffer
		err := rolloutCmd(ctx, append(append([]string{}, args...), "--contract", "code-review"), &out)
		return out.String(), err
	}
	reg, err := contract.Load()
	if err != nil {
		t.Fatal(err)
	}
	v2, _ := reg.Of("code-review", "code-review/2")
	check := finishedCheck(t, us, v2.PromptDigest)

	// Only us has a passed check: eu, named first, is refused and
	// reported, and us still moves.
	out, err := run("set-live", "--version", "code-review/2", "--cells", "eu,us")
	var refusal cli.ConfigError
	if !errors.As(err, &refusal) || !strings.Contains(err.Error(), "moved in 1 of 2 cells: moved in us; not moved in eu") {
		t.Fatalf("set-live --cells eu,us: %v (want a refusal naming the cells)\n%s", err, out)
	}
	for _, want := range []string{"cell eu: not moved: " + store.ErrCheckNotPassed.Error(), "was never checked",
		fmt.Sprintf("cell us: code-review for every tenant: new work gets code-review/2, the cell's model, its own prompt %s (check #%d passed)",
			store.ShortDigest(v2.PromptDigest), check)} {
		if !strings.Contains(out, want) {
			t.Fatalf("set-live --cells eu,us printed\n%s\nwant %q", out, want)
		}
	}
	if liveOf(t, us) != "code-review/2" || liveOf(t, eu) != "-" {
		t.Fatalf("after the refusal in eu: us live %s, eu live %s", liveOf(t, us), liveOf(t, eu))
	}
	// An override moves the cell its fence refused, with the reason in
	// that cell's history.
	out, err = run("set-live", "--version", "code-review/2", "--all-cells", "--override", "--reason", "eu checked by hand")
	if err != nil || !strings.Contains(out, "cell us: code-review for every tenant: new work gets code-review/2") ||
		!strings.Contains(out, "(override by assay rollout set-live: eu checked by hand)") ||
		!strings.Contains(out, "moved in every cell named: us, eu") {
		t.Fatalf("set-live --all-cells --override: %v\n%s", err, out)
	}
	for region, b := range cells {
		reads[region].waitNext(t, 2)
		_, r := b.Submit(t, celltest.CodeReview(evalset.Items()[0], "every cell"))
		if v := b.Wait(t, r.WorkID); v.SchemaVersion != "code-review/2" {
			t.Errorf("new work in %s made for %s, want code-review/2", region, v.SchemaVersion)
		}
	}
	// A cell without a database is refused before any cell changes.
	if out, err := run("set-candidate", "--version", "code-review/1", "--share", "0", "--cells", "us,ap"); !errors.As(err, &refusal) ||
		!strings.Contains(err.Error(), "set "+cellDatabaseVar("ap")) || out != "" {
		t.Fatalf("set-candidate in a cell without a database: %v\n%s", err, out)
	}
	// Promote goes across cells the same way: the shipped default needs
	// no check anywhere.
	if out, err := run("set-candidate", "--version", "code-review/1", "--share", "0", "--all-cells"); err != nil {
		t.Fatalf("set-candidate --all-cells: %v\n%s", err, out)
	}
	out, err = run("promote", "--all-cells")
	if err != nil || strings.Count(out, "the contract's default as shipped") != 2 || liveOf(t, us) != "code-review/1" ||
		liveOf(t, eu) != "code-review/1" {
		t.Fatalf("promote --all-cells: %v\n%s", err, out)
	}
}

// finishedCheck records a passed rollout check of code-review/2 with the
// cell's model and the prompt digest given, in st, and returns its id.
func finishedCheck(t *testing.T, st *store.Store, digest string) int64 {
	t.Helper()
	id, err := st.StartCheck(t.Context(), store.RolloutCheck{Contract: "code-review", SchemaVersion: "code-review/2",
		PromptDigest: digest, TenantID: "acme"})
	if err == nil {
		err = st.EndCheck(t.Context(), id, true, json.RawMessage(`{"passed":true}`))
	}
	if err != nil {
		t.Fatal(err)
	}
	return id
}
