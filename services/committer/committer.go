// Package committer is the only writer of accepted results. It runs the gate
// on every final answer and commits with a compare-and-set on the lease, so
// an answer from a lost lease is recorded and never becomes a result.
package committer

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
	"assay.dev/pkg/contract"
	"assay.dev/pkg/event"
	"assay.dev/pkg/gate"
	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

// Config of one committer instance.
type Config struct {
	// Region is the region this instance serves.
	Region string
	// Names are the cell's NATS names. Default the cell named after Region
	// in the default installation.
	Names event.Names
	// Concurrency is how many results are committed at once. Default 4.
	Concurrency int
	// AckWait and MaxDeliver configure the durable consumer. Defaults 30s, 20.
	AckWait    time.Duration
	MaxDeliver int
	// ReapEvery is how often the committer looks in the outbox for RESULT
	// events the broker lost (a store lost with its node): answers whose
	// work still waits for a verdict. Default 5s; negative turns it off.
	ReapEvery time.Duration
	// ReapGrace is how old such an event must be before it is read back,
	// so the reaper does not race the broker's delivery. Default 60s.
	ReapGrace time.Duration
}

// FromEnv fills ASSAY_ACK_WAIT (the RESULT consumer's ack wait),
// ASSAY_COMMITTER_REAP_EVERY and ASSAY_COMMITTER_REAP_GRACE (Go durations)
// from the environment. Errors name the variable.
// Vars are the settings FromEnv reads, for the committer's help.
var Vars = []config.Var{
	{Name: "ASSAY_ACK_WAIT", Default: "30s", Usage: "the RESULT consumer's ack wait"},
	{Name: "ASSAY_COMMITTER_REAP_EVERY", Default: "5s", Usage: "how often the reaper reads back RESULT events the broker lost"},
	{Name: "ASSAY_COMMITTER_REAP_GRACE", Default: "60s", Usage: "a RESULT event published this long ago and not committed is read back"},
}

func (c *Config) FromEnv(getenv func(string) string) error {
	return config.Durations(getenv,
		config.Duration{Name: "ASSAY_ACK_WAIT", To: &c.AckWait, Min: 100 * time.Millisecond, Max: 24 * time.Hour},
		config.Duration{Name: "ASSAY_COMMITTER_REAP_EVERY", To: &c.ReapEvery, Min: 100 * time.Millisecond, Max: 24 * time.Hour},
		config.Duration{Name: "ASSAY_COMMITTER_REAP_GRACE", To: &c.ReapGrace, Min: 100 * time.Millisecond, Max: 24 * time.Hour})
}

// Deps are what the committer talks to.
type Deps struct {
	Store     Store
	JS        jetstream.StreamConsumerManager
	Contracts *contract.Registry
	Log       *slog.Logger
	Tel       *telemetry.Provider
}

// Service is one committer instance.
type Service struct {
	cfg      Config
	d        Deps
	verdicts metric.Int64Counter
	refused  metric.Int64Counter
	endToEnd metric.Float64Histogram
	results  *consumer.Consumer
	reaper   lifecycle.Ticker
}

// Consumer is the durable name of the committer's RESULT consumer.
func Consumer(n event.Names) string { return n.ResultConsumer() }

// New checks the config and builds the service.
func New(cfg Config, d Deps) (*Service, error) {
	if cfg.Region == "" {
		return nil, errors.New("committer: Region is required")
	}
	if cfg.Names.Cell == "" {
		cfg.Names.Cell = cfg.Region
	}
	if err := cfg.Names.Check(); err != nil {
		return nil, fmt.Errorf("committer: %w", err)
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	if cfg.ReapEvery == 0 {
		cfg.ReapEvery = 5 * time.Second
	}
	if cfg.ReapGrace <= 0 {
		cfg.ReapGrace = time.Minute
	}
	s := &Service{cfg: cfg, d: d}
	var err error
	if s.verdicts, err = d.Tel.Meter().Int64Counter("assay_committer_verdicts",
		metric.WithDescription("final answers by verdict")); err != nil {
		return nil, err
	}
	if s.endToEnd, err = d.Tel.Seconds("assay_end_to_end", "from work created to its outcome"); err != nil {
		return nil, err
	}
	if s.refused, err = d.Tel.Meter().Int64Counter("assay_store_refused",
		metric.WithDescription("records the cell's database refused for good (SQLSTATE class 22 or 23), not retried")); err != nil {
		return nil, err
	}
	s.results, err = consumer.New(consumer.Config{JS: d.JS, Stream: cfg.Names.Stream(event.KindResult),
		Durable: event.ConsumerSettings{Durable: Consumer(cfg.Names), AckWait: cfg.AckWait, MaxDeliver: cfg.MaxDeliver,
			MaxAckPending: 4 * cfg.Concurrency},
		Concurrency: cfg.Concurrency, Log: d.Log,
		Meter: d.Tel.Meter(), Labels: []attribute.KeyValue{attribute.String("region", cfg.Region), attribute.String("lane", "")},
		Handle: consumer.Typed(d.Log, event.Parse[event.Result], s.handle)})
	if err != nil {
		return nil, fmt.Errorf("committer: %w", err)
	}
	r := &s.reaper
	r.Name, r.Every, r.Log, r.PassTimeout = "committer reaper", cfg.ReapEvery, d.Log, time.Minute
	r.Pass = func(ctx context.Context) (bool, error) {
		n, err := s.Reap(ctx)
		return n == reapBatch, err
	}
	return s, nil
}

// Start consumes the RESULT stream (the classifier's; the consumer waits
// for it) and runs the reaper.
func (s *Service) Start(ctx context.Context) error {
	parts := []lifecycle.Service{s.results}
	if s.cfg.ReapEvery > 0 {
		parts = append(parts, &s.reaper)
	}
	return lifecycle.StartAll(ctx, parts...)
}

// Stop stops the reaper, then stops taking results and waits for the ones
// in hand. Idempotent.
func (s *Service) Stop(ctx context.Context) { lifecycle.StopAll(ctx, &s.reaper, s.results) }

// reapBatch bounds the events one reaper pass reads back.
const reapBatch = 200

// Reap reads back from the outbox the RESULT events the broker lost whose
// work still waits for a verdict, and commits them as if delivered: the
// commit is idempotent, so one that was only late changes nothing.
func (s *Service) Reap(ctx context.Context) (int, error) {
	payloads, err := s.d.Store.UncommittedResults(ctx, event.KindResult, s.cfg.ReapGrace, time.Hour, reapBatch)
	if err != nil {
		return 0, err
	}
	for _, p := range payloads {
		ev, err := event.Parse[event.Result](p)
		if err != nil {
			s.d.Log.Warn("undecodable RESULT event in the outbox", "err", err)
			continue
		}
		telemetry.Decision(ctx, s.d.Log, ev.WorkID, "reaped", "RESULT event published but its answer still waits for a verdict; read back from the outbox",
			slog.String("attempt", ev.AttemptID))
		if err := s.Commit(ctx, ev); err != nil {
			return 0, err
		}
	}
	return len(payloads), nil
}

// Ready reports whether the service can take results.
func (s *Service) Ready(ctx context.Context) error {
	if err := s.d.Store.Ping(ctx); err != nil {
		return err
	}
	return s.results.Ready(ctx)
}

func (s *Service) handle(ctx context.Context, ev event.Result, _ consumer.Delivery) consumer.Disposition {
	if err := s.Commit(ctx, ev); err != nil {
		s.d.Log.Warn("commit failed; will retry", "key", ev.WorkID, "attempt", ev.AttemptID, "err", err)
		return consumer.Retry(time.Second)
	}
	return consumer.Done()
}

// Commit applies one RESULT event. It is idempotent: a redelivered event
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
		if w, answer, err = s.d.Store.WorkAnswer(ctx, ev.WorkID, ev.AttemptID); errors.Is(err, store.ErrNotFound) {
			w = nil
		} else if err != nil {
			return err
		}
		known := false
		if w != nil {
			c, known = s.d.Contracts.Get(w.Contract)
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
	v, err := s.d.Store.Commit(ctx, w, ev.AttemptID, ev.LeaseToken, acc.Output, acc.Findings)
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
	return s.decided(ctx, w, ev, committed(v), true, slog.Int("findings", acc.Findings))
}

func (s *Service) reject(ctx context.Context, w *store.Work, ev event.Result, reason string) error {
	ok, err := s.d.Store.Reject(ctx, w.ID, ev.AttemptID, ev.LeaseToken, reason)
	if err != nil {
		return err
	}
	return s.decided(ctx, w, ev, rejected(ok, reason), true)
}

// decided logs a verdict and, when it is one of a final answer's, counts it;
// work it ended has its end-to-end time recorded.
func (s *Service) decided(ctx context.Context, w *store.Work, ev event.Result, v verdict, count bool, attrs ...slog.Attr) error {
	if count {
		s.verdicts.Add(ctx, 1, metric.WithAttributes(attribute.String("verdict", v.word), attribute.String("region", s.cfg.Region)))
	}
	if v.word == verdictAccepted || v.word == verdictRejected || v.word == verdictLate {
		s.endToEnd.Record(ctx, time.Since(w.CreatedAt).Seconds(), metric.WithAttributes(attribute.String("region", s.cfg.Region),
			attribute.String("lane", w.Lane), attribute.String("contract", w.Contract), attribute.String("outcome", v.word),
			attribute.String("tenant", s.d.Tel.Tenant(w.TenantID))))
	}
	telemetry.Decision(ctx, s.d.Log, w.ID, v.word, v.reason, append([]slog.Attr{slog.String("attempt", ev.AttemptID)}, attrs...)...)
	return nil
}
