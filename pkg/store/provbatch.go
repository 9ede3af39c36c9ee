package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The provider-batch queries: batch-lane attempts sent through the
// provider's Batch API as lines of a batch (migration 0017).

// Provider batch states.
const (
	// BatchPreparing: the row and its lines exist; the provider may or may
	// not have the batch yet (its creation may have gone unanswered).
	BatchPreparing = "preparing"
	// BatchSubmitted: the provider's batch id is recorded; it is polled.
	BatchSubmitted = "submitted"
	// BatchReconciled: every line is reconciled.
	BatchReconciled = "reconciled"
)

// Line outcomes: how the provider answered one line.
const (
	LineAnswered = "answered" // a response with a 2xx status
	LineFailed   = "failed"   // a response with another status, or an error other than expiry
	LineExpired  = "expired"  // not run: the batch expired, failed or was canceled first
	LineMissing  = "missing"  // the batch ended and neither file names the line
	LineUnsent   = "unsent"   // its lease was gone before it was sent
)

// BatchLine is one attempt sent, or to be sent, as a line of a provider
// batch.
type BatchLine struct {
	AttemptID  string
	WorkID     string
	TenantID   string
	LeaseToken string
	// Request is the chat-completions body of the line.
	Request []byte
	// Live: the line's lease is still its work's.
	Live bool
}

// ProviderBatch is one batch of lines and what is known of it at the
// provider.
type ProviderBatch struct {
	ID           string
	State        string
	Lines        int
	InputFileID  string
	ProviderID   string
	Status       string
	OutputFileID string
	ErrorFileID  string
	SubmitTries  int
	// Errors is what the provider said of a batch that failed, or why
	// one was never submitted.
	Errors    string
	CreatedAt time.Time
	// OpenCount counts its lines not yet reconciled; Open are they, read
	// by OpenLines when a pass needs them.
	OpenCount int
	Open      []BatchLine
}

// BatchCounts are the provider's counts of a batch's requests.
type BatchCounts struct{ Total, Completed, Failed int }

// LineCounts are how a batch's lines were reconciled.
type LineCounts struct{ Answered, Failed, Expired, Missing int }

// EnqueueBatchLine makes a claimed attempt a line waiting for its batch
// and holds the attempt's lease for hold, in one transaction, only while
// the lease is still the attempt's: ok=false means it is not, and nothing
// was written.
func (s *Store) EnqueueBatchLine(ctx context.Context, l BatchLine, hold time.Duration) (ok bool, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if ok, err = extendLease(ctx, tx, l.WorkID, l.LeaseToken, hold); err != nil || !ok {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO provider_batch_lines (attempt_id, work_id, tenant_id, lease_token, request)
			VALUES ($1, $2, $3, $4, $5)`, l.AttemptID, l.WorkID, l.TenantID, l.LeaseToken, l.Request)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("store: enqueue batch line %s: %w", l.AttemptID, err)
	}
	return ok, nil
}

// PendingLines says how many lines wait for a batch and how long the
// oldest has waited.
func (s *Store) PendingLines(ctx context.Context) (n int, age time.Duration, err error) {
	var us int64
	err = s.pool.QueryRow(ctx, `SELECT count(*),
			coalesce((extract(epoch FROM now() - min(created_at)) * 1000000)::bigint, 0)
		FROM provider_batch_lines WHERE state = 'pending'`).Scan(&n, &us)
	if err != nil {
		return 0, 0, fmt.Errorf("store: pending lines: %w", err)
	}
	return n, time.Duration(us) * time.Microsecond, nil
}

// FormProviderBatch takes up to max waiting lines, oldest first, and puts
// those whose lease is still theirs in a new batch, held by the caller for
// hold; the batch is nil when none is. dead are the lines taken whose lease
// is gone: they are left waiting, for the caller to reconcile as unsent.
func (s *Store) FormProviderBatch(ctx context.Context, id string, max int, hold time.Duration) (b *ProviderBatch, dead []BatchLine, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		b, dead = nil, nil
		rows, err := tx.Query(ctx, `SELECT l.attempt_id::text, l.work_id, l.tenant_id, l.lease_token::text, l.request,
				coalesce(w.state = 'running' AND w.lease_token = l.lease_token AND w.lease_expires_at > now(), false)
			FROM provider_batch_lines l LEFT JOIN work w ON w.id = l.work_id
			WHERE l.state = 'pending' ORDER BY l.created_at LIMIT $1 FOR UPDATE OF l SKIP LOCKED`, max)
		if err != nil {
			return err
		}
		lines, err := pgx.CollectRows(rows, scanLine)
		if err != nil {
			return err
		}
		var live []string
		nb := &ProviderBatch{ID: id, State: BatchPreparing}
		for _, l := range lines {
			if !l.Live {
				dead = append(dead, l)
				continue
			}
			nb.Open = append(nb.Open, l)
			live = append(live, l.AttemptID)
		}
		if len(live) == 0 {
			return nil
		}
		nb.Lines, nb.OpenCount = len(live), len(live)
		if err := tx.QueryRow(ctx, `INSERT INTO provider_batches (id, lines, held_until)
				VALUES ($1, $2, now() + $3 * interval '1 microsecond') RETURNING created_at`,
			id, nb.Lines, interval(hold)).Scan(&nb.CreatedAt); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE provider_batch_lines SET batch_id = $1, state = 'batched'
			WHERE attempt_id = ANY($2::uuid[])`, id, live); err != nil {
			return err
		}
		b = nb
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("store: form provider batch: %w", err)
	}
	return b, dead, nil
}

func scanLine(r pgx.CollectableRow) (BatchLine, error) {
	var l BatchLine
	err := r.Scan(&l.AttemptID, &l.WorkID, &l.TenantID, &l.LeaseToken, &l.Request, &l.Live)
	return l, err
}

// TakeProviderBatches holds for hold up to limit batches that are not
// reconciled, are due and that no one holds, and returns them with the
// count of their open lines.
func (s *Store) TakeProviderBatches(ctx context.Context, limit int, hold time.Duration) ([]*ProviderBatch, error) {
	rows, err := s.pool.Query(ctx, `UPDATE provider_batches b SET held_until = now() + $2 * interval '1 microsecond'
		WHERE id IN (SELECT id FROM provider_batches WHERE state <> 'reconciled' AND next_poll_at <= now()
				AND held_until < now() ORDER BY next_poll_at LIMIT $1 FOR UPDATE SKIP LOCKED)
		RETURNING id::text, state, lines, coalesce(input_file_id, ''), coalesce(provider_batch_id, ''),
			coalesce(status, ''), coalesce(output_file_id, ''), coalesce(error_file_id, ''), submit_tries,
			coalesce(errors, ''), created_at,
			(SELECT count(*) FROM provider_batch_lines l WHERE l.batch_id = b.id AND l.state = 'batched')`,
		limit, interval(hold))
	if err != nil {
		return nil, fmt.Errorf("store: take provider batches: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*ProviderBatch, error) {
		var b ProviderBatch
		err := r.Scan(&b.ID, &b.State, &b.Lines, &b.InputFileID, &b.ProviderID, &b.Status, &b.OutputFileID,
			&b.ErrorFileID, &b.SubmitTries, &b.Errors, &b.CreatedAt, &b.OpenCount)
		return &b, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: take provider batches: %w", err)
	}
	return out, nil
}

// OpenLines reads a batch's lines not yet reconciled, with their
// requests, into b.Open.
func (s *Store) OpenLines(ctx context.Context, b *ProviderBatch) error {
	rows, err := s.pool.Query(ctx, `SELECT l.attempt_id::text, l.work_id, l.tenant_id, l.lease_token::text,
			coalesce(l.request, ''::bytea),
			coalesce(w.state = 'running' AND w.lease_token = l.lease_token, false)
		FROM provider_batch_lines l LEFT JOIN work w ON w.id = l.work_id
		WHERE l.batch_id = $1 AND l.state = 'batched' ORDER BY l.created_at`, b.ID)
	if err != nil {
		return fmt.Errorf("store: lines of provider batch %s: %w", b.ID, err)
	}
	if b.Open, err = pgx.CollectRows(rows, scanLine); err != nil {
		return fmt.Errorf("store: lines of provider batch %s: %w", b.ID, err)
	}
	b.OpenCount = len(b.Open)
	return nil
}

// ProviderBatchUpdate is what a pass learned of a batch. Empty fields keep
// what is recorded.
type ProviderBatchUpdate struct {
	InputFileID  string
	ProviderID   string
	Status       string
	Errors       string
	OutputFileID string
	ErrorFileID  string
	Counts       *BatchCounts
	// SubmitFailed counts a failed try at submitting, with its error.
	SubmitFailed string
	// NextPoll is when the batch is due again; the hold is released.
	NextPoll time.Duration
	// KeepHold keeps the caller's hold and the batch's due time, for a
	// step recorded in the middle of a pass.
	KeepHold bool
	Polled   bool
}

// UpdateProviderBatch records what a pass learned of a batch and releases
// the caller's hold. A recorded provider id makes the batch submitted.
func (s *Store) UpdateProviderBatch(ctx context.Context, id string, u ProviderBatchUpdate) error {
	var total, completed, failed *int
	if u.Counts != nil {
		total, completed, failed = &u.Counts.Total, &u.Counts.Completed, &u.Counts.Failed
	}
	_, err := s.pool.Exec(ctx, `UPDATE provider_batches SET
			input_file_id = coalesce(nullif($2, ''), input_file_id),
			provider_batch_id = coalesce(nullif($3, ''), provider_batch_id),
			state = CASE WHEN state = 'preparing' AND coalesce(nullif($3, ''), provider_batch_id) IS NOT NULL
				THEN 'submitted' ELSE state END,
			submitted_at = CASE WHEN submitted_at IS NULL AND nullif($3, '') IS NOT NULL THEN now() ELSE submitted_at END,
			status = coalesce(nullif($4, ''), status),
			errors = coalesce(nullif($5, ''), errors),
			output_file_id = coalesce(nullif($6, ''), output_file_id),
			error_file_id = coalesce(nullif($7, ''), error_file_id),
			request_total = coalesce($8, request_total),
			request_completed = coalesce($9, request_completed),
			request_failed = coalesce($10, request_failed),
			submit_tries = submit_tries + CASE WHEN $11 = '' THEN 0 ELSE 1 END,
			last_error = coalesce(nullif($11, ''), last_error),
			polls = polls + CASE WHEN $13 THEN 1 ELSE 0 END,
			next_poll_at = CASE WHEN $14 THEN next_poll_at ELSE now() + $12 * interval '1 microsecond' END,
			held_until = CASE WHEN $14 THEN held_until ELSE 'epoch' END,
			ended_at = CASE WHEN ended_at IS NULL AND $4 IN ('completed', 'expired', 'failed', 'cancelled')
				THEN now() ELSE ended_at END
		WHERE id = $1`, id, Text(u.InputFileID), Text(u.ProviderID), Text(u.Status), Text(u.Errors), Text(u.OutputFileID),
		Text(u.ErrorFileID), total, completed, failed, Text(u.SubmitFailed), interval(u.NextPoll), u.Polled, u.KeepHold)
	if err != nil {
		return fmt.Errorf("store: update provider batch %s: %w", id, err)
	}
	return nil
}

// ErrLineReconciled is returned by RecordBatchLine for a line already
// reconciled: its attempt was recorded once, and is not again.
var ErrLineReconciled = errors.New("store: batch line already reconciled")

// errLeaseGone rolls back a line's record whose work change no longer
// applies.
var errLeaseGone = errors.New("store: the lease is no longer the attempt's")

// RecordBatchLine reconciles one line and records its attempt as
// RecordAttempt does, in one transaction: the work change applies only
// while the attempt's lease is the work's, and when it does not nothing is
// written and applied is false, so the caller records the attempt as what
// it then is (stale, NoChange). A line is reconciled once, so its attempt
// is recorded and its events written once (ErrLineReconciled).
func (s *Store) RecordBatchLine(ctx context.Context, lineOutcome string, r AttemptRecord) (applied bool, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE provider_batch_lines SET state = 'reconciled', outcome = $2, request = NULL,
				reconciled_at = now()
			WHERE attempt_id = $1 AND state <> 'reconciled'`, r.AttemptID, lineOutcome)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrLineReconciled
		}
		applied, err := recordAttemptGroup(ctx, tx, []AttemptRecord{r})
		if err != nil {
			return err
		}
		if !applied[r.AttemptID] {
			return errLeaseGone
		}
		return nil
	})
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, errLeaseGone):
		return false, nil
	case errors.Is(err, ErrLineReconciled):
		return false, err
	}
	return false, fmt.Errorf("store: record batch line %s: %w", r.AttemptID, err)
}

// FinishProviderBatch marks a batch reconciled once no line of it is
// open, with how its lines were reconciled; done=false means lines are
// still open.
func (s *Store) FinishProviderBatch(ctx context.Context, id string) (c LineCounts, done bool, err error) {
	err = s.pool.QueryRow(ctx, `WITH counts AS (
			SELECT count(*) FILTER (WHERE outcome = 'answered') AS answered,
				count(*) FILTER (WHERE outcome = 'failed') AS failed,
				count(*) FILTER (WHERE outcome = 'expired') AS expired,
				count(*) FILTER (WHERE outcome = 'missing') AS missing,
				count(*) FILTER (WHERE state <> 'reconciled') AS open
			FROM provider_batch_lines WHERE batch_id = $1
		), upd AS (
			UPDATE provider_batches b SET state = 'reconciled', answered = counts.answered, failed = counts.failed,
				expired = counts.expired, missing = counts.missing, reconciled_at = now(),
				ended_at = coalesce(ended_at, now()), held_until = 'epoch'
			FROM counts WHERE b.id = $1 AND counts.open = 0
			RETURNING b.id
		)
		SELECT answered, failed, expired, missing, open = 0 FROM counts`, id).Scan(&c.Answered, &c.Failed, &c.Expired, &c.Missing, &done)
	if err != nil {
		return LineCounts{}, false, fmt.Errorf("store: finish provider batch %s: %w", id, err)
	}
	return c, done, nil
}

// ProviderBatchRow is a batch as the cell's database keeps it, for
// operators and tests.
type ProviderBatchRow struct {
	ID, State, ProviderID, Status, Errors string
	Lines                                 int
	Requests                              BatchCounts
	Reconciled                            LineCounts
	SubmitTries, Polls                    int
}

// ProviderBatches lists the cell's provider batches, newest first.
func (s *Store) ProviderBatches(ctx context.Context, limit int) ([]ProviderBatchRow, error) {
	rows, err := s.pool.Query(ctx, `SELECT id::text, state, coalesce(provider_batch_id, ''), coalesce(status, ''),
			coalesce(errors, ''), lines, request_total, request_completed, request_failed, answered, failed, expired,
			missing, submit_tries, polls
		FROM provider_batches ORDER BY created_at DESC LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("store: provider batches: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ProviderBatchRow, error) {
		var b ProviderBatchRow
		err := r.Scan(&b.ID, &b.State, &b.ProviderID, &b.Status, &b.Errors, &b.Lines, &b.Requests.Total,
			&b.Requests.Completed, &b.Requests.Failed, &b.Reconciled.Answered, &b.Reconciled.Failed,
			&b.Reconciled.Expired, &b.Reconciled.Missing, &b.SubmitTries, &b.Polls)
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: provider batches: %w", err)
	}
	return out, nil
}
