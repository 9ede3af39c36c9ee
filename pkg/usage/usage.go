// Package usage answers GET /v1/usage from the cell's ledger rows. Both the
// ledger and ingress serve it, so a cell has one base URL.
package usage

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"assay.dev/pkg/apierror"
	"assay.dev/pkg/auth"
	"assay.dev/pkg/store"
)

// Report answers GET /v1/usage: the same ledger rows totalled by
// outcome and by model.
type Report struct {
	TenantID    string    `json:"tenantId"`
	From        time.Time `json:"from"`
	To          time.Time `json:"to"`
	Calls       int64     `json:"calls"`
	InputUnits  int64     `json:"inputUnits"`
	OutputUnits int64     `json:"outputUnits"`
	// CachedInputUnits are the input units the provider read from its
	// prompt cache, priced at the cached-input price; ReasoningUnits the
	// output units spent on hidden reasoning, billed as output. Both are
	// parts of the counts above, and 0 in an estimate.
	CachedInputUnits int64 `json:"cachedInputUnits"`
	ReasoningUnits   int64 `json:"reasoningUnits"`
	CostMicros       int64 `json:"costMicros"`
	// EstimatedCalls and EstimatedCostMicros are the part of the totals that
	// is estimated: calls that left and brought no usage back, charged the
	// request's estimate, and attempts whose worker died.
	EstimatedCalls      int64  `json:"estimatedCalls"`
	EstimatedCostMicros int64  `json:"estimatedCostMicros"`
	ByOutcome           []Line `json:"byOutcome"`
	ByModel             []Line `json:"byModel"`
}

// Line totals one outcome's or one model's attempts.
type Line struct {
	Outcome             string `json:"outcome,omitempty"`
	Model               string `json:"model,omitempty"`
	Calls               int64  `json:"calls"`
	InputUnits          int64  `json:"inputUnits"`
	OutputUnits         int64  `json:"outputUnits"`
	CachedInputUnits    int64  `json:"cachedInputUnits"`
	ReasoningUnits      int64  `json:"reasoningUnits"`
	CostMicros          int64  `json:"costMicros"`
	EstimatedCalls      int64  `json:"estimatedCalls"`
	EstimatedCostMicros int64  `json:"estimatedCostMicros"`
}

func line(l store.UsageLine) Line {
	return Line{Calls: l.Calls, InputUnits: l.InputUnits, OutputUnits: l.OutputUnits, CachedInputUnits: l.CachedInputUnits,
		ReasoningUnits: l.ReasoningUnits, CostMicros: l.CostMicros, EstimatedCalls: l.EstimatedCalls,
		EstimatedCostMicros: l.EstimatedCostMicros}
}

// Ledger totals a tenant's ledger rows; *store.Store is one.
type Ledger interface {
	Usage(ctx context.Context, tenant string, from, to time.Time, by string) ([]store.UsageLine, error)
}

// Store is what the usage report reads; *store.Store is one.
type Store interface {
	auth.Tenants
	Ledger
}

// Handler serves GET /v1/usage?tenant=…&from=…&to=… (RFC 3339 times; from
// defaults to 30 days ago, to to now) for cell. The token decides the
// tenant; a tenant parameter that names another one is refused. refuse,
// when set, answers a refusal of the token in place of writing it (ingress
// sends a request of a tenant another cell serves on to it).
func Handler(st Store, cell auth.Cell, log *slog.Logger, refuse func(http.ResponseWriter, *http.Request, store.Tenant, *apierror.Error)) http.Handler {
	if refuse == nil {
		refuse = func(w http.ResponseWriter, _ *http.Request, _ store.Tenant, e *apierror.Error) { e.Write(w) }
	}
	h := handler{st: st, cell: cell, log: log, refuse: refuse}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/usage", h.usage)
	return mux
}

type handler struct {
	st     Store
	cell   auth.Cell
	log    *slog.Logger
	refuse func(http.ResponseWriter, *http.Request, store.Tenant, *apierror.Error)
}

func (s handler) usage(w http.ResponseWriter, r *http.Request) {
	t, refused := auth.Bearer(r.Context(), s.st, r.Header.Get("Authorization"), s.cell)
	if refused != nil {
		s.refuse(w, r, t, refused)
		return
	}
	q := r.URL.Query()
	if tn := q.Get("tenant"); tn != "" && tn != t.ID {
		apierror.Write(w, http.StatusForbidden, "forbidden", "this token may only read its own tenant's usage")
		return
	}
	to := time.Now()
	from := to.Add(-30 * 24 * time.Hour)
	for _, p := range []struct {
		name string
		dst  *time.Time
	}{{"from", &from}, {"to", &to}} {
		if v := q.Get(p.name); v != "" {
			ts, err := time.Parse(time.RFC3339, v)
			if err != nil {
				apierror.Write(w, http.StatusBadRequest, "invalid_time", p.name+" must be an RFC 3339 time, e.g. 2026-12-01T00:00:00Z")
				return
			}
			*p.dst = ts
		}
	}
	if !from.Before(to) {
		apierror.Write(w, http.StatusBadRequest, "invalid_period", "from must be before to")
		return
	}
	rep, err := Read(r.Context(), s.st, t.ID, from, to)
	if err != nil {
		s.log.Error("usage query failed", "err", err)
		auth.Unavailable().Write(w)
		return
	}
	apierror.JSON(w, http.StatusOK, rep)
}

// Read is the report of tenant's ledger rows that occurred in [from, to),
// as GET /v1/usage answers it.
func Read(ctx context.Context, st Ledger, tenant string, from, to time.Time) (Report, error) {
	lines, err := st.Usage(ctx, tenant, from, to, store.ByOutcome)
	if err != nil {
		return Report{}, err
	}
	models, err := st.Usage(ctx, tenant, from, to, store.ByModel)
	if err != nil {
		return Report{}, err
	}
	// Empty arrays, not null, so clients can range over them unchecked.
	rep := Report{TenantID: tenant, From: from.UTC(), To: to.UTC(), ByOutcome: []Line{}, ByModel: []Line{}}
	for _, l := range lines {
		u := line(l)
		u.Outcome = l.Key
		rep.ByOutcome = append(rep.ByOutcome, u)
		rep.Calls += l.Calls
		rep.InputUnits += l.InputUnits
		rep.OutputUnits += l.OutputUnits
		rep.CachedInputUnits += l.CachedInputUnits
		rep.ReasoningUnits += l.ReasoningUnits
		rep.CostMicros += l.CostMicros
		rep.EstimatedCalls += l.EstimatedCalls
		rep.EstimatedCostMicros += l.EstimatedCostMicros
	}
	for _, l := range models {
		u := line(l)
		u.Model = l.Key
		rep.ByModel = append(rep.ByModel, u)
	}
	return rep, nil
}
