package workapi

import (
	"net/http"
	"net/url"
	"slices"
	"time"

	"assay.dev/pkg/api"
	"assay.dev/pkg/apierror"
	"assay.dev/pkg/auth"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/services/ingress/internal/door"
	"assay.dev/services/ingress/internal/request"
)

// list serves GET /v1/work?state=&lane=&since=&limit=&cursor=: the
// token's tenant's work, filtered, in pages.
func (s *Room) list(w http.ResponseWriter, r *http.Request) {
	t, ok := s.Authenticate(w, r)
	if !ok {
		return
	}
	f, ok := readWorkFilter(w, r.URL.Query())
	if !ok {
		return
	}
	f.Tenant = t.ID
	s.writeWorkList(w, r, f)
}

// consoleFind serves GET /v1/console/work: the console's search, by
// source id, tenant, state, lane and time. An operator's token searches
// the cell's work, a tenant's its own alone.
func (s *Room) consoleFind(w http.ResponseWriter, r *http.Request) {
	v, ok := s.Viewer(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	f, ok := readWorkFilter(w, q)
	if !ok {
		return
	}
	f.Tenant, f.SourceID = q.Get("tenant"), q.Get("source")
	if f.SourceID != "" && !door.SourceRE.MatchString(f.SourceID) {
		apierror.Write(w, http.StatusBadRequest, "invalid_query", "source: not a source id")
		return
	}
	if !queryTime(w, q, "until", &f.Until) {
		return
	}
	if v.Operator == nil {
		if f.Tenant != "" && f.Tenant != v.Tenant.ID {
			apierror.Write(w, http.StatusForbidden, "forbidden", "a tenant's token finds its own work only")
			return
		}
		f.Tenant = v.Tenant.ID
	}
	s.writeWorkList(w, r, f)
}

// readWorkFilter reads a listing's state, lane, since, limit and cursor,
// or writes the refusal.
func readWorkFilter(w http.ResponseWriter, q url.Values) (store.WorkFilter, bool) {
	f := store.WorkFilter{State: q.Get("state"), Lane: q.Get("lane"), Limit: 100}
	if f.State != "" && !slices.Contains(outcome.WorkStates, f.State) {
		apierror.Write(w, http.StatusBadRequest, "invalid_query", "state: not a work state")
		return f, false
	}
	if f.Lane != "" && !event.ValidLane(f.Lane) {
		apierror.Write(w, http.StatusBadRequest, "invalid_query", "lane: not interactive or batch")
		return f, false
	}
	if !queryTime(w, q, "since", &f.Since) || !request.Page(w, q, store.ParseWorkCursor, &f.Limit, &f.AfterCreated, &f.AfterID) {
		return f, false
	}
	f.Live = true
	return f, true
}

// queryTime reads the query's name, when given, as an RFC 3339 time into
// at; false means it wrote the refusal.
func queryTime(w http.ResponseWriter, q url.Values, name string, at *time.Time) bool {
	v := q.Get(name)
	if v == "" {
		return true
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		apierror.Write(w, http.StatusBadRequest, "invalid_query", name+": not an RFC 3339 time")
		return false
	}
	*at = t
	return true
}

// writeWorkList answers with the page of work f selects.
func (s *Room) writeWorkList(w http.ResponseWriter, r *http.Request, f store.WorkFilter) {
	ws, err := s.D.Store.ListWork(r.Context(), f)
	if err != nil {
		s.D.Log.Error("list work failed", "tenant", f.Tenant, "err", err)
		auth.Unavailable().Write(w)
		return
	}
	out := api.WorkList{Items: make([]api.WorkSummary, 0, len(ws))}
	for _, wk := range ws {
		v := api.WorkSummary{WorkID: wk.ID, TenantID: wk.TenantID, Contract: wk.Contract, SourceID: wk.SourceID, Revision: wk.Revision,
			Lane: wk.Lane, State: wk.State, Reason: wk.Reason, Attempts: wk.Attempts, DeadlineAt: wk.DeadlineAt,
			CreatedAt: wk.CreatedAt, UpdatedAt: wk.UpdatedAt, Links: api.Links{Self: "/v1/work/" + wk.ID}}
		if wk.Terminal() {
			o := wk.State
			v.Outcome = &o
		}
		out.Items = append(out.Items, v)
	}
	if len(ws) == f.Limit {
		out.Next = store.WorkCursor(ws[len(ws)-1])
	}
	apierror.JSON(w, http.StatusOK, out)
}
