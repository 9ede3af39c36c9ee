package auth

import (
	"context"
	"sync"
	"time"

	"assay.dev/pkg/store"
)

// Cache remembers the tenant each token named for a short while, so a busy
// client costs the database one lookup per TTL rather than one per
// request. Only tokens that resolved are kept: an unknown token is looked
// up every time, so nobody fills the cache by guessing. A revoked token,
// a suspended tenant or a moved home region takes effect within TTL.
type Cache struct {
	next Credentials
	ttl  time.Duration
	max  int
	now  func() time.Time

	mu sync.Mutex
	m  map[string]cached
}

type cached struct {
	t       store.Tenant
	expires time.Time
}

// cacheMax bounds the tokens a cache holds; past it the expired go first,
// and if none had expired, all.
const cacheMax = 10_000

// NewCache caches next's tenant lookups for ttl; ttl 0 or less passes
// every lookup through.
func NewCache(next Credentials, ttl time.Duration) *Cache {
	return &Cache{next: next, ttl: ttl, max: cacheMax, now: time.Now, m: map[string]cached{}}
}

// TenantByToken is next's answer, at most TTL old.
func (c *Cache) TenantByToken(ctx context.Context, token string) (store.Tenant, error) {
	if c.ttl <= 0 {
		return c.next.TenantByToken(ctx, token)
	}
	key := string(store.HashToken(token))
	now := c.now()
	c.mu.Lock()
	e, ok := c.m[key]
	c.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.t, nil
	}
	t, err := c.next.TenantByToken(ctx, token)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		delete(c.m, key)
		return t, err
	}
	if len(c.m) >= c.max {
		for k, v := range c.m {
			if !now.Before(v.expires) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= c.max {
			clear(c.m)
		}
	}
	c.m[key] = cached{t: t, expires: now.Add(c.ttl)}
	return t, nil
}

// OperatorByToken is never cached: the console is not a hot path.
func (c *Cache) OperatorByToken(ctx context.Context, token string) (store.Operator, error) {
	return c.next.OperatorByToken(ctx, token)
}
