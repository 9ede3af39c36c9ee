package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"assay.dev/pkg/outcome"
	"github.com/jackc/pgx/v5"
)

// Kinds of tenant_sources rows: where webhook-originated work comes from.
const (
	SourceGitHubInstallation = "github_installation" // key: the installation id, decimal
	SourceGitHubRepository   = "github_repository"   // key: owner/repo
)

// Decisions recorded on a webhook delivery that produced work.
const (
	DeliveryQueued    = outcome.Queued // the delivery created the work
	DeliveryDuplicate = "duplicate"    // the work already existed under another delivery
)

// Delivery is one recorded webhook delivery.
type Delivery struct {
	ID         string
	TenantID   string
	Event      string
	Action     string
	Decision   string
	WorkID     string
	ReceivedAt time.Time
	// Installation is the GitHub App installation that sent it (0: none),
	// BaseSHA the pull request's base when it was sent: where the work's
	// outcome is published and what its diff was taken against.
	Installation int64
	BaseSHA      string
}

// Link maps a webhook source to a tenant. An installation link names the
// repositories the installation covers ("owner/*" or "owner/repo", at least
// one); a repository link names none.
type Link struct {
	Kind, Key, Tenant string
	Repositories      []string
}

// LinkSource maps a webhook source to a tenant, replacing any earlier
// mapping of the same source.
func (s *Store) LinkSource(ctx context.Context, l Link) error {
	switch {
	case l.Kind == SourceGitHubInstallation && len(l.Repositories) == 0:
		return fmt.Errorf("store: link installation %q: name the repositories it covers", l.Key)
	case l.Kind != SourceGitHubInstallation && len(l.Repositories) != 0:
		return fmt.Errorf("store: link %s %q: only an installation covers repositories", l.Kind, l.Key)
	}
	repos := l.Repositories
	if repos == nil {
		repos = []string{}
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO tenant_sources (kind, key, tenant_id, repositories) VALUES ($1, $2, $3, $4)
		ON CONFLICT (kind, key) DO UPDATE SET tenant_id = excluded.tenant_id, repositories = excluded.repositories`,
		l.Kind, l.Key, l.Tenant, repos)
	if err != nil {
		return fmt.Errorf("store: link %s %q: %w", l.Kind, l.Key, err)
	}
	return nil
}

// SourceLink is one linked source and the tenant it belongs to.
type SourceLink struct {
	Tenant       Tenant
	Repositories []string // an installation's
}

// WebhookLinks are the links a delivery's installation and repository have;
// nil where there is none.
type WebhookLinks struct {
	Installation *SourceLink
	Repository   *SourceLink
}

// WebhookLinks reads the links of an installation (skipped when "") and a
// repository.
func (s *Store) WebhookLinks(ctx context.Context, installation, repository string) (WebhookLinks, error) {
	rows, err := s.pool.Query(ctx, `SELECT src.kind, src.repositories, t.id, t.home_region, t.status, t.rate_per_minute, t.burst
		FROM tenant_sources src JOIN tenants t ON t.id = src.tenant_id
		WHERE (src.kind = $1 AND src.key = $2) OR (src.kind = $3 AND src.key = $4)`,
		SourceGitHubInstallation, installation, SourceGitHubRepository, repository)
	if err != nil {
		return WebhookLinks{}, fmt.Errorf("store: links of %q, %q: %w", installation, repository, err)
	}
	var l WebhookLinks
	for rows.Next() {
		var kind string
		var src SourceLink
		t := &src.Tenant
		if err := rows.Scan(&kind, &src.Repositories, &t.ID, &t.HomeRegion, &t.Status, &t.RatePerMinute, &t.Burst); err != nil {
			rows.Close()
			return WebhookLinks{}, fmt.Errorf("store: links of %q, %q: %w", installation, repository, err)
		}
		if kind == SourceGitHubInstallation {
			l.Installation = &src
		} else {
			l.Repository = &src
		}
	}
	if err := rows.Err(); err != nil {
		return WebhookLinks{}, fmt.Errorf("store: links of %q, %q: %w", installation, repository, err)
	}
	return l, nil
}

// SetWebhookSecret gives a tenant a new webhook secret for its repository
// hooks, replacing the one it had.
func (s *Store) SetWebhookSecret(ctx context.Context, tenant, secret string) error {
	tag, err := s.pool.Exec(ctx, `INSERT INTO tenant_webhook_secrets (tenant_id, secret)
		SELECT id, $2 FROM tenants WHERE id = $1
		ON CONFLICT (tenant_id) DO UPDATE SET secret = excluded.secret, created_at = now()`, tenant, secret)
	if err != nil {
		return fmt.Errorf("store: webhook secret of %q: %w", tenant, err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// RepositorySecret is the webhook secret of the tenant a repository is
// linked to; ErrNotFound when the repository is not linked or its tenant
// has no secret.
func (s *Store) RepositorySecret(ctx context.Context, repository string) (tenant, secret string, err error) {
	err = s.pool.QueryRow(ctx, `SELECT src.tenant_id, sec.secret FROM tenant_sources src
		JOIN tenant_webhook_secrets sec ON sec.tenant_id = src.tenant_id
		WHERE src.kind = $1 AND src.key = $2`, SourceGitHubRepository, repository).Scan(&tenant, &secret)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", ErrNotFound
	}
	if err != nil {
		return "", "", fmt.Errorf("store: secret of repository %q: %w", repository, err)
	}
	return tenant, secret, nil
}

// TenantBySource resolves a webhook source to its tenant; ErrNotFound when
// the source is not linked.
func (s *Store) TenantBySource(ctx context.Context, kind, key string) (Tenant, error) {
	var t Tenant
	err := s.pool.QueryRow(ctx, `SELECT t.id, t.home_region, t.status, t.rate_per_minute, t.burst
		FROM tenant_sources src JOIN tenants t ON t.id = src.tenant_id
		WHERE src.kind = $1 AND src.key = $2`, kind, key).Scan(&t.ID, &t.HomeRegion, &t.Status, &t.RatePerMinute, &t.Burst)
	if errors.Is(err, pgx.ErrNoRows) {
		return Tenant{}, ErrNotFound
	}
	if err != nil {
		return Tenant{}, fmt.Errorf("store: source %s %q: %w", kind, key, err)
	}
	return t, nil
}

const deliveryColumns = `delivery_id, coalesce(tenant_id, ''), event, action, decision, coalesce(work_id, ''), received_at`

func scanDelivery(row pgx.Row) (*Delivery, error) {
	var d Delivery
	err := row.Scan(&d.ID, &d.TenantID, &d.Event, &d.Action, &d.Decision, &d.WorkID, &d.ReceivedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	return &d, err
}

// GetDelivery reads a recorded delivery; ErrNotFound when it was never
// recorded.
func (s *Store) GetDelivery(ctx context.Context, id string) (*Delivery, error) {
	d, err := scanDelivery(s.pool.QueryRow(ctx, `SELECT `+deliveryColumns+` FROM webhook_deliveries
		WHERE delivery_id = $1`, id))
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("store: delivery %q: %w", id, err)
	}
	return d, err
}

// WebhookInsert is what InsertWebhookWork did.
type WebhookInsert struct {
	Delivery *Delivery
	// Work is the delivery's work; nil only for a delivery recorded
	// without one.
	Work *Work
	// First is false when the delivery id had been recorded before.
	First bool
	// Created is true when this call inserted the work row.
	Created bool
}

// InsertWebhookWork records a delivery and applies the ingress fence for the
// work it asks for, in one transaction. The delivery id is a fence of its
// own: a delivery already recorded returns that record with First=false and
// touches nothing else, even while the first copy is still being committed.
// For a first delivery it behaves as InsertWork and records whether the
// work was new (DeliveryQueued) or already existed (DeliveryDuplicate).
func (s *Store) InsertWebhookWork(ctx context.Context, d Delivery, w *Work, announce func(*Work) ([]OutboxMsg, error)) (WebhookInsert, error) {
	var r WebhookInsert
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		r = WebhookInsert{}
		// A concurrent copy of the same delivery waits here on the primary
		// key until the first commits, then sees its row.
		rec, err := scanDelivery(tx.QueryRow(ctx, `INSERT INTO webhook_deliveries
				(delivery_id, tenant_id, event, action, decision, work_id, installation_id, base_sha)
			VALUES ($1, $2, $3, $4, $5, $6, nullif($7, 0), nullif($8, ''))
			ON CONFLICT (delivery_id) DO NOTHING
			RETURNING `+deliveryColumns, d.ID, d.TenantID, d.Event, d.Action, DeliveryQueued, w.ID, d.Installation, d.BaseSHA))
		if errors.Is(err, ErrNotFound) {
			if r.Delivery, err = scanDelivery(tx.QueryRow(ctx, `SELECT `+deliveryColumns+` FROM webhook_deliveries
				WHERE delivery_id = $1`, d.ID)); err != nil {
				return err
			}
			if r.Delivery.WorkID != "" {
				r.Work, err = scanWork(tx.QueryRow(ctx, `SELECT `+workColumns+` FROM work WHERE id = $1`, r.Delivery.WorkID))
			}
			return err
		}
		if err != nil {
			return err
		}
		r.Delivery, r.First = rec, true
		ins := insertGroup(ctx, tx, []InsertReq{{Work: w, Announce: announce}})[0]
		if r.Work, r.Created, err = ins.Work, ins.Created, ins.Err; err != nil {
			return err
		}
		if r.Work.ID == rec.WorkID && r.Created {
			return nil
		}
		// Record what is really there: the work may have existed already,
		// under this or (should the caller's id disagree) another id.
		rec.WorkID = r.Work.ID
		if !r.Created {
			rec.Decision = DeliveryDuplicate
		}
		_, err = tx.Exec(ctx, `UPDATE webhook_deliveries SET work_id = $2, decision = $3
			WHERE delivery_id = $1`, rec.ID, rec.WorkID, rec.Decision)
		return err
	})
	if err != nil {
		return WebhookInsert{}, fmt.Errorf("store: webhook delivery %q: %w", d.ID, err)
	}
	return r, nil
}

// Links lists every webhook source link, by tenant and key.
func (s *Store) Links(ctx context.Context) ([]Link, error) {
	rows, err := s.pool.Query(ctx, `SELECT kind, key, tenant_id, repositories FROM tenant_sources ORDER BY tenant_id, kind, key`)
	if err != nil {
		return nil, fmt.Errorf("store: links: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Link, error) {
		var l Link
		err := r.Scan(&l.Kind, &l.Key, &l.Tenant, &l.Repositories)
		return l, err
	})
}
