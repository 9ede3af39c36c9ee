package sim_test

import (
	"encoding/json"
	"math"
	"slices"
	"testing"

	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/diff"
	"assay.dev/pkg/evalset"
)

// TestReviewerOnSet pins what the simulated reviewer finds, so a change to
// either the rules or the set shows up here.
func TestReviewerOnSet(t *testing.T) {
	want := map[string][]string{
		"01-price-float":            {sim.RuleMoneyFloat},
		"02-cart-subtotal-discount": {sim.RuleMoneyFloat, sim.RuleCouponReuse},
		"03-inventory-reserve":      {sim.RuleStockUnchecked},
		"04-tax-display":            {sim.RuleTaxUnrounded},
		"05-checkout-state":         {sim.RuleStateUnguarded},
		"06-refund-flow":            {sim.RuleMoneyFloat, sim.RuleStateUnguarded},
		"07-coupon-twice":           {sim.RuleCouponReuse},
		"08-order-search-sql":       {sim.RuleSQLConcat},
		"10-shipping-fee":           {sim.RuleMoneyFloat},
		"11-payment-webhook":        {sim.RuleMoneyFloat, sim.RuleStateUnguarded},
	}
	withFindings := 0
	for _, it := range evalset.Items() {
		fs := sim.Review(it.Diff)
		if len(fs) > 0 {
			withFindings++
		}
		d, err := diff.Parse(it.Diff)
		if err != nil {
			t.Fatal(err)
		}
		rules := map[string]bool{}
		for _, f := range fs {
			rules[f.Rule] = true
			file := d.File(f.File)
			if file == nil || !file.InHunk(f.Line) || !file.Contains(f.Evidence) {
				t.Errorf("%s: ungrounded finding %+v", it.Name, f)
			}
		}
		if slices.Contains(evalset.Clean, it.Name) {
			if len(fs) != 0 {
				t.Errorf("%s is clean but got %+v", it.Name, fs)
			}
			continue
		}
		var got []string
		for r := range rules {
			got = append(got, r)
		}
		slices.Sort(got)
		w := slices.Clone(want[it.Name])
		slices.Sort(w)
		if !slices.Equal(got, w) {
			for _, f := range fs {
				t.Logf("%s: %s:%d %s %q", it.Name, f.File, f.Line, f.Rule, f.Evidence)
			}
			t.Errorf("%s: rules %v, want %v", it.Name, got, w)
		}
	}
	if withFindings < 8 {
		t.Errorf("only %d items with findings, want at least 8", withFindings)
	}
}

// The simulated reviewer is the baseline a rollout is measured against: its
// scores on the set are pinned here.
func TestSimulatedReviewerBaseline(t *testing.T) {
	items := evalset.Items()
	var scores []evalset.Score
	for _, it := range items {
		out, err := json.Marshal(sim.ReviewCode(it.Diff, json.RawMessage("1"), "w"))
		if err != nil {
			t.Fatal(err)
		}
		fs, err := evalset.Findings(out)
		if err != nil {
			t.Fatal(err)
		}
		s := evalset.ScoreItem(it, fs)
		scores = append(scores, s)
		for _, m := range s.Missed {
			t.Logf("%s: missed %s:%d-%d %s", it.Name, m.File, m.From, m.To, m.Category)
		}
	}
	tot := evalset.Totals(scores)
	t.Logf("baseline: recall %.3f (%d of %d), precision %.3f (%d of %d found)", tot.Recall, tot.Matched, tot.Expected, tot.Precision, tot.Useful, tot.Found)
	if tot.Expected != 18 || tot.Matched != 14 || tot.Found != 18 || tot.Useful != 18 {
		t.Errorf("the simulated reviewer matched %d of %d expected issues with %d of %d findings useful; pinned at 14 of 18 and 18 of 18",
			tot.Matched, tot.Expected, tot.Useful, tot.Found)
	}
}

// The simulated reviewer's scores on the change-review and moderation
// sets are pinned too: they are the baseline of those contracts' rollouts.
func TestSimulatedReviewerOtherSetsBaseline(t *testing.T) {
	var tags, severity float64
	for _, c := range evalset.Changes() {
		out, err := json.Marshal(sim.ReviewChange(c.Diff, json.RawMessage(`"change-review.v1"`)))
		if err != nil {
			t.Fatal(err)
		}
		a, err := evalset.ReadChange(out)
		if err != nil {
			t.Fatal(err)
		}
		s := evalset.ScoreChange(c, &a)
		tags += s.Tags
		severity += s.Severity
		if s.Severity == 0 {
			t.Logf("%s: severity %s, want %s", c.Name, a.Severity, c.Severity)
		}
	}
	if severity != 7 || math.Abs(tags-10.8) > 1e-9 {
		t.Errorf("change-review: severity right on %.0f of 12, tags F1 summing to %.3f; pinned at 7 and 10.8", severity, tags)
	}
	var category, human float64
	for _, p := range evalset.Posts() {
		m := sim.Moderate(p.Text)
		s := evalset.ScorePost(p, &evalset.Verdict{Category: m.Category, NeedsHumanReview: m.NeedsHumanReview})
		category += s.Category
		human += s.HumanReview
	}
	if category != 10 || human != 9 {
		t.Errorf("moderation: category right on %.0f of 12, human review on %.0f; pinned at 10 and 9", category, human)
	}
}
