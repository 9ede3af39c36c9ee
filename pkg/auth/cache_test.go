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
