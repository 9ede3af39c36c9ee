package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Oldest is, per lane, the age of the oldest work that has no outcome yet.
func (s *Store) Oldest(ctx context.Context) (map[string]time.Duration, error) {
	rows, err := s.pool.Query(ctx, `SELECT lane, extract(epoch FROM now() - min(created_at))::float8
		FROM work WHERE state IN ('queued', 'running') GROUP BY lane`)
	if err != nil {
		return nil, fmt.Errorf("store: oldest: %w", err)
	}
	defer rows.Close()
	out := map[string]time.Duration{}
	for rows.Next() {
		var lane string
		var secs float64
		if err := rows.Scan(&lane, &secs); err != nil {
			return nil, fmt.Errorf("store: oldest: %w", err)
		}
		out[lane] = time.Duration(secs * float64(time.Second))
	}
	return out, rows.Err()
}

// Views of work a reviewer tells apart.
const (
	ViewRunning     = "running"      // queued or running: no outcome yet
	ViewAccepted    = "accepted"     // accepted, or a person published its answer
	ViewNeedsReview = "needs_review" // its review item is open: a person can act on it
	ViewRejected    = "rejected"     // schema_rejected, or a person rejected its answer
	ViewTerminal    = "terminal"     // every other outcome: expired, exhausted, dropped, superseded, …
)

// viewCase is the view of work w with review item v (NULLs when it has
// none), the one reading of a work's state that the views, the work API
// and the console share: an open review item needs review whatever the
// work's state; a person's resolution decides for the work (an answer
// published from the review screen is accepted, a rejection rejected);
// otherwise the work's own state.
const viewCase = `CASE
		WHEN v.state = 'open' THEN 'needs_review'
		WHEN w.state IN ('queued', 'running') THEN 'running'
		WHEN v.output IS NOT NULL THEN 'accepted'
		WHEN v.verdict = 'rejected' THEN 'rejected'
		WHEN w.state = 'accepted' THEN 'accepted'
		WHEN w.state = 'schema_rejected' THEN 'rejected'
		ELSE 'terminal' END`

// Views counts the cell's work by what a reviewer sees: needs_review is
// every open review item, the queue a person works through, however old;
// the other four count the work created in the last window that has no
// open item: running, accepted, rejected or otherwise terminal.
func (s *Store) Views(ctx context.Context, window time.Duration) (map[string]int64, error) {
	return s.ViewsOf(ctx, window, "")
}

// ViewsOf is Views of one tenant's work; tenant "" counts the whole cell's.
func (s *Store) ViewsOf(ctx context.Context, window time.Duration, tenant string) (map[string]int64, error) {
	return viewsOf(ctx, s.pool, window, tenant)
}

func viewsOf(ctx context.Context, q querier, window time.Duration, tenant string) (map[string]int64, error) {
	rows, err := q.Query(ctx, `SELECT view, count(*) FROM (
			SELECT `+viewCase+` AS view
			FROM work w LEFT JOIN reviews v ON v.work_id = w.id
			WHERE w.created_at > now() - $1 * interval '1 microsecond' AND ($2 = '' OR w.tenant_id = $2)
				AND v.state IS DISTINCT FROM 'open'
			UNION ALL
			SELECT 'needs_review' FROM reviews v WHERE v.state = 'open' AND ($2 = '' OR v.tenant_id = $2)
		) x GROUP BY 1`, interval(window), tenant)
	if err != nil {
		return nil, fmt.Errorf("store: views: %w", err)
	}
	defer rows.Close()
	out := map[string]int64{ViewRunning: 0, ViewAccepted: 0, ViewNeedsReview: 0, ViewRejected: 0, ViewTerminal: 0}
	for rows.Next() {
		var view string
		var n int64
		if err := rows.Scan(&view, &n); err != nil {
			return nil, fmt.Errorf("store: views: %w", err)
		}
		out[view] = n
	}
	return out, rows.Err()
}

// ViewOf is the view of one work item, as Views counts it.
func (s *Store) ViewOf(ctx context.Context, workID string) (string, error) {
	var view string
	err := s.pool.QueryRow(ctx, `SELECT `+viewCase+` FROM work w LEFT JOIN reviews v ON v.work_id = w.id
		WHERE w.id = $1`, workID).Scan(&view)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("store: view of %s: %w", workID, err)
	}
	return view, nil
}

// OutboxBacklog is one stream's unpublished outbox rows.
type OutboxBacklog struct {
	Pending  int64         // waiting for their relay
	Oldest   time.Duration // age of the oldest of them, 0 when none
	SetAside int64         // set aside, waiting for an operator
}

// Outbox is the unpublished outbox rows per stream kind (WORK, RESULT,
// ATTEMPT). Every kind is in the map, at zero when it has none.
func (s *Store) Outbox(ctx context.Context) (map[string]OutboxBacklog, error) {
	// Waiting and set-aside rows apart, each through its own partial index.
	rows, err := s.pool.Query(ctx, `SELECT stream, sum(pending)::bigint, max(oldest)::float8, sum(aside)::bigint FROM (
			SELECT q.stream, count(*) AS pending, coalesce(extract(epoch FROM now() - min(o.created_at)), 0) AS oldest, 0 AS aside
			FROM outbox_waiting q JOIN outbox o ON o.id = q.id WHERE q.set_aside_at IS NULL GROUP BY q.stream
			UNION ALL
			SELECT stream, 0, 0, count(*) FROM outbox_waiting WHERE set_aside_at IS NOT NULL GROUP BY stream
		) o GROUP BY stream`)
	if err != nil {
		return nil, fmt.Errorf("store: outbox backlog: %w", err)
	}
	defer rows.Close()
	out := map[string]OutboxBacklog{"WORK": {}, "RESULT": {}, "ATTEMPT": {}}
	for rows.Next() {
		var stream string
		var b OutboxBacklog
		var secs float64
		if err := rows.Scan(&stream, &b.Pending, &secs, &b.SetAside); err != nil {
			return nil, fmt.Errorf("store: outbox backlog: %w", err)
		}
		b.Oldest = time.Duration(secs * float64(time.Second))
		out[stream] = b
	}
	return out, rows.Err()
}
