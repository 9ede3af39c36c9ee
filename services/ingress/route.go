package ingress

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

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

type routeKey struct{ scope, contract string }

// refreshRoutes reads the routes again.
func (s *Service) refreshRoutes(ctx context.Context) (bool, error) {
	rs, err := s.d.Store.Routes(ctx)
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

// route is the route a tenant's new work of a contract follows: its own,
// or every tenant's; ok is false when neither exists (the contract's
// default version, as it ships).
func (s *Service) route(tenant, name string) (store.Route, bool) {
	s.routes.mu.RLock()
	defer s.routes.mu.RUnlock()
	if r, ok := s.routes.byKey[routeKey{tenant, name}]; ok {
		return r, true
	}
	r, ok := s.routes.byKey[routeKey{store.RouteAll, name}]
	return r, ok
}

// contractFor is the contract version a tenant's new work of a contract
// is made for: the route's live version, or the default one. A route
// naming a version this build does not have leaves the default in place
// (and says so): work is never made for a version no classifier reads.
func (s *Service) contractFor(ctx context.Context, tenant string, c *contract.Contract) (*contract.Contract, store.Variant) {
	r, ok := s.route(tenant, c.Name)
	if !ok || r.Live.Version == "" {
		return c, store.Variant{Version: c.SchemaVersion}
	}
	v, known := s.d.Contracts.Of(c.Name, r.Live.Version)
	if !known {
		s.d.Log.WarnContext(ctx, "route names a contract version this build does not have; the default is used",
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
func (s *Service) shadow(ctx context.Context, live *store.Work) {
	if live.ShadowOf != "" {
		return
	}
	r, ok := s.route(live.TenantID, live.Contract)
	if !ok || r.Candidate.Version == "" || !ShadowSampled(live.ID, r.ShadowShare) {
		return
	}
	c, known := s.d.Contracts.Of(live.Contract, r.Candidate.Version)
	result := "made"
	defer func() {
		s.shadows.Add(ctx, 1, metric.WithAttributes(attribute.String("region", s.cfg.Region),
			attribute.String("contract", live.Contract), attribute.String("result", result)))
	}()
	if !known {
		result = "unknown_version"
		s.d.Log.WarnContext(ctx, "a route's candidate names a contract version this build does not have; no shadow",
			"contract", live.Contract, "scope", r.Scope, "version", r.Candidate.Version)
		return
	}
	w := ShadowWork(live, c, r.Candidate)
	if d := time.Now().Add(s.cfg.BatchDeadline); d.After(w.DeadlineAt) {
		w.DeadlineAt = d
	}
	if _, _, err := s.d.Store.InsertWork(ctx, w, s.announce(ctx)); err != nil {
		result = "failed"
		s.d.Log.WarnContext(ctx, "shadow work not made", "key", live.ID, "err", err)
		return
	}
	telemetry.Decision(ctx, s.d.Log, w.ID, "shadowed", "a share of live work runs with the route's candidate",
		slog.String("live", live.ID), slog.String("version", c.SchemaVersion))
}

// ShadowWork is the shadow twin of live work for a candidate variant: its
// own ingress key (the source prefixed "shadow:<version>:"), so a newer
// revision's twin supersedes an older one's and never the live work.
func ShadowWork(live *store.Work, c *contract.Contract, v store.Variant) *store.Work {
	source := "shadow:" + c.SchemaVersion + ":" + live.SourceID
	w := *live
	w.ID = WorkID(live.TenantID, c.Name, source, live.Revision)
	w.SourceID, w.SchemaVersion, w.TaxonomyVersion = source, c.SchemaVersion, c.TaxonomyVersion
	w.Model, w.PromptDigest, w.ShadowOf = v.Model, v.Prompt, live.ID
	w.Lane, w.SupersedeOlder = event.Batch, true
	return &w
}

// goShadow makes the shadow twins of newly made live work, after the
// caller has its answer: a twin is a sample, and nothing live waits on it.
func (s *Service) goShadow(ctx context.Context, made ...*store.Work) {
	sampled := false
	for _, w := range made {
		if r, ok := s.route(w.TenantID, w.Contract); ok && r.Candidate.Version != "" && r.ShadowShare > 0 {
			sampled = true
			break
		}
	}
	if !sampled {
		return
	}
	ctx = context.WithoutCancel(ctx)
	s.shadowing.Add(1)
	go func() {
		defer s.shadowing.Done()
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		for _, w := range made {
			s.shadow(ctx, w)
		}
		s.relay.Kick()
	}()
}
