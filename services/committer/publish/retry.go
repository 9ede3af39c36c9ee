package publish

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"assay.dev/pkg/event"
	"assay.dev/pkg/store"
)

// Backoff is how long a failed publication waits before its next try: a
// capped exponential backoff with jitter, and never less than the target
// asked for (Retry-After, a rate limit's reset).
type Backoff struct {
	// Base is the wait after the first failed try; it doubles with each
	// try, up to Cap.
	Base, Cap time.Duration
}

// Wait is the wait after a failed try when tries were made before it;
// told is what the target asked for, 0 when nothing. The wait is drawn
// from the upper half of the doubled interval, so tries spread out and the
// interval still grows.
func (b Backoff) Wait(tries int, told time.Duration) time.Duration {
	d := b.Base << min(max(tries, 0), 30)
	if d <= 0 || d > b.Cap {
		d = b.Cap
	}
	w := d/2 + rand.N(d/2+1)
	return max(w, told)
}

// retryBatch bounds the due publications one retrier pass tries.
const retryBatch = 50

// RetryDue tries the publications whose next try is due, each target on
// its own; more says a full batch was due.
func (p *Publisher) RetryDue(ctx context.Context) (more bool, err error) {
	due, err := p.st.DuePublications(ctx, p.now(), retryBatch)
	if err != nil {
		return false, err
	}
	// Each publication takes its target's slot too; this bounds the
	// goroutines of a pass.
	sem := make(chan struct{}, p.cfg.Concurrency+p.cfg.CallbackConcurrency)
	var wg sync.WaitGroup
	for _, r := range due {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ev := event.Outcome{OutcomeID: event.OutcomeMsgID(r.WorkID, r.Outcome), WorkID: r.WorkID, TenantID: r.TenantID,
				Region: p.cfg.Region, Outcome: r.Outcome}
			if err := p.publish(ctx, ev, r.Target); err != nil {
				p.log.Warn("publication retry not recorded; the next pass tries again", "key", r.WorkID, "target", r.Target, "err", err)
			}
		})
	}
	wg.Wait()
	return len(due) == retryBatch, nil
}

// Unfinished states the gauge counts, and the targets that are retried.
var (
	unfinishedStates = []string{store.PublicationPending, store.PublicationFailed}
	retriedTargets   = []string{TargetGitHub, TargetCallback}
)

// countUnfinished reads how many publications are pending and failed, per
// target, for the gauge: a scrape never queries the database.
func (p *Publisher) countUnfinished(ctx context.Context) (bool, error) {
	counts, err := p.st.UnfinishedPublications(ctx, "")
	if err != nil {
		return false, err
	}
	fresh := map[[2]string]int64{}
	for _, t := range retriedTargets {
		for _, s := range unfinishedStates {
			fresh[[2]string{t, s}] = 0
		}
	}
	for _, c := range counts {
		fresh[[2]string{c.Target, c.State}] = c.Count
	}
	p.mu.Lock()
	p.counts = fresh
	p.mu.Unlock()
	return false, nil
}

// instruments registers the publisher's counter and gauge. Both read 0
// from the start for every target retried, so an alert over them reads 0
// rather than nothing.
func (p *Publisher) instruments(meter metric.Meter) error {
	var err error
	if p.published, err = meter.Int64Counter("assay_publications",
		metric.WithDescription("tries of publications by target and result: published, deferred (tried again later), paced (waits for the installation's GitHub write budget; not a try), superseded (a newer revision's review replaces it), failed")); err != nil {
		return err
	}
	region := attribute.String("region", p.cfg.Region)
	for _, t := range retriedTargets {
		p.counts[[2]string{t, store.PublicationPending}], p.counts[[2]string{t, store.PublicationFailed}] = 0, 0
		for _, r := range []string{"published", "deferred", "paced", "superseded", "failed"} {
			p.published.Add(context.Background(), 0, metric.WithAttributes(region, attribute.String("target", t), attribute.String("result", r)))
		}
	}
	_, err = meter.Int64ObservableGauge("assay_publications_unfinished",
		metric.WithDescription("publications not made: pending (tried again until their deadline) and failed (past it, or refused for good), by target"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			p.mu.Lock()
			defer p.mu.Unlock()
			for k, n := range p.counts {
				o.Observe(n, metric.WithAttributes(region, attribute.String("target", k[0]), attribute.String("state", k[1])))
			}
			return nil
		}))
	return err
}
