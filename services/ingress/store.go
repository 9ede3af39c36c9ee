package ingress

import (
	"context"
	"time"

	"assay.dev/pkg/auth"
	"assay.dev/pkg/outbox"
	"assay.dev/pkg/store"
)

// Store is what ingress asks of the cell's database; *store.Store is one.
type Store interface {
	auth.Tenants
	auth.Operators
	outbox.Source
	batchStore
	reviewStore
	workLister
	historyReader
	openCounter
	tenantWatcher
	StoryStore
	actor
	OpenReviews(ctx context.Context, tenant string) (int, error)
	Ping(ctx context.Context) error
	GetWork(ctx context.Context, id string) (*store.Work, error)
	HeldIn(ctx context.Context, id string) (string, error)
	InsertWork(ctx context.Context, w *store.Work, announce func(*store.Work) ([]store.OutboxMsg, error)) (*store.Work, bool, error)
	InsertWorkGroup(ctx context.Context, reqs []store.InsertReq) []store.WorkInserted
	Attempts(ctx context.Context, workID string) ([]store.Attempt, error)
	GetResult(ctx context.Context, workID string) (*store.Result, error)
	PublicationsOf(ctx context.Context, workID string) ([]*store.Publication, error)
	WebhookLinks(ctx context.Context, installation, repository string) (store.WebhookLinks, error)
	InstallationFor(ctx context.Context, tenant, repository string) (int64, error)
	RepositorySecret(ctx context.Context, repository string) (tenant, secret string, err error)
	GetDelivery(ctx context.Context, id string) (*store.Delivery, error)
	InsertWebhookWork(ctx context.Context, d store.Delivery, w *store.Work, announce func(*store.Work) ([]store.OutboxMsg, error)) (store.WebhookInsert, error)
	ExpireOverdue(ctx context.Context, grace time.Duration, limit int) ([]*store.Work, error)
	Purge(ctx context.Context, r store.Retention) (store.Purged, error)
	Usage(ctx context.Context, tenant string, from, to time.Time, by string) ([]store.UsageLine, error)
	Oldest(ctx context.Context) (map[string]time.Duration, error)
	Views(ctx context.Context, window time.Duration) (map[string]int64, error)
	Outbox(ctx context.Context) (map[string]store.OutboxBacklog, error)
	ViewsOf(ctx context.Context, window time.Duration, tenant string) (map[string]int64, error)
	Console(ctx context.Context, window time.Duration, tenant string, recent int, since time.Time) (store.ConsoleFigures, error)
	Routes(ctx context.Context) ([]store.Route, error)
	SweepStuck(ctx context.Context, sw store.Sweep, announce func(store.Stuck) (store.OutboxMsg, error)) ([]store.Stuck, error)
}

var _ Store = (*store.Store)(nil)
