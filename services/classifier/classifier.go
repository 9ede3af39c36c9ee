// Package classifier is the only caller of the model. It claims work under a
// lease, calls the model once per attempt with a deadline, checks the answer
// against the contract to decide on a repair, and hands every attempt to the
// committer and the ledger in one ATTEMPT event per attempt through its
// outbox.
package classifier

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"assay.dev/pkg/admission"
	"assay.dev/pkg/config"
	"assay.dev/pkg/consumer"
	"assay.dev/pkg/contract"
	"assay.dev/pkg/event"
	"assay.dev/pkg/group"
	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/model"
	"assay.dev/pkg/outbox"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/price"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

// Config of one classifier instance.
type Config struct {
	// Region is the region this instance serves.
	Region string
	// Names are the cell's NATS names. Default the cell named after Region
	// in the default installation.
	Names event.Names
	// Streams configure the RESULT and ATTEMPT streams, which the
	// classifier owns.
	Streams event.StreamSettings
	// SetAside bounds how long an outbox row that cannot be published is
	// tried before it is set aside.
	SetAside store.SetAsidePolicy
	// Model is the model name recorded on every attempt.
	Model string
	// Concurrency is the hard ceiling on model calls at once in this cell,
	// held across every instance of the cell through its slots bucket
	// (admission.CellSlots); each instance's adaptive limit moves below it.
	// Default 32.
	Concurrency int
	// InstanceScope makes Concurrency this instance's ceiling alone, with
	// no slots shared through NATS (ASSAY_MODEL_CONCURRENCY_SCOPE=instance):
	// then N instances may make N × Concurrency calls at once.
	InstanceScope bool
	// InitialConcurrency is where the adaptive limit starts. Default 4.
	InitialConcurrency int
	// FixedConcurrency keeps the limit at Concurrency, with no adaptation,
	// for a provider whose capacity is known and reserved.
	FixedConcurrency bool
	// SplitEvents writes an attempt as a RESULT event and, for a call, an
	// ATTEMPT event without the result (ASSAY_ATTEMPT_EVENTS=split): what
	// committers and ledgers of releases before one event per attempt
	// read. For a rollout from such a release, and a rollback to one.
	SplitEvents bool
	// LeaseTTL is how long a claim holds without a heartbeat. Default 30s.
	LeaseTTL time.Duration
	// Heartbeat is how often a running call extends its lease and tells
	// JetStream it is still working. Default LeaseTTL/3; negative disables
	// (for tests that need a lease to lapse).
	Heartbeat time.Duration
	// HandoffTTL is how long the lease is kept after a result is handed to
	// the committer. Default 5m.
	HandoffTTL time.Duration
	// CallTimeout bounds one model call (and the work's deadline bounds it
	// further). Default 60s.
	CallTimeout time.Duration
	// DeadlineMargin is the time an answer needs after its call to be
	// checked and committed. Work with less than twice a typical call plus
	// this margin left ends expired instead of taking a permit. Default
	// 500ms; negative means none.
	DeadlineMargin time.Duration
	// MaxAttempts bounds model calls per work item. Default 5.
	MaxAttempts int
	// MaxRepairs bounds re-asks that tell the model what failed. Default 1;
	// negative allows none.
	MaxRepairs int
	// BackoffBase and BackoffCap shape the capped exponential backoff with
	// full jitter used when the provider gives no Retry-After.
	// Defaults 500ms and 30s.
	BackoffBase, BackoffCap time.Duration
	// AckWait and MaxDeliver configure the durable consumer.
	// Defaults 30s and 50.
	AckWait    time.Duration
	MaxDeliver int
	// Prices estimate an attempt's cost for its budget reservation; the
	// ledger settles it from the same table. Default price.Default.
	Prices price.Prices
	// MaxOutputUnits caps every answer (max_tokens) and bounds the
	// reservation. Default 4096.
	MaxOutputUnits int
	// BytesPerUnit is how many request bytes the estimate counts as one
	// unit. Default 1, which no tokenizer undercuts; a larger value admits
	// more attempts but lets a misestimate spend past the budget.
	BytesPerUnit float64
	// PartUnits, when positive, is the size of a part of a diff reviewed in
	// parts, in model units, in place of the contracts' own (a contract
	// without parts is never cut).
	PartUnits int
	// WorkCostCap, when positive, bounds what one work item's calls may
	// cost in micro-dollars, at their estimates, in place of the
	// contracts' own caps: a review in parts that reaches it is a partial
	// review.
	WorkCostCap int64
	// PartConcurrency bounds the calls one work item reviewed in parts
	// makes at once (ASSAY_REVIEW_PART_CONCURRENCY). Each call beyond the
	// first also takes its tenant's turn in the lane and a permit of the
	// cell's limiter. Default 8.
	PartConcurrency int
	// ProviderBatch sends batch-lane work through the provider's Batch
	// API. Default off.
	ProviderBatch ProviderBatch
	// FairWindow is how many messages per lane are held beyond the limit,
	// among which the tenants are served in turn by weight. Default 128.
	FairWindow int
	// ReportEvery is how often the instance reports the cell's capacity
	// to ingress. Default 250ms; negative reports nothing.
	ReportEvery time.Duration
	// WeightsEvery is how often the tenants' weights are read again.
	// Default 10s.
	WeightsEvery time.Duration
	// Circuit shapes the cell's circuit breakers, one per model it calls.
	Circuit CircuitConfig
}

func (c *Config) defaults() error {
	if c.Region == "" {
		return errors.New("classifier: Region is required")
	}
	if c.Model == "" {
		return errors.New("classifier: Model is required")
	}
	if c.Names.Cell == "" {
		c.Names.Cell = c.Region
	}
	if err := c.Names.Check(); err != nil {
		return fmt.Errorf("classifier: %w", err)
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 32
	}
	if c.InitialConcurrency <= 0 {
		c.InitialConcurrency = min(4, c.Concurrency)
	}
	if c.InitialConcurrency > c.Concurrency {
		return fmt.Errorf("classifier: InitialConcurrency %d is above the ceiling Concurrency %d", c.InitialConcurrency, c.Concurrency)
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 30 * time.Second
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = c.LeaseTTL / 3
	}
	if c.HandoffTTL == 0 {
		c.HandoffTTL = 5 * time.Minute
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = 60 * time.Second
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 5
	}
	if c.DeadlineMargin == 0 {
		c.DeadlineMargin = 500 * time.Millisecond
	}
	c.DeadlineMargin = max(c.DeadlineMargin, 0)
	if c.MaxRepairs == 0 {
		c.MaxRepairs = 1
	}
	c.MaxRepairs = max(c.MaxRepairs, 0)
	if c.BackoffBase == 0 {
		c.BackoffBase = 500 * time.Millisecond
	}
	if c.BackoffCap == 0 {
		c.BackoffCap = 30 * time.Second
	}
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = 50
	}
	if c.Prices == nil {
		c.Prices = price.Default
	}
	if _, ok := c.Prices["*"]; !ok {
		return errors.New(`classifier: the price table needs a "*" entry`)
	}
	if c.MaxOutputUnits <= 0 {
		c.MaxOutputUnits = 4096
	}
	if c.BytesPerUnit <= 0 {
		c.BytesPerUnit = 1
	}
	if c.FairWindow <= 0 {
		c.FairWindow = 128
	}
	if c.ReportEvery == 0 {
		c.ReportEvery = 250 * time.Millisecond
	}
	if c.WeightsEvery <= 0 {
		c.WeightsEvery = 10 * time.Second
	}
	return c.partDefaults()
}

// Completer is the one method of the model adapter the classifier uses.
type Completer interface {
	Complete(ctx context.Context, call model.Call) (*model.Reply, error)
}

// JetStream is what the classifier asks of NATS JetStream; a
// jetstream.JetStream is one.
type JetStream interface {
	jetstream.Publisher             // the outbox relay's announcements
	jetstream.StreamManager         // the RESULT and ATTEMPT streams
	jetstream.StreamConsumerManager // the lanes' consumers; the committer's, read for its backlog
	jetstream.KeyValueManager       // the capacity and model-call slot buckets
	// Conn is the connection, read for the largest payload its server
	// takes and subscribed to the cancels.
	Conn() *nats.Conn
}

var _ JetStream = jetstream.JetStream(nil)

// Deps are what the classifier talks to.
type Deps struct {
	Store     Store
	JS        JetStream
	Model     Completer
	Contracts *contract.Registry
	Log       *slog.Logger
	Tel       *telemetry.Provider
	// Limiter is the cell's concurrency limit for its provider. Default: a
	// new one from the config, taking the cell's slots unless
	// Config.InstanceScope; instances in one process that call the same
	// provider for the same cell may share one.
	Limiter *admission.Limiter
	// Batches is the provider's Batch API, used when
	// Config.ProviderBatch is on. Default: Model, when it is a
	// *model.Client.
	Batches BatchAPI
}

// Service is one classifier instance.
type Service struct {
	cfg     Config
	d       Deps
	streams *event.Keeper
	relay   *outbox.Relay
	lim     *admission.Limiter
	slots   *admission.CellSlots // the cell's model-call slots; nil in instance scope
	lanes   []*consumer.Consumer
	// batches sends batch-lane work through the provider's Batch API;
	// nil when the cell does not.
	batches *batchLane
	// prompts holds the contracts of rollout prompts read so far, by digest.
	prompts sync.Map
	// budgets remembers whether each tenant had a budget, for claims on an
	// announcement's facts.
	budgets budgets
	fair    *fairLanes
	report  lifecycle.Ticker
	circs   *circuits
	// The hot path's statements in groups (group commit): reads of the
	// work to run, claims and attempt records of concurrent calls.
	toRun   *group.Batch[string, store.ToRun]
	claims  *group.Batch[store.ClaimReq, store.Claimed]
	records *group.Batch[store.AttemptRecord, store.AttemptRecorded]

	attempts     metric.Int64Counter
	storeRefused metric.Int64Counter
	m            *metrics

	mu      sync.Mutex
	running map[string]context.CancelCauseFunc // work id -> its model call, or all its parts' calls
	cancels *nats.Subscription
}

// errSuperseded cancels a model call whose work a newer revision replaced.
var errSuperseded = errors.New("superseded by a newer revision")

// New checks the config and builds the service.
func New(cfg Config, d Deps) (*Service, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, d: d, lim: d.Limiter, running: map[string]context.CancelCauseFunc{}, fair: newFairLanes(),
		toRun:   &group.Batch[string, store.ToRun]{Run: d.Store.WorkToRunGroup},
		claims:  &group.Batch[store.ClaimReq, store.Claimed]{Run: d.Store.ClaimGroup},
		records: &group.Batch[store.AttemptRecord, store.AttemptRecorded]{Run: d.Store.RecordAttemptGroup}}
	s.startReporter()
	s.buildRelay()
	if err := s.buildLimiter(); err != nil {
		return nil, err
	}
	var err error
	if s.m, err = newMetrics(d.Tel, cfg.Region); err != nil {
		return nil, err
	}
	if s.circs, err = newCircuits(cfg.Circuit, cfg.Names, cfg.Region, d.Store, d.Log, d.Tel.Meter()); err != nil {
		return nil, err
	}
	// The cell's own model has its circuit from the start, so its gauge
	// reads 0 before any call; a rollout's model gets one on first use.
	s.circs.of(cfg.Model)
	if err := s.buildCounters(); err != nil {
		return nil, err
	}
	if err := s.observeLimits(); err != nil {
		return nil, err
	}
	if s.batches, err = newBatchLane(s, cfg.ProviderBatch, d); err != nil {
		return nil, err
	}
	if err := s.buildLanes(); err != nil {
		return nil, err
	}
	return s, nil
}

// buildRelay sets up the keeper of the RESULT and ATTEMPT streams and the
// outbox relay that publishes to them.
func (s *Service) buildRelay() {
	cfg, d := s.cfg, s.d
	owned := []string{event.KindResult, event.KindAttempt}
	s.streams = &event.Keeper{JS: d.JS, Names: cfg.Names, Kinds: owned, Settings: cfg.Streams, Log: d.Log, Meter: d.Tel.Meter(), Region: cfg.Region}
	s.relay = &outbox.Relay{Store: d.Store, JS: d.JS, Log: d.Log, Streams: owned, Ensure: s.streams.Ensure,
		Meter: d.Tel.Meter(), Region: cfg.Region, SetAside: cfg.SetAside}
}

// buildLimiter sets up the cell's concurrency limiter, with the cell's
// slots unless Config.InstanceScope, when Deps gave none.
func (s *Service) buildLimiter() error {
	if s.lim != nil {
		return nil
	}
	cfg, d := s.cfg, s.d
	lc := admission.LimiterConfig{Initial: cfg.InitialConcurrency, Max: cfg.Concurrency, SlowStart: true,
		OnChange: s.limitChanged, Headroom: cfg.FairWindow}
	if cfg.FixedConcurrency {
		lc.Initial, lc.Min = cfg.Concurrency, cfg.Concurrency
	}
	if !cfg.InstanceScope {
		s.slots = &admission.CellSlots{Size: cfg.Concurrency, Holder: newInstanceID(), Log: d.Log,
			Open: admission.OpenSlots(d.JS, cfg.Names.CallsBucket(), admission.SlotTTL, cfg.Streams)}
		lc.Cell = s.slots
	}
	var err error
	if s.lim, err = admission.NewLimiter(lc); err != nil {
		return fmt.Errorf("classifier: %w", err)
	}
	return nil
}

// buildCounters sets up the counters of attempts and of records the
// database refused.
func (s *Service) buildCounters() error {
	var err error
	s.attempts, err = s.d.Tel.Meter().Int64Counter("assay_classifier_attempts",
		metric.WithDescription("model-call attempts by outcome"))
	if err != nil {
		return err
	}
	s.storeRefused, err = s.d.Tel.Meter().Int64Counter("assay_store_refused",
		metric.WithDescription("records the cell's database refused for good (SQLSTATE class 22 or 23), not retried"))
	return err
}

// observeLimits registers the instruments read from the limiter and the
// cell's slots when they are collected.
func (s *Service) observeLimits() error {
	meter := s.d.Tel.Meter()
	region := metric.WithAttributes(attribute.String("region", s.cfg.Region))
	_, err := meter.Int64ObservableGauge("assay_classifier_limit",
		metric.WithDescription("model calls the adaptive limit allows at once"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(int64(s.lim.Limit()), region)
			return nil
		}))
	if err != nil {
		return err
	}
	_, err = meter.Int64ObservableGauge("assay_classifier_in_flight",
		metric.WithDescription("model calls running now"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(int64(s.lim.Stats().InFlight), region)
			return nil
		}))
	if err != nil {
		return err
	}
	_, err = meter.Int64ObservableGauge("assay_classifier_cell_slots",
		metric.WithDescription("the cell's model-call slots this instance holds (all its instances together hold at most ASSAY_MODEL_MAX_CONCURRENCY)"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			if s.slots != nil {
				o.Observe(int64(s.slots.Held()), region)
			}
			return nil
		}))
	if err != nil {
		return err
	}
	_, err = meter.Int64ObservableCounter("assay_classifier_cell_slots_lost",
		metric.WithDescription("model-call slots that lapsed while this instance held them (cut from NATS past their TTL): calls above the cell's ceiling"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			if s.slots != nil {
				o.Observe(s.slots.Lost(), region)
			}
			return nil
		}))
	return err
}

// buildLanes sets up the durable WORK consumer of each lane, each
// delivery gated by the limiter.
func (s *Service) buildLanes() error {
	cfg, d := s.cfg, s.d
	handle := consumer.Typed(d.Log, event.Parse[event.Work], s.Process)
	for _, lane := range lanes {
		c, err := consumer.New(consumer.Config{JS: d.JS, Stream: cfg.Names.Stream(event.KindWork),
			Durable: event.ConsumerSettings{Durable: Consumer(cfg.Names, lane), Filter: cfg.Names.Lane(lane),
				AckWait: cfg.AckWait, MaxDeliver: cfg.MaxDeliver, MaxAckPending: 4*cfg.Concurrency + cfg.FairWindow},
			Gate: func(ctx context.Context) (func(), error) { return s.lim.Enter(ctx, lane) },
			Pull: lanePull(lane), Handle: handle, Log: d.Log,
			Meter: d.Tel.Meter(), Labels: []attribute.KeyValue{attribute.String("region", cfg.Region), attribute.String("lane", lane)}})
		if err != nil {
			return fmt.Errorf("classifier: %w", err)
		}
		s.lanes = append(s.lanes, c)
	}
	return nil
}

// lanePull is how many announcements a lane's consumer pulls at a time.
// Interactive announcements are pulled 32 at a time, so the hand takes
// them as fast as they come and a steady tenant's waits there, where
// tenants take turns, not in the stream behind a noisy one's (with 2 at a
// time the stream held up to 34 of them under a tenfold overload). Batch
// keeps 2: its hand is full for long, and what waits pulled but outside
// the hand ages toward its ack wait.
func lanePull(lane string) int {
	if lane == event.Interactive {
		return 32
	}
	return 2
}

// Consumer names the durable WORK consumer of a lane.
func Consumer(n event.Names, lane string) string { return n.WorkConsumer(lane) }

// Lanes are consumed apart, so a batch backlog never stands in front of
// interactive work; they share the cell's limiter, where interactive goes
// first.
var lanes = event.Lanes

// Limiter is the instance's concurrency limiter.
func (s *Service) Limiter() *admission.Limiter { return s.lim }

// keepAlive calls alive every every until stop is called.
func keepAlive(alive func(), every time.Duration) (stop func()) {
	if every <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				alive()
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done); <-ended }) }
}

func (s *Service) limitChanged(old, new int, reason string) {
	outcome := "limit_raised"
	if new < old {
		outcome = "limit_lowered"
	}
	telemetry.Decision(context.Background(), s.d.Log, "limit:"+s.cfg.Region, outcome, reason,
		slog.Int("from", old), slog.Int("to", new))
}

// Relay is the relay the service hands the events of its records to once
// they have committed (an ATTEMPT event has no outbox row to be found by
// another relay's poll). Start runs it; a service driven by hand, without
// Start, runs it alone.
func (s *Service) Relay() *outbox.Relay { return s.relay }

// Start creates the RESULT and ATTEMPT streams it publishes to, listens
// for cancels, starts its outbox relay and consumes each lane of the WORK
// stream (created by ingress, which owns it; the consumers wait for it).
func (s *Service) Start(ctx context.Context) error {
	if err := s.streams.Start(ctx); err != nil {
		return err
	}
	s.relay.MaxPayload = s.d.JS.Conn().MaxPayload()
	// Cancels first, so no call starts unseen by them.
	cancels, err := s.d.JS.Conn().Subscribe(s.cfg.Names.Cancels(), s.onCancel)
	if err != nil {
		s.streams.Stop(ctx)
		return fmt.Errorf("classifier: subscribe to cancels: %w", err)
	}
	// Under mu: a Stop racing Start reads it there.
	s.mu.Lock()
	s.cancels = cancels
	s.mu.Unlock()
	parts := []lifecycle.Service{s.relay, &s.report}
	if s.batches != nil {
		parts = append(parts, &s.batches.ticker)
	}
	for _, l := range s.lanes {
		parts = append(parts, l)
	}
	if err := lifecycle.StartAll(ctx, parts...); err != nil {
		_ = cancels.Unsubscribe()
		s.streams.Stop(ctx)
		return fmt.Errorf("classifier: %w", err)
	}
	return nil
}

// Stop stops taking work, lets running calls finish until ctx ends (then
// cancels them, which requeues their work), and flushes the outbox.
// Idempotent.
func (s *Service) Stop(ctx context.Context) {
	lanes := make([]lifecycle.Service, len(s.lanes))
	for i, l := range s.lanes {
		lanes[i] = l
	}
	lifecycle.StopAllParallel(ctx, lanes...)
	if s.batches != nil {
		s.batches.ticker.Stop(ctx)
	}
	s.mu.Lock()
	cancels := s.cancels
	s.cancels = nil
	s.mu.Unlock()
	if cancels != nil {
		_ = cancels.Unsubscribe()
	}
	s.report.Stop(ctx)
	s.relay.Stop(ctx)
	s.streams.Stop(ctx)
	if s.slots != nil {
		s.slots.Stop()
	}
}

// Ready reports whether the service can take work: its database answers,
// its streams exist and both lanes are consumed.
func (s *Service) Ready(ctx context.Context) error {
	if err := s.d.Store.Ping(ctx); err != nil {
		return err
	}
	if err := s.streams.Ready(ctx); err != nil {
		return err
	}
	for _, l := range s.lanes {
		if err := l.Ready(ctx); err != nil {
			return err
		}
	}
	return nil
}

// onCancel stops the model call of superseded work if this instance runs
// it. Its answer, should one still arrive, is recorded stale.
func (s *Service) onCancel(msg *nats.Msg) {
	var c event.Cancel
	if err := event.Decode(msg.Data, &c); err != nil {
		s.d.Log.Warn("undecodable cancel message", "subject", msg.Subject, "err", err)
		return
	}
	s.mu.Lock()
	cancel := s.running[c.WorkID]
	s.mu.Unlock()
	if cancel != nil {
		cancel(errSuperseded)
		telemetry.Decision(context.Background(), s.d.Log, c.WorkID, outcome.Superseded, "model call canceled: "+c.Reason)
	}
}

// backoff is capped exponential backoff with full jitter.
func (s *Service) backoff(attempt int) time.Duration {
	ceiling := s.cfg.BackoffBase << min(attempt, 20)
	if ceiling <= 0 || ceiling > s.cfg.BackoffCap {
		ceiling = s.cfg.BackoffCap
	}
	n, err := rand.Int(rand.Reader, big.NewInt(int64(ceiling)))
	if err != nil {
		return ceiling
	}
	return time.Duration(n.Int64())
}

// Vars are the settings FromEnv reads, for the classifier's help.
var Vars = append([]config.Var{
	{Name: "ASSAY_MODEL_CONCURRENCY", Default: "adaptive", Usage: "adaptive, or fixed at ASSAY_MODEL_MAX_CONCURRENCY"},
	{Name: "ASSAY_MODEL_MAX_CONCURRENCY", Default: "32", Usage: "model calls in flight at most, per cell: every instance of the cell takes one of its slots per call"},
	{Name: "ASSAY_MODEL_CONCURRENCY_SCOPE", Default: "cell", Usage: "cell (the ceiling is the cell's, shared through NATS), or instance (each instance's own)"},
	{Name: "ASSAY_ATTEMPT_EVENTS", Default: "one", Usage: "one ATTEMPT event per attempt carrying its result, or split: a RESULT and an ATTEMPT event, as committers and ledgers of earlier releases read; split while any of those runs"},
	{Name: "ASSAY_MAX_ATTEMPTS", Default: "5", Usage: "model calls per work item at most"},
	{Name: "ASSAY_MAX_REPAIRS", Default: "1", Usage: "repair re-asks per work item at most (0: none)"},
	{Name: "ASSAY_CALL_TIMEOUT", Default: "60s", Usage: "one model call at most"},
	{Name: "ASSAY_LEASE_TTL", Default: "30s", Usage: "a claim's lease, extended while the call runs"},
	{Name: "ASSAY_ACK_WAIT", Default: "30s", Usage: "the WORK consumers' ack wait"},
	{Name: "ASSAY_HANDOFF_TTL", Default: "5m", Usage: "the lease an answer holds while the committer commits it"},
	{Name: "ASSAY_PRICE_TABLE", Default: "every model at 0.15/0.60 $/M units", Usage: "JSON price table file, for budget reservations"},
	{Name: "ASSAY_MAX_OUTPUT_UNITS", Default: "4096", Usage: "the answer's cap (max_tokens); doubled once for an answer cut at it"},
	{Name: "ASSAY_BUDGET_BYTES_PER_UNIT", Default: "1", Usage: "bytes per unit a reservation counts the request at, 1 to 16"},
	{Name: "ASSAY_REVIEW_PART_UNITS", Default: "the contract's (code-review: 12000)", Usage: "model units of diff one call of a review in parts carries; a larger diff is reviewed in parts"},
	{Name: "ASSAY_WORK_COST_CAP_MICROS", Default: "the contract's (none)", Usage: "micro-dollars one work item's calls may cost, a review in parts counting each part at what recent calls were billed; a review in parts stops there, a partial review"},
	{Name: "ASSAY_REVIEW_PART_CONCURRENCY", Default: "8", Usage: "calls one review in parts makes at once (1-64), each beyond the first taking its tenant's turn and a cell slot"},
}, append(batchVars, circuitVars...)...)

// FromEnv fills the budget and admission settings from the environment:
// ASSAY_PRICE_TABLE (a price table file), ASSAY_MAX_OUTPUT_UNITS,
// ASSAY_BUDGET_BYTES_PER_UNIT, ASSAY_MODEL_MAX_CONCURRENCY (the ceiling),
// ASSAY_MODEL_CONCURRENCY (adaptive or fixed), the retry bounds
// ASSAY_MAX_ATTEMPTS and ASSAY_MAX_REPAIRS, and the timings
// ASSAY_CALL_TIMEOUT, ASSAY_LEASE_TTL, ASSAY_ACK_WAIT and
// ASSAY_HANDOFF_TTL, and the provider batch settings
// (ASSAY_PROVIDER_BATCH…). Errors name the variable.
func (c *Config) FromEnv(getenv func(string) string) error {
	for _, n := range []struct {
		name     string
		to       *int
		min, max int
	}{
		{"ASSAY_MODEL_MAX_CONCURRENCY", &c.Concurrency, 1, 1024},
		{"ASSAY_MAX_ATTEMPTS", &c.MaxAttempts, 1, 100},
		{"ASSAY_MAX_REPAIRS", &c.MaxRepairs, 0, 10},
	} {
		if err := config.Int(getenv, n.name, n.to, n.min, n.max); err != nil {
			return err
		}
	}
	if getenv("ASSAY_MAX_REPAIRS") == "0" {
		c.MaxRepairs = -1 // none, where the zero value means the default
	}
	if err := config.Durations(getenv,
		config.Duration{Name: "ASSAY_CALL_TIMEOUT", To: &c.CallTimeout, Min: 100 * time.Millisecond, Max: time.Hour},
		config.Duration{Name: "ASSAY_LEASE_TTL", To: &c.LeaseTTL, Min: 100 * time.Millisecond, Max: 24 * time.Hour},
		config.Duration{Name: "ASSAY_ACK_WAIT", To: &c.AckWait, Min: 100 * time.Millisecond, Max: 24 * time.Hour},
		config.Duration{Name: "ASSAY_HANDOFF_TTL", To: &c.HandoffTTL, Min: 100 * time.Millisecond, Max: 24 * time.Hour},
	); err != nil {
		return err
	}
	if err := config.Choices(getenv,
		config.Choice{Name: "ASSAY_MODEL_CONCURRENCY_SCOPE", Default: "cell", Other: "instance", To: &c.InstanceScope},
		config.Choice{Name: "ASSAY_ATTEMPT_EVENTS", Default: "one", Other: "split", To: &c.SplitEvents},
		config.Choice{Name: "ASSAY_MODEL_CONCURRENCY", Default: "adaptive", Other: "fixed", To: &c.FixedConcurrency},
	); err != nil {
		return err
	}
	prices, err := price.Load(getenv("ASSAY_PRICE_TABLE"))
	if err != nil {
		return fmt.Errorf("ASSAY_PRICE_TABLE: %w", err)
	}
	c.Prices = prices
	if v := getenv("ASSAY_MAX_OUTPUT_UNITS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("ASSAY_MAX_OUTPUT_UNITS: %q is not a positive whole number", config.Redacted(v))
		}
		c.MaxOutputUnits = n
	}
	if v := getenv("ASSAY_BUDGET_BYTES_PER_UNIT"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 1 || f > 16 {
			return fmt.Errorf("ASSAY_BUDGET_BYTES_PER_UNIT: %q is not a number from 1 to 16", config.Redacted(v))
		}
		c.BytesPerUnit = f
	}
	if err := config.Int(getenv, "ASSAY_REVIEW_PART_UNITS", &c.PartUnits, 256, 1<<20); err != nil {
		return err
	}
	if err := config.Int(getenv, "ASSAY_REVIEW_PART_CONCURRENCY", &c.PartConcurrency, 1, maxPartConcurrency); err != nil {
		return err
	}
	if v := getenv("ASSAY_WORK_COST_CAP_MICROS"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return fmt.Errorf("ASSAY_WORK_COST_CAP_MICROS: %q is not a positive whole number of micro-dollars", config.Redacted(v))
		}
		c.WorkCostCap = n
	}
	if err := c.Circuit.fromEnv(getenv); err != nil {
		return err
	}
	return c.ProviderBatch.fromEnv(getenv)
}
