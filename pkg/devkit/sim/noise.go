package sim

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
)

// noisyPrefix begins the name of a noisy model; the percent follows it.
const noisyPrefix = "assay-sim-noisy-"

// NoisyModel is the name of a model that answers as the simulated reviewer
// does, except that every call drops part of its answer at random with
// probability percent/100 (0 to 100): each code-review finding; each
// change-review finding and tag (one tag always stays, and the severity is
// that of the findings kept); the whole moderation verdict, which then
// reads the text as harmless. It stands for a real model sampled at a
// temperature above zero, whose answers to one input differ from call to
// call, so that a rollout check can be tried against one.
//
// The draws follow the server's seed (Reseed): the n-th call with one input
// to one noisy model draws the same after every Reseed with the same seed,
// whatever order concurrent calls arrive in.
func NoisyModel(percent int) string {
	return noisyPrefix + strconv.Itoa(min(max(percent, 0), 100))
}

// noisyPercent is the drop probability a model name asks for, and whether
// it names a noisy model.
func noisyPercent(name string) (float64, bool) {
	rest, ok := strings.CutPrefix(name, noisyPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 || n > 100 {
		return 0, false
	}
	return float64(n) / 100, true
}

// noiseState is the seed of the noisy models' draws and, per model and
// input, how many calls have drawn since the last Reseed.
type noiseState struct {
	mu    sync.Mutex
	seed  uint64
	calls map[uint64]uint64
}

// Reseed starts the noisy models' draws again from seed: after it, the
// n-th call with one input to one noisy model draws what the n-th call
// with that input drew after the last Reseed with the same seed.
func (s *Server) Reseed(seed uint64) {
	s.noise.mu.Lock()
	defer s.noise.mu.Unlock()
	s.noise.seed, s.noise.calls = seed, nil
}

// noise is one call's draws: what it drops, and how likely.
type noise struct {
	p float64
	r *rand.Rand
}

// noiseFor is the draws of call c, nil when its model is not noisy.
func (s *Server) noiseFor(c *call) *noise {
	p, ok := noisyPercent(c.req.Model)
	if !ok {
		return nil
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%s\x00%s\x00%s", c.req.Model, c.contract, c.input)
	key := h.Sum64()
	s.noise.mu.Lock()
	if s.noise.calls == nil {
		s.noise.calls = map[uint64]uint64{}
	}
	n := s.noise.calls[key]
	s.noise.calls[key]++
	seed := s.noise.seed
	s.noise.mu.Unlock()
	return &noise{p: p, r: rand.New(rand.NewPCG(seed, key+n*0x9e3779b97f4a7c15))}
}

// drop reports whether the next part of the answer is dropped; a nil noise
// drops nothing.
func (n *noise) drop() bool {
	return n != nil && n.r.Float64() < n.p
}

// keep is xs without the elements drop chose, in order.
func keep[T any](n *noise, xs []T) []T {
	if n == nil {
		return xs
	}
	out := xs[:0:0]
	for _, x := range xs {
		if !n.drop() {
			out = append(out, x)
		}
	}
	if out == nil {
		out = []T{}
	}
	return out
}

// bend drops a change review's findings and tags as n draws, keeping at
// least one tag (the schema wants one), and sets the severity to the
// highest of the findings kept, low for none.
func (ch *ChangeReview) bend(n *noise) {
	if n == nil {
		return
	}
	ch.Findings = keep(n, ch.Findings)
	tags := keep(n, ch.Tags)
	if len(tags) == 0 && len(ch.Tags) > 0 {
		tags = ch.Tags[:1]
	}
	ch.Tags = tags
	ch.Severity = "low"
	order := map[string]int{"low": 0, "medium": 1, "high": 2}
	for _, f := range ch.Findings {
		if order[f.Severity] > order[ch.Severity] {
			ch.Severity = f.Severity
		}
	}
}

// harmless is the moderation verdict of a text read as holding nothing.
var harmless = Moderation{Category: CategoryOther, Confidence: 0.9, NeedsHumanReview: false}

// bend reads the text as harmless when n draws so.
func (m *Moderation) bend(n *noise) {
	if n.drop() {
		*m = harmless
	}
}
