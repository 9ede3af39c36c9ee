package store

import (
	"context"
	"fmt"
	"time"
)

// The outcome mark. Every outcome the publisher owes is found by the
// committer's reaper however long ago it was announced: the cell keeps one
// point in time, its outcome mark, before which every outcome has what the
// publisher records for it (a publication, pending, failed or skipped) or
// is no longer the one its work publishes. The reaper reads from a little
// before the mark and moves the mark up to the oldest outcome still owed,
// so a pass reads what was announced since the outcomes last settled:
// moments in the ordinary run, the whole outage after a committer was
// down. An outcome is dated by its OUTCOME outbox row's created_at, or,
// for a commit's outcome, which has no row, by its work row's updated_at:
// both columns the reaper reads by an index.

// markSlack is how far before the outcome mark the reaper reads. An
// outcome is dated by the start of the transaction that wrote it, so one
// that committed just after the mark moved may be dated a little before
// the mark; no transaction that announces an outcome runs this long.
const markSlack = 10 * time.Minute

// outboxOutcomes is an OUTCOME outbox row o joined to its work w and to
// the work's review v when a person published an answer from it.
const outboxOutcomes = `outbox o JOIN work w ON w.id = split_part(o.msg_id, '.', 1)
			LEFT JOIN reviews v ON v.work_id = w.id AND v.output IS NOT NULL`

// owedInOutbox is the condition on outboxOutcomes that the row carries the
// outcome its work publishes now (its state's, or reviewed once a person
// published an answer), that something may be published for the work, and
// that the publisher recorded nothing for that outcome.
const owedInOutbox = `o.stream = 'OUTCOME'
				AND split_part(o.msg_id, '.', 2) = CASE WHEN v.work_id IS NULL THEN w.state ELSE 'reviewed' END
				AND ` + publishable + `
				AND NOT EXISTS (SELECT 1 FROM publications p WHERE p.work_id = w.id AND p.outcome = split_part(o.msg_id, '.', 2))`

// readBackSince is when the reaper's reading starts: markSlack before the
// cell's outcome mark. It is read on its own and passed to the queries as
// a value, so that their plans are made for the range it gives.
func (s *Store) readBackSince(ctx context.Context) (time.Time, error) {
	var since time.Time
	if err := s.pool.QueryRow(ctx, `SELECT at - $1 * interval '1 microsecond' FROM outcome_mark`,
		interval(markSlack)).Scan(&since); err != nil {
		return since, fmt.Errorf("store: outcome mark: %w", err)
	}
	return since, nil
}

// AdvanceOutcomeMark moves the cell's outcome mark up to the oldest
// outcome the publisher still owes, or to now when it owes none, and
// returns the mark. The committer's reaper calls it after each pass, once
// the outcomes it read back have their rows. An outcome still owed is one
// announced and not yet recorded (maybe within the reaper's grace) or one
// whose OUTCOME row waits to be sent; a row its relay set aside for good
// does not hold the mark. The mark never moves back, so reapers of the
// cell may move it at once.
func (s *Store) AdvanceOutcomeMark(ctx context.Context) (time.Time, error) {
	since, err := s.readBackSince(ctx)
	if err != nil {
		return since, err
	}
	// least ignores a part that owes nothing: with neither, the mark is
	// now.
	var at time.Time
	err = s.pool.QueryRow(ctx, `UPDATE outcome_mark SET at = greatest(at, least(now(),
			(SELECT o.created_at FROM `+outboxOutcomes+`
				WHERE o.created_at > $1 AND `+owedInOutbox+`
					AND NOT EXISTS (SELECT 1 FROM outbox_waiting q WHERE q.id = o.id AND q.set_aside_at IS NOT NULL)
				ORDER BY o.created_at LIMIT 1),
			(SELECT w.updated_at FROM work w WHERE w.updated_at > $1 AND `+unpublishedCommit+`
				ORDER BY w.updated_at LIMIT 1)))
		RETURNING at`, since).Scan(&at)
	if err != nil {
		return at, fmt.Errorf("store: advance the outcome mark: %w", err)
	}
	return at, nil
}
