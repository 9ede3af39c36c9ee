package price

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	t.Parallel()
	p, err := Parse([]byte(`{"gpt-4o-mini": {"input": 0.15, "output": 0.6}, "*": {"input": 1, "output": 2}, "free": {}}`))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	want := Prices{"gpt-4o-mini": {Input: 0.15, Output: 0.6}, "*": {Input: 1, Output: 2}, "free": {}}
	if len(p) != len(want) {
		t.Fatalf("prices = %v, want %v", p, want)
	}
	for m, pr := range want {
		if p[m] != pr {
			t.Fatalf("price of %q = %+v, want %+v", m, p[m], pr)
		}
	}

	bad := map[string]string{
		"negative input":  `{"m": {"input": -0.01, "output": 1}}`,
		"negative output": `{"*": {"input": 1, "output": -1}}`,
		"malformed":       `{"m": {"input": 1,}}`,
		"truncated":       `{"m": {"input": 1`,
		"string price":    `{"m": {"input": "0.15"}}`,
		"not an object":   `[1, 2]`,
		"price not obj":   `{"m": 0.15}`,
		"empty":           ``,
		"NaN literal":     `{"m": {"input": NaN}}`,
		"overflow":        `{"m": {"input": 1e400}}`,
		"no fallback":     `{"m": {"input": 1, "output": 1}}`,
	}
	for name, raw := range bad {
		if _, err := Parse([]byte(raw)); err == nil {
			t.Errorf("%s: accepted %s", name, raw)
		} else if !strings.HasPrefix(err.Error(), "price table:") {
			t.Errorf("%s: error %q does not say price table", name, err)
		}
	}
	_, err = Parse([]byte(`{"cheap": {"input": -1}}`))
	if err == nil || !strings.Contains(err.Error(), `"cheap"`) {
		t.Fatalf("negative price error %v does not name the model", err)
	}
}

func TestCostMicros(t *testing.T) {
	t.Parallel()
	p := Prices{
		"*":     {Input: 0.15, Output: 0.60},
		"big":   {Input: 2.50, Output: 10},
		"free":  {},
		"odd":   {Input: 0.0005, Output: 0},
		"exact": {Input: 1, Output: 1},
	}
	cases := []struct {
		model   string
		in, out int64
		want    int64
	}{
		{"unknown-model", 1000, 0, 150},
		{"unknown-model", 0, 1000, 600},
		{"unknown-model", 1000, 1000, 750},
		{"unknown-model", 1_000_000, 0, 150_000},
		{"big", 1000, 100, 3500},
		{"big", 0, 0, 0},
		{"free", 1_000_000, 1_000_000, 0},
		{"exact", 123, 456, 579},
		{"odd", 1000, 0, 1}, // 0.5 rounds half away from zero
		{"odd", 999, 0, 0},
		{"odd", 3000, 0, 2},
	}
	for _, c := range cases {
		if got := p.CostMicros(c.model, c.in, c.out); got != c.want {
			t.Errorf("CostMicros(%q, %d, %d) = %d, want %d", c.model, c.in, c.out, got, c.want)
		}
	}
	if got := Default.CostMicros("anything", 1000, 1000); got != 750 {
		t.Fatalf("default prices: 1000 in + 1000 out = %d micro-dollars, want 750", got)
	}
	noFallback := Prices{"only": {Input: 1, Output: 1}}
	if got := noFallback.CostMicros("other", 1000, 1000); got != 0 {
		t.Fatalf("no fallback price: %d, want 0", got)
	}
	parsed, err := Parse([]byte(`{"*": {"input": 0.15, "output": 0.6}}`))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if got := parsed.CostMicros("gpt-4o-mini", 1000, 0); got != 150 {
		t.Fatalf("1000 input units at 0.15 $/M = %d micro-dollars, want 150", got)
	}
}

// A family prices the dated names a provider answers with: the exact name
// wins, then the longest family, then "*".
func TestLookupFamilies(t *testing.T) {
	t.Parallel()
	p := Prices{
		"gpt-4o":       {Input: 2.5, Output: 10},
		"gpt-4o*":      {Input: 2.6, Output: 11},
		"gpt-4o-mini*": {Input: 0.15, Output: 0.6},
		"*":            {Input: 10, Output: 40},
	}
	for model, want := range map[string]Price{
		"gpt-4o":                 {Input: 2.5, Output: 10},
		"gpt-4o-2024-08-06":      {Input: 2.6, Output: 11},
		"gpt-4o-mini":            {Input: 0.15, Output: 0.6},
		"gpt-4o-mini-2024-07-18": {Input: 0.15, Output: 0.6},
		"gpt-4":                  {Input: 10, Output: 40},
		"":                       {Input: 10, Output: 40},
	} {
		if got := p.Lookup(model); got != want {
			t.Errorf("Lookup(%q) = %+v, want %+v", model, got, want)
		}
	}
}

func TestBatchPrices(t *testing.T) {
	t.Parallel()
	p, err := Parse([]byte(`{"m": {"input": 1, "output": 2, "batchInput": 0.5, "batchOutput": 1},
		"free-batch": {"input": 1, "output": 2, "batchInput": 0, "batchOutput": 0}, "*": {"input": 3, "output": 4}}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		model       string
		call, batch int64
	}{
		{"m", 1*1000 + 2*100, 500 + 100},
		{"free-batch", 1000 + 200, 0},
		// No batch price: a line costs what a call costs.
		{"other", 3000 + 400, 3000 + 400},
	} {
		if got := p.CostMicros(c.model, 1000, 100); got != c.call {
			t.Errorf("%s: call cost %d, want %d", c.model, got, c.call)
		}
		if got := p.BatchCostMicros(c.model, 1000, 100); got != c.batch {
			t.Errorf("%s: batch cost %d, want %d", c.model, got, c.batch)
		}
	}
	if _, err := Parse([]byte(`{"*": {"input": 1, "output": 1, "batchOutput": -1}}`)); err == nil {
		t.Error("a negative batch price was taken")
	}
}

// Cached input units cost the cached-input price where the table gives
// one, else the input price; a batch line's, the batch cached-input
// price, else the line's input price. Reasoning units are output units.
func TestCachedInputPrices(t *testing.T) {
	t.Parallel()
	p, err := Parse([]byte(`{"m": {"input": 1, "output": 2, "cachedInput": 0.1, "batchInput": 0.5, "batchCachedInput": 0.05},
		"no-batch-cache": {"input": 1, "output": 2, "cachedInput": 0.25, "batchInput": 0.5},
		"*": {"input": 3, "output": 4}}`))
	if err != nil {
		t.Fatal(err)
	}
	u := Units{Input: 1000, CachedInput: 800, Output: 100}
	for _, c := range []struct {
		model       string
		call, batch int64
	}{
		{"m", 200*1 + 800*0.1 + 100*2, 200*0.5 + 800*0.05 + 100*2},
		{"no-batch-cache", 200*1 + 800*0.25 + 100*2, 1000*0.5 + 100*2},
		// No cached price: cached units cost what other input units cost.
		{"other", 1000*3 + 100*4, 1000*3 + 100*4},
	} {
		if got := p.Lookup(c.model).Cost(u); got != c.call {
			t.Errorf("%s: call cost %d, want %d", c.model, got, c.call)
		}
		if got := p.Lookup(c.model).Batch().Cost(u); got != c.batch {
			t.Errorf("%s: batch cost %d, want %d", c.model, got, c.batch)
		}
		if full := p.CostMicros(c.model, u.Input, u.Output); full < c.call {
			t.Errorf("%s: the reservation's price %d is below the cost %d", c.model, full, c.call)
		}
	}
	// More cached units than input units price the input units alone.
	if got, want := p.Lookup("m").Cost(Units{Input: 100, CachedInput: 500}), int64(10); got != want {
		t.Errorf("cached above input: %d, want %d", got, want)
	}
	if got, want := p.Lookup("m").Cost(Units{Input: 100, CachedInput: -5}), int64(100); got != want {
		t.Errorf("negative cached: %d, want %d", got, want)
	}
	for _, raw := range []string{`{"*": {"input": 1, "cachedInput": -0.1}}`, `{"*": {"input": 1, "batchCachedInput": -1}}`} {
		if _, err := Parse([]byte(raw)); err == nil {
			t.Errorf("a negative cached price was taken: %s", raw)
		}
	}
}
