package ledger

import (
	"context"
	"time"

	"assay.dev/pkg/auth"
	"assay.dev/pkg/store"
)

// Store is what the ledger asks of the cell's database; *store.Store is
// one.
type Store interface {
	auth.Tenants
	Ping(ctx context.Context) error
	RecordLedgerBatch(ctx context.Context, rows []store.LedgerRow) []store.LedgerResult
	UnrecordedEvents(ctx context.Context, stream string, grace, horizon time.Duration, limit int) ([][]byte, error)
	DeadAttempts(ctx context.Context, grace time.Duration, limit int) ([]store.DeadAttempt, error)
	ReleaseOrphanReservations(ctx context.Context, grace time.Duration) (int64, error)
	Usage(ctx context.Context, tenant string, from, to time.Time, by string) ([]store.UsageLine, error)
}
