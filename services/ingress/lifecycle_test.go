package ingress

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"assay.dev/pkg/admission"
	"assay.dev/pkg/auth"
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

// TestCapacityViewLifecycle holds the capacity view, which watches the
// cell's capacity bucket, to the contract of every part.
func TestCapacityViewLifecycle(t *testing.T) {
	e := lifecycleEnv(t)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service {
		return &capacityView{js: e.js, bucket: e.svc.Cfg.Names.CapacityBucket(), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	})
}

// TestWarmCapacityViewLifecycle is the same with each Stop meeting a view
// that has read the report and watches for more.
func TestWarmCapacityViewLifecycle(t *testing.T) {
	e := lifecycleEnv(t)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service {
		v := &capacityView{js: e.js, bucket: e.svc.Cfg.Names.CapacityBucket(), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		return lifecycletest.Warm(v, func(context.Context) error {
			if v.rate(time.Now()) == 0 {
				return errNotYet
			}
			return nil
		})
	})
}

// TestCapacityViewWithoutBucketLifecycle is the capacity view of a cell
// whose classifiers have not made the bucket yet: it waits for it until
// stopped.
func TestCapacityViewWithoutBucketLifecycle(t *testing.T) {
	e := lifecycleEnv(t)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service {
		return &capacityView{js: e.js, bucket: "assay_capacity_nowhere", log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	})
}

// TestTenantWatchLifecycle holds the tenant watch, which listens to the
// cell's database for changes to tenants and tokens, to the contract of
// every part.
func TestTenantWatchLifecycle(t *testing.T) {
	e := lifecycleEnv(t)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service {
		return &tenantWatch{w: e.st, cache: auth.NewCache(e.st, 2*time.Second), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	})
}

// listenSpy is the store's tenant watch, noting whether it listens.
type listenSpy struct {
	tenantWatcher
	on atomic.Bool
}

func (l *listenSpy) WatchTenants(ctx context.Context, listening func(bool), changed func(string)) error {
	return l.tenantWatcher.WatchTenants(ctx, func(on bool) { l.on.Store(on); listening(on) }, changed)
}

// TestWarmTenantWatchLifecycle is the same with each Stop meeting a watch
// that listens.
func TestWarmTenantWatchLifecycle(t *testing.T) {
	e := lifecycleEnv(t)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service {
		spy := &listenSpy{tenantWatcher: e.st}
		w := &tenantWatch{w: spy, cache: auth.NewCache(e.st, 2*time.Second), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		return lifecycletest.Warm(w, func(context.Context) error {
			if !spy.on.Load() {
				return errNotYet
			}
			return nil
		})
	})
}
