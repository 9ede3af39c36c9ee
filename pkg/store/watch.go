package store

import (
	"context"
	"fmt"
	"time"
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
	ViewAccepted    = "accepted"     // accepted, nothing for a person to look at
	ViewNeedsReview = "needs_review" // accepted, and the answer asks for a person
	ViewRejected    = "rejected"     // schema_rejected: the model's answers failed the gate
	ViewTerminal    = "terminal"     // every other outcome: expired, exhausted, dropped, superseded, …
)

// Views counts the work created in the last window by what a reviewer
// sees: running, accepted, ready for human review (an accepted answer that
// asks for one: needsHumanReview, a blocking finding, a high severity),
// validation-rejected, or otherwise terminal.
func (s *Store) Views(ctx context.Context, window time.Duration) (map[string]int64, error) {
	return s.ViewsOf(ctx, window, "")
}

// ViewsOf is Views of one tenant's work; tenant "" counts the whole cell's.
func (s *Store) ViewsOf(ctx context.Context, window time.Duration, tenant string) (map[string]int64, error) {
	return viewsOf(ctx, s.pool, window, tenant)
}

func viewsOf(ctx context.Context, q querier, window time.Duration, tenant string) (map[string]int64, error) {
	// A person's resolution of the work's review item decides for it:
	// approved or dismissed is accepted, rejected is rejected, and an
	// answer a person published from the review screen (approved or
	// amended) is accepted whatever the work's own outcome.
	rows, err := q.Query(ctx, `SELECT CASE
			WHEN w.state IN ('queued', 'running') THEN 'running'
			WHEN v.output IS NOT NULL THEN 'accepted'
			WHEN w.state = 'accepted' AND v.verdict = 'rejected' THEN 'rejected'
			WHEN w.state = 'accepted' AND v.state IS DISTINCT FROM 'resolved' AND (r.output->>'needsHumanReview' = 'true'
				OR r.output @> '{"findings": [{"severity": "blocking"}]}' OR r.output->>'severity' = 'high') THEN 'needs_review'
			WHEN w.state = 'accepted' THEN 'accepted'
			WHEN w.state = 'schema_rejected' THEN 'rejected'
			ELSE 'terminal' END AS view, count(*)
		FROM work w LEFT JOIN results r ON r.work_id = w.id LEFT JOIN reviews v ON v.work_id = w.id
		WHERE w.created_at > now() - $1 * interval '1 microsecond' AND ($2 = '' OR w.tenant_id = $2)
		GROUP BY 1`, interval(window), tenant)
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
