package store

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"assay.dev/pkg/outcome"
)

// Review reasons: why work entered the human review queue. The reviews
// table's CHECK constraint lists the same words.
const (
	// ReviewNeedsHuman: an accepted answer asks for a person
	// (moderation's needsHumanReview).
	ReviewNeedsHuman = "needs_human_review"
	// ReviewSchemaRejected: the answers failed the gate and the repair
	// budget is spent; the work's outcome.
	ReviewSchemaRejected = outcome.SchemaRejected
	// ReviewRetryExhausted: interactive work whose retries ran out while
	// someone waited; the work's outcome.
	ReviewRetryExhausted = outcome.RetryExhausted
)

// ReviewReasons lists every review reason.
var ReviewReasons = []string{ReviewNeedsHuman, ReviewSchemaRejected, ReviewRetryExhausted}

// Review states.
const (
	ReviewOpen     = "open"
	ReviewResolved = "resolved"
)

// ReviewStates lists every review state.
var ReviewStates = []string{ReviewOpen, ReviewResolved}

// Review verdicts a person gives.
const (
	// VerdictApproved: the answer (or the work's ending) stands.
	VerdictApproved = "approved"
	// VerdictAmended: the answer stands with a person's changes to its
	// findings (given from the console's review screen).
	VerdictAmended = "amended"
	// VerdictRejected: the answer is wrong; the person acts on it.
	VerdictRejected = "rejected"
	// VerdictDismissed: nothing to act on.
	VerdictDismissed = "dismissed"
)

// Verdicts lists every review verdict a person gives.
var Verdicts = []string{VerdictApproved, VerdictAmended, VerdictRejected, VerdictDismissed}

// A review item its work settled is closed by the system: redriven work
// that ended accepted (with an answer that asks for nobody), superseded or
// canceled. The item's verdict is VerdictClosed, its resolver is of kind
// and route ResolverSystem with the id SystemID, and its note says why.
const (
	VerdictClosed  = "closed"
	ResolverSystem = "system"
	SystemID       = "assay"
)

// ResolvedVerdicts lists every verdict an item is resolved with: a
// person's, or the system's close.
var ResolvedVerdicts = append(slices.Clone(Verdicts), VerdictClosed)

// ResolverKinds and ResolverRoutes list who resolves an item and through
// which route: a person, as ActorKinds and Routes say, or the system.
var (
	ResolverKinds  = append(slices.Clone(ActorKinds), ResolverSystem)
	ResolverRoutes = append(slices.Clone(Routes), ResolverSystem)
)

// Review is one item of the human review queue. Its public name is its
// work's id: one review per work at most. ID is the row's own key, for
// the cell alone.
type Review struct {
	ID       int64
	WorkID   string
	TenantID string
	Contract string
	Lane     string
	Reason   string
	State    string
	Verdict  string
	// ResolvedBy is the resolver's id; ResolvedKind and ResolvedRoute say
	// of which kind and through which route ("" for an item resolved
	// before they were recorded, whose ResolvedBy is the name its request
	// gave, never checked).
	ResolvedBy    string
	ResolvedKind  string
	ResolvedRoute string
	Note          string
	ResolvedAt    time.Time // zero while open
	CreatedAt     time.Time
	// WorkState and WorkReason are the work's as it stands.
	WorkState  string
	WorkReason string
	// ClaimedBy, an operator token's name of kind ClaimedKind, holds the
	// item until ClaimedUntil (zero: nobody has claimed it); a claim past
	// its time is nobody's.
	ClaimedBy    string
	ClaimedKind  string
	ClaimedUntil time.Time
	// Output is the answer a person resolved the item with from the
	// console, which the work's reviewed outcome publishes; nil otherwise.
	Output json.RawMessage
	// SourceID and Revision are the work's: what the item is about.
	SourceID string
	Revision string
}

// ClosedBySystem says the system closed the item: its work was settled by
// another ending, which Note names.
func (v *Review) ClosedBySystem() bool { return v.Verdict == VerdictClosed }

// Resolver is who resolved the item; false for an open item, or one
// resolved before resolvers were recorded.
func (v *Review) Resolver() (Actor, bool) {
	if v.ResolvedKind == "" {
		return Actor{}, false
	}
	return Actor{Kind: v.ResolvedKind, ID: v.ResolvedBy, Route: v.ResolvedRoute}, true
}

// HeldBy is who holds the item at now, "" when nobody does.
func (v *Review) HeldBy(now time.Time) string {
	if v.ClaimedBy == "" || !now.Before(v.ClaimedUntil) {
		return ""
	}
	return v.ClaimedBy
}

const reviewColumns = `v.id, v.work_id, v.tenant_id, v.contract, v.lane, v.reason, v.state, coalesce(v.verdict, ''),
	coalesce(v.resolved_by, ''), coalesce(v.resolved_kind, ''), coalesce(v.resolved_route, ''), coalesce(v.note, ''),
	coalesce(v.resolved_at, 'epoch'), v.created_at, w.state, coalesce(w.reason, ''), coalesce(v.claimed_by, ''),
	coalesce(v.claimed_kind, ''), coalesce(v.claimed_until, 'epoch'), v.output, w.source_id, w.revision`

func scanReview(row pgx.Row) (*Review, error) {
	var v Review
	err := row.Scan(&v.ID, &v.WorkID, &v.TenantID, &v.Contract, &v.Lane, &v.Reason, &v.State, &v.Verdict,
		&v.ResolvedBy, &v.ResolvedKind, &v.ResolvedRoute, &v.Note, &v.ResolvedAt, &v.CreatedAt, &v.WorkState, &v.WorkReason,
		&v.ClaimedBy, &v.ClaimedKind, &v.ClaimedUntil, &v.Output, &v.SourceID, &v.Revision)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	for _, t := range []*time.Time{&v.ResolvedAt, &v.ClaimedUntil} {
		if t.Equal(time.Unix(0, 0)) {
			*t = time.Time{}
		}
	}
	return &v, err
}

// ReviewFilter selects review items, oldest first.
type ReviewFilter struct {
	// Tenant is whose items; "" is every tenant's (an operator's view).
	Tenant   string
	State    string // "" any
	Reason   string // "" any
	Contract string // "" any
	// AfterCreated and AfterWork are the cursor: the last item of the
	// previous page.
	AfterCreated time.Time
	AfterWork    string
	Limit        int
}

// ListReviews reads a page of a review queue.
func (s *Store) ListReviews(ctx context.Context, f ReviewFilter) ([]*Review, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+reviewColumns+` FROM reviews v JOIN work w ON w.id = v.work_id
		WHERE ($1 = '' OR v.tenant_id = $1) AND ($2 = '' OR v.state = $2) AND ($3 = '' OR v.reason = $3) AND ($4 = '' OR v.contract = $4)
			AND (v.created_at, v.work_id) > ($5, $6)
		ORDER BY v.created_at, v.work_id LIMIT $7`,
		f.Tenant, f.State, f.Reason, f.Contract, f.AfterCreated, f.AfterWork, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("store: list reviews: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Review, error) { return scanReview(r) })
	if err != nil {
		return nil, fmt.Errorf("store: list reviews: %w", err)
	}
	return out, nil
}

// ReviewCursor is the cursor after v in ListReviews' order: its creation
// time and work, nothing the cell counts.
func ReviewCursor(v *Review) string {
	return base64.RawURLEncoding.EncodeToString([]byte(v.CreatedAt.UTC().Format(time.RFC3339Nano) + "|" + v.WorkID))
}

// ParseReviewCursor reads a cursor ReviewCursor made.
func ParseReviewCursor(c string) (time.Time, string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return time.Time{}, "", err
	}
	at, work, ok := strings.Cut(string(raw), "|")
	if !ok || work == "" {
		return time.Time{}, "", errors.New("not a review cursor")
	}
	t, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		return time.Time{}, "", err
	}
	return t, work, nil
}

// GetReview reads the review item of one of a tenant's work items;
// another tenant's is ErrNotFound. Tenant "" reads any tenant's.
func (s *Store) GetReview(ctx context.Context, tenant, workID string) (*Review, error) {
	return scanReview(s.pool.QueryRow(ctx, `SELECT `+reviewColumns+` FROM reviews v JOIN work w ON w.id = v.work_id
		WHERE v.work_id = $1 AND ($2 = '' OR v.tenant_id = $2)`, workID, tenant))
}

// ErrClaimed is returned for an item another person holds; the item
// returned with it says who, and until when.
var ErrClaimed = errors.New("store: review item claimed by another person")

// ClaimReview has who (a reviewer or an operator, from the console) hold
// an open review item of the tenant ("" any tenant's) until now+hold: a
// claim of its own is extended, one past its time taken over. Each claim
// is recorded in work_actions in its own transaction. The guarded update
// is the fence: of two people claiming at once, one holds it and the other
// gets ErrClaimed. An item resolved already is ErrResolved, both with the
// item as it is.
func (s *Store) ClaimReview(ctx context.Context, tenant, workID string, who Actor, hold time.Duration) (*Review, error) {
	if !who.Valid() || who.Kind == ActorTenant {
		return nil, fmt.Errorf("store: claim the review of %s: a claim is a reviewer's or an operator's, not %+v", workID, who)
	}
	var v *Review
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		v, err = scanReview(tx.QueryRow(ctx, `WITH v AS (UPDATE reviews SET claimed_by = $3, claimed_kind = $5,
				claimed_until = now() + $4 * interval '1 microsecond'
			WHERE work_id = $1 AND ($2 = '' OR tenant_id = $2) AND state = 'open'
				AND (claimed_by IS NULL OR claimed_by = $3 OR claimed_until <= now()) RETURNING *)
			SELECT `+reviewColumns+` FROM v JOIN work w ON w.id = v.work_id`, workID, tenant, Text(who.ID), interval(hold), who.Kind))
		if err != nil {
			return err
		}
		return insertAudit(ctx, tx, workID, &Audit{By: who, Action: ActionClaim,
			Note: "held until " + v.ClaimedUntil.UTC().Format(time.RFC3339)})
	})
	if err == nil {
		return v, nil
	}
	if !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("store: claim the review of %s: %w", workID, err)
	}
	return s.whyNot(ctx, tenant, workID)
}

// whyNot reads an item a guarded update left alone and says why it did:
// ErrNotFound, ErrResolved or ErrClaimed.
func (s *Store) whyNot(ctx context.Context, tenant, workID string) (*Review, error) {
	v, err := s.GetReview(ctx, tenant, workID)
	switch {
	case err != nil:
		return nil, err
	case v.State == ReviewResolved:
		return v, ErrResolved
	default:
		return v, ErrClaimed
	}
}

// ReviewOfWork reads the review item of a work item, ErrNotFound when it
// has none.
func (s *Store) ReviewOfWork(ctx context.Context, workID string) (*Review, error) {
	return scanReview(s.pool.QueryRow(ctx, `SELECT `+reviewColumns+` FROM reviews v JOIN work w ON w.id = v.work_id
		WHERE v.work_id = $1`, workID))
}

// ErrResolved is returned by ResolveReview for an item resolved already.
var ErrResolved = errors.New("store: review already resolved")

// Resolution is a decision on a review item: By is who made it, as the
// request's credential says, recorded with the item and in work_actions.
type Resolution struct {
	By            Actor
	Verdict, Note string
	// Holder is the claim the person resolving holds ("" none): another
	// person's claim that has not run out refuses the resolution.
	Holder string
	// Output, with an approved or amended verdict, is the answer the
	// person stands by; Announce then gives the outbox rows that publish
	// it, written in the resolution's transaction.
	Output   json.RawMessage
	Announce func(*Review) ([]OutboxMsg, error)
}

// ResolveReview resolves an open review item of the tenant ("" any
// tenant's), recording who resolved it and through which route with the
// item and in work_actions, in one transaction. The guarded update is the
// fence: of two people resolving at once, one wins and the other gets
// ErrResolved with the item as it was resolved; an item another person
// holds is ErrClaimed.
func (s *Store) ResolveReview(ctx context.Context, tenant, workID string, res Resolution) (*Review, error) {
	if !res.By.Valid() {
		return nil, fmt.Errorf("store: resolve the review of %s: the resolution names no actor: %+v", workID, res.By)
	}
	var v *Review
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		v, err = scanReview(tx.QueryRow(ctx, `WITH v AS (UPDATE reviews SET state = 'resolved', verdict = $3,
				resolved_by = $4, resolved_kind = $8, resolved_route = $9, note = nullif($5, ''), resolved_at = now(), output = $7,
				claimed_by = NULL, claimed_kind = NULL, claimed_until = NULL
			WHERE work_id = $1 AND ($2 = '' OR tenant_id = $2) AND state = 'open'
				AND (claimed_by IS NULL OR claimed_by = $6 OR claimed_until <= now()) RETURNING *)
			SELECT `+reviewColumns+` FROM v JOIN work w ON w.id = v.work_id`,
			workID, tenant, res.Verdict, Text(res.By.ID), Text(res.Note), res.Holder, nullJSON(res.Output), res.By.Kind, res.By.Route))
		if err != nil {
			return err
		}
		if err := insertAudit(ctx, tx, workID, &Audit{By: res.By, Action: ActionResolve, Note: res.Verdict}); err != nil {
			return err
		}
		if res.Output == nil || res.Announce == nil {
			return nil
		}
		msgs, err := res.Announce(v)
		if err != nil {
			return err
		}
		return insertOutbox(ctx, tx, msgs)
	})
	if err == nil {
		return v, nil
	}
	if !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("store: resolve the review of %s: %w", workID, err)
	}
	return s.whyNot(ctx, tenant, workID)
}

// nullJSON is a JSON document as a parameter, SQL NULL for nil.
func nullJSON(b json.RawMessage) any {
	if b == nil {
		return nil
	}
	return string(b)
}

// OpenReviews counts a tenant's open review items.
func (s *Store) OpenReviews(ctx context.Context, tenant string) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM reviews WHERE tenant_id = $1 AND state = 'open'`, tenant).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: open reviews: %w", err)
	}
	return n, nil
}
