package publish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"assay.dev/pkg/consumer"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

// ReviewContract is the contract whose work is published to pull
// requests: the one GitHub webhooks ask for.
const ReviewContract = "code-review"

// Targets of a publication, as the fence names them.
const (
	TargetGitHub = "github"
	// TargetDry records what would be published, for a cell with no
	// GitHub App configured.
	TargetDry = "dry"
)

// Store is what the publisher asks of the cell's database; *store.Store
// is one.
type Store interface {
	PublishFacts(ctx context.Context, workID string) (store.PublishFacts, error)
	RecordDryPublication(ctx context.Context, workID, tenant, outcome string, plan json.RawMessage) error
	LockPublication(ctx context.Context, workID, target, tenant, outcome string) (*store.Publication, func(), error)
	RecordCheckRun(ctx context.Context, workID, target string, id int64) error
	RecordComment(ctx context.Context, workID, target, key string, id int64) error
	RecordRerunComment(ctx context.Context, workID, target string, id int64) error
	FinishPublication(ctx context.Context, workID, target, outcome string, plan json.RawMessage) error
	FailPublication(ctx context.Context, workID, target, msg string) error
}

// Config of a publisher.
type Config struct {
	Region string
	Names  event.Names
	// GitHub, when set, is where pull request work is published; nil
	// records each plan under the dry target.
	GitHub *GitHub
	// Rerun is the command that runs dropped work again. Required.
	Rerun func(workID string) string
	// AckWait and MaxDeliver configure the OUTCOME durable. Defaults 60s
	// and 50: a publication waits out rate limits.
	AckWait    time.Duration
	MaxDeliver int
	// Concurrency is how many outcomes are published at once. Default 2.
	Concurrency int
	// CallbackBackoff is the wait after a callback's first failure; it
	// doubles with each, up to CallbackMaxBackoff. Defaults 1s and 5m.
	CallbackBackoff, CallbackMaxBackoff time.Duration
	// CallbackTimeout bounds one callback. Default 10s.
	CallbackTimeout time.Duration
}

// Publisher consumes the cell's OUTCOME stream and publishes each outcome.
type Publisher struct {
	cfg       Config
	st        Store
	log       *slog.Logger
	consumer  *consumer.Consumer
	published metric.Int64Counter
	callbacks *http.Client
}

// New builds a publisher on its own OUTCOME durable.
func New(cfg Config, st Store, js jetstream.StreamConsumerManager, log *slog.Logger, meter metric.Meter) (*Publisher, error) {
	if cfg.Rerun == nil {
		return nil, errors.New("publish: Rerun is required")
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 2
	}
	if cfg.AckWait <= 0 {
		cfg.AckWait = time.Minute
	}
	if cfg.MaxDeliver == 0 {
		cfg.MaxDeliver = 50
	}
	if cfg.CallbackBackoff <= 0 {
		cfg.CallbackBackoff = time.Second
	}
	if cfg.CallbackMaxBackoff <= 0 {
		cfg.CallbackMaxBackoff = 5 * time.Minute
	}
	if cfg.CallbackTimeout <= 0 {
		cfg.CallbackTimeout = 10 * time.Second
	}
	p := &Publisher{cfg: cfg, st: st, log: log, callbacks: &http.Client{Timeout: cfg.CallbackTimeout}}
	var err error
	if p.published, err = meter.Int64Counter("assay_publications",
		metric.WithDescription("outcomes published, by target and result")); err != nil {
		return nil, err
	}
	p.consumer, err = consumer.New(consumer.Config{JS: js, Stream: cfg.Names.Stream(event.KindOutcome),
		Durable: event.ConsumerSettings{Durable: cfg.Names.OutcomeConsumer(), AckWait: cfg.AckWait, MaxDeliver: cfg.MaxDeliver,
			MaxAckPending: 4 * cfg.Concurrency},
		Concurrency: cfg.Concurrency, Log: log, Meter: meter,
		Labels: []attribute.KeyValue{attribute.String("region", cfg.Region), attribute.String("lane", "")},
		Handle: consumer.Typed(log, event.Parse[event.Outcome], p.handle)})
	if err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	return p, nil
}

// Start consumes OUTCOME.
func (p *Publisher) Start(ctx context.Context) error { return p.consumer.Start(ctx) }

// Stop stops taking outcomes and waits for those in hand. Idempotent.
func (p *Publisher) Stop(ctx context.Context) { p.consumer.Stop(ctx) }

// Ready reports whether the durable is in place.
func (p *Publisher) Ready(ctx context.Context) error { return p.consumer.Ready(ctx) }

// Target is where this publisher publishes.
func (p *Publisher) Target() string {
	if p.cfg.GitHub != nil {
		return TargetGitHub
	}
	return TargetDry
}

func (p *Publisher) handle(ctx context.Context, ev event.Outcome, d consumer.Delivery) consumer.Disposition {
	err := p.Publish(ctx, ev)
	var re *RetryError
	switch {
	case err == nil:
		return consumer.Done()
	case errors.As(err, &re):
		p.log.Warn("publication will be tried again", "key", ev.WorkID, "work_outcome", ev.Outcome, "wait", re.Wait.String(), "err", err)
		// Never earlier than GitHub said; a failure that named no time
		// backs off.
		if re.Wait > 0 {
			return consumer.Retry(re.Wait)
		}
		return consumer.Retry(backoff(d))
	case errors.Is(err, errFinal):
		return consumer.Done()
	}
	p.log.Warn("publication failed; will retry", "key", ev.WorkID, "work_outcome", ev.Outcome, "err", err)
	return consumer.Retry(backoff(d))
}

// backoff is the wait after a failure that named no time.
func backoff(consumer.Delivery) time.Duration { return 2 * time.Second }

// errFinal marks a publication that no retry mends; it is recorded.
var errFinal = errors.New("publication failed for good")

// Publish publishes one outcome behind the publication fence. It is
// idempotent: a redelivered outcome edits the check run and comments the
// fence recorded (or the markers found) and never makes a second.
func (p *Publisher) Publish(ctx context.Context, ev event.Outcome) error {
	f, err := p.st.PublishFacts(ctx, ev.WorkID)
	w := f.Work
	if errors.Is(err, store.ErrNotFound) || (err == nil && w.TenantID != ev.TenantID) {
		telemetry.Decision(ctx, p.log, ev.WorkID, "refused", "outcome names work this cell does not have for that tenant")
		return nil
	}
	if err != nil {
		return err
	}
	if w.State != ev.Outcome {
		// Dropped work run again has a newer outcome to come.
		telemetry.Decision(ctx, p.log, ev.WorkID, "unpublished", "the work is now "+w.State+"; the outcome "+ev.Outcome+" is not published")
		return nil
	}
	if w.State == outcome.Accepted && f.Output == nil {
		return fmt.Errorf("publish: accepted work %s has no result", w.ID)
	}
	if f.Callback != nil {
		if err := p.toCallback(ctx, w, ev, *f.Callback, f.Output); err != nil {
			return err
		}
	}
	if w.Contract != ReviewContract {
		return nil
	}
	src, err := store.PullSourceOf(w, f.Delivery, f.Links)
	if errors.Is(err, store.ErrNoPullSource) {
		// Not about a pull request: nothing to publish to on GitHub.
		return nil
	}
	if err != nil {
		return err
	}
	target := p.Target()
	if target == TargetGitHub && src.Installation == 0 {
		// Neither an App delivery nor a link of the tenant's names an
		// installation that may write to the repository.
		telemetry.Decision(ctx, p.log, w.ID, "unpublished", "no GitHub App installation of the tenant covers "+src.Owner+"/"+src.Repo)
		return nil
	}
	plan := p.plan(w, src, f)
	if target == TargetDry {
		// Nothing leaves the cell: the plan is recorded in one statement.
		b, err := json.Marshal(plan)
		if err != nil {
			return err
		}
		if err := p.st.RecordDryPublication(ctx, w.ID, w.TenantID, ev.Outcome, b); err != nil {
			return err
		}
		p.count(ctx, target, "published")
		telemetry.Decision(ctx, p.log, w.ID, "published", fmt.Sprintf("%s to %s: check run %v, %d comments, rerun comment %v",
			ev.Outcome, target, plan.CheckRun != nil, len(plan.Comments), plan.Rerun != ""))
		return nil
	}
	pub, release, err := p.st.LockPublication(ctx, w.ID, target, w.TenantID, ev.Outcome)
	if errors.Is(err, store.ErrPublicationBusy) {
		return &RetryError{Wait: time.Second, Err: err}
	}
	if err != nil {
		return err
	}
	defer release()
	if target == TargetGitHub {
		if err := p.toGitHub(ctx, pub, plan, src.Installation); err != nil {
			var se *StatusError
			var re *RetryError
			if !errors.As(err, &re) && errors.As(err, &se) && se.Status != http.StatusUnauthorized {
				_ = p.st.FailPublication(context.WithoutCancel(ctx), w.ID, target, err.Error())
				p.count(ctx, target, "failed")
				telemetry.Decision(ctx, p.log, w.ID, "publication_failed", se.Error())
				return fmt.Errorf("%w: %v", errFinal, err)
			}
			_ = p.st.FailPublication(context.WithoutCancel(ctx), w.ID, target, err.Error())
			return err
		}
	}
	b, err := json.Marshal(plan)
	if err != nil {
		return err
	}
	if err := p.st.FinishPublication(ctx, w.ID, target, ev.Outcome, b); err != nil {
		return err
	}
	p.count(ctx, target, "published")
	telemetry.Decision(ctx, p.log, w.ID, "published", fmt.Sprintf("%s to %s: check run %v, %d comments, rerun comment %v",
		ev.Outcome, target, plan.CheckRun != nil, len(plan.Comments), plan.Rerun != ""))
	return nil
}

func (p *Publisher) count(ctx context.Context, target, result string) {
	p.published.Add(ctx, 1, metric.WithAttributes(attribute.String("region", p.cfg.Region),
		attribute.String("target", target), attribute.String("result", result)))
}

// plan gathers what Decide needs.
func (p *Publisher) plan(w *store.Work, src store.PullSource, f store.PublishFacts) Plan {
	in := Input{WorkID: w.ID, Outcome: w.State, Reason: w.Reason, Source: src, Rerun: p.cfg.Rerun(w.ID)}
	if w.State == outcome.Accepted {
		in.Findings = Findings(f.Output)
		in.Policy = f.CheckPolicy
	}
	return Decide(in)
}

// toGitHub carries the plan out, recording each remote id as soon as it
// is known. What the fence has not recorded is looked for by its marker
// before anything is made.
func (p *Publisher) toGitHub(ctx context.Context, pub *store.Publication, plan Plan, inst int64) error {
	g := p.cfg.GitHub
	if plan.CheckRun != nil {
		id := pub.CheckRunID
		if id == 0 {
			found, err := g.findCheckRun(ctx, inst, plan)
			if err != nil {
				return err
			}
			id = found
			if id != 0 {
				if err := p.st.RecordCheckRun(ctx, pub.WorkID, pub.Target, id); err != nil {
					return err
				}
			}
		}
		made, err := g.putCheckRun(ctx, inst, plan, id)
		if err != nil {
			return err
		}
		if id == 0 {
			if err := p.st.RecordCheckRun(ctx, pub.WorkID, pub.Target, made); err != nil {
				return err
			}
		}
	}
	if len(plan.Comments) > 0 {
		var found map[string]int64
		for _, c := range plan.Comments {
			id := pub.CommentIDs[c.Key]
			if id == 0 {
				if found == nil {
					var err error
					if found, err = g.markedComments(ctx, inst, plan, false); err != nil {
						return err
					}
				}
				id = found[c.Key]
			}
			made, err := g.putReviewComment(ctx, inst, plan, c, id)
			if err != nil {
				return err
			}
			if pub.CommentIDs[c.Key] == 0 {
				if err := p.st.RecordComment(ctx, pub.WorkID, pub.Target, c.Key, made); err != nil {
					return err
				}
			}
		}
	}
	if plan.Rerun != "" {
		id := pub.RerunCommentID
		if id == 0 {
			found, err := g.markedComments(ctx, inst, plan, true)
			if err != nil {
				return err
			}
			id = found[rerunKey]
		}
		made, err := g.putIssueComment(ctx, inst, plan, rerunKey, plan.Rerun, id)
		if err != nil {
			return err
		}
		if pub.RerunCommentID == 0 {
			if err := p.st.RecordRerunComment(ctx, pub.WorkID, pub.Target, made); err != nil {
				return err
			}
		}
	}
	return nil
}
