package door

import (
	"context"
	"log/slog"
	"time"

	"assay.dev/pkg/auth"
	"assay.dev/pkg/lifecycle"
)

// TenantWatcher is what tells the token cache of changes: the cell's
// database, which tells of every change to a tenant or its tokens at its
// commit; *store.Store is one.
type TenantWatcher interface {
	WatchTenants(ctx context.Context, listening func(bool), changed func(tenant string)) error
}

// tenantWatch keeps the token cache told of every change to a tenant or
// its tokens, so it may keep a token's tenant for minutes (auth.Cache's
// LongTTL) and still take a revocation or a suspension at once. While it
// cannot listen (the database down, a connection lost), the cache holds
// entries for ASSAY_TOKEN_CACHE only. A lifecycle part.
type tenantWatch struct {
	w     TenantWatcher
	cache *auth.Cache
	log   *slog.Logger
	run   lifecycle.Runner
}

func (t *tenantWatch) Start(ctx context.Context) error { return t.run.Go(ctx, t.loop) }

func (t *tenantWatch) Stop(ctx context.Context) { t.run.Stop(ctx) }

func (t *tenantWatch) loop(ctx context.Context) {
	delay := 250 * time.Millisecond
	for ctx.Err() == nil {
		started := time.Now()
		err := t.w.WatchTenants(ctx, t.cache.Listening, t.cache.Forget)
		if ctx.Err() != nil {
			return
		}
		if time.Since(started) > time.Minute {
			delay = 250 * time.Millisecond
		}
		t.log.Warn("tenant changes not heard; tokens are looked up again every ASSAY_TOKEN_CACHE until they are",
			"err", err, "retry_in", delay.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, 10*time.Second)
	}
}
