package classifier

import (
	"context"
	"time"

	"assay.dev/pkg/outbox"
	"assay.dev/pkg/store"
)

// Store is what the classifier asks of the cell's database; *store.Store
// is one.
type Store interface {
	outbox.Source
	BatchStore
	weightSource
	Ping(ctx context.Context) error
	WorkToRun(ctx context.Context, id string) (w *store.Work, budgeted bool, err error)
	Reserve(ctx context.Context, tenantID, attemptID string, amount int64) (store.Reservation, error)
	Release(ctx context.Context, attemptID string) error
	Claim(ctx context.Context, workID, attemptID, token string, ttl time.Duration, estimate int64) (*store.Work, bool, error)
	ExtendLease(ctx context.Context, workID, token string, ttl time.Duration) (bool, error)
	FinishUnleased(ctx context.Context, workID, state, reason string) (bool, error)
	RecordAttempt(ctx context.Context, r store.AttemptRecord) (applied bool, err error)
	// The same in groups: what concurrent calls ask at once is one
	// statement, each row decided on its own.
	WorkToRunGroup(ctx context.Context, ids []string) []store.ToRun
	ClaimGroup(ctx context.Context, reqs []store.ClaimReq) []store.Claimed
	RecordAttemptGroup(ctx context.Context, recs []store.AttemptRecord) []store.AttemptRecorded
	// A review in parts: each call recorded before and after, earlier
	// leases' answers reused, the parts' answer kept with the attempt.
	StartPart(ctx context.Context, p store.PartCall) (bool, error)
	RecordPart(ctx context.Context, r store.PartRecord) error
	PartAnswers(ctx context.Context, workID string) ([]store.PartAnswer, error)
	PartsFacts(ctx context.Context, id string) (store.PartsFacts, error)
	SetWholeAnswer(ctx context.Context, attemptID, token string, answer, coverage []byte) (bool, error)
	PartCallCosts(ctx context.Context, contract, model string, n int) ([]store.CallCost, error)
	// Prompt reads a rollout's prompt by its digest.
	Prompt(ctx context.Context, digest string) (string, error)
	circuitStore
}

var _ Store = (*store.Store)(nil)
