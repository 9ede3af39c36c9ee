// Package settings is the configuration of one ingress instance: what a
// caller sets in Config, what the environment sets through FromEnv, and
// the defaults Defaults fills in.
package settings

import (
	"cmp"
	"crypto/rsa"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"assay.dev/pkg/api"
	"assay.dev/pkg/config"
	"assay.dev/pkg/event"
	"assay.dev/pkg/githubapp"
	"assay.dev/pkg/store"
	"assay.dev/services/ingress/internal/diffs"
	"assay.dev/services/ingress/internal/shed"
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
	// fetched diff, and the diff of a code review submitted through the
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
	Diffs diffs.DiffSource
	// Shed is capacity admission and the shared rate.
	Shed shed.Config
}

// Defaults checks the config and fills in what it leaves unset.
func (c *Config) Defaults() error {
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
	return c.Shed.Defaults()
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
		d := &diffs.GitHubDiffs{API: c.GitHubAPI, Token: c.GitHubToken, MaxBytes: c.MaxDiffBytes, Timeout: c.GitHubTimeout}
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
	shed.Vars[0], shed.Vars[1], shed.Vars[2], shed.Vars[3], shed.Vars[4], shed.Vars[5],
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
	return c.Shed.FromEnv(getenv)
}
