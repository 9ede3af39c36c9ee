// Package door is what every room of ingress shares: who the caller is
// (its token, its tenant and which cell of the region serves it, sending
// the request on when another does), whether the cell takes the work now
// (the tenant's rate, the cell's capacity, the tenant's backlog), the one
// way a work row is made from a request (its contract version by route,
// its shadow twin) and the answers every room writes alike.
package door

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"assay.dev/pkg/admission"
	"assay.dev/pkg/api"
	"assay.dev/pkg/apierror"
	"assay.dev/pkg/auth"
	"assay.dev/pkg/contract"
	"assay.dev/pkg/event"
	"assay.dev/pkg/group"
	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/outbox"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/placement"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
	"assay.dev/services/ingress/internal/settings"
)

// Door is one ingress instance's shared parts, which each room embeds.
type Door struct {
	Cfg     settings.Config
	D       Deps
	Streams *event.Keeper
	Relay   *outbox.Relay
	// Inserts writes the work of concurrent submissions in one statement.
	Inserts *group.Batch[store.InsertReq, store.WorkInserted]
	routes  routes
	// Shadowing counts the shadow twins being made; Stop waits for them.
	Shadowing sync.WaitGroup
	watched   watch
	Open      OpenStreams

	Requests metric.Int64Counter
	Webhooks metric.Int64Counter
	Dropped  metric.Int64Counter
	shadows  metric.Int64Counter
	buckets  *admission.Buckets
	Tokens   *auth.Cache
	Tenants  *tenantWatch // keeps tokens told of changes; nil when the store cannot
	place    *placement.View
	shed     *shedder

	// EventStreams counts the work and batch event streams per tenant.
	EventStreams OpenStreams
}

// Cell is who ingress authenticates for.
func (s *Door) Cell() auth.Cell {
	return auth.Cell{Region: s.Cfg.Region, ID: s.Cfg.Names.Cell, ServedBy: s.serving}
}

// Announcer makes the outbox rows that announce newly queued work.
func (s *Door) Announcer(ctx context.Context) func(*store.Work) ([]store.OutboxMsg, error) {
	return outbox.Announce(ctx, s.Cfg.Names)
}

// LogSuperseded records the supersede decision for each older work item.
func (s *Door) LogSuperseded(ctx context.Context, w *store.Work) {
	running := map[string]bool{}
	for _, id := range w.SupersededRunning {
		running[id] = true
	}
	for _, id := range w.Superseded {
		why := "revision " + w.Revision + " arrived"
		if running[id] {
			why += "; its running model call is canceled"
		}
		telemetry.Decision(ctx, s.D.Log, id, outcome.Superseded, why, slog.String("by", w.ID))
	}
}

// OverRate says why admission refused work.
func OverRate(t store.Tenant, lane string) string {
	return fmt.Sprintf("tenant %s is over its %s rate of %d per minute (burst %d)", t.ID, lane, t.RatePerMinute, t.Burst)
}

// RerunCommand is the command that asks again for dropped work.
func RerunCommand(w *store.Work) string {
	return fmt.Sprintf("assay work rerun %s --region %s", w.ID, w.Region)
}

// Count counts a work submission by its result (assay_ingress_requests).
func (s *Door) Count(ctx context.Context, result string) {
	s.Requests.Add(ctx, 1, metric.WithAttributes(attribute.String("result", result), attribute.String("region", s.Cfg.Region)))
}

// NewWork is the work a caller or a webhook asks for: the one place a work
// row is made from a request, keyed by the ingress key and bound to the
// contract version c (contractFor's: the route's live one) with the model
// and prompt the route names for it. A new revision of the same source
// supersedes the older one's work.
func (s *Door) NewWork(ctx context.Context, t store.Tenant, c *contract.Contract, source, revision, lane string, input []byte, deadline time.Time) *store.Work {
	var v store.Variant
	if r, ok := s.Route(t.ID, c.Name); ok && r.Live.Version == c.SchemaVersion {
		v = r.Live
	}
	return &store.Work{
		Model:           v.Model,
		PromptDigest:    v.Prompt,
		Traceparent:     telemetry.Traceparent(ctx),
		ID:              api.WorkID(t.ID, c.Name, source, revision),
		TenantID:        t.ID,
		Region:          s.Cfg.Region,
		Contract:        c.Name,
		SchemaVersion:   c.SchemaVersion,
		TaxonomyVersion: c.TaxonomyVersion,
		SourceID:        source,
		Revision:        revision,
		Lane:            lane,
		Input:           string(input),
		Digest:          api.Digest(input),
		DeadlineAt:      deadline,
		SupersedeOlder:  true,
	}
}

var (
	// SourceRE admits owner/repo#number and other printable ids, no spaces.
	SourceRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/#:@+-]{0,199}$`)
	RevisionRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$`)
)

// Authenticate resolves the bearer token to a tenant this cell serves, or
// writes the refusal and returns false.
func (s *Door) Authenticate(w http.ResponseWriter, r *http.Request) (store.Tenant, bool) {
	t, refused := auth.Bearer(r.Context(), s.Tokens, r.Header.Get("Authorization"), s.Cell())
	if refused != nil && refused.Code == "wrong_cell" && t.ID != "" && s.finishing(r, t.ID) {
		return t, true
	}
	if refused != nil {
		if refused.Status == http.StatusServiceUnavailable {
			s.D.Log.Error("token lookup failed", "err", refused.Message)
		}
		s.RefuseOrSendOn(w, r, t, refused, nil)
		return store.Tenant{}, false
	}
	return t, true
}

// LaneDeadline is how long work of lane has by default.
func (s *Door) LaneDeadline(lane string) time.Duration {
	if lane == event.Batch {
		return s.Cfg.BatchDeadline
	}
	return s.Cfg.InteractiveDeadline
}

// RefuseOverRate answers a submission the tenant's bucket refused: 429 with
// Retry-After, nothing stored; a key already accepted costs nothing, over
// the rate or not, and answers as the duplicate it is.
func (s *Door) RefuseOverRate(ctx context.Context, w http.ResponseWriter, t store.Tenant, work *store.Work, wait time.Duration) {
	if got, err := s.D.Store.GetWork(ctx, work.ID); err == nil && got.State != outcome.Dropped {
		s.Duplicate(ctx, w, t, got)
		return
	}
	s.Count(ctx, "rate_limited")
	telemetry.Decision(ctx, s.D.Log, work.ID, "refused", OverRate(t, work.Lane),
		slog.String("tenant", t.ID), slog.Duration("retry_after", wait))
	TooMany(w, "rate_limited", OverRate(t, work.Lane), wait)
}

// TooMany answers a submission refused for now: RetryLater, with a message
// that says why, how long, and that nothing was stored.
func TooMany(w http.ResponseWriter, code, why string, wait time.Duration) {
	RetryLater(w, code, fmt.Sprintf("%s; retry after %d s (nothing was stored)", why, retrySeconds(wait)), wait)
}

// RetryLater answers a refusal that asking again later can pass: 429 with
// code and message, and Retry-After: wait in whole seconds (retrySeconds).
// Every 429 ingress answers is written here.
func RetryLater(w http.ResponseWriter, code, message string, wait time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(retrySeconds(wait)))
	apierror.Write(w, http.StatusTooManyRequests, code, message)
}

// retrySeconds is wait as Retry-After gives it: whole seconds, rounded up.
func retrySeconds(wait time.Duration) int { return int(math.Ceil(wait.Seconds())) }

// StreamsFullWait is the Retry-After of a stream refused because its
// holder has as many open as it may: a stream ends when its client closes
// it, which no wait foretells, so the wait only paces asking again.
const StreamsFullWait = 5 * time.Second

// Duplicate answers a submission whose ingress key was already accepted.
func (s *Door) Duplicate(ctx context.Context, w http.ResponseWriter, t store.Tenant, got *store.Work) {
	s.Count(ctx, "duplicate")
	telemetry.Decision(ctx, s.D.Log, got.ID, "duplicate", "ingress key already accepted",
		slog.String("tenant", t.ID), slog.String("state", got.State))
	apierror.JSON(w, http.StatusOK, Submitted(got, true))
}

// Submitted is the answer to a submission whose work w is stored, or was
// already (duplicate).
func Submitted(w *store.Work, duplicate bool) api.SubmitResponse {
	return api.SubmitResponse{WorkID: w.ID, State: w.State, Duplicate: duplicate, Region: w.Region,
		Links: api.Links{Self: "/v1/work/" + w.ID}}
}

// ValidateInput checks the input against its contract's schema: the
// dearest check, made once the request took its rate token.
func (s *Door) ValidateInput(c *contract.Contract, input json.RawMessage) *apierror.Error {
	if err := c.ValidateInput(input); err != nil {
		return apierror.New(http.StatusBadRequest, "invalid_input", err.Error())
	}
	return s.DiffSize(c, input)
}

// DiffSize refuses the input of a contract grounded in a diff whose diff is
// over the cell's cap, the one webhooks are held to.
func (s *Door) DiffSize(c *contract.Contract, input json.RawMessage) *apierror.Error {
	// A diff is never longer than the JSON that quotes it: most inputs are
	// not decoded again.
	if c.Grounding != contract.GroundingDiff || int64(len(input)) <= s.Cfg.MaxDiffBytes {
		return nil
	}
	var in struct {
		Diff string `json:"diff"`
	}
	if json.Unmarshal(input, &in) != nil || int64(len(in.Diff)) <= s.Cfg.MaxDiffBytes {
		return nil
	}
	return apierror.New(http.StatusRequestEntityTooLarge, "diff_too_large", fmt.Sprintf(
		"the input's diff is %d bytes, over this cell's limit of %d (ASSAY_MAX_DIFF_BYTES, up to %d; larger diffs are reviewed in parts)",
		len(in.Diff), s.Cfg.MaxDiffBytes, settings.MaxDiffCeiling))
}

// Viewer authenticates a reader of the console, or writes the refusal.
func (s *Door) Viewer(w http.ResponseWriter, r *http.Request) (auth.Viewer, bool) {
	v, refused := auth.Console(r.Context(), s.D.Store, r.Header.Get("Authorization"), s.Cell())
	if refused != nil {
		if refused.Status == http.StatusServiceUnavailable {
			s.D.Log.Error("console: token lookup failed", "err", refused.Message)
		}
		var t store.Tenant
		if v.Tenant != nil {
			t = *v.Tenant
		}
		s.RefuseOrSendOn(w, r, t, refused, nil)
		return auth.Viewer{}, false
	}
	return v, true
}

// OpenStreams counts the console streams each credential holds open.
type OpenStreams struct {
	mu sync.Mutex
	n  map[string]int
}

// Take admits one more stream for key, up to max; release gives it back.
func (o *OpenStreams) Take(key string, max int) (release func(), ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[string]int{}
	}
	if o.n[key] >= max {
		return nil, false
	}
	o.n[key]++
	var once sync.Once
	return func() {
		once.Do(func() {
			o.mu.Lock()
			defer o.mu.Unlock()
			if o.n[key]--; o.n[key] == 0 {
				delete(o.n, key)
			}
		})
	}, true
}

// ConsoleActor is the person an operator token names, acting from the
// console: a reviewer or an operator, by the token's role.
func ConsoleActor(op *store.Operator) store.Actor {
	kind := store.ActorReviewer
	if op.Role == store.RoleOperator {
		kind = store.ActorOperator
	}
	return store.Actor{Kind: kind, ID: op.Name, Route: store.RouteConsole}
}

// Scope is the tenant whose items a viewer reaches: its own for a tenant's
// token, every tenant's ("") for an operator's.
func Scope(v auth.Viewer) string {
	if v.Operator != nil {
		return ""
	}
	return v.Tenant.ID
}

// New checks the config and builds the door: what every room of ingress
// shares.
func New(cfg settings.Config, d Deps) (*Door, error) {
	if err := cfg.Defaults(); err != nil {
		return nil, err
	}
	s := &Door{Cfg: cfg, D: d, buckets: admission.NewBuckets(time.Now), Tokens: auth.NewCache(d.Store, cfg.TokenCache)}
	s.Tokens.LongTTL = cfg.TokenCacheListening
	if cfg.TokenCache > 0 {
		s.Tenants = &tenantWatch{w: d.Store, cache: s.Tokens, log: d.Log}
	}
	s.place = &placement.View{JS: d.JS, Bucket: cfg.Names.PlacementBucket(cfg.Region), Region: cfg.Region,
		Replicas: cfg.Streams.Replicas, Tags: cfg.Streams.Placement, Cell: cfg.Names.Cell, URL: cfg.CellURL,
		NATSURL: cfg.PlacementNATSURL, Log: d.Log, Wait: cfg.Streams.Wait}
	s.Streams = &event.Keeper{JS: d.JS, Names: cfg.Names, Kinds: []string{event.KindWork}, Settings: cfg.Streams, Log: d.Log,
		Meter: d.Tel.Meter(), Region: cfg.Region}
	s.Relay = &outbox.Relay{Store: d.Store, JS: d.JS, Log: d.Log, Streams: []string{event.KindWork},
		Ensure: s.Streams.Ensure, Meter: d.Tel.Meter(), Region: cfg.Region, SetAside: cfg.SetAside}
	s.Inserts = &group.Batch[store.InsertReq, store.WorkInserted]{Run: d.Store.InsertWorkGroup}
	if err := s.watchMetrics(); err != nil {
		return nil, err
	}
	if err := s.setUpShed(); err != nil {
		return nil, err
	}
	var err error
	s.Requests, err = d.Tel.Meter().Int64Counter("assay_ingress_requests",
		metric.WithDescription("work submissions by result"))
	if err != nil {
		return nil, err
	}
	s.Webhooks, err = d.Tel.Meter().Int64Counter("assay_ingress_webhooks",
		metric.WithDescription("GitHub webhook deliveries by result"))
	if err != nil {
		return nil, err
	}
	s.shadows, err = d.Tel.Meter().Int64Counter("assay_ingress_shadows",
		metric.WithDescription("shadow twins of live work for a route's candidate, by contract and result (made, failed, unknown_version)"))
	return s, err
}

// Parts are the door's lifecycle parts, in the order they start: the
// placement view, the WORK stream, the outbox relay, the capacity view and,
// when the store tells of changes to tenants, the token cache's watch.
func (s *Door) Parts() []lifecycle.Service {
	parts := []lifecycle.Service{s.place, s.Streams, s.Relay, s.shed.view}
	if s.Tenants != nil {
		parts = append(parts, s.Tenants)
	}
	return parts
}

// An Endpoint is one operation a room serves: its "METHOD /path" pattern
// and its handler.
type Endpoint struct {
	Pattern string
	Handler http.Handler
}
