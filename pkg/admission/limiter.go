// Package admission decides how much work may proceed: keyed token buckets
// for ingress, and an adaptive concurrency limit with lanes for calls to a
// model provider.
package admission

import (
	"container/list"
	"context"
	"fmt"
	"math"
	"sync"
	"time"
)

// Lanes. Any other lane name is treated as Batch.
const (
	Interactive = "interactive"
	Batch       = "batch"
)

// Reasons passed to LimiterConfig.OnChange.
const (
	ReasonRateLimited = "rate_limited"
	ReasonLatency     = "latency"
	ReasonTimeout     = "timeout"
	ReasonGrowth      = "growth"
)

// SignalKind is what one call says about the provider's congestion.
type SignalKind int

const (
	// Ignore says nothing about congestion: transport errors, cancels,
	// invalid output. It is the zero value.
	Ignore SignalKind = iota
	// Success is an answer; its latency feeds the latency estimate.
	Success
	// RateLimited is a 429 from the provider.
	RateLimited
	// Timeout is a call that outlasted its deadline.
	Timeout
)

func (k SignalKind) String() string {
	switch k {
	case Ignore:
		return "ignore"
	case Success:
		return "success"
	case RateLimited:
		return "rate_limited"
	case Timeout:
		return "timeout"
	}
	return fmt.Sprintf("SignalKind(%d)", int(k))
}

// Signal is the outcome of one call, handed back with its permit.
type Signal struct {
	Kind    SignalKind
	Latency time.Duration // of a Success; zero means not measured
}

// The latency estimate. The short-term latency is a per-sample EWMA with
// TCP's SRTT gain. The baseline is a time-based EWMA of the short-term
// latency with time constant baselineTau: it ignores bursts (a hundred answers
// at once move it as much as one), equals the short-term latency when latency
// is constant, and follows a permanent change in a few tens of seconds. After
// a sudden rise by a factor r > LatencyTolerance, latency counts as congestion
// for about baselineTau × ln((r−1)/(r−LatencyTolerance)): 6 s for r = 3 with
// the defaults.
const (
	shortGain   = 1.0 / 8
	baselineTau = 20 * time.Second
	minSamples  = 5 // answers needed before latency can count as congestion
)

// LimiterConfig configures a Limiter. Zero fields take their defaults.
type LimiterConfig struct {
	// Initial is the starting limit. Default min(4, Max), at least Min.
	Initial int
	// Min is the lowest the limit falls. Default 1.
	Min int
	// Max is the hard ceiling of the limit. Required, at least 1.
	Max int
	// Headroom is how many messages beyond the limit may be held (Enter)
	// while they wait for a permit. Default 2; negative means none.
	Headroom int
	// Decrease multiplies the limit on congestion, at most once per window.
	// Between 0 and 1. Default 0.9.
	Decrease float64
	// GrowthWindows: the limit grows by one after GrowthWindows × Limit()
	// consecutive clean successes. Default 10.
	GrowthWindows int
	// SlowStart, until the first congestion signal, grows the limit by one
	// after every busy clean success instead of after GrowthWindows windows,
	// so the limit doubles each window, as TCP's congestion window does in
	// slow start, and a fresh limiter finds a roomy provider within a few
	// windows; after the first 429, timeout or latency rise it grows slowly.
	SlowStart bool
	// LatencyTolerance: a short-term latency above LatencyTolerance × the
	// baseline counts as congestion. Greater than 1. Default 2.
	LatencyTolerance float64
	// BatchReserve is how many permits (and hand slots) batch leaves for
	// interactive callers. Default 1; negative means none.
	BatchReserve int
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// OnChange, if set, is told of every change of Limit() with one of the
	// Reason constants. Calls come in order, one at a time, without the
	// limiter's lock held.
	OnChange func(old, new int, reason string)
	// Cell, if set, is a ceiling beyond this limiter's own that every
	// permit also takes a place under: the cell's, shared with its other
	// instances (CellSlots), so the provider's allowance holds however many
	// instances run. Acquire waits for it after the limiter's own permit.
	Cell Ceiling
}

// Ceiling is a limit on calls beyond a Limiter's own.
type Ceiling interface {
	Take(ctx context.Context) (release func(), err error)
}

func (c *LimiterConfig) validate() error {
	if c.Max < 1 {
		return fmt.Errorf("admission: LimiterConfig.Max must be at least 1, got %d", c.Max)
	}
	switch {
	case c.Min < 0:
		return fmt.Errorf("admission: LimiterConfig.Min must not be negative, got %d", c.Min)
	case c.Min == 0:
		c.Min = 1
	case c.Min > c.Max:
		return fmt.Errorf("admission: LimiterConfig.Min (%d) is above Max (%d)", c.Min, c.Max)
	}
	switch {
	case c.Initial < 0:
		return fmt.Errorf("admission: LimiterConfig.Initial must not be negative, got %d", c.Initial)
	case c.Initial == 0:
		c.Initial = max(c.Min, min(4, c.Max))
	case c.Initial < c.Min || c.Initial > c.Max:
		return fmt.Errorf("admission: LimiterConfig.Initial (%d) is outside Min..Max (%d..%d)", c.Initial, c.Min, c.Max)
	}
	if c.Headroom == 0 {
		c.Headroom = 2
	}
	c.Headroom = max(c.Headroom, 0)
	if c.Decrease == 0 {
		c.Decrease = 0.9
	}
	if !(c.Decrease > 0 && c.Decrease < 1) {
		return fmt.Errorf("admission: LimiterConfig.Decrease must be between 0 and 1, got %v", c.Decrease)
	}
	switch {
	case c.GrowthWindows < 0:
		return fmt.Errorf("admission: LimiterConfig.GrowthWindows must not be negative, got %d", c.GrowthWindows)
	case c.GrowthWindows == 0:
		c.GrowthWindows = 10
	}
	if c.LatencyTolerance == 0 {
		c.LatencyTolerance = 2
	}
	if !(c.LatencyTolerance > 1) || math.IsInf(c.LatencyTolerance, 1) {
		return fmt.Errorf("admission: LimiterConfig.LatencyTolerance must be a number above 1, got %v", c.LatencyTolerance)
	}
	if c.BatchReserve == 0 {
		c.BatchReserve = 1
	}
	c.BatchReserve = max(c.BatchReserve, 0)
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Limiter is an adaptive concurrency limit for one region and provider. It
// hands out permits for calls (Acquire) and slots for messages held while
// they wait for a permit (Enter). The limit shrinks multiplicatively on 429s,
// timeouts and rising latency, at most once per window, and grows by one
// after a run of clean successes (in slow start, after each one). Waiting
// interactive callers are served before batch ones; each lane is FIFO.
type Limiter struct {
	cfg LimiterConfig

	mu        sync.Mutex
	limit     float64 // permits are floor(limit), within Min..Max
	epoch     uint64  // bumped by every decrease
	clean     int     // consecutive clean successes since the last change
	probing   bool    // slow start: no congestion seen yet
	lat       latencyEstimate
	permits   pool
	hand      [2]pool // by lane: a batch backlog never takes interactive's slots
	decreases uint64
	increases uint64
	cellHeld  int // permits holding a place under cfg.Cell

	changes    []change // waiting for OnChange
	delivering bool     // a caller is running OnChange
}

type change struct {
	old, new int
	reason   string
}

// NewLimiter returns a Limiter, or an error naming the bad field of cfg.
func NewLimiter(cfg LimiterConfig) (*Limiter, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Limiter{cfg: cfg, limit: float64(cfg.Initial), probing: cfg.SlowStart}, nil
}

// Permit allows one call. Release it with the call's outcome.
type Permit struct {
	l        *Limiter
	epoch    uint64 // the limiter's epoch when granted
	busy     bool   // the limit was in use when granted: its success may grow it
	released bool   // guarded by l.mu
	cell     func() // gives back its place under LimiterConfig.Cell
}

// Acquire waits for a call permit: at most Limit() are in flight here, and
// with LimiterConfig.Cell at most the cell's ceiling in the whole cell. It
// returns an error wrapping ctx.Err() if ctx ends first.
func (l *Limiter) Acquire(ctx context.Context, lane string) (*Permit, error) {
	epoch, busy, err := l.wait(ctx, &l.permits, lane)
	if err != nil {
		return nil, fmt.Errorf("admission: wait for permit: %w", err)
	}
	p := &Permit{l: l, epoch: epoch, busy: busy}
	if l.cfg.Cell != nil {
		if p.cell, err = l.cfg.Cell.Take(ctx); err != nil {
			p.Release(Signal{Kind: Ignore})
			return nil, fmt.Errorf("admission: wait for the cell's ceiling: %w", err)
		}
		l.mu.Lock()
		l.cellHeld++
		l.mu.Unlock()
	}
	return p, nil
}

// Release gives the permit back and tells the limiter what the call saw.
// Only the first call has an effect.
func (p *Permit) Release(s Signal) {
	l := p.l
	l.mu.Lock()
	if p.released {
		l.mu.Unlock()
		return
	}
	p.released = true
	if p.cell != nil {
		l.cellHeld--
		defer p.cell()
	}
	l.permits.used--
	old := l.limitLocked()
	if reason := l.observeLocked(p.epoch, p.busy, s); reason != "" {
		if n := l.limitLocked(); n != old && l.cfg.OnChange != nil {
			l.changes = append(l.changes, change{old, n, reason})
		}
	}
	l.dispatchLocked()
	l.mu.Unlock()
	l.deliver()
}

// Enter waits for a slot to hold a message: each lane holds at most
// Limit()+Headroom (batch BatchReserve fewer), in slots of its own, so a batch
// backlog never keeps an interactive message out. leave gives the slot back;
// only its first call has an effect. Enter returns an error wrapping
// ctx.Err() if ctx ends first.
func (l *Limiter) Enter(ctx context.Context, lane string) (leave func(), err error) {
	hand := &l.hand[laneIndex(lane)]
	if _, _, err := l.wait(ctx, hand, lane); err != nil {
		return nil, fmt.Errorf("admission: wait to enter: %w", err)
	}
	left := false
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if left {
			return
		}
		left = true
		hand.used--
		l.dispatchLocked()
	}, nil
}

// Limit is the number of permits now.
func (l *Limiter) Limit() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.limitLocked()
}

// LimiterStats is a snapshot of a Limiter.
type LimiterStats struct {
	Limit     int        // permits
	Target    float64    // the limit before rounding down
	InFlight  int        // permits held
	CellHeld  int        // permits holding a place under LimiterConfig.Cell
	InHand    int        // hand slots held
	Waiting   LaneCounts // callers waiting in Acquire
	Entering  LaneCounts // callers waiting in Enter
	Decreases uint64     // decreases applied; damped signals do not count
	Increases uint64     // growth steps
	// PermitWaits counts the permits granted after a wait, PermitWaited
	// sums those waits, by lane: what admission itself added to queueing.
	PermitWaits  LaneCounts
	PermitWaited LaneDurations
	Baseline     time.Duration // slow latency estimate; zero before the first answer
	Short        time.Duration // short-term latency estimate
}

// LaneDurations are times by lane.
type LaneDurations struct {
	Interactive, Batch time.Duration
}

// LaneCounts count callers by lane.
type LaneCounts struct {
	Interactive, Batch int
}

// Stats returns a snapshot of the limiter.
func (l *Limiter) Stats() LimiterStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return LimiterStats{
		Limit:       l.limitLocked(),
		Target:      l.limit,
		InFlight:    l.permits.used,
		CellHeld:    l.cellHeld,
		InHand:      l.hand[laneInteractive].used + l.hand[laneBatch].used,
		PermitWaits: LaneCounts{Interactive: l.permits.waits[laneInteractive], Batch: l.permits.waits[laneBatch]},
		PermitWaited: LaneDurations{Interactive: l.permits.waited[laneInteractive],
			Batch: l.permits.waited[laneBatch]},
		Waiting:   l.permits.counts(),
		Entering:  LaneCounts{Interactive: l.hand[laneInteractive].counts().Interactive, Batch: l.hand[laneBatch].counts().Batch},
		Decreases: l.decreases,
		Increases: l.increases,
		Baseline:  time.Duration(l.lat.baseline),
		Short:     time.Duration(l.lat.short),
	}
}

func (l *Limiter) limitLocked() int {
	return max(l.cfg.Min, min(int(l.limit), l.cfg.Max))
}

// observeLocked applies one signal to the limit and returns the reason if
// the limit moved. Only a success of a permit granted while the limit was in
// use counts toward growth: light traffic says nothing about whether the
// provider could take more, and must not raise the limit to the ceiling.
func (l *Limiter) observeLocked(epoch uint64, busy bool, s Signal) string {
	switch s.Kind {
	case RateLimited:
		return l.congestionLocked(epoch, ReasonRateLimited)
	case Timeout:
		return l.congestionLocked(epoch, ReasonTimeout)
	case Success:
		if s.Latency > 0 {
			l.lat.observe(l.cfg.Now(), s.Latency)
			if l.lat.congested(l.cfg.LatencyTolerance) {
				return l.congestionLocked(epoch, ReasonLatency)
			}
		}
		if !busy {
			return ""
		}
		// In slow start (probing: no congestion seen yet) every busy clean
		// success grows the limit by one, so a window of Limit() of them
		// doubles it: a fresh cell reaches a roomy provider's capacity in
		// a few windows instead of one step per window. The first 429,
		// timeout or latency rise ends probing (congestionLocked); from
		// then on the limit grows by one per GrowthWindows windows.
		if !l.probing {
			l.clean++
			if l.clean < l.cfg.GrowthWindows*l.limitLocked() {
				return ""
			}
		}
		l.clean = 0
		if l.limit >= float64(l.cfg.Max) {
			return ""
		}
		l.limit = min(float64(l.cfg.Max), l.limit+1)
		l.increases++
		return ReasonGrowth
	}
	return ""
}

// congestionLocked decreases the limit unless a decrease already answered
// the window the signal's permit belongs to.
func (l *Limiter) congestionLocked(epoch uint64, reason string) string {
	l.clean = 0
	l.probing = false
	if epoch != l.epoch {
		return ""
	}
	l.epoch++
	l.limit = max(float64(l.cfg.Min), l.limit*l.cfg.Decrease)
	l.decreases++
	return reason
}

func (l *Limiter) capacityLocked(p *pool) int {
	if p != &l.permits {
		return l.limitLocked() + l.cfg.Headroom
	}
	return l.limitLocked()
}

func (l *Limiter) dispatchLocked() {
	l.permits.dispatch(l.capacityLocked(&l.permits), l.cfg.BatchReserve, l.epoch)
	for i := range l.hand {
		l.hand[i].dispatch(l.capacityLocked(&l.hand[i]), l.cfg.BatchReserve, l.epoch)
	}
}

// wait takes a slot of p for lane, waiting as long as ctx allows, and
// returns the epoch at which it was granted and whether the pool was in use
// up to what the lane may take (always true after a wait).
func (l *Limiter) wait(ctx context.Context, p *pool, lane string) (uint64, bool, error) {
	if err := ctx.Err(); err != nil {
		return 0, false, err
	}
	i := laneIndex(lane)
	l.mu.Lock()
	capacity := l.capacityLocked(p)
	if p.waiting[i].Len() == 0 && p.may(i, capacity, l.cfg.BatchReserve) {
		p.used++
		epoch := l.epoch
		busy := p.used >= capacity-max(l.cfg.BatchReserve, 0)
		l.mu.Unlock()
		return epoch, busy, nil
	}
	w := &waiter{ready: make(chan struct{})}
	w.elem = p.waiting[i].PushBack(w)
	since := l.cfg.Now()
	l.mu.Unlock()

	select {
	case <-w.ready:
		waited := l.cfg.Now().Sub(since)
		l.mu.Lock()
		p.waits[i]++
		p.waited[i] += waited
		l.mu.Unlock()
		return w.epoch, true, nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	if w.elem != nil {
		p.waiting[i].Remove(w.elem)
	} else {
		p.used-- // granted as ctx ended: give it back
	}
	l.dispatchLocked()
	l.mu.Unlock()
	return 0, false, ctx.Err()
}

// deliver runs OnChange for queued changes unless another caller already is.
func (l *Limiter) deliver() {
	l.mu.Lock()
	if l.delivering || len(l.changes) == 0 {
		l.mu.Unlock()
		return
	}
	l.delivering = true
	for len(l.changes) > 0 {
		c := l.changes[0]
		l.changes = l.changes[1:]
		l.mu.Unlock()
		l.cfg.OnChange(c.old, c.new, c.reason)
		l.mu.Lock()
	}
	l.delivering = false
	l.mu.Unlock()
}

const (
	laneInteractive = iota
	laneBatch
)

func laneIndex(lane string) int {
	if lane == Interactive {
		return laneInteractive
	}
	return laneBatch
}

// pool is a counted resource with a FIFO queue of waiters per lane.
type pool struct {
	used    int
	waiting [2]list.List     // of *waiter, by lane index
	waits   [2]int           // grants that had to wait, by lane index
	waited  [2]time.Duration // their total wait
}

type waiter struct {
	ready chan struct{} // closed when granted
	elem  *list.Element // nil once granted or removed
	epoch uint64
}

// may reports whether lane may take a slot out of capacity now, waiters of
// its own lane aside. Batch takes only what interactive leaves: nothing
// while interactive waits, and never the last reserve slots, or when
// capacity ≤ reserve only a slot when none is used.
func (p *pool) may(lane, capacity, reserve int) bool {
	if lane == laneInteractive {
		return p.used < capacity
	}
	if p.waiting[laneInteractive].Len() > 0 {
		return false
	}
	if capacity > reserve {
		return p.used < capacity-reserve
	}
	return p.used == 0
}

func (p *pool) dispatch(capacity, reserve int, epoch uint64) {
	for lane := range p.waiting {
		q := &p.waiting[lane]
		for q.Len() > 0 && p.may(lane, capacity, reserve) {
			w := q.Remove(q.Front()).(*waiter)
			w.elem = nil
			w.epoch = epoch
			p.used++
			close(w.ready)
		}
	}
}

func (p *pool) counts() LaneCounts {
	return LaneCounts{
		Interactive: p.waiting[laneInteractive].Len(),
		Batch:       p.waiting[laneBatch].Len(),
	}
}

// latencyEstimate holds the short-term and baseline latency in nanoseconds.
type latencyEstimate struct {
	short, baseline float64
	samples         int
	last            time.Time
}

func (e *latencyEstimate) observe(now time.Time, d time.Duration) {
	x := float64(d)
	if e.samples == 0 {
		e.short, e.baseline, e.last, e.samples = x, x, now, 1
		return
	}
	if dt := now.Sub(e.last); dt > 0 {
		// The baseline follows the short-term value held since the last answer.
		w := -math.Expm1(-float64(dt) / float64(baselineTau))
		e.baseline += w * (e.short - e.baseline)
		e.last = now
	}
	e.short += shortGain * (x - e.short)
	e.samples++
}

func (e *latencyEstimate) congested(tolerance float64) bool {
	return e.samples >= minSamples && e.short > tolerance*e.baseline
}
