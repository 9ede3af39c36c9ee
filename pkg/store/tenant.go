package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Tenant is who owns work, budget and cost.
type Tenant struct {
	ID         string `json:"id"`
	HomeRegion string `json:"homeRegion"`
	Status     string `json:"status"`
}

// TenantSeed is one entry of a tenants file. Token is the plain token; only
// its hash is stored.
type TenantSeed struct {
	ID         string `json:"id"`
	HomeRegion string `json:"homeRegion"`
	Token      string `json:"token"`
}

// HashToken is how a bearer token is stored and looked up.
func HashToken(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

// NewToken returns a random API token.
func NewToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return "asy_" + base64.RawURLEncoding.EncodeToString(b)
}

// SeedTenants creates the tenants and their tokens, leaving existing ones
// as they are.
func (s *Store) SeedTenants(ctx context.Context, seeds []TenantSeed) error {
	return pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		for _, t := range seeds {
			if t.Token == "" {
				return fmt.Errorf("store: tenant %q: empty token", t.ID)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO tenants (id, home_region) VALUES ($1, $2)
				ON CONFLICT (id) DO NOTHING`, t.ID, t.HomeRegion); err != nil {
				return fmt.Errorf("store: tenant %q: %w", t.ID, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO tenant_tokens (token_hash, tenant_id) VALUES ($1, $2)
				ON CONFLICT (token_hash) DO NOTHING`, HashToken(t.Token), t.ID); err != nil {
				return fmt.Errorf("store: tenant %q token: %w", t.ID, err)
			}
		}
		return nil
	})
}

// TenantByToken resolves a bearer token to its tenant; ErrNotFound for an
// unknown or revoked token.
func (s *Store) TenantByToken(ctx context.Context, token string) (Tenant, error) {
	var t Tenant
	err := s.Pool.QueryRow(ctx, `SELECT t.id, t.home_region, t.status
		FROM tenant_tokens k JOIN tenants t ON t.id = k.tenant_id
		WHERE k.token_hash = $1 AND k.revoked_at IS NULL`, HashToken(token)).Scan(&t.ID, &t.HomeRegion, &t.Status)
	if errors.Is(err, pgx.ErrNoRows) {
		return Tenant{}, ErrNotFound
	}
	return t, err
}
