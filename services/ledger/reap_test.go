package ledger

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"assay.dev/pkg/event"
	"assay.dev/pkg/store"
)

// The reaper makes the ledger whole from Postgres: an attempt whose worker
// died after claiming (and so after the provider billed the call) becomes
// an estimated row charged its reservation, replaced by the real report if
// that still arrives; an ATTEMPT event the broker lost is read back from the
// outbox; a reservation whose attempt was never recorded is released; a
// live attempt is left alone.
func TestReaperMakesTheLedgerWhole(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, st, db := newTestLedger(t, Config{Region: "us", ReapEvery: -1, ReapGrace: time.Second}, "acme")
	budget := int64(10_000_000)
	if err := st.SetBudget(ctx, "acme", &budget, "month"); err != nil {
		t.Fatal(err)
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := db.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	count := func(sql string, args ...any) int64 {
		t.Helper()
		var n int64
		if err := db.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return n
	}
	// claim reserves and claims one attempt at a new work item, the way the
	// classifier does before its model call.
	claim := func(workID, attemptID string, reserve int64) {
		t.Helper()
		if _, _, err := st.InsertWork(ctx, &store.Work{ID: workID, TenantID: "acme", Region: "us", Contract: "moderation",
			SchemaVersion: "1", TaxonomyVersion: "1", SourceID: "t/" + workID, Revision: "r1", Lane: "batch",
			Input: `{"text":"x"}`, Digest: "sha256:00", DeadlineAt: time.Now().Add(time.Hour)},
			func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil }); err != nil {
			t.Fatal(err)
		}
		if res, err := st.Reserve(ctx, "acme", attemptID, reserve); err != nil || res != store.Reserved {
			t.Fatalf("reserve: %v %v", res, err)
		}
		if _, ok, err := st.Claim(ctx, workID, attemptID, "00000000-0000-4000-8000-"+attemptID[24:], time.Minute, 0); err != nil || !ok {
			t.Fatalf("claim: %v %v", ok, err)
		}
	}
	const (
		dead    = "00000000-0000-4000-8000-0000000000d1"
		lost    = "00000000-0000-4000-8000-0000000000e1"
		live    = "00000000-0000-4000-8000-0000000000f1"
		orphan  = "00000000-0000-4000-8000-0000000000a1"
		reserve = 5000
	)
	// A worker that died during its call: its lease lapsed long ago.
	claim("w_dead", dead, reserve)
	exec(`UPDATE attempts SET started_at = now() - interval '2 minutes' WHERE id = $1`, dead)
	exec(`UPDATE work SET lease_expires_at = now() - interval '1 minute' WHERE id = 'w_dead'`)
	// A worker that finished and published; the broker then lost the event.
	claim("w_lost", lost, reserve)
	ev := event.Attempt{AttemptID: lost, WorkID: "w_lost", TenantID: "acme", Region: "us", Number: 1,
		Model: "assay-sim-1", Outcome: "ok", UpstreamAttempts: 1, InputUnits: 1000, OutputUnits: 100, At: time.Now().UTC()}
	payload, _ := json.Marshal(ev)
	if _, err := st.RecordAttempt(ctx, store.AttemptRecord{AttemptID: lost, WorkID: "w_lost", Outcome: "ok", Raw: []byte("{}"),
		Outbox: []store.OutboxMsg{{Stream: event.KindAttempt, Subject: (event.Names{Cell: "us"}).Attempt("acme"),
			MsgID: lost, Payload: payload}}}); err != nil {
		t.Fatal(err)
	}
	exec(`UPDATE outbox SET published_at = now() - interval '2 minutes' WHERE msg_id = $1`, lost)
	// A worker still in its call, lease fresh.
	claim("w_live", live, reserve)
	exec(`UPDATE attempts SET started_at = now() - interval '2 minutes' WHERE id = $1`, live)
	// A worker that reserved and died before it claimed.
	if _, err := st.Reserve(ctx, "acme", orphan, reserve); err != nil {
		t.Fatal(err)
	}
	exec(`UPDATE budget_reservations SET created_at = now() - interval '1 hour' WHERE attempt_id = $1`, orphan)

	n, err := s.Reap(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.Events != 1 || n.Dead != 1 || n.Reservations != 1 {
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
	lostCost := s.cfg.Prices.CostMicros("assay-sim-1", 1000, 100)
	b, err := st.CurrentBudget(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if b.ReservedMicros != reserve || b.SpentMicros != reserve+lostCost {
		t.Fatalf("budget reserved %d spent %d, want %d (the live attempt) and %d", b.ReservedMicros, b.SpentMicros, reserve, reserve+lostCost)
	}

	// Nothing is reaped twice.
	if n, err := s.Reap(ctx); err != nil || n != (Reaped{}) {
		t.Fatalf("second pass reaped %+v (%v), want nothing", n, err)
	}

	// The dead worker was only slow: its own report replaces the estimate,
	// one row still, and the budget is corrected to what it really cost.
	late := event.Attempt{AttemptID: dead, WorkID: "w_dead", TenantID: "acme", Region: "us", Number: 1,
		Model: "assay-sim-1", Outcome: "stale_lease", UpstreamAttempts: 1, InputUnits: 800, OutputUnits: 80, At: time.Now().UTC()}
	for range 2 {
		if err := s.Append(ctx, late); err != nil {
			t.Fatal(err)
		}
	}
	lateCost := s.cfg.Prices.CostMicros("assay-sim-1", 800, 80)
	if got := count(`SELECT count(*) FROM ledger WHERE attempt_id = $1 AND NOT estimated AND outcome = 'stale_lease'
		AND cost_micros = $2`, dead, lateCost); got != 1 {
		t.Error("the late report did not replace the estimate")
	}
	if got := count(`SELECT count(*) FROM ledger`); got != 2 {
		t.Errorf("ledger rows = %d, want 2", got)
	}
	if b, err = st.CurrentBudget(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	if b.SpentMicros != lateCost+lostCost {
		t.Errorf("spent %d after the late report, want %d", b.SpentMicros, lateCost+lostCost)
	}
}

func TestConfigFromEnv(t *testing.T) {
	t.Parallel()
	env := map[string]string{"ASSAY_ACK_WAIT": "5s", "ASSAY_LEDGER_REAP_EVERY": "1s", "ASSAY_LEDGER_REAP_GRACE": "2s"}
	var c Config
	if err := c.FromEnv(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if c.AckWait != 5*time.Second || c.ReapEvery != time.Second || c.ReapGrace != 2*time.Second {
		t.Fatalf("config %+v", c)
	}
	env["ASSAY_LEDGER_REAP_GRACE"] = "soon"
	if err := c.FromEnv(func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), "ASSAY_LEDGER_REAP_GRACE") {
		t.Fatalf("error %v does not name ASSAY_LEDGER_REAP_GRACE", err)
	}
}
