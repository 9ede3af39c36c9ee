package committer

import (
	"context"
	"encoding/json"

	"assay.dev/pkg/store"
)

// Store is what the committer asks of the cell's database; *store.Store is
// one.
type Store interface {
	Ping(ctx context.Context) error
	GetWork(ctx context.Context, id string) (*store.Work, error)
	MarkStale(ctx context.Context, attemptID string) (bool, error)
	Reject(ctx context.Context, workID, attemptID, token, reason string) (bool, error)
	Commit(ctx context.Context, w *store.Work, attemptID, token string, output json.RawMessage, findings int) (store.Verdict, error)
}
