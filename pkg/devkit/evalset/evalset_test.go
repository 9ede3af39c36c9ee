package evalset_test

import (
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"assay.dev/pkg/devkit/evalset"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/diff"
)

var (
	hexRe    = regexp.MustCompile(`^[0-9a-f]{40}$`)
	sourceRe = regexp.MustCompile(`^[\w.-]+/[\w.-]+#[0-9]+$`)
)

func TestItemsParseAndLookReal(t *testing.T) {
	items := evalset.Items()
	if len(items) < 10 {
		t.Fatalf("%d items, want at least 10", len(items))
	}
	if !slices.IsSortedFunc(items, func(a, b evalset.Item) int { return strings.Compare(a.Name, b.Name) }) {
		t.Error("items not in name order")
	}
	again := evalset.Items()
	exts := map[string]bool{}
	for i, it := range items {
		if !reflect.DeepEqual(it, again[i]) {
			t.Errorf("%s: Items() not deterministic", it.Name)
		}
		if it.Title == "" || !sourceRe.MatchString(it.SourceID) || !hexRe.MatchString(it.Revision) {
			t.Errorf("%s: bad metadata %q %q %q", it.Name, it.Title, it.SourceID, it.Revision)
		}
		if !strings.HasPrefix(it.Diff, "diff --git ") {
			t.Errorf("%s: not in git format", it.Name)
		}
		if n := strings.Count(strings.TrimRight(it.Diff, "\n"), "\n") + 1; n < 15 || n > 60 {
			t.Errorf("%s: %d lines, want 15-60", it.Name, n)
		}
		d, err := diff.Parse(it.Diff)
		if err != nil {
			t.Errorf("%s: %v", it.Name, err)
			continue
		}
		for _, f := range d.Files {
			if len(f.Hunks) == 0 || len(f.Added()) == 0 {
				t.Errorf("%s: %s has no added lines", it.Name, f.Path)
			}
			exts[f.Path[strings.LastIndex(f.Path, ".")+1:]] = true
		}
	}
	for _, e := range []string{"go", "ts", "py"} {
		if !exts[e] {
			t.Errorf("no .%s file in the set", e)
		}
	}
	seen := map[string]bool{}
	for _, it := range items {
		if seen[it.Revision] {
			t.Errorf("%s: duplicate revision", it.Name)
		}
		seen[it.Revision] = true
	}
}

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
