package event

// CapacityBucket is the key-value bucket where the cell's classifier
// instances report its capacity (one key per instance) and ingress reads
// it, e.g. assay_capacity_us.
func (n Names) CapacityBucket() string { return n.inst() + "_capacity_" + n.Cell }

// AdmitBucket is the key-value bucket holding the cell's shared ingress
// token buckets (one key per tenant and lane), e.g. assay_admit_us.
func (n Names) AdmitBucket() string { return n.inst() + "_admit_" + n.Cell }

// AdmitKey is the key of a tenant's ingress bucket for a lane.
func AdmitKey(tenant, lane string) string { return "rate." + tenant + "." + lane }

// CallsBucket is the key-value bucket holding the cell's model-call slots,
// which every classifier instance of the cell takes one of per call, e.g.
// assay_calls_us.
func (n Names) CallsBucket() string { return n.inst() + "_calls_" + n.Cell }

// PlacementBucket is the key-value bucket of a region's placement map:
// which of the region's cells serves each tenant, and where each cell
// answers, e.g. assay_placement_us. It is the region's, not a cell's: every
// cell of the region reads the same one.
func (n Names) PlacementBucket(region string) string { return n.inst() + "_placement_" + region }

// GitHubBucket is the key-value bucket of GitHub write budgets: per App
// installation, the content-creating requests made in the last hour and a
// hold GitHub imposed. A region's (e.g. assay_github_us, in the region's
// account) is drawn from by every publisher of the region; a cell's (named
// after the cell, in its own account) by the cell's committer replicas.
func (n Names) GitHubBucket(where string) string { return n.inst() + "_github_" + where }
