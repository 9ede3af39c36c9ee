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
}

// FromEnv fills ASSAY_ACK_WAIT (the RESULT consumer's ack wait, a Go
// duration) from the environment. Errors name the variable.
func (c *Config) FromEnv(getenv func(string) string) error {
	return config.Durations(getenv,
		config.Duration{Name: "ASSAY_ACK_WAIT", To: &c.AckWait, Min: 100 * time.Millisecond, Max: 24 * time.Hour})
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
	results  *consumer.Consumer
}

// Consumer is the durable name of the committer's RESULT consumer.
func Consumer(n event.Names) string { return n.Durable("committer") }

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
	s := &Service{cfg: cfg, d: d}
	var err error
	if s.verdicts, err = d.Tel.Meter().Int64Counter("assay_committer_verdicts",
		metric.WithDescription("final answers by verdict")); err != nil {
		return nil, err
	}
	s.results, err = consumer.New(consumer.Config{JS: d.JS, Stream: cfg.Names.Stream(event.KindResult),
		Durable: event.ConsumerSettings{Durable: Consumer(cfg.Names), AckWait: cfg.AckWait, MaxDeliver: cfg.MaxDeliver,
			MaxAckPending: 4 * cfg.Concurrency},
		Concurrency: cfg.Concurrency, Log: d.Log,
		Handle: consumer.Typed(d.Log, event.Parse[event.Result], s.handle)})
	if err != nil {
		return nil, fmt.Errorf("committer: %w", err)
	}
	return s, nil
}

// Start consumes the RESULT stream (the classifier's; the consumer waits
// for it).
func (s *Service) Start(ctx context.Context) error { return s.results.Start(ctx) }

// Stop stops taking results and waits for the ones in hand. Idempotent.
func (s *Service) Stop(ctx context.Context) { s.results.Stop(ctx) }

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
	if act == check {
		var err error
		if w, err = s.d.Store.GetWork(ctx, ev.WorkID); errors.Is(err, store.ErrNotFound) {
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
		return s.decided(ctx, w.ID, ev, marked(ok, w.State), false)
	case reject:
		return s.reject(ctx, w, ev, reason)
	}
	acc, fail := gate.Check(c, []byte(ev.Output), gate.ExpectFor(c, gate.Seen{WorkID: ev.WorkID,
		SchemaVersion: ev.SchemaVersion, TaxonomyVersion: ev.TaxonomyVersion, Digest: ev.Digest}, w.Digest, []byte(w.Input)))
	if fail != nil {
		return s.reject(ctx, w, ev, fail.Error())
	}
	v, err := s.d.Store.Commit(ctx, w, ev.AttemptID, ev.LeaseToken, acc.Output, acc.Findings)
	if err != nil {
		return err
	}
	return s.decided(ctx, w.ID, ev, committed(v), true, slog.Int("findings", acc.Findings))
}

func (s *Service) reject(ctx context.Context, w *store.Work, ev event.Result, reason string) error {
	ok, err := s.d.Store.Reject(ctx, w.ID, ev.AttemptID, ev.LeaseToken, reason)
	if err != nil {
		return err
	}
	return s.decided(ctx, w.ID, ev, rejected(ok, reason), true)
}

// decided logs a verdict and, when it is one of a final answer's, counts it.
func (s *Service) decided(ctx context.Context, workID string, ev event.Result, v verdict, count bool, attrs ...slog.Attr) error {
	if count {
		s.verdicts.Add(ctx, 1, metric.WithAttributes(attribute.String("verdict", v.word), attribute.String("region", s.cfg.Region)))
	}
	telemetry.Decision(ctx, s.d.Log, workID, v.word, v.reason, append([]slog.Attr{slog.String("attempt", ev.AttemptID)}, attrs...)...)
	return nil
}
