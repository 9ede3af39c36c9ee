package admission

import (
	"testing"
	"time"
)

func TestPredict(t *testing.T) {
	now := time.Unix(1000, 0)
	report := func(rate float64, pending int, held map[string]TenantLoad) CapacityReport {
		n := 0
		for _, tl := range held {
			n += tl.Held
		}
		return CapacityReport{Instance: "a", At: now, Every: time.Second, Rate: rate, Potential: rate, Limit: 10, InFlight: 10,
			Lanes: map[string]LaneLoad{Interactive: {Undelivered: pending, Held: n, Tenants: held}}}
	}
	cases := []struct {
		name    string
		reports []CapacityReport
		tenant  string
		age     time.Duration
		extra   float64
		known   bool
		wait    time.Duration
	}{
		{"nothing reported: unknown", nil, "acme", 0, 0, false, 0},
		{"stale report: unknown", []CapacityReport{func() CapacityReport { r := report(100, 0, nil); r.At = now.Add(-time.Minute); return r }()},
			"acme", 0, 0, false, 0},
		{"one tenant, 100 waiting at 100/s: one second", []CapacityReport{report(100, 50, map[string]TenantLoad{"acme": {Held: 50, Weight: 1}})},
			"acme", 0, 0, true, time.Second},
		{"half a second later, half is served", []CapacityReport{report(100, 50, map[string]TenantLoad{"acme": {Held: 50, Weight: 1}})},
			"acme", 500 * time.Millisecond, 0, true, 500 * time.Millisecond},
		{"what this ingress admitted since counts", []CapacityReport{report(100, 0, map[string]TenantLoad{"acme": {Held: 50, Weight: 1}})},
			"acme", 0, 50, true, time.Second},
		{"a quiet tenant beside a noisy one waits for its own share", []CapacityReport{report(100, 0, map[string]TenantLoad{"noisy": {Held: 199, Weight: 1}})},
			"quiet", 0, 0, true, 0},
		{"the noisy one waits for the lane", []CapacityReport{report(100, 0, map[string]TenantLoad{"noisy": {Held: 200, Weight: 1}})},
			"noisy", 0, 0, true, 2 * time.Second},
		{"two instances add their rates and their holds", []CapacityReport{report(50, 0, map[string]TenantLoad{"acme": {Held: 50, Weight: 1}}),
			func() CapacityReport {
				r := report(50, 0, map[string]TenantLoad{"acme": {Held: 50, Weight: 1}})
				r.Instance = "b"
				return r
			}()},
			"acme", 0, 0, true, time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := Combine(c.reports, now).Predict(Interactive, c.tenant, 1, c.age, c.extra, c.extra)
			if p.Known != c.known {
				t.Fatalf("known %v, want %v (%+v)", p.Known, c.known, p)
			}
			if d := p.Wait - c.wait; d > time.Millisecond || d < -time.Millisecond {
				t.Fatalf("wait %v, want %v (%+v)", p.Wait, c.wait, p)
			}
		})
	}
}

// Unsaturated, the cell is counted on for what its limit could serve, so an
// idle cell whose measured rate is low still admits.
func TestServiceRateIdle(t *testing.T) {
	now := time.Unix(1000, 0)
	c := Combine([]CapacityReport{{At: now, Every: time.Second, Rate: 0.5, Potential: 80, Limit: 8, InFlight: 1}}, now)
	if r := c.ServiceRate(); r != 80 {
		t.Fatalf("idle service rate %v, want the potential 80", r)
	}
	c = Combine([]CapacityReport{{At: now, Every: time.Second, Rate: 60, Potential: 80, Limit: 8, InFlight: 8,
		Lanes: map[string]LaneLoad{Interactive: {Held: 3, Running: 8}}}}, now)
	if r := c.ServiceRate(); r != 60 {
		t.Fatalf("saturated service rate %v, want the measured 60", r)
	}
	// At its limit with nothing waiting (a limit shrunk to one call by a
	// provider's errors, that call in flight), an idle cell served only
	// what came: that is not what it can serve.
	c = Combine([]CapacityReport{{At: now, Every: time.Second, Rate: 0.27, Potential: 3000, Limit: 1, InFlight: 1,
		Lanes: map[string]LaneLoad{Interactive: {Running: 1}}}}, now)
	if r := c.ServiceRate(); r != 3000 {
		t.Fatalf("at its limit, nothing waiting: service rate %v, want the potential 3000", r)
	}
	if p := c.Predict(Interactive, "acme", 1, 0, 1, 1); p.Wait > 10*time.Millisecond {
		t.Fatalf("one more item on an idle cell at a limit of one: %+v", p)
	}
}

// What waits is what the durable has not delivered (shared: every
// instance reports the same) and what each instance holds for a turn and
// a permit; what runs and what is parked is not waiting.
func TestCombineCountsUndeliveredAndHeld(t *testing.T) {
	now := time.Unix(1000, 0)
	rs := []CapacityReport{
		{Instance: "a", At: now, Every: time.Second, Lanes: map[string]LaneLoad{Interactive: {Undelivered: 30, Held: 5, Running: 8}}},
		{Instance: "b", At: now, Every: time.Second, Lanes: map[string]LaneLoad{Interactive: {Undelivered: 30, Held: 3, Running: 2}}},
	}
	if w := Combine(rs, now).Waiting[Interactive]; w != 38 {
		t.Fatalf("waiting %v, want 30 undelivered and 8 held", w)
	}
}

// With nothing waiting in the lane new work starts at once: the observed
// waits of earlier work and the answers waiting for the committer do not
// make an idle lane's prediction.
func TestPredictNothingWaiting(t *testing.T) {
	now := time.Unix(1000, 0)
	r := CapacityReport{At: now, Every: time.Second, Rate: 2000, Limit: 10, InFlight: 10, Downstream: 500,
		Lanes: map[string]LaneLoad{Interactive: {Running: 10, MinWait: 6 * time.Second,
			Tenants: map[string]TenantLoad{"acme": {MinWait: 6 * time.Second}}}}}
	if p := Combine([]CapacityReport{r}, now).Predict(Interactive, "acme", 1, 0, 0, 0); !p.Known || p.Wait != 0 {
		t.Fatalf("idle lane: %+v, want a known wait of 0", p)
	}
}

// What waited when the reports were made and what was admitted since
// take the slots the reports saw free before any of it counts as
// waiting: the last item of an idle cell, held a moment or done before the
// next report, is no queue for the one after it.
func TestPredictTakesFreeSlotsFirst(t *testing.T) {
	now := time.Unix(1000, 0)
	r := CapacityReport{At: now, Every: time.Second, Rate: 0.3, Potential: 40, Limit: 4, InFlight: 1,
		Lanes: map[string]LaneLoad{Interactive: {Running: 1}}}
	c := Combine([]CapacityReport{r}, now)
	for extra, want := range map[float64]float64{1: 0, 3: 0, 5: 2} {
		p := c.Predict(Interactive, "acme", 1, 0, extra, extra)
		if p.Waiting != want || (want == 0) != (p.Wait == 0) {
			t.Errorf("%v admitted since, 3 slots free: %+v, want %v waiting", extra, p, want)
		}
	}
	// One item held for its turn beside free slots: not a queue, and not
	// a saturated cell whose rate is what an idle hour offered it.
	r.Lanes = map[string]LaneLoad{Interactive: {Held: 1, Running: 1, Tenants: map[string]TenantLoad{"acme": {Held: 1}}}}
	c = Combine([]CapacityReport{r}, now)
	if p := c.Predict(Interactive, "acme", 1, 0, 0, 0); c.Saturated || p.Waiting != 0 || p.Wait != 0 {
		t.Errorf("one held beside 3 free slots: saturated %v, %+v; want nothing waiting", c.Saturated, p)
	}
	// At its limit, the cell has no slot for anything: all of it waits.
	r.InFlight, r.Lanes = 4, map[string]LaneLoad{Interactive: {Undelivered: 2, Running: 4}}
	if p := Combine([]CapacityReport{r}, now).Predict(Interactive, "acme", 1, 0, 1, 1); p.Waiting != 3 || p.Wait == 0 {
		t.Errorf("behind 2 waiting, no slot free: %+v, want 3 waiting", p)
	}
}

// A standing queue the counts do not see (an outbox that lags) shows in
// the waits work really had: the tenant's own, else the lane's shortest.
func TestPredictObservedWait(t *testing.T) {
	now := time.Unix(1000, 0)
	r := CapacityReport{At: now, Every: time.Second, Rate: 100, Limit: 10, InFlight: 10,
		Lanes: map[string]LaneLoad{Interactive: {Undelivered: 10, Running: 10, MinWait: 3 * time.Second,
			Tenants: map[string]TenantLoad{"slow": {MinWait: 5 * time.Second}, "quick": {MinWait: 3 * time.Second}}}}}
	c := Combine([]CapacityReport{r}, now)
	for tenant, want := range map[string]time.Duration{"slow": 5 * time.Second, "quick": 3 * time.Second, "new": 3 * time.Second} {
		if p := c.Predict(Interactive, tenant, 1, 0, 0, 0); p.Wait != want {
			t.Errorf("%s: predicted %v, want %v", tenant, p.Wait, want)
		}
	}
}

// Answers waiting for the committer delay every tenant's result, not its
// start.
func TestPredictDownstream(t *testing.T) {
	now := time.Unix(1000, 0)
	r := CapacityReport{At: now, Every: time.Second, Rate: 100, Limit: 10, InFlight: 10, Downstream: 200,
		Lanes: map[string]LaneLoad{Interactive: {Undelivered: 10, Running: 10}}}
	p := Combine([]CapacityReport{r}, now).Predict(Interactive, "acme", 1, 0, 0, 0)
	if (p.Downstream-2*time.Second).Abs() > time.Millisecond || p.Wait > 100*time.Millisecond {
		t.Fatalf("predicted a wait of %v and %v behind the committer, want at most 0.1s and 2s", p.Wait, p.Downstream)
	}
}
