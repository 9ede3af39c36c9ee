package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"
)

// Tenant statuses.
const (
	TenantActive    = "active"
	TenantSuspended = "suspended"
)

// Tenant is who owns work, budget and cost.
type Tenant struct {
	ID         string `json:"id"`
	HomeRegion string `json:"homeRegion"`
	Status     string `json:"status"`
	// RatePerMinute and Burst shape the tenant's ingress token bucket, one
	// per lane.
	RatePerMinute int `json:"ratePerMinute"`
	Burst         int `json:"burst"`
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

// ErrExists is returned for something that is already there.
var ErrExists = errors.New("already exists")

// tokenRE is what a tenant token may look like: URL-safe ASCII, long
// enough to be a secret. NewToken's are 36 characters.
var tokenRE = regexp.MustCompile(`^[A-Za-z0-9_.~-]{24,256}$`)

// ValidToken reports whether tok can be a tenant's API token.
func ValidToken(tok string) bool { return tokenRE.MatchString(tok) }

// NewWebhookSecret returns a fresh secret for a tenant's repository
// hooks: 32 random bytes, URL-safe.
func NewWebhookSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return "whs_" + base64.RawURLEncoding.EncodeToString(b)
}

// SeedTenants creates the tenants and their tokens, leaving existing ones
// as they are.
func (s *Store) SeedTenants(ctx context.Context, seeds []TenantSeed) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
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
	err := s.pool.QueryRow(ctx, `SELECT t.id, t.home_region, t.status, t.rate_per_minute, t.burst
		FROM tenant_tokens k JOIN tenants t ON t.id = k.tenant_id
		WHERE k.token_hash = $1 AND k.revoked_at IS NULL`, HashToken(token)).Scan(&t.ID, &t.HomeRegion, &t.Status,
		&t.RatePerMinute, &t.Burst)
	if errors.Is(err, pgx.ErrNoRows) {
		return Tenant{}, ErrNotFound
	}
	return t, err
}

// SetBudget sets a tenant's budget per period (nil: unlimited), counting
// what the tenant spent in the current period so far (SetBudgetCounted).
func (s *Store) SetBudget(ctx context.Context, tenantID string, micros *int64, period string) error {
	_, err := s.SetBudgetCounted(ctx, tenantID, micros, period)
	return err
}

// TenantRegion is the tenant's home region as this cell knows it;
// ErrNotFound when it does not know the tenant.
func (s *Store) TenantRegion(ctx context.Context, tenantID string) (string, error) {
	var region string
	err := s.pool.QueryRow(ctx, `SELECT home_region FROM tenants WHERE id = $1`, tenantID).Scan(&region)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("store: region of %s: %w", tenantID, err)
	}
	return region, nil
}

// TenantInfo is a tenant as the operator sees it.
type TenantInfo struct {
	Tenant
	BudgetMicros *int64 `json:"budgetMicros"`
	BudgetPeriod string `json:"budgetPeriod"`
	ActiveTokens int    `json:"activeTokens"`
}

// AddTenant creates a tenant with its first token. It fails if the tenant
// exists.
func (s *Store) AddTenant(ctx context.Context, id, homeRegion, token string) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO tenants (id, home_region) VALUES ($1, $2)`, id, homeRegion); err != nil {
			if SQLState(err) == "23505" {
				return fmt.Errorf("%w: tenant %q", ErrExists, id)
			}
			return fmt.Errorf("store: add tenant %q: %w", id, err)
		}
		_, err := tx.Exec(ctx, `INSERT INTO tenant_tokens (token_hash, tenant_id, label) VALUES ($1, $2, 'initial')`,
			HashToken(token), id)
		return err
	})
}

// ListTenants lists every tenant this cell knows.
func (s *Store) ListTenants(ctx context.Context) ([]TenantInfo, error) {
	rows, err := s.pool.Query(ctx, `SELECT t.id, t.home_region, t.status, t.rate_per_minute, t.burst,
			t.budget_micros, t.budget_period,
			(SELECT count(*) FROM tenant_tokens k WHERE k.tenant_id = t.id AND k.revoked_at IS NULL)
		FROM tenants t ORDER BY t.id`)
	if err != nil {
		return nil, fmt.Errorf("store: list tenants: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (TenantInfo, error) {
		var t TenantInfo
		err := r.Scan(&t.ID, &t.HomeRegion, &t.Status, &t.RatePerMinute, &t.Burst, &t.BudgetMicros, &t.BudgetPeriod, &t.ActiveTokens)
		return t, err
	})
}

// FirstTenants are the ids of the first n tenants this cell was given, in
// the order they were added (ties, such as tenants seeded together, by
// id): the same list for every service instance of the cell, and one that
// a new tenant never reorders.
func (s *Store) FirstTenants(ctx context.Context, n int) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT id FROM tenants ORDER BY created_at, id LIMIT $1`, n)
	if err != nil {
		return nil, fmt.Errorf("store: first tenants: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("store: first tenants: %w", err)
	}
	return ids, nil
}

// RotateToken revokes every active token of the tenant and adds token, in
// one transaction.
func (s *Store) RotateToken(ctx context.Context, tenantID, token string) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM tenants WHERE id = $1)`, tenantID).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			return ErrNotFound
		}
		if _, err := tx.Exec(ctx, `UPDATE tenant_tokens SET revoked_at = now() WHERE tenant_id = $1 AND revoked_at IS NULL`,
			tenantID); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO tenant_tokens (token_hash, tenant_id, label) VALUES ($1, $2, 'rotated')`,
			HashToken(token), tenantID)
		return err
	})
}

// SetRate sets the tenant's ingress rate per minute and burst, per lane.
func (s *Store) SetRate(ctx context.Context, tenantID string, perMinute, burst int) error {
	if perMinute < 1 || burst < 1 {
		return fmt.Errorf("store: set rate: rate per minute and burst must be at least 1")
	}
	tag, err := s.pool.Exec(ctx, `UPDATE tenants SET rate_per_minute = $2, burst = $3 WHERE id = $1`, tenantID, perMinute, burst)
	if err != nil {
		return fmt.Errorf("store: set rate: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// SetStatus suspends ("suspended") or resumes ("active") a tenant.
func (s *Store) SetStatus(ctx context.Context, tenantID, status string) error {
	tag, err := s.pool.Exec(ctx, `UPDATE tenants SET status = $2 WHERE id = $1`, tenantID, status)
	if err != nil {
		return fmt.Errorf("store: set status: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// TenantChanges is the channel a change to a tenant or its tokens is told
// on (migration 0021), with the tenant's id.
const TenantChanges = "assay_tenant_changed"

// WatchTenants listens for changes to tenants and their tokens on a
// connection of its own and calls changed with each tenant's id, until ctx
// ends or the connection fails (the error). listening is called with true
// once it listens, and with false when it stops: a change made meanwhile
// was not told.
func (s *Store) WatchTenants(ctx context.Context, listening func(bool), changed func(tenant string)) error {
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("store: watch tenants: %w", err)
	}
	// Taken out of the pool: a listening connection goes back to nobody.
	conn := pc.Hijack()
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+TenantChanges); err != nil {
		return fmt.Errorf("store: watch tenants: %w", err)
	}
	listening(true)
	defer listening(false)
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("store: watch tenants: %w", err)
		}
		changed(n.Payload)
	}
}
