// Package committer is the only writer of accepted results. It runs the gate
// on every final answer and commits with a compare-and-set on the lease, so
// an answer from a lost lease is recorded and never becomes a result.
package committer

import (
	"context"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"assay.dev/pkg/config"
	"assay.dev/pkg/consumer"
	"assay.dev/pkg/contract"
	"assay.dev/pkg/event"
	"assay.dev/pkg/gate"
	"assay.dev/pkg/githubapp"
	"assay.dev/pkg/group"
	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/outbox"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
	"assay.dev/services/committer/publish"
)

// Config of one committer instance.
type Config struct {
	// Region is the region this instance serves.
	Region string
	// Names are the cell's NATS names. Default the cell named after Region
	// in the default installation.
	Names event.Names
	// Concurrency is how many results are in hand at once; their reads and
	// commits go to the database in groups. Default 32.
	Concurrency int
	// AckWait and MaxDeliver configure the durable consumer. Defaults 30s, 20.
	AckWait    time.Duration
	MaxDeliver int
	// ReapEvery is how often the committer looks in the outbox for results
	// the broker lost (a store lost with its node): answers whose
	// work still waits for a verdict. Default 5s; negative turns it off.
	ReapEvery time.Duration
	// ReapGrace is how old such an event must be before it is read back,
	// so the reaper does not race the broker's delivery. Default 60s.
	ReapGrace time.Duration
	// Streams configure the OUTCOME stream the committer creates.
	Streams event.StreamSettings
	// AnnounceEvery is how often outcomes reached outside the commit
	// transaction (superseded, expired, dropped, …) are written to the
	// OUTCOME outbox. Default 1s; negative turns it off.
	AnnounceEvery time.Duration
	// GitHubAPI, GitHubAppID and GitHubKey configure publication to
	// GitHub as a GitHub App. With no app id the publisher records what
	// it would publish (the dry target). GitHubAPI defaults to
	// https://api.github.com.
	GitHubAPI   string
	GitHubAppID int64
	GitHubKey   *rsa.PrivateKey
	// Rerun is the command that runs dropped work again. Default
	// "assay work rerun <id> --region <region>".
	Rerun func(workID string) string
	// PublishDeadline is how long an outcome's publication to each target
	// is tried before it is failed. Default a day.
	PublishDeadline time.Duration
	// PublishBackoff, PublishRetryEvery and PublishCountEvery tune the
	// publisher's retries and the count of its unfinished publications
	// (defaults: publish.Config's).
	PublishBackoff                       publish.Backoff
	PublishRetryEvery, PublishCountEvery time.Duration
	// PublishConcurrency and CallbackConcurrency are how many publications
	// to GitHub and how many callbacks are tried at once (defaults:
	// publish.Config's).
	PublishConcurrency, CallbackConcurrency int
	// GitHubWritesPerMinute and GitHubWritesPerHour are each installation's
	// budget of content-creating requests, drawn from by every publisher
	// that shares the budget bucket. Defaults GitHub's limits, 80 and 500.
	GitHubWritesPerMinute, GitHubWritesPerHour int
	// GitHubBudgetNATSURL is the region's account, where the installations'
	// write budgets are kept for every cell of the region, with this
	// cell's publisher user (ASSAY_GITHUB_BUDGET_NATS_URL; assay
	// nats-config writes it). Unset, the budgets are kept in the cell's own
	// account: shared by its committer replicas.
	GitHubBudgetNATSURL string
	// Now is the publisher's clock. Default time.Now.
	Now func() time.Time
	// SetAside bounds how long an OUTCOME row that fails to publish is
	// tried.
	SetAside store.SetAsidePolicy
}

// Vars are the settings FromEnv reads, for the committer's help.
var Vars = []config.Var{
	{Name: "ASSAY_ACK_WAIT", Default: "30s", Usage: "the result consumers' ack wait"},
	{Name: "ASSAY_COMMITTER_REAP_EVERY", Default: "5s", Usage: "how often the reaper reads back results the broker lost"},
	{Name: "ASSAY_COMMITTER_REAP_GRACE", Default: "60s", Usage: "a result published this long ago and not committed is read back"},
	{Name: "ASSAY_PUBLISH_DEADLINE", Default: "24h", Usage: "an outcome's publication to each target is tried this long, then failed (assay publish retry sends it again)"},
	{Name: "ASSAY_GITHUB_API_URL", Default: "https://api.github.com", Usage: "where check runs and review comments are published"},
	{Name: "ASSAY_GITHUB_APP_ID", Default: "none (record what would be published)", Usage: "the GitHub App's id, to publish as the app"},
	{Name: "ASSAY_GITHUB_APP_KEY_FILE", Default: "none", Usage: "the GitHub App's private key (PEM); required with ASSAY_GITHUB_APP_ID"},
	{Name: "ASSAY_PUBLISH_CONCURRENCY", Default: "4", Usage: "publications to GitHub tried at once"},
	{Name: "ASSAY_CALLBACK_CONCURRENCY", Default: "4", Usage: "callbacks tried at once, apart from GitHub's"},
	{Name: "ASSAY_GITHUB_WRITES_PER_MINUTE", Default: "80", Usage: "content-creating requests each installation may make in any minute, shared by every publisher of the budget"},
	{Name: "ASSAY_GITHUB_WRITES_PER_HOUR", Default: "500", Usage: "content-creating requests each installation may make in any hour"},
	{Name: "ASSAY_GITHUB_BUDGET_NATS_URL", Default: "none (the cell's own account)", Usage: "the region's account, where every cell's publishers share each installation's write budget"},
}

// FromEnv fills ASSAY_ACK_WAIT (the result consumers' ack wait),
// ASSAY_COMMITTER_REAP_EVERY and ASSAY_COMMITTER_REAP_GRACE (Go durations)
// from the environment. Errors name the variable.
//
// It also reads ASSAY_PUBLISH_DEADLINE and the GitHub App settings:
// ASSAY_GITHUB_APP_ID (a positive integer), ASSAY_GITHUB_APP_KEY_FILE (a
// PEM RSA key, required with the id) and ASSAY_GITHUB_API_URL.
func (c *Config) FromEnv(getenv func(string) string) error {
	if err := config.Durations(getenv,
		config.Duration{Name: "ASSAY_ACK_WAIT", To: &c.AckWait, Min: 100 * time.Millisecond, Max: 24 * time.Hour},
		config.Duration{Name: "ASSAY_COMMITTER_REAP_EVERY", To: &c.ReapEvery, Min: 100 * time.Millisecond, Max: 24 * time.Hour},
		config.Duration{Name: "ASSAY_COMMITTER_REAP_GRACE", To: &c.ReapGrace, Min: 100 * time.Millisecond, Max: 24 * time.Hour},
		config.Duration{Name: "ASSAY_PUBLISH_DEADLINE", To: &c.PublishDeadline, Min: time.Minute, Max: 30 * 24 * time.Hour}); err != nil {
		return err
	}
	for _, n := range []struct {
		name     string
		to       *int
		min, max int
	}{{"ASSAY_PUBLISH_CONCURRENCY", &c.PublishConcurrency, 1, 256}, {"ASSAY_CALLBACK_CONCURRENCY", &c.CallbackConcurrency, 1, 256},
		{"ASSAY_GITHUB_WRITES_PER_MINUTE", &c.GitHubWritesPerMinute, 1, 1_000_000}, {"ASSAY_GITHUB_WRITES_PER_HOUR", &c.GitHubWritesPerHour, 1, 60_000_000}} {
		if err := config.Int(getenv, n.name, n.to, n.min, n.max); err != nil {
			return err
		}
	}
	if c.GitHubWritesPerMinute > 0 && c.GitHubWritesPerHour > 0 && c.GitHubWritesPerMinute > c.GitHubWritesPerHour {
		return config.Invalid(fmt.Errorf("ASSAY_GITHUB_WRITES_PER_MINUTE: %d is more than ASSAY_GITHUB_WRITES_PER_HOUR (%d)",
			c.GitHubWritesPerMinute, c.GitHubWritesPerHour))
	}
	if v := getenv("ASSAY_GITHUB_BUDGET_NATS_URL"); v != "" {
		if err := config.CheckNATSURL(v); err != nil {
			return fmt.Errorf("ASSAY_GITHUB_BUDGET_NATS_URL: %w", err)
		}
		c.GitHubBudgetNATSURL = v
	}
	if v := getenv("ASSAY_GITHUB_API_URL"); v != "" {
		if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("ASSAY_GITHUB_API_URL: %q is not an http(s) URL", config.Redacted(v))
		}
		c.GitHubAPI = v
	}
	id, key, err := githubapp.FromEnv(getenv)
	if err != nil {
		return err
	}
	c.GitHubAppID, c.GitHubKey = id, key
	return nil
}

// JetStream is what the committer asks of NATS JetStream; a
// jetstream.JetStream is one.
type JetStream interface {
	jetstream.Publisher             // the outbox relay's announcements
	jetstream.StreamManager         // the OUTCOME stream
	jetstream.StreamConsumerManager // the ATTEMPT, RESULT and OUTCOME consumers
	jetstream.KeyValueManager       // the GitHub write budgets, kept in the cell's account
	// Conn is the connection, read for the largest payload its server
	// takes.
	Conn() *nats.Conn
}

var _ JetStream = jetstream.JetStream(nil)

// Deps are what the committer talks to.
type Deps struct {
	Store     Store
	JS        JetStream
	Contracts *contract.Registry
	Log       *slog.Logger
	Tel       *telemetry.Provider
}

// Service is one committer instance.
type Service struct {
	cfg       Config
	d         Deps
	verdicts  metric.Int64Counter
	shadows   metric.Int64Counter
	refused   metric.Int64Counter
	endToEnd  metric.Float64Histogram
	onError   consumer.Step[event.Result] // what a commit's error does to its message
	results   *consumer.Consumer          // on ATTEMPT
	earlier   *consumer.Consumer          // on RESULT
	reaper    lifecycle.Ticker
	streams   *event.Keeper
	relay     *outbox.Relay
	announcer lifecycle.Ticker
	publisher *publish.Publisher
	budget    budgetConn
	// The reads of the answers to gate and the commits of concurrent
	// results, in groups (group commit).
	answers *group.Batch[store.AnswerReq, store.Answer]
	commits *group.Batch[store.CommitReq, store.CommitVerdict]
}

// Consumer is the durable name of the committer's consumers on ATTEMPT and
// RESULT.
func Consumer(n event.Names) string { return n.ResultConsumer() }

// New checks the config and builds the service.
func New(cfg Config, d Deps) (*Service, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, d: d,
		answers: &group.Batch[store.AnswerReq, store.Answer]{Run: d.Store.WorkAnswerGroup},
		commits: &group.Batch[store.CommitReq, store.CommitVerdict]{Run: d.Store.CommitGroup}}
	if err := s.buildMetrics(); err != nil {
		return nil, err
	}
	if err := s.buildResults(); err != nil {
		return nil, err
	}
	s.buildReaper()
	s.buildRelay()
	s.buildAnnouncer()
	if err := s.buildPublisher(); err != nil {
		return nil, err
	}
	return s, nil
}

// defaults checks the config and fills in what it leaves unset.
func (c *Config) defaults() error {
	if c.Region == "" {
		return errors.New("committer: Region is required")
	}
	if c.Names.Cell == "" {
		c.Names.Cell = c.Region
	}
	if err := c.Names.Check(); err != nil {
		return fmt.Errorf("committer: %w", err)
	}
	if c.GitHubAppID != 0 && c.GitHubKey == nil {
		return errors.New("committer: GitHubKey is required with GitHubAppID")
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 32
	}
	if c.ReapEvery == 0 {
		c.ReapEvery = 5 * time.Second
	}
	if c.ReapGrace <= 0 {
		c.ReapGrace = time.Minute
	}
	if c.AnnounceEvery == 0 {
		c.AnnounceEvery = time.Second
	}
	return nil
}

// buildMetrics sets up the committer's instruments: verdicts, shadow
// outcomes, end to end times and records the database refused.
func (s *Service) buildMetrics() error {
	meter := s.d.Tel.Meter()
	var err error
	if s.verdicts, err = meter.Int64Counter("assay_committer_verdicts",
		metric.WithDescription("final answers by verdict")); err != nil {
		return err
	}
	if s.shadows, err = meter.Int64Counter("assay_shadow_outcomes",
		metric.WithDescription("rollout shadow work (a candidate beside live work, or a rollout check's item) by contract, version and outcome")); err != nil {
		return err
	}
	if s.endToEnd, err = s.d.Tel.Seconds("assay_end_to_end", "from work created to its outcome"); err != nil {
		return err
	}
	s.refused, err = meter.Int64Counter("assay_store_refused",
		metric.WithDescription("records the cell's database refused for good (SQLSTATE class 22 or 23), not retried"))
	return err
}

// buildResults sets up the durable consumers that gate and commit every
// answer: on the ATTEMPT stream, whose events carry their attempt's
// result, and on the RESULT stream, where a classifier of an earlier
// release published results on their own (drained after an upgrade, then
// idle).
func (s *Service) buildResults() error {
	cfg, d := s.cfg, s.d
	s.onError = consumer.Step[event.Result]{Log: d.Log, Failed: "commit failed; will retry",
		Attrs: func(ev event.Result) []any { return []any{"key", ev.WorkID, "attempt", ev.AttemptID} }, Wait: time.Second}
	results := func(kind string, handle consumer.Handler) (*consumer.Consumer, error) {
		return consumer.New(consumer.Config{JS: d.JS, Stream: cfg.Names.Stream(kind),
			Durable: event.ConsumerSettings{Durable: Consumer(cfg.Names), AckWait: cfg.AckWait, MaxDeliver: cfg.MaxDeliver,
				MaxAckPending: 4 * cfg.Concurrency},
			Concurrency: cfg.Concurrency, Log: d.Log,
			Meter: d.Tel.Meter(), Labels: []attribute.KeyValue{attribute.String("region", cfg.Region), attribute.String("lane", "")},
			Handle: handle})
	}
	var err error
	if s.results, err = results(event.KindAttempt, consumer.Typed(d.Log, event.AttemptResult, s.handleAttempt)); err != nil {
		return fmt.Errorf("committer: %w", err)
	}
	if s.earlier, err = results(event.KindResult, consumer.Typed(d.Log, event.Parse[event.Result], s.handle)); err != nil {
		return fmt.Errorf("committer: %w", err)
	}
	return nil
}

// buildReaper sets up the reaper, which reads back results the
// broker lost, every ReapEvery.
func (s *Service) buildReaper() {
	r := &s.reaper
	r.Name, r.Every, r.Log, r.PassTimeout = "committer reaper", s.cfg.ReapEvery, s.d.Log, time.Minute
	r.Pass = func(ctx context.Context) (bool, error) {
		n, err := s.Reap(ctx)
		return n >= reapBatch, err
	}
}

// buildRelay sets up the keeper of the OUTCOME stream and the outbox relay
// that publishes to it.
func (s *Service) buildRelay() {
	cfg, d := s.cfg, s.d
	owned := []string{event.KindOutcome}
	s.streams = &event.Keeper{JS: d.JS, Names: cfg.Names, Kinds: owned, Settings: cfg.Streams, Log: d.Log, Meter: d.Tel.Meter(), Region: cfg.Region}
	s.relay = &outbox.Relay{Store: d.Store, JS: d.JS, Log: d.Log, Streams: owned, Ensure: s.streams.Ensure,
		Meter: d.Tel.Meter(), Region: cfg.Region, SetAside: cfg.SetAside}
}

// buildAnnouncer sets up the announcer, which writes outcomes reached
// outside the commit transaction to the OUTCOME outbox every
// AnnounceEvery.
func (s *Service) buildAnnouncer() {
	a := &s.announcer
	a.Name, a.Every, a.Log, a.PassTimeout = "committer outcome announcer", s.cfg.AnnounceEvery, s.d.Log, time.Minute
	a.Pass = s.announcePass
}

// announcePass writes one batch of outcomes to the OUTCOME outbox and
// records the end of each; true when there may be more.
func (s *Service) announcePass(ctx context.Context) (bool, error) {
	var ended []*store.Work
	announce := s.announce(ctx)
	n, err := s.d.Store.AnnounceOutcomes(ctx, announceBatch, func(w *store.Work, state string) ([]store.OutboxMsg, error) {
		ended = append(ended, w)
		return announce(w, state)
	})
	if n > 0 {
		s.relay.Kick()
	}
	if err == nil {
		// Once announced, never again: each ending counts once.
		for _, w := range ended {
			s.recordEnd(ctx, w, w.State, w.UpdatedAt.Sub(w.CreatedAt))
		}
	}
	return n == announceBatch, err
}

// buildPublisher sets up the publisher of outcomes to their targets: to
// GitHub as the GitHub App when the config names one.
func (s *Service) buildPublisher() error {
	cfg := s.cfg
	pc := publish.Config{Region: cfg.Region, Names: cfg.Names, Rerun: cfg.Rerun, Deadline: cfg.PublishDeadline,
		Backoff: cfg.PublishBackoff, RetryEvery: cfg.PublishRetryEvery, CountEvery: cfg.PublishCountEvery, Now: cfg.Now,
		Concurrency: cfg.PublishConcurrency, CallbackConcurrency: cfg.CallbackConcurrency}
	if pc.Rerun == nil {
		pc.Rerun = func(id string) string { return fmt.Sprintf("assay work rerun %s --region %s", id, cfg.Region) }
	}
	if cfg.GitHubAppID != 0 {
		api := cfg.GitHubAPI
		if api == "" {
			api = "https://api.github.com"
		}
		pc.GitHub = &publish.GitHub{App: &githubapp.App{API: api, ID: cfg.GitHubAppID, Key: cfg.GitHubKey, Now: cfg.Now,
			UserAgent: "assay-publisher"},
			Budget: &publish.Budget{PerMinute: cfg.GitHubWritesPerMinute, PerHour: cfg.GitHubWritesPerHour, Now: cfg.Now, Open: s.openBudget}}
	}
	var err error
	if s.publisher, err = publish.New(pc, s.d.Store, s.d.JS, s.d.Log, s.d.Tel.Meter()); err != nil {
		return fmt.Errorf("committer: %w", err)
	}
	return nil
}

// recordEnd records one work item's end to end time, from its creation to
// its outcome. The cell records every ending here, once: the verdicts the
// committer reaches in the statement that announces them, and every other
// outcome (superseded, canceled, dropped, expired, out of attempts or
// budget, refused by the provider) when the announcer announces it, so
// the histogram's count by outcome is the cell's endings by outcome.
func (s *Service) recordEnd(ctx context.Context, w *store.Work, outcome string, took time.Duration) {
	if w.ShadowOf != "" {
		// A rollout's shadow: counted apart, never in the cell's service
		// levels.
		s.shadows.Add(ctx, 1, metric.WithAttributes(attribute.String("region", s.cfg.Region),
			attribute.String("contract", w.Contract), attribute.String("version", w.SchemaVersion),
			attribute.String("outcome", outcome)))
		return
	}
	s.endToEnd.Record(ctx, max(took, 0).Seconds(), metric.WithAttributes(attribute.String("region", s.cfg.Region),
		attribute.String("lane", w.Lane), attribute.String("contract", w.Contract), attribute.String("outcome", outcome),
		attribute.String("tenant", s.d.Tel.Tenant(w.TenantID))))
}

// announceBatch bounds the outcomes one announcer pass writes.
const announceBatch = 200

// announce builds the OUTCOME event of a work item's outcome. A
// rollout's shadow work has none: nothing is published or called back for
// it.
func (s *Service) announce(ctx context.Context) store.Announce {
	return func(w *store.Work, state string) ([]store.OutboxMsg, error) {
		if w.ShadowOf != "" {
			return nil, nil
		}
		id := event.OutcomeMsgID(w.ID, state)
		m, err := outbox.Msg(ctx, event.KindOutcome, s.cfg.Names.Outcome(w.TenantID), id,
			event.Outcome{OutcomeID: id, WorkID: w.ID, TenantID: w.TenantID, Region: s.cfg.Region, Outcome: state, At: time.Now().UTC()})
		if err != nil {
			return nil, err
		}
		return []store.OutboxMsg{m}, nil
	}
}

// Publisher is the service's publisher.
func (s *Service) Publisher() *publish.Publisher { return s.publisher }

// Start creates the OUTCOME stream it publishes to, starts its outbox
// relay and the publisher, consumes the ATTEMPT and RESULT streams (the classifier's;
// the consumer waits for it) and runs the reaper and the announcer.
func (s *Service) Start(ctx context.Context) error {
	if err := s.streams.Start(ctx); err != nil {
		return err
	}
	s.relay.MaxPayload = s.d.JS.Conn().MaxPayload()
	parts := []lifecycle.Service{s.relay, s.publisher, s.results, s.earlier}
	if s.cfg.ReapEvery > 0 {
		parts = append(parts, &s.reaper)
	}
	if s.cfg.AnnounceEvery > 0 {
		parts = append(parts, &s.announcer)
	}
	if err := lifecycle.StartAll(ctx, parts...); err != nil {
		s.streams.Stop(ctx)
		return err
	}
	return nil
}

// Stop stops the reaper and the announcer, then stops taking results and
// waits for the ones in hand, flushes the outbox and stops publishing.
// Idempotent.
func (s *Service) Stop(ctx context.Context) {
	lifecycle.StopAll(ctx, &s.reaper, &s.announcer, s.results, s.earlier, s.relay, s.publisher, s.streams)
	s.closeBudget()
}

// reapBatch bounds the events one reaper pass reads back.
const reapBatch = 200

// Reap reads back from the outbox the results the broker lost whose
// work still waits for a verdict, and commits them as if delivered: the
// commit is idempotent, so one that was only late changes nothing. It
// does the same for OUTCOME events the publisher recorded nothing for:
// the publication fence makes a late one change nothing, and once read
// each outcome has its rows (made, pending, failed, or skipped when it has
// nowhere to go), so none is read twice. Outcomes are read in batches
// until none is left, so many with nothing to publish never keep a lost
// one waiting for another pass. Neither is bounded by age: a committer
// back from an outage of a day reads back what it owes from then, and
// each pass ends by moving the cell's outcome mark up to the oldest
// outcome still owed, where the next pass starts reading.
func (s *Service) Reap(ctx context.Context) (int, error) {
	var results []event.Result
	for _, kind := range []string{event.KindAttempt, event.KindResult} {
		payloads, err := s.d.Store.UncommittedResults(ctx, kind, s.cfg.ReapGrace, reapBatch)
		if err != nil {
			return 0, err
		}
		for _, p := range payloads {
			ev, err := resultIn(kind, p)
			if err != nil {
				s.d.Log.Warn("undecodable "+kind+" event in the outbox", "err", err)
				continue
			}
			if ev != nil {
				results = append(results, *ev)
			}
		}
	}
	for _, ev := range results {
		telemetry.Decision(ctx, s.d.Log, ev.WorkID, "reaped", "result published but its answer still waits for a verdict; read back from the outbox",
			slog.String("attempt", ev.AttemptID))
		if err := s.Commit(ctx, ev); err != nil {
			return 0, err
		}
	}
	outcomes := 0
	seen := map[string]bool{}
	for ctx.Err() == nil {
		n, fresh, err := s.reapOutcomes(ctx, seen)
		outcomes += fresh
		if err != nil {
			return 0, err
		}
		if n < reapBatch || fresh < n {
			// The rest, and any read again because nothing could be
			// recorded for it now, are the next pass's.
			break
		}
	}
	// What this pass read has its rows now: the mark moves up to the
	// oldest outcome still owed, the next pass's start.
	if _, err := s.d.Store.AdvanceOutcomeMark(ctx); err != nil {
		return 0, err
	}
	return max(len(results), outcomes), nil
}

// resultIn is the result an outbox payload of kind carries: an ATTEMPT
// event's, nil when it has none, or a RESULT event.
func resultIn(kind string, payload []byte) (*event.Result, error) {
	if kind == event.KindResult {
		ev, err := event.Parse[event.Result](payload)
		return &ev, err
	}
	return event.AttemptResult(payload)
}

// reapOutcomes reads back one batch of OUTCOME events and publishes those
// not seen yet in this pass; fresh counts them.
func (s *Service) reapOutcomes(ctx context.Context, seen map[string]bool) (n, fresh int, err error) {
	outcomes, err := s.d.Store.UnpublishedOutcomes(ctx, s.cfg.ReapGrace, reapBatch)
	if err != nil {
		return 0, 0, err
	}
	for _, p := range outcomes {
		ev, err := event.Parse[event.Outcome](p)
		if err != nil || seen[ev.OutcomeID] {
			if err != nil {
				s.d.Log.Warn("undecodable OUTCOME event read back", "err", err)
			}
			continue
		}
		seen[ev.OutcomeID] = true
		fresh++
		telemetry.Decision(ctx, s.d.Log, ev.WorkID, "reaped", "OUTCOME event published but nothing recorded for it; read back from the cell's database",
			slog.String("work_outcome", ev.Outcome))
		if err := s.publisher.Publish(ctx, ev); err != nil {
			s.d.Log.Warn("reaped outcome not recorded; the next pass tries again", "key", ev.WorkID, "err", err)
		}
	}
	return len(outcomes), fresh, nil
}

// Ready reports whether the service can take results.
func (s *Service) Ready(ctx context.Context) error {
	if err := s.d.Store.Ping(ctx); err != nil {
		return err
	}
	if err := s.streams.Ready(ctx); err != nil {
		return err
	}
	if err := s.publisher.Ready(ctx); err != nil {
		return err
	}
	if err := s.results.Ready(ctx); err != nil {
		return err
	}
	return s.earlier.Ready(ctx)
}

// handleAttempt commits the result an ATTEMPT event carries; a call that is
// one part of a review in parts carries none, and is the ledger's alone.
func (s *Service) handleAttempt(ctx context.Context, res *event.Result, d consumer.Delivery) consumer.Disposition {
	if res == nil {
		return consumer.Done()
	}
	return s.handle(ctx, *res, d)
}

// handle commits each result; a commit that failed is tried again a
// second later.
func (s *Service) handle(ctx context.Context, ev event.Result, _ consumer.Delivery) consumer.Disposition {
	return s.onError.Settle(ctx, ev, s.Commit(ctx, ev))
}

// Commit applies one result. It is idempotent: a redelivered event
// finds the work already decided and changes nothing.
func (s *Service) Commit(ctx context.Context, ev event.Result) error {
	ctx, span := s.d.Tel.Tracer().Start(ctx, "committer.commit", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("assay.work_id", ev.WorkID), attribute.String("assay.attempt_id", ev.AttemptID)))
	defer span.End()
	act, reason := screen(ev, s.cfg.Region)
	var w *store.Work
	var c *contract.Contract
	var answer []byte
	if act == check {
		var err error
		got := s.answers.Do(ctx, store.AnswerReq{WorkID: ev.WorkID, AttemptID: ev.AttemptID})
		if w, answer, err = got.Work, got.Answer, got.Err; errors.Is(err, store.ErrNotFound) {
			w = nil
		} else if err != nil {
			return err
		}
		known := false
		if w != nil {
			// The version the work was made for: v1 work finishing during
			// a switch to v2 is gated as v1.
			c, known = s.d.Contracts.Of(w.Contract, w.SchemaVersion)
		}
		act, reason = triage(ev, w, known)
	}
	switch act {
	case record:
		telemetry.Decision(ctx, s.d.Log, ev.WorkID, ev.Outcome, reason, slog.String("attempt", ev.AttemptID))
		return nil
	case refuse:
		telemetry.Decision(ctx, s.d.Log, ev.WorkID, "refused", reason, slog.String("attempt", ev.AttemptID))
		return nil
	case markStale:
		ok, err := s.d.Store.MarkStale(ctx, ev.AttemptID)
		if err != nil {
			return err
		}
		return s.decided(ctx, w, ev, marked(ok, w.State), false)
	case reject:
		return s.reject(ctx, w, ev, reason)
	}
	acc, fail := gate.Check(c, answer, gate.ExpectFor(c, gate.Seen{WorkID: ev.WorkID,
		SchemaVersion: ev.SchemaVersion, TaxonomyVersion: ev.TaxonomyVersion, Digest: ev.Digest}, w.Digest, []byte(w.Input)))
	if fail != nil {
		return s.reject(ctx, w, ev, fail.Error())
	}
	// The result is the gate's canonical JSON, the one reading every later
	// reader gets; the answer as the model sent it stays on its attempt.
	v, written, err := s.commit(ctx, w, ev, acc.Output, len(acc.Findings))
	if store.Permanent(err) {
		// Refused for good: a retry would only loop. The answer cannot
		// become a result; the work ends with the reason.
		s.refused.Add(ctx, 1, metric.WithAttributes(attribute.String("region", s.cfg.Region)))
		return s.reject(ctx, w, ev, fmt.Sprintf("the cell's database refused the result for good (SQLSTATE %s); not retried",
			store.SQLState(err)))
	}
	if err != nil {
		return err
	}
	s.relay.Send(written...)
	return s.decided(ctx, w, ev, committed(v), true, slog.Int("findings", len(acc.Findings)))
}

// commit commits an accepted answer in a group with those of other
// results in hand, its outcome's events with it, and returns the events it
// wrote.
func (s *Service) commit(ctx context.Context, w *store.Work, ev event.Result, output json.RawMessage,
	findings int) (store.Verdict, []store.OutboxMsg, error) {
	announce := s.announce(ctx)
	req := store.CommitReq{Work: w, AttemptID: ev.AttemptID, Token: ev.LeaseToken, Output: output, Findings: findings, Announce: true}
	var err error
	if req.Accepted, err = announce(w, outcome.Accepted); err != nil {
		return store.Lost, nil, err
	}
	if req.Expired, err = announce(w, outcome.Expired); err != nil {
		return store.Lost, nil, err
	}
	// The outcome's event has no outbox row: the work row the commit
	// writes says it (UnpublishedOutcomes rebuilds a lost one from it),
	// and it is handed to the relay below once committed.
	store.NoRows(req.Accepted)
	store.NoRows(req.Expired)
	got := s.commits.Do(ctx, req)
	switch {
	case got.Err != nil:
		return got.Verdict, nil, got.Err
	case got.Verdict == store.Committed:
		return got.Verdict, req.Accepted, nil
	case got.Verdict == store.Late:
		return got.Verdict, req.Expired, nil
	}
	return got.Verdict, nil, nil
}

func (s *Service) reject(ctx context.Context, w *store.Work, ev event.Result, reason string) error {
	ok, err := s.d.Store.Reject(ctx, w, ev.AttemptID, ev.LeaseToken, reason, s.announce(ctx))
	if err != nil {
		return err
	}
	if ok {
		s.relay.Kick()
	}
	return s.decided(ctx, w, ev, rejected(ok, reason), true)
}

// decided logs a verdict and, when it is one of a final answer's, counts it;
// work it ended has its end-to-end time recorded.
func (s *Service) decided(ctx context.Context, w *store.Work, ev event.Result, v verdict, count bool, attrs ...slog.Attr) error {
	if count && w.ShadowOf == "" {
		s.verdicts.Add(ctx, 1, metric.WithAttributes(attribute.String("verdict", v.word), attribute.String("region", s.cfg.Region)))
	}
	if v.word == verdictAccepted || v.word == verdictRejected || v.word == verdictLate {
		s.recordEnd(ctx, w, v.word, time.Since(w.CreatedAt))
	}
	telemetry.Decision(ctx, s.d.Log, w.ID, v.word, v.reason, append([]slog.Attr{slog.String("attempt", ev.AttemptID)}, attrs...)...)
	return nil
}
