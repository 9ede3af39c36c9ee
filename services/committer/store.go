package committer

import (
	"context"
	"encoding/json"
	"time"

	"assay.dev/pkg/outbox"
	"assay.dev/pkg/store"
	"assay.dev/services/committer/publish"
)

// Store is what the committer asks of the cell's database; *store.Store is
// one.
type Store interface {
	Ping(ctx context.Context) error
	WorkAnswer(ctx context.Context, workID, attemptID string) (*store.Work, []byte, error)
	MarkStale(ctx context.Context, attemptID string) (bool, error)
	Reject(ctx context.Context, w *store.Work, attemptID, token, reason string, announce store.Announce) (bool, error)
	UncommittedResults(ctx context.Context, stream string, grace time.Duration, limit int) ([][]byte, error)
	Commit(ctx context.Context, w *store.Work, attemptID, token string, output json.RawMessage, findings int,
		announce store.Announce) (store.Verdict, error)
	// The same in groups: what concurrent results ask at once is one
	// statement, each row decided on its own.
	WorkAnswerGroup(ctx context.Context, reqs []store.AnswerReq) []store.Answer
	CommitGroup(ctx context.Context, reqs []store.CommitReq) []store.CommitVerdict
	AnnounceOutcomes(ctx context.Context, limit int, announce store.Announce) (int, error)
	UnpublishedOutcomes(ctx context.Context, grace time.Duration, limit int) ([][]byte, error)
	AdvanceOutcomeMark(ctx context.Context) (time.Time, error)
	outbox.Source
	publish.Store
}
