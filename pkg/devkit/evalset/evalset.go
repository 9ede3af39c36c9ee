// Package evalset bundles an evaluation set of realistic e-commerce
// pull-request diffs, each a git-format unified diff with known issues (or,
// for the clean ones, none), for tests, demos and benchmarks.
package evalset

import (
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"io/fs"
	"path"
	"slices"
	"strings"
)

//go:embed diffs/*.diff
var files embed.FS

// Item is one pull request of the set.
type Item struct {
	Name     string // file name without ".diff", e.g. "05-checkout-state"
	Title    string
	Diff     string
	SourceID string // owner/repo#number
	Revision string // head SHA: 40 hex digits derived from the diff, so stable
}

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

// Items returns the set in file-name order. It panics if the embedded files
// and their metadata disagree, which a test guards against.
func Items() []Item {
	names, err := fs.Glob(files, "diffs/*.diff")
	if err != nil {
		panic(err)
	}
	slices.Sort(names)
	out := make([]Item, 0, len(names))
	for _, n := range names {
		b, err := files.ReadFile(n)
		if err != nil {
			panic(err)
		}
		name := strings.TrimSuffix(path.Base(n), ".diff")
		m, ok := meta[name]
		if !ok {
			panic("evalset: no metadata for " + name)
		}
		sum := sha1.Sum(b)
		out = append(out, Item{Name: name, Title: m.title, Diff: string(b), SourceID: m.source, Revision: hex.EncodeToString(sum[:])})
	}
	return out
}
