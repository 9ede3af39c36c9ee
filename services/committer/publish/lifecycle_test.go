package publish

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/lifecycle/lifecycletest"
)

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
		return lifecycletest.Warm(p, p.Ready)
	})
	t.Logf("%d calls to the fake GitHub", apiCalls(b.gh))
}
