package classifier

import (
	"context"
	"math"
	"slices"
	"sync"
)

// A review in parts reserves each call at its estimate — the request's
// bytes as units and the answer at its max_tokens cap — which bounds the
// call's cost from above and keeps a tenant's budget safe, but is an order
// of magnitude above what a call is billed. Its cost cap is checked
// against a calibrated estimate instead: the reservation scaled by the
// ratio of what the provider billed to what was reserved, over the last
// calibrationCalls calls of reviews in parts of the same contract and
// model (their ledger rows, read once a lease) and then this lease's own
// calls as they answer. The ratio taken is the 90th percentile of the
// calls' ratios, so a part is rarely estimated below what it costs; with
// no call to go on it is 1, the reservation itself.

const (
	// calibrationCalls is how many recent calls the ratio is taken over.
	calibrationCalls = 50
	// calibrationQuantile is the quantile of their ratios taken.
	calibrationQuantile = 0.9
)

// calibration is the billed-to-reserved ratios of recent calls.
type calibration struct {
	mu     sync.Mutex
	ratios []float64 // newest last, at most calibrationCalls
}

// observe adds a call reserved at estimate and billed cost.
func (c *calibration) observe(estimate, cost int64) {
	if estimate <= 0 || cost < 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ratios = append(c.ratios, float64(cost)/float64(estimate))
	if n := len(c.ratios); n > calibrationCalls {
		c.ratios = slices.Delete(c.ratios, 0, n-calibrationCalls)
	}
}

// ratio is the calibrated ratio and how many calls it rests on: 1 and 0
// before any.
func (c *calibration) ratio() (float64, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.ratios) == 0 {
		return 1, 0
	}
	sorted := slices.Clone(c.ratios)
	slices.Sort(sorted)
	// Nearest rank.
	i := int(math.Ceil(calibrationQuantile*float64(len(sorted)))) - 1
	return sorted[max(i, 0)], len(sorted)
}

// project is what a call reserved at estimate is expected to cost.
func (c *calibration) project(estimate int64) int64 {
	r, _ := c.ratio()
	return int64(math.Ceil(float64(estimate) * r))
}

// calibrationOf reads the recent calls of reviews in parts of contract
// asked of model. A failed read leaves the reservation as the estimate
// until this lease's own calls answer.
func (s *Service) calibrationOf(ctx context.Context, contract, model string) *calibration {
	cal := &calibration{}
	costs, err := s.d.Store.PartCallCosts(ctx, contract, model, calibrationCalls)
	if err != nil {
		s.d.Log.Warn("reading recent part calls' costs failed; the cost cap counts parts at their reservations", "err", err)
		return cal
	}
	for i := len(costs) - 1; i >= 0; i-- {
		cal.observe(costs[i].Estimate, costs[i].Cost)
	}
	return cal
}
