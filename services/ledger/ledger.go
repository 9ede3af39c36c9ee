// Package ledger appends every attempt, failed ones included, to its
// tenant's usage, priced from a configurable table, and answers usage
// queries.
package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"assay.dev/pkg/config"
	"assay.dev/pkg/consumer"
	"assay.dev/pkg/event"
	"assay.dev/pkg/group"
	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/price"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

// Config of one ledger instance.
type Config struct {
	// Region is the region this instance serves.
	Region string
	// Names are the cell's NATS names. Default the cell named after Region
	// in the default installation.
	Names event.Names
	// Prices prices attempts. Default price.Default.
	Prices price.Prices
	// AckWait and MaxDeliver configure the durable consumer. Defaults 30s, 20.
	AckWait    time.Duration
	MaxDeliver int
	// ReapEvery is how often the reaper looks for attempts the ledger
	// should hold but does not: events the broker lost, attempts whose
	// worker died. Default 5s; negative turns the reaper off.
	ReapEvery time.Duration
	// ReapGrace is how old an event or an attempt must be before the
	// reaper acts on it, so that it does not race the event on its way.
	// Default 30s.
	ReapGrace time.Duration
	// ReapHorizon bounds how far back the reaper re-reads published
	// events from the outbox. Default 1h.
	ReapHorizon time.Duration
	// GroupWait is how long the rows of a group that is not full gather
	// before they are written in one statement. The ledger is off every
	// caller's path, so a few milliseconds buy one statement for many
	// attempts instead of one each. Default 20ms; negative writes each
	// delivery's row at once.
	GroupWait time.Duration
}

// Vars are the settings FromEnv reads, for the ledger's help.
var Vars = []config.Var{
	{Name: "ASSAY_ACK_WAIT", Default: "30s", Usage: "the ATTEMPT consumer's ack wait"},
	{Name: "ASSAY_LEDGER_REAP_EVERY", Default: "5s", Usage: "how often the reaper looks for attempts without a ledger row"},
	{Name: "ASSAY_LEDGER_REAP_GRACE", Default: "30s", Usage: "an ATTEMPT event published this long ago without a row is read back"},
	{Name: "ASSAY_LEDGER_GROUP_WAIT", Default: "20ms", Usage: "how long attempts gather to be written in one statement (0s: at once)"},
	{Name: "ASSAY_PRICE_TABLE", Default: "every model at 0.15/0.60 $/M units", Usage: "JSON price table file the ledger prices attempts with"},
}

// FromEnv fills the settings an operator sets from the environment:
// ASSAY_ACK_WAIT (the consumer's), ASSAY_LEDGER_REAP_EVERY,
// ASSAY_LEDGER_REAP_GRACE and ASSAY_LEDGER_GROUP_WAIT (0s: no wait), as
// Go durations. Errors name the variable.
func (c *Config) FromEnv(getenv func(string) string) error {
	if path := getenv("ASSAY_PRICE_TABLE"); path != "" {
		prices, err := price.Load(path)
		if err != nil {
			return fmt.Errorf("ASSAY_PRICE_TABLE: %w", err)
		}
		c.Prices = prices
	}
	wait := time.Duration(-1)
	if err := config.Durations(getenv,
		config.Duration{Name: "ASSAY_ACK_WAIT", To: &c.AckWait, Min: 100 * time.Millisecond, Max: 24 * time.Hour},
		config.Duration{Name: "ASSAY_LEDGER_REAP_EVERY", To: &c.ReapEvery, Min: 100 * time.Millisecond, Max: 24 * time.Hour},
		config.Duration{Name: "ASSAY_LEDGER_REAP_GRACE", To: &c.ReapGrace, Min: 100 * time.Millisecond, Max: 24 * time.Hour},
		config.Duration{Name: "ASSAY_LEDGER_GROUP_WAIT", To: &wait, Min: 0, Max: time.Second},
	); err != nil {
		return err
	}
	switch {
	case wait == 0:
		c.GroupWait = -1
	case wait > 0:
		c.GroupWait = wait
	}
	return nil
}

// Deps are what the ledger talks to.
type Deps struct {
	Store Store
	JS    jetstream.StreamConsumerManager
	Log   *slog.Logger
	Tel   *telemetry.Provider
}

// Service is one ledger instance.
type Service struct {
	cfg      Config
	d        Deps
	recorded metric.Int64Counter
	refused  metric.Int64Counter
	attempts *consumer.Consumer
	onError  consumer.Step[event.Attempt] // what an append's error does to its message
	reaper   lifecycle.Ticker
	// rows records the rows of deliveries together: those that arrive
	// within GroupWait of each other share one statement and one commit.
	rows *group.Batch[store.LedgerRow, store.LedgerResult]
}

// Consumer is the durable name of the ledger's ATTEMPT consumer.
func Consumer(n event.Names) string { return n.AttemptConsumer() }

// New checks the config and builds the service.
// ledgerBatch is how many deliveries are handled at once, and so how many
// rows one transaction records at most.
const ledgerBatch = 64

func New(cfg Config, d Deps) (*Service, error) {
	if cfg.Region == "" {
		return nil, errors.New("ledger: Region is required")
	}
	if cfg.Prices == nil {
		cfg.Prices = price.Default
	}
	if _, ok := cfg.Prices["*"]; !ok {
		return nil, errors.New(`ledger: the price table needs a "*" entry for models it does not list`)
	}
	if cfg.ReapEvery == 0 {
		cfg.ReapEvery = 5 * time.Second
	}
	if cfg.ReapGrace <= 0 {
		cfg.ReapGrace = 30 * time.Second
	}
	if cfg.ReapHorizon <= 0 {
		cfg.ReapHorizon = time.Hour
	}
	if cfg.GroupWait == 0 {
		cfg.GroupWait = 20 * time.Millisecond
	}
	if cfg.Names.Cell == "" {
		cfg.Names.Cell = cfg.Region
	}
	if err := cfg.Names.Check(); err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	s := &Service{cfg: cfg, d: d, rows: &group.Batch[store.LedgerRow, store.LedgerResult]{Max: ledgerBatch,
		Wait: max(cfg.GroupWait, 0), Run: d.Store.RecordLedgerBatch}}
	s.onError = consumer.Step[event.Attempt]{Log: d.Log, Failed: "ledger append failed; will retry",
		Attrs: func(ev event.Attempt) []any { return []any{"key", ev.AttemptID} }, Wait: time.Second,
		Permanent: store.Permanent, GiveUp: s.refuse}
	var err error
	if s.recorded, err = d.Tel.Meter().Int64Counter("assay_ledger_attempts",
		metric.WithDescription("attempts appended to the ledger by outcome")); err != nil {
		return nil, err
	}
	if s.refused, err = d.Tel.Meter().Int64Counter("assay_store_refused",
		metric.WithDescription("records the cell's database refused for good (SQLSTATE class 22 or 23), not retried")); err != nil {
		return nil, err
	}
	s.attempts, err = consumer.New(consumer.Config{JS: d.JS, Stream: cfg.Names.Stream(event.KindAttempt),
		Durable: event.ConsumerSettings{Durable: Consumer(cfg.Names), AckWait: cfg.AckWait, MaxDeliver: cfg.MaxDeliver,
			MaxAckPending: 256},
		Concurrency: ledgerBatch, Log: d.Log, Handle: consumer.Typed(d.Log, event.Parse[event.Attempt], s.handle),
		Meter: d.Tel.Meter(), Labels: []attribute.KeyValue{attribute.String("region", cfg.Region), attribute.String("lane", "")}})
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	r := &s.reaper
	r.Name, r.Every, r.Log = "ledger reaper", cfg.ReapEvery, d.Log
	r.PassTimeout = time.Minute
	r.Pass = func(ctx context.Context) (bool, error) {
		_, err := s.Reap(ctx)
		return false, err
	}
	return s, nil
}

// Start consumes the ATTEMPT stream (the classifier's; the consumer waits
// for it) and runs the reaper.
func (s *Service) Start(ctx context.Context) error {
	parts := []lifecycle.Service{s.attempts}
	if s.cfg.ReapEvery > 0 {
		parts = append(parts, &s.reaper)
	}
	return lifecycle.StartAll(ctx, parts...)
}

// Stop stops the reaper, then stops taking attempts and waits for the ones
// in hand. Idempotent.
func (s *Service) Stop(ctx context.Context) {
	lifecycle.StopAll(ctx, &s.reaper, s.attempts)
}

// Ready reports whether the service can take attempts.
func (s *Service) Ready(ctx context.Context) error {
	if err := s.d.Store.Ping(ctx); err != nil {
		return err
	}
	return s.attempts.Ready(ctx)
}

// handle appends each attempt; a row the database refuses for good is
// given up, any other failure tried again a second later.
func (s *Service) handle(ctx context.Context, ev event.Attempt, _ consumer.Delivery) consumer.Disposition {
	return s.onError.Settle(ctx, ev, s.Append(ctx, ev))
}

// refuse logs and counts an attempt the database refused for good; it is
// not retried, which could never succeed.
func (s *Service) refuse(ctx context.Context, ev event.Attempt, err error) {
	s.refused.Add(ctx, 1, metric.WithAttributes(attribute.String("region", s.cfg.Region)))
	telemetry.Decision(ctx, s.d.Log, ev.AttemptID, "refused",
		fmt.Sprintf("the cell's database refused the ledger row for good (SQLSTATE %s); not retried", store.SQLState(err)),
		slog.String("tenant", ev.TenantID), slog.String("work", ev.WorkID))
}

// Append records one attempt; a redelivery changes nothing.
func (s *Service) Append(ctx context.Context, ev event.Attempt) error {
	ctx, span := s.d.Tel.Tracer().Start(ctx, "ledger.append", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("assay.attempt_id", ev.AttemptID), attribute.String("assay.tenant", ev.TenantID)))
	defer span.End()
	if why, foreign := event.ForeignRegion("attempt", ev.Region, s.cfg.Region); foreign {
		telemetry.Decision(ctx, s.d.Log, ev.AttemptID, "refused", why)
		return nil
	}
	if ev.NoCall {
		// No call of its own: nothing the provider bills; its result is
		// the committer's.
		return nil
	}
	up := ev.UpstreamAttempts
	if up < 1 {
		up = 1
	}
	cached, reasoning := details(ev)
	pr := s.cfg.Prices.Lookup(ev.Model)
	if ev.Batch {
		pr = pr.Batch()
	}
	cost := pr.Cost(price.Units{Input: ev.InputUnits, CachedInput: cached, Output: ev.OutputUnits})
	return s.append(ctx, store.LedgerRow{AttemptID: ev.AttemptID, TenantID: ev.TenantID,
		WorkID: ev.WorkID, Model: ev.Model, ServedModel: ev.ServedModel, Outcome: ev.Outcome, UpstreamAttempts: up, InputUnits: ev.InputUnits,
		OutputUnits: ev.OutputUnits, CachedInputUnits: cached, ReasoningUnits: reasoning, CostMicros: cost, LatencyMS: ev.LatencyMS,
		OccurredAt: ev.At, Estimated: ev.Estimated})
}

// details are the cached input and reasoning units the ledger records of
// ev: none for an estimate, which is priced in full, and never more than
// the units they are part of.
func details(ev event.Attempt) (cached, reasoning int64) {
	if ev.Estimated {
		return 0, 0
	}
	return min(ev.CachedInputUnits, ev.InputUnits), min(ev.ReasoningUnits, ev.OutputUnits)
}

// append writes one ledger row and logs the decision.
func (s *Service) append(ctx context.Context, row store.LedgerRow) error {
	r := s.rows.Do(ctx, row)
	rec, excess, err := r.Recorded, r.Excess, r.Err
	switch {
	case err != nil:
		return err
	case rec == store.Duplicate:
		telemetry.Decision(ctx, s.d.Log, row.AttemptID, "duplicate", "attempt already in the ledger")
		return nil
	case rec == store.Replaced:
		telemetry.Decision(ctx, s.d.Log, row.AttemptID, "replaced",
			"the attempt's own report replaced the estimate written when its worker seemed dead",
			slog.String("tenant", row.TenantID), slog.String("work", row.WorkID), slog.Int64("cost_micros", row.CostMicros))
		return nil
	}
	s.recorded.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", row.Outcome), attribute.String("region", s.cfg.Region)))
	if excess > 0 {
		// The reservation bounds a call from above; a cost past it says the
		// estimate is wrong (a price table without the model, say). It is
		// spent all the same, so the next reservation sees it.
		telemetry.Decision(ctx, s.d.Log, row.AttemptID, "over_reservation",
			fmt.Sprintf("the attempt cost %d micro-dollars beyond its reservation; spent in full, the next reservation sees it", excess),
			slog.String("tenant", row.TenantID), slog.String("work", row.WorkID), slog.Int64("excess_micros", excess))
	}
	reason := "attempt " + row.Outcome
	if row.Estimated {
		reason += "; its worker died before reporting, so its reservation is charged as an estimate"
	}
	telemetry.Decision(ctx, s.d.Log, row.AttemptID, "recorded", reason,
		slog.String("tenant", row.TenantID), slog.String("work", row.WorkID), slog.Int64("cost_micros", row.CostMicros),
		slog.Bool("estimated", row.Estimated))
	return nil
}
