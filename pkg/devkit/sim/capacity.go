package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// Latency kinds.
const (
	LatencyFixed    = "fixed"    // Base
	LatencyUniform  = "uniform"  // Base..Base+Spread
	LatencyLongtail = "longtail" // lognormal, median Base, capped
)

// Capacity is what the simulated provider can take. Beyond it a call is
// answered 429 at once, with the exact time until capacity frees up in
// retry-after-ms and Retry-After. The zero Capacity is unlimited.
type Capacity struct {
	Rate        float64 `json:"rate,omitempty"`        // requests/second admitted by a token bucket; 0 = unlimited
	Burst       int     `json:"burst,omitempty"`       // bucket size; 0 = max(1, floor(Rate/10))
	Concurrency int     `json:"concurrency,omitempty"` // calls answered at once; 0 = unlimited
	Latency     Latency `json:"latency,omitzero"`      // how long an admitted call takes; replaces Options.Latency
	Steps       []Step  `json:"steps,omitempty"`       // capacity changes over time, relative to SetCapacity
}

// Latency is how long an admitted call takes before it is answered.
type Latency struct {
	Kind string // LatencyFixed (also ""), LatencyUniform or LatencyLongtail
	// Base is the latency (fixed), the least one (uniform) or the median
	// (longtail).
	Base time.Duration
	// Spread widens uniform to Base..Base+Spread and caps longtail at
	// Base+Spread; a longtail without Spread is capped at 20×Base.
	Spread time.Duration
	Seed   int64 // draws are deterministic for a seed, in order of admission
}

// Step changes capacity from At on: Rate and Concurrency are scaled by
// Factor (0.5 halves, 1 restores, 0 admits nothing). The bucket keeps its
// tokens across a step, capped by the scaled burst: max(1, Burst×Factor),
// or 0 while Factor is 0, which empties it.
// A scaled concurrency is Concurrency×Factor rounded down, at least 1 while
// Factor > 0.
type Step struct {
	At     time.Duration
	Factor float64
}

// Longtail shape: lognormal with sigma 1 puts p90 near 3.6× and p99 near
// 10× the median.
const (
	longtailSigma = 1.0
	longtailCap   = 20
)

// maxLatency bounds Base+Spread.
const maxLatency = 24 * time.Hour

// maxHorizon bounds step times and the wait for a token, far beyond any
// benchmark, so that times stay clear of overflow.
const maxHorizon = 365 * 24 * time.Hour

// noCapacityWait is the Retry-After given when capacity never comes back
// (a Factor 0 step with no later one, or calls that hang).
const noCapacityWait = time.Minute

// tokenEpsilon absorbs float rounding in the bucket, so that a token
// accrued exactly on time is whole.
const tokenEpsilon = 1e-9

type latencyJSON struct {
	Kind   string `json:"kind,omitempty"`
	Base   string `json:"base,omitempty"`
	Spread string `json:"spread,omitempty"`
	Seed   int64  `json:"seed,omitempty"`
}

// MarshalJSON writes durations as Go duration strings.
func (l Latency) MarshalJSON() ([]byte, error) {
	j := latencyJSON{Kind: l.Kind, Seed: l.Seed}
	if l.Base != 0 {
		j.Base = l.Base.String()
	}
	if l.Spread != 0 {
		j.Spread = l.Spread.String()
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads durations as Go duration strings and refuses unknown
// fields.
func (l *Latency) UnmarshalJSON(b []byte) error {
	var j latencyJSON
	if err := strictUnmarshal(b, &j); err != nil {
		return fmt.Errorf("latency: %w", err)
	}
	out := Latency{Kind: j.Kind, Seed: j.Seed}
	var err error
	if j.Base != "" {
		if out.Base, err = time.ParseDuration(j.Base); err != nil {
			return fmt.Errorf("latency base: %w", err)
		}
	}
	if j.Spread != "" {
		if out.Spread, err = time.ParseDuration(j.Spread); err != nil {
			return fmt.Errorf("latency spread: %w", err)
		}
	}
	*l = out
	return nil
}

type stepJSON struct {
	At     string   `json:"at"`
	Factor *float64 `json:"factor"`
}

// MarshalJSON writes At as a Go duration string.
func (s Step) MarshalJSON() ([]byte, error) {
	return json.Marshal(stepJSON{At: s.At.String(), Factor: &s.Factor})
}

// UnmarshalJSON reads At as a Go duration string; factor is required, so a
// misspelt one is not read as an outage.
func (s *Step) UnmarshalJSON(b []byte) error {
	var j stepJSON
	if err := strictUnmarshal(b, &j); err != nil {
		return fmt.Errorf("step: %w", err)
	}
	if j.Factor == nil {
		return errors.New("step: factor is required")
	}
	out := Step{Factor: *j.Factor}
	if j.At != "" {
		var err error
		if out.At, err = time.ParseDuration(j.At); err != nil {
			return fmt.Errorf("step at: %w", err)
		}
	}
	*s = out
	return nil
}

func strictUnmarshal(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("trailing data after the JSON document")
	}
	return nil
}

// validate reports the first thing wrong with c.
func (c Capacity) validate() error {
	switch {
	case math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0):
		return fmt.Errorf("sim: capacity rate %v is not a number", c.Rate)
	case c.Rate < 0:
		return fmt.Errorf("sim: capacity rate %v is negative", c.Rate)
	case c.Burst < 0:
		return fmt.Errorf("sim: capacity burst %d is negative", c.Burst)
	case c.Burst > 0 && c.Rate == 0:
		return errors.New("sim: capacity burst needs a rate")
	case c.Concurrency < 0:
		return fmt.Errorf("sim: capacity concurrency %d is negative", c.Concurrency)
	case len(c.Steps) > 0 && c.Rate == 0 && c.Concurrency == 0:
		return errors.New("sim: capacity steps need a rate or a concurrency to scale")
	}
	if err := c.Latency.validate(); err != nil {
		return err
	}
	for i, s := range c.Steps {
		switch {
		case s.At < 0:
			return fmt.Errorf("sim: capacity step %d: at %v is negative", i, s.At)
		case s.At > maxHorizon:
			return fmt.Errorf("sim: capacity step %d: at %v is beyond %v", i, s.At, maxHorizon)
		case i > 0 && s.At <= c.Steps[i-1].At:
			return fmt.Errorf("sim: capacity step %d: at %v is not after step %d at %v", i, s.At, i-1, c.Steps[i-1].At)
		case math.IsNaN(s.Factor) || math.IsInf(s.Factor, 0):
			return fmt.Errorf("sim: capacity step %d: factor %v is not a number", i, s.Factor)
		case s.Factor < 0:
			return fmt.Errorf("sim: capacity step %d: factor %v is negative", i, s.Factor)
		}
	}
	return nil
}

func (l Latency) validate() error {
	switch l.Kind {
	case "", LatencyFixed, LatencyUniform, LatencyLongtail:
	default:
		return fmt.Errorf("sim: latency kind %q is not %s, %s or %s", l.Kind, LatencyFixed, LatencyUniform, LatencyLongtail)
	}
	switch {
	case l.Base < 0 || l.Spread < 0:
		return errors.New("sim: latency base and spread must not be negative")
	case l.Base > maxLatency || l.Spread > maxLatency-l.Base:
		return fmt.Errorf("sim: latency base+spread exceeds %v", maxLatency)
	case (l.Kind == "" || l.Kind == LatencyFixed) && l.Spread != 0:
		return errors.New("sim: fixed latency takes no spread; use uniform or longtail")
	case l.Kind == LatencyLongtail && l.Base == 0:
		return errors.New("sim: longtail latency needs a base (its median)")
	}
	return nil
}

// draw picks one call's latency.
func (l Latency) draw(r *rand.Rand) time.Duration {
	switch l.Kind {
	case LatencyUniform:
		if l.Spread == 0 {
			return l.Base
		}
		return l.Base + time.Duration(r.Int64N(int64(l.Spread)+1))
	case LatencyLongtail:
		hi := l.Base + l.Spread
		if l.Spread == 0 {
			hi = min(longtailCap*l.Base, maxLatency)
		}
		d := float64(l.Base) * math.Exp(longtailSigma*r.NormFloat64())
		if d >= float64(hi) {
			return hi
		}
		return time.Duration(d)
	}
	return l.Base
}

func (c Capacity) isZero() bool {
	return c.Rate == 0 && c.Burst == 0 && c.Concurrency == 0 && c.Latency == Latency{} && len(c.Steps) == 0
}

// withDefaults fills Burst and the latency kind.
func (c Capacity) withDefaults() Capacity {
	if c.Rate > 0 && c.Burst == 0 {
		c.Burst = max(1, int(c.Rate/10))
	}
	if c.Latency.Kind == "" && (c.Latency.Base != 0 || c.Latency.Spread != 0) {
		c.Latency.Kind = LatencyFixed
	}
	c.Steps = slices.Clone(c.Steps)
	return c
}

// capState is a set Capacity in motion: its bucket and latency draws.
type capState struct {
	cfg    Capacity
	start  time.Time // when it was set; Steps count from here
	tokens float64   // at last
	last   time.Time
	rng    *rand.Rand
}

func newCapState(c Capacity, now time.Time) *capState {
	seed := uint64(c.Latency.Seed)
	return &capState{cfg: c, start: now, tokens: float64(c.Burst), last: now, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// factorAt is the factor in effect at t and when it next changes (ok false:
// never).
func (cs *capState) factorAt(t time.Time) (f float64, next time.Time, ok bool) {
	f = 1
	for _, s := range cs.cfg.Steps {
		at := cs.start.Add(s.At)
		if t.Before(at) {
			return f, at, true
		}
		f = s.Factor
	}
	return f, time.Time{}, false
}

func (cs *capState) burst(f float64) float64 {
	if f == 0 {
		return 0
	}
	return max(1, float64(cs.cfg.Burst)*f)
}

// limit is the concurrency ceiling under factor f, -1 when unlimited.
func (cs *capState) limit(f float64) int {
	switch {
	case cs.cfg.Concurrency == 0:
		return -1
	case f == 0:
		return 0
	}
	return max(1, int(math.Floor(float64(cs.cfg.Concurrency)*f+tokenEpsilon)))
}

// project returns the tokens at to of a bucket holding tok at from, with
// nothing taken in between.
func (cs *capState) project(from time.Time, tok float64, to time.Time) float64 {
	for t := from; t.Before(to); {
		f, next, ok := cs.factorAt(t)
		b := cs.burst(f)
		end := to
		if ok && next.Before(to) {
			end = next
		}
		tok = min(b, min(tok, b)+cs.cfg.Rate*f*end.Sub(t).Seconds())
		t = end
	}
	f, _, _ := cs.factorAt(to)
	return min(tok, cs.burst(f))
}

// tokenAt is the first time from on when the bucket holds a whole token,
// with nothing taken after last; ok is false if it never does.
func (cs *capState) tokenAt(from time.Time) (time.Time, bool) {
	if cs.cfg.Rate == 0 {
		return from, true
	}
	t, tok := from, cs.project(cs.last, cs.tokens, from)
	for {
		f, next, ok := cs.factorAt(t)
		b := cs.burst(f)
		tok = min(tok, b)
		if tok >= 1-tokenEpsilon {
			return t, true
		}
		if r := cs.cfg.Rate * f; r > 0 {
			// Float noise must not add a nanosecond, which the header
			// would round up to a whole millisecond.
			ns := min((1-tok)/r*float64(time.Second), float64(maxHorizon))
			at := t.Add(time.Duration(math.Ceil(ns - ns*1e-12)))
			if !ok || at.Before(next) {
				return at, true
			}
		}
		if !ok {
			return time.Time{}, false
		}
		tok = min(b, tok+cs.cfg.Rate*f*next.Sub(t).Seconds())
		t = next
	}
}

// slotAt is the first time from on when fewer calls are in flight than the
// ceiling allows, calls finishing as planned; ok is false if that never
// happens. finishes are the planned ends (zero: never) of the calls in
// flight at now, from <= now counting them all.
func (cs *capState) slotAt(now, from time.Time, finishes []time.Time) (time.Time, bool) {
	if cs.cfg.Concurrency == 0 {
		return from, true
	}
	// A call past its planned end is about to answer: it ends just after now.
	ends := make([]time.Time, 0, len(finishes))
	for _, e := range finishes {
		if !e.IsZero() && !e.After(now) {
			e = now.Add(1)
		}
		ends = append(ends, e)
	}
	cands := []time.Time{from}
	for _, e := range ends {
		if e.After(from) {
			cands = append(cands, e)
		}
	}
	for _, s := range cs.cfg.Steps {
		if at := cs.start.Add(s.At); at.After(from) {
			cands = append(cands, at)
		}
	}
	slices.SortFunc(cands, time.Time.Compare)
	for _, t := range cands {
		n := 0
		for _, e := range ends {
			if e.IsZero() || e.After(t) {
				n++
			}
		}
		f, _, _ := cs.factorAt(t)
		if n < cs.limit(f) {
			return t, true
		}
	}
	return time.Time{}, false
}

// Refusal reasons, as they appear in the 429 message.
const (
	refusedRate        = "requests per second"
	refusedConcurrency = "concurrent requests"
)

// admit takes a token and reports "" when a call arriving at now may start
// with inFlight calls already running; otherwise it says what refused it
// and how long until both a token and a slot are there.
func (cs *capState) admit(now time.Time, inFlight map[int64]time.Time) (wait time.Duration, refused string) {
	if cs.cfg.Rate > 0 {
		cs.tokens = cs.project(cs.last, cs.tokens, now)
		cs.last = now
	}
	f, _, _ := cs.factorAt(now)
	rateOK := cs.cfg.Rate == 0 || cs.tokens >= 1-tokenEpsilon
	lim := cs.limit(f)
	concOK := lim < 0 || len(inFlight) < lim
	if rateOK && concOK {
		if cs.cfg.Rate > 0 {
			cs.tokens = max(0, cs.tokens-1)
		}
		return 0, ""
	}
	refused = refusedRate
	if rateOK {
		refused = refusedConcurrency
	}
	finishes := make([]time.Time, 0, len(inFlight))
	for _, e := range inFlight {
		finishes = append(finishes, e)
	}
	// Both must hold at once: alternate until a token time is also a slot
	// time. Slot times come from a finite set, so this ends.
	t := now
	for range 1 + len(finishes) + len(cs.cfg.Steps) + 1 {
		t1, ok := cs.tokenAt(t)
		if !ok {
			return noCapacityWait, refused
		}
		t2, ok := cs.slotAt(now, t1, finishes)
		if !ok {
			return noCapacityWait, refused
		}
		if t2.Equal(t1) {
			return t1.Sub(now), refused
		}
		t = t2
	}
	return noCapacityWait, refused
}

// SetCapacity replaces the capacity; its bucket starts full and its Steps
// count from now. The zero Capacity is unlimited. Calls already in flight
// count against the new concurrency ceiling.
func (s *Server) SetCapacity(c Capacity) error {
	if err := c.validate(); err != nil {
		return err
	}
	c = c.withDefaults()
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.isZero() {
		s.capa = nil
		return nil
	}
	s.capa = newCapState(c, time.Now())
	return nil
}

// ClearCapacity makes capacity unlimited again.
func (s *Server) ClearCapacity() {
	s.mu.Lock()
	s.capa = nil
	s.mu.Unlock()
}

// Capacity returns the capacity set, with defaults filled; the zero
// Capacity when unlimited.
func (s *Server) Capacity() Capacity {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.capa == nil {
		return Capacity{}
	}
	c := s.capa.cfg
	c.Steps = slices.Clone(c.Steps)
	return c
}

func (s *Server) handleSetCapacity(w http.ResponseWriter, r *http.Request) {
	var c Capacity
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err == nil {
		err = strictUnmarshal(b, &c)
	}
	if err == nil {
		err = s.SetCapacity(c)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_capacity", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, s.Capacity())
}

// setRetryAfter sets retry-after-ms (milliseconds rounded up, at least 1)
// and Retry-After (seconds rounded up, at least 1) for d. It returns the
// delay as given in retry-after-ms, and in seconds.
func setRetryAfter(h http.Header, d time.Duration) (time.Duration, int64) {
	ms := max(1, int64((d+time.Millisecond-1)/time.Millisecond))
	secs := max(1, int64((d+time.Second-1)/time.Second))
	h.Set("Retry-After-Ms", strconv.FormatInt(ms, 10))
	h.Set("Retry-After", strconv.FormatInt(secs, 10))
	return time.Duration(ms) * time.Millisecond, secs
}
