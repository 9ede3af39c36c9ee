package desk

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"assay.dev/pkg/api"
	"assay.dev/pkg/apierror"
	"assay.dev/pkg/auth"
	"assay.dev/pkg/store"
	"assay.dev/pkg/story"
	"assay.dev/pkg/telemetry"
	"assay.dev/services/ingress/internal/door"
	"assay.dev/services/ingress/internal/request"
)

// parseReviewID reads a review id into its work's id: exactly rv_ and 24
// lower-case hex digits, so no other spelling names the same item.
func parseReviewID(s string) (workID string, ok bool) {
	hex, found := strings.CutPrefix(s, "rv_")
	return "w_" + hex, found && api.ValidWorkID("w_"+hex)
}

// holder is who holds an item in a sentence: "reviewer ana".
func holder(v *store.Review) string {
	return strings.TrimSpace(v.ClaimedKind + " " + v.ClaimedBy)
}

// listReviews serves GET /v1/reviews?state=&reason=&contract=&limit=&cursor=:
// the tenant's review queue, oldest first, in pages.
func (s *Room) listReviews(w http.ResponseWriter, r *http.Request) {
	t, ok := s.Authenticate(w, r)
	if !ok {
		return
	}
	f, ok := s.reviewFilter(w, r.URL.Query())
	if !ok {
		return
	}
	f.Tenant = t.ID
	s.writeReviews(w, r, f)
}

// reviewFilter reads a review listing's state, reason, contract, limit and
// cursor, or writes the refusal.
func (s *Room) reviewFilter(w http.ResponseWriter, q url.Values) (store.ReviewFilter, bool) {
	f := store.ReviewFilter{State: q.Get("state"), Reason: q.Get("reason"), Contract: q.Get("contract"), Limit: 100}
	switch {
	case f.State != "" && !slices.Contains(store.ReviewStates, f.State):
		apierror.Write(w, http.StatusBadRequest, "invalid_query", "state: not one of "+strings.Join(store.ReviewStates, ", "))
		return f, false
	case f.Reason != "" && !slices.Contains(store.ReviewReasons, f.Reason):
		apierror.Write(w, http.StatusBadRequest, "invalid_query", "reason: not one of "+strings.Join(store.ReviewReasons, ", "))
		return f, false
	case f.Contract != "":
		if _, known := s.D.Contracts.Get(f.Contract); !known {
			apierror.Write(w, http.StatusBadRequest, "invalid_query", "contract: not a known contract")
			return f, false
		}
	}
	return f, request.Page(w, q, store.ParseReviewCursor, &f.Limit, &f.AfterCreated, &f.AfterWork)
}

// writeReviews answers with the page of review items f selects.
func (s *Room) writeReviews(w http.ResponseWriter, r *http.Request, f store.ReviewFilter) {
	vs, err := s.D.Store.ListReviews(r.Context(), f)
	if err != nil {
		s.D.Log.Error("list reviews failed", "tenant", f.Tenant, "err", err)
		auth.Unavailable().Write(w)
		return
	}
	now := time.Now()
	out := api.ReviewList{Items: make([]api.ReviewView, 0, len(vs))}
	for _, v := range vs {
		out.Items = append(out.Items, story.ReviewView(v, now))
	}
	if len(vs) == f.Limit {
		out.Next = store.ReviewCursor(vs[len(vs)-1])
	}
	apierror.JSON(w, http.StatusOK, out)
}

// resolveReview serves POST /v1/reviews/{id}/resolve: the token's tenant
// resolves its item, recorded as resolved by tenant <id> via the API.
// Resolving an item resolved already is 409 and names who resolved it.
func (s *Room) resolveReview(w http.ResponseWriter, r *http.Request) {
	t, ok := s.Authenticate(w, r)
	if !ok {
		return
	}
	workID, ok := parseReviewID(r.PathValue("id"))
	if !ok {
		apierror.Write(w, http.StatusNotFound, "not_found", "no review item with that id for this tenant")
		return
	}
	var req api.ResolveRequest
	if refused, _ := request.DecodeBody(w, r, 64<<10, &req); refused != nil {
		refused.Write(w)
		return
	}
	switch {
	case req.By != nil:
		apierror.Write(w, http.StatusBadRequest, "invalid_resolver",
			"by is not accepted: the resolution is recorded as the token's tenant's ("+t.ID+"), via the API; leave by out")
		return
	case !slices.Contains(store.Verdicts, req.Verdict) || req.Verdict == store.VerdictAmended:
		apierror.Write(w, http.StatusBadRequest, "invalid_verdict",
			"verdict must be one of approved, rejected, dismissed (amended is given with its findings from the console's review screen)")
		return
	case len(req.Note) > 4000:
		apierror.Write(w, http.StatusBadRequest, "invalid_note", "note is at most 4000 bytes")
		return
	}
	by := store.Actor{Kind: store.ActorTenant, ID: t.ID, Route: store.RouteAPI}
	v, err := s.D.Store.ResolveReview(r.Context(), t.ID, workID, store.Resolution{By: by, Verdict: req.Verdict, Note: req.Note})
	switch {
	case errors.Is(err, store.ErrNotFound):
		apierror.Write(w, http.StatusNotFound, "not_found", "no review item with that id for this tenant")
		return
	case errors.Is(err, store.ErrResolved), errors.Is(err, store.ErrClaimed):
		reviewConflict(w, v, err)
		return
	case err != nil:
		s.D.Log.Error("resolve review failed", "key", workID, "err", err)
		auth.Unavailable().Write(w)
		return
	}
	telemetry.Decision(r.Context(), s.D.Log, v.WorkID, "review_resolved", story.Resolution(v),
		slog.String("tenant", t.ID), slog.String("review", story.ReviewID(v)))
	apierror.JSON(w, http.StatusOK, story.ReviewView(v, time.Now()))
}

// reviewConflict writes the 409 of an item resolved already
// (already_resolved) or held by another person (claimed), naming who.
func reviewConflict(w http.ResponseWriter, v *store.Review, err error) {
	if errors.Is(err, store.ErrResolved) {
		apierror.Write(w, http.StatusConflict, "already_resolved",
			fmt.Sprintf("review %s was resolved already (%s at %s); it is not resolved again", story.ReviewID(v),
				story.Resolution(v), v.ResolvedAt.UTC().Format(time.RFC3339)))
		return
	}
	apierror.Write(w, http.StatusConflict, "claimed",
		fmt.Sprintf("review %s is held by %s from the console until %s; it can be taken once that has passed", story.ReviewID(v),
			holder(v), v.ClaimedUntil.UTC().Format(time.RFC3339)))
}

// ViewCounts answers GET /v1/views: the tenant's work created in the last
// WindowSeconds, counted by the five states a reviewer tells apart
// (running, accepted, needs_review, rejected, terminal), and its open
// review items.
type ViewCounts struct {
	WindowSeconds int64            `json:"windowSeconds"`
	States        map[string]int64 `json:"states"`
	OpenReviews   *int             `json:"openReviews,omitempty"`
}

// views serves GET /v1/views?window=24h.
func (s *Room) views(w http.ResponseWriter, r *http.Request) {
	t, ok := s.Authenticate(w, r)
	if !ok {
		return
	}
	window := door.ViewWindow
	if v := r.URL.Query().Get("window"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Minute || d > 31*24*time.Hour {
			apierror.Write(w, http.StatusBadRequest, "invalid_query", "window: a duration from 1m to 744h, e.g. 24h")
			return
		}
		window = d
	}
	states, err := s.D.Store.ViewsOf(r.Context(), window, t.ID)
	if err != nil {
		s.D.Log.Error("views failed", "tenant", t.ID, "err", err)
		auth.Unavailable().Write(w)
		return
	}
	out := ViewCounts{WindowSeconds: int64(window / time.Second), States: states}
	n, err := s.D.Store.OpenReviews(r.Context(), t.ID)
	if err != nil {
		s.D.Log.Error("views failed", "tenant", t.ID, "err", err)
		auth.Unavailable().Write(w)
		return
	}
	out.OpenReviews = &n
	apierror.JSON(w, http.StatusOK, out)
}
