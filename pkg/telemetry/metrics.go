package telemetry

import (
	"sync"

	"go.opentelemetry.io/otel/metric"
)

// LatencyBuckets are the bounds, in seconds, of every assay latency
// histogram: from a fast claim (5 ms) to a batch item's day.
var LatencyBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 21600, 86400}

// Seconds is a latency histogram in seconds with LatencyBuckets.
func (p *Provider) Seconds(name, description string) (metric.Float64Histogram, error) {
	return p.meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(description),
		metric.WithExplicitBucketBoundaries(LatencyBuckets...))
}

// OtherTenants is the tenant label of every tenant past the cap.
const OtherTenants = "other"

// DefaultTenantLabels is how many tenants get a label of their own when
// ASSAY_METRICS_TENANTS is unset.
const DefaultTenantLabels = 20

// tenantLabels hands out tenant labels: the tenants it was given (the
// cell's first max tenants, in the order the cell's database added them)
// by their id, every other as OtherTenants, so a series count stays
// bounded however many tenants a cell serves. The rule is the database's,
// not this process's: every replica of a service, and every service of
// the cell, labels a tenant alike, whatever order they meet tenants in.
// Before a list is given every tenant is OtherTenants. Exact per-tenant
// figures are the ledger's.
type tenantLabels struct {
	mu  sync.RWMutex
	max int
	own map[string]bool
}

func (t *tenantLabels) label(id string) string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.own[id] {
		return id
	}
	return OtherTenants
}

func (t *tenantLabels) set(ids []string) {
	own := make(map[string]bool, min(len(ids), t.max))
	for _, id := range ids[:min(len(ids), t.max)] {
		own[id] = true
	}
	t.mu.Lock()
	t.own = own
	t.mu.Unlock()
}

// Tenant is the label tenant id gets in this process's metrics.
func (p *Provider) Tenant(id string) string { return p.tenants.label(id) }

// TenantLabels is how many tenants may have a label of their own.
func (p *Provider) TenantLabels() int { return p.tenants.max }

// LabelTenants gives the first TenantLabels() of ids a label of their own
// and every other tenant OtherTenants. ids are the cell's tenants in the
// order its database added them (store.FirstTenants), so every process of
// the cell labels alike.
func (p *Provider) LabelTenants(ids []string) { p.tenants.set(ids) }
