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

// tenantLabels hands out tenant labels, the first max tenants seen by
// their id and the rest as OtherTenants, so a series count stays bounded
// however many tenants a cell serves. Exact per-tenant figures are the
// ledger's.
type tenantLabels struct {
	mu   sync.Mutex
	max  int
	seen map[string]bool
}

func (t *tenantLabels) label(id string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.seen[id] {
		return id
	}
	if len(t.seen) >= t.max {
		return OtherTenants
	}
	t.seen[id] = true
	return id
}

// Tenant is the label tenant id gets in this process's metrics.
func (p *Provider) Tenant(id string) string { return p.tenants.label(id) }
