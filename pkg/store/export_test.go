package store

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Pool gives the package's tests the pool, to set up and read back rows
// the store's methods do not expose.
func Pool(s *Store) *pgxpool.Pool { return s.pool }

// InsertOutbox writes outbox rows in a transaction of their own.
func InsertOutbox(ctx context.Context, s *Store, msgs []OutboxMsg) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return insertOutbox(ctx, tx, msgs) })
}

// FinishLeased is the lease-guarded finish every verdict uses.
func FinishLeased(ctx context.Context, s *Store, workID, token, state, reason string) (bool, error) {
	return finishLeased(ctx, s.pool, workID, token, state, reason)
}
