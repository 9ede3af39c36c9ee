package store

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
)

// Announce builds the outbox rows that tell the cell a work item reached
// state (its outcome). It runs inside the transaction that ended the work.
type Announce func(w *Work, state string) ([]OutboxMsg, error)

// announceOutcome writes the outcome's rows and marks the work announced,
// so the sweep does not announce it again.
func announceOutcome(ctx context.Context, tx pgx.Tx, w *Work, state string, announce Announce) error {
	if announce == nil {
		return nil
	}
	msgs, err := announce(w, state)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE work SET outcome_announced_at = now() WHERE id = $1`, w.ID); err != nil {
		return fmt.Errorf("store: announce %s: %w", w.ID, err)
	}
	return insertOutbox(ctx, tx, msgs)
}

// AnnounceOutcomes announces up to limit work items that reached their
// outcome outside the commit transaction (superseded, expired, dropped,
// retry_exhausted, …) and were not announced yet, in one transaction. Work
// that is re-admitted after a drop is announced again at its next outcome.
func (s *Store) AnnounceOutcomes(ctx context.Context, limit int, announce Announce) (int, error) {
	n := 0
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		n = 0
		rows, err := tx.Query(ctx, `SELECT `+workColumns+` FROM work
			WHERE outcome_announced_at IS NULL AND state NOT IN ('queued', 'running')
			ORDER BY updated_at LIMIT $1 FOR UPDATE SKIP LOCKED`, limit)
		if err != nil {
			return err
		}
		ws, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Work, error) { return scanWork(r) })
		if err != nil {
			return err
		}
		for _, w := range ws {
			if err := announceOutcome(ctx, tx, w, w.State, announce); err != nil {
				return err
			}
		}
		n = len(ws)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("store: announce outcomes: %w", err)
	}
	return n, nil
}

// PullSource is where code-review work is published back to: a pull
// request revision and, for webhook work, the GitHub App installation that
// delivered it.
type PullSource struct {
	Owner, Repo string
	Number      int64
	HeadSHA     string
	BaseSHA     string
	// Webhook says a webhook delivery asked for the work. Installation is
	// its GitHub App installation, or for work submitted through the API
	// the installation the tenant linked for the repository; 0 for none.
	Webhook      bool
	Installation int64
}

// ErrNoPullSource is returned for work whose source is not a pull request.
var ErrNoPullSource = errors.New("work's source is not a pull request")

// PublishDelivery is what the first webhook delivery that asked for a work
// item says about where it is published.
type PublishDelivery struct {
	Installation int64
	BaseSHA      string
}

// PullSourceOf is the pull request w reviews: from its source id
// (owner/repo#number) and revision (the head SHA), with the delivery that
// asked for it, or else the tenant's installation links (work submitted
// through the API is published as the installation the tenant linked for
// the repository, if it linked one: never as another tenant's).
func PullSourceOf(w *Work, d *PublishDelivery, links []Link) (PullSource, error) {
	var p PullSource
	repo, num, ok := strings.Cut(w.SourceID, "#")
	owner, name, ok2 := strings.Cut(repo, "/")
	n, err := strconv.ParseInt(num, 10, 64)
	if !ok || !ok2 || err != nil || n <= 0 || owner == "" || name == "" {
		return p, fmt.Errorf("store: work %s source %q: %w", w.ID, w.SourceID, ErrNoPullSource)
	}
	p = PullSource{Owner: owner, Repo: name, Number: n, HeadSHA: w.Revision}
	if w.RestOf != "" {
		p.HeadSHA = HeadRevision(w.Revision)
	}
	if d != nil {
		p.Webhook, p.Installation, p.BaseSHA = true, d.Installation, d.BaseSHA
		return p, nil
	}
	p.Installation = installationOf(links, repo)
	return p, nil
}

// Covers reports whether one of an installation's repository patterns
// ("owner/*" or "owner/repo", as GitHub spells them) names repo.
func Covers(patterns []string, repo string) bool {
	owner, _, _ := strings.Cut(repo, "/")
	for _, p := range patterns {
		if p == repo || p == owner+"/*" {
			return true
		}
	}
	return false
}

// installationOf is the first of a tenant's installation links that covers
// repo, 0 when none does.
func installationOf(links []Link, repo string) int64 {
	for _, l := range links {
		if Covers(l.Repositories, repo) {
			if id, err := strconv.ParseInt(l.Key, 10, 64); err == nil {
				return id
			}
		}
	}
	return 0
}

// InstallationFor is the GitHub App installation a tenant linked for a
// repository ("owner/repo"), 0 when it linked none that covers it: what
// reads and writes the tenant's pull requests there.
func (s *Store) InstallationFor(ctx context.Context, tenant, repository string) (int64, error) {
	rows, err := s.pool.Query(ctx, `SELECT kind, key, tenant_id, repositories FROM tenant_sources
		WHERE kind = $1 AND tenant_id = $2 ORDER BY key`, SourceGitHubInstallation, tenant)
	if err != nil {
		return 0, fmt.Errorf("store: installations of %s: %w", tenant, err)
	}
	links, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Link, error) {
		var l Link
		err := r.Scan(&l.Kind, &l.Key, &l.Tenant, &l.Repositories)
		return l, err
	})
	if err != nil {
		return 0, fmt.Errorf("store: installations of %s: %w", tenant, err)
	}
	return installationOf(links, repository), nil
}

// PublishFacts are what publishing one outcome reads, read at once.
type PublishFacts struct {
	Work *Work
	// Output is the accepted result's output; nil when there is none.
	Output json.RawMessage
	// Coverage says what a review in parts covered (nil for work reviewed
	// whole): the result's attempt's coverage.
	Coverage json.RawMessage
	// CheckPolicy is the tenant's check-run policy.
	CheckPolicy string
	// Callback is the tenant's callback endpoint; nil when it has none.
	Callback *Callback
	// Delivery is the first webhook delivery that asked for the work; nil
	// for work submitted through the API, which has Links instead.
	Delivery *PublishDelivery
	Links    []Link
	// Reviewed is the answer a person resolved the work's review item with
	// from the console (approved or amended); nil when there is none. Once
	// there is, it is what the work publishes.
	Reviewed json.RawMessage
	// Newer is the revision of the same source, after the work's, that
	// replaces what it would publish: accepted, on its way (queued or
	// running), or published from the review screen. "" when there is none.
	Newer string
}

// PublishFacts reads, in one statement, the work, its result, its
// tenant's check policy and callback, and where it is published.
func (s *Store) PublishFacts(ctx context.Context, workID string) (PublishFacts, error) {
	return scanPublishFacts(s.pool.QueryRow(ctx, publishFactsSQL+` WHERE work.id = $1`, workID))
}

// Facts is one work item's PublishFacts, or why there are none (Err is
// ErrNotFound when there is no such work).
type Facts struct {
	PublishFacts
	Err error
}

// PublishFactsGroup is PublishFacts for many work items in one statement,
// one result per id in their order.
func (s *Store) PublishFactsGroup(ctx context.Context, ids []string) []Facts {
	out := make([]Facts, len(ids))
	rows, err := s.pool.Query(ctx, publishFactsSQL+` WHERE work.id = ANY($1)`, ids)
	found := map[string]PublishFacts{}
	if err == nil {
		for rows.Next() {
			var f PublishFacts
			if f, err = scanPublishFacts(rows); err != nil {
				break
			}
			found[f.Work.ID] = f
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil {
		return fill(out, func(int) Facts { return Facts{Err: fmt.Errorf("store: publish facts: %w", err)} })
	}
	for i, id := range ids {
		f, ok := found[id]
		out[i] = Facts{PublishFacts: f}
		if !ok {
			out[i].Err = ErrNotFound
		}
	}
	return out
}

// publishFactsSQL reads the columns scanPublishFacts takes, to be ended
// by the work it reads.
var publishFactsSQL = `SELECT ` + workColumns + `,
			(SELECT output FROM results r WHERE r.work_id = work.id AND r.schema_version = work.schema_version),
			(SELECT a.coverage FROM results r JOIN attempts a ON a.id = r.attempt_id
				WHERE r.work_id = work.id AND r.schema_version = work.schema_version),
			coalesce((SELECT check_policy FROM tenants t WHERE t.id = work.tenant_id), 'advisory'),
			(SELECT url FROM tenant_callbacks c WHERE c.tenant_id = work.tenant_id),
			(SELECT secret FROM tenant_callbacks c WHERE c.tenant_id = work.tenant_id),
			(SELECT coalesce(installation_id, 0) FROM webhook_deliveries d WHERE d.work_id = coalesce(work.rest_of, work.id)
				ORDER BY installation_id IS NULL, received_at LIMIT 1),
			(SELECT coalesce(base_sha, '') FROM webhook_deliveries d WHERE d.work_id = coalesce(work.rest_of, work.id)
				ORDER BY installation_id IS NULL, received_at LIMIT 1),
			CASE WHEN NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.work_id = coalesce(work.rest_of, work.id)) THEN
				(SELECT coalesce(json_agg(json_build_object('key', key, 'repositories', repositories) ORDER BY key), '[]')
				FROM tenant_sources WHERE kind = 'github_installation' AND tenant_id = work.tenant_id) END,
			coalesce(work.rest_of, ''),
			(SELECT output FROM reviews v WHERE v.work_id = work.id),
			coalesce((SELECT o.revision FROM work o
				WHERE o.tenant_id = work.tenant_id AND o.contract = work.contract AND o.source_id = work.source_id
					AND coalesce(o.rest_of, o.id) <> coalesce(work.rest_of, work.id) AND ` + revisionAfter("o", "work") + `
					AND (o.state IN ('queued', 'running', 'accepted', 'elsewhere')
						OR EXISTS (SELECT 1 FROM reviews v WHERE v.work_id = o.id AND v.output IS NOT NULL))
				ORDER BY coalesce(o.source_updated_at, o.created_at) DESC LIMIT 1), '')
		FROM work`

func scanPublishFacts(row pgx.Row) (PublishFacts, error) {
	var f PublishFacts
	var cbURL, cbSecret, base *string
	var inst *int64
	var links []byte
	var restOf string
	w, err := scanWorkWith(row, &f.Output, &f.Coverage, &f.CheckPolicy, &cbURL, &cbSecret, &inst, &base, &links, &restOf, &f.Reviewed,
		&f.Newer)
	if err != nil {
		return f, err
	}
	f.Work, w.RestOf = w, restOf
	if cbURL != nil && cbSecret != nil {
		f.Callback = &Callback{URL: *cbURL, Secret: *cbSecret}
	}
	if inst != nil && base != nil {
		f.Delivery = &PublishDelivery{Installation: *inst, BaseSHA: *base}
	}
	if len(links) > 0 {
		var ls []struct {
			Key          string   `json:"key"`
			Repositories []string `json:"repositories"`
		}
		if err := json.Unmarshal(links, &ls); err != nil {
			return f, fmt.Errorf("store: links of %s: %w", w.TenantID, err)
		}
		for _, l := range ls {
			f.Links = append(f.Links, Link{Key: l.Key, Repositories: l.Repositories})
		}
	}
	return f, nil
}

// RecordDryPublication records what would be published for work under the
// dry target, in one statement: nothing leaves the cell, so no lock is
// held, and the row's key keeps it one per work.
func (s *Store) RecordDryPublication(ctx context.Context, workID, tenant, outcome string, plan json.RawMessage) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO publications (work_id, target, tenant_id, outcome, plan, published_at, state)
		VALUES ($1, 'dry', $2, $3, $4, now(), 'published')
		ON CONFLICT (work_id, target) DO UPDATE SET outcome = $3, plan = $4, published_at = now(), last_error = NULL,
			state = 'published', updated_at = now()`, workID, tenant, outcome, plan)
	if err != nil {
		return fmt.Errorf("store: publication %s/dry: %w", workID, err)
	}
	return nil
}

// DryPublication is one RecordDryPublication.
type DryPublication struct {
	WorkID, Tenant, Outcome string
	Plan                    json.RawMessage
}

// RecordDryPublicationGroup is RecordDryPublication for many in one
// statement, one error per record in their order (a group the database
// refuses whole — the same work twice — runs again record by record).
func (s *Store) RecordDryPublicationGroup(ctx context.Context, recs []DryPublication) []error {
	out := make([]error, len(recs))
	works, tenants, outcomes, plans := make([]string, len(recs)), make([]string, len(recs)), make([]string, len(recs)), make([]string, len(recs))
	for i, r := range recs {
		works[i], tenants[i], outcomes[i], plans[i] = r.WorkID, r.Tenant, r.Outcome, string(r.Plan)
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO publications (work_id, target, tenant_id, outcome, plan, published_at, state)
		SELECT x.work_id, 'dry', x.tenant_id, x.outcome, x.plan::jsonb, now(), 'published'
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS x(work_id, tenant_id, outcome, plan)
		ON CONFLICT (work_id, target) DO UPDATE SET outcome = excluded.outcome, plan = excluded.plan, published_at = now(),
			last_error = NULL, state = 'published', updated_at = now()`, works, tenants, outcomes, plans)
	if err == nil {
		return out
	}
	if len(recs) == 1 || Unsent(err) {
		return fill(out, func(i int) error { return fmt.Errorf("store: publication %s/dry: %w", recs[i].WorkID, err) })
	}
	for i, r := range recs {
		out[i] = s.RecordDryPublication(ctx, r.WorkID, r.Tenant, r.Outcome, r.Plan)
	}
	return out
}

// SkipPublication records that an outcome is not published to target, and
// why: target 'none' for an outcome with nowhere to go (so it is read
// once), or a target the outcome no longer goes to (the work moved on, the
// tenant removed its callback), so it is not tried again.
func (s *Store) SkipPublication(ctx context.Context, workID, target, tenant, outcome, reason string) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO publications (work_id, target, tenant_id, outcome, state, reason)
		VALUES ($1, $2, $3, $4, 'skipped', $5)
		ON CONFLICT (work_id, target) DO UPDATE SET outcome = $4, state = 'skipped', reason = $5, next_try_at = NULL,
			updated_at = now()`,
		workID, target, tenant, outcome, Text(reason))
	if err != nil {
		return fmt.Errorf("store: publication %s/%s: %w", workID, target, err)
	}
	return nil
}

// Check policies of a tenant's check runs.
const (
	CheckAdvisory = "advisory" // a check never fails
	CheckBlocking = "blocking" // a blocking finding fails the check
)

// SetCheckPolicy sets a tenant's check-run policy.
func (s *Store) SetCheckPolicy(ctx context.Context, tenant, policy string) error {
	if policy != CheckAdvisory && policy != CheckBlocking {
		return fmt.Errorf("store: check policy %q: want %s or %s", policy, CheckAdvisory, CheckBlocking)
	}
	tag, err := s.pool.Exec(ctx, `UPDATE tenants SET check_policy = $2 WHERE id = $1`, tenant, policy)
	if err != nil {
		return fmt.Errorf("store: set check policy of %s: %w", tenant, err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// Publication states.
const (
	PublicationPending   = "pending"   // tried again at NextTryAt, until DeadlineAt
	PublicationPublished = "published" // made; a redelivered outcome changes nothing
	PublicationFailed    = "failed"    // its deadline passed or the target refused it for good
	PublicationSkipped   = "skipped"   // target "none": nothing to publish, Reason says why
	// PublicationSuperseded: a newer revision of the pull request replaces
	// the work's review before it was made; Reason names it.
	PublicationSuperseded = "superseded"
)

// Publication is the fence row of one work item's publication to one
// target, with the remote ids made so far and its state.
type Publication struct {
	WorkID, Target, TenantID, Outcome string
	State                             string
	// CheckRunID is 0 until a check run is known.
	CheckRunID int64
	// CommentIDs maps a comment's key (a finding's index) to its id.
	CommentIDs     map[string]int64
	RerunCommentID int64
	// ReviewID is the last pull request review made for the work; 0 for
	// none.
	ReviewID int64
	// Steps maps each step of a publication to GitHub that is complete
	// (StepCheckRun, StepReview, StepRerun, StepComment) to the outcome it
	// was completed for; see Done.
	Steps     map[string]string
	Plan      json.RawMessage
	Tries     int
	LastError string
	// Reason says why a publication failed or was skipped.
	Reason string
	// NextTryAt is when a pending publication is tried again; DeadlineAt
	// when it is given up as failed; zero when unset.
	NextTryAt, DeadlineAt, LastTriedAt time.Time
	PublishedAt                        time.Time
	CreatedAt, UpdatedAt               time.Time
}

// Steps of a publication to GitHub, as Publication.Steps names them.
const (
	// StepCheckRun: the check run is made, or edited, with the outcome's
	// content.
	StepCheckRun = "check_run"
	// StepReview: every finding of the outcome is on the pull request, the
	// new ones in one review and the others edited.
	StepReview = "review"
	// StepRerun: the conversation comment is made, or edited.
	StepRerun = "rerun"
)

// StepComment is the step of editing the existing comment of one finding
// (its key) to the outcome's content.
func StepComment(key string) string { return "comment:" + key }

// Done reports whether step is complete for the publication's outcome. A
// step completed for an earlier outcome of the work is not.
func (p *Publication) Done(step string) bool {
	o, ok := p.Steps[step]
	return ok && o == p.Outcome
}

const publicationColumns = `work_id, target, tenant_id, outcome, state, coalesce(check_run_id, 0), comment_ids,
	coalesce(rerun_comment_id, 0), coalesce(review_id, 0), steps, plan, tries, coalesce(last_error, ''), coalesce(reason, ''),
	coalesce(next_try_at, 'epoch'), coalesce(deadline_at, 'epoch'), coalesce(last_tried_at, 'epoch'),
	coalesce(published_at, 'epoch'), created_at, updated_at`

func scanPublication(row pgx.Row) (*Publication, error) {
	var p Publication
	err := row.Scan(&p.WorkID, &p.Target, &p.TenantID, &p.Outcome, &p.State, &p.CheckRunID, &p.CommentIDs,
		&p.RerunCommentID, &p.ReviewID, &p.Steps, &p.Plan, &p.Tries, &p.LastError, &p.Reason, &p.NextTryAt, &p.DeadlineAt,
		&p.LastTriedAt, &p.PublishedAt, &p.CreatedAt, &p.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	for _, t := range []*time.Time{&p.NextTryAt, &p.DeadlineAt, &p.LastTriedAt, &p.PublishedAt} {
		if t.Unix() == 0 {
			*t = time.Time{}
		}
	}
	return &p, err
}

func collectPublications(rows pgx.Rows, err error) ([]*Publication, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Publication, error) { return scanPublication(r) })
}

// OpenPublications makes the rows of an outcome's publication to each
// target, pending from now until deadline, and returns every row of the
// work by target. A row that holds another outcome of the work (dropped
// work run again, a person's review of accepted work) starts over for this
// one, keeping the remote ids and forgetting its completed steps; a row of
// this outcome is left as it is, so a redelivered outcome changes nothing.
func (s *Store) OpenPublications(ctx context.Context, workID, tenant, outcome string, targets []string,
	now, deadline time.Time) (map[string]*Publication, error) {
	rows, err := s.pool.Query(ctx, `WITH up AS (
			INSERT INTO publications AS p (work_id, target, tenant_id, outcome, state, next_try_at, deadline_at)
			SELECT $1, t, $2, $3, 'pending', $5, $6 FROM unnest($4::text[]) t
			ON CONFLICT (work_id, target) DO UPDATE SET outcome = excluded.outcome, state = 'pending', tries = 0,
				last_error = NULL, reason = NULL, published_at = NULL, steps = '{}', next_try_at = excluded.next_try_at,
				deadline_at = excluded.deadline_at, updated_at = now()
			WHERE p.outcome <> excluded.outcome
			RETURNING `+publicationColumns+`)
		SELECT * FROM up
		UNION ALL
		SELECT `+publicationColumns+` FROM publications
		WHERE work_id = $1 AND target = ANY($4) AND NOT EXISTS (SELECT 1 FROM up WHERE up.target = publications.target)`,
		workID, tenant, outcome, targets, now, deadline)
	ps, err := collectPublications(rows, err)
	if err != nil {
		return nil, fmt.Errorf("store: open publications of %s: %w", workID, err)
	}
	out := map[string]*Publication{}
	for _, p := range ps {
		out[p.Target] = p
	}
	return out, nil
}

// ErrPublicationBusy is returned by LockPublication while another
// publisher holds the same work and target.
var ErrPublicationBusy = errors.New("publication is held by another publisher")

// LockPublication is the publication fence. It takes a lock on the row of
// (work, target) that lasts until release is called (or the connection
// dies with its process), and returns the row as it is then: its state and
// the ids already made. A second publisher gets ErrPublicationBusy.
func (s *Store) LockPublication(ctx context.Context, workID, target string) (*Publication, func(), error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("store: publication %s/%s: %w", workID, target, err)
	}
	release := func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }
	// The lock is an advisory one held by its own transaction, so ids
	// recorded while it is held are committed one by one (and survive a
	// publisher that dies), and the lock goes with the connection.
	var locked bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtextextended('publication:' || $1 || '/' || $2, 0))`,
		workID, target).Scan(&locked); err != nil {
		release()
		return nil, nil, fmt.Errorf("store: publication %s/%s: %w", workID, target, err)
	}
	if !locked {
		release()
		return nil, nil, ErrPublicationBusy
	}
	p, err := s.GetPublication(ctx, workID, target)
	if err != nil {
		release()
		return nil, nil, err
	}
	return p, release, nil
}

// GetPublication reads the publication of a work item to a target.
func (s *Store) GetPublication(ctx context.Context, workID, target string) (*Publication, error) {
	p, err := scanPublication(s.pool.QueryRow(ctx, `SELECT `+publicationColumns+` FROM publications
		WHERE work_id = $1 AND target = $2`, workID, target))
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("store: publication %s/%s: %w", workID, target, err)
	}
	return p, err
}

// PublicationsOf lists a work item's publications by target.
func (s *Store) PublicationsOf(ctx context.Context, workID string) ([]*Publication, error) {
	ps, err := collectPublications(s.pool.Query(ctx, `SELECT `+publicationColumns+` FROM publications
		WHERE work_id = $1 ORDER BY target`, workID))
	if err != nil {
		return nil, fmt.Errorf("store: publications of %s: %w", workID, err)
	}
	return ps, nil
}

// Publications lists a tenant's publications (every tenant's for ""),
// oldest first, up to limit.
func (s *Store) Publications(ctx context.Context, tenant string, limit int) ([]*Publication, error) {
	ps, err := collectPublications(s.pool.Query(ctx, `SELECT `+publicationColumns+` FROM publications
		WHERE $1 = '' OR tenant_id = $1 ORDER BY created_at, work_id, target LIMIT $2`, tenant, limit))
	if err != nil {
		return nil, fmt.Errorf("store: publications: %w", err)
	}
	return ps, nil
}

// DuePublications are up to limit pending publications whose next try is
// at or before now, the longest due first.
func (s *Store) DuePublications(ctx context.Context, now time.Time, limit int) ([]*Publication, error) {
	ps, err := collectPublications(s.pool.Query(ctx, `SELECT `+publicationColumns+` FROM publications
		WHERE state = 'pending' AND next_try_at <= $1 ORDER BY next_try_at LIMIT $2`, now, limit))
	if err != nil {
		return nil, fmt.Errorf("store: due publications: %w", err)
	}
	return ps, nil
}

// PublicationCount is how many publications to one target are in one
// state.
type PublicationCount struct {
	Target, State string
	Count         int64
}

// UnfinishedPublications counts the publications, of one tenant or ("")
// every tenant's, that are pending or failed, by target and state.
func (s *Store) UnfinishedPublications(ctx context.Context, tenant string) ([]PublicationCount, error) {
	return unfinishedPublications(ctx, s.pool, tenant)
}

func unfinishedPublications(ctx context.Context, q querier, tenant string) ([]PublicationCount, error) {
	// One count per state, each read from its own partial index.
	rows, err := q.Query(ctx, `SELECT * FROM (
			SELECT target, state, count(*) FROM publications WHERE state = 'failed' AND ($1 = '' OR tenant_id = $1) GROUP BY target, state
			UNION ALL
			SELECT target, state, count(*) FROM publications WHERE state = 'pending' AND ($1 = '' OR tenant_id = $1) GROUP BY target, state
		) c ORDER BY 1, 2`, tenant)
	if err != nil {
		return nil, fmt.Errorf("store: unfinished publications: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (PublicationCount, error) {
		var c PublicationCount
		err := r.Scan(&c.Target, &c.State, &c.Count)
		return c, err
	})
}

// RecordCheckRun records the check run of a publication; the holder of
// the publication's lock calls it as soon as the remote id is known.
func (s *Store) RecordCheckRun(ctx context.Context, workID, target string, id int64) error {
	return s.recordPublication(ctx, `UPDATE publications SET check_run_id = $3, updated_at = now()
		WHERE work_id = $1 AND target = $2`, workID, target, id)
}

// FinishCheckRun records the check run of a publication as made, or
// edited, with outcome's content: a retry of that outcome does not send it
// again.
func (s *Store) FinishCheckRun(ctx context.Context, workID, target, outcome string, id int64) error {
	return s.recordPublication(ctx, `UPDATE publications SET check_run_id = $3,
			steps = steps || jsonb_build_object('`+StepCheckRun+`', $4::text), updated_at = now()
		WHERE work_id = $1 AND target = $2`, workID, target, id, outcome)
}

// FinishComment records the existing review comment of one finding (key)
// as edited to outcome's content.
func (s *Store) FinishComment(ctx context.Context, workID, target, outcome, key string, id int64) error {
	return s.recordPublication(ctx, `UPDATE publications SET comment_ids = comment_ids || jsonb_build_object($3::text, $4::bigint),
			steps = steps || jsonb_build_object('comment:' || $3::text, $5::text), updated_at = now()
		WHERE work_id = $1 AND target = $2`, workID, target, key, id, outcome)
}

// FinishReview records that every finding of outcome is on the pull
// request: id is the review made for the findings that had no comment (0
// when every one had), comments the ids of its comments by key.
func (s *Store) FinishReview(ctx context.Context, workID, target, outcome string, id int64, comments map[string]int64) error {
	if comments == nil {
		comments = map[string]int64{}
	}
	return s.recordPublication(ctx, `UPDATE publications SET review_id = coalesce(nullif($3::bigint, 0), review_id),
			comment_ids = comment_ids || $4::jsonb, steps = steps || jsonb_build_object('`+StepReview+`', $5::text),
			updated_at = now()
		WHERE work_id = $1 AND target = $2`, workID, target, id, comments, outcome)
}

// FinishRerunComment records the conversation comment of a publication as
// made, or edited, with outcome's text.
func (s *Store) FinishRerunComment(ctx context.Context, workID, target, outcome string, id int64) error {
	return s.recordPublication(ctx, `UPDATE publications SET rerun_comment_id = $3,
			steps = steps || jsonb_build_object('`+StepRerun+`', $4::text), updated_at = now()
		WHERE work_id = $1 AND target = $2`, workID, target, id, outcome)
}

// FinishPublication records that the publication of outcome is complete,
// with what was published.
func (s *Store) FinishPublication(ctx context.Context, workID, target, outcome string, plan json.RawMessage, now time.Time) error {
	return s.recordPublication(ctx, `UPDATE publications SET outcome = $3, plan = $4, published_at = now(), state = 'published',
			last_tried_at = $5, next_try_at = NULL, last_error = NULL, reason = NULL, updated_at = now()
		WHERE work_id = $1 AND target = $2`, workID, target, outcome, plan, now)
}

// DeferPublication counts a failed try with its error; the publication is
// tried again at next.
func (s *Store) DeferPublication(ctx context.Context, workID, target, msg string, now, next time.Time) error {
	return s.recordPublication(ctx, `UPDATE publications SET tries = tries + 1, last_error = $3, last_tried_at = $4,
			next_try_at = $5, updated_at = now()
		WHERE work_id = $1 AND target = $2 AND state = 'pending'`, workID, target, Text(msg), now, next)
}

// FailPublication counts a failed try with its error and gives the
// publication up, failed, for reason: only RetryPublications sends it
// again.
func (s *Store) FailPublication(ctx context.Context, workID, target, msg, reason string, now time.Time) error {
	return s.recordPublication(ctx, `UPDATE publications SET tries = tries + 1, last_error = $3, reason = $4, state = 'failed',
			last_tried_at = $5, next_try_at = NULL, updated_at = now()
		WHERE work_id = $1 AND target = $2 AND state = 'pending'`, workID, target, Text(msg), Text(reason), now)
}

func (s *Store) recordPublication(ctx context.Context, sql string, workID, target string, args ...any) error {
	if _, err := s.pool.Exec(ctx, sql, append([]any{workID, target}, args...)...); err != nil {
		return fmt.Errorf("store: publication %s/%s: %w", workID, target, err)
	}
	return nil
}

// FailedPublications lists the failed publications of one work item, or
// (workID "") of every work item that failed at or after since, oldest
// failure first, up to limit.
func (s *Store) FailedPublications(ctx context.Context, workID string, since time.Time, limit int) ([]*Publication, error) {
	ps, err := collectPublications(s.pool.Query(ctx, `SELECT `+publicationColumns+` FROM publications
		WHERE state = 'failed' AND (($1 <> '' AND work_id = $1) OR ($1 = '' AND updated_at >= $2))
		ORDER BY updated_at, work_id, target LIMIT $3`, workID, since, limit))
	if err != nil {
		return nil, fmt.Errorf("store: failed publications: %w", err)
	}
	return ps, nil
}

// RetryPublications puts failed publications back, pending at once with a
// fresh deadline and their tries counted anew: those of one work item, or
// (workID "") of every work item that failed at or after since. It returns
// the rows it put back; a row is put back once, since it is no longer
// failed.
func (s *Store) RetryPublications(ctx context.Context, workID string, since time.Time, deadline time.Duration) ([]*Publication, error) {
	ps, err := collectPublications(s.pool.Query(ctx, `UPDATE publications SET state = 'pending', tries = 0, reason = NULL,
			next_try_at = now(), deadline_at = now() + $3 * interval '1 microsecond', updated_at = now()
		WHERE state = 'failed' AND (($1 <> '' AND work_id = $1) OR ($1 = '' AND updated_at >= $2))
		RETURNING `+publicationColumns, workID, since, interval(deadline)))
	if err != nil {
		return nil, fmt.Errorf("store: retry publications: %w", err)
	}
	return ps, nil
}

// Callback is a tenant's signed-callback endpoint.
type Callback struct {
	URL string
	// Secret is the Standard Webhooks signing secret, "whsec_" and the
	// base64 of its bytes.
	Secret string
}

// NewCallbackSecret is a new signing secret: 32 random bytes.
func NewCallbackSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return "whsec_" + base64.StdEncoding.EncodeToString(b)
}

// SetCallback sets (or, with an empty URL, removes) a tenant's callback.
func (s *Store) SetCallback(ctx context.Context, tenant string, c Callback) error {
	var err error
	if c.URL == "" {
		_, err = s.pool.Exec(ctx, `DELETE FROM tenant_callbacks WHERE tenant_id = $1`, tenant)
	} else {
		_, err = s.pool.Exec(ctx, `INSERT INTO tenant_callbacks (tenant_id, url, secret) VALUES ($1, $2, $3)
			ON CONFLICT (tenant_id) DO UPDATE SET url = excluded.url, secret = excluded.secret, created_at = now()`,
			tenant, c.URL, c.Secret)
	}
	if SQLState(err) == "23503" { // foreign_key_violation: no such tenant
		return ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("store: callback of %s: %w", tenant, err)
	}
	return nil
}

// AbandonPublications gives up a work item's failed publications for good,
// as skipped with the operator's reason: their target is gone (a deleted
// repository) and no retry can make them.
func (s *Store) AbandonPublications(ctx context.Context, workID, reason string) ([]*Publication, error) {
	ps, err := collectPublications(s.pool.Query(ctx, `UPDATE publications SET state = 'skipped', reason = $2, next_try_at = NULL,
			updated_at = now()
		WHERE work_id = $1 AND state = 'failed'
		RETURNING `+publicationColumns, workID, Text(reason)))
	if err != nil {
		return nil, fmt.Errorf("store: abandon publications of %s: %w", workID, err)
	}
	return ps, nil
}

// publishable is the condition on work w that something may be published
// for it: a code review of a pull request (owner/repo#number), or work of a
// tenant with a callback.
const publishable = `((w.contract = 'code-review' AND w.source_id ~ '^[^/#]+/[^/#]+#[1-9][0-9]*$')
				OR EXISTS (SELECT 1 FROM tenant_callbacks c WHERE c.tenant_id = w.tenant_id))`

// unpublishedCommit is the condition on work w of a commit's outcome
// (accepted, or expired when the answer came late), which has no outbox
// row, that something may be published for and the publisher recorded
// nothing for. The work row says the outcome: its state, announced at
// outcome_announced_at.
const unpublishedCommit = `w.state IN ('` + outcome.Accepted + `', '` + outcome.Expired + `') AND w.shadow_of IS NULL
				AND w.outcome_announced_at IS NOT NULL
				AND ` + publishable + `
				AND NOT EXISTS (SELECT 1 FROM reviews v WHERE v.work_id = w.id AND v.output IS NOT NULL)
				AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.msg_id = w.id || '.' || w.state AND o.stream = 'OUTCOME')
				AND NOT EXISTS (SELECT 1 FROM publications p WHERE p.work_id = w.id AND p.outcome = w.state)`

// UnpublishedOutcomes reads back up to limit OUTCOME events, oldest
// first, published more than grace ago whose work is still in that
// outcome and for which the publisher recorded nothing: events the broker
// lost (a person's reviewed answer among them). They are read from a
// little before the cell's outcome mark, however long ago that is (see
// AdvanceOutcomeMark), so an outcome lost while the committer was down for
// a day is read when it is back. Only work something may
// be published for is read: code reviews of
// a pull request (owner/repo#number), and the work of tenants with a
// callback. Once the publisher has seen an outcome, its rows (pending,
// published, failed, or skipped when there was nothing to publish) take
// it from there, so each outcome is read back at most once.
//
// A commit's OUTCOME event (accepted, or expired when the answer came
// late) has no outbox row: the work row says it (its state, announced at
// outcome_announced_at), and the event is rebuilt from it here when the
// broker lost it or its committer stopped before publishing it. Outcomes
// reached any other way are announced with a row.
func (s *Store) UnpublishedOutcomes(ctx context.Context, grace time.Duration, limit int) ([][]byte, error) {
	since, err := s.readBackSince(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT e.payload, e.work_id, e.tenant_id, e.region, e.state, e.at FROM (
			SELECT o.payload, '' AS work_id, '' AS tenant_id, '' AS region, '' AS state, o.created_at AS at FROM `+outboxOutcomes+`
			WHERE o.created_at > $2
				AND o.published_at < now() - $1 * interval '1 microsecond'
				AND `+owedInOutbox+`
			UNION ALL
			SELECT NULL, w.id, w.tenant_id, w.region, w.state, w.outcome_announced_at FROM work w
			WHERE w.updated_at > $2
				AND w.outcome_announced_at < now() - $1 * interval '1 microsecond'
				AND `+unpublishedCommit+`
		) e ORDER BY e.at LIMIT $3`, interval(grace), since, limit)
	if err != nil {
		return nil, fmt.Errorf("store: unpublished outcomes: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]byte, error) {
		var payload []byte
		var o event.Outcome
		if err := r.Scan(&payload, &o.WorkID, &o.TenantID, &o.Region, &o.Outcome, &o.At); err != nil || payload != nil {
			return payload, err
		}
		// A commit's outcome, rebuilt from its work row as the committer
		// built it.
		o.OutcomeID, o.At = event.OutcomeMsgID(o.WorkID, o.Outcome), o.At.UTC()
		return json.Marshal(o)
	})
	if err != nil {
		return nil, fmt.Errorf("store: unpublished outcomes: %w", err)
	}
	return out, nil
}
