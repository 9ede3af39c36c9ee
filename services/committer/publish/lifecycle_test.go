package publish

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/lifecycle/lifecycletest"
)

// warmWithin bounds how long a warm part is waited for after Start.
const warmWithin = 3 * time.Second

// warm is a part whose Start returns once ready says it runs (or
// warmWithin passed: a Start that lost a race with Stop may never be), so
// the Stops of a Stress meet it running, not still starting.
type warm struct {
	lifecycle.Service
	ready func(ctx context.Context) error
}

func (w warm) Start(ctx context.Context) error {
	if err := w.Service.Start(ctx); err != nil {
		return err
	}
	for end := time.Now().Add(warmWithin); w.ready(ctx) != nil && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// stressPublisher is setup's publisher, with outcomes of accepted pull
// request work waiting in its stream, so the first publishers stopped
// hold publications; newPart builds one more of it, on the same durable,
// counting often.
func stressPublisher(t *testing.T, outcomes int) (b *bundle, newPart func(t *testing.T) *Publisher) {
	t.Helper()
	b = setup(t, func(c *Config) { c.CountEvery = 5 * time.Millisecond })
	for n := range outcomes {
		b.deliver(t, outcomeOf(b.accepted(t, n+1)), 1)
	}
	return b, func(t *testing.T) *Publisher {
		p, err := New(b.pub.cfg, b.st, b.js, slog.New(slog.NewTextHandler(io.Discard, nil)), noop.NewMeterProvider().Meter("test"))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
}

// TestPublisherLifecycle holds the publisher (its OUTCOME consumer, its
// retrier and its counter) to the contract of every part.
func TestPublisherLifecycle(t *testing.T) {
	_, newPart := stressPublisher(t, 10)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service { return newPart(t) })
}

// TestWarmPublisherLifecycle is the same with each Stop meeting a
// publisher whose durable is consumed: the first ones stopped hold
// publications to the fake GitHub.
func TestWarmPublisherLifecycle(t *testing.T) {
	b, newPart := stressPublisher(t, 10)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service {
		p := newPart(t)
		return warm{p, p.Ready}
	})
	t.Logf("%d calls to the fake GitHub", apiCalls(b.gh))
}
