// Package story reads what a cell's records say of one work item: its
// row, attempts, ledger, outbox, redrives, actions, review item and
// publications, and the decisions they trace, in time order. Ingress
// serves it to the console's work page; the operator's tool prints it
// (assay work show) straight from the database.
package story

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"assay.dev/pkg/api"
	"assay.dev/pkg/event"
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

// Story is everything the cell's records say of one work item: what
// `assay work show` prints and the console's work page shows.
type Story struct {
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
	Review *api.WorkReview `json:"review,omitempty"`
	// View is the work's one state, as the work API and the views give it.
	View      string     `json:"view"`
	Decisions []Decision `json:"decisions"`
	// Publications are where its outcome went, one per target.
	Publications []api.PublicationView `json:"publications"`
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

// Store is what a work's story is read from; *store.Store is one.
type Store interface {
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

// Read reads everything the cell records about one work item,
// showing as much of each answer as answers says.
func Read(ctx context.Context, st Store, id string, answers Answers) (*Story, error) {
	w, err := st.GetWork(ctx, id)
	if err != nil {
		return nil, err
	}
	s := &Story{Work: WorkRowOf(w), TraceID: traceID(w.Traceparent), Attempts: []AttemptStory{}}
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
	if s.Review, err = ReviewOf(ctx, st, id); err != nil {
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
func decisions(w *store.Work, s *Story) []Decision {
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

// PublicationViews are the views of a work item's publications.
func PublicationViews(ps []*store.Publication) []api.PublicationView {
	at := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		u := t.UTC()
		return &u
	}
	out := make([]api.PublicationView, 0, len(ps))
	for _, p := range ps {
		v := api.PublicationView{Target: p.Target, State: p.State, Outcome: p.Outcome, CheckRunID: p.CheckRunID,
			RerunCommentID: p.RerunCommentID, Tries: p.Tries, LastError: p.LastError, Reason: p.Reason,
			LastTriedAt: at(p.LastTriedAt), PublishedAt: at(p.PublishedAt)}
		if len(p.CommentIDs) > 0 {
			v.CommentIDs = p.CommentIDs
		}
		if p.State == store.PublicationPending {
			v.NextTryAt, v.DeadlineAt = at(p.NextTryAt), at(p.DeadlineAt)
		}
		out = append(out, v)
	}
	return out
}

// ReviewOf reads the review item of work id, nil when it has none.
func ReviewOf(ctx context.Context, st Store, id string) (*api.WorkReview, error) {
	rv, err := st.ReviewOfWork(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &api.WorkReview{ReviewView: ReviewView(rv, time.Now()), Output: rv.Output}, nil
}

// ReviewView is v as the API shows it at now.
func ReviewView(v *store.Review, now time.Time) api.ReviewView {
	rv := api.ReviewView{ReviewID: ReviewID(v), WorkID: v.WorkID, TenantID: v.TenantID, Contract: v.Contract, Lane: v.Lane, Reason: v.Reason,
		State: v.State, WorkState: v.WorkState, WorkReason: v.WorkReason, SourceID: v.SourceID, Revision: v.Revision,
		Verdict: v.Verdict, ResolvedBy: v.ResolvedBy,
		Note: v.Note, Published: v.Output != nil, CreatedAt: v.CreatedAt, Links: api.Links{Self: "/v1/work/" + v.WorkID}}
	if !v.ResolvedAt.IsZero() {
		at := v.ResolvedAt
		rv.ResolvedAt = &at
		rv.Resolution = Resolution(v)
	}
	if who, ok := v.Resolver(); ok {
		rv.Resolver = &who
	}
	if rv.HeldBy = v.HeldBy(now); rv.HeldBy != "" {
		until := v.ClaimedUntil
		rv.HeldByKind, rv.HeldUntil = v.ClaimedKind, &until
	}
	return rv
}

// ReviewID is a review item's public id: rv_ and its work's hex. A work
// has one review item at most, so it is unique, and it counts nothing (a
// sequence would tell a tenant how many items the whole cell holds).
func ReviewID(v *store.Review) string { return "rv_" + strings.TrimPrefix(v.WorkID, "w_") }

// Resolution is a resolved item's verdict and resolver in a sentence. An
// item resolved before resolvers were recorded has only the name its
// request gave, and says so.
func Resolution(v *store.Review) string {
	if v.ClosedBySystem() {
		return "closed by the system: " + v.Note
	}
	if who, ok := v.Resolver(); ok {
		return v.Verdict + " by " + who.String()
	}
	return fmt.Sprintf("%s by %q (as its request named it, before resolvers were recorded)", v.Verdict, v.ResolvedBy)
}
