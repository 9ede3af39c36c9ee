package desk

import (
	"bytes"
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"assay.dev/pkg/api"
	"assay.dev/pkg/apierror"
	"assay.dev/pkg/auth"
	"assay.dev/pkg/contract"
	"assay.dev/pkg/diff"
	"assay.dev/pkg/event"
	"assay.dev/pkg/gate"
	"assay.dev/pkg/outbox"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/story"
	"assay.dev/pkg/telemetry"
	"assay.dev/services/ingress/internal/door"
	"assay.dev/services/ingress/internal/page"
	"assay.dev/services/ingress/internal/request"
)

// ReviewHold is how long a claim from the console's review screen (its
// Claim button, POST /v1/console/reviews/{id}/claim) holds an item for
// that person; claiming it again extends the hold. Opening the item only
// reads it.
const ReviewHold = 15 * time.Minute

// ReviewCase is one review item as the review screen shows it: the item,
// its work, the answer judged with each finding placed on the diff, and
// every attempt's outcome and the gate's reason.
type ReviewCase struct {
	Review api.ReviewView `json:"review"`
	Work   story.WorkRow  `json:"work"`
	// Answer names the answer judged: "result" (an accepted one), "attempt
	// N" (the last kept answer that is a JSON object), or "" for none.
	Answer string `json:"answer"`
	// Gate is the gate's verdict on that answer now: "" when it passes,
	// else its code and detail.
	Gate     string        `json:"gate,omitempty"`
	Findings []CaseFinding `json:"findings"`
	// Files is the work's diff, for contracts grounded in one; Input is
	// the work's input otherwise.
	Files    []CaseFile      `json:"files,omitempty"`
	Input    json.RawMessage `json:"input,omitempty"`
	Attempts []CaseAttempt   `json:"attempts"`
	// Output is what the item was resolved with and published, once it is.
	Output json.RawMessage `json:"output,omitempty"`
	// Schema is the JSON Schema of an answer of the work's contract
	// version, the very one an amended answer is checked against: the
	// review screen builds its amend form from it. Fixed names the fields
	// the cell fills in from the work (its correlation), which the form
	// leaves out.
	Schema json.RawMessage `json:"schema,omitempty"`
	Fixed  []string        `json:"fixed"`
	// Judged is the answer judged, as the gate reads it when it passes:
	// what the amend form starts from.
	Judged json.RawMessage `json:"judged,omitempty"`
}

// CaseFinding is one finding of the answer judged, as the model gave it,
// and where it falls on the diff: "line" (a changed hunk's line),
// "outside_hunk" or "not_in_diff".
type CaseFinding struct {
	Index   int             `json:"index"`
	Finding json.RawMessage `json:"finding"`
	File    string          `json:"file,omitempty"`
	Line    int             `json:"line,omitempty"`
	Placed  string          `json:"placed"`
}

// CaseFile is one file of the diff.
type CaseFile struct {
	Path  string     `json:"path"`
	Hunks []CaseHunk `json:"hunks"`
}

// CaseHunk is one hunk: its header and lines.
type CaseHunk struct {
	Header string     `json:"header"`
	Lines  []CaseLine `json:"lines"`
}

// CaseLine is one line of a hunk: kind "+", "-" or " ", its number in the
// new file (0 for a removed line) and its text.
type CaseLine struct {
	Kind string `json:"kind"`
	New  int    `json:"new,omitempty"`
	Text string `json:"text"`
}

// CaseAttempt is one attempt's outcome and reason (the gate's, for an
// answer it refused).
type CaseAttempt struct {
	Number  int    `json:"number"`
	Outcome string `json:"outcome"`
	Reason  string `json:"reason,omitempty"`
}

// DeskResolveRequest is the body of POST /v1/console/reviews/{id}/resolve.
type DeskResolveRequest struct {
	// Verdict is approved (the answer judged stands and is published),
	// amended (Findings replace its findings, and that is published),
	// rejected or dismissed (nothing is published).
	Verdict string `json:"verdict"`
	Note    string `json:"note,omitempty"`
	// Findings are the person's findings, with amended only: each as the
	// contract's schema has it. They pass the contract's gate, or the
	// resolution is refused.
	Findings []json.RawMessage `json:"findings,omitempty"`
	// Answer, with amended only, is the person's whole answer: the fields
	// of the work's contract version (its correlation, the case's Fixed,
	// is filled in from the work). It passes that version's schema and
	// gate, or the resolution is refused naming the field to fix.
	Answer json.RawMessage `json:"answer,omitempty"`
}

// reviewer authenticates a person on the review screen: an operator
// token of either role, who acts as that token's name and role via the
// console. A tenant's token reads its tenant's queue but names nobody, so
// it neither claims nor resolves from the console.
func (s *Room) reviewer(w http.ResponseWriter, r *http.Request) (store.Actor, bool) {
	v, ok := s.Viewer(w, r)
	if !ok {
		return store.Actor{}, false
	}
	if v.Operator == nil {
		apierror.Write(w, http.StatusForbidden, "forbidden",
			"a review item is held and resolved by a person: sign in with an operator token (role reviewer or operator); a tenant's token resolves through POST /v1/reviews/{id}/resolve")
		return store.Actor{}, false
	}
	return door.ConsoleActor(v.Operator), true
}

// consoleReviews serves GET /v1/console/reviews: the review queue of the
// token's tenant, or, for an operator, of the cell (tenant= narrows it).
func (s *Room) consoleReviews(w http.ResponseWriter, r *http.Request) {
	v, ok := s.Viewer(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	f, ok := s.reviewFilter(w, q)
	if !ok {
		return
	}
	f.Tenant = q.Get("tenant")
	if v.Operator == nil {
		if f.Tenant != "" && f.Tenant != v.Tenant.ID {
			apierror.Write(w, http.StatusForbidden, "forbidden", "a tenant's token reads its own review queue only")
			return
		}
		f.Tenant = v.Tenant.ID
	}
	s.writeReviews(w, r, f)
}

// consoleReview serves GET /v1/console/reviews/{id}: the item's case and
// who holds it, if anyone. Reading an item never claims it.
func (s *Room) consoleReview(w http.ResponseWriter, r *http.Request) {
	v, ok := s.Viewer(w, r)
	if !ok {
		return
	}
	workID, ok := s.reviewPath(w, r)
	if !ok {
		return
	}
	rv, err := s.D.Store.GetReview(r.Context(), door.Scope(v), workID)
	s.writeCase(w, r, rv, err)
}

// consoleClaim serves POST /v1/console/reviews/{id}/claim, the review
// screen's Claim button: the person holds the open item for ReviewHold and
// gets its case; the claim is recorded with the work's actions. Another
// person's hold is 409 claimed, naming them.
func (s *Room) consoleClaim(w http.ResponseWriter, r *http.Request) {
	by, ok := s.reviewer(w, r)
	if !ok {
		return
	}
	workID, ok := s.reviewPath(w, r)
	if !ok {
		return
	}
	rv, err := s.D.Store.ClaimReview(r.Context(), "", workID, by, ReviewHold)
	if errors.Is(err, store.ErrClaimed) || errors.Is(err, store.ErrResolved) {
		reviewConflict(w, rv, err)
		return
	}
	if err == nil {
		s.D.Log.Info("console: review item held", "key", workID, "by", by.String())
	}
	s.writeCase(w, r, rv, err)
}

// reviewPath reads the path's review id into its work's id, or writes the
// 404.
func (s *Room) reviewPath(w http.ResponseWriter, r *http.Request) (string, bool) {
	workID, ok := parseReviewID(r.PathValue("id"))
	if !ok {
		apierror.Write(w, http.StatusNotFound, "not_found", "no review item with that id for this token")
	}
	return workID, ok
}

// writeCase answers with rv's case, or with why there is none.
func (s *Room) writeCase(w http.ResponseWriter, r *http.Request, rv *store.Review, err error) {
	if errors.Is(err, store.ErrNotFound) {
		apierror.Write(w, http.StatusNotFound, "not_found", "no review item with that id for this token")
		return
	}
	var c *ReviewCase
	if err == nil {
		c, err = s.readCase(r.Context(), rv)
	}
	if err != nil {
		s.D.Log.Error("console: read a review item failed", "review", r.PathValue("id"), "err", err)
		auth.Unavailable().Write(w)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	apierror.JSON(w, http.StatusOK, c)
}

// readCase reads what a person judges rv by.
func (s *Room) readCase(ctx context.Context, rv *store.Review) (*ReviewCase, error) {
	j, err := s.judge(ctx, rv.WorkID)
	if err != nil {
		return nil, err
	}
	wk := j.work
	c := &ReviewCase{Review: story.ReviewView(rv, time.Now()), Work: story.WorkRowOf(wk), Answer: j.name, Findings: []CaseFinding{},
		Attempts: make([]CaseAttempt, 0, len(j.kept)), Output: rv.Output, Fixed: []string{}}
	if j.contract != nil {
		c.Schema, c.Fixed = j.contract.Schema, CorrelationFields(j.contract)
	}
	for _, a := range j.kept {
		c.Attempts = append(c.Attempts, CaseAttempt{Number: a.Number, Outcome: a.Outcome, Reason: a.Reason})
	}
	grounded := j.contract != nil && j.contract.Grounding == contract.GroundingDiff
	d := inputDiff(wk)
	switch {
	case !grounded:
		c.Input = json.RawMessage(wk.Input)
	case d != nil:
		c.Files = caseFiles(d)
	}
	if j.answer != nil {
		read := j.answer
		if acc, fail := gate.Check(j.contract, j.answer, expect(j.contract, wk)); fail != nil {
			c.Gate = fail.Error()
		} else {
			// The findings as the gate reads them, and as they would be
			// published: a line written 2.0 is placed on line 2.
			read = acc.Output
		}
		c.Findings, c.Judged = placeFindings(read, d), read
	}
	return c, nil
}

// judgement is what a person judges a review item by: its work and
// contract, the kept attempts, and the answer judged — the accepted
// result's, or the last kept answer that is a JSON object (nil when there
// is none) — with its name ("result", "attempt N").
type judgement struct {
	work     *store.Work
	contract *contract.Contract
	kept     []store.AttemptAnswer
	answer   []byte
	name     string
}

// judge reads the judgement of work workID.
func (s *Room) judge(ctx context.Context, workID string) (*judgement, error) {
	wk, err := s.D.Store.GetWork(ctx, workID)
	if err != nil {
		return nil, err
	}
	kept, err := s.D.Store.AttemptAnswers(ctx, workID)
	if err != nil {
		return nil, err
	}
	j := &judgement{work: wk, kept: kept}
	j.contract, _ = s.D.Contracts.Of(wk.Contract, wk.SchemaVersion)
	if wk.State == outcome.Accepted {
		res, err := s.D.Store.GetResult(ctx, wk.ID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
		if err == nil {
			j.answer, j.name = res.Output, "result"
			return j, nil
		}
	}
	for i := len(kept) - 1; i >= 0; i-- {
		var obj map[string]json.RawMessage
		if raw := bytes.TrimSpace(kept[i].Raw); len(raw) > 0 && json.Unmarshal(raw, &obj) == nil {
			j.answer, j.name = raw, "attempt "+strconv.Itoa(kept[i].Number)
			return j, nil
		}
	}
	return j, nil
}

// expect is what an answer to wk must match now, as the committer gates it.
func expect(ct *contract.Contract, wk *store.Work) gate.Expect {
	return gate.ExpectFor(ct, gate.Seen{WorkID: wk.ID, SchemaVersion: wk.SchemaVersion, TaxonomyVersion: wk.TaxonomyVersion,
		Digest: wk.Digest}, wk.Digest, []byte(wk.Input))
}

// inputDiff is the work's input's diff, nil when it has none that parses.
func inputDiff(wk *store.Work) *diff.Diff {
	var in struct {
		Diff string `json:"diff"`
	}
	if json.Unmarshal([]byte(wk.Input), &in) != nil || in.Diff == "" {
		return nil
	}
	d, err := diff.Parse(in.Diff)
	if err != nil {
		return nil
	}
	return d
}

func caseFiles(d *diff.Diff) []CaseFile {
	files := make([]CaseFile, 0, len(d.Files))
	for _, f := range d.Files {
		cf := CaseFile{Path: f.Path, Hunks: make([]CaseHunk, 0, len(f.Hunks))}
		for _, h := range f.Hunks {
			ch := CaseHunk{Header: "@@ -" + strconv.Itoa(h.OldStart) + "," + strconv.Itoa(h.OldLines) + " +" +
				strconv.Itoa(h.NewStart) + "," + strconv.Itoa(h.NewLines) + " @@ " + h.Section, Lines: make([]CaseLine, 0, len(h.Lines))}
			for _, l := range h.Lines {
				ch.Lines = append(ch.Lines, CaseLine{Kind: string(l.Kind), New: l.NewLine, Text: l.Text})
			}
			cf.Hunks = append(cf.Hunks, ch)
		}
		files = append(files, cf)
	}
	return files
}

// placeFindings reads the answer's findings and says where each falls on
// the diff d (nil: none is placed).
func placeFindings(answer []byte, d *diff.Diff) []CaseFinding {
	var doc struct {
		Findings []json.RawMessage `json:"findings"`
	}
	out := []CaseFinding{}
	if json.Unmarshal(answer, &doc) != nil {
		return out
	}
	for i, raw := range doc.Findings {
		var at struct {
			File string          `json:"file"`
			Line json.RawMessage `json:"line"`
		}
		_ = json.Unmarshal(raw, &at)
		cf := CaseFinding{Index: i, Finding: raw, File: at.File, Placed: "not_in_diff"}
		if n, err := strconv.Atoi(string(at.Line)); err == nil {
			cf.Line = n
		}
		if d != nil {
			if f := d.File(at.File); f != nil {
				cf.Placed = "outside_hunk"
				if f.InHunk(cf.Line) {
					cf.Placed = "line"
				}
			}
		}
		out = append(out, cf)
	}
	return out
}

// consoleResolve serves POST /v1/console/reviews/{id}/resolve: the person
// resolves the item unless another person holds it. Approved and amended
// publish the answer as the work's reviewed outcome, once, in the
// resolution's own transaction; the answer must pass the contract's gate.
func (s *Room) consoleResolve(w http.ResponseWriter, r *http.Request) {
	by, ok := s.reviewer(w, r)
	if !ok {
		return
	}
	workID, ok := s.reviewPath(w, r)
	if !ok {
		return
	}
	var req DeskResolveRequest
	if refused, _ := request.DecodeBody(w, r, 256<<10, &req); refused != nil {
		refused.Write(w)
		return
	}
	switch {
	case !slices.Contains(store.Verdicts, req.Verdict):
		apierror.Write(w, http.StatusBadRequest, "invalid_verdict", "verdict must be one of approved, amended, rejected, dismissed")
		return
	case len(req.Note) > 4000:
		apierror.Write(w, http.StatusBadRequest, "invalid_note", "note is at most 4000 bytes")
		return
	case (req.Findings != nil || req.Answer != nil) && req.Verdict != store.VerdictAmended:
		apierror.Write(w, http.StatusBadRequest, "invalid_findings", "findings and answer are given with the verdict amended only")
		return
	}
	ctx := r.Context()
	res := store.Resolution{By: by, Verdict: req.Verdict, Note: req.Note, Holder: by.ID}
	if req.Verdict == store.VerdictApproved || req.Verdict == store.VerdictAmended {
		output, refusal, err := s.deskOutput(ctx, workID, req)
		if errors.Is(err, store.ErrNotFound) {
			apierror.Write(w, http.StatusNotFound, "not_found", "no review item with that id for this token")
			return
		}
		if err != nil {
			s.D.Log.Error("console: read a review item failed", "key", workID, "err", err)
			auth.Unavailable().Write(w)
			return
		}
		if refusal != "" {
			apierror.Write(w, http.StatusBadRequest, "invalid_findings", refusal)
			return
		}
		res.Output, res.Announce = output, s.announceReviewed(ctx)
	}
	rv, err := s.D.Store.ResolveReview(ctx, "", workID, res)
	switch {
	case errors.Is(err, store.ErrNotFound):
		apierror.Write(w, http.StatusNotFound, "not_found", "no review item with that id for this token")
		return
	case errors.Is(err, store.ErrResolved), errors.Is(err, store.ErrClaimed):
		reviewConflict(w, rv, err)
		return
	case err != nil:
		s.D.Log.Error("console: resolve review failed", "key", workID, "err", err)
		auth.Unavailable().Write(w)
		return
	}
	telemetry.Decision(ctx, s.D.Log, rv.WorkID, "review_resolved", story.Resolution(rv),
		slog.String("tenant", rv.TenantID), slog.String("review", story.ReviewID(rv)), slog.String("by", by.ID),
		slog.Bool("published", rv.Output != nil))
	apierror.JSON(w, http.StatusOK, story.ReviewView(rv, time.Now()))
}

// deskOutput is the answer an approved or amended resolution publishes:
// the answer judged, with the person's fields for amended. refusal, when
// set, says why it cannot be published (it fails the gate of the work's
// contract version, naming the field to fix, or there is no answer to
// approve).
func (s *Room) deskOutput(ctx context.Context, workID string, req DeskResolveRequest) (json.RawMessage, string, error) {
	j, err := s.judge(ctx, workID)
	if err != nil {
		return nil, "", err
	}
	wk, ct, answer := j.work, j.contract, j.answer
	switch {
	case ct == nil:
		return nil, "the work's contract version " + wk.SchemaVersion + " is not one this cell knows: reject or dismiss it", nil
	case req.Verdict == store.VerdictApproved && answer == nil:
		return nil, "there is no answer to approve: amend it with an answer of " + ct.SchemaVersion + ", or reject or dismiss it", nil
	case req.Verdict == store.VerdictAmended:
		var refusal string
		if answer, refusal = amendedAnswer(ct, wk, answer, req); refusal != "" {
			return nil, refusal, nil
		}
	}
	acc, fail := gate.Check(ct, answer, expect(ct, wk))
	if fail != nil {
		return nil, gateRefusal(ct, answer, fail, req.Verdict), nil
	}
	// What is stored and published is the gate's canonical JSON, as a
	// result the committer stores is: a line a person wrote 3.0 is 3.
	return acc.Output, "", nil
}

// amendedAnswer is the person's answer under the work's correlation: their
// whole answer when they gave one, else the answer judged (nil: none) with
// their findings; refusal says why the request's answer cannot be read.
func amendedAnswer(ct *contract.Contract, wk *store.Work, judged []byte, req DeskResolveRequest) ([]byte, string) {
	doc := map[string]json.RawMessage{}
	if req.Answer != nil {
		if json.Unmarshal(req.Answer, &doc) != nil || doc == nil {
			return nil, "answer must be a JSON object of " + ct.SchemaVersion + "'s fields"
		}
	} else if judged != nil {
		_ = json.Unmarshal(judged, &doc)
	}
	switch _, has := doc["findings"]; {
	case req.Findings != nil:
		doc["findings"], _ = json.Marshal(req.Findings)
	case req.Answer == nil && (has || ct.MaxFindings > 0):
		doc["findings"] = json.RawMessage("[]")
	}
	if f := ct.Correlation.WorkID; f != "" {
		doc[f], _ = json.Marshal(wk.ID)
	}
	if f := ct.Correlation.SchemaVersion; f != "" {
		doc[f] = ct.WireSchemaVersion
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, "answer: " + err.Error()
	}
	return out, ""
}

// CorrelationFields are the fields of ct's answers the cell fills in from
// the work: its id and the contract version's schema version.
func CorrelationFields(ct *contract.Contract) []string {
	out := []string{}
	for _, f := range []string{ct.Correlation.WorkID, ct.Correlation.SchemaVersion} {
		if f != "" {
			out = append(out, f)
		}
	}
	return out
}

// gateRefusal says why an answer fails ct's gate, and which field to fix.
func gateRefusal(ct *contract.Contract, answer []byte, fail *gate.Failure, verdict string) string {
	msg := "the answer fails the gate of " + ct.SchemaVersion + " (" + fail.Error() + ")"
	if f := fieldToFix(ct, answer, fail); f != "" {
		msg += "; fix " + f
	}
	if verdict == store.VerdictApproved {
		return msg + "; amend it, or reject or dismiss it"
	}
	return msg + "; or reject or dismiss it"
}

// requiredName reads the first property a "required" violation names:
// a name of the schema's, never the answer's text.
var requiredName = regexp.MustCompile(`'([A-Za-z_][A-Za-z0-9_]*)'`)

// fieldPath is a field as the gate's details begin with one:
// findings[0].line, category.
var fieldPath = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\[[0-9]+\])*(\.[A-Za-z_][A-Za-z0-9_]*(\[[0-9]+\])*)*`)

// fieldToFix names the field of answer that fail is about: a schema
// violation's field (for a missing property, the property), or the field
// a grounding, policy or correlation detail starts with; "" when it names
// none of the contract's fields.
func fieldToFix(ct *contract.Contract, answer []byte, fail *gate.Failure) string {
	if fail.Stage == gate.StageSchema {
		var ve *contract.ValidationError
		if !errors.As(ct.ValidateOutput(answer), &ve) || len(ve.Violations) == 0 {
			return ""
		}
		v := ve.Violations[0]
		at := strings.TrimPrefix(strings.TrimPrefix(v.Field, "output"), ".")
		if m := requiredName.FindStringSubmatch(v.Message); v.Keyword == "required" && m != nil {
			at = strings.TrimPrefix(at+"."+m[1], ".")
		}
		return cmp.Or(at, "the answer")
	}
	at := fieldPath.FindString(fail.Detail)
	var schema struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	_ = json.Unmarshal(ct.Schema, &schema)
	if top, _, _ := strings.Cut(strings.SplitN(at, "[", 2)[0], "."); schema.Properties[top] == nil {
		return ""
	}
	return at
}

// announceReviewed gives the OUTCOME event that publishes a reviewed
// item's answer; its id is the work's and "reviewed", so it is one.
func (s *Room) announceReviewed(ctx context.Context) func(*store.Review) ([]store.OutboxMsg, error) {
	return func(rv *store.Review) ([]store.OutboxMsg, error) {
		id := event.OutcomeMsgID(rv.WorkID, outcome.Reviewed)
		m, err := outbox.Msg(ctx, event.KindOutcome, s.Cfg.Names.Outcome(rv.TenantID), id, event.Outcome{OutcomeID: id,
			WorkID: rv.WorkID, TenantID: rv.TenantID, Region: s.Cfg.Region, Outcome: outcome.Reviewed, At: time.Now().UTC()})
		if err != nil {
			return nil, err
		}
		return []store.OutboxMsg{m}, nil
	}
}

// consoleReviewPage serves the review screen: the queue, and the item
// named by ?item= with its diff and findings.
func (s *Room) consoleReviewPage(w http.ResponseWriter, r *http.Request) {
	page.Review.Serve(w, r)
}
