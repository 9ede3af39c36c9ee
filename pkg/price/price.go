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
}

// Prices maps a model name to its price. A key that ends in "*" prices a
// family (gpt-4o-mini* prices gpt-4o-mini-2024-07-18); the exact name wins,
// then the longest family; "*" prices any model not listed.
type Prices map[string]Price

// Default prices every model at 0.15/0.60 dollars per million units.
var Default = Prices{"*": {Input: 0.15, Output: 0.60}}

// Parse reads a price table from JSON, e.g.
// {"gpt-4o-mini": {"input": 0.15, "output": 0.6, "batchInput": 0.075,
// "batchOutput": 0.3}, "*": {...}}.
func Parse(raw []byte) (Prices, error) {
	var p Prices
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("price table: %w", err)
	}
	for m, pr := range p {
		for _, v := range []*float64{&pr.Input, &pr.Output, pr.BatchInput, pr.BatchOutput} {
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
	pr := p.Lookup(model)
	// dollars/1M units × units = micro-dollars.
	return int64(math.Round(pr.Input*float64(in) + pr.Output*float64(out)))
}

// Batch is the price of a line answered through the provider's Batch API:
// the batch prices where the table gives them, else the call's.
func (pr Price) Batch() Price {
	b := Price{Input: pr.Input, Output: pr.Output}
	if pr.BatchInput != nil {
		b.Input = *pr.BatchInput
	}
	if pr.BatchOutput != nil {
		b.Output = *pr.BatchOutput
	}
	return b
}

// BatchCostMicros prices a Batch API line in millionths of a dollar.
func (p Prices) BatchCostMicros(model string, in, out int64) int64 {
	pr := p.Lookup(model).Batch()
	return int64(math.Round(pr.Input*float64(in) + pr.Output*float64(out)))
}
