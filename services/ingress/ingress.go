// Package ingress is the front door of a cell: it authenticates the caller,
// takes the tenant and region from the credential, applies the ingress fence
// and enqueues through the transactional outbox.
package ingress

import (
	"cmp"
	"context"
	"crypto/rsa"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"assay.dev/pkg/admission"
	"assay.dev/pkg/api"
	"assay.dev/pkg/apierror"
	"assay.dev/pkg/auth"
	"assay.dev/pkg/config"
	"assay.dev/pkg/contract"
	"assay.dev/pkg/event"
	"assay.dev/pkg/githubapp"
	"assay.dev/pkg/group"
	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/outbox"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/placement"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
	"assay.dev/pkg/usage"
	"assay.dev/schemas"
	"assay.dev/services/ingress/internal/request"
)

// Config of one ingress instance.
type Config struct {
	// Region is the region this instance serves.
	Region string
	// Names are the cell's NATS names. Default the cell named after Region
	// in the default installation.
	Names event.Names
	// Streams configure the WORK stream, which ingress owns.
	Streams event.StreamSettings
	// MaxBodyBytes caps a request body. Default twice MaxDiffBytes and
	// 256 KiB, at least 1 MiB.
	MaxBodyBytes int64
	// DefaultDeadline applies per lane when a request names none.
	// Defaults: interactive 10m, batch 24h.
	InteractiveDeadline, BatchDeadline time.Duration
	// SweepEvery is how often stuck work is looked for. Default 5s.
	SweepEvery time.Duration
	// QueuedFor is how long work may sit queued before it is announced
	// again. Default 60s.
	QueuedFor time.Duration
	// LeaseGrace is how long after a lease expired the work is announced
	// again. Default 5s.
	LeaseGrace time.Duration
	// SetAside bounds how long an outbox row that cannot be published is
	// tried before it is set aside.
	SetAside store.SetAsidePolicy
	// OutboxRetention is how long published outbox rows are kept. Default
	// 24h; at least 2h, past the ledger reaper's one-hour horizon.
	OutboxRetention time.Duration
	// DataRetention is how long work inputs and raw answers are kept after
	// the work ended. Default 720h (30 days).
	DataRetention time.Duration
	// WatchEvery is how often the gauges of the cell's work (oldest
	// unfinished per lane, the views of the last day) are sampled. Default
	// 15s.
	WatchEvery time.Duration
	// RoutesEvery is how often the contracts' routes are read again: a
	// change of a route reaches new work within it.
	RoutesEvery time.Duration
	// ConsoleEvery is how often a console stream looks for new figures.
	// Default 2s.
	ConsoleEvery time.Duration
	// ConsoleStreams bounds the console streams one credential holds open
	// at once. Default 4.
	ConsoleStreams int
	// TokenCache is how long a token's tenant is remembered while
	// ingress does not hear of changes to tenants: a revoked token, a
	// suspension or a move takes effect within it. Default 2s; negative
	// looks every token up on every request.
	TokenCache time.Duration
	// TokenCacheListening is how long it is remembered while the cell's
	// database tells ingress of every change to a tenant or its tokens
	// (each is forgotten the moment it changes). Default 5m.
	TokenCacheListening time.Duration
	// EventsEvery is how often a work or batch event stream reads its
	// rows again. Default 1s.
	EventsEvery time.Duration
	// EventsHeartbeat is how long an event stream stays quiet before it
	// sends a heartbeat comment. Default 15s.
	EventsHeartbeat time.Duration
	// EventStreams bounds the work and batch event streams one tenant
	// holds open at once on one instance. Default 16.
	EventStreams int
	// EventsRecheck is how often an open event stream checks its
	// credential again, whatever it is sending: a suspended tenant's or
	// a revoked token's stream ends within it. Default 5s.
	EventsRecheck time.Duration

	// GitHubSecret is the cell's webhook secret: its GitHub App's, held by
	// the operator alone. Empty, only deliveries signed with a tenant's own
	// secret are taken.
	GitHubSecret string
	// GitHubAPI is the REST API the diffs are fetched from. Default
	// https://api.github.com.
	GitHubAPI string
	// GitHubAppID and GitHubKey are the GitHub App's credentials (the ones
	// the committer publishes with): each diff is read with the token of
	// the installation its pull request belongs to.
	GitHubAppID int64
	GitHubKey   *rsa.PrivateKey
	// GitHubToken, when set, authenticates every diff fetch instead: the
	// single-tenant option, refused beside an App.
	GitHubToken string
	// GitHubTimeout bounds one diff fetch. Default 5s, well inside the 10s
	// GitHub waits for a webhook answer.
	GitHubTimeout time.Duration
	// MaxDiffBytes is the one cap on a diff to review: a pull request's
	// fetched diff, and the diff of a code review Submitted through the
	// API. Default 1 MiB; reviews in parts serve diffs up to it.
	MaxDiffBytes int64
	// CellURL is where this cell's ingress answers the other cells of its
	// region (ASSAY_CELL_URL), registered in the region's placement map:
	// they send this cell's tenants' requests on to it. Unset, nothing is
	// sent to it, and its tenants' requests that reach another cell of the
	// region are refused there with 421 wrong_cell.
	CellURL string
	// PlacementNATSURL is the region's account, where the map of which
	// cell serves which tenant is kept, with this cell's placement user
	// (ASSAY_PLACEMENT_NATS_URL; assay nats-config writes it). Unset, the
	// map is kept in the cell's own account: a region of one cell, or a
	// server without accounts.
	PlacementNATSURL string
	// Diffs fetches pull-request diffs. Default: GitHubDiffs built from the
	// settings above.
	Diffs DiffSource
	// Shed is capacity admission and the shared rate.
	Shed ShedConfig
}

// defaults checks the config and fills in what it leaves unset.
func (c *Config) defaults() error {
	if c.Region == "" {
		return errors.New("ingress: Region is required")
	}
	if c.Names.Cell == "" {
		c.Names.Cell = c.Region
	}
	if err := c.Names.Check(); err != nil {
		return fmt.Errorf("ingress: %w", err)
	}
	c.requestDefaults()
	c.sweeperDefaults()
	c.streamDefaults()
	c.TokenCache = cmp.Or(c.TokenCache, 2*time.Second)
	c.TokenCacheListening = cmp.Or(c.TokenCacheListening, 5*time.Minute)
	if err := c.githubDefaults(); err != nil {
		return err
	}
	return c.Shed.defaults()
}

// requestDefaults fills in the caps of a request and the lanes' deadlines.
func (c *Config) requestDefaults() {
	c.MaxDiffBytes = cmp.Or(c.MaxDiffBytes, 1<<20)
	// Room for a diff at its cap, quoted as JSON.
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, max(1<<20, 2*c.MaxDiffBytes+256<<10))
	c.InteractiveDeadline = cmp.Or(c.InteractiveDeadline, 10*time.Minute)
	c.BatchDeadline = cmp.Or(c.BatchDeadline, 24*time.Hour)
}

// sweeperDefaults fills in the settings of the sweeper and of the other
// passes over the cell's work: the watch and the routes.
func (c *Config) sweeperDefaults() {
	c.SweepEvery = cmp.Or(c.SweepEvery, 5*time.Second)
	c.QueuedFor = cmp.Or(c.QueuedFor, 60*time.Second)
	c.LeaseGrace = cmp.Or(c.LeaseGrace, 5*time.Second)
	c.OutboxRetention = cmp.Or(c.OutboxRetention, 24*time.Hour)
	c.DataRetention = cmp.Or(c.DataRetention, 30*24*time.Hour)
	c.RoutesEvery = cmp.Or(c.RoutesEvery, 5*time.Second)
	c.WatchEvery = cmp.Or(c.WatchEvery, 15*time.Second)
}

// streamDefaults fills in the settings of the console's streams and of the
// work and batch event streams.
func (c *Config) streamDefaults() {
	c.ConsoleEvery = cmp.Or(c.ConsoleEvery, 2*time.Second)
	c.ConsoleStreams = cmp.Or(c.ConsoleStreams, 4)
	c.EventsEvery = cmp.Or(c.EventsEvery, time.Second)
	c.EventsHeartbeat = cmp.Or(c.EventsHeartbeat, 15*time.Second)
	c.EventStreams = cmp.Or(c.EventStreams, 16)
	c.EventsRecheck = cmp.Or(c.EventsRecheck, 5*time.Second)
}

// githubDefaults checks GitHub's settings, fills in what they leave unset
// and builds the diff source from them when the config gives none.
func (c *Config) githubDefaults() error {
	c.GitHubAPI = cmp.Or(c.GitHubAPI, "https://api.github.com")
	if u, err := url.Parse(c.GitHubAPI); err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return fmt.Errorf("ingress: GitHubAPI %q is not an http(s) URL", config.Redacted(c.GitHubAPI))
	}
	c.GitHubTimeout = cmp.Or(c.GitHubTimeout, 5*time.Second)
	if c.GitHubAppID != 0 && c.GitHubToken != "" {
		return errors.New("ingress: GitHubToken is the single-tenant option and is not used beside a GitHub App (GitHubAppID)")
	}
	if c.GitHubAppID != 0 && c.GitHubKey == nil {
		return errors.New("ingress: GitHubKey is required with GitHubAppID")
	}
	if c.Diffs == nil {
		d := &GitHubDiffs{API: c.GitHubAPI, Token: c.GitHubToken, MaxBytes: c.MaxDiffBytes, Timeout: c.GitHubTimeout}
		if c.GitHubAppID != 0 {
			d.App = &githubapp.App{API: c.GitHubAPI, ID: c.GitHubAppID, Key: c.GitHubKey, UserAgent: "assay-ingress",
				Client: &http.Client{Timeout: c.GitHubTimeout}}
		}
		c.Diffs = d
	}
	return nil
}

// MaxDiffCeiling is the most ASSAY_MAX_DIFF_BYTES may be: the input
// schema's cap on a diff.
const MaxDiffCeiling = api.MaxDiffCeiling

// Vars are the settings FromEnv reads, for ingress's help.
var Vars = []config.Var{
	{Name: "ASSAY_INTERACTIVE_DEADLINE", Default: "10m", Usage: "deadline of interactive work without its own"},
	{Name: "ASSAY_BATCH_DEADLINE", Default: "24h", Usage: "deadline of batch work without its own"},
	{Name: "ASSAY_SWEEP_EVERY", Default: "5s", Usage: "how often the sweeper looks for stuck and overdue work"},
	{Name: "ASSAY_SWEEP_QUEUED_FOR", Default: "60s", Usage: "queued this long behind its lane's backlog head, work is announced again"},
	{Name: "ASSAY_SWEEP_LEASE_GRACE", Default: "5s", Usage: "a lease expired this long ago is taken back"},
	{Name: "ASSAY_OUTBOX_RETENTION", Default: "24h", Usage: "published outbox rows are purged after this"},
	{Name: "ASSAY_DATA_RETENTION", Default: "720h", Usage: "inputs and raw answers of ended work are cleared after this"},
	{Name: "ASSAY_WATCH_EVERY", Default: "15s", Usage: "how often the gauges of the cell's work are sampled"},
	{Name: "ASSAY_ROUTES_EVERY", Default: "5s", Usage: "how often the contracts' routes (assay rollout) are read again; a change reaches new work within it"},
	{Name: "ASSAY_CONSOLE_EVERY", Default: "2s", Usage: "how often a console stream looks for new figures"},
	{Name: "ASSAY_TOKEN_CACHE", Default: "2s", Usage: "how long a token's tenant is remembered while changes to tenants are not heard; a revocation or suspension takes effect within it (0s: never remembered)"},
	{Name: "ASSAY_TOKEN_CACHE_LISTENING", Default: "5m", Usage: "how long it is remembered while the database tells of every change to a tenant or its tokens (each forgotten as it changes)"},
	{Name: "ASSAY_EVENTS_RECHECK", Default: "5s", Usage: "how often an open event stream checks its token again; a suspension or revocation ends it within this"},
	{Name: "ASSAY_MAX_DIFF_BYTES", Default: "1048576", Usage: "the largest diff reviewed, from a webhook or the API (65536 to 8388608); a larger one is refused with diff_too_large, a pull request's with one comment"},
	{Name: "ASSAY_GITHUB_WEBHOOK_SECRET", Default: "none", Usage: "the cell's (its GitHub App's) webhook secret"},
	{Name: "ASSAY_GITHUB_API_URL", Default: "https://api.github.com", Usage: "where pull request diffs are fetched"},
	{Name: "ASSAY_GITHUB_APP_ID", Default: "none (diffs read without a token)", Usage: "the GitHub App whose installation tokens read each pull request's diff (the committer publishes as it)"},
	{Name: "ASSAY_GITHUB_APP_KEY_FILE", Default: "none", Usage: "the GitHub App's private key (PEM); required with ASSAY_GITHUB_APP_ID"},
	{Name: "ASSAY_GITHUB_TOKEN", Default: "none", Usage: "single tenant, without an App: the one token every diff is read with"},
	{Name: "ASSAY_PLACEMENT_NATS_URL", Default: "none (the map is kept in the cell's own account)", Usage: "NATS URL of the region's account, with this cell's placement user and password, where the region's map of which cell serves which tenant is kept"},
	{Name: "ASSAY_CELL_URL", Default: "none (no other cell of the region sends requests here)", Usage: "where this cell's ingress answers the region's other cells, which send the requests of the tenants placed on it here"},
	shedVars[0], shedVars[1], shedVars[2], shedVars[3], shedVars[4], shedVars[5],
}

// FromEnv fills the settings an operator sets from the environment:
// ASSAY_INTERACTIVE_DEADLINE and ASSAY_BATCH_DEADLINE (Go durations, e.g.
// 10m), the sweeper's ASSAY_SWEEP_EVERY, ASSAY_SWEEP_QUEUED_FOR and
// ASSAY_SWEEP_LEASE_GRACE, and the GitHub settings ASSAY_GITHUB_WEBHOOK_SECRET,
// ASSAY_GITHUB_API_URL, ASSAY_GITHUB_APP_ID and ASSAY_GITHUB_APP_KEY_FILE
// (the App that reads diffs) or, for a single tenant, ASSAY_GITHUB_TOKEN,
// and ASSAY_CELL_URL. Errors name the variable.
func (c *Config) FromEnv(getenv func(string) string) error {
	const week = 7 * 24 * time.Hour
	if err := config.Durations(getenv,
		config.Duration{Name: "ASSAY_INTERACTIVE_DEADLINE", To: &c.InteractiveDeadline, Min: time.Second, Max: week},
		config.Duration{Name: "ASSAY_BATCH_DEADLINE", To: &c.BatchDeadline, Min: time.Second, Max: week},
		config.Duration{Name: "ASSAY_SWEEP_EVERY", To: &c.SweepEvery, Min: 100 * time.Millisecond, Max: week},
		config.Duration{Name: "ASSAY_SWEEP_QUEUED_FOR", To: &c.QueuedFor, Min: 100 * time.Millisecond, Max: week},
		config.Duration{Name: "ASSAY_SWEEP_LEASE_GRACE", To: &c.LeaseGrace, Min: 100 * time.Millisecond, Max: week},
		config.Duration{Name: "ASSAY_OUTBOX_RETENTION", To: &c.OutboxRetention, Min: 2 * time.Hour, Max: 366 * 24 * time.Hour},
		config.Duration{Name: "ASSAY_DATA_RETENTION", To: &c.DataRetention, Min: time.Hour, Max: 10 * 366 * 24 * time.Hour},
		config.Duration{Name: "ASSAY_WATCH_EVERY", To: &c.WatchEvery, Min: time.Second, Max: time.Hour},
		config.Duration{Name: "ASSAY_ROUTES_EVERY", To: &c.RoutesEvery, Min: 100 * time.Millisecond, Max: 10 * time.Minute},
		config.Duration{Name: "ASSAY_CONSOLE_EVERY", To: &c.ConsoleEvery, Min: 100 * time.Millisecond, Max: time.Minute},
		config.Duration{Name: "ASSAY_TOKEN_CACHE", To: &c.TokenCache, Min: 0, Max: time.Minute},
		config.Duration{Name: "ASSAY_TOKEN_CACHE_LISTENING", To: &c.TokenCacheListening, Min: time.Second, Max: 24 * time.Hour},
		config.Duration{Name: "ASSAY_EVENTS_RECHECK", To: &c.EventsRecheck, Min: 100 * time.Millisecond, Max: 5 * time.Minute},
	); err != nil {
		return err
	}
	if getenv("ASSAY_TOKEN_CACHE") != "" && c.TokenCache == 0 {
		c.TokenCache = -1
	}
	if v := getenv("ASSAY_MAX_DIFF_BYTES"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 64<<10 || n > MaxDiffCeiling {
			return fmt.Errorf("ASSAY_MAX_DIFF_BYTES: %q is not a whole number of bytes from %d to %d", config.Redacted(v), 64<<10, MaxDiffCeiling)
		}
		c.MaxDiffBytes = n
	}
	if v := getenv("ASSAY_CELL_URL"); v != "" {
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
			return fmt.Errorf("ASSAY_CELL_URL: %q is not the http(s) address of a cell's ingress (scheme and host, no path)", config.Redacted(v))
		}
		c.CellURL = strings.TrimSuffix(v, "/")
	}
	if v := getenv("ASSAY_PLACEMENT_NATS_URL"); v != "" {
		if err := config.CheckNATSURL(v); err != nil {
			return fmt.Errorf("ASSAY_PLACEMENT_NATS_URL: %w", err)
		}
		c.PlacementNATSURL = v
	}
	c.GitHubSecret = getenv("ASSAY_GITHUB_WEBHOOK_SECRET")
	c.GitHubAPI = getenv("ASSAY_GITHUB_API_URL")
	c.GitHubToken = getenv("ASSAY_GITHUB_TOKEN")
	var err error
	if c.GitHubAppID, c.GitHubKey, err = githubapp.FromEnv(getenv); err != nil {
		return err
	}
	if c.GitHubAppID != 0 && c.GitHubToken != "" {
		return errors.New("ASSAY_GITHUB_TOKEN: set beside ASSAY_GITHUB_APP_ID; with the App each diff is read with its installation's token, so the static token (the single-tenant option) must be unset")
	}
	return c.Shed.fromEnv(getenv)
}

// JetStream is what ingress asks of NATS JetStream; a
// jetstream.JetStream is one.
type JetStream interface {
	jetstream.Publisher             // the outbox relay's announcements
	jetstream.StreamManager         // the WORK stream and its messages
	jetstream.StreamConsumerManager // the cell's consumers, read for their backlog
	jetstream.KeyValueManager       // the placement, capacity and admission buckets
	// Conn is the connection, read for the largest payload its server
	// takes.
	Conn() *nats.Conn
}

var _ JetStream = jetstream.JetStream(nil)

// Deps are what ingress talks to.
type Deps struct {
	Store     Store
	JS        JetStream
	Contracts *contract.Registry
	Log       *slog.Logger
	Tel       *telemetry.Provider
}

// Service is one ingress instance.
type Service struct {
	Cfg     Config
	D       Deps
	Streams *event.Keeper
	Relay   *outbox.Relay
	// Inserts writes the work of concurrent submissions in one statement.
	Inserts *group.Batch[store.InsertReq, store.WorkInserted]
	sweeper lifecycle.Ticker
	janitor lifecycle.Ticker
	watcher lifecycle.Ticker
	router  lifecycle.Ticker
	Routes_ routes
	// Shadowing counts the shadow twins being made; Stop waits for them.
	Shadowing sync.WaitGroup
	Watched   watch
	Open      OpenStreams
	Shared    consoleShared

	Requests metric.Int64Counter
	Webhooks metric.Int64Counter
	Dropped  metric.Int64Counter
	Shadows  metric.Int64Counter
	Buckets  *admission.Buckets
	Tokens   *auth.Cache
	Tenants  *tenantWatch // keeps tokens told of changes; nil when the store cannot
	Place    *placement.View
	Shed     *shedder

	// EventStreams counts the work and batch event streams per tenant.
	EventStreams OpenStreams
}

// New checks the config and builds the service.
func New(cfg Config, d Deps) (*Service, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	s := &Service{Cfg: cfg, D: d, Buckets: admission.NewBuckets(time.Now), Tokens: auth.NewCache(d.Store, cfg.TokenCache)}
	s.Tokens.LongTTL = cfg.TokenCacheListening
	if cfg.TokenCache > 0 {
		s.Tenants = &tenantWatch{w: d.Store, cache: s.Tokens, log: d.Log}
	}
	s.Place = &placement.View{JS: d.JS, Bucket: cfg.Names.PlacementBucket(cfg.Region), Region: cfg.Region,
		Replicas: cfg.Streams.Replicas, Tags: cfg.Streams.Placement, Cell: cfg.Names.Cell, URL: cfg.CellURL,
		NATSURL: cfg.PlacementNATSURL, Log: d.Log, Wait: cfg.Streams.Wait}
	s.Streams = &event.Keeper{JS: d.JS, Names: cfg.Names, Kinds: []string{event.KindWork}, Settings: cfg.Streams, Log: d.Log,
		Meter: d.Tel.Meter(), Region: cfg.Region}
	s.Relay = &outbox.Relay{Store: d.Store, JS: d.JS, Log: d.Log, Streams: []string{event.KindWork},
		Ensure: s.Streams.Ensure, Meter: d.Tel.Meter(), Region: cfg.Region, SetAside: cfg.SetAside}
	s.Inserts = &group.Batch[store.InsertReq, store.WorkInserted]{Run: d.Store.InsertWorkGroup}
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
	if err := s.WatchMetrics(); err != nil {
		return nil, err
	}
	if err := s.SetUpShed(); err != nil {
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
	s.Shadows, err = d.Tel.Meter().Int64Counter("assay_ingress_shadows",
		metric.WithDescription("shadow twins of live work for a route's candidate, by contract and result (made, failed, unknown_version)"))
	return s, err
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
	parts := []lifecycle.Service{s.Place, s.Streams, s.Relay, &s.sweeper, &s.janitor, &s.watcher, &s.router, s.Shed.view}
	if s.Tenants != nil {
		parts = append(parts, s.Tenants)
	}
	return lifecycle.StartAll(ctx, parts...)
}

// Stop ends the sweeper, then the relay after a last drain. Idempotent.
func (s *Service) Stop(ctx context.Context) {
	parts := []lifecycle.Service{s.Shed.view, &s.router, &s.watcher, &s.janitor, &s.sweeper, s.Relay, s.Streams, s.Place}
	if s.Tenants != nil {
		parts = append([]lifecycle.Service{s.Tenants}, parts...)
	}
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

// cell is who ingress authenticates for.
func (s *Service) Cell() auth.Cell {
	return auth.Cell{Region: s.Cfg.Region, ID: s.Cfg.Names.Cell, ServedBy: s.Serving}
}

func (s *Service) Announcer(ctx context.Context) func(*store.Work) ([]store.OutboxMsg, error) {
	return Announce(ctx, s.Cfg.Names)
}

// logSuperseded records the supersede decision for each older work item.
func (s *Service) LogSuperseded(ctx context.Context, w *store.Work) {
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

// admit takes a token from the tenant's bucket for the lane. When there is
// none it returns how long until there is one.
func (s *Service) Admit(ctx context.Context, t store.Tenant, lane string) (time.Duration, bool) {
	return s.Take(ctx, t, lane)
}

// OverRate says why admission refused work.
func OverRate(t store.Tenant, lane string) string {
	return fmt.Sprintf("tenant %s is over its %s rate of %d per minute (burst %d)", t.ID, lane, t.RatePerMinute, t.Burst)
}

// RerunCommand is the command that asks again for dropped work.
func RerunCommand(w *store.Work) string {
	return fmt.Sprintf("assay work rerun %s --region %s", w.ID, w.Region)
}

// Handler serves the ingress API. A path that is not text is refused
// before it is routed (TextPaths).
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, r := range s.endpoints(usage.Handler(s.D.Store, s.Cell(), s.D.Log, func(w http.ResponseWriter, r *http.Request, t store.Tenant, refused *apierror.Error) {
		s.RefuseOrSendOn(w, r, t, refused, nil)
	})) {
		mux.Handle(r.pattern, r.h)
	}
	return request.TextPaths(mux)
}

// Routes is every "METHOD /path" the ingress API serves: what its OpenAPI
// description (schemas/openapi.yaml) must describe, no more and no less.
func Routes() []string {
	var out []string
	for _, r := range (&Service{}).endpoints(nil) {
		out = append(out, r.pattern)
	}
	return out
}

type endpoint struct {
	pattern string
	h       http.Handler
}

// endpoints pairs each pattern with its handler; usageReport serves the
// usage report. Each operation whose query reaches the database (filters,
// cursors) is wrapped in TextQuery; the usage report's parameters are
// compared and parsed, never queried by.
func (s *Service) endpoints(usageReport http.Handler) []endpoint {
	return []endpoint{
		{"POST /v1/work", http.HandlerFunc(s.submit)},
		{"GET /v1/work/{id}", http.HandlerFunc(s.get)},
		{"GET /v1/work", request.TextQuery(http.HandlerFunc(s.list))},
		{"GET /v1/work/{id}/events", http.HandlerFunc(s.workEventStream)},
		{"POST /v1/batches", http.HandlerFunc(s.submitBatch)},
		{"GET /v1/batches/{id}", http.HandlerFunc(s.getBatch)},
		{"GET /v1/batches/{id}/results", http.HandlerFunc(s.batchResults)},
		{"GET /v1/batches/{id}/events", http.HandlerFunc(s.batchEventStream)},
		{"POST /v1/batches/{id}/cancel", http.HandlerFunc(s.cancelBatch)},
		{"DELETE /v1/batches/{id}", http.HandlerFunc(s.cancelBatch)},
		{"GET /v1/reviews", request.TextQuery(http.HandlerFunc(s.listReviews))},
		{"POST /v1/reviews/{id}/resolve", http.HandlerFunc(s.resolveReview)},
		{"GET /v1/views", request.TextQuery(http.HandlerFunc(s.views))},
		{"POST /v1/webhooks/github", http.HandlerFunc(s.githubWebhook)},
		// The ledger's rows are in the cell's database: the usage report is
		// read here too, so a cell has one base URL.
		{"GET /v1/usage", usageReport},
		{"GET /v1/openapi.yaml", http.HandlerFunc(openAPI)},
		{"GET /console", http.HandlerFunc(s.consolePage)},
		{"GET /v1/console", http.HandlerFunc(s.consoleSnapshot)},
		{"GET /v1/console/events", http.HandlerFunc(s.consoleEvents)},
		{"GET /v1/console/work", request.TextQuery(http.HandlerFunc(s.consoleFind))},
		{"GET /v1/console/work/{id}", http.HandlerFunc(s.consoleWork)},
		{"POST /v1/console/work/{id}/actions", http.HandlerFunc(s.consoleAct)},
		{"GET /console/work/{id}", http.HandlerFunc(s.consoleWorkPage)},
		{"GET /v1/console/reviews", request.TextQuery(http.HandlerFunc(s.consoleReviews))},
		{"GET /v1/console/reviews/{id}", http.HandlerFunc(s.consoleReview)},
		{"POST /v1/console/reviews/{id}/claim", http.HandlerFunc(s.consoleClaim)},
		{"POST /v1/console/reviews/{id}/resolve", http.HandlerFunc(s.consoleResolve)},
		{"GET /console/reviews", http.HandlerFunc(s.consoleReviewPage)},
	}
}

// openAPI serves the API's description, to anyone: it holds no secret.
func openAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(schemas.OpenAPI)
}

func (s *Service) Count(ctx context.Context, result string) {
	s.Requests.Add(ctx, 1, metric.WithAttributes(attribute.String("result", result), attribute.String("region", s.Cfg.Region)))
}

// newWork is the work a caller or a webhook asks for: the one place a work
// row is made from a request, keyed by the ingress key and bound to the
// contract version c (contractFor's: the route's live one) with the model
// and prompt the route names for it. A new revision of the same source
// supersedes the older one's work.
func (s *Service) NewWork(ctx context.Context, t store.Tenant, c *contract.Contract, source, revision, lane string, input []byte, deadline time.Time) *store.Work {
	var v store.Variant
	if r, ok := s.Route(t.ID, c.Name); ok && r.Live.Version == c.SchemaVersion {
		v = r.Live
	}
	return &store.Work{
		Model:           v.Model,
		PromptDigest:    v.Prompt,
		Traceparent:     telemetry.Traceparent(ctx),
		ID:              WorkID(t.ID, c.Name, source, revision),
		TenantID:        t.ID,
		Region:          s.Cfg.Region,
		Contract:        c.Name,
		SchemaVersion:   c.SchemaVersion,
		TaxonomyVersion: c.TaxonomyVersion,
		SourceID:        source,
		Revision:        revision,
		Lane:            lane,
		Input:           string(input),
		Digest:          Digest(input),
		DeadlineAt:      deadline,
		SupersedeOlder:  true,
	}
}
