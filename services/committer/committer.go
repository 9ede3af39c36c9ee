// Package committer is the only writer of accepted results. It runs the gate
// on every final answer and commits with a compare-and-set on the lease, so
// an answer from a lost lease is recorded and never becomes a result.
package committer

import (
	"context"
	"encoding/json"
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
	// Region is the cell this instance serves.
	Region string
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
	Store     *store.Store
	JS        jetstream.JetStream
	Contracts *contract.Registry
	Log       *slog.Logger
	Tel       *telemetry.Provider
}

// Service is one committer instance.
type Service struct {
	cfg      Config
	d        Deps
	verdicts metric.Int64Counter
	loop     *consumer.Loop
}

// Consumer is the durable name of the committer's RESULT consumer.
const Consumer = "committer"

// New checks the config and builds the service.
func New(cfg Config, d Deps) (*Service, error) {
	if cfg.Region == "" {
		return nil, errors.New("committer: Region is required")
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	s := &Service{cfg: cfg, d: d}
	var err error
	s.verdicts, err = d.Tel.Meter().Int64Counter("assay_committer_verdicts",
		metric.WithDescription("final answers by verdict"))
	return s, err
}

// Start ensures the RESULT stream and the durable consumer, then consumes.
func (s *Service) Start(ctx context.Context) error {
	st, err := event.EnsureStream(ctx, s.d.JS, event.KindResult, s.cfg.Region, event.StreamSettings{})
	if err != nil {
		return err
	}
	cons, err := event.EnsureConsumer(ctx, st, event.ConsumerSettings{Durable: Consumer,
		AckWait: s.cfg.AckWait, MaxDeliver: s.cfg.MaxDeliver, MaxAckPending: 4 * s.cfg.Concurrency})
	if err != nil {
		return err
	}
	if s.loop, err = consumer.Start(ctx, cons, s.cfg.Concurrency, s.handle, consumer.WithLog(s.d.Log)); err != nil {
		return fmt.Errorf("committer: %w", err)
	}
	return nil
}

// Stop stops taking results and waits for the ones in hand. Idempotent.
func (s *Service) Stop(ctx context.Context) {
	if s.loop != nil {
		s.loop.Stop(ctx)
	}
}

// Ready reports whether the service can take results.
func (s *Service) Ready(ctx context.Context) error {
	return consumer.Ready(ctx, s.d.Store.Pool, s.d.JS, event.StreamName(event.KindResult, s.cfg.Region), Consumer)
}

func (s *Service) handle(ctx context.Context, msg jetstream.Msg) {
	ctx = telemetry.Extract(ctx, msg.Headers())
	var ev event.Result
	if err := event.Decode(msg.Data(), &ev); err != nil {
		telemetry.Decision(ctx, s.d.Log, msg.Subject(), "refused", "undecodable result message: "+err.Error())
		_ = msg.Term()
		return
	}
	if err := s.Commit(ctx, ev); err != nil {
		s.d.Log.Warn("commit failed; will retry", "key", ev.WorkID, "attempt", ev.AttemptID, "err", err)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	_ = msg.Ack()
}

// Commit applies one RESULT event. It is idempotent: a redelivered event
// finds the work already decided and changes nothing.
func (s *Service) Commit(ctx context.Context, ev event.Result) error {
	ctx, span := s.d.Tel.Tracer().Start(ctx, "committer.commit", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("assay.work_id", ev.WorkID), attribute.String("assay.attempt_id", ev.AttemptID)))
	defer span.End()
	log := s.d.Log
	if ev.Region != s.cfg.Region {
		telemetry.Decision(ctx, log, ev.WorkID, "refused", fmt.Sprintf("result of region %s reached the %s cell", ev.Region, s.cfg.Region))
		return nil
	}
	if ev.Outcome != "ok" && !(ev.Outcome == "invalid_output" && ev.Final) {
		// Retries, repairs, refusals and stale answers are the classifier's
		// to decide; the attempt row already holds them.
		telemetry.Decision(ctx, log, ev.WorkID, ev.Outcome, "not a final answer; recorded only", slog.String("attempt", ev.AttemptID))
		return nil
	}
	w, err := s.d.Store.GetWork(ctx, ev.WorkID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && w.TenantID != ev.TenantID) {
		telemetry.Decision(ctx, log, ev.WorkID, "refused", "result names work this cell does not have for that tenant")
		return nil
	}
	if err != nil {
		return err
	}
	if w.Terminal() {
		// Accepted, rejected or ended otherwise already; a second answer
		// never becomes a second result.
		marked, err := s.d.Store.MarkStale(ctx, ev.AttemptID)
		if err != nil {
			return err
		}
		if !marked {
			telemetry.Decision(ctx, log, w.ID, "duplicate", "this answer's verdict is already recorded", slog.String("attempt", ev.AttemptID))
			return nil
		}
		telemetry.Decision(ctx, log, w.ID, "stale_lease", "work already "+w.State+"; answer recorded, not published", slog.String("attempt", ev.AttemptID))
		return nil
	}
	if ev.Outcome == "invalid_output" {
		return s.reject(ctx, w, ev, ev.Reason)
	}
	c, ok := s.d.Contracts.Get(w.Contract)
	if !ok {
		return s.reject(ctx, w, ev, fmt.Sprintf("contract %q is not known to this committer", w.Contract))
	}
	acc, fail := gate.Check(c, []byte(ev.Output), gate.Expect{WorkID: ev.WorkID, SchemaVersion: ev.SchemaVersion,
		TaxonomyVersion: ev.TaxonomyVersion, CurrentTaxonomyVersion: c.TaxonomyVersion,
		Digest: ev.Digest, CurrentDigest: w.Digest, Input: json.RawMessage(w.Input)})
	if fail != nil {
		return s.reject(ctx, w, ev, fail.Error())
	}
	verdict, err := s.d.Store.Commit(ctx, w, ev.AttemptID, ev.LeaseToken, acc.Output, acc.Findings)
	if err != nil {
		return err
	}
	switch verdict {
	case store.Late:
		s.count(ctx, "expired")
		telemetry.Decision(ctx, log, w.ID, "expired", "deadline passed before the verdict; answer recorded, not published",
			slog.String("attempt", ev.AttemptID))
		return nil
	case store.Lost:
		s.count(ctx, "stale_lease")
		telemetry.Decision(ctx, log, w.ID, "stale_lease", "lease lost before commit; answer recorded, not published",
			slog.String("attempt", ev.AttemptID))
		return nil
	}
	s.count(ctx, "accepted")
	telemetry.Decision(ctx, log, w.ID, "accepted", "passed syntax, schema, correlation, grounding and policy",
		slog.String("attempt", ev.AttemptID), slog.Int("findings", acc.Findings))
	return nil
}

func (s *Service) reject(ctx context.Context, w *store.Work, ev event.Result, reason string) error {
	rejected, err := s.d.Store.Reject(ctx, w.ID, ev.AttemptID, ev.LeaseToken, reason)
	if err != nil {
		return err
	}
	if !rejected {
		s.count(ctx, "stale_lease")
		telemetry.Decision(ctx, s.d.Log, w.ID, "stale_lease", "lease lost before the rejection; recorded only", slog.String("attempt", ev.AttemptID))
		return nil
	}
	s.count(ctx, "schema_rejected")
	telemetry.Decision(ctx, s.d.Log, w.ID, "schema_rejected", reason, slog.String("attempt", ev.AttemptID))
	return nil
}

func (s *Service) count(ctx context.Context, verdict string) {
	s.verdicts.Add(ctx, 1, metric.WithAttributes(attribute.String("verdict", verdict), attribute.String("region", s.cfg.Region)))
}
