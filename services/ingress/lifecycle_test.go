package ingress

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"assay.dev/pkg/admission"
	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/lifecycle/lifecycletest"
)

// lifecycleEnv is one cell for every part a Stress call makes: the
// webhook tests' database, NATS and contracts, with a classifier's
// capacity report in the cell's bucket. The env's own ingress is stopped
// once the report is read, so only the parts under stress run.
func lifecycleEnv(t *testing.T) *webhookEnv {
	t.Helper()
	e := newWebhookEnv(t, nil)
	e.report(admission.CapacityReport{Instance: "test", At: time.Now(), Every: time.Hour, Rate: 10, Limit: 4, Latency: 100 * time.Millisecond})
	e.svc.Stop(context.Background())
	return e
}

var errNotYet = errors.New("not running yet")

// TestServiceLifecycle holds a whole ingress instance (its WORK stream,
// relay, tickers, placement view, capacity view and tenant watch) to the
// contract of every part.
func TestServiceLifecycle(t *testing.T) {
	e := lifecycleEnv(t)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service { return e.stressService(t) })
}

// TestWarmServiceLifecycle is the same with each Stop meeting an instance
// that is ready and has read the cell's capacity.
func TestWarmServiceLifecycle(t *testing.T) {
	e := lifecycleEnv(t)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service {
		s := e.stressService(t)
		return lifecycletest.Warm(s, func(ctx context.Context) error {
			if !s.CapacityKnown() {
				return errNotYet
			}
			return s.Ready(ctx)
		})
	})
}

// stressService builds an ingress instance of the env's cell, not
// started, whose tickers pass often.
func (e *webhookEnv) stressService(t *testing.T) *Service {
	t.Helper()
	cfg := e.svc.Cfg
	cfg.SweepEvery, cfg.WatchEvery, cfg.RoutesEvery = 5*time.Millisecond, 5*time.Millisecond, 5*time.Millisecond
	d := e.svc.D
	d.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := New(cfg, d)
	if err != nil {
		t.Fatal(err)
	}
	if s.Tenants == nil {
		t.Fatal("the instance has no tenant watch to stress")
	}
	return s
}
