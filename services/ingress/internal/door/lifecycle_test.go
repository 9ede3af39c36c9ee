package door

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"assay.dev/pkg/auth"
	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/lifecycle/lifecycletest"
)

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
	TenantWatcher
	on atomic.Bool
}

func (l *listenSpy) WatchTenants(ctx context.Context, listening func(bool), changed func(string)) error {
	return l.TenantWatcher.WatchTenants(ctx, func(on bool) { l.on.Store(on); listening(on) }, changed)
}

// TestWarmTenantWatchLifecycle is the same with each Stop meeting a watch
// that listens.
func TestWarmTenantWatchLifecycle(t *testing.T) {
	e := lifecycleEnv(t)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service {
		spy := &listenSpy{TenantWatcher: e.st}
		w := &tenantWatch{w: spy, cache: auth.NewCache(e.st, 2*time.Second), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		return lifecycletest.Warm(w, func(context.Context) error {
			if !spy.on.Load() {
				return errNotYet
			}
			return nil
		})
	})
}
