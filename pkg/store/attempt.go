package store

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Attempt is one claim and one model call.
type Attempt struct {
	ID         string
	WorkID     string
	TenantID   string
	Number     int
	Outcome    string
	Reason     string
	StartedAt  time.Time
	FinishedAt *time.Time
	// Part is, for a review in parts, the part a call was made for (p1,
	// p2, …), or WholeAttempt for the claimed attempt, which made none.
	Part string
}

// WorkChange is what recording an attempt does to its work. Each applies
// only while the attempt's lease is still the work's: a worker that lost its
// lease records its attempt and changes nothing else.
type WorkChange int

// Work changes.
const (
	// NoChange leaves the work as it is.
	NoChange WorkChange = iota
	// Handoff keeps the lease for HandoffTTL while the committer decides.
	Handoff
	// Requeue gives the lease up so the work can be claimed again; with a
	// RepairNote the next attempt is a repair re-ask.
	Requeue
	// Finish ends the work with WorkOutcome and WorkReason.
	Finish
)

// AttemptRecord is how one attempt ended, with what it does to its work and
// the events it implies.
type AttemptRecord struct {
	AttemptID, WorkID, LeaseToken string
	// Outcome and Reason are the attempt's.
	Outcome, Reason string
	// Raw is the answer as the provider sent it, kept in the cell byte for
	// byte, whatever its bytes.
	Raw []byte

	Change                  WorkChange
	HandoffTTL              time.Duration // Handoff
	RepairNote              string        // Requeue
	RetryAfter              time.Duration // Requeue: when it may be tried again
	OutputCap               int           // Requeue: the next attempt's raised answer cap; 0 keeps it
	WorkOutcome, WorkReason string        // Finish
	// Outage, with Requeue or Finish, counts the attempt as lost to a
	// provider outage: the attempt budget does not count it.
	Outage bool

	// Outbox are the events the attempt implies (its ATTEMPT event). Its
	// ATTEMPT event marked NoRow is kept on the attempt's row instead of an
	// outbox row, for its process to publish once the record has committed;
	// the reapers read it back from there (UnrecordedEvents,
	// UncommittedResults).
	Outbox []OutboxMsg
}

// RecordAttempt records an attempt, changes its work and writes its events
// in one statement: no record without its events, no handoff without a
// record. A change applies only while the attempt's lease is the work's:
// when it is not, nothing at all is written and applied is false, so the
// caller can record the attempt as what it then is (stale, NoChange).
// NoChange always applies. It is the record fence, RecordAttemptGroup, as
// a group of one.
func (s *Store) RecordAttempt(ctx context.Context, r AttemptRecord) (applied bool, err error) {
	rec := s.RecordAttemptGroup(ctx, []AttemptRecord{r})[0]
	return rec.Applied, rec.Err
}

// finishAttempt records how an attempt ended. The raw response stays in the
// cell for diagnosis; nil keeps what is there.
func finishAttempt(ctx context.Context, db execer, attemptID, outcome, reason string, raw []byte) error {
	if len(raw) == 0 {
		raw = nil
	}
	_, err := db.Exec(ctx, `UPDATE attempts SET outcome = $2, reason = nullif($3, ''),
			raw_response = coalesce($4, raw_response), finished_at = coalesce(finished_at, now())
		WHERE id = $1`, attemptID, outcome, Text(reason), raw)
	if err != nil {
		return fmt.Errorf("store: finish attempt %s: %w", attemptID, err)
	}
	return nil
}

// Attempts lists a work item's attempts in order.
func (s *Store) Attempts(ctx context.Context, workID string) ([]Attempt, error) {
	rows, err := s.pool.Query(ctx, `SELECT id::text, work_id, tenant_id, number, coalesce(outcome, 'running'),
			coalesce(reason, ''), started_at, finished_at, coalesce(part, '')
		FROM attempts WHERE work_id = $1 ORDER BY number, call NULLS FIRST`, workID)
	if err != nil {
		return nil, fmt.Errorf("store: attempts %s: %w", workID, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Attempt, error) {
		var a Attempt
		err := r.Scan(&a.ID, &a.WorkID, &a.TenantID, &a.Number, &a.Outcome, &a.Reason, &a.StartedAt, &a.FinishedAt, &a.Part)
		return a, err
	})
}

// MarkStale records that an attempt's answer came from a lease that is no
// longer the work's. The attempt that decided the work keeps its verdict,
// and an attempt already marked is left alone: marked says whether this
// call changed it.
func (s *Store) MarkStale(ctx context.Context, attemptID string) (marked bool, err error) {
	return markLost(ctx, s.pool, attemptID)
}

// Text makes s storable in a text column: bytes that are not UTF-8 and NUL
// become U+FFFD. It is for what the cell writes about its work (reasons,
// notes), never for what it must keep exactly (an input is refused at the
// edge, a raw answer is kept as bytes).
func Text(s string) string {
	if utf8.ValidString(s) && !strings.ContainsRune(s, 0) {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}
