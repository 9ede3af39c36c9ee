package store

import (
	"context"
	"fmt"
	"time"
)

// Parts: a diff too large for one model call is reviewed in parts under
// the one lease of a claimed attempt (migration 0024). The claimed attempt
// makes no call of its own and is marked part '*'; each call is an
// attempt row of its own, with the lease's token and number, the part's id
// and its place among the lease's calls, recorded before the call (so a
// worker that dies mid-call leaves a row the ledger's reaper charges) and
// after it with its outcome, raw answer and ATTEMPT event.

// WholeAttempt marks a claimed attempt whose work is reviewed in parts.
const WholeAttempt = "*"

// PartCall is one call of a lease reviewed in parts, about to be made.
type PartCall struct {
	// ID is the call's attempt id (its reservation's and ledger row's).
	ID string
	// WorkID and Token name the work and the lease the call is made under.
	WorkID, Token string
	// Part is the part's id (p1, p2, …); Call its place among the lease's
	// calls, from 1 (a part asked again after a failed gate is a call of
	// its own).
	Part string
	Call int
	// Estimate bounds the call's cost from above.
	Estimate int64
	// TTL extends the lease from now: a call is progress.
	TTL time.Duration
}

// StartPart records a call before it is made, marks the lease's claimed
// attempt as reviewed in parts and extends the lease, in one statement,
// only while the lease is the work's: ok=false writes nothing.
func (s *Store) StartPart(ctx context.Context, p PartCall) (ok bool, err error) {
	err = s.pool.QueryRow(ctx, `WITH w AS (
			UPDATE work SET lease_expires_at = now() + $7 * interval '1 microsecond'
			WHERE id = $2 AND state = 'running' AND lease_token = $3
			RETURNING id, tenant_id, attempts, lease_token
		), whole AS (
			UPDATE attempts SET part = '*'
			WHERE work_id = $2 AND lease_token = $3 AND call IS NULL AND part IS NULL AND EXISTS (SELECT 1 FROM w)
		), ins AS (
			INSERT INTO attempts (id, work_id, tenant_id, number, lease_token, estimate_micros, part, call)
			SELECT $1, id, tenant_id, attempts, lease_token, $6, $4, $5 FROM w
			RETURNING 1
		)
		SELECT EXISTS (SELECT 1 FROM ins)`,
		p.ID, p.WorkID, p.Token, p.Part, p.Call, p.Estimate, interval(p.TTL)).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("store: start part %s of %s: %w", p.Part, p.WorkID, err)
	}
	return ok, nil
}

// PartRecord is how one call of a lease reviewed in parts ended.
type PartRecord struct {
	ID              string
	Outcome, Reason string
	// Raw is the provider's answer, byte for byte; nil keeps none.
	Raw []byte
	// Outbox is the call's ATTEMPT event.
	Outbox []OutboxMsg
}

// RecordPart records a call's outcome and writes its event in one
// statement. The call was made and paid for whatever became of the lease,
// so it is recorded unconditionally.
func (s *Store) RecordPart(ctx context.Context, r PartRecord) error {
	var ob outboxRows
	if err := ob.add("", r.Outbox); err != nil {
		return err
	}
	raw := r.Raw
	if len(raw) == 0 {
		raw = nil
	}
	_, err := s.pool.Exec(ctx, `WITH att AS (
			UPDATE attempts SET outcome = $2, reason = nullif($3, ''), raw_response = coalesce($4, raw_response),
				finished_at = coalesce(finished_at, now())
			WHERE id = $1 AND call IS NOT NULL RETURNING 1
		), ob AS (`+outboxInsert(5, `EXISTS (SELECT 1 FROM att)`)+`)
		SELECT 1`, append([]any{r.ID, r.Outcome, Text(r.Reason), raw}, ob.args()...)...)
	if err != nil {
		return fmt.Errorf("store: record part call %s: %w", r.ID, err)
	}
	return nil
}

// PartAnswer is an answer a part of the work got under an earlier lease.
type PartAnswer struct {
	Part string
	Raw  []byte
}

// PartAnswers lists the answers the work's parts got under earlier leases
// that the gate accepted (their calls ended ok), oldest first: a lease
// reviewing the same parts reuses them instead of paying for them again.
func (s *Store) PartAnswers(ctx context.Context, workID string) ([]PartAnswer, error) {
	rows, err := s.pool.Query(ctx, `SELECT part, raw_response FROM attempts
		WHERE work_id = $1 AND call IS NOT NULL AND outcome = 'ok' AND raw_response IS NOT NULL
		ORDER BY number, call`, workID)
	if err != nil {
		return nil, fmt.Errorf("store: part answers of %s: %w", workID, err)
	}
	defer rows.Close()
	var out []PartAnswer
	for rows.Next() {
		var a PartAnswer
		if err := rows.Scan(&a.Part, &a.Raw); err != nil {
			return nil, fmt.Errorf("store: part answers of %s: %w", workID, err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: part answers of %s: %w", workID, err)
	}
	return out, nil
}

// SetWholeAnswer keeps, on a lease's claimed attempt, the answer its parts
// make together (what the committer gates) and what they covered, while
// the lease is the work's and before the attempt is recorded.
func (s *Store) SetWholeAnswer(ctx context.Context, attemptID, token string, answer, coverage []byte) (bool, error) {
	if len(answer) == 0 {
		answer = nil
	}
	tag, err := s.pool.Exec(ctx, `UPDATE attempts SET part = '*', answer = $3, coverage = nullif($4, '')::jsonb
		WHERE id = $1 AND lease_token = $2 AND call IS NULL AND outcome IS NULL`, attemptID, token, answer, string(coverage))
	if err != nil {
		return false, fmt.Errorf("store: whole answer of %s: %w", attemptID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// CallCost is what one call of a review in parts was reserved at and what
// its ledger row charged.
type CallCost struct {
	Estimate, Cost int64
}

// PartCallCosts lists the reservations and charges of the last n calls of
// reviews in parts of contract asked of model, newest first: those the
// model answered (ok or invalid_output) whose ledger row carries the
// provider's own usage (not an estimate, not a shadow lane's). Read only; a review in parts calibrates its cost cap on
// them.
func (s *Store) PartCallCosts(ctx context.Context, contract, model string, n int) ([]CallCost, error) {
	rows, err := s.pool.Query(ctx, `SELECT a.estimate_micros, l.cost_micros
		FROM attempts a
		JOIN work w ON w.id = a.work_id
		JOIN ledger l ON l.attempt_id = a.id
		WHERE a.call IS NOT NULL AND a.finished_at IS NOT NULL AND a.estimate_micros > 0
			AND a.outcome IN ('ok', 'invalid_output') AND w.contract = $1 AND l.model = $2 AND NOT l.estimated AND NOT l.shadow
		ORDER BY a.finished_at DESC
		LIMIT $3`, contract, model, n)
	if err != nil {
		return nil, fmt.Errorf("store: part call costs of %s: %w", contract, err)
	}
	defer rows.Close()
	var out []CallCost
	for rows.Next() {
		var c CallCost
		if err := rows.Scan(&c.Estimate, &c.Cost); err != nil {
			return nil, fmt.Errorf("store: part call costs of %s: %w", contract, err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: part call costs of %s: %w", contract, err)
	}
	return out, nil
}
