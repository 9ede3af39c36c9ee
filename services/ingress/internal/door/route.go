package door

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"assay.dev/pkg/api"
	"assay.dev/pkg/contract"
	"assay.dev/pkg/event"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

// routes is what ingress knows of the contracts' routes, read again every
// RoutesEvery: a change reaches every instance within it.
type routes struct {
	mu     sync.RWMutex
	byKey  map[routeKey]store.Route
	loaded bool
}

type routeKey struct{ Scope, contract string }

// RefreshRoutes reads the routes again.
func (s *Door) RefreshRoutes(ctx context.Context) (bool, error) {
	rs, err := s.D.Store.Routes(ctx)
	if err != nil {
		return false, err
	}
	m := make(map[routeKey]store.Route, len(rs))
	for _, r := range rs {
		m[routeKey{r.Scope, r.Contract}] = r
	}
	s.routes.mu.Lock()
	s.routes.byKey, s.routes.loaded = m, true
	s.routes.mu.Unlock()
	return false, nil
}

// Route is the route a tenant's new work of a contract follows: its own,
// or every tenant's; ok is false when neither exists (the contract's
// default version, as it ships).
func (s *Door) Route(tenant, name string) (store.Route, bool) {
	s.routes.mu.RLock()
	defer s.routes.mu.RUnlock()
	if r, ok := s.routes.byKey[routeKey{tenant, name}]; ok {
		return r, true
	}
	r, ok := s.routes.byKey[routeKey{store.RouteAll, name}]
	return r, ok
}

// ContractFor is the contract version a tenant's new work of a contract
// is made for: the route's live version, or the default one. A route
// naming a version this build does not have leaves the default in place
// (and says so): work is never made for a version no classifier reads.
func (s *Door) ContractFor(ctx context.Context, tenant string, c *contract.Contract) (*contract.Contract, store.Variant) {
	r, ok := s.Route(tenant, c.Name)
	if !ok || r.Live.Version == "" {
		return c, store.Variant{Version: c.SchemaVersion}
	}
	v, known := s.D.Contracts.Of(c.Name, r.Live.Version)
	if !known {
		s.D.Log.WarnContext(ctx, "route names a contract version this build does not have; the default is used",
			"contract", c.Name, "scope", r.Scope, "version", r.Live.Version)
		return c, store.Variant{Version: c.SchemaVersion}
	}
	return v, r.Live
}

// ShadowSampled reports whether live work with this id is in a shadow
// share: where the id's hash falls in [0, 1), the same for every
// instance, so a sample is the same whoever takes the work.
func ShadowSampled(id string, share float64) bool {
	sum := sha256.Sum256([]byte(id))
	return float64(binary.BigEndian.Uint64(sum[:8])>>11)/float64(1<<53) < share
}

// shadow makes the shadow twin of live work a route samples: the same
// input asked of the candidate (version, model, prompt), in the batch
// lane, never published and never opening a review item; its calls are
// ledgered, marked shadow, and charged to the tenant. A twin that cannot
// be made is logged and counted; live work never waits on it.
func (s *Door) shadow(ctx context.Context, live *store.Work) {
	if live.ShadowOf != "" {
		return
	}
	r, ok := s.Route(live.TenantID, live.Contract)
	if !ok || r.Candidate.Version == "" || !ShadowSampled(live.ID, r.ShadowShare) {
		return
	}
	c, known := s.D.Contracts.Of(live.Contract, r.Candidate.Version)
	result := "made"
	defer func() {
		s.shadows.Add(ctx, 1, metric.WithAttributes(attribute.String("region", s.Cfg.Region),
			attribute.String("contract", live.Contract), attribute.String("result", result)))
	}()
	if !known {
		result = "unknown_version"
		s.D.Log.WarnContext(ctx, "a route's candidate names a contract version this build does not have; no shadow",
			"contract", live.Contract, "scope", r.Scope, "version", r.Candidate.Version)
		return
	}
	w := ShadowWork(live, c, r.Candidate)
	if d := time.Now().Add(s.Cfg.BatchDeadline); d.After(w.DeadlineAt) {
		w.DeadlineAt = d
	}
	if _, _, err := s.D.Store.InsertWork(ctx, w, s.Announcer(ctx)); err != nil {
		result = "failed"
		s.D.Log.WarnContext(ctx, "shadow work not made", "key", live.ID, "err", err)
		return
	}
	telemetry.Decision(ctx, s.D.Log, w.ID, "shadowed", "a share of live work runs with the route's candidate",
		slog.String("live", live.ID), slog.String("version", c.SchemaVersion))
}

// ShadowWork is the shadow twin of live work for a candidate variant: its
// own ingress key (the source prefixed "shadow:<version>:"), so a newer
// revision's twin supersedes an older one's and never the live work.
func ShadowWork(live *store.Work, c *contract.Contract, v store.Variant) *store.Work {
	source := "shadow:" + c.SchemaVersion + ":" + live.SourceID
	w := *live
	w.ID = api.WorkID(live.TenantID, c.Name, source, live.Revision)
	w.SourceID, w.SchemaVersion, w.TaxonomyVersion = source, c.SchemaVersion, c.TaxonomyVersion
	w.Model, w.PromptDigest, w.ShadowOf = v.Model, v.Prompt, live.ID
	w.Lane, w.SupersedeOlder = event.Batch, true
	return &w
}

// GoShadow makes the shadow twins of newly made live work, after the
// caller has its answer: a twin is a sample, and nothing live waits on it.
func (s *Door) GoShadow(ctx context.Context, made ...*store.Work) {
	sampled := false
	for _, w := range made {
		if r, ok := s.Route(w.TenantID, w.Contract); ok && r.Candidate.Version != "" && r.ShadowShare > 0 {
			sampled = true
			break
		}
	}
	if !sampled {
		return
	}
	ctx = context.WithoutCancel(ctx)
	s.Shadowing.Add(1)
	go func() {
		defer s.Shadowing.Done()
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		for _, w := range made {
			s.shadow(ctx, w)
		}
		s.Relay.Kick()
	}()
}
