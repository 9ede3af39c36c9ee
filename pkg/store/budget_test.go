package store_test

import (
	"context"
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
