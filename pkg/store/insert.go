package store

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"assay.dev/pkg/outcome"
)

// InsertReq is one request of the ingress fence.
type InsertReq struct {
	Work     *Work
	Announce func(*Work) ([]OutboxMsg, error)
	// Item: the work is asked for as a batch's item, not on its own: a new
	// row is stored not direct, and a row found stays as direct as it was.
	Item bool
	// Publish: the caller hands the new work's announcement to its relay
	// once the statement has committed, so the statement writes no outbox
	// row for it (store.OutboxMsg.NoRow); should the announcement be lost,
	// the sweeper announces the queued work again. Without it the
	// announcement is an outbox row, published by a relay's poll.
	Publish bool
}

// WorkInserted is what the ingress fence answered for one request.
type WorkInserted struct {
	Work    *Work
	Created bool
	Err     error
}

// InsertWork applies the ingress fence to one request: InsertWorkGroup as
// a group of one. A duplicate returns the existing work and created=false.
func (s *Store) InsertWork(ctx context.Context, w *Work, announce func(*Work) ([]OutboxMsg, error)) (got *Work, created bool, err error) {
	r := s.InsertWorkGroup(ctx, []InsertReq{{Work: w, Announce: announce}})[0]
	return r.Work, r.Created, r.Err
}

// InsertWorkGroup is the ingress fence: each request's row is inserted (or
// the row its ingress key already names is found, and queued again when
// it was dropped and is asked for again), supersedes its source's older
// revisions or is stored superseded when a later one is already here, and
// is announced when queued — every request decided by one statement,
// insertGroupSQL, on its own row. A source asked for twice in one group
// takes the statement once per revision, in the order asked, so a later
// revision supersedes the earlier as it would one call after the other.
func (s *Store) InsertWorkGroup(ctx context.Context, reqs []InsertReq) []WorkInserted {
	return insertGroup(ctx, s.pool, reqs)
}

// txQuerier is what insertGroup needs of the pool or a transaction.
type txQuerier interface {
	querier
	execer
}

// insertGroup runs the ingress fence for reqs on db, the pool or the
// caller's transaction.
func insertGroup(ctx context.Context, db txQuerier, reqs []InsertReq) []WorkInserted {
	out := make([]WorkInserted, len(reqs))
	// Rounds: the n-th request of a source goes in the n-th statement.
	rounds := [][]int{}
	seen := map[[3]string]int{}
	for i, r := range reqs {
		w := r.Work
		k := [3]string{w.TenantID, w.Contract, w.SourceID}
		n := seen[k]
		seen[k]++
		if n == len(rounds) {
			rounds = append(rounds, nil)
		}
		rounds[n] = append(rounds[n], i)
	}
	for n := 0; n < len(rounds); n++ {
		// A request the statement neither inserted nor found (a copy
		// committed after it began) is asked again in the next one; a
		// key that still answers nothing after that is an error.
		again := insertRound(ctx, db, reqs, rounds[n], out)
		if len(again) == 0 {
			continue
		}
		if n+1 == len(rounds) {
			rounds = append(rounds, nil)
		}
		for _, i := range again {
			if n >= 3 {
				out[i].Err = fmt.Errorf("store: insert work %s: its key is taken but no row holds it", reqs[i].Work.ID)
				continue
			}
			rounds[n+1] = append(rounds[n+1], i)
		}
		slices.Sort(rounds[n+1])
	}
	return out
}

// insertRound runs insertGroupSQL for reqs[take], fills out for each
// request it decided and returns those it did not.
func insertRound(ctx context.Context, db txQuerier, reqs []InsertReq, take []int, out []WorkInserted) (again []int) {
	args, announced := insertGroupArgs(reqs, take, out)
	at := map[string]int{}
	for _, i := range take {
		if out[i].Err == nil {
			at[reqs[i].Work.ID] = i
		}
	}
	if len(at) == 0 {
		return nil
	}
	answers, err := runInsert(ctx, db, args)
	if _, inTx := db.(pgx.Tx); err != nil && (Permanent(err) || MovedOut(err)) && len(at) > 1 && !inTx {
		// A value one request carries that the database refuses: each half
		// again, so the refusal falls on that request alone. In the
		// caller's transaction, which the refusal has ended, the caller
		// has the error.
		half := len(take) / 2
		return append(insertRound(ctx, db, reqs, take[:half], out), insertRound(ctx, db, reqs, take[half:], out)...)
	}
	if err != nil {
		for _, i := range take {
			if out[i].Err == nil {
				out[i].Err = fmt.Errorf("store: insert work: %w", err)
			}
		}
		return nil
	}
	answered := map[int]bool{}
	for _, a := range answers {
		i, ok := at[a.req]
		if !ok || answered[i] {
			continue
		}
		answered[i] = true
		out[i] = WorkInserted{Work: a.work, Created: a.kind != "found"}
		if a.kind == "new" && a.work.State == outcome.Queued {
			a.work.Announced = announced[i]
		}
	}
	for _, i := range take {
		switch {
		case out[i].Err != nil:
		case !answered[i]:
			again = append(again, i)
		case out[i].Created:
			if err := announceAfter(ctx, db, out[i].Work, reqs[i].Announce); err != nil {
				out[i] = WorkInserted{Err: err}
			}
		}
	}
	return again
}

// insertAnswer is one row insertGroupSQL answers: the work as it became
// (which may hold the request's key under another id), and how.
type insertAnswer struct {
	work      *Work
	req, kind string // the request's work id, and what became of it
}

// runInsert runs insertGroupSQL with args and reads every row it answers.
func runInsert(ctx context.Context, db querier, args []any) ([]insertAnswer, error) {
	rows, err := db.Query(ctx, insertGroupSQL, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var answers []insertAnswer
	for rows.Next() {
		var a insertAnswer
		var readmitted bool
		var superseded, running []string
		if a.work, err = scanWorkWith(rows, &readmitted, &a.req, &a.kind, &superseded, &running); err != nil {
			return nil, err
		}
		a.work.Superseded, a.work.SupersededRunning = superseded, running
		answers = append(answers, a)
	}
	return answers, rows.Err()
}

// announceAfter writes, in a statement of its own after the fence's, what
// the fence's statement could not announce: the cancels of the running
// revisions new work superseded, and the announcement of dropped work
// queued again, whose dispatch number the statement chose. Should this be
// lost, the sweeper announces queued work again, and a superseded worker
// learns of it at its next lease heartbeat.
func announceAfter(ctx context.Context, db execer, got *Work, announce func(*Work) ([]OutboxMsg, error)) error {
	if got.State != outcome.Queued || (got.Announced != nil && len(got.SupersededRunning) == 0) {
		return nil
	}
	all, err := announce(got)
	if err != nil {
		return fmt.Errorf("store: insert work: %w", err)
	}
	rest := slices.DeleteFunc(all, func(m OutboxMsg) bool {
		return slices.ContainsFunc(got.Announced, func(a OutboxMsg) bool { return a.MsgID == m.MsgID })
	})
	var ob outboxRows
	if err := ob.add("", rest); err != nil {
		return err
	}
	if _, err := db.Exec(ctx, outboxInsert(1, "true"), ob.args()...); err != nil {
		return fmt.Errorf("store: announce %s: %w", got.ID, err)
	}
	got.Announced = append(got.Announced, rest...)
	return nil
}

// insertGroupArgs are insertGroupSQL's arguments for reqs[take], each row
// announced as it will read when new (dispatch 1): the announcements by
// request. A request whose announcement cannot be made gets its error in
// out and no row (an empty id, which the statement skips).
func insertGroupArgs(reqs []InsertReq, take []int, out []WorkInserted) (args []any, announced map[int][]OutboxMsg) {
	n := len(take)
	ids, tenants, regions, contracts, schemas, taxonomies, sources, revisions, lanes, inputs, digests, traces, models, prompts, shadows, drops :=
		make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n),
		make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n),
		make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	deadlines, supersede, sourceTimes, direct := make([]time.Time, n), make([]bool, n), make([]*time.Time, n), make([]bool, n)
	var ob outboxRows
	announced = map[int][]OutboxMsg{}
	for k, i := range take {
		w := reqs[i].Work
		first := *w
		first.Dispatch, first.Superseded, first.SupersededRunning, first.State = 1, nil, nil, outcome.Queued
		msgs, err := reqs[i].Announce(&first)
		if reqs[i].Publish {
			NoRows(msgs)
		}
		if err == nil {
			err = ob.add(w.ID, msgs)
		}
		if err != nil {
			out[i].Err = fmt.Errorf("store: insert work: %w", err)
			continue
		}
		announced[i] = msgs
		ids[k], tenants[k], regions[k], contracts[k], schemas[k], taxonomies[k] = w.ID, w.TenantID, w.Region, w.Contract, w.SchemaVersion, w.TaxonomyVersion
		sources[k], revisions[k], lanes[k], inputs[k], digests[k], deadlines[k] = w.SourceID, w.Revision, w.Lane, w.Input, w.Digest, w.DeadlineAt
		traces[k], supersede[k], models[k], prompts[k], shadows[k] = w.Traceparent, w.SupersedeOlder, w.Model, w.PromptDigest, w.ShadowOf
		drops[k], sourceTimes[k], direct[k] = w.DropReason, sourceTime(w.SourceUpdatedAt), !reqs[i].Item
	}
	args = append([]any{ids, tenants, regions, contracts, schemas, taxonomies, sources, revisions, lanes, inputs, digests,
		deadlines, traces, supersede, models, prompts, shadows, drops, sourceTimes, direct}, ob.args()...)
	return args, announced
}

// insertGroupSQL is the ingress fence's statement. For each request (x, one
// per source):
//   - found is the row its ingress key already names, if any, whatever
//     its id, looked up by id and by key each through its own index (the
//     two asked in one condition scanned the whole table); me is the
//     request as a revision of its source: the found row's id and times,
//     or the new row's (its source time, and now() as it arrives);
//   - late names a later revision of its source already here, when it
//     supersedes (revisionAfter; a partial review's rests are the same
//     revision): it is then stored superseded and supersedes nothing;
//   - ins inserts a new row, queued, dropped with its reason, or
//     superseded when late, direct unless it is a batch's item; ex marks
//     a found row asked for on its own direct, and queues it again when
//     it was dropped and is asked for without a drop, under the next
//     dispatch number;
//   - sup supersedes, for each row created (new or queued again) and not
//     late, the source's other unfinished revisions it comes after;
//   - ob writes the announcements of the new rows that are queued.
//
// Rows are inserted and locked in id order, so that two groups naming the
// same work (two batches) wait for each other instead of deadlocking.
//
// It answers each request's row with what became of it (new, readmitted
// or found) and what it superseded; a request whose key a copy committed
// after the statement began took is not answered.
var insertGroupSQL = `WITH x AS (
			SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
				$9::text[], $10::text[], $11::text[], $12::timestamptz[], $13::text[], $14::bool[], $15::text[], $16::text[], $17::text[],
				$18::text[], $19::timestamptz[], $20::bool[])
				AS x(r_id, r_tenant, r_region, r_contract, r_schema, r_taxonomy, r_source, r_revision, r_lane, r_input,
					r_digest, r_deadline, r_trace, r_supersede, r_model, r_prompt, r_shadow, r_drop, r_source_time, r_direct)
			WHERE x.r_id <> ''
		), found AS (
			SELECT w.* FROM work w WHERE w.id IN (
				SELECT r_id FROM x
				UNION ALL SELECT k.id FROM x JOIN work k ON k.tenant_id = x.r_tenant AND k.contract = x.r_contract
					AND k.source_id = x.r_source AND k.revision = x.r_revision)
		), me AS (
			SELECT x.*, coalesce(f.id, x.r_id) AS row_id, f.id IS NOT NULL AS taken, coalesce(f.direct, true) AS was_direct,
				coalesce(f.dispatch, 0) AS was_dispatch,
				CASE WHEN f.id IS NULL THEN x.r_source_time ELSE f.source_updated_at END AS source_updated_at,
				coalesce(f.created_at, now()) AS created_at
			FROM x LEFT JOIN found f ON f.tenant_id = x.r_tenant AND f.contract = x.r_contract AND f.source_id = x.r_source
				AND f.revision = x.r_revision
		), late AS (
			SELECT DISTINCT ON (me.r_id) me.r_id AS late_id, o.revision AS late_revision
			FROM me JOIN work o ON o.tenant_id = me.r_tenant AND o.contract = me.r_contract AND o.source_id = me.r_source
			WHERE me.r_supersede AND coalesce(o.rest_of, o.id) <> me.row_id AND ` + revisionAfter("o", "me") + `
			ORDER BY me.r_id, coalesce(o.source_updated_at, o.created_at) DESC
		), ins AS (
			INSERT INTO work (id, tenant_id, region, contract, schema_version, taxonomy_version, source_id, revision, lane, input,
				content_digest, deadline_at, source_updated_at, state, reason, traceparent, model, prompt_digest, shadow_of, direct)
			SELECT me.r_id, me.r_tenant, me.r_region, me.r_contract, me.r_schema, me.r_taxonomy, me.r_source, me.r_revision,
				me.r_lane, me.r_input, me.r_digest, me.r_deadline, me.r_source_time,
				CASE WHEN late.late_id IS NOT NULL THEN '` + outcome.Superseded + `' WHEN me.r_drop <> '' THEN '` + outcome.Dropped + `'
					ELSE '` + outcome.Queued + `' END,
				CASE WHEN late.late_id IS NOT NULL THEN 'revision ' || late.late_revision || ' was pushed later'
					ELSE nullif(me.r_drop, '') END,
				nullif(me.r_trace, ''), nullif(me.r_model, ''), nullif(me.r_prompt, ''), nullif(me.r_shadow, ''), me.r_direct
			FROM me LEFT JOIN late ON late.late_id = me.r_id
			WHERE NOT me.taken
			ORDER BY me.r_id
			ON CONFLICT DO NOTHING
			RETURNING ` + workColumns + `
		), ex AS (
			UPDATE work w SET direct = w.direct OR m.r_direct,
				state = CASE WHEN w.state <> '` + outcome.Dropped + `' OR m.r_drop <> '' THEN w.state
					WHEN late.late_id IS NOT NULL THEN '` + outcome.Superseded + `' ELSE '` + outcome.Queued + `' END,
				reason = CASE WHEN w.state <> '` + outcome.Dropped + `' OR m.r_drop <> '' THEN w.reason
					WHEN late.late_id IS NOT NULL THEN 'revision ' || late.late_revision || ' was pushed later' END,
				deadline_at = CASE WHEN w.state = '` + outcome.Dropped + `' AND m.r_drop = '' THEN m.r_deadline ELSE w.deadline_at END,
				dispatch = w.dispatch + CASE WHEN w.state = '` + outcome.Dropped + `' AND m.r_drop = '' THEN 1 ELSE 0 END,
				updated_at = CASE WHEN w.state = '` + outcome.Dropped + `' AND m.r_drop = '' THEN now() ELSE w.updated_at END,
				outcome_announced_at = CASE WHEN w.state = '` + outcome.Dropped + `' AND m.r_drop = '' THEN NULL
					ELSE w.outcome_announced_at END
			FROM (SELECT r_id, row_id, r_drop, r_deadline, r_direct, taken, was_direct, was_dispatch FROM me) m
				LEFT JOIN late ON late.late_id = m.r_id
			WHERE w.id IN (SELECT row_id FROM me WHERE taken) AND w.id = m.row_id AND m.taken
				AND ((m.r_direct AND NOT m.was_direct) OR (w.state = '` + outcome.Dropped + `' AND m.r_drop = ''))
			RETURNING ` + workColumns + `, w.dispatch > m.was_dispatch AS readmitted, m.r_id AS req
		), mine AS (
			SELECT me.row_id, me.r_tenant, me.r_contract, me.r_source, me.r_revision, me.source_updated_at, me.created_at
			FROM me
			WHERE me.r_supersede AND me.r_id NOT IN (SELECT late_id FROM late)
				AND (me.row_id IN (SELECT id FROM ins) OR me.row_id IN (SELECT id FROM ex WHERE readmitted))
		), old AS (
			SELECT w.id, w.state, mine.row_id AS by_id, mine.r_revision AS revision
			FROM mine JOIN work w ON w.tenant_id = mine.r_tenant AND w.contract = mine.r_contract AND w.source_id = mine.r_source
			WHERE w.id <> mine.row_id AND w.state IN ('` + outcome.Queued + `', '` + outcome.Running + `') AND ` + revisionAfter("mine", "w") + `
			ORDER BY w.id FOR UPDATE OF w
		), sup AS (
			UPDATE work w SET state = '` + outcome.Superseded + `', lease_token = NULL, lease_expires_at = NULL,
				reason = 'superseded by revision ' || old.revision, updated_at = now()
			FROM old WHERE w.id = old.id
			RETURNING w.id, old.state, old.by_id
		), ob AS (` + outboxInsert(21, `m.tag IN (SELECT id FROM ins WHERE state = '`+outcome.Queued+`')`) + `), answer AS (
			SELECT ins.*, false AS readmitted, ins.id AS req, 'new' AS kind FROM ins
			UNION ALL SELECT ex.*, CASE WHEN ex.readmitted THEN 'readmitted' ELSE 'found' END FROM ex
			UNION ALL SELECT fw.*, false, fr.req, 'found'
			FROM (SELECT ` + workColumns + ` FROM found WHERE id NOT IN (SELECT id FROM ex)) fw
				JOIN (SELECT row_id, r_id AS req FROM me WHERE taken) fr ON fr.row_id = fw.id
		)
		SELECT answer.*,
			coalesce((SELECT array_agg(sup.id ORDER BY sup.id) FROM sup WHERE sup.by_id = answer.id), '{}'),
			coalesce((SELECT array_agg(sup.id ORDER BY sup.id) FROM sup WHERE sup.by_id = answer.id AND sup.state = '` + outcome.Running + `'), '{}')
		FROM answer`
