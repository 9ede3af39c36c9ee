package console

import (
	_ "embed"
	"errors"
	"net/http"
	"time"

	"assay.dev/pkg/api"
	"assay.dev/pkg/apierror"
	"assay.dev/pkg/auth"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outbox"
	"assay.dev/pkg/store"
	"assay.dev/pkg/story"
	"assay.dev/services/ingress/internal/door"
	"assay.dev/services/ingress/internal/page"
	"assay.dev/services/ingress/internal/request"
)

// consoleWork serves GET /v1/console/work/{id}: the work's story for the
// console's work page. A tenant's token reads its own work, an operator's
// any of the cell's; each answer is shown by its shape, never its words.
func (s *Room) consoleWork(w http.ResponseWriter, r *http.Request) {
	v, ok := s.Viewer(w, r)
	if !ok {
		return
	}
	story, err := story.Read(r.Context(), s.D.Store, r.PathValue("id"), story.AnswerShape)
	if errors.Is(err, store.ErrNotFound) || (err == nil && v.Operator == nil && story.Work.TenantID != v.Tenant.ID) {
		apierror.Write(w, http.StatusNotFound, "not_found", "no work with that id for this token")
		return
	}
	if err != nil {
		s.D.Log.Error("console: read a work's story failed", "key", r.PathValue("id"), "err", err)
		auth.Unavailable().Write(w)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	apierror.JSON(w, http.StatusOK, story)
}

// consoleWorkPage serves the work page: like the console, one page with
// nothing in it but its script, which reads /v1/console/work/{id} with the
// token the console keeps in the tab.
func (s *Room) consoleWorkPage(w http.ResponseWriter, r *http.Request) {
	page.Work.Serve(w, r)
}

// consoleAct serves POST /v1/console/work/{id}/actions: an operator (an
// operator token of role operator) redrives, reruns or cancels a work item
// from its page; the action is written with who asked, in its own
// transaction.
func (s *Room) consoleAct(w http.ResponseWriter, r *http.Request) {
	v, ok := s.Viewer(w, r)
	if !ok {
		return
	}
	if v.Operator == nil || v.Operator.Role != store.RoleOperator {
		apierror.Write(w, http.StatusForbidden, "forbidden", "only an operator token of role operator acts on work; this one reads")
		return
	}
	id := r.PathValue("id")
	var req api.ActionRequest
	if refused, _ := request.DecodeBody(w, r, 16<<10, &req); refused != nil {
		refused.Write(w)
		return
	}
	switch {
	case req.Action != "redrive" && req.Action != "rerun" && req.Action != "cancel":
		apierror.Write(w, http.StatusBadRequest, "invalid_action", "action must be redrive, rerun or cancel")
		return
	case req.Confirm != id:
		apierror.Write(w, http.StatusBadRequest, "unconfirmed", "confirm must repeat the work's id")
		return
	case len(req.Note) > 1000:
		apierror.Write(w, http.StatusBadRequest, "invalid_note", "note is at most 1000 bytes")
		return
	}
	ctx := r.Context()
	cur, err := s.D.Store.GetWork(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		apierror.Write(w, http.StatusNotFound, "not_found", "no work with that id in this cell")
		return
	}
	if err != nil {
		s.D.Log.Error("console: read work failed", "key", id, "err", err)
		auth.Unavailable().Write(w)
		return
	}
	audit := &store.Audit{By: door.ConsoleActor(v.Operator), Action: req.Action, Note: req.Note}
	deadline := time.Now().Add(s.LaneDeadline(cur.Lane))
	var got *store.Work
	switch req.Action {
	case "redrive":
		got, err = s.D.Store.RedriveWork(ctx, id, store.RedriveOptions{Deadline: deadline, Audit: audit}, outbox.Announce(ctx, s.Cfg.Names))
	case "rerun":
		got, err = s.D.Store.RerunAudited(ctx, id, deadline, outbox.Announce(ctx, s.Cfg.Names), audit)
	default:
		reason := "canceled from the console by " + v.Operator.Name
		got, err = s.D.Store.CancelWork(ctx, id, reason, func(w *store.Work, running bool) ([]store.OutboxMsg, error) {
			if !running {
				return nil, nil
			}
			m, err := outbox.Msg(ctx, event.KindWork, s.Cfg.Names.Cancel(w.TenantID), "cancel."+w.ID+".console",
				event.Cancel{WorkID: w.ID, TenantID: w.TenantID, Region: s.Cfg.Region, Reason: reason})
			if err != nil {
				return nil, err
			}
			return []store.OutboxMsg{m}, nil
		}, audit)
	}
	for _, refusal := range []error{store.ErrNotRedrivable, store.ErrRedriven, store.ErrNoInput, store.ErrSuperseded,
		store.ErrNotDropped, store.ErrTooLarge, store.ErrNotCancelable} {
		if errors.Is(err, refusal) {
			apierror.Write(w, http.StatusConflict, "not_actionable", err.Error())
			return
		}
	}
	if err != nil {
		s.D.Log.Error("console: action failed", "key", id, "action", req.Action, "err", err)
		auth.Unavailable().Write(w)
		return
	}
	s.D.Log.Info("console: work acted on", "key", id, "action", req.Action, "by", v.Operator.Name)
	apierror.JSON(w, http.StatusOK, api.ActionResponse{WorkID: got.ID, Action: req.Action, State: got.State, By: v.Operator.Name})
}
