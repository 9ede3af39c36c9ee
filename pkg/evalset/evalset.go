// Package evalset bundles an evaluation set per contract, for rollout
// checks, tests, demos and benchmarks. The code-review set is realistic
// e-commerce pull-request diffs, each a git-format unified diff with known
// issues (or, for the clean ones, none); the change-review set is changes
// with the risk tags and severity they carry (changes.go); the moderation
// set is short user texts with their verdicts (moderation.go). [For] gives
// any of them as a [Set] of inputs with a rubric.
//
// The issues are data, not prose: expected.json lists, per item, the findings
// a correct reviewer must report and the ones it may report without being
// wrong, and [ScoreItem] and [Totals] score a review against them.
package evalset

import (
	"bytes"
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"
)

//go:embed diffs/*.diff
var files embed.FS

// expectedJSON maps each item's name to its expected and acceptable
// findings.
//
//go:embed expected.json
var expectedJSON []byte

// Item is one pull request of the set.
type Item struct {
	Name     string // file name without ".diff", e.g. "05-checkout-state"
	Title    string
	Diff     string
	SourceID string // owner/repo#number
	Revision string // head SHA: 40 hex digits derived from the diff, so stable
	// Expect lists the issues a correct reviewer must report; it is empty
	// for the items in Clean and non-empty for every other item.
	Expect []Expect
	// Extras lists findings a reviewer may report without being wrong,
	// such as a second site of an expected issue or a minor point.
	Extras []Extra
}

// Expect is one issue a correct reviewer must report. File is the new path
// (as after "b/" in the diff); From and To are new-file line numbers, both
// inclusive, of a block of added lines; Category is one of Categories;
// Reason says in one sentence what is wrong.
type Expect struct {
	File     string
	From, To int
	Category string
	Reason   string
}

// Extra is a finding a reviewer may report without being wrong, placed like
// an Expect but with no category.
type Extra struct {
	File     string
	From, To int
	Reason   string
}

// Categories is the closed set of finding categories, the same as the
// code-review contract's (schemaVersion 2) "category" enum.
var Categories = []string{"correctness", "security", "data-integrity", "money", "concurrency", "maintainability"}

// meta holds what a diff file cannot: the pull request's title and origin.
var meta = map[string]struct{ title, source string }{
	"01-price-float":            {"Add reseller markup and bulk pricing to products", "shop/catalog#112"},
	"02-cart-subtotal-discount": {"Show promotion discount in cart totals", "shop/storefront#287"},
	"03-inventory-reserve":      {"Reserve stock when an order is placed", "shop/inventory#54"},
	"04-tax-display":            {"Show regional tax in the checkout summary", "shop/storefront#301"},
	"05-checkout-state":         {"Mark orders paid on confirmation and shipped from the warehouse", "shop/checkout#41"},
	"06-refund-flow":            {"Add refunds to the payment service", "shop/payments#77"},
	"07-coupon-twice":           {"Let customers redeem coupon codes at checkout", "shop/checkout#58"},
	"08-order-search-sql":       {"Back-office order search by email and status", "shop/backoffice#19"},
	"09-currency-format-fix":    {"Fix cents padding and currency symbols in price formatting", "shop/checkout#63"},
	"10-shipping-fee":           {"Free shipping threshold and remote-region surcharge", "shop/fulfillment#35"},
	"11-payment-webhook":        {"Handle payment_intent.succeeded webhooks", "shop/payments#82"},
	"12-reserve-with-check":     {"Atomic stock hold with availability check", "shop/inventory#61"},
}

// Clean names the items a correct reviewer finds nothing in.
var Clean = []string{"09-currency-format-fix", "12-reserve-with-check"}

// Items returns the set in file-name order, each item with its expected and
// acceptable findings. It panics if the embedded files, their metadata and
// expected.json disagree (an item without an entry, an entry for an unknown
// item, a category outside Categories, a malformed range), which tests guard
// against.
func Items() []Item {
	paths, err := fs.Glob(files, "diffs/*.diff")
	if err != nil {
		panic(err)
	}
	slices.Sort(paths)
	names := make([]string, len(paths))
	for i, p := range paths {
		names[i] = strings.TrimSuffix(path.Base(p), ".diff")
	}
	expected, err := parseExpected(expectedJSON, names)
	if err != nil {
		panic(err)
	}
	out := make([]Item, 0, len(paths))
	for i, p := range paths {
		b, err := files.ReadFile(p)
		if err != nil {
			panic(err)
		}
		name := names[i]
		m, ok := meta[name]
		if !ok {
			panic("evalset: no metadata for " + name)
		}
		sum := sha1.Sum(b)
		e := expected[name]
		out = append(out, Item{
			Name: name, Title: m.title, Diff: string(b), SourceID: m.source, Revision: hex.EncodeToString(sum[:]),
			Expect: e.expect, Extras: e.extras,
		})
	}
	return out
}

// rawFinding is one entry of expected.json. Category is required for an
// expected finding; on an acceptable one it may be given, is checked, and is
// not kept.
type rawFinding struct {
	File     string `json:"file"`
	Lines    []int  `json:"lines"`
	Category string `json:"category"`
	Reason   string `json:"reason"`
}

type rawItem struct {
	Expect     []rawFinding `json:"expect"`
	Acceptable []rawFinding `json:"acceptable"`
}

type itemFindings struct {
	expect []Expect
	extras []Extra
}

// parseExpected decodes expected.json and checks it against the item names:
// exactly one entry per item, known fields only, categories from Categories,
// and for every finding a file, a reason and a range [from, to] with
// 1 <= from <= to.
func parseExpected(data []byte, names []string) (map[string]itemFindings, error) {
	var raw map[string]rawItem
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("evalset: expected.json: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("evalset: expected.json: data after the top-level object")
	}
	out := make(map[string]itemFindings, len(raw))
	for name, ri := range raw {
		if !slices.Contains(names, name) {
			return nil, fmt.Errorf("evalset: expected.json names unknown item %q", name)
		}
		var f itemFindings
		for i, r := range ri.Expect {
			where := fmt.Sprintf("%s expect[%d]", name, i)
			if err := r.check(where, true); err != nil {
				return nil, err
			}
			f.expect = append(f.expect, Expect{File: r.File, From: r.Lines[0], To: r.Lines[1], Category: r.Category, Reason: r.Reason})
		}
		for i, r := range ri.Acceptable {
			where := fmt.Sprintf("%s acceptable[%d]", name, i)
			if err := r.check(where, false); err != nil {
				return nil, err
			}
			f.extras = append(f.extras, Extra{File: r.File, From: r.Lines[0], To: r.Lines[1], Reason: r.Reason})
		}
		out[name] = f
	}
	for _, n := range names {
		if _, ok := raw[n]; !ok {
			return nil, fmt.Errorf("evalset: expected.json has no entry for %q", n)
		}
	}
	return out, nil
}

func (r rawFinding) check(where string, needCategory bool) error {
	switch {
	case r.File == "":
		return fmt.Errorf("evalset: expected.json: %s: no file", where)
	case len(r.Lines) != 2 || r.Lines[0] < 1 || r.Lines[1] < r.Lines[0]:
		return fmt.Errorf("evalset: expected.json: %s: lines %v, want [from, to] with 1 <= from <= to", where, r.Lines)
	case strings.TrimSpace(r.Reason) == "":
		return fmt.Errorf("evalset: expected.json: %s: no reason", where)
	case needCategory && r.Category == "":
		return fmt.Errorf("evalset: expected.json: %s: no category", where)
	case r.Category != "" && !slices.Contains(Categories, r.Category):
		return fmt.Errorf("evalset: expected.json: %s: bad category %q", where, r.Category)
	}
	return nil
}
