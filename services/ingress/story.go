package ingress

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"assay.dev/pkg/apierror"
	"assay.dev/pkg/auth"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outbox"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

// WorkRow is a work row as the operator sees it; the input itself stays
// in the database (its size and digest are shown).
type WorkRow struct {
	ID              string    `json:"workId"`
	TenantID        string    `json:"tenantId"`
	Region          string    `json:"region"`
	Contract        string    `json:"contract"`
	SchemaVersion   string    `json:"schemaVersion"`
	TaxonomyVersion string    `json:"taxonomyVersion"`
	SourceID        string    `json:"sourceId"`
	Revision        string    `json:"revision"`
	Lane            string    `json:"lane"`
	State           string    `json:"state"`
	Reason          string    `json:"reason,omitempty"`
	Attempts        int       `json:"attempts"`
	Repairs         int       `json:"repairs"`
	Dispatch        int       `json:"dispatch"`
	InputBytes      int       `json:"inputBytes"`
	Digest          string    `json:"digest"`
	Traceparent     string    `json:"traceparent,omitempty"`
	DeadlineAt      time.Time `json:"deadlineAt"`
	CreatedAt       time.Time `json:"createdAt"`
	UpdatedAt       time.Time `json:"updatedAt"`
}

// WorkRowOf is w as an operator sees it.
func WorkRowOf(w *store.Work) WorkRow {
	return WorkRow{ID: w.ID, TenantID: w.TenantID, Region: w.Region, Contract: w.Contract, SchemaVersion: w.SchemaVersion,
		TaxonomyVersion: w.TaxonomyVersion, SourceID: w.SourceID, Revision: w.Revision, Lane: w.Lane, State: w.State,
		Reason: w.Reason, Attempts: w.Attempts, Repairs: w.Repairs, Dispatch: w.Dispatch, InputBytes: len(w.Input),
		Digest: w.Digest, Traceparent: w.Traceparent, DeadlineAt: w.DeadlineAt, CreatedAt: w.CreatedAt, UpdatedAt: w.UpdatedAt}
}

// AttemptStory is one attempt with an excerpt of its kept answer.
type AttemptStory struct {
	ID           string     `json:"attemptId"`
	Number       int        `json:"number"`
	Outcome      string     `json:"outcome"`
	Reason       string     `json:"reason,omitempty"`
	StartedAt    time.Time  `json:"startedAt"`
	FinishedAt   *time.Time `json:"finishedAt,omitempty"`
	AnswerBytes  int        `json:"answerBytes"`
	AnswerSHA256 string     `json:"answerSha256,omitempty"`
	// Excerpt is the answer's first bytes, only when asked (AnswerFull):
	// a model's answer may quote its input (a credential in a diff,
	// personal data), and this output leaves the database.
	Excerpt string `json:"excerpt,omitempty"`
	// Shape is the answer with every string replaced by its length (its
	// keys, numbers and nesting kept), when asked (AnswerShape): what a
	// person needs to see why an answer was refused, without its words.
	Shape string `json:"shape,omitempty"`
}

// Decision is one thing the cell decided about the work, as its records
// show it.
type Decision struct {
	At     time.Time `json:"at"`
	What   string    `json:"what"`
	Reason string    `json:"reason,omitempty"`
	// From names the record it is read from.
	From string `json:"from"`
}

// WorkStory is everything the cell's records say of one work item: what
// `assay work show` prints and the console's work page shows.
type WorkStory struct {
	Work     WorkRow           `json:"work"`
	TraceID  string            `json:"traceId,omitempty"`
	Attempts []AttemptStory    `json:"attempts"`
	Ledger   []store.LedgerRow `json:"ledger"`
	Result   *store.Result     `json:"result,omitempty"`
	Outbox   []store.OutboxRow `json:"outbox"`
	Redrives []store.Redrive   `json:"redrives"`
	// Actions are what was done to it: the console's redrives, reruns and
	// cancels, and its review item's claims and resolution, each with who
	// (as their credential said), through which route, and when.
	Actions []store.WorkAction `json:"actions"`
	// Review is its review item, when it has one, with the answer a person
	// published when they did.
	Review *WorkReview `json:"review,omitempty"`
	// View is the work's one state, as the work API and the views give it.
	View      string     `json:"view"`
	Decisions []Decision `json:"decisions"`
	// Publications are where its outcome went, one per target.
	Publications []PublicationView `json:"publications"`
}

// excerptBytes is how much of an answer an excerpt shows.
const excerptBytes = 160

// excerpt is the start of an answer, printable: bytes that are not UTF-8
// and control characters are escaped.
func excerpt(raw []byte) string {
	cut := raw[:min(len(raw), excerptBytes)]
	var b strings.Builder
	for len(cut) > 0 {
		r, n := utf8.DecodeRune(cut)
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, cut[0])
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.WriteRune(r)
		}
		cut = cut[n:]
	}
	if len(raw) > excerptBytes {
		b.WriteString("…")
	}
	return b.String()
}

// traceID is the trace id of a W3C traceparent, "" when there is none.
func traceID(tp string) string {
	parts := strings.Split(tp, "-")
	if len(parts) != 4 {
		return ""
	}
	return parts[1]
}

// Answers says how much of each kept answer a story shows.
type Answers int

const (
	AnswerNone  Answers = iota // its size and digest alone
	AnswerShape                // and its shape, no string of it
	AnswerFull                 // and its first bytes as they are
)

// StoryStore is what a work's story is read from; *store.Store is one.
type StoryStore interface {
	GetWork(ctx context.Context, id string) (*store.Work, error)
	AttemptAnswers(ctx context.Context, workID string) ([]store.AttemptAnswer, error)
	LedgerOf(ctx context.Context, workID string) ([]store.LedgerRow, error)
	GetResult(ctx context.Context, workID string) (*store.Result, error)
	OutboxOf(ctx context.Context, workID string) ([]store.OutboxRow, error)
	RedrivesOf(ctx context.Context, workID string) ([]store.Redrive, error)
	ActionsOf(ctx context.Context, workID string) ([]store.WorkAction, error)
	PublicationsOf(ctx context.Context, workID string) ([]*store.Publication, error)
	ReviewOfWork(ctx context.Context, workID string) (*store.Review, error)
	ViewOf(ctx context.Context, workID string) (string, error)
}

// ReadStory reads everything the cell records about one work item,
// showing as much of each answer as answers says.
func ReadStory(ctx context.Context, st StoryStore, id string, answers Answers) (*WorkStory, error) {
	w, err := st.GetWork(ctx, id)
	if err != nil {
		return nil, err
	}
	s := &WorkStory{Work: WorkRowOf(w), TraceID: traceID(w.Traceparent), Attempts: []AttemptStory{}}
	kept, err := st.AttemptAnswers(ctx, id)
	if err != nil {
		return nil, err
	}
	for _, a := range kept {
		as := AttemptStory{ID: a.ID, Number: a.Number, Outcome: a.Outcome, Reason: a.Reason, StartedAt: a.StartedAt,
			FinishedAt: a.FinishedAt, AnswerBytes: len(a.Raw)}
		if a.Raw != nil {
			sum := sha256.Sum256(a.Raw)
			as.AnswerSHA256 = hex.EncodeToString(sum[:])
			switch answers {
			case AnswerFull:
				as.Excerpt = excerpt(a.Raw)
			case AnswerShape:
				as.Shape = shape(a.Raw)
			}
		}
		s.Attempts = append(s.Attempts, as)
	}
	if s.Ledger, err = st.LedgerOf(ctx, id); err != nil {
		return nil, err
	}
	if w.State == outcome.Accepted {
		if s.Result, err = st.GetResult(ctx, id); err != nil && !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
	}
	if s.Outbox, err = st.OutboxOf(ctx, id); err != nil {
		return nil, err
	}
	if s.Redrives, err = st.RedrivesOf(ctx, id); err != nil {
		return nil, err
	}
	if s.Actions, err = st.ActionsOf(ctx, id); err != nil {
		return nil, err
	}
	if s.Actions == nil {
		s.Actions = []store.WorkAction{}
	}
	if s.Review, err = workReview(ctx, st, id); err != nil {
		return nil, err
	}
	if s.View, err = st.ViewOf(ctx, id); err != nil {
		return nil, err
	}
	pubs, err := st.PublicationsOf(ctx, id)
	if err != nil {
		return nil, err
	}
	s.Publications = PublicationViews(pubs)
	s.Decisions = decisions(w, s)
	return s, nil
}

// decisions puts the cell's records of one work item in time order: each
// row is the trace of a decision made when it was written.
func decisions(w *store.Work, s *WorkStory) []Decision {
	ds := []Decision{{At: w.CreatedAt, What: "admitted", Reason: "work row written by ingress", From: "work.created_at"}}
	number := map[string]int{}
	for _, a := range s.Attempts {
		number[a.ID] = a.Number
		ds = append(ds, Decision{At: a.StartedAt, What: fmt.Sprintf("claimed attempt %d", a.Number), Reason: "lease taken", From: "attempts.started_at"})
		if a.FinishedAt != nil {
			ds = append(ds, Decision{At: *a.FinishedAt, What: fmt.Sprintf("attempt %d: %s", a.Number, a.Outcome), Reason: a.Reason, From: "attempts.outcome"})
		}
	}
	first := event.WorkMsgID(w.ID, 1)
	if w.State != outcome.Dropped && !slices.ContainsFunc(s.Outbox, func(o store.OutboxRow) bool { return o.MsgID == first }) {
		// The ingress publishes a new work's own announcement once the row
		// is committed, with no outbox row; the sweeper announces queued
		// work again whose announcement was lost.
		ds = append(ds, Decision{At: w.CreatedAt, What: "announced " + first,
			Reason: "published by the ingress once the work row was committed (no outbox row)", From: "work.created_at"})
	}
	for _, o := range s.Outbox {
		what := "event " + o.Stream + " " + o.MsgID
		if o.Stream == event.KindWork {
			what = "announced " + o.MsgID
			if strings.HasPrefix(o.MsgID, "cancel.") {
				what = "cancel sent " + o.MsgID
			}
		}
		switch {
		case o.PublishedAt != nil:
			ds = append(ds, Decision{At: *o.PublishedAt, What: what, Reason: "published to " + o.Subject, From: "outbox.published_at"})
		case o.SetAside:
			ds = append(ds, Decision{At: o.CreatedAt, What: what, Reason: "set aside: could not be published", From: "outbox_waiting.set_aside_at"})
		default:
			ds = append(ds, Decision{At: o.CreatedAt, What: what, Reason: "written, not yet published", From: "outbox.created_at"})
		}
	}
	for _, l := range s.Ledger {
		reason := fmt.Sprintf("%d in, %d out, %d micro-dollars", l.InputUnits, l.OutputUnits, l.CostMicros)
		if l.Estimated {
			reason += ", estimated (no usage came back)"
		}
		ds = append(ds, Decision{At: l.OccurredAt, What: fmt.Sprintf("charged attempt %d (%s)", number[l.AttemptID], l.Outcome), Reason: reason, From: "ledger"})
	}
	if s.Result != nil {
		ds = append(ds, Decision{At: s.Result.CreatedAt, What: "committed", Reason: fmt.Sprintf("attempt %d accepted, %d finding(s)",
			number[s.Result.AttemptID], s.Result.Findings), From: "results"})
	}
	for _, r := range s.Redrives {
		ds = append(ds, Decision{At: r.EndedAt, What: "ended " + r.EndedState, Reason: r.EndedReason, From: "redrives.ended_state"})
		ds = append(ds, Decision{At: r.RedrivenAt, What: "redriven", Reason: fmt.Sprintf("its %s ending of %s queued again as dispatch %d",
			r.EndedState, r.EndedAt.UTC().Format(time.RFC3339), r.Dispatch), From: "redrives"})
	}
	resolvedAct := false
	for _, a := range s.Actions {
		d := Decision{At: a.At, What: a.Action + " asked", Reason: "by " + a.Actor().String(), From: "work_actions"}
		switch a.Action {
		case store.ActionClaim:
			d.What = "review item claimed"
			if a.Note != "" {
				d.Reason += ", " + a.Note
			}
		case store.ActionResolve:
			d.What, resolvedAct = "review item "+a.Note, true
		}
		ds = append(ds, d)
	}
	if v := s.Review; v != nil {
		ds = append(ds, Decision{At: v.CreatedAt, What: "entered the review queue", Reason: v.Reason, From: "reviews.created_at"})
		if v.ResolvedAt != nil && !resolvedAct {
			// Resolved before resolutions were recorded as actions.
			ds = append(ds, Decision{At: *v.ResolvedAt, What: "review item " + v.Verdict, Reason: v.Resolution, From: "reviews.resolved_at"})
		}
	}
	if w.Terminal() && w.State != outcome.Accepted {
		ds = append(ds, Decision{At: w.UpdatedAt, What: "ended " + w.State, Reason: w.Reason, From: "work.state"})
	}
	slices.SortStableFunc(ds, func(a, b Decision) int { return a.At.Compare(b.At) })
	return ds
}

// shapeBytes is how much of an answer's shape a story shows.
const shapeBytes = 2000

// plainKey is an object key shown as it is in a shape: a schema's own
// kind of name. Any other key is shown by its length, as strings are.
var plainKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,39}$`)

// shape is an answer's JSON with every string replaced by its length and
// every key that is not a plain name likewise; an answer that is not JSON
// is named by its size alone.
func shape(raw []byte) string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil || dec.More() {
		return fmt.Sprintf("(not JSON: %d bytes)", len(raw))
	}
	var walk func(any) any
	walk = func(v any) any {
		switch x := v.(type) {
		case string:
			return fmt.Sprintf("‹%d chars›", utf8.RuneCountInString(x))
		case []any:
			for i := range x {
				x[i] = walk(x[i])
			}
			return x
		case map[string]any:
			out := make(map[string]any, len(x))
			for k, e := range x {
				if !plainKey.MatchString(k) {
					k = fmt.Sprintf("‹key of %d chars›", utf8.RuneCountInString(k))
				}
				out[k] = walk(e)
			}
			return out
		}
		return v
	}
	out, err := json.Marshal(walk(v))
	if err != nil {
		return fmt.Sprintf("(not JSON: %d bytes)", len(raw))
	}
	if len(out) > shapeBytes {
		cut := out[:shapeBytes]
		for !utf8.Valid(cut) {
			cut = cut[:len(cut)-1]
		}
		return string(cut) + "…"
	}
	return string(out)
}

// consoleWork serves GET /v1/console/work/{id}: the work's story for the
// console's work page. A tenant's token reads its own work, an operator's
// any of the cell's; each answer is shown by its shape, never its words.
func (s *Service) consoleWork(w http.ResponseWriter, r *http.Request) {
	v, ok := s.viewer(w, r)
	if !ok {
		return
	}
	story, err := ReadStory(r.Context(), s.d.Store, r.PathValue("id"), AnswerShape)
	if errors.Is(err, store.ErrNotFound) || (err == nil && v.Operator == nil && story.Work.TenantID != v.Tenant.ID) {
		apierror.Write(w, http.StatusNotFound, "not_found", "no work with that id for this token")
		return
	}
	if err != nil {
		s.d.Log.Error("console: read a work's story failed", "key", r.PathValue("id"), "err", err)
		auth.Unavailable().Write(w)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	apierror.JSON(w, http.StatusOK, story)
}

//go:embed console_work.html
var consoleWorkSource []byte

var consoleWorkHTML = withConsoleStyle(consoleWorkSource)

// withConsoleStyle is a console page with the console's own style rules
// and the shared script in it, so the pages look and sign in alike from
// one stylesheet and one script, and each still loads nothing.
func withConsoleStyle(page []byte) []byte {
	const marker = "/* the console's own rules (console.html) are put here when the page is served */\n"
	m := regexp.MustCompile(`(?s)<style>(.*?)</style>`).FindSubmatch(consoleSource)
	if m == nil || !bytes.Contains(page, []byte(marker)) {
		panic("ingress: a console page or the console has no style to share")
	}
	return withSharedScript(bytes.Replace(page, []byte(marker), m[1], 1))
}

var consoleWorkCSP = pageCSP(consoleWorkHTML)

// consoleWorkPage serves the work page: like the console, one page with
// nothing in it but its script, which reads /v1/console/work/{id} with the
// token the console keeps in the tab.
func (s *Service) consoleWorkPage(w http.ResponseWriter, r *http.Request) {
	servePage(w, r, consoleWorkHTML, consoleWorkCSP)
}

// actor is what acting on work from the console asks of the store.
type actor interface {
	RedriveWork(ctx context.Context, id string, o store.RedriveOptions, announce func(*store.Work) ([]store.OutboxMsg, error)) (*store.Work, error)
	RerunAudited(ctx context.Context, id string, deadline time.Time, announce func(*store.Work) ([]store.OutboxMsg, error),
		audit *store.Audit) (*store.Work, error)
	CancelWork(ctx context.Context, id, reason string, cancel func(w *store.Work, running bool) ([]store.OutboxMsg, error),
		audit *store.Audit) (*store.Work, error)
}

// ActionRequest is the body of POST /v1/console/work/{id}/actions.
type ActionRequest struct {
	// Action is redrive (work that ended in a failed outcome), rerun (work
	// admission dropped) or cancel (work not ended yet).
	Action string `json:"action"`
	// Confirm repeats the work's id: the page asks the person to type it.
	Confirm string `json:"confirm"`
	Note    string `json:"note,omitempty"`
}

// ActionResponse answers an action taken.
type ActionResponse struct {
	WorkID string `json:"workId"`
	Action string `json:"action"`
	State  string `json:"state"`
	By     string `json:"by"`
}

// consoleAct serves POST /v1/console/work/{id}/actions: an operator (an
// operator token of role operator) redrives, reruns or cancels a work item
// from its page; the action is written with who asked, in its own
// transaction.
func (s *Service) consoleAct(w http.ResponseWriter, r *http.Request) {
	v, ok := s.viewer(w, r)
	if !ok {
		return
	}
	if v.Operator == nil || v.Operator.Role != store.RoleOperator {
		apierror.Write(w, http.StatusForbidden, "forbidden", "only an operator token of role operator acts on work; this one reads")
		return
	}
	id := r.PathValue("id")
	var req ActionRequest
	if refused, _ := decodeBody(w, r, 16<<10, &req); refused != nil {
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
	cur, err := s.d.Store.GetWork(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		apierror.Write(w, http.StatusNotFound, "not_found", "no work with that id in this cell")
		return
	}
	if err != nil {
		s.d.Log.Error("console: read work failed", "key", id, "err", err)
		auth.Unavailable().Write(w)
		return
	}
	audit := &store.Audit{By: consoleActor(v.Operator), Action: req.Action, Note: req.Note}
	deadline := time.Now().Add(s.laneDeadline(cur.Lane))
	var got *store.Work
	switch req.Action {
	case "redrive":
		got, err = s.d.Store.RedriveWork(ctx, id, store.RedriveOptions{Deadline: deadline, Audit: audit}, Announce(ctx, s.cfg.Names))
	case "rerun":
		got, err = s.d.Store.RerunAudited(ctx, id, deadline, Announce(ctx, s.cfg.Names), audit)
	default:
		reason := "canceled from the console by " + v.Operator.Name
		got, err = s.d.Store.CancelWork(ctx, id, reason, func(w *store.Work, running bool) ([]store.OutboxMsg, error) {
			if !running {
				return nil, nil
			}
			m, err := outbox.Msg(ctx, event.KindWork, s.cfg.Names.Cancel(w.TenantID), "cancel."+w.ID+".console",
				event.Cancel{WorkID: w.ID, TenantID: w.TenantID, Region: s.cfg.Region, Reason: reason})
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
		s.d.Log.Error("console: action failed", "key", id, "action", req.Action, "err", err)
		auth.Unavailable().Write(w)
		return
	}
	s.d.Log.Info("console: work acted on", "key", id, "action", req.Action, "by", v.Operator.Name)
	apierror.JSON(w, http.StatusOK, ActionResponse{WorkID: got.ID, Action: req.Action, State: got.State, By: v.Operator.Name})
}
