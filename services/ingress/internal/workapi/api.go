package workapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"assay.dev/pkg/api"
	"assay.dev/pkg/apierror"
	"assay.dev/pkg/auth"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/story"
	"assay.dev/pkg/telemetry"
	"assay.dev/services/ingress/internal/door"
	"assay.dev/services/ingress/internal/request"
)

func (s *Room) submit(w http.ResponseWriter, r *http.Request) {
	ctx, span := s.D.Tel.Tracer().Start(telemetry.FromCaller(r.Context(), r.Header), "ingress.submit", trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()
	r = r.WithContext(ctx)
	t, ok := s.Authenticate(w, r)
	if !ok {
		s.Count(ctx, "unauthenticated")
		return
	}
	req, refused := s.decodeSubmit(w, r)
	if refused != nil {
		s.Count(ctx, refused.Code)
		refused.Write(w)
		return
	}
	c, _ := s.D.Contracts.Get(req.Contract)
	c, _ = s.ContractFor(ctx, t.ID, c)
	work := s.NewWork(ctx, t, c, req.SourceID, req.Revision, req.Lane, request.Compact(req.Input), s.deadline(req))
	span.SetAttributes(attribute.String("assay.work_id", work.ID), attribute.String("assay.tenant", t.ID))
	// The rate token is taken before the input is checked against its
	// schema: a refused request costs its bounded decoding alone.
	if wait, ok := s.Take(ctx, t, req.Lane); !ok {
		s.RefuseOverRate(ctx, w, t, work, wait)
		return
	}
	if refused := s.ValidateInput(c, req.Input); refused != nil {
		s.Count(ctx, refused.Code)
		refused.Write(w)
		return
	}
	if r := s.AdmitCapacity(ctx, t, work); r != nil {
		s.OverCapacity(ctx, w, t, work, r)
		return
	}
	ins := s.Inserts.Do(ctx, store.InsertReq{Work: work, Announce: s.Announcer(ctx), Publish: true})
	got, created, err := ins.Work, ins.Created, ins.Err
	if store.Permanent(err) {
		// Bad input the checks above let through: a 400, never a
		// "try again".
		s.Count(ctx, "invalid_input")
		s.D.Log.Warn("work refused by the database", "key", work.ID, "sqlstate", store.SQLState(err))
		apierror.Write(w, http.StatusBadRequest, "invalid_input",
			fmt.Sprintf("the cell cannot store this request: %s; nothing was stored", store.Refusal(err)))
		return
	}
	if store.MovedOut(err) {
		body, _ := json.Marshal(req)
		s.MovedOut(w, r, t.ID, body)
		return
	}
	if err != nil {
		s.D.Log.Error("insert work failed", "key", work.ID, "err", err)
		s.Count(ctx, "unavailable")
		apierror.Write(w, http.StatusServiceUnavailable, "unavailable", "the work was not stored; try again")
		return
	}
	if !created && got.State == outcome.Elsewhere {
		body, _ := json.Marshal(req)
		if s.SendToFinisher(w, r, t.ID, got.ID, body) {
			return
		}
	}
	if !created {
		s.Duplicate(ctx, w, t, got)
		return
	}
	s.Relay.Send(got.Announced...)
	s.GoShadow(ctx, work)
	s.LogSuperseded(ctx, got)
	s.Count(ctx, outcome.Accepted)
	telemetry.Decision(ctx, s.D.Log, got.ID, outcome.Queued, "new ingress key",
		slog.String("tenant", t.ID), telemetry.OpaqueAttr("source", req.SourceID), telemetry.OpaqueAttr("revision", req.Revision))
	apierror.JSON(w, http.StatusAccepted, door.Submitted(got, false))
}

// deadline is the request's deadline: its own, else its lane's.
func (s *Room) deadline(req api.SubmitRequest) time.Time {
	d := s.LaneDeadline(req.Lane)
	if req.DeadlineSeconds > 0 {
		d = time.Duration(req.DeadlineSeconds) * time.Second
	}
	return time.Now().Add(d)
}

// decodeSubmit reads the body strictly and validates it; a refusal says
// why the request is refused.
func (s *Room) decodeSubmit(w http.ResponseWriter, r *http.Request) (api.SubmitRequest, *apierror.Error) {
	var req api.SubmitRequest
	bad := func(code, msg string) (api.SubmitRequest, *apierror.Error) {
		return req, apierror.New(http.StatusBadRequest, code, msg)
	}
	// Text is checked as it is read: Postgres stores text, and
	// encoding/json would quietly turn bad bytes into U+FFFD.
	if refused, _ := request.DecodeBody(w, r, s.Cfg.MaxBodyBytes, &req); refused != nil {
		return req, refused
	}
	if req.Lane == "" {
		req.Lane = event.Interactive
	}
	_, ok := s.D.Contracts.Get(req.Contract)
	switch {
	case !ok:
		return bad("unknown_contract", fmt.Sprintf("contract %q is not known (known: %s)", req.Contract, strings.Join(s.D.Contracts.Names(), ", ")))
	case !door.SourceRE.MatchString(req.SourceID):
		return bad("invalid_source_id", "sourceId must be 1-200 characters of letters, digits and ._/#:@+- (e.g. owner/repo#42)")
	case !door.RevisionRE.MatchString(req.Revision):
		return bad("invalid_revision", "revision must be 1-100 characters of letters, digits and ._- (e.g. a commit SHA)")
	case !event.ValidLane(req.Lane):
		return bad("invalid_lane", fmt.Sprintf("lane %q is not one of interactive, batch", req.Lane))
	case req.DeadlineSeconds < 0 || req.DeadlineSeconds > 7*24*3600:
		return bad("invalid_deadline", "deadlineSeconds must be between 1 and 604800")
	case len(req.Input) == 0:
		return bad("invalid_input", "input is required")
	}
	return req, nil
}

// DecodeSubmit decodes a submission strictly: one JSON object, known fields
// only, nothing after it.
func DecodeSubmit(body []byte, req *api.SubmitRequest) error {
	return request.Decode(body, req)
}

func (s *Room) get(w http.ResponseWriter, r *http.Request) {
	t, ok := s.Authenticate(w, r)
	if !ok {
		return
	}
	v, err := s.View(r.Context(), r.PathValue("id"))
	if errors.Is(err, store.ErrNotFound) || (err == nil && v.TenantID != t.ID) {
		// Another tenant's work is indistinguishable from no work.
		apierror.Write(w, http.StatusNotFound, "not_found", "no work with that id for this tenant")
		return
	}
	if err != nil {
		s.D.Log.Error("read work failed", "key", r.PathValue("id"), "err", err)
		auth.Unavailable().Write(w)
		return
	}
	if v.State == outcome.Elsewhere && s.SendToFinisher(w, r, t.ID, v.WorkID, nil) {
		return
	}
	apierror.JSON(w, http.StatusOK, v)
}

// View reads what GET /v1/work/{id} shows.
func (s *Room) View(ctx context.Context, id string) (*api.WorkView, error) {
	wk, err := s.D.Store.GetWork(ctx, id)
	if err != nil {
		return nil, err
	}
	v := &api.WorkView{WorkID: wk.ID, TenantID: wk.TenantID, Region: wk.Region, Contract: wk.Contract, SchemaVersion: wk.SchemaVersion,
		SourceID: wk.SourceID, Revision: wk.Revision, Lane: wk.Lane, State: wk.State, Reason: wk.Reason,
		DeadlineAt: wk.DeadlineAt, CreatedAt: wk.CreatedAt, UpdatedAt: wk.UpdatedAt, Attempts: []api.AttemptView{}}
	if wk.Terminal() {
		o := wk.State
		v.Outcome = &o
	}
	attempts, err := s.D.Store.Attempts(ctx, id)
	if err != nil {
		return nil, err
	}
	for _, a := range attempts {
		v.Attempts = append(v.Attempts, api.AttemptView{AttemptID: a.ID, Number: a.Number, Outcome: a.Outcome,
			Reason: a.Reason, StartedAt: a.StartedAt, FinishedAt: a.FinishedAt, Part: a.Part})
	}
	if wk.State == outcome.Accepted {
		r, err := s.D.Store.GetResult(ctx, id)
		if err != nil {
			return nil, err
		}
		v.Result = &api.ResultView{SchemaVersion: r.SchemaVersion, AttemptID: r.AttemptID, Output: r.Output,
			Findings: r.Findings, CreatedAt: r.CreatedAt, Coverage: r.Coverage}
	}
	pubs, err := s.D.Store.PublicationsOf(ctx, id)
	if err != nil {
		return nil, err
	}
	v.Publications = story.PublicationViews(pubs)
	if v.Review, err = story.ReviewOf(ctx, s.D.Store, id); err != nil {
		return nil, err
	}
	if v.View, err = s.D.Store.ViewOf(ctx, id); err != nil {
		return nil, err
	}
	return v, nil
}
