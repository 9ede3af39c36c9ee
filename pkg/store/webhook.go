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
}

// LinkSource maps a webhook source to a tenant, replacing any earlier
// mapping of the same source.
func (s *Store) LinkSource(ctx context.Context, kind, key, tenant string) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO tenant_sources (kind, key, tenant_id) VALUES ($1, $2, $3)
		ON CONFLICT (kind, key) DO UPDATE SET tenant_id = excluded.tenant_id`, kind, key, tenant)
	if err != nil {
		return fmt.Errorf("store: link %s %q: %w", kind, key, err)
	}
	return nil
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
				(delivery_id, tenant_id, event, action, decision, work_id)
			VALUES ($1, $2, $3, $4, $5, $6)
			ON CONFLICT (delivery_id) DO NOTHING
			RETURNING `+deliveryColumns, d.ID, d.TenantID, d.Event, d.Action, DeliveryQueued, w.ID))
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
		if r.Work, r.Created, err = insertWork(ctx, tx, w, announce); err != nil {
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
