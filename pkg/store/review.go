package store

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Review reasons: why work entered the human review queue. The reviews
// table's CHECK constraint lists the same words.
const (
	// ReviewNeedsHuman: an accepted answer asks for a person
	// (moderation's needsHumanReview).
	ReviewNeedsHuman = "needs_human_review"
	// ReviewSchemaRejected: the answers failed the gate and the repair
	// budget is spent.
	ReviewSchemaRejected = "schema_rejected"
	// ReviewRetryExhausted: interactive work whose retries ran out while
	// someone waited.
	ReviewRetryExhausted = "retry_exhausted"
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
	// VerdictRejected: the answer is wrong; the person acts on it.
	VerdictRejected = "rejected"
	// VerdictDismissed: nothing to act on.
	VerdictDismissed = "dismissed"
)

// Verdicts lists every review verdict.
var Verdicts = []string{VerdictApproved, VerdictRejected, VerdictDismissed}

// Review is one item of the human review queue. Its public name is its
// work's id: one review per work at most. ID is the row's own key, for
// the cell alone.
type Review struct {
	ID         int64
	WorkID     string
	TenantID   string
	Contract   string
	Lane       string
	Reason     string
	State      string
	Verdict    string
	ResolvedBy string
	Note       string
	ResolvedAt time.Time // zero while open
	CreatedAt  time.Time
	// WorkState and WorkReason are the work's as it stands.
	WorkState  string
	WorkReason string
}

const reviewColumns = `v.id, v.work_id, v.tenant_id, v.contract, v.lane, v.reason, v.state, coalesce(v.verdict, ''),
	coalesce(v.resolved_by, ''), coalesce(v.note, ''), coalesce(v.resolved_at, 'epoch'), v.created_at,
	w.state, coalesce(w.reason, '')`

func scanReview(row pgx.Row) (*Review, error) {
	var v Review
	err := row.Scan(&v.ID, &v.WorkID, &v.TenantID, &v.Contract, &v.Lane, &v.Reason, &v.State, &v.Verdict,
		&v.ResolvedBy, &v.Note, &v.ResolvedAt, &v.CreatedAt, &v.WorkState, &v.WorkReason)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if v.ResolvedAt.Equal(time.Unix(0, 0)) {
		v.ResolvedAt = time.Time{}
	}
	return &v, err
}

// ReviewFilter selects a tenant's review items, oldest first.
type ReviewFilter struct {
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

// ListReviews reads a page of a tenant's review queue.
func (s *Store) ListReviews(ctx context.Context, f ReviewFilter) ([]*Review, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+reviewColumns+` FROM reviews v JOIN work w ON w.id = v.work_id
		WHERE v.tenant_id = $1 AND ($2 = '' OR v.state = $2) AND ($3 = '' OR v.reason = $3) AND ($4 = '' OR v.contract = $4)
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
// another tenant's is ErrNotFound.
func (s *Store) GetReview(ctx context.Context, tenant, workID string) (*Review, error) {
	return scanReview(s.pool.QueryRow(ctx, `SELECT `+reviewColumns+` FROM reviews v JOIN work w ON w.id = v.work_id
		WHERE v.work_id = $1 AND v.tenant_id = $2`, workID, tenant))
}

// ReviewOfWork reads the review item of a work item, ErrNotFound when it
// has none.
func (s *Store) ReviewOfWork(ctx context.Context, workID string) (*Review, error) {
	return scanReview(s.pool.QueryRow(ctx, `SELECT `+reviewColumns+` FROM reviews v JOIN work w ON w.id = v.work_id
		WHERE v.work_id = $1`, workID))
}

// ErrResolved is returned by ResolveReview for an item resolved already.
var ErrResolved = errors.New("store: review already resolved")

// Resolution is a person's decision on a review item.
type Resolution struct {
	By, Verdict, Note string
}

// ResolveReview resolves an open review item of the tenant. The guarded
// update is the fence: of two people resolving at once, one wins and the
// other gets ErrResolved with the item as it was resolved.
func (s *Store) ResolveReview(ctx context.Context, tenant, workID string, res Resolution) (*Review, error) {
	v, err := scanReview(s.pool.QueryRow(ctx, `WITH v AS (UPDATE reviews SET state = 'resolved', verdict = $3,
			resolved_by = $4, note = nullif($5, ''), resolved_at = now()
		WHERE work_id = $1 AND tenant_id = $2 AND state = 'open' RETURNING *)
		SELECT `+reviewColumns+` FROM v JOIN work w ON w.id = v.work_id`, workID, tenant, res.Verdict, Text(res.By), Text(res.Note)))
	if err == nil {
		return v, nil
	}
	if !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("store: resolve the review of %s: %w", workID, err)
	}
	v, err = s.GetReview(ctx, tenant, workID)
	if err != nil {
		return nil, err
	}
	return v, ErrResolved
}

// OpenReviews counts a tenant's open review items.
func (s *Store) OpenReviews(ctx context.Context, tenant string) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM reviews WHERE tenant_id = $1 AND state = 'open'`, tenant).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: open reviews: %w", err)
	}
	return n, nil
}
