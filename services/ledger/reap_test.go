package ledger

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
)

// The reaper makes the ledger whole from what the store holds: an attempt
// whose worker died after claiming (and so after the provider billed the
// call) becomes an estimated lease_expired row charged what the store says,
// replaced by the real report if that still arrives; an ATTEMPT event the
// broker lost is read back and priced; an event that does not decode is
// passed over; a reservation whose attempt was never claimed is released;
// a live attempt is left alone. Nothing is reaped twice.
func TestReaperMakesTheLedgerWhole(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, m, log := newMemLedger(t, Config{Region: "us", ReapEvery: -1, ReapGrace: time.Second})
	m.Tenant("acme", "us", "tok-acme")
	dead, lost, live, orphan, garbled := attemptN(1), attemptN(2), attemptN(3), attemptN(4), attemptN(5)
	const reserve = 5000
	// A worker that died during its call: its lease lapsed long ago.
	m.Reserve("acme", dead, reserve, 2*time.Minute)
	m.Claim(claimFact{Tenant: "acme", Work: "w_dead", Attempt: dead, Age: 2 * time.Minute, Lease: -time.Minute, Estimate: 700})
	// A worker that finished and published; the broker then lost the event.
	m.Claim(claimFact{Tenant: "acme", Work: "w_lost", Attempt: lost, Age: 2 * time.Minute, Lease: time.Minute})
	ev := event.Attempt{AttemptID: lost, WorkID: "w_lost", TenantID: "acme", Region: "us", Number: 1,
		Model: "assay-sim-1", Outcome: outcome.AttemptOK, UpstreamAttempts: 1, InputUnits: 1000, OutputUnits: 100, At: time.Now().UTC()}
	payload, _ := json.Marshal(ev)
	m.Report(lost, outcome.AttemptOK, eventFact{Stream: event.KindAttempt, Payload: payload, Written: 2 * time.Minute, Published: 2 * time.Minute})
	// A worker still in its call, lease fresh.
	m.Claim(claimFact{Tenant: "acme", Work: "w_live", Attempt: live, Age: 2 * time.Minute, Lease: time.Minute})
	// A worker that reserved and died before it claimed.
	m.Reserve("acme", orphan, reserve, time.Hour)
	// An event that does not decode.
	m.Claim(claimFact{Tenant: "acme", Work: "w_garbled", Attempt: garbled, Age: 2 * time.Minute, Lease: time.Minute})
	m.Report(garbled, outcome.AttemptOK, eventFact{Stream: event.KindAttempt, Payload: []byte("{"), Written: 2 * time.Minute, Published: 2 * time.Minute})

	n, err := s.Reap(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != (Reaped{Events: 1, Dead: 1, Reservations: 1}) {
		t.Fatalf("reaped %+v, want one event, one dead attempt, one reservation", n)
	}
	if r, ok := m.row(dead); !ok || !r.Estimated || r.Outcome != outcome.AttemptLeaseExpired || r.CostMicros != reserve ||
		r.Model != "unknown" || r.WorkID != "w_dead" || r.UpstreamAttempts != 1 || !startedAbout(r.OccurredAt, 2*time.Minute) {
		t.Errorf("dead attempt's row %+v (%v), want an estimated lease_expired row charged its reservation when it started", r, ok)
	}
	if r, ok := m.row(lost); !ok || r.Estimated || r.InputUnits != 1000 || r.CostMicros != s.cfg.Prices.CostMicros("assay-sim-1", 1000, 100) {
		t.Errorf("lost event's row %+v (%v), want it read back and priced", r, ok)
	}
	for _, id := range []string{live, garbled} {
		if r, ok := m.row(id); ok {
			t.Errorf("row %+v, want none", r)
		}
	}
	for key, want := range map[string][]string{dead: {"recorded"}, lost: {"reaped", "recorded"}, "reservations": {"released"}} {
		if got := log.OutcomesOf(t, key); !slices.Equal(got, want) {
			t.Errorf("decisions for %s: %q, want %q", key, got, want)
		}
	}

	// Nothing is reaped twice.
	if n, err := s.Reap(ctx); err != nil || n != (Reaped{}) {
		t.Fatalf("second pass reaped %+v (%v), want nothing", n, err)
	}

	// The dead worker was only slow: its own report replaces the estimate,
	// once.
	late := event.Attempt{AttemptID: dead, WorkID: "w_dead", TenantID: "acme", Region: "us", Number: 1,
		Model: "assay-sim-1", Outcome: outcome.AttemptStaleLease, UpstreamAttempts: 1, InputUnits: 800, OutputUnits: 80, At: time.Now().UTC()}
	for range 2 {
		if err := s.Append(ctx, late); err != nil {
			t.Fatal(err)
		}
	}
	if r, ok := m.row(dead); !ok || r.Estimated || r.Outcome != outcome.AttemptStaleLease ||
		r.CostMicros != s.cfg.Prices.CostMicros("assay-sim-1", 800, 80) {
		t.Errorf("row after the late report %+v, want the report", r)
	}
	if got, want := log.OutcomesOf(t, dead), []string{"recorded", "replaced", "duplicate"}; !slices.Equal(got, want) {
		t.Errorf("decisions for the dead attempt: %q, want %q", got, want)
	}
	if got := m.rows(); got != 2 {
		t.Errorf("ledger rows = %d, want 2", got)
	}
}

// A pass that cannot read the store fails, for the ticker to log and run
// again.
func TestReapFailsWhileTheStoreIsDown(t *testing.T) {
	t.Parallel()
	s, m, _ := newMemLedger(t, Config{Region: "us", ReapEvery: -1})
	m.Down()
	if n, err := s.Reap(t.Context()); err == nil || n != (Reaped{}) {
		t.Fatalf("reaped %+v (%v), want an error", n, err)
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
	if c.GroupWait != 0 {
		t.Fatalf("GroupWait %v without ASSAY_LEDGER_GROUP_WAIT, want the default (0 here)", c.GroupWait)
	}
	for v, want := range map[string]time.Duration{"5ms": 5 * time.Millisecond, "0s": -1} {
		env["ASSAY_LEDGER_GROUP_WAIT"] = v
		if err := c.FromEnv(func(k string) string { return env[k] }); err != nil || c.GroupWait != want {
			t.Fatalf("ASSAY_LEDGER_GROUP_WAIT=%s: GroupWait %v (%v), want %v", v, c.GroupWait, err, want)
		}
	}
	env["ASSAY_LEDGER_GROUP_WAIT"] = "2s"
	if err := c.FromEnv(func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), "ASSAY_LEDGER_GROUP_WAIT") {
		t.Fatalf("error %v does not name ASSAY_LEDGER_GROUP_WAIT", err)
	}
	delete(env, "ASSAY_LEDGER_GROUP_WAIT")
	env["ASSAY_LEDGER_REAP_GRACE"] = "soon"
	if err := c.FromEnv(func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), "ASSAY_LEDGER_REAP_GRACE") {
		t.Fatalf("error %v does not name ASSAY_LEDGER_REAP_GRACE", err)
	}
}
