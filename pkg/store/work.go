package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"assay.dev/pkg/outcome"
)

// Work is one requested extraction.
type Work struct {
	ID              string
	TenantID        string
	Region          string
	Contract        string
	SchemaVersion   string
	TaxonomyVersion string
	SourceID        string
	Revision        string
	Lane            string
	Input           string
	Digest          string
	State           string
	Reason          string
	LeaseToken      string
	LeaseExpiresAt  time.Time
	Attempts        int
	Repairs         int
	RepairNote      string
	Dispatch        int
	// RetryAt is when a retry falls due (zero when none was asked).
	RetryAt time.Time
	// Traceparent is the W3C traceparent of the request that created the
	// work, "" when there was none.
	Traceparent string
	// OutputCap is the answer cap of the next attempt when it was raised
	// (an answer was cut at the cap); 0 takes the classifier's.
	OutputCap  int
	DeadlineAt time.Time
	CreatedAt  time.Time
	UpdatedAt  time.Time

	// OutageAttempts are the attempts lost to a provider outage, which the
	// attempt budget does not count.
	OutageAttempts int

	// Model is the model the work is asked of; "" is the cell's model.
	// PromptDigest names the prompt it is asked with (contract_prompts);
	// "" is its contract version's own.
	Model        string
	PromptDigest string
	// ShadowOf marks shadow work: the id of the live work it runs beside,
	// or "check:<id>" for an item of a rollout check. Shadow work is never
	// published and opens no review item; its calls are ledgered, marked.
	ShadowOf string
	// RestOf, where it is read (PublishFacts), names the work whose partial
	// review this work continues; its revision is that one's with
	// "+rest<n>" after it.
	RestOf string `json:"-"`

	// SupersedeOlder, on insert, ends the same source's other revisions
	// that have not reached an outcome as superseded (a force-push). With
	// SourceUpdatedAt set it keeps push order: only revisions whose source
	// time is older are superseded, and a revision that arrives after a
	// newer one is stored superseded at once.
	SupersedeOlder  bool      `json:"-"`
	SourceUpdatedAt time.Time `json:"-"`
	// DropReason, on insert, stores the work dropped with this reason and
	// unannounced: admission refused it, and the reason tells how to ask
	// again. Asking again with the same key re-admits it.
	DropReason string `json:"-"`
	// Superseded and SupersededRunning, after an insert, name the older
	// work it superseded, and those of them a worker was running: their
	// model calls are to be canceled.
	Superseded        []string `json:"-"`
	SupersededRunning []string `json:"-"`
	// Announced, after an insert that created the work, are the outbox
	// rows it wrote (the announcement, and the cancels of what it
	// superseded), to hand to the relay once committed.
	Announced []OutboxMsg `json:"-"`
}

// Terminal reports whether the work has reached its outcome.
func (w *Work) Terminal() bool { return outcome.IsTerminal(w.State) }

const workColumns = `id, tenant_id, region, contract, schema_version, taxonomy_version, source_id,
	revision, lane, input, content_digest, state, coalesce(reason, ''), coalesce(lease_token::text, ''),
	coalesce(lease_expires_at, 'epoch'), attempts, repairs, coalesce(repair_note, ''), dispatch,
	deadline_at, created_at, updated_at, coalesce(output_cap, 0), coalesce(retry_at, 'epoch'), coalesce(traceparent, ''), outage_attempts,
	coalesce(model, ''), coalesce(prompt_digest, ''), coalesce(shadow_of, '')`

func scanWork(row pgx.Row) (*Work, error) { return scanWorkWith(row) }

// scanWorkWith scans the work columns and then extra.
func scanWorkWith(row pgx.Row, extra ...any) (*Work, error) {
	var w Work
	err := row.Scan(append([]any{&w.ID, &w.TenantID, &w.Region, &w.Contract, &w.SchemaVersion, &w.TaxonomyVersion,
		&w.SourceID, &w.Revision, &w.Lane, &w.Input, &w.Digest, &w.State, &w.Reason, &w.LeaseToken,
		&w.LeaseExpiresAt, &w.Attempts, &w.Repairs, &w.RepairNote, &w.Dispatch, &w.DeadlineAt,
		&w.CreatedAt, &w.UpdatedAt, &w.OutputCap, &w.RetryAt, &w.Traceparent, &w.OutageAttempts,
		&w.Model, &w.PromptDigest, &w.ShadowOf}, extra...)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	return &w, err
}

func sourceTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// revisionAfter is the SQL condition that the row named a is a later
// revision of its source than the row named b; a and b name rows of work,
// or rows with its source_updated_at and created_at columns. It alone
// decides which revisions a new one supersedes (insertGroupSQL, the one
// way work is inserted) and whether a later revision replaced work asked
// to run again (newerRevision).
//
// A revision is later when its source says it was pushed later:
// source_updated_at is the source's own time of the change (a pull
// request's updated_at, migration 0003), which keeps push order however
// late or out of order a delivery comes. Only a source's webhook gives it;
// the column is nullable, and work asked for through the API has none. So
// when either row lacks it, the row that arrived later is later: created_at,
// which every row has. When both have the same time, arrival decides too:
// the source's times are whole seconds, so two pushes within one second
// share one, and the later delivery is a better guess than keeping both
// revisions open. Rows that arrived together (written by one statement,
// with one created_at) are neither later than the other.
func revisionAfter(a, b string) string {
	return `CASE WHEN ` + a + `.source_updated_at IS NOT NULL AND ` + b + `.source_updated_at IS NOT NULL
			AND ` + a + `.source_updated_at <> ` + b + `.source_updated_at
		THEN ` + a + `.source_updated_at > ` + b + `.source_updated_at
		ELSE ` + a + `.created_at > ` + b + `.created_at END`
}

// newerRevision names the revision of the same source that replaces work
// id, "" when none does: one after it (revisionAfter). The work a partial
// review's rest continues, and its other rests, are the same revision and
// never replace it. Supersede on arrival, rerun, redrive and the rest of a
// partial review all ask this one question.
func newerRevision(ctx context.Context, tx pgx.Tx, id string) (string, error) {
	var newer string
	err := tx.QueryRow(ctx, `SELECT o.revision FROM work me JOIN work o
			ON o.tenant_id = me.tenant_id AND o.contract = me.contract AND o.source_id = me.source_id
		WHERE me.id = $1 AND coalesce(o.rest_of, o.id) <> coalesce(me.rest_of, me.id)
			AND `+revisionAfter("o", "me")+`
		ORDER BY coalesce(o.source_updated_at, o.created_at) DESC LIMIT 1`, id).Scan(&newer)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return newer, err
}

// readmit queues dropped work again with a new deadline and a new dispatch
// number.
func readmit(ctx context.Context, tx pgx.Tx, id string, deadline time.Time) (*Work, error) {
	return scanWork(tx.QueryRow(ctx, `UPDATE work SET state = 'queued', reason = NULL, deadline_at = $2,
			dispatch = dispatch + 1, updated_at = now(), outcome_announced_at = NULL
		WHERE id = $1 AND state = 'dropped' RETURNING `+workColumns, id, deadline))
}

// ErrTooLarge is returned by Rerun for work dropped because its diff was
// over the cell's cap: there is no diff to run.
var ErrTooLarge = errors.New("the work's diff was too large to keep")

// ErrNotDropped is returned by Rerun for work admission did not drop.
var ErrNotDropped = errors.New("only dropped work can be run again")

// Rerun queues dropped work again with a new deadline and writes its
// announcement, in one transaction. It refuses work in any other state
// (ErrNotDropped) and a revision that a later one of the same source has
// replaced (ErrSuperseded).
func (s *Store) Rerun(ctx context.Context, id string, deadline time.Time, announce func(*Work) ([]OutboxMsg, error)) (*Work, error) {
	return s.RerunAudited(ctx, id, deadline, announce, nil)
}

// RerunAudited is Rerun with who asked for it written with it (audit may
// be nil).
func (s *Store) RerunAudited(ctx context.Context, id string, deadline time.Time, announce func(*Work) ([]OutboxMsg, error),
	audit *Audit) (*Work, error) {
	var got *Work
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		w, err := scanWork(tx.QueryRow(ctx, `SELECT `+workColumns+` FROM work WHERE id = $1 FOR UPDATE`, id))
		if err != nil {
			return err
		}
		if w.State != outcome.Dropped {
			return fmt.Errorf("work %s is %s: %w", id, w.State, ErrNotDropped)
		}
		if strings.HasPrefix(w.Reason, outcome.ReasonDiffTooLarge) {
			return fmt.Errorf("work %s: its diff was over the cell's cap and was not kept; raise ASSAY_MAX_DIFF_BYTES and push to the pull request again: %w",
				id, ErrTooLarge)
		}
		if newer, err := newerRevision(ctx, tx, id); err != nil {
			return err
		} else if newer != "" {
			return fmt.Errorf("work %s: revision %s of %s came later; run that one: %w", id, newer, w.SourceID, ErrSuperseded)
		}
		if got, err = readmit(ctx, tx, id, deadline); err != nil {
			return err
		}
		msgs, err := announce(got)
		if err != nil {
			return err
		}
		if err := insertAudit(ctx, tx, id, audit); err != nil {
			return err
		}
		return insertOutbox(ctx, tx, msgs)
	})
	if err != nil {
		return nil, fmt.Errorf("store: rerun: %w", err)
	}
	return got, nil
}

// ErrSuperseded is returned by Rerun when a later revision replaced the work.
var ErrSuperseded = errors.New(outcome.Superseded)

// ExpireOverdue ends work whose deadline passed more than grace ago and
// that has no outcome yet: queued work nobody will take in time, and
// running work whose worker has not reported back. The grace lets a live
// worker record its own outcome first. A late answer then finds the work
// expired and is recorded stale, never published.
func (s *Store) ExpireOverdue(ctx context.Context, grace time.Duration, limit int) ([]*Work, error) {
	rows, err := s.pool.Query(ctx, `UPDATE work SET state = 'expired',
			reason = 'deadline passed before a result was accepted', lease_token = NULL,
			lease_expires_at = NULL, updated_at = now()
		WHERE id IN (SELECT id FROM work WHERE state IN ('queued', 'running')
				AND deadline_at < now() - $1 * interval '1 microsecond'
			ORDER BY deadline_at LIMIT $2 FOR UPDATE SKIP LOCKED)
		RETURNING `+workColumns, interval(grace), limit)
	if err != nil {
		return nil, fmt.Errorf("store: expire: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Work, error) { return scanWork(r) })
	if err != nil {
		return nil, fmt.Errorf("store: expire: %w", err)
	}
	return out, nil
}

// WorkAnswer reads one work row and the answer of one of its attempts (its
// raw answer, or what its parts answered together), in one statement: what
// the committer gates. The answer is nil when the
// attempt is not the work's or kept none.
func (s *Store) WorkAnswer(ctx context.Context, workID, attemptID string) (*Work, []byte, error) {
	var answer []byte
	w, err := scanWorkWith(s.pool.QueryRow(ctx, `SELECT `+workColumns+`,
			(SELECT coalesce(a.answer, a.raw_response) FROM attempts a WHERE a.id = $2::uuid AND a.work_id = work.id)
		FROM work WHERE id = $1`, workID, attemptID), &answer)
	return w, answer, err
}

// WorkToRun reads one work row for a worker about to run it, and whether
// its tenant has a budget: one that has none needs no reservation.
func (s *Store) WorkToRun(ctx context.Context, id string) (w *Work, budgeted bool, err error) {
	w, err = scanWorkWith(s.pool.QueryRow(ctx, `SELECT `+workColumns+`,
			coalesce((SELECT budget_micros IS NOT NULL FROM tenants t WHERE t.id = work.tenant_id), false)
		FROM work WHERE id = $1`, id), &budgeted)
	return w, budgeted, err
}

// GetWork reads one work row.
func (s *Store) GetWork(ctx context.Context, id string) (*Work, error) {
	return scanWork(s.pool.QueryRow(ctx, `SELECT `+workColumns+` FROM work WHERE id = $1`, id))
}

// Claim takes the lease on queued work (or on running work whose lease
// has expired) and records the attempt: the claim fence, ClaimGroup, as a
// group of one. ok=false means another worker holds the work or it is
// terminal.
//
// estimate is what the attempt's call may cost from above, kept with the
// attempt: if its worker dies before reporting, the ledger charges it.
func (s *Store) Claim(ctx context.Context, workID, attemptID, token string, ttl time.Duration, estimate int64) (w *Work, ok bool, err error) {
	c := s.ClaimGroup(ctx, []ClaimReq{{WorkID: workID, AttemptID: attemptID, Token: token, TTL: ttl, Estimate: estimate}})[0]
	return c.Work, c.OK, c.Err
}

// ExtendLease pushes the lease out while its holder still has it. false
// means the lease is lost.
func (s *Store) ExtendLease(ctx context.Context, workID, token string, ttl time.Duration) (bool, error) {
	return extendLease(ctx, s.pool, workID, token, ttl)
}

// extendLease is ExtendLease inside the caller's transaction.
func extendLease(ctx context.Context, db execer, workID, token string, ttl time.Duration) (bool, error) {
	tag, err := db.Exec(ctx, `UPDATE work SET lease_expires_at = now() + $3 * interval '1 microsecond'
		WHERE id = $1 AND state = 'running' AND lease_token = $2`, workID, token, interval(ttl))
	if err != nil {
		return false, fmt.Errorf("store: extend lease %s: %w", workID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// finishLeased ends leased work with a terminal outcome, only while the
// caller still holds the lease.
func finishLeased(ctx context.Context, db execer, workID, token, state, reason string) (bool, error) {
	tag, err := db.Exec(ctx, `UPDATE work SET state = $3, reason = $4, lease_token = NULL,
			lease_expires_at = NULL, updated_at = now()
		WHERE id = $1 AND state = 'running' AND lease_token = $2`, workID, token, state, reason)
	if err != nil {
		return false, fmt.Errorf("store: finish %s: %w", workID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// FinishUnleased ends work that nobody holds (queued, or running with an
// expired lease), e.g. when its deadline or attempt budget has run out.
func (s *Store) FinishUnleased(ctx context.Context, workID, state, reason string) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE work SET state = $2, reason = $3, lease_token = NULL,
			lease_expires_at = NULL, updated_at = now()
		WHERE id = $1 AND (state = 'queued' OR (state = 'running' AND lease_expires_at < now()))`,
		workID, state, Text(reason))
	if err != nil {
		return false, fmt.Errorf("store: finish %s: %w", workID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Stuck is work the sweeper re-announces.
type Stuck struct {
	Work *Work
	// Redrive is true when an expired lease was taken back; false for
	// queued work whose announcement was lost.
	Redrive  bool
	Dispatch int
}

// Sweep says what the sweeper looks for.
type Sweep struct {
	// QueuedFor is how long queued work, announced or due for its retry,
	// waits before it counts as lost.
	QueuedFor time.Duration
	// LeaseGrace is how long after its lease expired running work is taken
	// back.
	LeaseGrace time.Duration
	// Heads, per lane, is since when the lane's consumer holds the
	// announcements it has not finished with (undelivered, or delivered
	// and not yet acknowledged): queued work announced before then has no
	// message left (acknowledged, or lost), work announced after waits its
	// turn behind a healthy backlog and is left alone. A lane not named
	// counts as caught up.
	Heads map[string]time.Time
	Limit int
}

// SweepStuck finds queued work whose announcement is lost and running work
// whose lease expired more than LeaseGrace ago, and writes the outbox rows
// announce makes for them, in one transaction. Each gets a new dispatch
// number, so its re-announcement is a new message that the broker's
// duplicate window does not swallow; queued work is touched, so the next
// pass waits a full period; expired work's lease moves up to now, which
// keeps it claimable while the next re-announcement waits another full
// grace period.
func (s *Store) SweepStuck(ctx context.Context, sw Sweep, announce func(Stuck) (OutboxMsg, error)) ([]Stuck, error) {
	lanes, heads := []string{}, []time.Time{}
	for l, h := range sw.Heads {
		lanes, heads = append(lanes, l), append(heads, h)
	}
	var out []Stuck
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		out = out[:0]
		for _, q := range []struct {
			sql     string
			args    []any
			redrive bool
		}{
			{`UPDATE work SET dispatch = dispatch + 1, updated_at = now()
				WHERE id IN (SELECT id FROM work WHERE state = 'queued'
						AND greatest(updated_at, coalesce(retry_at, updated_at)) < now() - $1 * interval '1 microsecond'
						AND updated_at < coalesce((SELECT h FROM unnest($3::text[], $4::timestamptz[]) AS x(l, h)
							WHERE x.l = work.lane), now())
					ORDER BY updated_at LIMIT $2 FOR UPDATE SKIP LOCKED)
				RETURNING ` + workColumns, []any{interval(sw.QueuedFor), sw.Limit, lanes, heads}, false},
			{`UPDATE work SET dispatch = dispatch + 1, lease_expires_at = now(), updated_at = now()
				WHERE id IN (SELECT id FROM work WHERE state = 'running' AND lease_expires_at < now() - $1 * interval '1 microsecond'
					ORDER BY lease_expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)
				RETURNING ` + workColumns, []any{interval(sw.LeaseGrace), sw.Limit}, true},
		} {
			rows, err := tx.Query(ctx, q.sql, q.args...)
			if err != nil {
				return err
			}
			found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Work, error) { return scanWork(r) })
			if err != nil {
				return err
			}
			for _, w := range found {
				out = append(out, Stuck{Work: w, Redrive: q.redrive, Dispatch: w.Dispatch})
			}
		}
		msgs := make([]OutboxMsg, 0, len(out))
		for _, st := range out {
			m, err := announce(st)
			if err != nil {
				return err
			}
			msgs = append(msgs, m)
		}
		return insertOutbox(ctx, tx, msgs)
	})
	if err != nil {
		return nil, fmt.Errorf("store: sweep: %w", err)
	}
	return out, nil
}
