package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
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
}

func insertOutbox(ctx context.Context, tx pgx.Tx, msgs []OutboxMsg) error {
	for _, m := range msgs {
		if m.Headers == nil {
			m.Headers = map[string]string{}
		}
		if m.Stream == "" {
			return fmt.Errorf("store: outbox row for %s names no stream", m.Subject)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (stream, subject, msg_id, payload, headers) VALUES ($1, $2, $3, $4, $5)`,
			m.Stream, m.Subject, m.MsgID, m.Payload, m.Headers); err != nil {
			return fmt.Errorf("store: outbox: %w", err)
		}
	}
	return nil
}

// DrainOutbox locks up to limit unpublished messages for the given
// streams, hands them to publish in order and marks the ones it returns as
// published, all in one transaction. Several relays can run at once:
// locked rows are skipped.
func (s *Store) DrainOutbox(ctx context.Context, limit int, streams []string, publish func([]OutboxMsg) (published int, err error)) (int, error) {
	n := 0
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id, stream, subject, msg_id, payload, headers FROM outbox
			WHERE published_at IS NULL AND stream = ANY($2)
			ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`, limit, streams)
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
		n, err = publish(msgs)
		if n > 0 {
			ids := make([]int64, n)
			for i := range n {
				ids[i] = msgs[i].ID
			}
			if _, uerr := tx.Exec(ctx, `UPDATE outbox SET published_at = now() WHERE id = ANY($1)`, ids); uerr != nil {
				return uerr
			}
		}
		// Keep what was published marked even if a later message failed.
		if err != nil && n == 0 {
			return err
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("store: drain outbox: %w", err)
	}
	return n, nil
}

// PendingOutbox counts unpublished messages.
func (s *Store) PendingOutbox(ctx context.Context) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&n)
	return n, err
}
