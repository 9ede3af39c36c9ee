// Package price turns an attempt's units into money, from one table shared
// by the classifier (which reserves an estimate before a call) and the
// ledger (which settles the real cost after it).
package price

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
)

// Price is US dollars per million units.
type Price struct {
	Input  float64 `json:"input"`
	Output float64 `json:"output"`
	// BatchInput and BatchOutput price a line answered through the
	// provider's Batch API. Absent, a line costs what a call costs: a
	// table that does not know the discount never under-counts.
	BatchInput  *float64 `json:"batchInput,omitempty"`
	BatchOutput *float64 `json:"batchOutput,omitempty"`
	// CachedInput prices the input units the provider read from its
	// prompt cache (usage.prompt_tokens_details.cached_tokens). Absent,
	// they cost what other input units cost: a table that does not know
	// the discount never under-counts. BatchCachedInput prices them in a
	// Batch API line; absent, they cost the line's input price.
	CachedInput      *float64 `json:"cachedInput,omitempty"`
	BatchCachedInput *float64 `json:"batchCachedInput,omitempty"`
}

// Units are what an attempt is priced on: its input units, of which
// CachedInput were read from the provider's prompt cache, and its output
// units (reasoning units among them, billed as output).
type Units struct {
	Input, CachedInput, Output int64
}

// Prices maps a model name to its price. A key that ends in "*" prices a
// family (gpt-4o-mini* prices gpt-4o-mini-2024-07-18); the exact name wins,
// then the longest family; "*" prices any model not listed.
type Prices map[string]Price

// Default prices every model at 0.15/0.60 dollars per million units.
var Default = Prices{"*": {Input: 0.15, Output: 0.60}}

// Parse reads a price table from JSON, e.g.
// {"gpt-4o-mini": {"input": 0.15, "output": 0.6, "cachedInput": 0.075,
// "batchInput": 0.075, "batchOutput": 0.3}, "*": {...}}.
func Parse(raw []byte) (Prices, error) {
	var p Prices
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("price table: %w", err)
	}
	for m, pr := range p {
		for _, v := range []*float64{&pr.Input, &pr.Output, pr.BatchInput, pr.BatchOutput, pr.CachedInput, pr.BatchCachedInput} {
			if v != nil && (*v < 0 || math.IsNaN(*v)) {
				return nil, fmt.Errorf("price table: model %q: prices must be non-negative", m)
			}
		}
	}
	if _, ok := p["*"]; !ok {
		return nil, fmt.Errorf(`price table: needs a "*" entry for models it does not list`)
	}
	return p, nil
}

// Load reads a price table file; an empty path gives Default.
func Load(path string) (Prices, error) {
	if path == "" {
		return Default, nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("price table: %w", err)
	}
	return Parse(raw)
}

// Lookup is the price of a model: its exact name, else its longest family,
// else "*".
func (p Prices) Lookup(model string) Price {
	if pr, ok := p[model]; ok {
		return pr
	}
	best, found := "", false
	for k := range p {
		fam, ok := strings.CutSuffix(k, "*")
		if ok && fam != "" && strings.HasPrefix(model, fam) && len(fam) > len(best) {
			best, found = fam, true
		}
	}
	if found {
		return p[best+"*"]
	}
	return p["*"]
}

// CostMicros prices an attempt in millionths of a dollar.
func (p Prices) CostMicros(model string, in, out int64) int64 {
	return p.Lookup(model).Cost(Units{Input: in, Output: out})
}

// Cost prices units at pr in millionths of a dollar: cached input units
// at the cached-input price, the other input units at the input price,
// output units at the output price. Cached units are bounded by the
// input units, so they never price more units than were sent.
func (pr Price) Cost(u Units) int64 {
	cached := max(0, min(u.CachedInput, u.Input))
	// dollars/1M units × units = micro-dollars.
	return int64(math.Round(pr.Input*float64(u.Input-cached) + pr.Cached()*float64(cached) + pr.Output*float64(u.Output)))
}

// Cached is the price of an input unit read from the prompt cache: the
// table's cached-input price, else the input price.
func (pr Price) Cached() float64 {
	if pr.CachedInput != nil {
		return *pr.CachedInput
	}
	return pr.Input
}

// Batch is the price of a line answered through the provider's Batch API:
// the batch prices where the table gives them, else the call's; cached
// input at the batch cached-input price, else at the line's input price.
func (pr Price) Batch() Price {
	b := Price{Input: pr.Input, Output: pr.Output}
	if pr.BatchInput != nil {
		b.Input = *pr.BatchInput
	}
	if pr.BatchOutput != nil {
		b.Output = *pr.BatchOutput
	}
	if pr.BatchCachedInput != nil {
		b.CachedInput = pr.BatchCachedInput
	}
	return b
}

// BatchCostMicros prices a Batch API line in millionths of a dollar.
func (p Prices) BatchCostMicros(model string, in, out int64) int64 {
	return p.Lookup(model).Batch().Cost(Units{Input: in, Output: out})
}
