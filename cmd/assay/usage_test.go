package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
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
	var ce configError
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
			t.Errorf("%v: error %v, want a configError", bad, err)
		}
	}
}
