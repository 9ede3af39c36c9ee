package cell_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/store"
	"assay.dev/services/ingress"
)

// Ingress keeps a token's tenant as long as it is told of changes, and a
// change is told at its commit: with a minute's fallback cache and an
// hour's while listening, a rotated token is refused and a suspended
// tenant turned away within moments, not a minute.
func TestTokenCacheHearsEveryChange(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{Ingress: ingress.Config{TokenCache: time.Minute, TokenCacheListening: time.Hour}})
	ctx := context.Background()
	req := celltest.CodeReview(evalset.Items()[0], "tokens heard")
	// until polls the request until it gets want, and says how long that
	// took.
	until := func(token string, want int) time.Duration {
		t.Helper()
		start := time.Now()
		for {
			status, raw := b.Post(t, token, req)
			if status == want {
				return time.Since(start)
			}
			// Well within the minute's fallback cache.
			if time.Since(start) > 30*time.Second {
				t.Fatalf("still HTTP %d %s after 30s, want %d", status, raw, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if status, raw := b.Post(t, b.Token, req); status != http.StatusAccepted {
		t.Fatalf("first post: %d %s", status, raw)
	}
	fresh := store.NewToken()
	if err := b.Cell.Env.Store.RotateToken(ctx, b.Tenant, fresh); err != nil {
		t.Fatal(err)
	}
	revoked := until(b.Token, http.StatusUnauthorized)
	if status, _ := b.Post(t, fresh, req); status != http.StatusOK {
		t.Fatalf("the new token on the same key: %d, want 200", status)
	}
	if err := b.Cell.Env.Store.SetStatus(ctx, b.Tenant, store.TenantSuspended); err != nil {
		t.Fatal(err)
	}
	suspended := until(fresh, http.StatusForbidden)
	t.Logf("a rotated token refused %s after the rotation, a suspension %s after it (cache: a minute, an hour while listening)",
		revoked.Round(time.Millisecond), suspended.Round(time.Millisecond))
}
