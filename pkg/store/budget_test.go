package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/store"
)

// Fifty workers reserve at once against a budget that holds ten: exactly
// ten are reserved, and the period never goes past its limit.
func TestReserveRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t, testenv.Database(t))
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.SeedTenants(ctx, []store.TenantSeed{{ID: "acme", HomeRegion: "us", Token: "t"}}); err != nil {
		t.Fatal(err)
	}
	const amount = 70
	limit := int64(10 * amount)
	if err := s.SetBudget(ctx, "acme", &limit, "month"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	results := make([]store.Reservation, 50)
	for i := range results {
		wg.Go(func() {
			r, err := s.Reserve(ctx, "acme", fmt.Sprintf("00000000-0000-4000-8000-%012d", i), amount)
			if err != nil {
				t.Error(err)
			}
			results[i] = r
		})
	}
	wg.Wait()
	got := map[store.Reservation]int{}
	for _, r := range results {
		got[r]++
	}
	if got[store.Reserved] != 10 || got[store.Busy] != 40 {
		t.Fatalf("reserved %d, busy %d, exhausted %d; want 10, 40, 0", got[store.Reserved], got[store.Busy], got[store.Exhausted])
	}
	b, err := s.CurrentBudget(ctx, "acme")
	if err != nil || b.ReservedMicros != limit {
		t.Fatalf("period %+v (%v), want %d reserved", b, err, limit)
	}
	// Releasing one makes room for exactly one more, once.
	var held string
	for i, r := range results {
		if r == store.Reserved {
			held = fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
			break
		}
	}
	for range 2 {
		if err := s.Release(ctx, held); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := s.CurrentBudget(ctx, "acme"); err != nil || b.ReservedMicros != limit-amount {
		t.Fatalf("after releasing %s twice: %+v (%v), want %d reserved", held, b, err, limit-amount)
	}
	if r, err := s.Reserve(ctx, "acme", "00000000-0000-4000-8000-888888888888", amount); err != nil || r != store.Reserved {
		t.Fatalf("reserve after a release = %v, %v; want reserved", r, err)
	}
	if r, err := s.Reserve(ctx, "acme", "00000000-0000-4000-8000-888888888889", amount); err != nil || r != store.Busy {
		t.Fatalf("reserve on a full budget = %v, %v; want busy", r, err)
	}
	if _, err := store.Pool(s).Exec(ctx, `UPDATE budget_periods SET spent_micros = limit_micros, reserved_micros = 0`); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Reserve(ctx, "acme", "00000000-0000-4000-8000-999999999999", 1); err != nil || r != store.Exhausted {
		t.Fatalf("reserve on a spent budget = %v, %v; want exhausted", r, err)
	}
}

// The period rule is one SQL function; every budget statement asks it.
func TestPeriodStart(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	at := time.Date(2026, 12, 1, 17, 4, 5, 0, time.FixedZone("x", -8*3600)) // 2026-12-02 01:04 UTC
	for _, c := range []struct {
		period string
		want   time.Time
	}{
		{"day", time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)},
		{"month", time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)},
	} {
		got, err := s.PeriodStart(ctx, c.period, at)
		if err != nil || !got.Equal(c.want) {
			t.Errorf("%s: %v, %v; want %v", c.period, got, err, c.want)
		}
	}
}

// A batch of ledger rows settles each reservation as one row at a time
// would, in one transaction; a row the database refuses for good fails
// alone, and a row already there is a duplicate.
func TestRecordLedgerBatchSettlesEachRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t, testenv.Database(t))
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.SeedTenants(ctx, []store.TenantSeed{{ID: "acme", HomeRegion: "us", Token: "t1"}, {ID: "globex", HomeRegion: "us", Token: "t2"}}); err != nil {
		t.Fatal(err)
	}
	limit := int64(10_000)
	for _, tenant := range []string{"acme", "globex"} {
		if err := s.SetBudget(ctx, tenant, &limit, "month"); err != nil {
			t.Fatal(err)
		}
	}
	id := func(i int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", i) }
	works := map[string]string{}
	for _, tenant := range []string{"acme", "globex"} {
		works[tenant] = insert(t, ctx, s, newWork(tenant, "octo/batch#1", "b1")).ID
	}
	row := func(i int, tenant string, cost int64) store.LedgerRow {
		return store.LedgerRow{AttemptID: id(i), TenantID: tenant, WorkID: works[tenant], Model: "assay-sim-1",
			Outcome: "ok", UpstreamAttempts: 1, CostMicros: cost, OccurredAt: time.Now()}
	}
	for i, tenant := range []string{"acme", "globex", "acme", "globex"} {
		if r, err := s.Reserve(ctx, tenant, id(i), 100); err != nil || r != store.Reserved {
			t.Fatalf("reserve %d: %v %v", i, r, err)
		}
	}
	if _, err := s.AppendLedger(ctx, row(9, "acme", 1)); err != nil {
		t.Fatal(err)
	}
	rows := []store.LedgerRow{row(0, "acme", 60), row(1, "globex", 150), row(2, "acme", 100), row(3, "globex", 40), row(9, "acme", 1)}
	got := s.RecordLedgerBatch(ctx, rows)
	want := []store.LedgerResult{{Recorded: store.Inserted}, {Recorded: store.Inserted, Excess: 50}, {Recorded: store.Inserted},
		{Recorded: store.Inserted}, {Recorded: store.Duplicate}}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("row %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	for tenant, spent := range map[string]int64{"acme": 160 + 1, "globex": 190} {
		b, err := s.CurrentBudget(ctx, tenant)
		if err != nil || b.ReservedMicros != 0 || b.SpentMicros != spent {
			t.Errorf("%s: %+v (%v), want nothing reserved and %d spent", tenant, b, err, spent)
		}
	}
	if n := countRows(t, s, `SELECT count(*) FROM ledger WHERE excess_micros = 50 AND attempt_id = $1`, id(1)); n != 1 {
		t.Errorf("the excess of row 1 is not recorded")
	}
	// An attempt named twice in one batch is recorded once; a row without
	// a reservation is spent in its tenant's current period.
	got = s.RecordLedgerBatch(ctx, []store.LedgerRow{row(30, "globex", 7), row(30, "globex", 7), row(31, "globex", 3)})
	if got[0].Recorded != store.Inserted || got[1].Recorded != store.Duplicate || got[2].Recorded != store.Inserted {
		t.Fatalf("a batch naming one attempt twice: %+v", got)
	}
	if b, err := s.CurrentBudget(ctx, "globex"); err != nil || b.SpentMicros != 190+7+3 {
		t.Errorf("globex after the twice-named attempt: %+v (%v), want %d spent", b, err, 190+7+3)
	}
	// A report after its own estimate in one batch replaces the estimate;
	// an estimate after its report changes nothing.
	estimate := func(i int) store.LedgerRow { r := row(i, "acme", 9); r.Estimated = true; return r }
	got = s.RecordLedgerBatch(ctx, []store.LedgerRow{estimate(40), row(40, "acme", 4), row(41, "acme", 4), estimate(41)})
	want = []store.LedgerResult{{Recorded: store.Inserted}, {Recorded: store.Replaced}, {Recorded: store.Inserted}, {Recorded: store.Duplicate}}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("estimate and report in one batch, row %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if n := countRows(t, s, `SELECT count(*) FROM ledger WHERE attempt_id = ANY($1::uuid[]) AND NOT estimated AND cost_micros = 4`,
		[]string{id(40), id(41)}); n != 2 {
		t.Errorf("%d of the two attempts hold their report, want 2", n)
	}
	// A row with a NUL in its work id is refused for good; its batch
	// neighbours are recorded all the same.
	bad := row(20, "acme", 5)
	bad.WorkID = "w_\x00"
	got = s.RecordLedgerBatch(ctx, []store.LedgerRow{row(21, "acme", 5), bad, row(22, "acme", 5)})
	if got[0].Recorded != store.Inserted || got[2].Recorded != store.Inserted || !store.Permanent(got[1].Err) {
		t.Fatalf("a batch with a refused row: %+v", got)
	}
	if n := countRows(t, s, `SELECT count(*) FROM ledger WHERE attempt_id = ANY($1::uuid[])`, []string{id(20), id(21), id(22)}); n != 2 {
		t.Fatalf("%d of the batch's rows recorded, want 2", n)
	}
}

func countRows(t *testing.T, s *store.Store, q string, args ...any) int {
	t.Helper()
	var n int
	if err := store.Pool(s).QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// spendRow is an attempt of w's tenant, as the ledger records it.
func spendRow(w *store.Work, cost int64) store.LedgerRow {
	return store.LedgerRow{AttemptID: newUUID(), TenantID: w.TenantID, WorkID: w.ID, Model: "assay-sim-1", Outcome: "ok",
		UpstreamAttempts: 1, CostMicros: cost, OccurredAt: time.Now()}
}

// A budget set after the tenant spent $0.0079 of the day counts that
// spend: a budget of $0.0080 refuses the next reservation, where it once
// let three more calls through. An attempt that began before the budget
// and settles after it is counted once; a budget changed again mid-period,
// with a reservation in flight or after a time without a budget, keeps
// every attempt of the period counted once.
func TestBudgetSetMidPeriodCountsTheSpendSoFar(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	w := insert(t, ctx, s, newWork("acme", "octo/budget#1", "r1"))
	other := insert(t, ctx, s, newWork("other", "octo/budget#1", "r1"))
	for _, r := range []store.LedgerRow{spendRow(w, 7000), spendRow(w, 900), spendRow(other, 5000)} {
		if _, err := s.AppendLedger(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	// Yesterday's spend is another period's.
	old := spendRow(w, 100_000)
	if _, err := s.AppendLedger(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Pool(s).Exec(ctx, `UPDATE ledger SET recorded_at = now() - interval '1 day',
		occurred_at = now() - interval '1 day' WHERE attempt_id = $1`, old.AttemptID); err != nil {
		t.Fatal(err)
	}
	limit := func(m int64) *int64 { return &m }
	set := func(micros *int64, wantSpent, wantReserved int64) {
		t.Helper()
		b, err := s.SetBudgetCounted(ctx, "acme", micros, "day")
		day, _ := s.PeriodStart(ctx, "day", time.Now())
		if err != nil || b.SpentMicros != wantSpent || b.ReservedMicros != wantReserved || !b.PeriodStart.Equal(day) ||
			(micros != nil && b.LimitMicros != *micros) {
			t.Fatalf("set budget %v: %+v (%v); want %d spent and %d reserved in the period from %v", micros, b, err, wantSpent,
				wantReserved, day)
		}
	}
	standing := func(wantSpent, wantReserved int64) {
		t.Helper()
		if b, err := s.CurrentBudget(ctx, "acme"); err != nil || b.SpentMicros != wantSpent || b.ReservedMicros != wantReserved {
			t.Fatalf("period %+v (%v); want %d spent and %d reserved", b, err, wantSpent, wantReserved)
		}
	}
	record := func(r store.LedgerRow) {
		t.Helper()
		if _, _, err := s.RecordLedger(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	set(limit(8000), 7900, 0)
	if r, err := s.Reserve(ctx, "acme", newUUID(), 200); err != nil || r != store.Exhausted {
		t.Fatalf("a reservation of $0.0002 after $0.0079 of $0.0080 spent: %v, %v; want exhausted", r, err)
	}
	// An attempt that began without a budget settles after it: counted
	// once, however often its event comes.
	late := spendRow(w, 60)
	record(late)
	record(late)
	standing(7960, 0)
	// Changed again mid-period: the same spend, neither reset nor doubled.
	set(limit(9000), 7960, 0)
	inFlight := newUUID()
	if r, err := s.Reserve(ctx, "acme", inFlight, 500); err != nil || r != store.Reserved {
		t.Fatalf("reserve 500 of the 1040 left: %v, %v", r, err)
	}
	set(limit(9500), 7960, 500)
	settled := spendRow(w, 300)
	settled.AttemptID = inFlight
	record(settled)
	standing(8260, 0)
	// Spend while the tenant had no budget counts when it has one again.
	set(nil, 8260, 0)
	record(spendRow(w, 1000))
	set(limit(20_000), 9260, 0)
	record(spendRow(w, 40))
	standing(9300, 0)
}

// Ledger rows settled while budgets are set and changed, from many
// workers at once, are each counted once: the period ends holding exactly
// what the ledger recorded.
func TestBudgetSetWhileTheLedgerSettlesCountsEachAttemptOnce(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	w := insert(t, ctx, s, newWork("acme", "octo/budget#2", "r1"))
	const workers, rows = 6, 30
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			for j := range rows {
				var errs []error
				if i%2 == 0 {
					_, _, err := s.RecordLedger(ctx, spendRow(w, int64(1+j)))
					errs = append(errs, err)
				} else {
					for _, r := range s.RecordLedgerBatch(ctx, []store.LedgerRow{spendRow(w, int64(1+j)), spendRow(w, 1)}) {
						errs = append(errs, r.Err)
					}
				}
				if err := errors.Join(errs...); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for i := range 20 {
			limit := int64(1_000_000 + i)
			if _, err := s.SetBudgetCounted(ctx, "acme", &limit, "month"); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Wait()
	var ledger int64
	if err := store.Pool(s).QueryRow(ctx, `SELECT sum(cost_micros) FROM ledger WHERE tenant_id = 'acme'`).Scan(&ledger); err != nil {
		t.Fatal(err)
	}
	b, err := s.CurrentBudget(ctx, "acme")
	if err != nil || b.SpentMicros != ledger || b.LimitMicros != 1_000_019 {
		t.Fatalf("period %+v (%v); want the ledger's %d spent under the last limit", b, err, ledger)
	}
}
