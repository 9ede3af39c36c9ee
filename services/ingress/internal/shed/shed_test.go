package shed

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"assay.dev/pkg/admission"
	"assay.dev/pkg/event"
)

func withDown(p admission.Prediction, d time.Duration) admission.Prediction {
	p.Downstream = d
	return p
}

func TestShedDecision(t *testing.T) {
	t.Parallel()
	known := func(wait time.Duration) admission.Prediction {
		return admission.Prediction{Known: true, Wait: wait, Rate: 100, Share: 1, Waiting: 100 * wait.Seconds()}
	}
	cases := []struct {
		name      string
		p         admission.Prediction
		remaining time.Duration
		refused   bool
		retry     time.Duration
	}{
		{"nothing known: admitted", admission.Prediction{}, time.Minute, false, 0},
		{"within the queue wait", known(900 * time.Millisecond), time.Minute, false, 0},
		{"over the queue wait: retry when it drained", known(4 * time.Second), time.Minute, true, 3 * time.Second},
		{"just over: retry after at least a second", known(1100 * time.Millisecond), time.Minute, true, time.Second},
		{"a short deadline bounds it further", known(500 * time.Millisecond), 900 * time.Millisecond, true, time.Second},
		{"deadline already too short for a call", known(10 * time.Millisecond), 100 * time.Millisecond, true, time.Second},
		{"a stalled cell's wait: retry no later than the deadline", known(74 * time.Hour), 10 * time.Minute, true, 10 * time.Minute},
		{"answers waiting for the committer do not delay the start", withDown(known(100*time.Millisecond), 2*time.Second), 8 * time.Second, false, 0},
		{"but a result they would push past the deadline is refused", withDown(known(100*time.Millisecond), 9*time.Second), 8 * time.Second, true, 1600 * time.Millisecond},
	}
	for _, c := range cases {
		r := Decide(c.p, time.Second, c.remaining, 500*time.Millisecond, time.Hour)
		if r != nil && strings.Contains(c.name, "past the deadline") && !strings.Contains(r.Reason, "after its deadline") {
			t.Fatalf("%s: %q does not say the result would be late", c.name, r.Reason)
		}
		if (r != nil) != c.refused {
			t.Fatalf("%s: refused %v, want %v", c.name, r != nil, c.refused)
		}
		if r != nil && (r.Retry != c.retry || r.Code != "over_capacity") {
			t.Fatalf("%s: %+v, want over_capacity retry %v", c.name, r, c.retry)
		}
	}
}

// Settings: a bad one names itself.
func TestShedFromEnv(t *testing.T) {
	t.Parallel()
	for name, v := range map[string]string{"ASSAY_SHED": "maybe", "ASSAY_SHED_QUEUE_WAIT": "soon",
		"ASSAY_BATCH_BACKLOG": "-1", "ASSAY_INGRESS_RATE": "global"} {
		var c Config
		err := c.FromEnv(func(k string) string {
			if k == name {
				return v
			}
			return ""
		})
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Fatalf("%s=%s: %v, want an error naming it", name, v, err)
		}
	}
}

// The two rules of capacity admission, over random cells: a lane with
// nothing waiting in it (its work running, parked out of the way for a
// Retry-After or a backoff, or waiting for the committer) refuses no one,
// whatever earlier work waited; and no refusal's Retry-After is longer
// than the cap or than the work could wait.
func TestShedRulesHoldOverRandomCells(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 11))
	now := time.Unix(1_800_000_000, 0)
	tenants := []string{"acme", "globex", "initech", "umbrella"}
	refusals, idle := 0, 0
	for range 20000 {
		// Each message of the lane is in one state; a classifier reports
		// what it holds and what its durable has not delivered, and
		// nothing of what it parked or runs but the count of calls.
		var reports []admission.CapacityReport
		undelivered := rng.IntN(3) * rng.IntN(200)
		waiting := undelivered
		for i := range 1 + rng.IntN(3) {
			l := admission.LaneLoad{Undelivered: undelivered, Tenants: map[string]admission.TenantLoad{}}
			for _, tn := range tenants {
				// Parked work is released with a delay: neither held nor
				// undelivered, so it is in no report.
				held := rng.IntN(2) * rng.IntN(40)
				l.Running += rng.IntN(8)
				if held > 0 || rng.IntN(2) == 0 {
					l.Tenants[tn] = admission.TenantLoad{Held: held, Weight: 1 + rng.IntN(3),
						MinWait: time.Duration(rng.IntN(20_000)) * time.Millisecond}
				}
				l.Held += held
				waiting += held
			}
			l.MinWait = time.Duration(rng.IntN(20_000)) * time.Millisecond
			rate := float64(rng.IntN(3000)) / 10
			reports = append(reports, admission.CapacityReport{Instance: fmt.Sprint(i), At: now, Every: time.Second,
				Rate: rate, Potential: rate * 2, Limit: 8, InFlight: rng.IntN(9), Latency: time.Duration(rng.IntN(2000)) * time.Millisecond,
				Downstream: rng.IntN(500), Lanes: map[string]admission.LaneLoad{event.Interactive: l}})
		}
		tenant := tenants[rng.IntN(len(tenants))]
		p := admission.Combine(reports, now).Predict(event.Interactive, tenant, 1, 0, 0, 0)
		remaining := time.Duration(1+rng.IntN(600)) * time.Second
		retryMax := time.Duration(1+rng.IntN(120)) * time.Second
		r := Decide(p, 0, remaining, time.Duration(rng.IntN(3000))*time.Millisecond, retryMax)
		if waiting == 0 {
			idle++
			if r != nil {
				t.Fatalf("a lane with nothing waiting refused: %+v (prediction %+v)", r, p)
			}
		}
		if r == nil {
			continue
		}
		refusals++
		if r.Retry > retryMax || r.Retry > max(remaining, time.Second) || r.Retry < time.Second {
			t.Fatalf("Retry-After %v with a cap of %v and %v left", r.Retry, retryMax, remaining)
		}
		if strings.Contains(r.Reason, "tenant") || strings.Contains(r.Reason, "waiting in the lane") {
			t.Fatalf("a refusal tells of other work: %q", r.Reason)
		}
	}
	if refusals == 0 || idle == 0 {
		t.Fatalf("the mixes never refused (%d) or never had an idle lane (%d): they test nothing", refusals, idle)
	}
	t.Logf("%d refusals, %d idle lanes among 20000 cells", refusals, idle)
}
