package ledger

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/usage"
)

// The ledger started on Postgres and JetStream: an ATTEMPT event delivered
// twice is one row, which settles its reservation; a reaper pass records
// the event the broker lost and the attempt whose worker died, releases
// the reservation no attempt claimed and leaves the live attempt alone;
// the dead worker's late report replaces its estimate; and the budget
// follows every row.
func TestLedgerOnPostgresAndJetStream(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st, db := newTestDatabase(t)
	f := &pgFacts{t: t, st: st, db: db, claims: map[string]claimFact{}}
	f.Tenant("acme", "us", "tok-acme")
	js := testenv.JetStream(t)
	names := event.Names{Cell: "us"}
	if _, err := event.EnsureStream(ctx, js, nil, names, event.KindAttempt, event.StreamSettings{}); err != nil {
		t.Fatal(err)
	}
	s := newLedger(t, Config{Region: "us", ReapEvery: -1, ReapGrace: time.Second}, Deps{Store: st, JS: js})
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop(context.Background()) })

	count := func(sql string, args ...any) int64 {
		t.Helper()
		var n int64
		if err := db.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return n
	}
	attempt := func(id, work string, result string, in, out int64) event.Attempt {
		return event.Attempt{AttemptID: id, WorkID: work, TenantID: "acme", Region: "us", Number: 1, Model: "assay-sim-1",
			Outcome: result, UpstreamAttempts: 1, InputUnits: in, OutputUnits: out, At: time.Now().UTC()}
	}
	// deliver publishes ev twice, as a redelivery would bring it, and
	// waits until the ledger has settled every message on the stream.
	var published uint64
	deliver := func(ev event.Attempt) {
		t.Helper()
		payload, _ := json.Marshal(ev)
		for range 2 {
			if _, err := js.Publish(ctx, names.Attempt(ev.TenantID), payload); err != nil {
				t.Fatal(err)
			}
			published++
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			c, err := js.Consumer(ctx, names.Stream(event.KindAttempt), Consumer(names))
			if err == nil {
				if info, err := c.Info(ctx); err == nil && info.AckFloor.Stream >= published && info.NumAckPending == 0 {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("the ledger did not settle %d messages within 30s", published)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	budget := func() store.Budget {
		t.Helper()
		b, err := st.CurrentBudget(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	const reserve = 5000
	fresh, dead, lost, live, orphan := attemptN(1), attemptN(2), attemptN(3), attemptN(4), attemptN(5)
	price := s.cfg.Prices.CostMicros

	// A worker reports, and the broker delivers its event twice.
	f.Reserve("acme", fresh, reserve, 0)
	f.Claim(claimFact{Tenant: "acme", Work: "w_fresh", Attempt: fresh, Lease: time.Minute})
	deliver(attempt(fresh, "w_fresh", outcome.AttemptOK, 2000, 200))
	if got := count(`SELECT count(*) FROM ledger WHERE attempt_id = $1 AND cost_micros = $2`, fresh, price("assay-sim-1", 2000, 200)); got != 1 {
		t.Fatalf("%d rows of the delivered attempt at its price, want 1", got)
	}
	freshCost := price("assay-sim-1", 2000, 200)
	if b := budget(); b.ReservedMicros != 0 || b.SpentMicros != freshCost {
		t.Fatalf("budget reserved %d spent %d, want 0 and %d", b.ReservedMicros, b.SpentMicros, freshCost)
	}

	// A worker that died during its call: its lease lapsed long ago.
	f.Reserve("acme", dead, reserve, 2*time.Minute)
	f.Claim(claimFact{Tenant: "acme", Work: "w_dead", Attempt: dead, Age: 2 * time.Minute, Lease: -time.Minute})
	// A worker that finished and published; the broker then lost the event.
	f.Reserve("acme", lost, reserve, 2*time.Minute)
	f.Claim(claimFact{Tenant: "acme", Work: "w_lost", Attempt: lost, Age: 2 * time.Minute, Lease: time.Minute})
	payload, _ := json.Marshal(attempt(lost, "w_lost", outcome.AttemptOK, 1000, 100))
	f.Report(lost, outcome.AttemptOK, eventFact{Stream: event.KindAttempt, Payload: payload, Written: 2 * time.Minute, Published: 2 * time.Minute})
	// A worker still in its call, lease fresh.
	f.Reserve("acme", live, reserve, 2*time.Minute)
	f.Claim(claimFact{Tenant: "acme", Work: "w_live", Attempt: live, Age: 2 * time.Minute, Lease: time.Minute})
	// A worker that reserved and died before it claimed.
	f.Reserve("acme", orphan, reserve, time.Hour)

	n, err := s.Reap(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != (Reaped{Events: 1, Dead: 1, Reservations: 1}) {
		t.Fatalf("reaped %+v, want one event, one dead attempt, one reservation", n)
	}
	if got := count(`SELECT count(*) FROM ledger WHERE attempt_id = $1 AND estimated AND outcome = 'lease_expired'
		AND cost_micros = $2`, dead, reserve); got != 1 {
		t.Error("the dead attempt is not an estimated lease_expired row charged its reservation")
	}
	if got := count(`SELECT count(*) FROM attempts WHERE id = $1 AND outcome = 'lease_expired'`, dead); got != 1 {
		t.Error("the dead attempt still looks like it is running")
	}
	if got := count(`SELECT count(*) FROM ledger WHERE attempt_id = $1 AND NOT estimated AND input_units = 1000`, lost); got != 1 {
		t.Error("the lost event was not read back from the outbox")
	}
	if got := count(`SELECT count(*) FROM ledger WHERE attempt_id = $1`, live); got != 0 {
		t.Error("a live attempt was reaped")
	}
	lostCost := price("assay-sim-1", 1000, 100)
	if b := budget(); b.ReservedMicros != reserve || b.SpentMicros != freshCost+reserve+lostCost {
		t.Fatalf("budget reserved %d spent %d, want %d (the live attempt) and %d", b.ReservedMicros, b.SpentMicros, reserve, freshCost+reserve+lostCost)
	}
	if n, err := s.Reap(ctx); err != nil || n != (Reaped{}) {
		t.Fatalf("second pass reaped %+v (%v), want nothing", n, err)
	}

	// The dead worker was only slow: its own report, delivered twice,
	// replaces the estimate, and the budget is corrected to what it cost.
	deliver(attempt(dead, "w_dead", outcome.AttemptStaleLease, 800, 80))
	lateCost := price("assay-sim-1", 800, 80)
	if got := count(`SELECT count(*) FROM ledger WHERE attempt_id = $1 AND NOT estimated AND outcome = 'stale_lease'
		AND cost_micros = $2`, dead, lateCost); got != 1 {
		t.Error("the late report did not replace the estimate")
	}
	if got := count(`SELECT count(*) FROM ledger`); got != 3 {
		t.Errorf("ledger rows = %d, want 3", got)
	}
	if b := budget(); b.SpentMicros != freshCost+lostCost+lateCost {
		t.Errorf("spent %d after the late report, want %d", b.SpentMicros, freshCost+lostCost+lateCost)
	}

	// The tenant reads the three rows back.
	rec := getUsage(s, "tok-acme")
	var rep usage.Report
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &rep) != nil || rep.Calls != 3 ||
		rep.CostMicros != freshCost+lostCost+lateCost || rep.EstimatedCalls != 0 {
		t.Errorf("usage: HTTP %d %s", rec.Code, rec.Body)
	}
}
