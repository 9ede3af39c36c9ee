package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// RouteAll is the scope of the route every tenant without one of its own
// follows.
const RouteAll = "*"

// Route says which version of a contract new work gets, and what runs
// beside it in the shadow.
type Route struct {
	Scope    string // RouteAll or a tenant id
	Contract string
	// Live is what new work is made of: a schema version, the model it is
	// asked of ("": the cell's) and its prompt's digest ("": the version's
	// own prompt).
	Live Variant
	// Candidate, when Version is not "", is what a share of live work also
	// runs with, in the shadow.
	Candidate   Variant
	ShadowShare float64
	UpdatedAt   time.Time
	UpdatedBy   string
	// Override, when not nil, is the change that made Live live without a
	// passed rollout check: who overrode the fence, and why.
	Override *RouteChange `json:",omitempty"`
}

// Variant is one way of asking for a contract: a version, a model and a
// prompt.
type Variant struct {
	Version string `json:"version"`
	Model   string `json:"model,omitempty"`
	Prompt  string `json:"prompt,omitempty"` // a digest; "": the version's own
}

// Label names the variant in a line: its version, its model when it is
// not the cell's and its prompt's short digest when it is not the
// version's own.
func (v Variant) Label() string {
	s := v.Version
	if v.Model != "" {
		s += " " + v.Model
	}
	if v.Prompt != "" {
		s += " " + ShortDigest(v.Prompt)
	}
	return s
}

// ShortDigest is a prompt digest cut to "sha256:" and 12 hex digits.
func ShortDigest(d string) string {
	if len(d) > len("sha256:")+12 {
		return d[:len("sha256:")+12]
	}
	return d
}

// ErrCheckNotPassed refuses a move of live traffic to a variant that has
// no passed rollout check of its own (an *UncheckedError says which).
var ErrCheckNotPassed = errors.New("no passed rollout check for exactly this version, model and prompt")

// UncheckedError refuses a move of a route's live traffic to a variant
// whose last finished rollout check did not pass, or that was never
// checked. It is ErrCheckNotPassed.
type UncheckedError struct {
	Contract string
	Variant  Variant
	// Digest is the prompt digest the check is looked up by: the
	// variant's own, or its version's.
	Digest string
	// LastCheck is the last finished check of the variant, 0 when none;
	// LastState its state.
	LastCheck int64
	LastState string
}

func (e *UncheckedError) Error() string {
	model := "the cell's model"
	if e.Variant.Model != "" {
		model = "model " + e.Variant.Model
	}
	if e.LastCheck == 0 {
		return fmt.Sprintf("%v: %s with %s and prompt %s was never checked", ErrCheckNotPassed, e.Variant.Version, model, e.Digest)
	}
	return fmt.Sprintf("%v: the last check of %s with %s and prompt %s, #%d, %s", ErrCheckNotPassed, e.Variant.Version,
		model, e.Digest, e.LastCheck, e.LastState)
}

func (e *UncheckedError) Unwrap() error { return ErrCheckNotPassed }

// The verbs of a route's history.
const (
	ChangeSetLive      = "set-live"
	ChangePromote      = "promote"
	ChangeSetCandidate = "set-candidate"
	// ChangeOverride is a move of live traffic, by set-live or promote,
	// that no passed check allowed: an operator overrode the fence.
	ChangeOverride = "override"
)

// RouteChange is one change of a route, as its history keeps it.
type RouteChange struct {
	ID       int64     `json:"id"`
	Scope    string    `json:"scope"`
	Contract string    `json:"contract"`
	At       time.Time `json:"at"`
	By       string    `json:"by"`
	Verb     string    `json:"verb"`
	// From and To are the live variant before and after (the candidate's,
	// for set-candidate: a Version of "" is none).
	From Variant `json:"from"`
	To   Variant `json:"to"`
	// CheckID is the passed rollout check that allowed a move of live
	// traffic; 0 for none (the shipped default, an override, a candidate).
	CheckID int64 `json:"checkId,omitempty"`
	// Reason is why an override moved without a passed check.
	Reason string `json:"reason,omitempty"`
}

// Shipped is what the rollout fence knows of a contract as it ships.
type Shipped struct {
	// Default is the contract's default version: what its new work gets
	// without a route.
	Default string
	// OwnPrompt is a version's own prompt digest, for a variant that names
	// none.
	OwnPrompt func(version string) string
}

// digest is the prompt digest v is asked with.
func (sh Shipped) digest(v Variant) string {
	if v.Prompt != "" || sh.OwnPrompt == nil {
		return v.Prompt
	}
	return sh.OwnPrompt(v.Version)
}

// routeChangeColumns read a route_changes row c in RouteChange's order.
const routeChangeColumns = `c.id, c.scope, c.contract, c.at, c.changed_by, c.verb, c.from_version, c.from_model,
	c.from_prompt, c.to_version, c.to_model, c.to_prompt, coalesce(c.check_id, 0), coalesce(c.reason, '')`

func (c *RouteChange) fields() []any {
	return []any{&c.ID, &c.Scope, &c.Contract, &c.At, &c.By, &c.Verb, &c.From.Version, &c.From.Model, &c.From.Prompt,
		&c.To.Version, &c.To.Model, &c.To.Prompt, &c.CheckID, &c.Reason}
}

// routeColumns read a route of table t (its name or its alias) in
// scanRoute's order: the override that made its live variant live comes
// as JSON, NULL when it got there otherwise (a tenant's route made from
// every tenant's carries that route's change).
func routeColumns(t string) string {
	return fmt.Sprintf(`%[1]s.scope, %[1]s.contract, %[1]s.live_version, coalesce(%[1]s.live_model, ''),
		coalesce(%[1]s.live_prompt, ''), coalesce(%[1]s.candidate_version, ''), coalesce(%[1]s.candidate_model, ''),
		coalesce(%[1]s.candidate_prompt, ''), %[1]s.shadow_share, %[1]s.updated_at, coalesce(%[1]s.updated_by, ''),
		(SELECT jsonb_build_object('id', o.id, 'scope', o.scope, 'contract', o.contract, 'at', o.at, 'by', o.changed_by,
				'verb', o.verb, 'reason', o.reason,
				'from', jsonb_build_object('version', o.from_version, 'model', o.from_model, 'prompt', o.from_prompt))
			FROM route_changes o WHERE o.id = %[1]s.live_change AND o.verb = 'override')`, t)
}

// scanRoute scans routeColumns, then more.
func scanRoute(r pgx.CollectableRow, more ...any) (Route, error) {
	var rt Route
	var share float32
	var override []byte
	err := r.Scan(append([]any{&rt.Scope, &rt.Contract, &rt.Live.Version, &rt.Live.Model, &rt.Live.Prompt,
		&rt.Candidate.Version, &rt.Candidate.Model, &rt.Candidate.Prompt, &share, &rt.UpdatedAt, &rt.UpdatedBy,
		&override}, more...)...)
	rt.ShadowShare = float64(share)
	if err == nil && override != nil {
		rt.Override = &RouteChange{}
		err = json.Unmarshal(override, rt.Override)
		rt.Override.To = rt.Live
	}
	return rt, err
}

// Routes reads every route.
func (s *Store) Routes(ctx context.Context) ([]Route, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+routeColumns("contract_routes")+`
		FROM contract_routes ORDER BY contract, scope`)
	if err != nil {
		return nil, fmt.Errorf("store: routes: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Route, error) { return scanRoute(r) })
	if err != nil {
		return nil, fmt.Errorf("store: routes: %w", err)
	}
	return out, nil
}

// PutPrompt stores a prompt's text under its digest (idempotent).
func (s *Store) PutPrompt(ctx context.Context, contract, digest, body string) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO contract_prompts (digest, contract, body) VALUES ($1, $2, $3)
		ON CONFLICT (digest) DO NOTHING`, digest, contract, body)
	if err != nil {
		return fmt.Errorf("store: prompt %s: %w", digest, err)
	}
	return nil
}

// Prompt reads a stored prompt's text.
func (s *Store) Prompt(ctx context.Context, digest string) (string, error) {
	var body string
	err := s.pool.QueryRow(ctx, `SELECT body FROM contract_prompts WHERE digest = $1`, digest).Scan(&body)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("store: prompt %s: %w", digest, err)
	}
	return body, nil
}

// moveLive is the rollout fence. A route's live traffic moves to a
// variant only when the last finished rollout check of exactly its
// version, model and prompt digest passed, whatever moves it (set-live or
// promote), decided in the transaction that moves it. Needing no check:
//   - the variant already live, which moves nothing (and is not recorded
//     unless a check of it passed: moved is false);
//   - the contract's default version with the cell's model and its own
//     prompt: what the contract ships with, what new work gets without a
//     route, and so the way back that is always open.
//
// Any other way back, to a variant that was live on the route before,
// needs its check like any move: having served traffic is not a check (it
// may have gone live by an override, or failed a check since). Without a
// passed check only an override moves live traffic, and its reason is
// kept. moveLive returns the change to record, or an *UncheckedError.
func moveLive(ctx context.Context, tx pgx.Tx, contract string, from, to Variant, sh Shipped, verb, override string) (RouteChange, bool, error) {
	ch := RouteChange{Contract: contract, Verb: verb, From: from, To: to}
	digest := sh.digest(to)
	var state string
	err := tx.QueryRow(ctx, `SELECT id, state FROM rollout_checks
		WHERE contract = $1 AND schema_version = $2 AND model = $3 AND prompt_digest = $4 AND state <> 'running'
		ORDER BY id DESC LIMIT 1`, contract, to.Version, to.Model, digest).Scan(&ch.CheckID, &state)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return ch, false, err
	}
	switch {
	case state == "passed":
		return ch, true, nil
	case to == from:
		ch.CheckID = 0
		return ch, false, nil
	case to == Variant{Version: sh.Default}:
		ch.CheckID = 0
		return ch, true, nil
	case strings.TrimSpace(override) != "":
		ch.CheckID, ch.Verb, ch.Reason = 0, ChangeOverride, strings.TrimSpace(override)
		return ch, true, nil
	}
	return ch, false, &UncheckedError{Contract: contract, Variant: to, Digest: digest, LastCheck: ch.CheckID, LastState: state}
}

// lockRoute locks a route's row for the rest of tx and reads it; a scope
// without one gets a row of its own that follows what its new work gets
// now (every tenant's route, or the contract's default version).
func lockRoute(ctx context.Context, tx pgx.Tx, scope, contract string, sh Shipped) (Route, error) {
	_, err := tx.Exec(ctx, `INSERT INTO contract_routes (scope, contract, live_version, live_model, live_prompt, live_change)
		SELECT $1, $2, coalesce(a.live_version, $3), a.live_model, a.live_prompt, a.live_change
		FROM (SELECT 1) one LEFT JOIN contract_routes a ON a.scope = '*' AND a.contract = $2 AND $1 <> '*'
		ON CONFLICT (scope, contract) DO NOTHING`, scope, contract, sh.Default)
	if err != nil {
		return Route{}, err
	}
	rt := Route{Scope: scope, Contract: contract}
	err = tx.QueryRow(ctx, `SELECT live_version, coalesce(live_model, ''), coalesce(live_prompt, ''),
			coalesce(candidate_version, ''), coalesce(candidate_model, ''), coalesce(candidate_prompt, '')
		FROM contract_routes WHERE scope = $1 AND contract = $2 FOR UPDATE`, scope, contract).
		Scan(&rt.Live.Version, &rt.Live.Model, &rt.Live.Prompt, &rt.Candidate.Version, &rt.Candidate.Model, &rt.Candidate.Prompt)
	return rt, err
}

// recordChange adds ch to its route's history, as made now by by, and
// returns it with its id and time.
func recordChange(ctx context.Context, tx pgx.Tx, ch RouteChange, by string) (RouteChange, error) {
	ch.By = by
	var check *int64
	if ch.CheckID != 0 {
		check = &ch.CheckID
	}
	err := tx.QueryRow(ctx, `INSERT INTO route_changes (scope, contract, changed_by, verb, from_version, from_model,
			from_prompt, to_version, to_model, to_prompt, check_id, reason)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, NULLIF($12, ''))
		RETURNING id, at`, ch.Scope, ch.Contract, by, ch.Verb, ch.From.Version, ch.From.Model, ch.From.Prompt,
		ch.To.Version, ch.To.Model, ch.To.Prompt, check, ch.Reason).Scan(&ch.ID, &ch.At)
	return ch, err
}

// SetLive makes v what new work of the contract gets in scope, behind the
// rollout fence (a passed check of exactly v, or v already live or the
// contract's default as shipped), or anyway with an override: its reason
// ("" for none). The move and its record in the route's history are one
// transaction; a candidate stays as it was. It returns the change made
// (ID 0 when v was live already); an *UncheckedError when the fence
// refuses.
func (s *Store) SetLive(ctx context.Context, scope, contract string, v Variant, sh Shipped, override, by string) (RouteChange, error) {
	var ch RouteChange
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rt, err := lockRoute(ctx, tx, scope, contract, sh)
		if err != nil {
			return err
		}
		var moved bool
		if ch, moved, err = moveLive(ctx, tx, contract, rt.Live, v, sh, ChangeSetLive, override); err != nil || !moved {
			return err
		}
		ch.Scope = scope
		if ch, err = recordChange(ctx, tx, ch, by); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE contract_routes SET live_version = $3, live_model = NULLIF($4, ''),
				live_prompt = NULLIF($5, ''), live_change = $6, updated_by = NULLIF($7, ''), updated_at = now()
			WHERE scope = $1 AND contract = $2`, scope, contract, v.Version, v.Model, v.Prompt, ch.ID, by)
		return err
	})
	if err != nil {
		if errors.Is(err, ErrCheckNotPassed) {
			return RouteChange{}, err
		}
		return RouteChange{}, fmt.Errorf("store: route %s %s: %w", scope, contract, err)
	}
	return ch, nil
}

// SetCandidate names the candidate of a route and the share of live work
// that also runs with it, and records the change in the route's history;
// a scope without a route of its own gets one that follows what its new
// work gets now. A zero Variant clears the candidate.
func (s *Store) SetCandidate(ctx context.Context, scope, contract string, cand Variant, share float64, sh Shipped, by string) error {
	if cand.Version == "" {
		share = 0
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rt, err := lockRoute(ctx, tx, scope, contract, sh)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE contract_routes SET candidate_version = NULLIF($3, ''),
				candidate_model = NULLIF($4, ''), candidate_prompt = NULLIF($5, ''), shadow_share = $6,
				updated_by = NULLIF($7, ''), updated_at = now()
			WHERE scope = $1 AND contract = $2`, scope, contract, cand.Version, cand.Model, cand.Prompt, share, by)
		if err != nil {
			return err
		}
		_, err = recordChange(ctx, tx, RouteChange{Scope: scope, Contract: contract, Verb: ChangeSetCandidate,
			From: rt.Candidate, To: cand}, by)
		return err
	})
	if err != nil {
		return fmt.Errorf("store: route %s %s: %w", scope, contract, err)
	}
	return nil
}

// Promote makes a route's candidate its live variant behind the rollout
// fence, as SetLive does, or anyway with an override: its reason ("" for
// none). It returns the route and the change recorded in its history (its
// CheckID, the check that allowed it); an *UncheckedError when the fence
// refuses, ErrNotFound when the route has no candidate.
func (s *Store) Promote(ctx context.Context, scope, contract string, sh Shipped, override, by string) (Route, RouteChange, error) {
	var rt Route
	var ch RouteChange
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `SELECT live_version, coalesce(live_model, ''), coalesce(live_prompt, ''),
				coalesce(candidate_version, ''), coalesce(candidate_model, ''), coalesce(candidate_prompt, '')
			FROM contract_routes WHERE scope = $1 AND contract = $2 FOR UPDATE`, scope, contract).
			Scan(&rt.Live.Version, &rt.Live.Model, &rt.Live.Prompt, &rt.Candidate.Version, &rt.Candidate.Model, &rt.Candidate.Prompt)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && rt.Candidate.Version == "") {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		var moved bool
		if ch, moved, err = moveLive(ctx, tx, contract, rt.Live, rt.Candidate, sh, ChangePromote, override); err != nil {
			return err
		}
		// The candidate goes even when it was live already: the change is
		// recorded, but it is not what put the live variant there.
		ch.Scope = scope
		if ch, err = recordChange(ctx, tx, ch, by); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE contract_routes SET live_version = candidate_version, live_model = candidate_model,
				live_prompt = candidate_prompt, candidate_version = NULL, candidate_model = NULL, candidate_prompt = NULL,
				shadow_share = 0, live_change = CASE WHEN $4 THEN $5 ELSE live_change END,
				updated_by = NULLIF($3, ''), updated_at = now()
			WHERE scope = $1 AND contract = $2`, scope, contract, by, moved, ch.ID)
		rt.Scope, rt.Contract = scope, contract
		rt.Live, rt.Candidate = rt.Candidate, Variant{}
		return err
	})
	if err != nil {
		if errors.Is(err, ErrNotFound) || errors.Is(err, ErrCheckNotPassed) {
			return Route{}, RouteChange{}, err
		}
		return Route{}, RouteChange{}, fmt.Errorf("store: promote %s %s: %w", scope, contract, err)
	}
	return rt, ch, nil
}

// RouteHistory reads the last perRoute changes of each route of a
// contract, newest first.
func (s *Store) RouteHistory(ctx context.Context, contract string, perRoute int) ([]RouteChange, error) {
	return routeChanges(ctx, s.pool, contract, "", perRoute)
}

// routeChanges reads the last perRoute changes of each route of contract
// ("": every contract's) that applies to tenant ("": every route), newest
// first.
func routeChanges(ctx context.Context, q querier, contract, tenant string, perRoute int) ([]RouteChange, error) {
	rows, err := q.Query(ctx, `SELECT `+routeChangeColumns+` FROM (SELECT *, row_number() OVER
				(PARTITION BY scope, contract ORDER BY id DESC) AS n
			FROM route_changes WHERE ($1 = '' OR contract = $1) AND ($2 = '' OR scope IN ('*', $2))) c
		WHERE c.n <= $3 ORDER BY c.id DESC`, contract, tenant, perRoute)
	if err != nil {
		return nil, fmt.Errorf("store: route history: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RouteChange, error) {
		var c RouteChange
		err := r.Scan(c.fields()...)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: route history: %w", err)
	}
	return out, nil
}

// RolloutCheck is one run of assay rollout check.
type RolloutCheck struct {
	ID            int64
	Contract      string
	SchemaVersion string
	Model         string
	PromptDigest  string
	TenantID      string
	State         string // running, passed, failed
	Report        json.RawMessage
	StartedAt     time.Time
	EndedAt       time.Time
}

// StartCheck records a rollout check that is starting.
func (s *Store) StartCheck(ctx context.Context, c RolloutCheck) (int64, error) {
	var id int64
	err := s.pool.QueryRow(ctx, `INSERT INTO rollout_checks (contract, schema_version, model, prompt_digest, tenant_id)
		VALUES ($1, $2, $3, $4, $5) RETURNING id`, c.Contract, c.SchemaVersion, c.Model, c.PromptDigest, c.TenantID).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("store: start check: %w", err)
	}
	return id, nil
}

// EndCheck records a check's verdict and report.
func (s *Store) EndCheck(ctx context.Context, id int64, passed bool, report json.RawMessage) error {
	state := "failed"
	if passed {
		state = "passed"
	}
	_, err := s.pool.Exec(ctx, `UPDATE rollout_checks SET state = $2, report = $3, ended_at = now() WHERE id = $1`, id, state, report)
	if err != nil {
		return fmt.Errorf("store: end check %d: %w", id, err)
	}
	return nil
}

// Checks reads the last limit rollout checks of a contract, newest first.
func (s *Store) Checks(ctx context.Context, contract string, limit int) ([]RolloutCheck, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, contract, schema_version, model, prompt_digest, tenant_id, state,
			report, started_at, coalesce(ended_at, 'epoch')
		FROM rollout_checks WHERE contract = $1 ORDER BY id DESC LIMIT $2`, contract, limit)
	if err != nil {
		return nil, fmt.Errorf("store: checks: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RolloutCheck, error) {
		var c RolloutCheck
		var report []byte
		err := r.Scan(&c.ID, &c.Contract, &c.SchemaVersion, &c.Model, &c.PromptDigest, &c.TenantID, &c.State,
			&report, &c.StartedAt, &c.EndedAt)
		c.Report = report
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: checks: %w", err)
	}
	return out, nil
}

// ShadowRun is what one shadow work item and its live twin came to.
type ShadowRun struct {
	Work, Live             *Work
	Output, LiveOutput     json.RawMessage // the accepted answers, nil when none
	Calls, LiveCalls       int             // ledgered calls
	CostMicros, LiveCost   int64
	LatencyMS, LiveLatency int64 // summed over the calls
}

// ShadowRuns reads the shadow work of a contract created since a time,
// with their live twins (for a rollout check's items, whose shadow_of is
// "check:<id>", pass that as of; "" reads the live traffic's shadows).
func (s *Store) ShadowRuns(ctx context.Context, contract, of string, since time.Time, limit int) ([]ShadowRun, error) {
	rows, err := s.pool.Query(ctx, `WITH s AS (SELECT `+workColumns+`, shadow_of AS of_id FROM work
			WHERE shadow_of IS NOT NULL AND contract = $1 AND created_at >= $2
				AND (CASE WHEN $3 = '' THEN shadow_of NOT LIKE 'check:%' ELSE shadow_of = $3 END)
			ORDER BY created_at DESC, id LIMIT $4)
		SELECT s.*, (SELECT output FROM results r WHERE r.work_id = s.id), sl.calls, sl.cost, sl.latency,
			coalesce(w.id, ''), coalesce(w.state, ''), coalesce(w.schema_version, ''),
			(SELECT output FROM results r WHERE r.work_id = w.id), coalesce(wl.calls, 0), coalesce(wl.cost, 0),
			coalesce(wl.latency, 0)
		FROM s LEFT JOIN work w ON w.id = s.of_id
		-- A work item's ledger rows by its attempts: the ledger's key.
		CROSS JOIN LATERAL (SELECT count(l.attempt_id) AS calls, coalesce(sum(l.cost_micros), 0) AS cost,
			coalesce(sum(l.latency_ms), 0) AS latency FROM attempts a JOIN ledger l ON l.attempt_id = a.id
			WHERE a.work_id = s.id) sl
		LEFT JOIN LATERAL (SELECT count(l.attempt_id) AS calls, coalesce(sum(l.cost_micros), 0) AS cost,
			coalesce(sum(l.latency_ms), 0) AS latency FROM attempts a JOIN ledger l ON l.attempt_id = a.id
			WHERE a.work_id = w.id) wl ON true
		ORDER BY s.created_at DESC, s.id`, contract, since, of, limit)
	if err != nil {
		return nil, fmt.Errorf("store: shadow runs: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ShadowRun, error) {
		var run ShadowRun
		var out, liveOut []byte
		var live Work
		var ofID string
		w, err := scanWorkWith(r, &ofID, &out, &run.Calls, &run.CostMicros, &run.LatencyMS, &live.ID, &live.State,
			&live.SchemaVersion, &liveOut, &run.LiveCalls, &run.LiveCost, &run.LiveLatency)
		if err != nil {
			return run, err
		}
		run.Work, run.Output = w, out
		if live.ID != "" {
			run.Live, run.LiveOutput = &live, liveOut
		}
		return run, nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: shadow runs: %w", err)
	}
	return out, nil
}
