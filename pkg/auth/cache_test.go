package auth

import (
	"context"
	"errors"
	"testing"
	"time"

	"assay.dev/pkg/store"
)

// counting answers from a map and counts the lookups that reach it.
type counting struct {
	ts      tenants
	lookups int
}

func (c *counting) TenantByToken(ctx context.Context, tok string) (store.Tenant, error) {
	c.lookups++
	return c.ts.TenantByToken(ctx, tok)
}

func (c *counting) OperatorByToken(context.Context, string) (store.Operator, error) {
	return store.Operator{}, store.ErrNotFound
}

func TestCacheHoldsAnAnswerForItsTTLOnly(t *testing.T) {
	t.Parallel()
	src := &counting{ts: tenants{"tok-acme": {ID: "acme", HomeRegion: "us", Status: store.TenantActive}}}
	c := NewCache(src, 2*time.Second)
	now := time.Unix(1_000_000, 0)
	c.now = func() time.Time { return now }
	ctx := context.Background()
	for range 5 {
		if got, err := c.TenantByToken(ctx, "tok-acme"); err != nil || got.ID != "acme" {
			t.Fatalf("lookup: %+v %v", got, err)
		}
	}
	if src.lookups != 1 {
		t.Fatalf("%d lookups reached the database for five requests inside the TTL, want 1", src.lookups)
	}
	// Revoked: still served inside the TTL, refused once it has passed.
	delete(src.ts, "tok-acme")
	now = now.Add(1900 * time.Millisecond)
	if _, err := c.TenantByToken(ctx, "tok-acme"); err != nil {
		t.Fatalf("inside the TTL: %v", err)
	}
	now = now.Add(200 * time.Millisecond)
	if _, err := c.TenantByToken(ctx, "tok-acme"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("past the TTL a revoked token answered %v, want not found", err)
	}
	// Unknown tokens are never kept: each asks again.
	before := src.lookups
	for range 3 {
		_, _ = c.TenantByToken(ctx, "guess")
	}
	if src.lookups-before != 3 || len(c.m) != 0 {
		t.Fatalf("unknown tokens: %d lookups, %d kept; want 3 and 0", src.lookups-before, len(c.m))
	}
	// A suspension is seen once the TTL has passed, through Bearer.
	src.ts["tok-acme"] = store.Tenant{ID: "acme", HomeRegion: "us", Status: store.TenantActive}
	if _, r := Bearer(ctx, c, "Bearer tok-acme", Cell{Region: "us"}); r != nil {
		t.Fatal(r)
	}
	src.ts["tok-acme"] = store.Tenant{ID: "acme", HomeRegion: "us", Status: store.TenantSuspended}
	now = now.Add(2 * time.Second)
	if _, r := Bearer(ctx, c, "Bearer tok-acme", Cell{Region: "us"}); r == nil || r.Code != "tenant_suspended" {
		t.Fatalf("suspended past the TTL: %+v", r)
	}
}

func TestCacheOffPassesEveryLookup(t *testing.T) {
	t.Parallel()
	src := &counting{ts: tenants{"tok-acme": {ID: "acme", HomeRegion: "us", Status: store.TenantActive}}}
	c := NewCache(src, -1)
	for range 3 {
		_, _ = c.TenantByToken(context.Background(), "tok-acme")
	}
	if src.lookups != 3 {
		t.Fatalf("%d lookups with the cache off, want 3", src.lookups)
	}
}

func TestCacheBounded(t *testing.T) {
	t.Parallel()
	ts := tenants{}
	for i := range 50 {
		ts[string(rune('a'+i%26))+string(rune('a'+i/26))] = store.Tenant{ID: "t", Status: store.TenantActive}
	}
	c := NewCache(&counting{ts: ts}, time.Minute)
	c.max = 10
	for tok := range ts {
		_, _ = c.TenantByToken(context.Background(), tok)
		if len(c.m) > 10 {
			t.Fatalf("cache holds %d tokens, bound 10", len(c.m))
		}
	}
}

// Told of changes, the cache keeps an answer for LongTTL and forgets a
// tenant's the moment it is told the tenant changed; when it stops being
// told it drops everything and keeps answers for TTL again.
func TestCacheListeningHoldsLongAndForgets(t *testing.T) {
	t.Parallel()
	src := &counting{ts: tenants{"tok-acme": {ID: "acme", HomeRegion: "us", Status: store.TenantActive},
		"tok-globex": {ID: "globex", HomeRegion: "eu", Status: store.TenantActive}}}
	c := NewCache(src, 2*time.Second)
	c.LongTTL = 5 * time.Minute
	now := time.Unix(1_000_000, 0)
	c.now = func() time.Time { return now }
	ctx := context.Background()
	c.Listening(true)
	for _, tok := range []string{"tok-acme", "tok-globex"} {
		if _, err := c.TenantByToken(ctx, tok); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(4 * time.Minute)
	for _, tok := range []string{"tok-acme", "tok-globex"} {
		_, _ = c.TenantByToken(ctx, tok)
	}
	if src.lookups != 2 {
		t.Fatalf("%d lookups in four minutes while listening, want 2", src.lookups)
	}
	// acme's token is revoked, and the cache is told.
	delete(src.ts, "tok-acme")
	c.Forget("acme")
	if _, err := c.TenantByToken(ctx, "tok-acme"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a forgotten tenant's revoked token answered %v", err)
	}
	if _, err := c.TenantByToken(ctx, "tok-globex"); err != nil || src.lookups != 3 {
		t.Fatalf("another tenant's entry was forgotten too (%d lookups, %v)", src.lookups, err)
	}
	// Not told any more: everything is dropped, and held for TTL.
	c.Listening(false)
	_, _ = c.TenantByToken(ctx, "tok-globex")
	now = now.Add(3 * time.Second)
	_, _ = c.TenantByToken(ctx, "tok-globex")
	if src.lookups != 5 {
		t.Fatalf("%d lookups, want 5: a lookup after the listening ended and one past the short TTL", src.lookups)
	}
}

// slow answers after gate is closed, so a Forget can fall while a lookup
// is in flight.
type slow struct {
	counting
	started, gate chan struct{}
}

func (s *slow) TenantByToken(ctx context.Context, tok string) (store.Tenant, error) {
	s.started <- struct{}{}
	<-s.gate
	return s.counting.TenantByToken(ctx, tok)
}

// A lookup that began before a Forget does not keep what it read: it may
// be what was forgotten.
func TestCacheForgetDuringALookup(t *testing.T) {
	t.Parallel()
	src := &slow{counting: counting{ts: tenants{"tok-acme": {ID: "acme", HomeRegion: "us", Status: store.TenantActive}}},
		started: make(chan struct{}, 1), gate: make(chan struct{})}
	c := NewCache(src, time.Minute)
	c.Listening(true)
	done := make(chan struct{})
	go func() { defer close(done); _, _ = c.TenantByToken(context.Background(), "tok-acme") }()
	<-src.started
	c.Forget("acme")
	close(src.gate)
	<-done
	if len(c.m) != 0 {
		t.Fatalf("the lookup kept what it read across a Forget: %v", c.m)
	}
}
