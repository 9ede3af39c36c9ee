package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"assay.dev/pkg/event"
)

// The ledger reaper's queries. The broker carries ATTEMPT events, but
// Postgres holds what they say: the attempt row, and the event itself,
// written in the statement that finished the attempt on the attempt's row
// (or, for the events of some paths and of earlier releases, as an outbox
// row). So an event the broker lost is read back from there, and an
// attempt whose worker died before it could write either still becomes a
// ledger row, estimated.

// DeadAttempt is an attempt whose worker will not report: it claimed the
// work (and so, a moment later, called the model) and then its lease went
// to another attempt, lapsed, or the work ended without it.
type DeadAttempt struct {
	AttemptID string
	WorkID    string
	TenantID  string
	Number    int
	StartedAt time.Time
	// ChargeMicros is what it is charged: its unsettled budget reservation,
	// or the estimate it was claimed with, whichever is larger.
	ChargeMicros int64
	// Model is the model another attempt of the same work reported, or
	// "unknown".
	Model string
}

// DeadAttempts finds up to limit attempts without an outcome of their own
// (none, or lease_expired from the next claim) that started more than grace
// ago, whose lease is no longer live (taken by another attempt, or lapsed
// more than grace ago), and that have neither a ledger row nor an ATTEMPT
// event in the outbox. Those still without an outcome are marked
// lease_expired, as the next claim would have done.
func (s *Store) DeadAttempts(ctx context.Context, grace time.Duration, limit int) ([]DeadAttempt, error) {
	rows, err := s.pool.Query(ctx, `WITH dead AS (
			SELECT a.id FROM attempts a JOIN work w ON w.id = a.work_id
			WHERE (a.outcome IS NULL OR a.outcome = 'lease_expired') AND a.part IS DISTINCT FROM '*'
				AND a.started_at < now() - $1 * interval '1 microsecond'
				AND NOT (w.state = 'running' AND w.lease_token = a.lease_token
					AND w.lease_expires_at > now() - $1 * interval '1 microsecond')
				AND NOT EXISTS (SELECT 1 FROM ledger l WHERE l.attempt_id = a.id)
				AND a.event IS NULL
				AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.msg_id = a.id::text)
			ORDER BY a.started_at LIMIT $2
		), marked AS (
			UPDATE attempts a SET outcome = 'lease_expired',
				reason = 'the worker never reported back and its lease is gone',
				finished_at = coalesce(a.finished_at, now())
			FROM dead WHERE a.id = dead.id AND a.outcome IS NULL
			RETURNING a.id
		)
		SELECT a.id::text, a.work_id, a.tenant_id, a.number, a.started_at,
			greatest(a.estimate_micros, coalesce((SELECT r.amount_micros FROM budget_reservations r
				WHERE r.attempt_id = a.id AND r.settled_at IS NULL), 0)),
			coalesce((SELECT l.model FROM ledger l WHERE l.work_id = a.work_id AND NOT l.estimated LIMIT 1), 'unknown')
		FROM attempts a JOIN dead ON dead.id = a.id
		ORDER BY a.started_at`, interval(grace), limit)
	if err != nil {
		return nil, fmt.Errorf("store: dead attempts: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadAttempt, error) {
		var d DeadAttempt
		err := r.Scan(&d.AttemptID, &d.WorkID, &d.TenantID, &d.Number, &d.StartedAt, &d.ChargeMicros, &d.Model)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: dead attempts: %w", err)
	}
	return out, nil
}

// UnrecordedEvents returns the payloads of up to limit events of the
// given stream (the cell's ATTEMPT events) written within horizon and
// published more than grace ago (an event kept on its attempt's row:
// recorded more than grace ago), oldest first, of an attempt that made a
// call (event.NoCallHeader) and has no ledger row: events the broker
// acknowledged and then lost (a purged stream, a store lost with its node),
// that its worker never got to publish, or that nobody consumed. Such
// events carry their attempt id as their message id.
func (s *Store) UnrecordedEvents(ctx context.Context, stream string, grace, horizon time.Duration, limit int) ([][]byte, error) {
	rows, err := s.pool.Query(ctx, `SELECT e.payload FROM (
			SELECT o.payload, o.created_at AS at FROM outbox o
			WHERE o.stream = $1
				AND o.created_at > now() - $3 * interval '1 microsecond'
				AND o.published_at < now() - $2 * interval '1 microsecond'
				AND NOT o.headers ? '`+event.NoCallHeader+`'
				AND NOT EXISTS (SELECT 1 FROM ledger l WHERE l.attempt_id = o.msg_id::uuid)
			UNION ALL
			SELECT a.event, a.finished_at FROM attempts a
			WHERE $1 = '`+event.KindAttempt+`' AND a.event_call
				AND a.finished_at > now() - $3 * interval '1 microsecond'
				AND a.finished_at < now() - $2 * interval '1 microsecond'
				AND NOT EXISTS (SELECT 1 FROM ledger l WHERE l.attempt_id = a.id)
		) e ORDER BY e.at LIMIT $4`,
		stream, interval(grace), interval(horizon), limit)
	if err != nil {
		return nil, fmt.Errorf("store: unrecorded events: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		return nil, fmt.Errorf("store: unrecorded events: %w", err)
	}
	return out, nil
}

// ReleaseOrphanReservations returns reservations older than grace whose
// attempt was never recorded: the worker died between reserving and
// claiming, or a claim that lost did not get to release. It returns how
// many it released.
func (s *Store) ReleaseOrphanReservations(ctx context.Context, grace time.Duration) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `WITH gone AS (
			DELETE FROM budget_reservations r
			WHERE r.settled_at IS NULL AND r.created_at < now() - $1 * interval '1 microsecond'
				AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.id = r.attempt_id)
			RETURNING tenant_id, period_start, amount_micros
		), sums AS (
			SELECT tenant_id, period_start, sum(amount_micros) AS amount, count(*) AS n FROM gone GROUP BY 1, 2
		), upd AS (
			UPDATE budget_periods p SET reserved_micros = p.reserved_micros - sums.amount
			FROM sums WHERE p.tenant_id = sums.tenant_id AND p.period_start = sums.period_start
		)
		SELECT coalesce(sum(n), 0) FROM sums`, interval(grace)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("store: release orphan reservations: %w", err)
	}
	return n, nil
}

// UncommittedResults returns the payloads of up to limit RESULT events of
// the given stream published more than grace ago, however long ago, whose
// answer still waits for its verdict: the attempt handed its work to the
// committer, holds the lease, and the work has no outcome. These are events
// the broker acknowledged and then lost, or that no committer was up to
// take; without them the work would wait out its handoff lease and be paid
// for again.
func (s *Store) UncommittedResults(ctx context.Context, stream string, grace time.Duration, limit int) ([][]byte, error) {
	// From the work that runs, which is what is in flight, not from the
	// events: a pass costs what the cell has in hand, however many results
	// were published since the one it reads, so it needs no bound on their
	// age. An ATTEMPT event kept on its attempt's row counts as published
	// when the attempt was recorded.
	rows, err := s.pool.Query(ctx, `SELECT coalesce(o.payload, a.event) FROM work w
		JOIN attempts a ON a.work_id = w.id AND a.lease_token = w.lease_token
		LEFT JOIN outbox o ON o.msg_id = a.id::text AND o.stream = $1
			AND o.published_at < now() - $2 * interval '1 microsecond'
		WHERE w.state = 'running'
			AND a.outcome IN ('ok', 'invalid_output')
			AND (o.id IS NOT NULL OR ($1 = '`+event.KindAttempt+`' AND a.event IS NOT NULL
				AND a.finished_at < now() - $2 * interval '1 microsecond'))
		ORDER BY coalesce(o.created_at, a.finished_at) LIMIT $3`,
		stream, interval(grace), limit)
	if err != nil {
		return nil, fmt.Errorf("store: uncommitted results: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		return nil, fmt.Errorf("store: uncommitted results: %w", err)
	}
	return out, nil
}
