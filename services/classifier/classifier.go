// Package classifier is the only caller of the model. It claims work under a
// lease, calls the model once per attempt with a deadline, checks the answer
// against the contract to decide on a repair, and hands every attempt to the
// committer (RESULT) and the ledger (ATTEMPT) through its outbox.
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
	"assay.dev/pkg/model"
	"assay.dev/pkg/outbox"
	"assay.dev/pkg/price"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

// Config of one classifier instance.
type Config struct {
	// Region is the cell this instance serves.
	Region string
	// Model is the model name recorded on every attempt.
	Model string
	// Concurrency is the hard ceiling on model calls at once in this cell;
	// the adaptive limit moves below it. Default 32.
	Concurrency int
	// InitialConcurrency is where the adaptive limit starts. Default 4.
	InitialConcurrency int
	// FixedConcurrency keeps the limit at Concurrency, with no adaptation,
	// for a provider whose capacity is known and reserved.
	FixedConcurrency bool
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
	// MaxRepairs bounds re-asks that tell the model what failed. Default 1.
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
}

func (c *Config) defaults() error {
	if c.Region == "" {
		return errors.New("classifier: Region is required")
	}
	if c.Model == "" {
		return errors.New("classifier: Model is required")
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
	return nil
}

// Completer is the one method of the model adapter the classifier uses.
type Completer interface {
	Complete(ctx context.Context, call model.Call) (*model.Reply, error)
}

// Deps are what the classifier talks to.
type Deps struct {
	Store     *store.Store
	JS        jetstream.JetStream
	Model     Completer
	Contracts *contract.Registry
	Log       *slog.Logger
	Tel       *telemetry.Provider
	// Limiter is the cell's concurrency limit for its provider. Default: a
	// new one from the config; instances in one process that call the same
	// provider for the same cell may share one.
	Limiter *admission.Limiter
}

// Service is one classifier instance.
type Service struct {
	cfg   Config
	d     Deps
	relay *outbox.Relay
	lim   *admission.Limiter

	attempts metric.Int64Counter

	mu      sync.Mutex
	running map[string]context.CancelCauseFunc // work id -> its model call

	loops    []*consumer.Loop
	cancels  *nats.Subscription
	stopOnce sync.Once
}

// errSuperseded cancels a model call whose work a newer revision replaced.
var errSuperseded = errors.New("superseded by a newer revision")

// New checks the config and builds the service.
func New(cfg Config, d Deps) (*Service, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, d: d, lim: d.Limiter, running: map[string]context.CancelCauseFunc{}}
	s.relay = &outbox.Relay{Store: d.Store, JS: d.JS, Log: d.Log, Subjects: []string{
		event.StreamPrefix(event.KindResult, cfg.Region), event.StreamPrefix(event.KindAttempt, cfg.Region)}}
	if s.lim == nil {
		lc := admission.LimiterConfig{Initial: cfg.InitialConcurrency, Max: cfg.Concurrency, SlowStart: true,
			OnChange: s.limitChanged}
		if cfg.FixedConcurrency {
			lc.Initial, lc.Min = cfg.Concurrency, cfg.Concurrency
		}
		var err error
		if s.lim, err = admission.NewLimiter(lc); err != nil {
			return nil, fmt.Errorf("classifier: %w", err)
		}
	}
	var err error
	s.attempts, err = d.Tel.Meter().Int64Counter("assay_classifier_attempts",
		metric.WithDescription("model-call attempts by outcome"))
	if err != nil {
		return nil, err
	}
	region := metric.WithAttributes(attribute.String("region", cfg.Region))
	_, err = d.Tel.Meter().Int64ObservableGauge("assay_classifier_limit",
		metric.WithDescription("model calls the adaptive limit allows at once"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(int64(s.lim.Limit()), region)
			return nil
		}))
	if err != nil {
		return nil, err
	}
	_, err = d.Tel.Meter().Int64ObservableGauge("assay_classifier_in_flight",
		metric.WithDescription("model calls running now"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(int64(s.lim.Stats().InFlight), region)
			return nil
		}))
	return s, err
}

// Consumer names the durable WORK consumer of a lane.
func Consumer(lane string) string { return "classifier-" + lane }

// Lanes are consumed apart, so a batch backlog never stands in front of
// interactive work; they share the cell's limiter, where interactive goes
// first.
var lanes = []string{event.Interactive, event.Batch}

// Limiter is the instance's concurrency limiter.
func (s *Service) Limiter() *admission.Limiter { return s.lim }

func (s *Service) limitChanged(old, new int, reason string) {
	outcome := "limit_raised"
	if new < old {
		outcome = "limit_lowered"
	}
	telemetry.Decision(context.Background(), s.d.Log, "limit:"+s.cfg.Region, outcome, reason,
		slog.Int("from", old), slog.Int("to", new))
}

// Start ensures the cell's streams and the durable consumer, then consumes.
func (s *Service) Start(ctx context.Context) error {
	for _, k := range []string{event.KindResult, event.KindAttempt} {
		if _, err := event.EnsureStream(ctx, s.d.JS, k, s.cfg.Region, event.StreamSettings{}); err != nil {
			return err
		}
	}
	st, err := event.EnsureStream(ctx, s.d.JS, event.KindWork, s.cfg.Region, event.StreamSettings{})
	if err != nil {
		return err
	}
	// Cancels first, so no call starts unseen by them.
	if s.cancels, err = s.d.JS.Conn().Subscribe(event.CancelSubjects(s.cfg.Region), s.onCancel); err != nil {
		return fmt.Errorf("classifier: subscribe to cancels: %w", err)
	}
	s.relay.Start(context.WithoutCancel(ctx))
	for _, lane := range lanes {
		cons, err := event.EnsureConsumer(ctx, st, event.ConsumerSettings{
			Durable: Consumer(lane), Filter: event.LaneSubjects(s.cfg.Region, lane),
			AckWait: s.cfg.AckWait, MaxDeliver: s.cfg.MaxDeliver, MaxAckPending: 4 * s.cfg.Concurrency,
		})
		if err == nil {
			var loop *consumer.Loop
			loop, err = consumer.StartGated(ctx, cons, 2, func(ctx context.Context) (func(), error) {
				return s.lim.Enter(ctx, lane)
			}, s.handle, consumer.WithLog(s.d.Log))
			s.loops = append(s.loops, loop)
		}
		if err != nil {
			s.Stop(context.Background())
			return fmt.Errorf("classifier: %w", err)
		}
	}
	return nil
}

// Stop stops taking work, lets running calls finish until ctx ends (then
// cancels them, which requeues their work), and flushes the outbox.
func (s *Service) Stop(ctx context.Context) {
	s.stopOnce.Do(func() {
		var wg sync.WaitGroup
		for _, l := range s.loops {
			if l != nil {
				wg.Go(func() { l.Stop(ctx) })
			}
		}
		wg.Wait()
		if s.cancels != nil {
			_ = s.cancels.Unsubscribe()
		}
		s.relay.Stop()
	})
}

// Ready reports whether the service can take work.
func (s *Service) Ready(ctx context.Context) error {
	for _, lane := range lanes {
		if err := consumer.Ready(ctx, s.d.Store.Pool, s.d.JS, event.StreamName(event.KindWork, s.cfg.Region), Consumer(lane)); err != nil {
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
		telemetry.Decision(context.Background(), s.d.Log, c.WorkID, "superseded", "model call canceled: "+c.Reason)
	}
}

func (s *Service) handle(ctx context.Context, msg jetstream.Msg) {
	ctx = telemetry.Extract(ctx, msg.Headers())
	var ev event.Work
	if err := event.Decode(msg.Data(), &ev); err != nil {
		telemetry.Decision(ctx, s.d.Log, msg.Subject(), "refused", "undecodable work message: "+err.Error())
		_ = msg.Term()
		return
	}
	d := s.Process(ctx, ev, func() { _ = msg.InProgress() })
	var err error
	switch d.Kind {
	case Ack:
		err = msg.Ack()
	case Nak:
		err = msg.NakWithDelay(d.Delay)
	case Term:
		err = msg.Term()
	}
	if err != nil {
		s.d.Log.Warn("settling work message failed", "key", ev.WorkID, "err", err)
	}
}

// Disposition says what to do with the message that carried the work.
type Disposition struct {
	Kind  int
	Delay time.Duration
}

// Dispositions.
const (
	Ack = iota
	Nak
	Term
)

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

// FromEnv fills the budget and admission settings from the environment:
// ASSAY_PRICE_TABLE (a price table file), ASSAY_MAX_OUTPUT_UNITS,
// ASSAY_BUDGET_BYTES_PER_UNIT, ASSAY_MODEL_MAX_CONCURRENCY (the ceiling),
// ASSAY_MODEL_CONCURRENCY (adaptive or fixed), and the timings
// ASSAY_LEASE_TTL, ASSAY_ACK_WAIT and ASSAY_HANDOFF_TTL. Errors name the
// variable.
func (c *Config) FromEnv(getenv func(string) string) error {
	if v := getenv("ASSAY_MODEL_MAX_CONCURRENCY"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1024 {
			return fmt.Errorf("ASSAY_MODEL_MAX_CONCURRENCY: %q is not a whole number from 1 to 1024", v)
		}
		c.Concurrency = n
	}
	if err := config.Durations(getenv,
		config.Duration{Name: "ASSAY_LEASE_TTL", To: &c.LeaseTTL, Min: 100 * time.Millisecond, Max: 24 * time.Hour},
		config.Duration{Name: "ASSAY_ACK_WAIT", To: &c.AckWait, Min: 100 * time.Millisecond, Max: 24 * time.Hour},
		config.Duration{Name: "ASSAY_HANDOFF_TTL", To: &c.HandoffTTL, Min: 100 * time.Millisecond, Max: 24 * time.Hour},
	); err != nil {
		return err
	}
	switch v := getenv("ASSAY_MODEL_CONCURRENCY"); v {
	case "", "adaptive":
	case "fixed":
		c.FixedConcurrency = true
	default:
		return fmt.Errorf("ASSAY_MODEL_CONCURRENCY: %q is not adaptive or fixed", v)
	}
	prices, err := price.Load(getenv("ASSAY_PRICE_TABLE"))
	if err != nil {
		return fmt.Errorf("ASSAY_PRICE_TABLE: %w", err)
	}
	c.Prices = prices
	if v := getenv("ASSAY_MAX_OUTPUT_UNITS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("ASSAY_MAX_OUTPUT_UNITS: %q is not a positive whole number", v)
		}
		c.MaxOutputUnits = n
	}
	if v := getenv("ASSAY_BUDGET_BYTES_PER_UNIT"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 1 || f > 16 {
			return fmt.Errorf("ASSAY_BUDGET_BYTES_PER_UNIT: %q is not a number from 1 to 16", v)
		}
		c.BytesPerUnit = f
	}
	return nil
}
