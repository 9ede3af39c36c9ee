package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Circuit states.
const (
	CircuitClosed = "closed" // calls go out
	CircuitOpen   = "open"   // the provider failed call after call; one probe per interval
)

// Circuit is the cell's circuit breaker for one model, shared by the cell's
// classifiers.
type Circuit struct {
	Model string
	State string
	// Since is when it last changed state.
	Since time.Time
	// Failures are the consecutive transport failures that opened it, and
	// LastError the last one's error.
	Failures  int
	LastError string
	// Probes counts the probe calls made since it opened; the next is due
	// at NextProbeAt, and the one after waits ProbeEvery.
	Probes      int
	ProbeEvery  time.Duration
	NextProbeAt time.Time
	UpdatedAt   time.Time
}

const circuitColumns = `model, state, since, failures, coalesce(last_error, ''), probes,
	coalesce(extract(epoch FROM probe_every), 0)::float8, coalesce(next_probe_at, 'epoch'), updated_at`

func scanCircuit(row pgx.Row, extra ...any) (Circuit, error) {
	var c Circuit
	var every float64
	err := row.Scan(append([]any{&c.Model, &c.State, &c.Since, &c.Failures, &c.LastError, &c.Probes, &every, &c.NextProbeAt,
		&c.UpdatedAt}, extra...)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, ErrNotFound
	}
	c.ProbeEvery = time.Duration(every * float64(time.Second))
	if c.NextProbeAt.Unix() == 0 {
		c.NextProbeAt = time.Time{}
	}
	return c, err
}

// The circuit's times are the classifier's clock, now, passed in: the
// classifiers of a cell keep one time between them.

// OpenCircuit opens the model's circuit after failures consecutive
// transport failures, the first probe due probeEvery after now. A circuit
// another classifier opened already stays as it is. It returns the circuit
// and whether this call opened it.
func (s *Store) OpenCircuit(ctx context.Context, model string, failures int, lastErr string, probeEvery time.Duration,
	now time.Time) (Circuit, bool, error) {
	var opened bool
	c, err := scanCircuit(s.pool.QueryRow(ctx, `INSERT INTO provider_circuits AS c
			(model, state, since, failures, last_error, probes, probe_every, next_probe_at, updated_at)
		VALUES ($1, 'open', $5, $2, $3, 0, $4 * interval '1 microsecond', $5::timestamptz + $4 * interval '1 microsecond', $5)
		ON CONFLICT (model) DO UPDATE SET state = 'open', since = $5, failures = excluded.failures,
			last_error = excluded.last_error, probes = 0, probe_every = excluded.probe_every,
			next_probe_at = excluded.next_probe_at, updated_at = $5
		WHERE c.state = 'closed'
		RETURNING `+circuitColumns+`, true`, model, failures, Text(lastErr), interval(probeEvery), now), &opened)
	if errors.Is(err, ErrNotFound) {
		c, err = s.GetCircuit(ctx, model)
	}
	if err != nil {
		return c, false, fmt.Errorf("store: open circuit %s: %w", model, err)
	}
	return c, opened, nil
}

// ProbeTurn asks for the open circuit's next probe at now. When it is due,
// the caller gets it (turn) and the one after is put off by the interval,
// which doubles up to maxEvery; otherwise the circuit is returned as it is:
// still open with its next probe, or closed by another classifier's probe.
func (s *Store) ProbeTurn(ctx context.Context, model string, maxEvery time.Duration, now time.Time) (c Circuit, turn bool, err error) {
	c, err = scanCircuit(s.pool.QueryRow(ctx, `WITH t AS (
			UPDATE provider_circuits SET probes = probes + 1, next_probe_at = $3::timestamptz + probe_every,
				probe_every = least(probe_every * 2, $2 * interval '1 microsecond'), updated_at = $3
			WHERE model = $1 AND state = 'open' AND next_probe_at <= $3
			RETURNING `+circuitColumns+`, true)
		SELECT * FROM t
		UNION ALL
		SELECT `+circuitColumns+`, false FROM provider_circuits WHERE model = $1 AND NOT EXISTS (SELECT 1 FROM t)`,
		model, interval(maxEvery), now), &turn)
	if errors.Is(err, ErrNotFound) {
		return Circuit{Model: model, State: CircuitClosed}, false, nil
	}
	if err != nil {
		return c, false, fmt.Errorf("store: probe turn %s: %w", model, err)
	}
	return c, turn, nil
}

// CloseCircuit closes the model's circuit: the provider answered. It
// reports whether this call closed it.
func (s *Store) CloseCircuit(ctx context.Context, model string, now time.Time) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE provider_circuits SET state = 'closed', since = $2, next_probe_at = NULL,
			updated_at = $2
		WHERE model = $1 AND state = 'open'`, model, now)
	if err != nil {
		return false, fmt.Errorf("store: close circuit %s: %w", model, err)
	}
	return tag.RowsAffected() == 1, nil
}

// GetCircuit reads the model's circuit; a model never opened is closed.
func (s *Store) GetCircuit(ctx context.Context, model string) (Circuit, error) {
	c, err := scanCircuit(s.pool.QueryRow(ctx, `SELECT `+circuitColumns+` FROM provider_circuits WHERE model = $1`, model))
	if errors.Is(err, ErrNotFound) {
		return Circuit{Model: model, State: CircuitClosed}, nil
	}
	return c, err
}

// circuits are every model's circuit the cell has opened at least once.
func circuits(ctx context.Context, q querier) ([]Circuit, error) {
	rows, err := q.Query(ctx, `SELECT `+circuitColumns+` FROM provider_circuits ORDER BY model`)
	if err != nil {
		return nil, fmt.Errorf("store: circuits: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Circuit, error) { return scanCircuit(r) })
}
