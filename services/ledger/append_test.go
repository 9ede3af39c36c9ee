package ledger

import (
	"context"
	"slices"
	"testing"
	"time"

	"assay.dev/pkg/consumer"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/price"
	"assay.dev/pkg/store"
)

// Each ATTEMPT delivery is settled by what the store answered: recorded,
// already there or refused for good, it is done; when the store does not
// answer it is asked for again in a second. A row is priced from the
// table, a batch line at the batch price, cached input units at the
// cached-input price (an estimate's at the input price, recording none),
// and charged in full even past its reservation.
func TestHandleSettlesEachAttempt(t *testing.T) {
	t.Parallel()
	half, one, quarter, eighth := 0.5, 1.0, 0.25, 0.125
	prices := price.Prices{"*": {Input: 1, Output: 2, BatchInput: &half, BatchOutput: &one, CachedInput: &quarter,
		BatchCachedInput: &eighth}}
	details := func(cached, reasoning int64) func(ev *event.Attempt) {
		return func(ev *event.Attempt) { ev.CachedInputUnits, ev.ReasoningUnits = cached, reasoning }
	}
	attempt := attemptN(1)
	estimate := store.LedgerRow{AttemptID: attempt, TenantID: "acme", WorkID: "w1", Model: "unknown",
		Outcome: outcome.AttemptLeaseExpired, UpstreamAttempts: 1, CostMicros: 5000, Estimated: true}
	for _, c := range []struct {
		name string
		// given adds to a store that holds tenant acme and its work w1,
		// claimed by the attempt.
		given      func(m *memStore)
		edit       func(ev *event.Attempt)
		deliveries int // 1 when not set
		want       consumer.Disposition
		decisions  []string
		// row is the attempt's row, compared on its cost, estimate and
		// upstream attempts; nil: none.
		row *store.LedgerRow
	}{
		{name: "recorded", edit: func(ev *event.Attempt) { ev.UpstreamAttempts = 0 },
			want: consumer.Done(), decisions: []string{"recorded"},
			row: &store.LedgerRow{CostMicros: 1200, UpstreamAttempts: 1}},
		{name: "batch line", edit: func(ev *event.Attempt) { ev.Batch = true },
			want: consumer.Done(), decisions: []string{"recorded"},
			row: &store.LedgerRow{CostMicros: 600, UpstreamAttempts: 2}},
		{name: "estimated call", edit: func(ev *event.Attempt) { ev.Estimated = true },
			want: consumer.Done(), decisions: []string{"recorded"},
			row: &store.LedgerRow{CostMicros: 1200, UpstreamAttempts: 2, Estimated: true}},
		{name: "cached input", edit: details(800, 40),
			want: consumer.Done(), decisions: []string{"recorded"},
			row: &store.LedgerRow{CostMicros: 200 + 200 + 200, UpstreamAttempts: 2, CachedInputUnits: 800, ReasoningUnits: 40}},
		{name: "cached batch line", edit: func(ev *event.Attempt) { details(800, 0)(ev); ev.Batch = true },
			want: consumer.Done(), decisions: []string{"recorded"},
			row: &store.LedgerRow{CostMicros: 100 + 100 + 100, UpstreamAttempts: 2, CachedInputUnits: 800}},
		{name: "details beyond the units", edit: details(5000, 500),
			want: consumer.Done(), decisions: []string{"recorded"},
			row: &store.LedgerRow{CostMicros: 250 + 200, UpstreamAttempts: 2, CachedInputUnits: 1000, ReasoningUnits: 100}},
		{name: "estimated call with details", edit: func(ev *event.Attempt) { details(800, 40)(ev); ev.Estimated = true },
			want: consumer.Done(), decisions: []string{"recorded"},
			row: &store.LedgerRow{CostMicros: 1200, UpstreamAttempts: 2, Estimated: true}},
		{name: "redelivered", deliveries: 2,
			want: consumer.Done(), decisions: []string{"recorded", "duplicate"},
			row: &store.LedgerRow{CostMicros: 1200, UpstreamAttempts: 2}},
		{name: "over its reservation", given: func(m *memStore) { m.Reserve("acme", attempt, 1000, 0) },
			want: consumer.Done(), decisions: []string{"over_reservation", "recorded"},
			row: &store.LedgerRow{CostMicros: 1200, UpstreamAttempts: 2}},
		{name: "report after the estimate", given: func(m *memStore) { m.RecordLedgerBatch(context.Background(), []store.LedgerRow{estimate}) },
			want: consumer.Done(), decisions: []string{"replaced"},
			row: &store.LedgerRow{CostMicros: 1200, UpstreamAttempts: 2}},
		{name: "another region's", edit: func(ev *event.Attempt) { ev.Region = "eu" },
			want: consumer.Done(), decisions: []string{"refused"}},
		{name: "no call of its own", edit: func(ev *event.Attempt) {
			ev.NoCall, ev.Result = true, &event.Result{AttemptID: ev.AttemptID, WorkID: ev.WorkID, TenantID: ev.TenantID,
				Region: ev.Region, LeaseToken: leaseToken(ev.AttemptID), Outcome: outcome.AttemptOK, Final: true}
		}, want: consumer.Done()},
		{name: "refused for good", edit: func(ev *event.Attempt) { ev.WorkID = "w_elsewhere" },
			want: consumer.Done(), decisions: []string{"refused"}},
		{name: "store down", given: func(m *memStore) { m.Down() },
			want: consumer.Retry(time.Second)},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s, m, log := newMemLedger(t, Config{Region: "us", Prices: prices})
			m.Tenant("acme", "us", "tok-acme")
			m.Claim(claimFact{Tenant: "acme", Work: "w1", Attempt: attempt, Lease: time.Minute})
			if c.given != nil {
				c.given(m)
			}
			ev := event.Attempt{AttemptID: attempt, WorkID: "w1", TenantID: "acme", Region: "us", Number: 1,
				Model: "assay-sim-1", Outcome: outcome.AttemptOK, UpstreamAttempts: 2, InputUnits: 1000, OutputUnits: 100,
				At: time.Now().UTC()}
			if c.edit != nil {
				c.edit(&ev)
			}
			for i := range max(c.deliveries, 1) {
				if got := s.handle(t.Context(), ev, nil); got != c.want {
					t.Errorf("delivery %d: %+v, want %+v", i, got, c.want)
				}
			}
			if got := log.OutcomesOf(t, attempt); !slices.Equal(got, c.decisions) {
				t.Errorf("decisions %q, want %q", got, c.decisions)
			}
			got, ok := m.row(attempt)
			switch {
			case c.row == nil && ok:
				t.Errorf("row %+v, want none", got)
			case c.row == nil:
			case !ok:
				t.Error("no row")
			case got.CostMicros != c.row.CostMicros || got.Estimated != c.row.Estimated || got.UpstreamAttempts != c.row.UpstreamAttempts ||
				got.CachedInputUnits != c.row.CachedInputUnits || got.ReasoningUnits != c.row.ReasoningUnits:
				t.Errorf("row %+v, want cost %d, estimated %v, %d upstream attempts, %d cached and %d reasoning units", got,
					c.row.CostMicros, c.row.Estimated, c.row.UpstreamAttempts, c.row.CachedInputUnits, c.row.ReasoningUnits)
			}
		})
	}
}
