package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"assay.dev/pkg/outcome"
)

// Result is the one accepted output of a work item.
type Result struct {
	WorkID        string
	SchemaVersion string
	AttemptID     string
	Output        json.RawMessage
	Findings      int
	CreatedAt     time.Time
	// Coverage says what a review in parts covered; nil for a review
	// whole.
	Coverage json.RawMessage
}

// Commit is the commit fence for one answer: CommitGroup as a group of
// one. While the attempt's lease is still the work's lease it marks the
// work accepted and inserts the one result row; the result key (work,
// schema version) refuses a second. Otherwise the attempt is recorded
// stale_lease and the verdict says why: the lease was lost, or the
// deadline passed and the work is now expired. announce, when set, writes
// the outcome the work reached (accepted or expired) to the outbox in the
// same statement.
func (s *Store) Commit(ctx context.Context, w *Work, attemptID, token string, output json.RawMessage, findings int,
	announce Announce) (v Verdict, err error) {
	r := CommitReq{Work: w, AttemptID: attemptID, Token: token, Output: output, Findings: findings, Announce: announce != nil}
	if announce != nil {
		if r.Accepted, err = announce(w, outcome.Accepted); err != nil {
			return Lost, err
		}
		if r.Expired, err = announce(w, outcome.Expired); err != nil {
			return Lost, err
		}
	}
	c := s.CommitGroup(ctx, []CommitReq{r})[0]
	return c.Verdict, c.Err
}

// Verdict is what Commit did with an answer.
type Verdict int

// Verdicts.
const (
	// Lost: the attempt's lease was no longer the work's.
	Lost Verdict = iota
	// Late: the work's deadline had passed; the work is now expired.
	Late
	// Committed: the answer is the work's one result.
	Committed
)

// Reject ends leased work schema_rejected with the gate's reason. false
// means the lease was lost; the attempt is then recorded stale_lease.
// announce, when set, writes the outcome to the outbox in the same
// transaction.
func (s *Store) Reject(ctx context.Context, w *Work, attemptID, token, reason string, announce Announce) (rejected bool, err error) {
	workID := w.ID
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		ok, err := finishLeased(ctx, tx, workID, token, outcome.SchemaRejected, Text(reason))
		if err != nil {
			return err
		}
		if !ok {
			_, err := markLost(ctx, tx, attemptID)
			return err
		}
		rejected = true
		if err := finishAttempt(ctx, tx, attemptID, outcome.AttemptInvalidOutput, reason, nil); err != nil {
			return err
		}
		return announceOutcome(ctx, tx, w, outcome.SchemaRejected, announce)
	})
	if err != nil {
		return false, fmt.Errorf("store: reject %s: %w", workID, err)
	}
	return rejected, nil
}

// markLost records stale_lease on an attempt whose verdict came too late.
// The attempt that decided the work keeps its outcome: a redelivered verdict
// for it must not relabel the accepted (or rejected) answer as stale.
func markLost(ctx context.Context, db execer, attemptID string) (marked bool, err error) {
	tag, err := db.Exec(ctx, `UPDATE attempts SET outcome = 'stale_lease', reason = coalesce(reason, 'lease lost before the verdict'),
			finished_at = coalesce(finished_at, now())
		WHERE id = $1 AND coalesce(outcome, '') IN ('', 'ok', 'lease_expired')
			AND NOT EXISTS (SELECT 1 FROM results r WHERE r.work_id = attempts.work_id AND r.attempt_id = $1)`, attemptID)
	if err != nil {
		return false, fmt.Errorf("store: mark lost %s: %w", attemptID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// GetResult reads the accepted result of a work item.
func (s *Store) GetResult(ctx context.Context, workID string) (*Result, error) {
	var r Result
	err := s.pool.QueryRow(ctx, `SELECT work_id, schema_version, attempt_id::text, output, findings, created_at,
			(SELECT a.coverage FROM attempts a WHERE a.id = r.attempt_id)
		FROM results r WHERE work_id = $1`, workID).Scan(&r.WorkID, &r.SchemaVersion, &r.AttemptID, &r.Output, &r.Findings,
		&r.CreatedAt, &r.Coverage)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	return &r, err
}
