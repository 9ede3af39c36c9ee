package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// ErrCheckNotPassed refuses a promotion whose candidate has no passed
// rollout check of its own.
var ErrCheckNotPassed = errors.New("no passed rollout check for exactly this version, model and prompt")

// Routes reads every route.
func (s *Store) Routes(ctx context.Context) ([]Route, error) {
	rows, err := s.pool.Query(ctx, `SELECT scope, contract, live_version, coalesce(live_model, ''),
			coalesce(live_prompt, ''), coalesce(candidate_version, ''), coalesce(candidate_model, ''),
			coalesce(candidate_prompt, ''), shadow_share, updated_at, coalesce(updated_by, '')
		FROM contract_routes ORDER BY contract, scope`)
	if err != nil {
		return nil, fmt.Errorf("store: routes: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Route, error) {
		var rt Route
		var share float32
		err := r.Scan(&rt.Scope, &rt.Contract, &rt.Live.Version, &rt.Live.Model, &rt.Live.Prompt, &rt.Candidate.Version,
			&rt.Candidate.Model, &rt.Candidate.Prompt, &share, &rt.UpdatedAt, &rt.UpdatedBy)
		rt.ShadowShare = float64(share)
		return rt, err
	})
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

// SetLive makes v what new work of the contract gets in scope, at once and
// without a check: the first route of a contract, or a way back. A
// candidate stays as it was.
func (s *Store) SetLive(ctx context.Context, scope, contract string, v Variant, by string) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO contract_routes (scope, contract, live_version, live_model, live_prompt, updated_by)
		VALUES ($1, $2, $3, NULLIF($4, ''), NULLIF($5, ''), NULLIF($6, ''))
		ON CONFLICT (scope, contract) DO UPDATE SET live_version = EXCLUDED.live_version,
			live_model = EXCLUDED.live_model, live_prompt = EXCLUDED.live_prompt,
			updated_by = EXCLUDED.updated_by, updated_at = now()`,
		scope, contract, v.Version, v.Model, v.Prompt, by)
	if err != nil {
		return fmt.Errorf("store: route %s %s: %w", scope, contract, err)
	}
	return nil
}

// SetCandidate names the candidate of a route and the share of live work
// that also runs with it; a route the scope has no row for starts with
// live as given. A zero Variant clears the candidate.
func (s *Store) SetCandidate(ctx context.Context, scope, contract string, live, cand Variant, share float64, by string) error {
	if cand.Version == "" {
		share = 0
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO contract_routes (scope, contract, live_version, live_model, live_prompt,
			candidate_version, candidate_model, candidate_prompt, shadow_share, updated_by)
		VALUES ($1, $2, $3, NULLIF($4, ''), NULLIF($5, ''), NULLIF($6, ''), NULLIF($7, ''), NULLIF($8, ''), $9, NULLIF($10, ''))
		ON CONFLICT (scope, contract) DO UPDATE SET candidate_version = EXCLUDED.candidate_version,
			candidate_model = EXCLUDED.candidate_model, candidate_prompt = EXCLUDED.candidate_prompt,
			shadow_share = EXCLUDED.shadow_share, updated_by = EXCLUDED.updated_by, updated_at = now()`,
		scope, contract, live.Version, live.Model, live.Prompt, cand.Version, cand.Model, cand.Prompt, share, by)
	if err != nil {
		return fmt.Errorf("store: route %s %s: %w", scope, contract, err)
	}
	return nil
}

// Promote makes a route's candidate its live variant, only when the last
// finished rollout check of exactly that version, model and prompt passed
// (ownPrompt gives a version's own prompt digest, for a candidate that
// names none). It returns the check that allowed it; ErrCheckNotPassed
// (wrapped, with the last check's state) when none did, ErrNotFound when
// the route has no candidate.
func (s *Store) Promote(ctx context.Context, scope, contract string, ownPrompt func(version string) string, by string) (Route, int64, error) {
	var rt Route
	var checkID int64
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
		digest := rt.Candidate.Prompt
		if digest == "" {
			digest = ownPrompt(rt.Candidate.Version)
		}
		var state string
		err = tx.QueryRow(ctx, `SELECT id, state FROM rollout_checks
			WHERE contract = $1 AND schema_version = $2 AND model = $3 AND prompt_digest = $4 AND state <> 'running'
			ORDER BY id DESC LIMIT 1`, contract, rt.Candidate.Version, rt.Candidate.Model, digest).Scan(&checkID, &state)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %s (model %q, prompt %s) was never checked", ErrCheckNotPassed, rt.Candidate.Version,
				rt.Candidate.Model, digest)
		}
		if err != nil {
			return err
		}
		if state != "passed" {
			return fmt.Errorf("%w: the last check of %s (model %q, prompt %s), #%d, %s", ErrCheckNotPassed,
				rt.Candidate.Version, rt.Candidate.Model, digest, checkID, state)
		}
		_, err = tx.Exec(ctx, `UPDATE contract_routes SET live_version = candidate_version, live_model = candidate_model,
				live_prompt = candidate_prompt, candidate_version = NULL, candidate_model = NULL, candidate_prompt = NULL,
				shadow_share = 0, updated_by = NULLIF($3, ''), updated_at = now()
			WHERE scope = $1 AND contract = $2`, scope, contract, by)
		rt.Scope, rt.Contract = scope, contract
		rt.Live, rt.Candidate = rt.Candidate, Variant{}
		return err
	})
	if err != nil {
		if errors.Is(err, ErrNotFound) || errors.Is(err, ErrCheckNotPassed) {
			return Route{}, checkID, err
		}
		return Route{}, 0, fmt.Errorf("store: promote %s %s: %w", scope, contract, err)
	}
	return rt, checkID, nil
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
