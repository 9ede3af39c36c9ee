package admission

import (
	"math"
	"time"
)

// CapacityReport is what one classifier instance says of its cell about
// every second: how fast it serves, what its limit could serve, and what
// waits in each lane. Ingress reads the reports of every instance to
// predict how long new work would wait.
type CapacityReport struct {
	// Instance names the classifier instance.
	Instance string `json:"instance"`
	// At is when the report was made; Every is how often one is made.
	At    time.Time     `json:"at"`
	Every time.Duration `json:"every"`
	// Rate is the answers per second this instance received, averaged over
	// the last few seconds.
	Rate float64 `json:"rate"`
	// Potential is what the instance's limit could serve per second at the
	// present latency: limit / latency. Zero before the first answer.
	Potential float64 `json:"potential"`
	// Limit and InFlight are the instance's concurrency limit and the calls
	// it runs now.
	Limit    int `json:"limit"`
	InFlight int `json:"inFlight"`
	// Latency is the instance's short-term call latency.
	Latency time.Duration `json:"latency"`
	// Lanes are what waits in each lane.
	Lanes map[string]LaneLoad `json:"lanes"`
	// Downstream are the answers handed on and not yet committed (the
	// committer's durable, pending and unacknowledged): work every tenant
	// waits behind, in order, before its result counts.
	Downstream int `json:"downstream"`
}

// LaneLoad is what waits in one lane. Work parked out of the way (waiting
// out a provider's Retry-After, a backoff or a budget: its announcement
// released with a delay) is neither undelivered nor held, so it is not a
// queue in front of new work.
type LaneLoad struct {
	// Undelivered are the lane's announcements its durable has not
	// delivered yet (the durable is shared: every instance reports the
	// same).
	Undelivered int `json:"undelivered"`
	// Running are the calls this instance runs for the lane.
	Running int `json:"running"`
	// Held are the announcements this instance holds that wait for their
	// turn and a permit.
	Held int `json:"held"`
	// Tenants are, of Held, the tenants waiting, with their weight, and
	// the tenants whose work got a permit in the last period.
	Tenants map[string]TenantLoad `json:"tenants,omitempty"`
	// MinWait is the shortest queue wait (from the work's creation to its
	// permit) of the work that got a permit in the last period; zero when
	// none did. It sees every queue on the way (the outbox, the stream,
	// the hand), so a standing queue the counts miss still shows.
	MinWait time.Duration `json:"minWait,omitempty"`
}

// TenantLoad is one tenant's waiting work in a lane.
type TenantLoad struct {
	Held   int `json:"held"`
	Weight int `json:"weight"`
	// MinWait is as LaneLoad's, for the tenant's work alone.
	MinWait time.Duration `json:"minWait,omitempty"`
}

// Fresh reports whether the report still describes the cell at now: it
// is at most three periods (and at least 3 s) old.
func (r CapacityReport) Fresh(now time.Time) bool {
	return now.Sub(r.At) <= max(3*r.Every, 3*time.Second)
}

// CellLoad is the cell as the fresh reports of its instances describe it,
// with what this ingress admitted since.
type CellLoad struct {
	// Rate, Potential: summed over the instances.
	Rate, Potential float64
	// Saturated: work waits beyond the slots free, so Rate is what the
	// cell can serve, not just what it was offered. Calls at the limit
	// with nothing waiting are not: a limit shrunk by a provider's errors
	// on an idle cell, one call in flight, served only what came.
	Saturated bool
	// Latency is the slowest instance's.
	Latency time.Duration
	// Waiting by lane: not yet delivered, and held for a turn and a
	// permit by any instance.
	Waiting map[string]float64
	// Tenants by lane: waiting by tenant, with weight.
	Tenants map[string]map[string]TenantLoad
	// MinWait by lane: the shortest observed queue wait, zero if none.
	MinWait map[string]time.Duration
	// Downstream are the answers waiting to be committed.
	Downstream float64
	// Free are the call slots the instances had free when they reported
	// (their limits less their calls in flight): work admitted since then
	// takes one of them and starts at once while any is left.
	Free float64
	// Reports counts the fresh reports; zero means nothing is known.
	Reports int
}

// Combine folds the fresh reports at now into one CellLoad.
func Combine(reports []CapacityReport, now time.Time) CellLoad {
	c := CellLoad{Waiting: map[string]float64{}, Tenants: map[string]map[string]TenantLoad{}, MinWait: map[string]time.Duration{}}
	undelivered, held := map[string]int{}, map[string]int{}
	for _, r := range reports {
		if !r.Fresh(now) {
			continue
		}
		c.Reports++
		c.Rate += r.Rate
		c.Potential += r.Potential
		c.Latency = max(c.Latency, r.Latency)
		c.Downstream = max(c.Downstream, float64(r.Downstream))
		if r.Limit > r.InFlight {
			c.Free += float64(r.Limit - r.InFlight)
		}
		for lane, l := range r.Lanes {
			undelivered[lane] = max(undelivered[lane], l.Undelivered)
			held[lane] += l.Held
			c.MinWait[lane] = minPositive(c.MinWait[lane], l.MinWait)
			ts := c.Tenants[lane]
			if ts == nil {
				ts = map[string]TenantLoad{}
				c.Tenants[lane] = ts
			}
			for t, tl := range l.Tenants {
				cur := ts[t]
				cur.Held += tl.Held
				cur.Weight = max(cur.Weight, tl.Weight)
				cur.MinWait = minPositive(cur.MinWait, tl.MinWait)
				ts[t] = cur
			}
		}
	}
	// Work waiting beyond the slots free is a queue, and the cell serves
	// what it can: its rate is then what it served. Work held for a
	// moment beside free slots is not (an idle cell's rate is only what it
	// was offered).
	for lane, u := range undelivered {
		w := u + held[lane]
		c.Waiting[lane] = float64(w)
		if float64(w) > c.Free {
			c.Saturated = true
		}
	}
	for lane, h := range held {
		if _, ok := undelivered[lane]; !ok && h > 0 {
			c.Waiting[lane] = float64(h)
			if float64(h) > c.Free {
				c.Saturated = true
			}
		}
	}
	return c
}

func minPositive(a, b time.Duration) time.Duration {
	switch {
	case a <= 0:
		return b
	case b <= 0:
		return a
	}
	return min(a, b)
}

// ServiceRate is the rate the cell can be counted on to serve: what it
// served while saturated (the limit over latency overstates it when the
// time goes elsewhere, the database say), else the more of that and what
// its limit could serve. Zero means unknown.
func (c CellLoad) ServiceRate() float64 {
	if c.Saturated && c.Rate > 0 {
		return c.Rate
	}
	return max(c.Rate, c.Potential)
}

// Prediction is how long new work of one tenant in one lane is predicted to
// wait before it runs.
type Prediction struct {
	// Known is false when no fresh report says anything: admission then
	// lets the work in.
	Known bool
	// Wait is the predicted queue wait.
	Wait time.Duration
	// Rate is the service rate it was predicted from, and Share the part
	// of it the tenant is owed in the lane.
	Rate, Share float64
	// Waiting are the lane's waiting work, and Ahead the tenant's own.
	Waiting, Ahead float64
	// Downstream is how long the answers now waiting for the committer
	// take to be committed: not a wait before the work starts, but one
	// before its result counts.
	Downstream time.Duration
}

// Predict predicts the queue wait of one more item for tenant (of weight,
// 1 if unknown) in lane, age after the reports were made. Interactive work
// is served before batch, and within a lane tenants are served in turn by
// weight, so the tenant's wait is its own waiting work at its share of the
// rate, and never more than the whole lane's waiting work at the whole
// rate. extra and extraTenant are what this ingress admitted since the
// reports, not yet in them.
func (c CellLoad) Predict(lane, tenant string, weight int, age time.Duration, extra, extraTenant float64) Prediction {
	rate := c.ServiceRate()
	if c.Reports == 0 || !(rate > 0) {
		return Prediction{}
	}
	weight = max(weight, 1)
	own, active, held := 0.0, 0.0, 0.0
	for t, tl := range c.Tenants[lane] {
		if tl.Held <= 0 {
			continue
		}
		held += float64(tl.Held)
		w := float64(max(tl.Weight, 1))
		if t == tenant {
			w = float64(max(tl.Weight, weight))
			own = float64(tl.Held)
		}
		active += w
	}
	if own == 0 {
		active += float64(weight)
	}
	share := float64(weight) / active
	// Announcements not yet pulled are counted in the tenant's part as
	// its share of what is held: the tenants that crowd the window crowd
	// what stands behind it too.
	if pend := c.Waiting[lane] - held; pend > 0 && held > 0 {
		own += pend * own / held
	}
	served := rate * max(age, 0).Seconds()
	// What waited when the reports were made and what was admitted since
	// take the slots the reports saw free first: only what finds none
	// waits (an idle cell's last item, held a moment or done before the
	// next report, is not a queue).
	waiting := math.Max(0, math.Max(0, c.Waiting[lane]-served)+extra-c.Free)
	ahead := math.Min(math.Max(0, own-served*share)+extraTenant, waiting)
	if waiting <= 0 {
		// Nothing waits in the lane: new work starts at once, whatever
		// is parked, running or waiting to be committed.
		return Prediction{Known: true, Rate: rate, Share: share}
	}
	// New work starts once what is ahead of it has started.
	byShare := ahead / (rate * share)
	byLane := waiting / rate
	secs := math.Min(byShare, byLane)
	// Answers waiting for the committer delay every tenant's result alike.
	down := time.Duration(math.Max(0, c.Downstream-served) / rate * float64(time.Second))
	// The counts see the queues the classifiers hold; the waits work
	// really had see all of them. A tenant whose work waited longer than
	// the counts say waits at least that long; one with no recent work
	// at least as long as the luckiest in the lane.
	obs := c.Tenants[lane][tenant].MinWait
	if obs <= 0 {
		obs = c.MinWait[lane]
	}
	secs = math.Max(secs, obs.Seconds())
	return Prediction{Known: true, Wait: time.Duration(secs * float64(time.Second)), Rate: rate, Share: share,
		Waiting: waiting, Ahead: ahead, Downstream: down}
}
