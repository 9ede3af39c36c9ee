package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/price"
	"assay.dev/pkg/store"
	"assay.dev/pkg/usage"
)

// reconcileLine returns the output line of one check.
func reconcileLine(out, check string) string {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[1] == check {
			return l
		}
	}
	return ""
}

// offendersOf returns the ids line printed under a check.
func offendersOf(out, check string) string {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if f := strings.Fields(l); len(f) > 1 && f[1] == check && i+1 < len(lines) {
			return lines[i+1]
		}
	}
	return ""
}

func TestUsageReconcile(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	ctx := context.Background()
	items := evalset.Items()
	if err := b.Sim.AddFault(sim.Fault{Kind: sim.FaultWrongChangeID, Tenant: "acme", Match: "reconcile rejected", Times: 2}); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i, title := range []string{"reconcile one", "reconcile two", "reconcile rejected"} {
		req := celltest.CodeReview(items[i], title)
		req.SourceID = fmt.Sprintf("shop/reconcile#%d", i+1)
		_, r := b.Submit(t, req)
		ids = append(ids, r.WorkID)
	}
	for i, want := range []string{"accepted", "accepted", "schema_rejected"} {
		if v := b.Wait(t, ids[i]); *v.Outcome != want {
			t.Fatalf("work %d: %s (%s), want %s", i, *v.Outcome, v.Reason, want)
		}
	}
	b.WaitLedger(t, "acme", 4)
	acc1, acc2, rej := ids[0], ids[1], ids[2]

	dbURL := b.Cell.Env.Config.DatabaseURL
	args := []string{"--database-url", dbURL, "--region", "us", "--provider-stats", b.Cell.Env.Config.ModelBaseURL}
	var out bytes.Buffer
	if err := usageReconcile(ctx, args, &out); err != nil {
		t.Fatalf("clean cell: %v\n%s", err, out.String())
	}
	checks := []string{"accepted_one_result", "result_only_accepted", "result_attempt_ok", "attempt_one_ledger_row",
		"ledger_has_attempt", "work_in_region", "ledger_provider_calls"}
	for _, c := range checks {
		if l := reconcileLine(out.String(), c); !strings.HasPrefix(l, "OK ") {
			t.Errorf("clean cell, %s: %q\n%s", c, l, out.String())
		}
	}
	for c, fig := range map[string]string{"accepted_one_result": "2 accepted work", "attempt_one_ledger_row": "4 finished attempts",
		"ledger_provider_calls": "1 tenants"} {
		if l := reconcileLine(out.String(), c); !strings.Contains(l, fig+", 0 differ") {
			t.Errorf("%s: %q does not say %s", c, l, fig)
		}
	}

	attempt := func(workID string, number int) string {
		var id string
		if err := b.DB.QueryRow(ctx, `SELECT id::text FROM attempts WHERE work_id = $1 AND number = $2`,
			workID, number).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		tag, err := b.DB.Exec(ctx, sql, args...)
		if err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("%s: %v (%d rows)", sql, err, tag.RowsAffected())
		}
	}
	// Corruptions the schema permits, each breaking one promise.
	lostLedger := attempt(acc1, 1)
	exec(`DELETE FROM ledger WHERE attempt_id = $1`, lostLedger)
	exec(`DELETE FROM results WHERE work_id = $1`, acc2)
	rejAttempt := attempt(rej, 1)
	exec(`INSERT INTO results (work_id, schema_version, tenant_id, attempt_id, output, findings)
		VALUES ($1, 'code-review/1', 'acme', $2, '{}', 0)`, rej, rejAttempt)
	moved := attempt(rej, 2)
	exec(`UPDATE ledger SET work_id = $2 WHERE attempt_id = $1`, moved, acc1)
	stray := "00000000-0000-4000-8000-0000000000aa"
	exec(`INSERT INTO ledger (attempt_id, tenant_id, work_id, model, outcome, occurred_at)
		VALUES ($1, 'acme', $2, 'assay-sim-1', 'ok', now())`, stray, acc2)
	exec(`UPDATE work SET region = 'eu' WHERE id = $1`, acc2)
	// Two more rows for acme than the provider saw: one lost, one stray.
	exec(`DELETE FROM ledger WHERE attempt_id = $1`, attempt(acc2, 1))

	out.Reset()
	err := usageReconcile(ctx, args, &out)
	if err == nil {
		t.Fatalf("corrupted cell reconciled:\n%s", out.String())
	}
	t.Logf("%v\n%s", err, out.String())
	var ce cli.ConfigError
	if errors.As(err, &ce) {
		t.Fatalf("a difference is reported as a bad setting: %v", err)
	}
	want := map[string][]string{
		"accepted_one_result":    {acc2},
		"result_only_accepted":   {rej},
		"result_attempt_ok":      {rej},
		"attempt_one_ledger_row": {lostLedger, moved, attempt(acc2, 1)},
		"ledger_has_attempt":     {stray},
		"work_in_region":         {acc2},
		"ledger_provider_calls":  {"acme(provider=4,ledger=3)"},
	}
	for _, c := range checks {
		l := reconcileLine(out.String(), c)
		if !strings.HasPrefix(l, "DIFF ") || !strings.Contains(l, fmt.Sprintf(", %d differ", len(want[c]))) {
			t.Errorf("%s: %q, want DIFF with %d differing", c, l, len(want[c]))
		}
		for _, id := range want[c] {
			if !strings.Contains(offendersOf(out.String(), c), id) {
				t.Errorf("%s does not list %s:\n%s", c, id, out.String())
			}
		}
		if !strings.Contains(err.Error(), c) {
			t.Errorf("error %q does not name %s", err, c)
		}
	}

	// Work created after --since is out of scope, so nothing differs there.
	out.Reset()
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if err := usageReconcile(ctx, []string{"--database-url", dbURL, "--since", future}, &out); err != nil {
		t.Fatalf("--since in the future: %v\n%s", err, out.String())
	}
	if l := reconcileLine(out.String(), "accepted_one_result"); !strings.Contains(l, "0 accepted work, 0 differ") {
		t.Errorf("--since: %q", l)
	}

	for _, bad := range [][]string{{"--since", "yesterday", "--database-url", dbURL}, {"--database-url", ""}, {"--nope"}} {
		if err := usageReconcile(ctx, bad, &out); !errors.As(err, &ce) {
			t.Errorf("%v: error %v, want a cli.ConfigError", bad, err)
		}
	}
}

// cachedRow is a ledger row's units and cost.
type cachedRow struct {
	id, model, outcome                    string
	in, cached, out, reasoning, costMicro int64
	estimated                             bool
}

// A provider that answers cached_tokens and reasoning_tokens (the
// simulated one, with its prompt cache on) gets a ledger row with those
// counts, its cached input priced at the table's cached-input price; a
// call that brought no usage back stays an estimate at the full price with
// neither; GET /v1/usage, assay usage show and assay usage export report
// the counts the provider billed.
func TestUsageCachedAndReasoningUnits(t *testing.T) {
	t.Parallel()
	cachedPrice := 0.015
	prices := price.Prices{"*": {Input: 0.15, Output: 0.60, CachedInput: &cachedPrice}}
	b := celltest.Setup(t, cell.Options{Prices: prices})
	if err := b.Sim.SetUsageDetails(sim.UsageDetails{CacheMinTokens: 64, CacheBlockTokens: 16, ReasoningTokens: 24}); err != nil {
		t.Fatal(err)
	}
	if err := b.Sim.AddFault(sim.Fault{Kind: sim.FaultServerError, Tenant: "acme", Match: "cache three", Times: 1}); err != nil {
		t.Fatal(err)
	}
	// One at a time: each prompt starts with the contract's instructions,
	// which the provider has cached once it answered the first.
	for i, title := range []string{"cache one", "cache two", "cache three"} {
		req := celltest.CodeReview(evalset.Items()[i], title)
		req.SourceID = fmt.Sprintf("shop/cache#%d", i+1)
		if _, r := b.Submit(t, req); *b.Wait(t, r.WorkID).Outcome != "accepted" {
			t.Fatalf("%s did not end accepted", title)
		}
	}
	b.WaitLedger(t, "acme", 4)
	ledger, sum := cachedLedger(t, b)
	withCache, estimates := checkCachedPrices(t, prices, ledger)
	provider := b.Sim.Stats().Tenants["acme"]
	if withCache < 2 || estimates != 1 || sum.cached != provider.CachedPromptUnits || sum.reasoning != provider.ReasoningUnits {
		t.Fatalf("ledger %+v: %d rows with cached units, %d estimates; %d cached and %d reasoning units, the provider billed %d and %d",
			ledger, withCache, estimates, sum.cached, sum.reasoning, provider.CachedPromptUnits, provider.ReasoningUnits)
	}
	rep := getUsage(t, b)
	if rep.CachedInputUnits != sum.cached || rep.ReasoningUnits != sum.reasoning || rep.CostMicros != sum.costMicro ||
		len(rep.ByModel) != 1 || rep.ByModel[0].CachedInputUnits != sum.cached || rep.EstimatedCalls != 1 {
		t.Errorf("GET /v1/usage %+v, want %d cached and %d reasoning units costing %d", rep, sum.cached, sum.reasoning, sum.costMicro)
	}
	checkUsageShow(t, b, rep)
	settledFor(t, b, len(ledger))
	ex := export(t, b.Cell.Env.Config.DatabaseURL, "--format", "cloudevents", "--tenant", "acme")
	for i, l := range ex.lines {
		var e cloudEvent
		if err := json.Unmarshal([]byte(l), &e); err != nil || i >= len(ledger) || e.ID != ledger[i].id ||
			e.Data.CachedInputUnits != ledger[i].cached || e.Data.ReasoningUnits != ledger[i].reasoning ||
			e.Data.CostMicros != ledger[i].costMicro || e.Data.Estimated != ledger[i].estimated {
			t.Errorf("event %d %s, want the ledger row %+v", i, l, ledger[min(i, len(ledger)-1)])
		}
	}
}

// cachedLedger is acme's ledger rows in the order they occurred, and their
// sums of cached units, reasoning units and cost.
func cachedLedger(t *testing.T, b *celltest.Bundle) ([]cachedRow, cachedRow) {
	t.Helper()
	rows, err := b.DB.Query(t.Context(), `SELECT attempt_id::text, model, outcome, input_units, cached_input_units, output_units,
		reasoning_units, cost_micros, estimated FROM ledger WHERE tenant_id = 'acme' ORDER BY occurred_at`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ledger []cachedRow
	var sum cachedRow
	for rows.Next() {
		var r cachedRow
		if err := rows.Scan(&r.id, &r.model, &r.outcome, &r.in, &r.cached, &r.out, &r.reasoning, &r.costMicro, &r.estimated); err != nil {
			t.Fatal(err)
		}
		ledger = append(ledger, r)
		sum.cached, sum.reasoning, sum.costMicro = sum.cached+r.cached, sum.reasoning+r.reasoning, sum.costMicro+r.costMicro
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ledger, sum
}

// checkCachedPrices holds each row to its price: an estimate in full with
// no cached or reasoning units, any other with the provider's reasoning
// units and its cached ones at the cached-input price. It counts the rows
// with cached units and the estimates.
func checkCachedPrices(t *testing.T, prices price.Prices, ledger []cachedRow) (withCache, estimates int) {
	t.Helper()
	for _, r := range ledger {
		full := prices.CostMicros(r.model, r.in, r.out)
		switch {
		case r.estimated:
			estimates++
			if r.cached != 0 || r.reasoning != 0 || r.costMicro != full {
				t.Errorf("estimate %+v: want no cached or reasoning units and the full price %d", r, full)
			}
		case r.reasoning != 24:
			t.Errorf("row %+v: %d reasoning units, want the provider's 24", r, r.reasoning)
		case r.cached > 0:
			withCache++
			want := prices.Lookup(r.model).Cost(price.Units{Input: r.in, CachedInput: r.cached, Output: r.out})
			if r.costMicro != want || want >= full {
				t.Errorf("row %+v: cost %d, want %d at the cached-input price (below the full %d)", r, r.costMicro, want, full)
			}
		case r.costMicro != full:
			t.Errorf("row %+v without cached units: cost %d, want %d", r, r.costMicro, full)
		}
	}
	return withCache, estimates
}

// checkUsageShow holds assay usage show, as JSON and as a table, to the
// figures of GET /v1/usage.
func checkUsageShow(t *testing.T, b *celltest.Bundle, rep usage.Report) {
	t.Helper()
	ctx, dbURL := context.Background(), b.Cell.Env.Config.DatabaseURL
	var out bytes.Buffer
	if err := usageShow(ctx, []string{"--database-url", dbURL, "--tenant", "acme", "--json"}, &out); err != nil {
		t.Fatal(err)
	}
	var shown usage.Report
	if err := json.Unmarshal(out.Bytes(), &shown); err != nil || shown.CachedInputUnits != rep.CachedInputUnits ||
		shown.ReasoningUnits != rep.ReasoningUnits || shown.CostMicros != rep.CostMicros {
		t.Errorf("assay usage show --json: %s (%v), want GET /v1/usage's figures", out.String(), err)
	}
	out.Reset()
	if err := usageShow(ctx, []string{"--database-url", dbURL, "--tenant", "acme"}, &out); err != nil {
		t.Fatal(err)
	}
	if total := strings.Fields(strings.Split(out.String(), "\n")[2]); len(total) < 6 || total[0] != "total" ||
		total[3] != fmt.Sprint(rep.CachedInputUnits) || total[5] != fmt.Sprint(rep.ReasoningUnits) {
		t.Errorf("assay usage show:\n%s", out.String())
	}
}

// settledFor waits until the export order of b's ledger holds n rows.
func settledFor(t *testing.T, b *celltest.Bundle, n int) {
	t.Helper()
	st, err := store.Open(t.Context(), b.Cell.Env.Config.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	settled(t, st, n)
}

// getUsage is GET /v1/usage as acme.
func getUsage(t *testing.T, b *celltest.Bundle) usage.Report {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, b.Cell.URL+"/v1/usage", nil)
	req.Header.Set("Authorization", "Bearer "+b.Token)
	resp, err := b.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rep usage.Report
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/usage: HTTP %d %v", resp.StatusCode, err)
	}
	return rep
}
