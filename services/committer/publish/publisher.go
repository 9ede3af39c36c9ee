package publish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"assay.dev/pkg/consumer"
	"assay.dev/pkg/diff"
	"assay.dev/pkg/event"
	"assay.dev/pkg/group"
	"assay.dev/pkg/lifecycle"
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
	// TargetNone records that an outcome has nowhere to be published, and
	// why.
	TargetNone = "none"
)

// Store is what the publisher asks of the cell's database; *store.Store
// is one.
type Store interface {
	PublishFacts(ctx context.Context, workID string) (store.PublishFacts, error)
	PublishFactsGroup(ctx context.Context, ids []string) []store.Facts
	RecordDryPublication(ctx context.Context, workID, tenant, outcome string, plan json.RawMessage) error
	RecordDryPublicationGroup(ctx context.Context, recs []store.DryPublication) []error
	SkipPublication(ctx context.Context, workID, target, tenant, outcome, reason string) error
	SupersedePublication(ctx context.Context, workID, target, tenant, outcome, reason string) error
	OpenPublications(ctx context.Context, workID, tenant, outcome string, targets []string, now, deadline time.Time) (map[string]*store.Publication, error)
	LockPublication(ctx context.Context, workID, target string) (*store.Publication, func(), error)
	RecordCheckRun(ctx context.Context, workID, target string, id int64) error
	FinishCheckRun(ctx context.Context, workID, target, outcome string, id int64) error
	FinishComment(ctx context.Context, workID, target, outcome, key string, id int64) error
	FinishReview(ctx context.Context, workID, target, outcome string, id int64, comments map[string]int64) error
	FinishRerunComment(ctx context.Context, workID, target, outcome string, id int64) error
	FinishPublication(ctx context.Context, workID, target, outcome string, plan json.RawMessage, now time.Time) error
	DeferPublication(ctx context.Context, workID, target, msg string, now, next time.Time) error
	PacePublication(ctx context.Context, workID, target, msg string, next time.Time) error
	FailPublication(ctx context.Context, workID, target, msg, reason string, now time.Time) error
	DuePublications(ctx context.Context, now time.Time, limit int) ([]*store.Publication, error)
	UnfinishedPublications(ctx context.Context, tenant string) ([]store.PublicationCount, error)
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
	// Rest is the command that reviews the rest of a partial review,
	// without its --cost-cap. Default "assay work rest <id> --region
	// <region>".
	Rest func(workID string) string
	// Deadline is how long an outcome's publication to a target is tried
	// before it is failed, from its first try. Default a day.
	Deadline time.Duration
	// Backoff is the retry policy of every target: the wait after a failed
	// try that named none, growing with each try. Defaults 2s and 5m.
	Backoff Backoff
	// RetryEvery is how often the publications whose next try is due are
	// tried. Default 1s.
	RetryEvery time.Duration
	// CountEvery is how often the pending and failed publications are
	// counted for their gauge. Default 15s.
	CountEvery time.Duration
	// AckWait configures the OUTCOME durable. Default 60s. An outcome is
	// acknowledged once its publications are recorded (made, or scheduled
	// to be tried again), so the durable never gives up on one.
	AckWait time.Duration
	// Concurrency is how many publications to GitHub are tried at once.
	// Default 4. Up to 32 outcomes are in hand, their reads and records in
	// groups. What GitHub is sent is paced by each installation's budget
	// (GitHub.Budget), however many are tried at once.
	Concurrency int
	// CallbackConcurrency is how many callbacks are tried at once, apart
	// from GitHub's: a slow tenant endpoint never holds a pull request's
	// review back, nor the reverse. Default 4.
	CallbackConcurrency int
	// CallbackTimeout bounds one callback. Default 10s.
	CallbackTimeout time.Duration
	// TryTimeout bounds one try of a publication, all its calls together,
	// so a target that hangs holds an outcome no longer than this, within
	// the durable's ack wait. Default 45s.
	TryTimeout time.Duration
	// Now is the publisher's clock, for its tries, backoff and deadlines.
	// Default time.Now.
	Now func() time.Time
}

func (c *Config) defaults() error {
	if c.Rest == nil {
		c.Rest = func(id string) string { return fmt.Sprintf("assay work rest %s --region %s", id, c.Region) }
	}
	if c.Rerun == nil {
		return errors.New("publish: Rerun is required")
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 4
	}
	if c.CallbackConcurrency <= 0 {
		c.CallbackConcurrency = 4
	}
	if c.AckWait <= 0 {
		c.AckWait = time.Minute
	}
	if c.Deadline <= 0 {
		c.Deadline = 24 * time.Hour
	}
	if c.Backoff.Base <= 0 {
		c.Backoff.Base = 2 * time.Second
	}
	if c.Backoff.Cap <= 0 {
		c.Backoff.Cap = 5 * time.Minute
	}
	if c.RetryEvery <= 0 {
		c.RetryEvery = time.Second
	}
	if c.CountEvery <= 0 {
		c.CountEvery = 15 * time.Second
	}
	if c.CallbackTimeout <= 0 {
		c.CallbackTimeout = 10 * time.Second
	}
	if c.TryTimeout <= 0 {
		c.TryTimeout = 45 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Publisher consumes the cell's OUTCOME stream and publishes each outcome
// to each of its targets, each retried on its own until its deadline.
type Publisher struct {
	cfg       Config
	st        Store
	log       *slog.Logger
	consumer  *consumer.Consumer
	onError   consumer.Step[event.Outcome] // what a publication's error does to its outcome
	retrier   lifecycle.Ticker
	counter   lifecycle.Ticker
	published metric.Int64Counter
	callbacks *http.Client

	mu     sync.Mutex
	counts map[[2]string]int64 // target, state -> publications

	// The reads and dry records of the outcomes in hand, in groups; tries
	// and callbackTries bound the tries made at once (Concurrency,
	// CallbackConcurrency).
	factsOf       *group.Batch[string, store.Facts]
	drys          *group.Batch[store.DryPublication, error]
	tries         chan struct{}
	callbackTries chan struct{}
}

// inHand is how many outcomes the publisher holds at once.
const inHand = 32

// New builds a publisher on its own OUTCOME durable.
func New(cfg Config, st Store, js jetstream.StreamConsumerManager, log *slog.Logger, meter metric.Meter) (*Publisher, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	p := &Publisher{cfg: cfg, st: st, log: log, callbacks: &http.Client{Timeout: cfg.CallbackTimeout}, counts: map[[2]string]int64{},
		factsOf: &group.Batch[string, store.Facts]{Run: st.PublishFactsGroup},
		drys:    &group.Batch[store.DryPublication, error]{Run: st.RecordDryPublicationGroup},
		tries:   make(chan struct{}, cfg.Concurrency), callbackTries: make(chan struct{}, cfg.CallbackConcurrency)}
	if err := p.instruments(meter); err != nil {
		return nil, err
	}
	p.onError = consumer.Step[event.Outcome]{Log: log, Failed: "publication not recorded; the outcome is delivered again",
		Attrs: func(ev event.Outcome) []any { return []any{"key", ev.WorkID, "work_outcome", ev.Outcome} }, Wait: cfg.Backoff.Base}
	var err error
	p.consumer, err = consumer.New(consumer.Config{JS: js, Stream: cfg.Names.Stream(event.KindOutcome),
		Durable: event.ConsumerSettings{Durable: cfg.Names.OutcomeConsumer(), AckWait: cfg.AckWait, MaxDeliver: -1,
			MaxAckPending: 4 * inHand},
		Concurrency: inHand, Log: log, Meter: meter,
		Labels: []attribute.KeyValue{attribute.String("region", cfg.Region), attribute.String("lane", "")},
		Handle: consumer.Typed(log, event.Parse[event.Outcome], p.handle)})
	if err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	r := &p.retrier
	r.Name, r.Every, r.Log, r.PassTimeout, r.Pass = "publication retrier", cfg.RetryEvery, log, 2*time.Minute, p.RetryDue
	c := &p.counter
	c.Name, c.Every, c.Log, c.Pass = "publication counter", cfg.CountEvery, log, p.countUnfinished
	return p, nil
}

// Start consumes OUTCOME, tries due publications again and counts those
// not yet made.
func (p *Publisher) Start(ctx context.Context) error {
	return lifecycle.StartAll(ctx, p.consumer, &p.retrier, &p.counter)
}

// Stop stops taking outcomes and waits for those in hand, then stops
// retrying. Idempotent.
func (p *Publisher) Stop(ctx context.Context) {
	lifecycle.StopAll(ctx, p.consumer, &p.retrier, &p.counter)
}

// Ready reports whether the durable is in place.
func (p *Publisher) Ready(ctx context.Context) error { return p.consumer.Ready(ctx) }

// Target is where this publisher publishes pull request work.
func (p *Publisher) Target() string {
	if p.cfg.GitHub != nil {
		return TargetGitHub
	}
	return TargetDry
}

func (p *Publisher) now() time.Time { return p.cfg.Now() }

// handle publishes each outcome. Nothing of a publication that failed is
// recorded yet (the database did not answer): the outcome comes again.
func (p *Publisher) handle(ctx context.Context, ev event.Outcome, _ consumer.Delivery) consumer.Disposition {
	return p.onError.Settle(ctx, ev, p.Publish(ctx, ev))
}

// errFinal marks a publication that no retry mends; it is failed at once.
var errFinal = errors.New("publication failed for good")

// target is one place an outcome is published to, and how.
type target struct {
	name string
	// plan is what GitHub gets (or the dry target records); body what a
	// callback carries.
	plan Plan
	inst int64
	cb   store.Callback
	body []byte
	// unreadable, when set, says why the accepted answer the plan is made
	// from cannot be read: the publication fails for good, loudly, and
	// nothing is posted (never a check run that says "No findings").
	unreadable error
}

// Publish publishes one outcome behind the publication fence, to each of
// its targets whose try is due, each on its own: one that fails is
// scheduled again and never holds up another. It is idempotent: a
// redelivered outcome finds its publications made (or scheduled) and
// changes nothing. An error means nothing was recorded for some target.
func (p *Publisher) Publish(ctx context.Context, ev event.Outcome) error {
	return p.publish(ctx, ev, "")
}

// publish publishes ev to its targets, or to only that one when set.
func (p *Publisher) publish(ctx context.Context, ev event.Outcome, only string) error {
	f, moot, err := p.facts(ctx, ev)
	if err != nil {
		return err
	}
	if moot != "" {
		if only != "" {
			return p.st.SkipPublication(ctx, ev.WorkID, only, ev.TenantID, ev.Outcome, moot)
		}
		return nil
	}
	w := f.Work
	ts, skip, err := p.targets(f)
	if err != nil {
		return err
	}
	var done bool
	if ts, done, err = p.superseded(ctx, f, ev, ts, only); err != nil || done {
		return err
	}
	if skip != "" && only == "" {
		telemetry.Decision(ctx, p.log, w.ID, "unpublished", skip)
		if err := p.st.SkipPublication(ctx, w.ID, TargetNone, w.TenantID, ev.Outcome, skip); err != nil {
			return err
		}
	}
	var names []string
	for _, t := range ts {
		// A dry plan that could not be made is failed as a publication
		// would be, so it is recorded, not left out.
		dry := t.name == TargetDry && t.unreadable == nil
		switch {
		case dry && only == "":
			if err := p.dry(ctx, w, ev, t.plan); err != nil {
				return err
			}
		case !dry && (only == "" || only == t.name):
			names = append(names, t.name)
		}
	}
	if len(names) == 0 {
		if only != "" {
			return p.st.SkipPublication(ctx, ev.WorkID, only, ev.TenantID, ev.Outcome, "the outcome no longer goes to "+only)
		}
		return nil
	}
	now := p.now()
	pubs, err := p.st.OpenPublications(ctx, w.ID, w.TenantID, ev.Outcome, names, now, now.Add(p.cfg.Deadline))
	if err != nil {
		return err
	}
	errs := make([]error, len(ts))
	var wg sync.WaitGroup
	for i, t := range ts {
		if pub := pubs[t.name]; pub != nil && due(pub, ev.Outcome, now) {
			slots := p.tries
			if t.name == TargetCallback {
				slots = p.callbackTries
			}
			wg.Go(func() {
				slots <- struct{}{}
				defer func() { <-slots }()
				errs[i] = p.try(ctx, w, ev, t)
			})
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

// superseded ends the pull request's publication as superseded when a
// newer revision of it is accepted or on its way, since that revision's
// review replaces this one, and returns the targets left; done when the
// one asked for (only) was that one.
func (p *Publisher) superseded(ctx context.Context, f store.PublishFacts, ev event.Outcome, ts []target, only string) (
	left []target, done bool, err error) {
	if f.Newer == "" {
		return ts, false, nil
	}
	w := f.Work
	reason := "revision " + f.Newer + " of the pull request replaces this one's review"
	var kept []target
	for _, t := range ts {
		if t.name != TargetGitHub && t.name != TargetDry {
			kept = append(kept, t)
			continue
		}
		if only != "" && only != t.name {
			continue
		}
		if err := p.st.SupersedePublication(ctx, w.ID, t.name, w.TenantID, ev.Outcome, reason); err != nil {
			return nil, false, err
		}
		p.count(ctx, t.name, "superseded")
		telemetry.Decision(ctx, p.log, w.ID, "superseded", ev.Outcome+" not published to "+t.name+": "+reason)
		if only == t.name {
			return nil, true, nil
		}
	}
	return kept, false, nil
}

// due is whether a publication of outcome waits for a try at now.
func due(pub *store.Publication, outcome string, now time.Time) bool {
	return pub.Outcome == outcome && pub.State == store.PublicationPending && !pub.NextTryAt.After(now)
}

// facts reads what publishing ev needs. moot, when set, says why ev is not
// published at all.
func (p *Publisher) facts(ctx context.Context, ev event.Outcome) (f store.PublishFacts, moot string, err error) {
	got := p.factsOf.Do(ctx, ev.WorkID)
	f, err = got.PublishFacts, got.Err
	w := f.Work
	if errors.Is(err, store.ErrNotFound) || (err == nil && w.TenantID != ev.TenantID) {
		telemetry.Decision(ctx, p.log, ev.WorkID, "refused", "outcome names work this cell does not have for that tenant")
		return f, "no such work of the tenant", nil
	}
	if err != nil {
		return f, "", err
	}
	switch {
	case ev.Outcome == outcome.Reviewed && f.Reviewed == nil:
		moot = "no person resolved the work's review item with an answer; the outcome reviewed is not published"
	case ev.Outcome == outcome.Reviewed:
		// The person's answer is published as an accepted one would be.
		reviewed := *w
		reviewed.State = outcome.Reviewed
		f.Work, f.Output = &reviewed, f.Reviewed
		return f, "", nil
	case f.Reviewed != nil:
		moot = "a person's review of the work is published instead; its outcome " + ev.Outcome + " is not"
	case w.State != ev.Outcome:
		// Dropped work run again has a newer outcome to come.
		moot = "the work is now " + w.State + "; the outcome " + ev.Outcome + " is not published"
	}
	if moot != "" {
		telemetry.Decision(ctx, p.log, ev.WorkID, "unpublished", moot)
		return f, moot, nil
	}
	if w.State == outcome.Accepted && f.Output == nil {
		return f, "", fmt.Errorf("publish: accepted work %s has no result", w.ID)
	}
	return f, "", nil
}

// targets are where the work's outcome goes: the tenant's callback, and
// for a pull request's review GitHub (or the dry record). skip, when set,
// says why the pull request gets nothing.
func (p *Publisher) targets(f store.PublishFacts) (ts []target, skip string, err error) {
	w := f.Work
	if f.Callback != nil {
		body, err := p.callbackBody(w, f.Output)
		if err != nil {
			return nil, "", err
		}
		ts = append(ts, target{name: TargetCallback, cb: *f.Callback, body: body})
	}
	if w.Contract != ReviewContract {
		return ts, "", nil
	}
	src, err := store.PullSourceOf(w, f.Delivery, f.Links)
	if errors.Is(err, store.ErrNoPullSource) {
		// Not about a pull request: nothing to publish to on GitHub.
		return ts, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	name := p.Target()
	if name == TargetGitHub && src.Installation == 0 {
		// Neither an App delivery nor a link of the tenant's names an
		// installation that may write to the repository.
		return ts, "no GitHub App installation of the tenant covers " + src.Owner + "/" + src.Repo, nil
	}
	plan, unreadable := p.plan(w, src, f)
	return append(ts, target{name: name, plan: plan, inst: src.Installation, unreadable: unreadable}), "", nil
}

// dry records the plan under the dry target: nothing leaves the cell.
func (p *Publisher) dry(ctx context.Context, w *store.Work, ev event.Outcome, plan Plan) error {
	b, err := json.Marshal(plan)
	if err != nil {
		return err
	}
	if err := p.drys.Do(ctx, store.DryPublication{WorkID: w.ID, Tenant: w.TenantID, Outcome: ev.Outcome, Plan: b}); err != nil {
		return err
	}
	p.count(ctx, TargetDry, "published")
	telemetry.Decision(ctx, p.log, w.ID, "published", fmt.Sprintf("%s to %s: check run %v, %d comments, rerun comment %v",
		ev.Outcome, TargetDry, plan.CheckRun != nil, len(plan.Comments), plan.Rerun != ""))
	return nil
}

// try makes one try of a publication under its lock, and records how it
// went: made, tried again later, or failed.
func (p *Publisher) try(ctx context.Context, w *store.Work, ev event.Outcome, t target) error {
	pub, release, err := p.st.LockPublication(ctx, w.ID, t.name)
	if errors.Is(err, store.ErrPublicationBusy) {
		// Another publisher is at it, and records how its try went.
		return nil
	}
	if err != nil {
		return err
	}
	defer release()
	if !due(pub, ev.Outcome, p.now()) {
		return nil
	}
	tctx, cancel := context.WithTimeout(ctx, p.cfg.TryTimeout)
	defer cancel()
	var sent error
	record := t.body
	switch {
	case t.unreadable != nil:
		sent = fmt.Errorf("%w: %v", errFinal, t.unreadable)
	case t.name == TargetGitHub:
		sent = p.toGitHub(tctx, pub, t.plan, t.inst)
		if record, err = json.Marshal(t.plan); err != nil {
			return err
		}
	case t.name == TargetCallback:
		sent = p.callback(tctx, t.cb.URL, t.cb.Secret, ev.OutcomeID, t.body)
	}
	return p.settle(context.WithoutCancel(ctx), w, ev, t, pub, sent, record)
}

// settle records how one try went.
func (p *Publisher) settle(ctx context.Context, w *store.Work, ev event.Outcome, t target, pub *store.Publication, sent error,
	record json.RawMessage) error {
	now := p.now()
	if sent == nil {
		if err := p.st.FinishPublication(ctx, w.ID, t.name, ev.Outcome, record, now); err != nil {
			return err
		}
		p.count(ctx, t.name, "published")
		what := ev.Outcome + " to the tenant's callback"
		if t.name == TargetGitHub {
			review := "no review"
			if n := len(t.plan.Comments); n > 0 {
				review = fmt.Sprintf("review with %d comments", n)
			}
			what = fmt.Sprintf("%s to %s: check run %v, %s, rerun comment %v",
				ev.Outcome, t.name, t.plan.CheckRun != nil, review, t.plan.Rerun != "")
		}
		telemetry.Decision(ctx, p.log, w.ID, "published", what, slog.Int("tries", pub.Tries+1))
		return nil
	}
	var re *RetryError
	if errors.As(sent, &re) && errors.Is(re.Err, errPaced) && !now.Add(re.Wait).After(pub.DeadlineAt) {
		// Nothing was sent: the installation's budget had no room. It is
		// tried once the budget has, and that is not a try.
		if err := p.st.PacePublication(ctx, w.ID, t.name, sent.Error(), now.Add(re.Wait)); err != nil {
			return err
		}
		p.count(ctx, t.name, "paced")
		return nil
	}
	wait, told, final := p.next(pub.Tries, sent)
	next := now.Add(wait)
	if next.After(pub.DeadlineAt) && !now.Add(told).After(pub.DeadlineAt) {
		// One last try at the deadline itself.
		next = pub.DeadlineAt
	}
	var reason string
	switch {
	case final:
		reason = "refused for good: " + sent.Error()
	case !now.Before(pub.DeadlineAt) || next.After(pub.DeadlineAt):
		reason = fmt.Sprintf("not made by its deadline %s, after %d tries", pub.DeadlineAt.UTC().Format(time.RFC3339), pub.Tries+1)
	default:
		if err := p.st.DeferPublication(ctx, w.ID, t.name, sent.Error(), now, next); err != nil {
			return err
		}
		p.count(ctx, t.name, "deferred")
		p.log.Warn("publication will be tried again", "key", w.ID, "target", t.name, "work_outcome", ev.Outcome,
			"tries", pub.Tries+1, "next_try", next.UTC().Format(time.RFC3339Nano), "err", sent)
		return nil
	}
	if err := p.st.FailPublication(ctx, w.ID, t.name, sent.Error(), reason, now); err != nil {
		return err
	}
	p.count(ctx, t.name, "failed")
	telemetry.Decision(ctx, p.log, w.ID, "publication_failed", fmt.Sprintf("%s: %s; last error: %v; send it again with: assay publish retry --work %s",
		t.name, reason, sent, w.ID))
	return nil
}

// next says how long a failed try waits for the next, and the part of
// that the target asked for, or that no try can mend it.
func (p *Publisher) next(tries int, err error) (wait, told time.Duration, final bool) {
	var re *RetryError
	var se *StatusError
	switch {
	case errors.As(err, &re):
		return p.cfg.Backoff.Wait(tries, re.Wait), re.Wait, false
	case errors.Is(err, errFinal):
		return 0, 0, true
	case errors.As(err, &se) && se.Status != http.StatusUnauthorized:
		return 0, 0, true
	}
	// A failure that says nothing of the target (the cell's database, a
	// token refused as bad credentials) is tried again.
	return p.cfg.Backoff.Wait(tries, 0), 0, false
}

func (p *Publisher) count(ctx context.Context, target, result string) {
	p.published.Add(ctx, 1, metric.WithAttributes(attribute.String("region", p.cfg.Region),
		attribute.String("target", target), attribute.String("result", result)))
}

// plan gathers what Decide needs. An accepted or reviewed answer that
// cannot be read is an error, and no plan.
func (p *Publisher) plan(w *store.Work, src store.PullSource, f store.PublishFacts) (Plan, error) {
	in := Input{WorkID: w.ID, Outcome: w.State, Reason: w.Reason, Source: src, Rerun: p.cfg.Rerun(w.ID), Rest: p.cfg.Rest(w.ID)}
	if w.State == outcome.Accepted || w.State == outcome.Reviewed {
		var err error
		if in.Findings, err = Findings(f.Output); err != nil {
			return Plan{}, err
		}
		in.Policy = f.CheckPolicy
		if len(f.Coverage) > 0 {
			var cv diff.Coverage
			if json.Unmarshal(f.Coverage, &cv) == nil {
				in.Coverage = &cv
			}
		}
	}
	return Decide(in), nil
}

// toGitHub carries the plan out in up to three steps: the check run, the
// findings (one review), the conversation comment. Each step is recorded
// complete for the publication's outcome as soon as it is, with its remote
// ids, so a retry sends nothing a step already did: a failed review does
// not edit the check run again. What the fence has not recorded is looked
// for by its marker before anything is made.
func (p *Publisher) toGitHub(ctx context.Context, pub *store.Publication, plan Plan, inst int64) error {
	g := p.cfg.GitHub
	if plan.CheckRun != nil && !pub.Done(store.StepCheckRun) {
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
		if err := p.st.FinishCheckRun(ctx, pub.WorkID, pub.Target, pub.Outcome, made); err != nil {
			return err
		}
	}
	if len(plan.Comments) > 0 && !pub.Done(store.StepReview) {
		if err := p.review(ctx, pub, plan, inst); err != nil {
			return err
		}
	}
	if plan.Rerun != "" && !pub.Done(store.StepRerun) {
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
		if err := p.st.FinishRerunComment(ctx, pub.WorkID, pub.Target, pub.Outcome, made); err != nil {
			return err
		}
	}
	return nil
}

// review puts each finding of the plan on the pull request once. A finding
// whose key already has a comment (an earlier outcome of the work made it:
// the model's accepted review before a person's) has that comment edited,
// each edit recorded as its own step; the findings with none go out
// together as one review, whatever their number, and the review's comment
// ids are recorded with it. Before a review is made, the one an earlier
// try of this outcome may have made is looked for by its body's marker and
// taken instead; and where comments the fence may not know of can exist
// (another outcome's review, an earlier try), the pull request's review
// comments are looked through by their markers.
func (p *Publisher) review(ctx context.Context, pub *store.Publication, plan Plan, inst int64) error {
	g := p.cfg.GitHub
	ids := maps.Clone(pub.CommentIDs)
	if ids == nil {
		ids = map[string]int64{}
	}
	missing := func() bool {
		return slices.ContainsFunc(plan.Comments, func(c Comment) bool { return ids[c.Key] == 0 })
	}
	made := map[string]int64{} // comments made with this outcome's text by its review
	var id int64               // that review
	if missing() {
		reviews, err := g.markedReviews(ctx, inst, plan)
		if err != nil {
			return err
		}
		if id = reviews[reviewKey(plan.Outcome)]; id != 0 {
			if made, err = g.reviewComments(ctx, inst, plan, id); err != nil {
				return err
			}
			maps.Copy(ids, made)
		}
		others := len(reviews)
		if id != 0 {
			others--
		}
		if missing() && (others > 0 || len(pub.CommentIDs) > 0 || pub.Tries > 0) {
			found, err := g.markedComments(ctx, inst, plan, false)
			if err != nil {
				return err
			}
			for k, c := range found {
				if ids[k] == 0 {
					ids[k] = c
				}
			}
		}
	}
	var fresh []Comment
	for _, c := range plan.Comments {
		switch {
		case made[c.Key] != 0:
			// This outcome's review made it, with this outcome's text.
		case ids[c.Key] == 0:
			fresh = append(fresh, c)
		case pub.Done(store.StepComment(c.Key)):
		default:
			if err := g.editReviewComment(ctx, inst, plan, c, ids[c.Key]); err != nil {
				return err
			}
			if err := p.st.FinishComment(ctx, pub.WorkID, pub.Target, pub.Outcome, c.Key, ids[c.Key]); err != nil {
				return err
			}
		}
	}
	if len(fresh) > 0 {
		var err error
		if id, err = g.postReview(ctx, inst, plan, fresh); err != nil {
			return err
		}
		more, err := g.reviewComments(ctx, inst, plan, id)
		if err != nil {
			return err
		}
		maps.Copy(made, more)
	}
	return p.st.FinishReview(ctx, pub.WorkID, pub.Target, pub.Outcome, id, made)
}
