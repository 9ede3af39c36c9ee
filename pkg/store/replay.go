package store

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"assay.dev/pkg/outcome"
)

// WorkFilter selects work rows for a listing. Zero fields select all.
type WorkFilter struct {
	State, Tenant, Lane string
	// SourceID, when set, keeps the work of that source alone.
	SourceID string
	// States, when not empty, keeps work in any of them (beside State).
	States []string
	// Since and Until bound created_at: since inclusive, until exclusive.
	Since, Until time.Time
	// After is the listing's cursor: rows created after AfterCreated, or at
	// that time with an id after AfterID.
	AfterCreated time.Time
	AfterID      string
	// Limit is the most rows returned. Default 100, at most 1000.
	Limit int
	// Live leaves out rollouts' shadow work, which its tenant did not ask
	// for.
	Live bool
}

// ListWork lists work in the order it was created, oldest first.
func (s *Store) ListWork(ctx context.Context, f WorkFilter) ([]*Work, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	f.Limit = min(f.Limit, 1000)
	rows, err := s.pool.Query(ctx, `SELECT `+workColumns+` FROM work
		WHERE ($1 = '' OR state = $1) AND ($2 = '' OR tenant_id = $2) AND ($3 = '' OR lane = $3)
			AND ($4::timestamptz IS NULL OR created_at >= $4) AND ($5::timestamptz IS NULL OR created_at < $5)
			AND ($6::timestamptz IS NULL OR (created_at, id) > ($6, $7))
			AND (cardinality($9::text[]) = 0 OR state = ANY($9)) AND (NOT $10 OR shadow_of IS NULL)
			AND ($11 = '' OR source_id = $11)
		ORDER BY created_at, id LIMIT $8`,
		f.State, f.Tenant, f.Lane, sourceTime(f.Since), sourceTime(f.Until), sourceTime(f.AfterCreated), f.AfterID, f.Limit,
		append([]string{}, f.States...), f.Live, f.SourceID)
	if err != nil {
		return nil, fmt.Errorf("store: list work: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Work, error) { return scanWork(r) })
	if err != nil {
		return nil, fmt.Errorf("store: list work: %w", err)
	}
	return out, nil
}

// AttemptAnswer is an attempt with the raw answer the cell kept (nil when
// it kept none, or purged it).
type AttemptAnswer struct {
	Attempt
	Raw []byte
}

// AttemptAnswers lists a work item's attempts in order, with their raw
// answers.
func (s *Store) AttemptAnswers(ctx context.Context, workID string) ([]AttemptAnswer, error) {
	rows, err := s.pool.Query(ctx, `SELECT id::text, work_id, tenant_id, number, coalesce(outcome, 'running'),
			coalesce(reason, ''), started_at, finished_at, raw_response
		FROM attempts WHERE work_id = $1 ORDER BY number`, workID)
	if err != nil {
		return nil, fmt.Errorf("store: attempts %s: %w", workID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AttemptAnswer, error) {
		var a AttemptAnswer
		err := r.Scan(&a.ID, &a.WorkID, &a.TenantID, &a.Number, &a.Outcome, &a.Reason, &a.StartedAt, &a.FinishedAt, &a.Raw)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: attempts %s: %w", workID, err)
	}
	return out, nil
}

// LedgerOf lists a work item's ledger rows in the order they occurred.
func (s *Store) LedgerOf(ctx context.Context, workID string) ([]LedgerRow, error) {
	rows, err := s.pool.Query(ctx, `SELECT attempt_id::text, tenant_id, work_id, model, coalesce(served_model, ''),
			outcome, upstream_attempts, input_units, output_units, cost_micros, latency_ms, occurred_at, estimated
		FROM ledger WHERE work_id = $1 ORDER BY occurred_at, attempt_id`, workID)
	if err != nil {
		return nil, fmt.Errorf("store: ledger of %s: %w", workID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (LedgerRow, error) {
		var l LedgerRow
		err := r.Scan(&l.AttemptID, &l.TenantID, &l.WorkID, &l.Model, &l.ServedModel, &l.Outcome, &l.UpstreamAttempts,
			&l.InputUnits, &l.OutputUnits, &l.CostMicros, &l.LatencyMS, &l.OccurredAt, &l.Estimated)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: ledger of %s: %w", workID, err)
	}
	return out, nil
}

// OutboxRow is one event the cell wrote about a work item, as its outbox
// keeps it.
type OutboxRow struct {
	ID          int64
	Stream      string
	Subject     string
	MsgID       string
	CreatedAt   time.Time
	PublishedAt *time.Time
	SetAside    bool
}

// OutboxOf lists the outbox rows that name a work item: its announcements
// (msg id work.dispatch), its cancels, and its attempts' RESULT and
// ATTEMPT events (msg id = attempt id). Published rows older than the
// outbox retention are gone.
func (s *Store) OutboxOf(ctx context.Context, workID string) ([]OutboxRow, error) {
	rows, err := s.pool.Query(ctx, `SELECT o.id, o.stream, o.subject, o.msg_id, o.created_at, o.published_at,
			EXISTS (SELECT 1 FROM outbox_waiting q WHERE q.id = o.id AND q.set_aside_at IS NOT NULL)
		FROM outbox o
		WHERE o.msg_id LIKE replace(replace($1, '%', '\%'), '_', '\_') || '.%'
			OR o.msg_id LIKE 'cancel.' || replace(replace($1, '%', '\%'), '_', '\_') || '.%'
			OR o.msg_id IN (SELECT id::text FROM attempts WHERE work_id = $1)
		ORDER BY o.id`, workID)
	if err != nil {
		return nil, fmt.Errorf("store: outbox of %s: %w", workID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OutboxRow, error) {
		var o OutboxRow
		err := r.Scan(&o.ID, &o.Stream, &o.Subject, &o.MsgID, &o.CreatedAt, &o.PublishedAt, &o.SetAside)
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: outbox of %s: %w", workID, err)
	}
	return out, nil
}

// Redrive is one redrive the cell recorded.
type Redrive struct {
	EndedState string
	// EndedReason is the work's reason for that ending.
	EndedReason string
	EndedAt     time.Time
	Dispatch    int
	RedrivenAt  time.Time
}

// RedrivesOf lists the redrives of a work item, oldest first.
func (s *Store) RedrivesOf(ctx context.Context, workID string) ([]Redrive, error) {
	rows, err := s.pool.Query(ctx, `SELECT ended_state, ended_reason, ended_at, dispatch, redriven_at FROM redrives
		WHERE work_id = $1 ORDER BY redriven_at`, workID)
	if err != nil {
		return nil, fmt.Errorf("store: redrives of %s: %w", workID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Redrive, error) {
		var d Redrive
		err := r.Scan(&d.EndedState, &d.EndedReason, &d.EndedAt, &d.Dispatch, &d.RedrivenAt)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: redrives of %s: %w", workID, err)
	}
	return out, nil
}

// Redrivable are the outcomes a redrive may queue again: the failed ones.
// Accepted, superseded and canceled work is never revived, and queued or
// running work is not finished.
var Redrivable = []string{outcome.Expired, outcome.RetryExhausted, outcome.SchemaRejected,
	outcome.TransportRejected, outcome.BudgetExhausted, outcome.Dropped}

// Why a redrive refused a work item.
var (
	// ErrNotRedrivable: the work is not in a failed outcome.
	ErrNotRedrivable = errors.New("not in a failed outcome")
	// ErrRedriven: the work was redriven before (this ending, or any
	// ending without RedriveOptions.Again).
	ErrRedriven = errors.New("already redriven")
	// ErrNoInput: the work's input was purged with its data retention.
	ErrNoInput = errors.New("its input was purged")
)

// RedriveOptions say how a work item is redriven.
type RedriveOptions struct {
	// Deadline is the redriven work's new deadline.
	Deadline time.Time
	// Again allows a redrive of work redriven before, of an ending not yet
	// redriven.
	Again bool
	// DryRun checks everything and writes nothing.
	DryRun bool
	// Audit, when set, is written with the redrive: who asked for it.
	Audit *Audit
}

// errDryRun rolls a dry run's transaction back.
var errDryRun = errors.New("dry run")

// RedriveWork queues work that ended in a failed outcome again, through
// the same fences as a new request: in one transaction it records the
// ending it redrives (once per ending, the redrives key), queues the work
// with a new deadline, a new dispatch number and a fresh repair budget by a
// guarded UPDATE on the state and time it read, and writes the
// announcement. It refuses work in any other state (ErrNotRedrivable),
// work redriven before (ErrRedriven), work whose input was purged
// (ErrNoInput) and a revision a later one replaced (ErrSuperseded). With
// DryRun it refuses the same way and writes nothing; the work returned is
// then what it would be.
func (s *Store) RedriveWork(ctx context.Context, id string, o RedriveOptions, announce func(*Work) ([]OutboxMsg, error)) (*Work, error) {
	var got *Work
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		w, err := scanWork(tx.QueryRow(ctx, `SELECT `+workColumns+` FROM work WHERE id = $1 FOR UPDATE`, id))
		if err != nil {
			return err
		}
		if got, err = redriveLocked(ctx, tx, w, o, announce); err != nil {
			return err
		}
		if o.DryRun {
			return errDryRun
		}
		return nil
	})
	if errors.Is(err, errDryRun) {
		return got, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store: redrive: %w", err)
	}
	return got, nil
}

// redriveLocked is RedriveWork of w, read and locked in tx. It refuses
// before writing anything, or writes the redrive, the queued row and its
// announcement.
func redriveLocked(ctx context.Context, tx pgx.Tx, w *Work, o RedriveOptions, announce func(*Work) ([]OutboxMsg, error)) (*Work, error) {
	id := w.ID
	if !slices.Contains(Redrivable, w.State) {
		return nil, fmt.Errorf("work %s is %s: %w", id, w.State, ErrNotRedrivable)
	}
	if w.Input == "" {
		return nil, fmt.Errorf("work %s: %w", id, ErrNoInput)
	}
	if newer, err := newerRevision(ctx, tx, id); err != nil {
		return nil, err
	} else if newer != "" {
		return nil, fmt.Errorf("work %s: revision %s of %s came later: %w", id, newer, w.SourceID, ErrSuperseded)
	}
	var before int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM redrives WHERE work_id = $1`, id).Scan(&before); err != nil {
		return nil, err
	}
	if before > 0 && !o.Again {
		return nil, fmt.Errorf("work %s: redriven %d time(s) before: %w", id, before, ErrRedriven)
	}
	tag, err := tx.Exec(ctx, `INSERT INTO redrives (work_id, ended_state, ended_reason, ended_at, dispatch)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`, id, w.State, w.Reason, w.UpdatedAt, w.Dispatch+1)
	if err != nil {
		return nil, err
	}
	if tag.RowsAffected() == 0 {
		return nil, fmt.Errorf("work %s: its %s ending was redriven before: %w", id, w.State, ErrRedriven)
	}
	// The row is locked since it was read, so the guard holds.
	got, err := scanWork(tx.QueryRow(ctx, `UPDATE work SET state = 'queued', reason = NULL, deadline_at = $4,
			dispatch = dispatch + 1, repairs = 0, repair_note = NULL, retry_at = NULL, output_cap = NULL,
			lease_token = NULL, lease_expires_at = NULL, updated_at = now()
		WHERE id = $1 AND state = $2 AND updated_at = $3 RETURNING `+workColumns, id, w.State, w.UpdatedAt, o.Deadline))
	if err != nil {
		return nil, err
	}
	msgs, err := announce(got)
	if err != nil {
		return nil, err
	}
	if err := insertAudit(ctx, tx, id, o.Audit); err != nil {
		return nil, err
	}
	return got, insertOutbox(ctx, tx, msgs)
}

// ErrSelectionChanged is RedriveSet's refusal when the work it would
// redrive is not as many as the caller confirmed: nothing was written.
var ErrSelectionChanged = errors.New("the selection changed")

// Redrove is one work item of a RedriveSet: what it was, and what it
// became (Work) or why it was left alone (Err: ErrNotFound,
// ErrNotRedrivable, ErrRedriven, ErrSuperseded, ErrNoInput).
type Redrove struct {
	ID   string
	Was  string
	Work *Work
	Err  error
}

// RedriveSet redrives the work ids name in one transaction: every row is
// locked (in id order) before any is decided, each is redriven as
// RedriveWork would, and unless confirm is negative the transaction
// commits only when exactly confirm of them were redriven; otherwise
// nothing is written and the error is ErrSelectionChanged. Of two
// confirmed redrives of the same work at once, the second waits for the
// first's locks, finds the work queued, and writes nothing. A dry run
// (o.DryRun) reports and writes nothing.
func (s *Store) RedriveSet(ctx context.Context, ids []string, o RedriveOptions, confirm int,
	announce func(*Work) ([]OutboxMsg, error)) ([]Redrove, error) {
	var out []Redrove
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT `+workColumns+` FROM work WHERE id = ANY($1) ORDER BY id FOR UPDATE`, ids)
		if err != nil {
			return err
		}
		locked, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Work, error) { return scanWork(r) })
		if err != nil {
			return err
		}
		byID := make(map[string]*Work, len(locked))
		for _, w := range locked {
			byID[w.ID] = w
		}
		out, err = redriveEach(ctx, tx, ids, byID, o, announce)
		if err != nil {
			return err
		}
		n := 0
		for _, r := range out {
			if r.Err == nil {
				n++
			}
		}
		switch {
		case confirm >= 0 && n != confirm:
			return fmt.Errorf("%d work item(s) would be redriven now, not the %d confirmed: %w", n, confirm, ErrSelectionChanged)
		case o.DryRun:
			return errDryRun
		}
		return nil
	})
	switch {
	case errors.Is(err, errDryRun):
		return out, nil
	case errors.Is(err, ErrSelectionChanged):
		return out, err
	case err != nil:
		return nil, fmt.Errorf("store: redrive: %w", err)
	}
	return out, nil
}

// redriveEach redrives each locked work item in ids' order, each in a
// savepoint of its own, so one left alone leaves nothing behind.
func redriveEach(ctx context.Context, tx pgx.Tx, ids []string, byID map[string]*Work, o RedriveOptions,
	announce func(*Work) ([]OutboxMsg, error)) ([]Redrove, error) {
	out := make([]Redrove, 0, len(ids))
	for _, id := range ids {
		w, ok := byID[id]
		if !ok {
			out = append(out, Redrove{ID: id, Err: ErrNotFound})
			continue
		}
		r := Redrove{ID: id, Was: w.State}
		err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			var err error
			r.Work, err = redriveLocked(ctx, sp, w, o, announce)
			return err
		})
		for _, why := range []error{ErrNotRedrivable, ErrRedriven, ErrSuperseded, ErrNoInput} {
			if errors.Is(err, why) {
				r.Err, err = err, nil
			}
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// WorkCursor is where a listing continues after w: its creation time and
// id, opaque to callers.
func WorkCursor(w *Work) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(w.CreatedAt.UnixMicro(), 10) + " " + w.ID))
}

// ParseWorkCursor reads a WorkCursor into WorkFilter.AfterCreated and
// AfterID.
func ParseWorkCursor(c string) (time.Time, string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(c)
	at, id, ok := strings.Cut(string(raw), " ")
	us, perr := strconv.ParseInt(at, 10, 64)
	if err != nil || !ok || perr != nil || id == "" {
		return time.Time{}, "", fmt.Errorf("%q is not a cursor a listing gave", c)
	}
	return time.UnixMicro(us), id, nil
}
