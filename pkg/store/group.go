package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
)

// The classifier's hot path in groups: what many workers ask at once is
// one statement, and each row's fence is still its own. Each statement
// finds its rows by key alone: it names them with = ANY beside joining
// the request's arrays, and writes each state condition as a CASE, which
// no partial index's predicate matches. A cached generic plan otherwise
// chose the partial indexes of queued or running work (tiny when the
// plan was made) and read thousands of buffers a statement once they had
// grown: 13 ms a claim against 0.3 ms. Each fence's statement is its only
// SQL; one refused as a whole for a value one row carries runs again on
// halves of its group (isolate), so that row's fault is its alone.

// ToRun is one work row for a worker about to run it, with whether its
// tenant has a budget; Err is ErrNotFound when there is no such work.
type ToRun struct {
	Work     *Work
	Budgeted bool
	Err      error
}

// WorkToRunGroup is WorkToRun for many ids in one statement, one result
// per id in their order.
func (s *Store) WorkToRunGroup(ctx context.Context, ids []string) []ToRun {
	out := make([]ToRun, len(ids))
	rows, err := s.pool.Query(ctx, `SELECT `+workColumns+`,
			coalesce((SELECT budget_micros IS NOT NULL FROM tenants t WHERE t.id = work.tenant_id), false)
		FROM work WHERE id = ANY($1)`, ids)
	if err != nil {
		return fill(out, func(i int) ToRun { return ToRun{Err: fmt.Errorf("store: work to run: %w", err)} })
	}
	found := map[string]ToRun{}
	for rows.Next() {
		var r ToRun
		if r.Work, err = scanWorkWith(rows, &r.Budgeted); err != nil {
			break
		}
		found[r.Work.ID] = r
	}
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	if err != nil {
		return fill(out, func(i int) ToRun { return ToRun{Err: fmt.Errorf("store: work to run: %w", err)} })
	}
	for i, id := range ids {
		r, ok := found[id]
		if !ok {
			r.Err = ErrNotFound
		}
		out[i] = r
	}
	return out
}

// ClaimReq asks for the lease on one work item, as Claim does.
type ClaimReq struct {
	WorkID, AttemptID, Token string
	TTL                      time.Duration
	Estimate                 int64
	// Expect, when set, claims only while the work row still holds these
	// facts: the claim of a worker that decided on an announcement's facts
	// without reading the row.
	Expect *Expect
}

// Expect is what a claim made without reading the work row expects of it:
// every fact the worker's decisions and estimate rest on, and whether its
// tenant has a budget.
type Expect struct {
	TenantID, Lane, Contract, SchemaVersion, TaxonomyVersion, PromptDigest, Model string
	InputBytes, Attempts, OutageAttempts, Repairs, OutputCap                      int
	DeadlineAt                                                                    time.Time
	Budgeted                                                                      bool
}

// Claimed is one ClaimReq's answer: the work as claimed and OK, or OK
// false when another worker holds it, it is terminal, or another request
// of the same group took it first.
type Claimed struct {
	Work *Work
	OK   bool
	Err  error
}

// ClaimGroup is the claim fence, the one statement that takes leases:
// each row's compare-and-set decides for that row alone, and of two
// requests for one work in the group one wins. A request whose values the
// database refuses (an id that is not a UUID, text it cannot store) fails
// alone through isolate.
func (s *Store) ClaimGroup(ctx context.Context, reqs []ClaimReq) []Claimed {
	return isolate(ctx, reqs, func(ctx context.Context, reqs []ClaimReq) ([]Claimed, error) {
		won, err := s.claimGroup(ctx, reqs)
		if err != nil {
			return nil, err
		}
		got := make([]Claimed, len(reqs))
		for i, r := range reqs {
			w := won[r.AttemptID]
			got[i] = Claimed{Work: w, OK: w != nil}
		}
		return got, nil
	}, func(r ClaimReq, err error) Claimed {
		return Claimed{Err: fmt.Errorf("store: claim %s: %w", r.WorkID, err)}
	})
}

// claimGroup runs the claim's statement for reqs and returns the work each
// attempt that won claimed, by attempt id.
func (s *Store) claimGroup(ctx context.Context, reqs []ClaimReq) (map[string]*Work, error) {
	n := len(reqs)
	works, attempts, tokens := make([]string, n), make([]string, n), make([]string, n)
	ttls, estimates := make([]int64, n), make([]int64, n)
	var e expectArrays
	for i, r := range reqs {
		works[i], attempts[i], tokens[i], ttls[i], estimates[i] = r.WorkID, r.AttemptID, r.Token, interval(r.TTL), r.Estimate
		e.add(r.Expect)
	}
	// The claim, the lapse of an earlier attempt still without an
	// outcome, and the new attempt: sub-statements share one snapshot, so
	// a new attempt is never among those marked lapsed. A request with
	// expectations claims only a row that meets every one of them.
	rows, err := s.pool.Query(ctx, `WITH x AS (
			SELECT * FROM unnest($1::text[], $2::uuid[], $3::uuid[], $4::bigint[], $5::bigint[],
				$6::bool[], $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[],
				$14::int[], $15::int[], $16::int[], $17::int[], $18::int[], $19::timestamptz[], $20::bool[])
				AS x(work_id, attempt_id, token, ttl, estimate,
					expect, e_tenant, e_lane, e_contract, e_schema, e_taxonomy, e_prompt, e_model,
					e_input, e_attempts, e_outage, e_repairs, e_cap, e_deadline, e_budgeted)
		), claimed AS (
			UPDATE work SET state = 'running', lease_token = x.token,
				lease_expires_at = now() + x.ttl * interval '1 microsecond', attempts = attempts + 1, updated_at = now()
			FROM x WHERE work.id = ANY($1) AND work.id = x.work_id
				AND CASE work.state WHEN 'queued' THEN true WHEN 'running' THEN work.lease_expires_at < now() ELSE false END
				AND (NOT x.expect OR (
					(work.tenant_id, work.lane, work.contract, work.schema_version, work.taxonomy_version,
						coalesce(work.prompt_digest, ''), coalesce(work.model, ''), octet_length(work.input),
						work.attempts, work.outage_attempts, work.repairs, coalesce(work.output_cap, 0), work.deadline_at)
					= (x.e_tenant, x.e_lane, x.e_contract, x.e_schema, x.e_taxonomy, x.e_prompt, x.e_model, x.e_input,
						x.e_attempts, x.e_outage, x.e_repairs, x.e_cap, x.e_deadline)
					AND coalesce((SELECT t.budget_micros IS NOT NULL FROM tenants t WHERE t.id = work.tenant_id), false) = x.e_budgeted))
			RETURNING work.*, x.attempt_id AS claim_attempt, x.estimate AS claim_estimate
		), lapsed AS (
			UPDATE attempts SET outcome = 'lease_expired', reason = 'the lease lapsed before the worker reported back'
			WHERE work_id = ANY($1) AND work_id IN (SELECT id FROM claimed) AND outcome IS NULL
		), attempt AS (
			INSERT INTO attempts (id, work_id, tenant_id, number, lease_token, estimate_micros)
			SELECT claim_attempt, id, tenant_id, attempts, lease_token, claim_estimate FROM claimed
		)
		SELECT `+workColumns+`, claim_attempt::text FROM claimed`, append([]any{works, attempts, tokens, ttls, estimates}, e.args()...)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	won := map[string]*Work{}
	for rows.Next() {
		var attempt string
		w, err := scanWorkWith(rows, &attempt)
		if err != nil {
			return nil, err
		}
		won[attempt] = w
	}
	return won, rows.Err()
}

// ExpectOf is what a claim on w's facts expects: w as the worker saw it,
// and budgeted.
func ExpectOf(w *Work, budgeted bool) *Expect {
	return &Expect{TenantID: w.TenantID, Lane: w.Lane, Contract: w.Contract, SchemaVersion: w.SchemaVersion,
		TaxonomyVersion: w.TaxonomyVersion, PromptDigest: w.PromptDigest, Model: w.Model, InputBytes: len(w.Input),
		Attempts: w.Attempts, OutageAttempts: w.OutageAttempts, Repairs: w.Repairs, OutputCap: w.OutputCap,
		DeadlineAt: w.DeadlineAt, Budgeted: budgeted}
}

// expectArrays are ClaimReq.Expect as the arrays ClaimGroup's statement
// takes, one element per request (expect false where it has none).
type expectArrays struct {
	expect, budgeted                                        []bool
	tenant, lane, contract, schema, taxonomy, prompt, model []string
	input, attempts, outage, repairs, outputCap             []int32
	deadline                                                []time.Time
}

func (a *expectArrays) add(e *Expect) {
	has := e != nil
	if !has {
		e = &Expect{DeadlineAt: time.Unix(0, 0)}
	}
	a.expect = append(a.expect, has)
	a.budgeted = append(a.budgeted, e.Budgeted)
	a.tenant, a.lane, a.contract = append(a.tenant, e.TenantID), append(a.lane, e.Lane), append(a.contract, e.Contract)
	a.schema, a.taxonomy = append(a.schema, e.SchemaVersion), append(a.taxonomy, e.TaxonomyVersion)
	a.prompt, a.model = append(a.prompt, e.PromptDigest), append(a.model, e.Model)
	a.input, a.attempts = append(a.input, int32(e.InputBytes)), append(a.attempts, int32(e.Attempts))
	a.outage, a.repairs = append(a.outage, int32(e.OutageAttempts)), append(a.repairs, int32(e.Repairs))
	a.outputCap, a.deadline = append(a.outputCap, int32(e.OutputCap)), append(a.deadline, e.DeadlineAt)
}

func (a *expectArrays) args() []any {
	return []any{a.expect, a.tenant, a.lane, a.contract, a.schema, a.taxonomy, a.prompt, a.model,
		a.input, a.attempts, a.outage, a.repairs, a.outputCap, a.deadline, a.budgeted}
}

// AttemptRecorded is one AttemptRecord's answer, as RecordAttempt's.
type AttemptRecorded struct {
	Applied bool
	Err     error
}

// RecordAttemptGroup is the record fence, the one statement that records
// attempts: each record's change applies only while its lease is still the
// work's, and a record whose lease is gone writes nothing at all (Applied
// false), without touching the others. A statement the database refuses
// for good is run again on each half of the group (the same statement), so
// the refusal falls on the record that carries it alone.
func (s *Store) RecordAttemptGroup(ctx context.Context, recs []AttemptRecord) []AttemptRecorded {
	return isolate(ctx, recs, func(ctx context.Context, recs []AttemptRecord) ([]AttemptRecorded, error) {
		applied, err := recordAttemptGroup(ctx, s.pool, recs)
		if err != nil {
			return nil, err
		}
		out := make([]AttemptRecorded, len(recs))
		for i, r := range recs {
			out[i] = AttemptRecorded{Applied: applied[r.AttemptID]}
		}
		return out, nil
	}, func(r AttemptRecord, err error) AttemptRecorded {
		return AttemptRecorded{Err: fmt.Errorf("store: record attempt %s: %w", r.AttemptID, err)}
	})
}

// isolate answers reqs with run, one statement for the group. When the
// database refuses that statement for good (Permanent: a value one row
// carries), each half is run again, down to the row alone, so the refusal
// is that row's only; any other failure is every row's, as fail makes it.
func isolate[R, A any](ctx context.Context, reqs []R, run func(context.Context, []R) ([]A, error), fail func(R, error) A) []A {
	out, err := run(ctx, reqs)
	if err == nil {
		return out
	}
	if len(reqs) == 1 || !Permanent(err) {
		out = make([]A, len(reqs))
		for i, r := range reqs {
			out[i] = fail(r, err)
		}
		return out
	}
	half := len(reqs) / 2
	return append(isolate(ctx, reqs[:half], run, fail), isolate(ctx, reqs[half:], run, fail)...)
}

// recordAttemptGroupArgs are the records as the arrays
// recordAttemptGroupSQL takes, one element per record, and their outbox
// rows tagged by attempt.
func recordAttemptGroupArgs(recs []AttemptRecord) ([]any, error) {
	n := len(recs)
	var (
		works, tokens, attempts, outcomes, reasons = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		raws                                       = make([][]byte, n)
		changes, caps                              = make([]int32, n), make([]int32, n)
		handoffs, retries                          = make([]int64, n), make([]int64, n)
		notes, workOutcomes, workReasons           = make([]string, n), make([]string, n), make([]string, n)
		outages                                    = make([]bool, n)
		events                                     = make([][]byte, n)
		calls                                      = make([]*bool, n)
		ob                                         outboxRows
	)
	for i, r := range recs {
		works[i], tokens[i], attempts[i], outcomes[i], reasons[i] = r.WorkID, r.LeaseToken, r.AttemptID, r.Outcome, Text(r.Reason)
		if len(r.Raw) > 0 {
			raws[i] = r.Raw
		}
		changes[i], caps[i] = int32(r.Change), int32(r.OutputCap)
		handoffs[i], retries[i] = interval(r.HandoffTTL), interval(r.RetryAfter)
		notes[i], workOutcomes[i], workReasons[i], outages[i] = Text(r.RepairNote), r.WorkOutcome, Text(r.WorkReason), r.Outage
		// Its ATTEMPT event with no row is kept on the attempt's row; add
		// leaves it out of the outbox.
		for _, m := range r.Outbox {
			if !m.NoRow {
				continue
			}
			if m.Stream != event.KindAttempt || m.MsgID != r.AttemptID || events[i] != nil {
				return nil, fmt.Errorf("store: record attempt %s: a message with no row (%s %s) is not its ATTEMPT event",
					r.AttemptID, m.Stream, m.MsgID)
			}
			call := m.Headers[event.NoCallHeader] == ""
			events[i], calls[i] = m.Payload, &call
		}
		if err := ob.add(r.AttemptID, r.Outbox); err != nil {
			return nil, err
		}
	}
	return append([]any{works, tokens, attempts, outcomes, reasons, raws, changes, handoffs, notes, retries, caps, workOutcomes,
		workReasons, outages, events, calls}, ob.args()...), nil
}

// recordAttemptGroupSQL makes each record's change, chosen per row by its
// kind: 1 handoff (the lease kept for the committer), 2 requeue, 3 finish.
// A NoChange record (0) always applies, and may name no lease token; the
// others only where the work is still running under the record's lease.
// It returns the attempt ids of the records that applied.
var recordAttemptGroupSQL = `WITH x AS (
			SELECT * FROM unnest($1::text[], $2::text[], $3::uuid[], $4::text[], $5::text[], $6::bytea[], $7::int[],
				$8::bigint[], $9::text[], $10::bigint[], $11::int[], $12::text[], $13::text[], $14::bool[], $15::bytea[], $16::bool[])
				AS x(work_id, token, attempt_id, outcome, reason, raw, change, handoff, note, retry, cap, work_outcome, work_reason, outage,
					event, event_call)
		), wk AS (
			UPDATE work SET
				state = CASE x.change WHEN 2 THEN 'queued' WHEN 3 THEN x.work_outcome ELSE work.state END,
				reason = CASE x.change WHEN 3 THEN nullif(x.work_reason, '') ELSE work.reason END,
				lease_token = CASE WHEN x.change IN (2, 3) THEN NULL ELSE work.lease_token END,
				lease_expires_at = CASE x.change WHEN 1 THEN now() + x.handoff * interval '1 microsecond' ELSE NULL END,
				repairs = work.repairs + CASE WHEN x.change = 2 AND x.note <> '' THEN 1 ELSE 0 END,
				repair_note = CASE WHEN x.change = 2 AND x.note <> '' THEN x.note ELSE work.repair_note END,
				retry_at = CASE x.change WHEN 2 THEN now() + x.retry * interval '1 microsecond' ELSE work.retry_at END,
				output_cap = CASE WHEN x.change = 2 THEN coalesce(nullif(x.cap, 0), work.output_cap) ELSE work.output_cap END,
				outage_attempts = work.outage_attempts + CASE WHEN x.change IN (2, 3) AND x.outage THEN 1 ELSE 0 END,
				updated_at = CASE WHEN x.change IN (2, 3) THEN now() ELSE work.updated_at END
			FROM x WHERE work.id = ANY($1) AND x.change IN (1, 2, 3) AND work.id = x.work_id
				AND CASE work.state WHEN 'running' THEN work.lease_token = nullif(x.token, '')::uuid ELSE false END
			RETURNING x.attempt_id
		), ok AS (
			SELECT attempt_id FROM wk UNION ALL SELECT attempt_id FROM x WHERE x.change = 0
		), att AS (
			UPDATE attempts SET outcome = x.outcome, reason = nullif(x.reason, ''),
				raw_response = coalesce(x.raw, attempts.raw_response), finished_at = coalesce(attempts.finished_at, now()),
				event = coalesce(x.event, attempts.event), event_call = coalesce(x.event_call, attempts.event_call)
			FROM x WHERE attempts.id = ANY($3) AND attempts.id = x.attempt_id AND x.attempt_id IN (SELECT attempt_id FROM ok)
		), ob AS (` + outboxInsert(17, `m.tag::uuid IN (SELECT attempt_id FROM ok)`) + `)
		SELECT attempt_id::text FROM ok`

// recordAttemptGroup runs recordAttemptGroupSQL for recs on db (the pool,
// or a caller's transaction) and returns the attempt ids of the records
// that applied.
func recordAttemptGroup(ctx context.Context, db querier, recs []AttemptRecord) (map[string]bool, error) {
	args, err := recordAttemptGroupArgs(recs)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, recordAttemptGroupSQL, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	applied := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		applied[id] = true
	}
	return applied, rows.Err()
}

// fill sets every element of out to f(i) and returns it.
func fill[T any](out []T, f func(int) T) []T {
	for i := range out {
		out[i] = f(i)
	}
	return out
}

// AnswerReq names one attempt's answer to read with its work.
type AnswerReq struct{ WorkID, AttemptID string }

// Answer is WorkAnswer's result for one AnswerReq.
type Answer struct {
	Work   *Work
	Answer []byte
	Err    error
}

// WorkAnswerGroup is WorkAnswer for many requests in one statement, one
// result per request in their order.
func (s *Store) WorkAnswerGroup(ctx context.Context, reqs []AnswerReq) []Answer {
	out := make([]Answer, len(reqs))
	works, attempts := make([]string, len(reqs)), make([]string, len(reqs))
	for i, r := range reqs {
		works[i], attempts[i] = r.WorkID, r.AttemptID
	}
	rows, err := s.pool.Query(ctx, `SELECT `+workColumns+`, x.attempt_id::text,
			(SELECT coalesce(a.answer, a.raw_response) FROM attempts a WHERE a.id = x.attempt_id AND a.work_id = work.id)
		FROM unnest($1::text[], $2::uuid[]) AS x(work_id, attempt_id) JOIN work ON work.id = x.work_id
		WHERE work.id = ANY($1)`, works, attempts)
	// By work and attempt: a request naming an attempt of other work (a
	// malformed event) gets its own work's row, with no answer.
	type key struct{ work, attempt string }
	found := map[key]Answer{}
	if err == nil {
		for rows.Next() {
			var attempt string
			var a Answer
			if a.Work, err = scanWorkWith(rows, &attempt, &a.Answer); err != nil {
				break
			}
			found[key{a.Work.ID, attempt}] = a
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil {
		return fill(out, func(int) Answer { return Answer{Err: fmt.Errorf("store: work answer: %w", err)} })
	}
	for i, r := range reqs {
		a, ok := found[key{r.WorkID, r.AttemptID}]
		if !ok {
			a.Err = ErrNotFound
		}
		out[i] = a
	}
	return out
}

// CommitReq is one answer the gate accepted, to commit as Commit does.
type CommitReq struct {
	Work              *Work
	AttemptID, Token  string
	Output            json.RawMessage
	Findings          int
	Accepted, Expired []OutboxMsg // the outcome's events, for the state it reaches
	Announce          bool        // the outcome's events are written (outcome_announced_at set)
}

// CommitVerdict is one CommitReq's verdict.
type CommitVerdict struct {
	Verdict Verdict
	Err     error
}

// CommitGroup is the commit fence, the one statement that commits
// answers: each row's lease, deadline and result key decide for that row
// alone — a lost lease is marked stale, a passed deadline expires its
// work — and the others commit. A statement the database refuses for good
// (a value one answer carries) is run again on halves of the group, so the
// refusal is that answer's alone.
func (s *Store) CommitGroup(ctx context.Context, reqs []CommitReq) []CommitVerdict {
	return isolate(ctx, reqs, func(ctx context.Context, reqs []CommitReq) ([]CommitVerdict, error) {
		got, err := s.commitGroup(ctx, reqs)
		if err != nil {
			return nil, err
		}
		out := make([]CommitVerdict, len(reqs))
		for i, r := range reqs {
			out[i] = CommitVerdict{Verdict: got[r.AttemptID]} // Lost when neither
		}
		return out, nil
	}, func(r CommitReq, err error) CommitVerdict {
		if SQLState(err) == "23505" {
			// The lease CAS passed, so this cannot be a second commit of
			// the same work; refuse loudly rather than accept without a
			// row, and not as a refusal for good: the record is what is
			// wrong.
			return CommitVerdict{Verdict: Lost, Err: fmt.Errorf("store: commit %s: a result for it already exists", r.Work.ID)}
		}
		return CommitVerdict{Verdict: Lost, Err: fmt.Errorf("store: commit %s: %w", r.Work.ID, err)}
	})
}

// commitGroupArgs are the answers as the arrays commitGroupSQL takes, one
// element per answer, and their outcomes' outbox rows tagged by attempt
// and state.
func commitGroupArgs(reqs []CommitReq) ([]any, error) {
	n := len(reqs)
	works, tokens, versions, tenants, attempts, outputs := make([]string, n), make([]string, n), make([]string, n),
		make([]string, n), make([]string, n), make([]string, n)
	findings, announce := make([]int32, n), make([]bool, n)
	var ob outboxRows
	for i, r := range reqs {
		works[i], tokens[i], versions[i], tenants[i], attempts[i] = r.Work.ID, r.Token, r.Work.SchemaVersion, r.Work.TenantID, r.AttemptID
		outputs[i], findings[i], announce[i] = string(r.Output), int32(r.Findings), r.Announce
		if err := ob.add(r.AttemptID+" "+outcome.Accepted, r.Accepted); err != nil {
			return nil, err
		}
		if err := ob.add(r.AttemptID+" "+outcome.Expired, r.Expired); err != nil {
			return nil, err
		}
	}
	return append([]any{works, tokens, versions, tenants, attempts, outputs, findings, announce}, ob.args()...), nil
}

// commitGroupSQL is the commit fence's statement, row by row: the late and the
// accepted branch exclude each other by the deadline; with neither the
// attempt is marked stale; an attempt already recorded ok is not written
// again. It returns each committed or expired attempt id with the state
// its work reached.
var commitGroupSQL = `WITH x AS (
			SELECT * FROM unnest($1::text[], $2::uuid[], $3::text[], $4::text[], $5::uuid[], $6::text[], $7::int[], $8::bool[])
				AS x(work_id, token, schema_version, tenant_id, attempt_id, output, findings, announce)
		), late AS (
			UPDATE work SET state = 'expired', reason = 'deadline passed before a result was accepted',
				lease_token = NULL, lease_expires_at = NULL, updated_at = now(),
				outcome_announced_at = CASE WHEN x.announce THEN now() ELSE work.outcome_announced_at END
			FROM x WHERE work.id = ANY($1) AND work.id = x.work_id
				AND CASE work.state WHEN 'running' THEN work.lease_token = x.token AND work.deadline_at <= now() ELSE false END
			RETURNING x.attempt_id
		), acc AS (
			UPDATE work SET state = 'accepted', reason = '', lease_token = NULL, lease_expires_at = NULL,
				updated_at = now(), outcome_announced_at = CASE WHEN x.announce THEN now() ELSE work.outcome_announced_at END
			FROM x WHERE work.id = ANY($1) AND work.id = x.work_id
				AND CASE work.state WHEN 'running' THEN work.lease_token = x.token AND work.deadline_at > now() ELSE false END
			RETURNING x.attempt_id
		), res AS (
			INSERT INTO results (work_id, schema_version, tenant_id, attempt_id, output, findings)
			SELECT x.work_id, x.schema_version, x.tenant_id, x.attempt_id, x.output::jsonb, x.findings
			FROM x WHERE x.attempt_id IN (SELECT attempt_id FROM acc)
		), att_ok AS (
			UPDATE attempts SET outcome = 'ok', reason = NULL, finished_at = coalesce(finished_at, now())
			WHERE id = ANY($5) AND id IN (SELECT attempt_id FROM acc)
				AND (outcome IS DISTINCT FROM 'ok' OR reason IS NOT NULL OR finished_at IS NULL)
		), att_late AS (
			UPDATE attempts SET outcome = 'stale_lease', reason = 'deadline passed before the verdict',
				finished_at = coalesce(finished_at, now())
			WHERE id = ANY($5) AND id IN (SELECT attempt_id FROM late)
		), att_lost AS (
			UPDATE attempts SET outcome = 'stale_lease', reason = coalesce(reason, 'lease lost before the verdict'),
				finished_at = coalesce(finished_at, now())
			WHERE id = ANY($5) AND id NOT IN (SELECT attempt_id FROM acc) AND id NOT IN (SELECT attempt_id FROM late)
				AND coalesce(outcome, '') IN ('', 'ok', 'lease_expired')
				AND NOT EXISTS (SELECT 1 FROM results r WHERE r.work_id = attempts.work_id AND r.attempt_id = attempts.id)
		), ob AS (` + outboxInsert(9, `(split_part(m.tag, ' ', 2) = '`+outcome.Accepted+`' AND split_part(m.tag, ' ', 1)::uuid IN (SELECT attempt_id FROM acc))
			OR (split_part(m.tag, ' ', 2) = '`+outcome.Expired+`' AND split_part(m.tag, ' ', 1)::uuid IN (SELECT attempt_id FROM late))`) + `)
		SELECT attempt_id::text, '` + outcome.Accepted + `' FROM acc UNION ALL SELECT attempt_id::text, '` + outcome.Expired + `' FROM late`

// commitGroup runs commitGroupSQL for reqs and returns the verdict of
// each attempt it committed or found late.
func (s *Store) commitGroup(ctx context.Context, reqs []CommitReq) (map[string]Verdict, error) {
	args, err := commitGroupArgs(reqs)
	if err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, commitGroupSQL, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	got := map[string]Verdict{}
	for rows.Next() {
		var id, what string
		if err := rows.Scan(&id, &what); err != nil {
			return nil, err
		}
		got[id] = map[string]Verdict{outcome.Accepted: Committed, outcome.Expired: Late}[what]
	}
	return got, rows.Err()
}
