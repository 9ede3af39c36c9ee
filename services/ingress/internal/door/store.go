package door

import (
	"context"
	"time"

	"assay.dev/pkg/auth"
	"assay.dev/pkg/outbox"
	"assay.dev/pkg/store"
	"assay.dev/pkg/story"
)

// Store is what ingress asks of the cell's database; *store.Store is one.
type Store interface {
	auth.Tenants
	auth.Operators
	outbox.Source
	BatchStore
	ReviewStore
	WorkLister
	HistoryReader
	OpenCounter
	TenantWatcher
	story.Store
	Actor
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

// BatchStore is what the batch API asks of the cell's database; Store
// includes it.
type BatchStore interface {
	InsertBatch(ctx context.Context, b *store.Batch, entries []*store.BatchEntry, announce func(*store.Work) ([]store.OutboxMsg, error)) (*store.Batch, bool, error)
	GetBatch(ctx context.Context, tenant, id string) (*store.Batch, error)
	BatchItems(ctx context.Context, f store.BatchItemFilter) ([]store.BatchItem, error)
	BatchOverview(ctx context.Context, batchID string, named int) (store.BatchOverview, error)
	BatchSignal(ctx context.Context, batchID string) (store.BatchSignal, error)
	CancelBatch(ctx context.Context, tenant, id string, cancel func([]store.CanceledItem) ([]store.OutboxMsg, error)) (*store.Batch, []store.CanceledItem, error)
}

// ReviewStore is what the review API asks of the cell's database; Store
// includes it.
type ReviewStore interface {
	ListReviews(ctx context.Context, f store.ReviewFilter) ([]*store.Review, error)
	ResolveReview(ctx context.Context, tenant, workID string, res store.Resolution) (*store.Review, error)
	GetReview(ctx context.Context, tenant, workID string) (*store.Review, error)
	ClaimReview(ctx context.Context, tenant, workID string, who store.Actor, hold time.Duration) (*store.Review, error)
	ViewOf(ctx context.Context, workID string) (string, error)
}

// WorkLister is what GET /v1/work asks of the cell's database; Store
// includes it.
type WorkLister interface {
	ListWork(ctx context.Context, f store.WorkFilter) ([]*store.Work, error)
}

// HistoryReader is what a work stream reads; *store.Store is one.
type HistoryReader interface {
	WorkHistory(ctx context.Context, id string) (*store.History, error)
}

// Actor is what acting on work from the console asks of the store.
type Actor interface {
	RedriveWork(ctx context.Context, id string, o store.RedriveOptions, announce func(*store.Work) ([]store.OutboxMsg, error)) (*store.Work, error)
	RerunAudited(ctx context.Context, id string, deadline time.Time, announce func(*store.Work) ([]store.OutboxMsg, error),
		audit *store.Audit) (*store.Work, error)
	CancelWork(ctx context.Context, id, reason string, cancel func(w *store.Work, running bool) ([]store.OutboxMsg, error),
		audit *store.Audit) (*store.Work, error)
}
