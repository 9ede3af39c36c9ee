package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"assay.dev/pkg/event"
)

// OutboxMsg is one message to publish once the transaction that wrote it
// has committed.
type OutboxMsg struct {
	ID int64
	// Stream is the kind of stream the message goes to (WORK, RESULT, …);
	// relays and the ledger's reaper select rows by it.
	Stream  string
	Subject string
	MsgID   string
	Payload []byte
	Headers map[string]string
	// NoRow: the message has no outbox row. Its process publishes it once
	// it has committed (Relay.Send), and what the broker loses of it is
	// found again from the state it announces (the sweeper announces
	// queued work whose announcement is gone, the reapers read back an
	// attempt's or a commit's event), so no row has to be written,
	// published and dated for it.
	NoRow bool
}

// NoRows marks msgs as messages with no row (NoRow) and returns them.
func NoRows(msgs []OutboxMsg) []OutboxMsg {
	for i := range msgs {
		msgs[i].NoRow = true
	}
	return msgs
}

func insertOutbox(ctx context.Context, tx pgx.Tx, msgs []OutboxMsg) error {
	if len(msgs) == 0 {
		return nil
	}
	var ob outboxRows
	if err := ob.add("", msgs); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, outboxInsert(1, "true"), ob.args()...); err != nil {
		return fmt.Errorf("store: outbox: %w", err)
	}
	return nil
}

// Sent is what publishing one outbox row did.
type Sent struct {
	// Err is nil when the row was published.
	Err error
	// Permanent marks an error no retry can mend (the row is larger than
	// the broker takes): the row is set aside at once.
	Permanent bool
}

// SetAsidePolicy bounds how long a row that fails to publish is tried.
type SetAsidePolicy struct {
	// MaxTries is how many failed publishes set a row aside. Default 5.
	MaxTries int
	// Grace is how long after its first failure a row is still tried,
	// whatever its tries, so a broker that restarts sets nothing aside.
	// Default 30s.
	Grace time.Duration
}

func (p SetAsidePolicy) withDefaults() SetAsidePolicy {
	if p.MaxTries <= 0 {
		p.MaxTries = 5
	}
	if p.Grace == 0 {
		p.Grace = 30 * time.Second
	}
	return p
}

// Drained is what one DrainOutbox did.
type Drained struct {
	Published int
	// Failed rows stay for the next drain, SetAside ones are out of it.
	Failed, SetAside []FailedMsg
}

// FailedMsg is a row that failed to publish.
type FailedMsg struct {
	OutboxMsg
	Tries int
	Err   string
}

// DrainOutbox locks up to limit pending rows of the given streams, written
// at least olderThan ago, and hands them to publish in order, in one
// transaction. publish answers for each
// row it tried, in order; a shorter answer means it stopped (the broker is
// unreachable) and the rest wait untouched. Published rows are marked;
// a failed row counts a try and, past the policy, is set aside, and the
// rows after it still go out. Several relays can run at once: locked rows
// are skipped.
func (s *Store) DrainOutbox(ctx context.Context, limit int, streams []string, olderThan time.Duration, policy SetAsidePolicy,
	publish func([]OutboxMsg) []Sent) (Drained, error) {
	policy = policy.withDefaults()
	var d Drained
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		d = Drained{}
		rows, err := tx.Query(ctx, `SELECT o.id, o.stream, o.subject, o.msg_id, o.payload, o.headers
			FROM outbox_waiting q JOIN outbox o ON o.id = q.id
			WHERE q.set_aside_at IS NULL AND q.stream = ANY($2)
				AND ($3::bigint = 0 OR o.created_at <= now() - $3::bigint * interval '1 microsecond')
			ORDER BY q.id LIMIT $1 FOR UPDATE OF q SKIP LOCKED`, limit, streams, interval(olderThan))
		if err != nil {
			return err
		}
		msgs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OutboxMsg, error) {
			var m OutboxMsg
			err := r.Scan(&m.ID, &m.Stream, &m.Subject, &m.MsgID, &m.Payload, &m.Headers)
			return m, err
		})
		if err != nil || len(msgs) == 0 {
			return err
		}
		sent := publish(msgs)
		var published []int64
		for i, r := range sent[:min(len(sent), len(msgs))] {
			if r.Err == nil {
				published = append(published, msgs[i].ID)
				continue
			}
			f := FailedMsg{OutboxMsg: msgs[i], Err: Text(r.Err.Error())}
			var aside bool
			if err := tx.QueryRow(ctx, `UPDATE outbox_waiting SET tries = tries + 1, last_error = $2,
					first_failed_at = coalesce(first_failed_at, now()),
					set_aside_at = CASE WHEN $3 OR (tries + 1 >= $4 AND coalesce(first_failed_at, now()) <= now() - $5 * interval '1 microsecond')
						THEN now() END
				WHERE id = $1 RETURNING tries, set_aside_at IS NOT NULL`,
				f.ID, f.Err, r.Permanent, policy.MaxTries, interval(policy.Grace)).Scan(&f.Tries, &aside); err != nil {
				return err
			}
			if aside {
				d.SetAside = append(d.SetAside, f)
			} else {
				d.Failed = append(d.Failed, f)
			}
		}
		if len(published) > 0 {
			// The time of this statement, not of the transaction's start: the
			// rows were read by a later statement than the start, and may have
			// been written after it, so now() could date their publishing
			// before the work they announce was made.
			if _, err := tx.Exec(ctx, `WITH sent AS (DELETE FROM outbox_waiting WHERE id = ANY($1) RETURNING id)
				UPDATE outbox SET published_at = statement_timestamp() WHERE id IN (SELECT id FROM sent)`, published); err != nil {
				return err
			}
		}
		d.Published = len(published)
		return nil
	})
	if err != nil {
		return Drained{}, fmt.Errorf("store: drain outbox: %w", err)
	}
	return d, nil
}

// Published is an outbox row sent without being read back, named by its
// stream and message id (one message to the broker, which keeps one copy
// of each id), and when the broker took it.
type Published struct {
	Stream, MsgID string
	At            time.Time
}

// MarkPublished marks rows published that a relay was handed by the
// process that wrote them; a row is dated when the broker took it, never
// before it was written. A row marked already stays as it is. It returns
// how many rows it marked.
func (s *Store) MarkPublished(ctx context.Context, sent []Published) (int64, error) {
	streams, ids, at := make([]string, len(sent)), make([]string, len(sent)), make([]time.Time, len(sent))
	for i, p := range sent {
		streams[i], ids[i], at[i] = p.Stream, p.MsgID, p.At
	}
	// Its wait ends first, then the row is dated: the order in which a
	// drain takes the two, so neither waits for the other in a cycle.
	tag, err := s.pool.Exec(ctx, `WITH m AS (
			SELECT * FROM unnest($1::text[], $2::text[], $3::timestamptz[]) AS m(stream, msg_id, at)
		), sent AS (
			DELETE FROM outbox_waiting q USING outbox o, m
			WHERE o.msg_id = m.msg_id AND o.stream = m.stream AND q.id = o.id
			RETURNING q.id, m.at
		)
		UPDATE outbox o SET published_at = greatest(sent.at, o.created_at) FROM sent WHERE o.id = sent.id`, streams, ids, at)
	if err != nil {
		return 0, fmt.Errorf("store: mark outbox rows published: %w", err)
	}
	return tag.RowsAffected(), nil
}

// SetAsideRow is a set-aside outbox row as the operator sees it.
type SetAsideRow struct {
	ID        int64     `json:"id"`
	Stream    string    `json:"stream"`
	Subject   string    `json:"subject"`
	MsgID     string    `json:"msgId"`
	Bytes     int       `json:"bytes"`
	Tries     int       `json:"tries"`
	LastError string    `json:"lastError"`
	CreatedAt time.Time `json:"createdAt"`
	SetAside  time.Time `json:"setAsideAt"`
}

// SetAsideRows lists up to limit set-aside rows, oldest first.
func (s *Store) SetAsideRows(ctx context.Context, limit int) ([]SetAsideRow, error) {
	rows, err := s.pool.Query(ctx, `SELECT o.id, o.stream, o.subject, o.msg_id, length(o.payload), q.tries, coalesce(q.last_error, ''),
			o.created_at, q.set_aside_at
		FROM outbox_waiting q JOIN outbox o ON o.id = q.id WHERE q.set_aside_at IS NOT NULL ORDER BY q.id LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("store: set-aside rows: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (SetAsideRow, error) {
		var x SetAsideRow
		err := r.Scan(&x.ID, &x.Stream, &x.Subject, &x.MsgID, &x.Bytes, &x.Tries, &x.LastError, &x.CreatedAt, &x.SetAside)
		return x, err
	})
}

// RetrySetAside puts set-aside rows back in the queue with their tries
// cleared: the ids given, or every one when ids is empty. It returns how
// many it put back.
func (s *Store) RetrySetAside(ctx context.Context, ids []int64) (int64, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE outbox_waiting SET set_aside_at = NULL, tries = 0, first_failed_at = NULL
		WHERE set_aside_at IS NOT NULL AND (coalesce(cardinality($1::bigint[]), 0) = 0 OR id = ANY($1))`, ids)
	if err != nil {
		return 0, fmt.Errorf("store: retry set-aside rows: %w", err)
	}
	return tag.RowsAffected(), nil
}

// PendingOutbox counts unpublished messages.
func (s *Store) PendingOutbox(ctx context.Context) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_waiting WHERE set_aside_at IS NULL`).Scan(&n)
	return n, err
}

// Retention says how long a cell keeps what it no longer needs.
type Retention struct {
	// Outbox is how long a published outbox row is kept (the ledger's
	// reaper reads ATTEMPT events back from it, so it must outlast the
	// reaper's horizon). An OUTCOME row is kept longer while the
	// committer's reaper may still read it: until it is older than the
	// point before the cell's outcome mark where that reading starts.
	Outbox time.Duration
	// Data is how long work inputs and raw answers are kept after the work
	// ended; then they are removed, and the rows that say what happened
	// stay.
	Data time.Duration
	// Limit bounds the rows one pass touches per table.
	Limit int
}

// Purged counts what one Purge removed.
type Purged struct {
	Outbox, Inputs, Answers int64
}

// Purge removes published outbox rows older than r.Outbox (OUTCOME rows
// only once the committer's reaper reads no further back), and the inputs
// and raw answers of work that ended more than r.Data ago.
func (s *Store) Purge(ctx context.Context, r Retention) (Purged, error) {
	var p Purged
	since, err := s.readBackSince(ctx)
	if err != nil {
		return p, err
	}
	steps := []struct {
		n    *int64
		sql  string
		age  time.Duration
		more []any
	}{
		// Stream by stream through the index of when rows were written: a
		// row published before the cut was written before it too.
		{&p.Outbox, `WITH RECURSIVE kinds AS (
				SELECT min(stream) AS stream FROM outbox
				UNION ALL
				SELECT (SELECT min(stream) FROM outbox WHERE stream > kinds.stream) FROM kinds WHERE kinds.stream IS NOT NULL
			)
			DELETE FROM outbox WHERE id IN (SELECT old.id FROM kinds, LATERAL (
				SELECT id FROM outbox o WHERE o.stream = kinds.stream AND o.created_at < now() - $1 * interval '1 microsecond'
					AND o.published_at < now() - $1 * interval '1 microsecond'
					AND (o.stream <> '` + event.KindOutcome + `' OR o.created_at < $3)
				ORDER BY o.created_at LIMIT $2) old LIMIT $2)`, r.Outbox, []any{since}},
		{&p.Answers, `UPDATE attempts SET raw_response = NULL WHERE id IN (SELECT a.id FROM attempts a JOIN work w ON w.id = a.work_id
			WHERE a.raw_response IS NOT NULL AND w.state NOT IN ('queued', 'running', 'elsewhere')
				AND w.updated_at < now() - $1 * interval '1 microsecond' LIMIT $2)`, r.Data, nil},
		{&p.Inputs, `UPDATE work SET input = '' WHERE id IN (SELECT id FROM work
			WHERE input <> '' AND state NOT IN ('queued', 'running', 'elsewhere') AND updated_at < now() - $1 * interval '1 microsecond' LIMIT $2)`, r.Data, nil},
	}
	for _, st := range steps {
		tag, err := s.pool.Exec(ctx, st.sql, append([]any{interval(st.age), r.Limit}, st.more...)...)
		if err != nil {
			return p, fmt.Errorf("store: purge: %w", err)
		}
		*st.n = tag.RowsAffected()
	}
	return p, nil
}

// outboxRows are messages as the arrays one INSERT … SELECT FROM unnest
// takes, each message with a tag the statement can choose rows by.
type outboxRows struct {
	streams, subjects, ids, headers, tags []string
	payloads                              [][]byte
}

// add appends msgs under tag, but for those with no row (NoRow), which
// their process publishes once the statement has committed.
func (o *outboxRows) add(tag string, msgs []OutboxMsg) error {
	for _, m := range msgs {
		if m.NoRow {
			continue
		}
		if m.Stream == "" {
			return fmt.Errorf("store: outbox row for %s names no stream", m.Subject)
		}
		h := m.Headers
		if h == nil {
			h = map[string]string{}
		}
		b, err := json.Marshal(h)
		if err != nil {
			return fmt.Errorf("store: outbox headers: %w", err)
		}
		o.streams, o.subjects, o.ids = append(o.streams, m.Stream), append(o.subjects, m.Subject), append(o.ids, m.MsgID)
		o.payloads, o.headers, o.tags = append(o.payloads, m.Payload), append(o.headers, string(b)), append(o.tags, tag)
	}
	return nil
}

// args are the six arrays, in the order outboxInsert's placeholders take.
func (o *outboxRows) args() []any {
	return []any{o.streams, o.subjects, o.ids, o.payloads, o.headers, o.tags}
}

// outboxInsert is an INSERT of the rows passed as the six arrays from
// placeholder $first on, keeping those whose tag cond admits (cond names
// the tag m.tag).
func outboxInsert(first int, cond string) string {
	return fmt.Sprintf(`INSERT INTO outbox (stream, subject, msg_id, payload, headers)
		SELECT m.stream, m.subject, m.msg_id, m.payload, m.headers::jsonb
		FROM unnest($%d::text[], $%d::text[], $%d::text[], $%d::bytea[], $%d::text[], $%d::text[])
			AS m(stream, subject, msg_id, payload, headers, tag)
		WHERE %s`, first, first+1, first+2, first+3, first+4, first+5, cond)
}
