// Package ingress is the front door of a cell: it authenticates the caller,
// takes the tenant and region from the credential, applies the ingress fence
// and enqueues through the transactional outbox.
package ingress

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"assay.dev/pkg/apierror"
	"assay.dev/pkg/event"
	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
	"assay.dev/pkg/usage"
	"assay.dev/schemas"
	"assay.dev/services/ingress/internal/batches"
	"assay.dev/services/ingress/internal/console"
	"assay.dev/services/ingress/internal/desk"
	"assay.dev/services/ingress/internal/diffs"
	"assay.dev/services/ingress/internal/door"
	"assay.dev/services/ingress/internal/request"
	"assay.dev/services/ingress/internal/settings"
	"assay.dev/services/ingress/internal/shed"
	"assay.dev/services/ingress/internal/webhook"
	"assay.dev/services/ingress/internal/workapi"
)

// Service is one ingress instance: the door every room shares, and the
// rooms, each serving its part of the API.
type Service struct {
	*door.Door
	work    *workapi.Room
	batches *batches.Room
	webhook *webhook.Room
	console *console.Room
	desk    *desk.Room
	sweeper lifecycle.Ticker
	janitor lifecycle.Ticker
	watcher lifecycle.Ticker
	router  lifecycle.Ticker
}

// Config of one ingress instance.
type Config = settings.Config

// Deps are what ingress talks to.
type Deps = door.Deps

// Store is what ingress asks of the cell's database; *store.Store is one.
type Store = door.Store

// JetStream is what ingress asks of NATS JetStream; a
// jetstream.JetStream is one.
type JetStream = door.JetStream

// ShedConfig is capacity admission and the shared rate.
type ShedConfig = shed.Config

// GitHubDiffs fetches pull requests' diffs from GitHub's REST API; PullRef
// names one pull request.
type (
	GitHubDiffs = diffs.GitHubDiffs
	PullRef     = diffs.PullRef
	DiffSource  = diffs.DiffSource
)

// Vars are the settings Config.FromEnv reads, for ingress's help.
var Vars = settings.Vars

// The headers of a request sent on between the cells of a region.
const (
	ForwardedBy = door.ForwardedBy
	ServedBy    = door.ServedBy
)

// MaxDiffCeiling is the most ASSAY_MAX_DIFF_BYTES may be.
const MaxDiffCeiling = settings.MaxDiffCeiling

// ShadowSampled reports whether live work with this id is in a shadow
// share (door.ShadowSampled).
func ShadowSampled(id string, share float64) bool { return door.ShadowSampled(id, share) }

// New checks the config and builds the service.
func New(cfg Config, d Deps) (*Service, error) {
	dr, err := door.New(cfg, d)
	if err != nil {
		return nil, err
	}
	s := &Service{Door: dr, work: &workapi.Room{Door: dr}, batches: &batches.Room{Door: dr}, webhook: &webhook.Room{Door: dr},
		console: &console.Room{Door: dr}, desk: &desk.Room{Door: dr}}
	cfg = dr.Cfg
	sw := &s.sweeper
	sw.Name, sw.Every, sw.Log, sw.PassTimeout = "sweeper", cfg.SweepEvery, d.Log, time.Minute
	sw.Pass = func(ctx context.Context) (bool, error) { return false, s.SweepOnce(ctx) }
	jn := &s.janitor
	jn.Name, jn.Every, jn.Log, jn.PassTimeout = "retention", 10*time.Minute, d.Log, 5*time.Minute
	jn.Pass = s.purge
	wt := &s.watcher
	wt.Name, wt.Every, wt.Log, wt.PassTimeout = "watch", cfg.WatchEvery, d.Log, time.Minute
	wt.Pass = s.Sample
	rt := &s.router
	rt.Name, rt.Every, rt.Log, rt.PassTimeout = "routes", cfg.RoutesEvery, d.Log, 30*time.Second
	rt.Pass = s.RefreshRoutes
	return s, nil
}

// Start creates the cell's WORK stream, which ingress owns, and runs the
// outbox relay and the sweeper.
func (s *Service) Start(ctx context.Context) error {
	s.Relay.MaxPayload = s.D.JS.Conn().MaxPayload()
	// The routes are read once before work is taken, then every
	// RoutesEvery; a database that does not answer yet leaves the defaults
	// until it does.
	if _, err := s.RefreshRoutes(ctx); err != nil {
		s.D.Log.WarnContext(ctx, "routes not read yet; new work gets the contracts' default versions until they are", "err", err)
	}
	parts := append(s.Parts(), &s.sweeper, &s.janitor, &s.watcher, &s.router)
	return lifecycle.StartAll(ctx, parts...)
}

// Stop ends the sweeper, then the relay after a last drain. Idempotent.
func (s *Service) Stop(ctx context.Context) {
	parts := []lifecycle.Service{&s.router, &s.watcher, &s.janitor, &s.sweeper}
	back := s.Parts()
	slices.Reverse(back)
	parts = append(parts, back...)
	s.Shadowing.Wait()
	lifecycle.StopAll(ctx, parts...)
}

// purge is one pass of the cell's retention: published outbox rows past
// OutboxRetention, inputs and raw answers of work that ended more than
// DataRetention ago. A full batch asks for another pass at once.
func (s *Service) purge(ctx context.Context) (bool, error) {
	const batch = 5000
	p, err := s.D.Store.Purge(ctx, store.Retention{Outbox: s.Cfg.OutboxRetention, Data: s.Cfg.DataRetention, Limit: batch})
	if err != nil {
		return false, err
	}
	if p.Outbox+p.Inputs+p.Answers > 0 {
		s.D.Log.Info("retention: removed what the cell no longer keeps", "outbox_rows", p.Outbox,
			"work_inputs", p.Inputs, "raw_answers", p.Answers)
	}
	return p.Outbox == batch || p.Inputs == batch || p.Answers == batch, nil
}

// Ready reports whether the service can take work: its database answers
// and the WORK stream exists.
func (s *Service) Ready(ctx context.Context) error {
	if err := s.D.Store.Ping(ctx); err != nil {
		return err
	}
	return s.Streams.Ready(ctx)
}

// SweepOnce runs one pass of the sweeper, a lifecycle.Ticker: work past its
// deadline ends expired, then work that sits queued with no live attempt,
// or whose lease expired, is announced again. A lost broker message delays
// work; it never loses it.
func (s *Service) SweepOnce(ctx context.Context) error {
	expired, err := s.D.Store.ExpireOverdue(ctx, s.Cfg.LeaseGrace, 500)
	if err != nil {
		return err
	}
	for _, w := range expired {
		telemetry.Decision(ctx, s.D.Log, w.ID, outcome.Expired, w.Reason, slog.String("tenant", w.TenantID), slog.String("lane", w.Lane))
	}
	sw := store.Sweep{QueuedFor: s.Cfg.QueuedFor, LeaseGrace: s.Cfg.LeaseGrace, Heads: s.backlogHeads(ctx), Limit: 500}
	stuck, err := s.D.Store.SweepStuck(ctx, sw, func(st store.Stuck) (store.OutboxMsg, error) {
		// The new announcement is a trace of its own, linked to the one
		// the work began in.
		var opts []trace.SpanStartOption
		if l, ok := telemetry.Link(st.Work.Traceparent); ok {
			opts = append(opts, trace.WithLinks(l))
		}
		actx, span := s.D.Tel.Tracer().Start(context.WithoutCancel(ctx), "ingress.reannounce", append(opts,
			trace.WithNewRoot(), trace.WithAttributes(attribute.String("assay.work_id", st.Work.ID), attribute.Int("assay.dispatch", st.Dispatch)))...)
		defer span.End()
		return WorkMessage(actx, s.Cfg.Names, st.Work, st.Dispatch)
	})
	if err != nil {
		return err
	}
	for _, st := range stuck {
		reason := "queued longer than " + s.Cfg.QueuedFor.String() + " with no announcement waiting"
		if st.Redrive {
			reason = "lease expired"
		}
		telemetry.Decision(ctx, s.D.Log, st.Work.ID, "requeued", reason, slog.Int("dispatch", st.Dispatch))
	}
	if len(stuck) > 0 {
		s.Relay.Kick()
	}
	return nil
}

// backlogHeads reads, for each lane, since when its consumer holds
// announcements it has not finished with: the time of the first message
// after its ack floor. Every message from there on is either waiting to be
// delivered or in a worker's hands unacknowledged (held for its tenant's
// turn, delayed for a retry, or with a worker that died, and then
// redelivered after the ack wait), so the work it announces is not lost,
// however long the backlog. Queued work announced before then has no
// message left (it was acknowledged, or the broker lost it) and is
// announced again. A message reaches the stream a little after its work
// row was written (the relay's lag), so the head is moved back by
// QueuedFor: the head message's own work is never taken for lost, and
// work lost just before it is found once the head moves on. A lane whose
// consumer cannot be read, or that holds nothing, counts as caught up.
func (s *Service) backlogHeads(ctx context.Context) map[string]time.Time {
	heads := map[string]time.Time{}
	stream := s.Cfg.Names.Stream(event.KindWork)
	for _, lane := range event.Lanes {
		cons, err := s.D.JS.Consumer(ctx, stream, s.Cfg.Names.WorkConsumer(lane))
		if err != nil {
			continue
		}
		info := cons.CachedInfo()
		if info.NumPending == 0 && info.NumAckPending == 0 {
			continue
		}
		st, err := s.D.JS.Stream(ctx, stream)
		if err != nil {
			continue
		}
		next, err := st.GetMsg(ctx, info.AckFloor.Stream+1, jetstream.WithGetMsgSubject(s.Cfg.Names.Lane(lane)))
		if err != nil {
			continue
		}
		heads[lane] = next.Time.Add(-s.Cfg.QueuedFor)
	}
	return heads
}

// Handler serves the ingress API. A path that is not text is refused
// before it is routed (request.TextPaths).
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, e := range s.endpoints(usage.Handler(s.D.Store, s.Cell(), s.D.Log, func(w http.ResponseWriter, r *http.Request, t store.Tenant, refused *apierror.Error) {
		s.RefuseOrSendOn(w, r, t, refused, nil)
	})) {
		mux.Handle(e.Pattern, e.Handler)
	}
	return request.TextPaths(mux)
}

// Routes is every "METHOD /path" the ingress API serves: what its OpenAPI
// description (schemas/openapi.yaml) must describe, no more and no less.
func Routes() []string {
	var out []string
	for _, e := range (&Service{}).endpoints(nil) {
		out = append(out, e.Pattern)
	}
	return out
}

// endpoints are the rooms' operations, the usage report (usageReport) and
// the API's description.
func (s *Service) endpoints(usageReport http.Handler) []door.Endpoint {
	var out []door.Endpoint
	for _, r := range []interface{ Endpoints() []door.Endpoint }{s.work, s.batches, s.webhook, s.console, s.desk} {
		out = append(out, r.Endpoints()...)
	}
	return append(out,
		// The ledger's rows are in the cell's database: the usage report is
		// read here too, so a cell has one base URL.
		door.Endpoint{Pattern: "GET /v1/usage", Handler: usageReport},
		door.Endpoint{Pattern: "GET /v1/openapi.yaml", Handler: http.HandlerFunc(openAPI)},
	)
}

// openAPI serves the API's description, to anyone: it holds no secret.
func openAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(schemas.OpenAPI)
}
