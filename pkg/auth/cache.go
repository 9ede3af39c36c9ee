package auth

import (
	"context"
	"sync"
	"time"

	"assay.dev/pkg/store"
)

// Cache remembers the tenant each token named, so a busy client costs the
// database one lookup per while rather than one per request. Only tokens
// that resolved are kept: an unknown token is looked up every time, so
// nobody fills the cache by guessing.
//
// How long an entry holds depends on whether the cache hears of changes.
// While Listening (the cell's database tells it of every change to a
// tenant or its tokens, and Forget is called for each), an entry holds for
// LongTTL; otherwise for TTL, so a revoked token, a suspended tenant or a
// moved home region takes effect within TTL whatever happens.
type Cache struct {
	next Credentials
	ttl  time.Duration
	// LongTTL is how long an entry holds while the cache is told of
	// changes. Default 5 minutes.
	LongTTL time.Duration
	max     int
	now     func() time.Time

	mu        sync.Mutex
	m         map[string]cached
	listening bool
	// gen counts what was forgotten: a lookup that began before a Forget
	// does not keep what it read, which may be what was forgotten.
	gen uint64
}

type cached struct {
	t  store.Tenant
	at time.Time
}

// cacheMax bounds the tokens a cache holds; past it the expired go first,
// and if none had expired, all.
const cacheMax = 10_000

// NewCache caches next's tenant lookups for ttl; ttl 0 or less passes
// every lookup through.
func NewCache(next Credentials, ttl time.Duration) *Cache {
	return &Cache{next: next, ttl: ttl, LongTTL: 5 * time.Minute, max: cacheMax, now: time.Now, m: map[string]cached{}}
}

// hold is how long an entry holds now.
func (c *Cache) hold() time.Duration {
	if c.listening && c.LongTTL > c.ttl {
		return c.LongTTL
	}
	return c.ttl
}

// TenantByToken is next's answer, no older than the cache lets it be.
func (c *Cache) TenantByToken(ctx context.Context, token string) (store.Tenant, error) {
	if c.ttl <= 0 {
		return c.next.TenantByToken(ctx, token)
	}
	key := string(store.HashToken(token))
	now := c.now()
	c.mu.Lock()
	e, ok := c.m[key]
	hold, gen := c.hold(), c.gen
	c.mu.Unlock()
	if ok && now.Before(e.at.Add(hold)) {
		return e.t, nil
	}
	t, err := c.next.TenantByToken(ctx, token)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		delete(c.m, key)
		return t, err
	}
	if c.gen != gen {
		// Something was forgotten while this was read.
		return t, nil
	}
	if len(c.m) >= c.max {
		for k, v := range c.m {
			if !now.Before(v.at.Add(hold)) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= c.max {
			clear(c.m)
		}
	}
	c.m[key] = cached{t: t, at: now}
	return t, nil
}

// Forget drops every entry of tenant: one of its tokens or the tenant
// itself changed.
func (c *Cache) Forget(tenant string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	for k, v := range c.m {
		if v.t.ID == tenant {
			delete(c.m, k)
		}
	}
}

// Listening says whether the cache is told of every change from now on.
// Either way what it holds is dropped: a change may have gone unheard
// while it was not told (or is about to be, now that it is not).
func (c *Cache) Listening(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.listening = on
	clear(c.m)
}

// OperatorByToken is never cached: the console is not a hot path.
func (c *Cache) OperatorByToken(ctx context.Context, token string) (store.Operator, error) {
	return c.next.OperatorByToken(ctx, token)
}
