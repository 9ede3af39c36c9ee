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

// Commit is the commit fence. While the attempt's lease is still the work's
// lease it marks the work accepted and inserts the one result row; the result
// key (work, schema version) refuses a second. Otherwise the attempt is
// recorded stale_lease and the verdict says why: the lease was lost, or the
// deadline passed and the work is now expired. announce, when set, writes
// the outcome the work reached (accepted or expired) to the outbox in the
// same transaction.
func (s *Store) Commit(ctx context.Context, w *Work, attemptID, token string, output json.RawMessage, findings int,
	announce Announce) (v Verdict, err error) {
	var ob outboxRows
	if announce != nil {
		for _, state := range []string{outcome.Accepted, outcome.Expired} {
			msgs, err := announce(w, state)
			if err != nil {
				return Lost, err
			}
			if err := ob.add(state, msgs); err != nil {
				return Lost, err
			}
		}
	}
	// One statement: the late and the accepted branch exclude each other
	// by the deadline, and with neither the attempt is marked stale. An
	// attempt the classifier already recorded ok is not written again (its
	// raw answer would go to the WAL a second time). The
	// result's key refuses a second result, which aborts the statement
	// whole.
	var accepted, late bool
	err = s.pool.QueryRow(ctx, `WITH
		late AS (UPDATE work SET state = 'expired', reason = 'deadline passed before a result was accepted',
				lease_token = NULL, lease_expires_at = NULL, updated_at = now(),
				outcome_announced_at = CASE WHEN $8 THEN now() ELSE outcome_announced_at END
			WHERE id = $1 AND state = 'running' AND lease_token = $2 AND deadline_at <= now() RETURNING id),
		acc AS (UPDATE work SET state = 'accepted', reason = '', lease_token = NULL, lease_expires_at = NULL,
				updated_at = now(), outcome_announced_at = CASE WHEN $8 THEN now() ELSE outcome_announced_at END
			WHERE id = $1 AND state = 'running' AND lease_token = $2 AND deadline_at > now() RETURNING id),
		res AS (INSERT INTO results (work_id, schema_version, tenant_id, attempt_id, output, findings)
			SELECT $1, $3, $4, $5::uuid, $6::jsonb, $7::int FROM acc RETURNING work_id),
		att_ok AS (UPDATE attempts SET outcome = 'ok', reason = NULL, finished_at = coalesce(finished_at, now())
			WHERE id = $5 AND EXISTS (SELECT 1 FROM acc)
				AND (outcome IS DISTINCT FROM 'ok' OR reason IS NOT NULL OR finished_at IS NULL) RETURNING 1),
		att_late AS (UPDATE attempts SET outcome = 'stale_lease', reason = 'deadline passed before the verdict',
				finished_at = coalesce(finished_at, now())
			WHERE id = $5 AND EXISTS (SELECT 1 FROM late) RETURNING 1),
		att_lost AS (UPDATE attempts SET outcome = 'stale_lease', reason = coalesce(reason, 'lease lost before the verdict'),
				finished_at = coalesce(finished_at, now())
			WHERE id = $5 AND NOT EXISTS (SELECT 1 FROM acc) AND NOT EXISTS (SELECT 1 FROM late)
				AND coalesce(outcome, '') IN ('', 'ok', 'lease_expired')
				AND NOT EXISTS (SELECT 1 FROM results WHERE work_id = $1 AND attempt_id = $5) RETURNING 1),
		ob AS (`+outboxInsert(9, `(m.tag = 'accepted' AND EXISTS (SELECT 1 FROM acc)) OR (m.tag = 'expired' AND EXISTS (SELECT 1 FROM late))`)+`)
		SELECT EXISTS (SELECT 1 FROM acc), EXISTS (SELECT 1 FROM late)`,
		append([]any{w.ID, token, w.SchemaVersion, w.TenantID, attemptID, output, findings, announce != nil}, ob.args()...)...).
		Scan(&accepted, &late)
	if SQLState(err) == "23505" {
		// The lease CAS passed, so this cannot be a second commit of the
		// same work; refuse loudly rather than accept without a row, and
		// not as a refusal for good: the record is what is wrong.
		return Lost, fmt.Errorf("store: commit %s: a result for it already exists", w.ID)
	}
	if err != nil {
		return Lost, fmt.Errorf("store: commit %s: %w", w.ID, err)
	}
	switch {
	case accepted:
		return Committed, nil
	case late:
		return Late, nil
	}
	return Lost, nil
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
