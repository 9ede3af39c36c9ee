package store_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"assay.dev/pkg/store"
)

// exportUntil exports q from its cursor on, resuming from each export's
// cursor, until want rows came (another test's transaction that writes may
// hold the horizon back a moment), and returns them with the last cursor.
func exportUntil(t *testing.T, ctx context.Context, s *store.Store, q store.LedgerExport, want int) ([]store.ExportedRow, store.LedgerCursor) {
	t.Helper()
	var got []store.ExportedRow
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		next, err := s.ExportLedger(ctx, q, func(r store.ExportedRow) error {
			got = append(got, r)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		q.After = next
		if len(got) >= want || time.Now().After(deadline) {
			return got, q.After
		}
	}
}

func attemptIDs(rows []store.ExportedRow) []string {
	var ids []string
	for _, r := range rows {
		ids = append(ids, r.AttemptID)
	}
	return ids
}

// The export reads every ledger row once, in one order: again from the
// start it gives the same rows, and from a cursor exactly the rows after
// it, whether the cursor is a limit's or the end's; a tenant and a time
// narrow it; each row carries its work's contract and its cached and
// reasoning units.
func TestExportLedgerResumes(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	acme := insert(t, ctx, s, newWork("acme", "octo/repo#1", "abc"))
	other := insert(t, ctx, s, newWork("other", "octo/repo#2", "abc"))
	old := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	row := func(w *store.Work, at time.Time) store.LedgerRow {
		return store.LedgerRow{AttemptID: newUUID(), TenantID: w.TenantID, WorkID: w.ID, Model: "assay-sim-1", Outcome: "ok",
			UpstreamAttempts: 1, InputUnits: 2000, CachedInputUnits: 1536, OutputUnits: 300, ReasoningUnits: 64, CostMicros: 321,
			OccurredAt: at}
	}
	write := func(rows ...store.LedgerRow) {
		t.Helper()
		for _, r := range rows {
			if _, err := s.AppendLedger(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	write(row(acme, now), row(other, now), row(acme, old), row(other, old), row(acme, now))

	all, end := exportUntil(t, ctx, s, store.LedgerExport{}, 5)
	ids := attemptIDs(all)
	if len(all) != 5 || len(slices.Compact(slices.Sorted(slices.Values(ids)))) != 5 {
		t.Fatalf("exported %v, want the 5 rows once each", ids)
	}
	if r := all[0]; r.Contract != "pr-review" || r.ContractVersion != "1" || r.CachedInputUnits != 1536 || r.ReasoningUnits != 64 ||
		r.CostMicros != 321 || r.Estimated || !r.OccurredAt.Equal(now) {
		t.Errorf("first row %+v", r)
	}
	again, _ := exportUntil(t, ctx, s, store.LedgerExport{}, 5)
	if !slices.Equal(attemptIDs(again), ids) {
		t.Errorf("a second export gave %v, want %v", attemptIDs(again), ids)
	}
	first, cut := exportUntil(t, ctx, s, store.LedgerExport{Limit: 2}, 2)
	if !slices.Equal(attemptIDs(first), ids[:2]) || cut.AttemptID != ids[1] {
		t.Errorf("two rows: %v and cursor %s, want %v and a cursor at the second", attemptIDs(first), cut, ids[:2])
	}
	rest, _ := exportUntil(t, ctx, s, store.LedgerExport{After: cut}, 3)
	if !slices.Equal(attemptIDs(rest), ids[2:]) {
		t.Errorf("resumed at %s: %v, want %v", cut, attemptIDs(rest), ids[2:])
	}
	if got, _ := exportUntil(t, ctx, s, store.LedgerExport{Tenant: "other", Since: now}, 1); len(got) != 1 ||
		got[0].TenantID != "other" || !got[0].OccurredAt.Equal(now) {
		t.Errorf("other's rows since now: %+v", got)
	}

	later := []store.LedgerRow{row(other, now), row(acme, now)}
	write(later...)
	got, _ := exportUntil(t, ctx, s, store.LedgerExport{After: end}, 2)
	if want := []string{later[0].AttemptID, later[1].AttemptID}; !slices.Equal(attemptIDs(got), want) {
		t.Errorf("resumed at the end %s: %v, want the two new rows %v", end, attemptIDs(got), want)
	}
}

// A row committed while an earlier transaction that writes the ledger is
// still open is held back until that one ends, so a cursor never passes
// a row that lands before it.
func TestExportLedgerWaitsForOpenTransactions(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	w := insert(t, ctx, s, newWork("acme", "octo/repo#1", "abc"))
	slow, fast := newUUID(), newUUID()
	tx, err := store.Pool(s).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `INSERT INTO ledger (attempt_id, tenant_id, work_id, model, outcome, occurred_at)
		VALUES ($1, $2, $3, 'assay-sim-1', 'ok', now())`, slow, w.TenantID, w.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendLedger(ctx, store.LedgerRow{AttemptID: fast, TenantID: w.TenantID, WorkID: w.ID,
		Model: "assay-sim-1", Outcome: "ok", OccurredAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	var before []string
	cursor, err := s.ExportLedger(ctx, store.LedgerExport{}, func(r store.ExportedRow) error {
		before = append(before, r.AttemptID)
		return nil
	})
	if err != nil || len(before) != 0 {
		t.Fatalf("exported %v (%v) while an earlier transaction was open, want nothing yet", before, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got, _ := exportUntil(t, ctx, s, store.LedgerExport{After: cursor}, 2)
	if want := []string{slow, fast}; !slices.Equal(attemptIDs(got), want) {
		t.Errorf("resumed at %s: %v, want the open transaction's row, then the other %v", cursor, attemptIDs(got), want)
	}
}

func TestLedgerCursorText(t *testing.T) {
	t.Parallel()
	for _, c := range []store.LedgerCursor{{}, {Xact: 812}, {Xact: 812, AttemptID: "00000000-0000-4000-8000-0000000000a1"}} {
		got, err := store.ParseLedgerCursor(c.String())
		if err != nil || got != c {
			t.Errorf("%q read back as %+v (%v)", c, got, err)
		}
	}
	for _, bad := range []string{"", "x", "-1", "812.", "812.nope", "812.00000000-0000-4000-8000-0000000000A1", "1e3"} {
		if _, err := store.ParseLedgerCursor(bad); err == nil {
			t.Errorf("cursor %q accepted", bad)
		}
	}
}
