package classifier

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"assay.dev/pkg/admission"
	"assay.dev/pkg/consumer"
	"assay.dev/pkg/contract"
	"assay.dev/pkg/diff"
	"assay.dev/pkg/event"
	"assay.dev/pkg/gate"
	"assay.dev/pkg/model"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

// A code review whose diff is over its contract's part size is reviewed in
// parts (diff.Split: whole files where they fit, riskiest first, lock
// files skipped) under the one lease of its claimed attempt. The parts are
// called in their order, up to PartConcurrency at once (partsrun.go): the
// first call runs on the lease's permit, each other takes its tenant's
// turn in the lane and a permit of the cell's limiter, so a large pull
// request waits its turn like any other tenant's work. Each part is a call
// of its own — recorded before it is made and after, with its reservation,
// raw answer and ATTEMPT event — and its answer passes the gate against
// the part's own diff; a part whose answer fails is asked again with what
// failed (MaxRepairs times, once by default), and a failure after that
// ends the work schema_rejected naming the part. The parts' findings are
// merged (merge.go: findings of two parts that point at one issue are kept
// once, and the contract's cap on findings keeps the most severe) into one
// answer, which the committer gates against the whole diff and commits as
// the one result. The work's cost cap counts each part at its calibrated
// estimate (calibrate.go) and each call made at what it was billed; when
// the cap, its tenant's budget or its deadline stops the review before
// every part is reviewed, what was reviewed is the result, a partial
// review whose coverage names what was not and what it would cost. A call
// that brings no answer ends the lease as a whole attempt's would (a
// retry, a raised cap, an outage); the parts reviewed so far are not paid
// for again, as the next lease reuses their answers.

// partsPlan is a work item cut into parts.
type partsPlan struct {
	plan *diff.Plan
	// input is the work's input with its diff left out: each part's input
	// is this with the part's diff.
	input map[string]json.RawMessage
}

// partsOf is the plan for reviewing w in parts, nil when w is reviewed
// whole: its contract is not cut into parts, or its diff fits one call, or
// its input cannot be read (the gate names what is wrong with it).
func (s *Service) partsOf(c *contract.Contract, w *store.Work) *partsPlan {
	units := s.partUnits(c)
	// A diff is never longer than the JSON that quotes it: an input that
	// fits a part is not read (most of them, on every claim).
	if units <= 0 || diff.Units(w.Input, c.Parts.BytesPerUnit) <= units {
		return nil
	}
	var in map[string]json.RawMessage
	var text string
	if json.Unmarshal([]byte(w.Input), &in) != nil || json.Unmarshal(in["diff"], &text) != nil {
		return nil
	}
	if diff.Units(text, c.Parts.BytesPerUnit) <= units {
		return nil
	}
	d, err := diff.Parse(text)
	if err != nil {
		return nil
	}
	plan, err := diff.Split(d, units, c.Parts.BytesPerUnit)
	if err != nil || len(plan.Parts) == 0 {
		return nil
	}
	return &partsPlan{plan: plan, input: in}
}

// claimedInput is the input size a claim reserves for: the whole input,
// or, for an input larger than one part of its contract, a part's (twice
// its bytes, for what quoting the diff as JSON adds, and room for the rest
// of the input). A review in parts releases the claim's reservation and
// reserves for each part's call as it makes it, so a tenant whose budget
// covers a part is not refused a review of a diff larger than its budget.
func (s *Service) claimedInput(c *contract.Contract, inputLen int) int {
	units := s.partUnits(c)
	if units <= 0 {
		return inputLen
	}
	part := 2*int(float64(units)*c.Parts.BytesPerUnit) + 4096
	return min(inputLen, part)
}

// partUnits is the part size of c's diffs in model units: the cell's
// setting, else the contract's; 0 for a contract never cut into parts.
func (s *Service) partUnits(c *contract.Contract) int {
	if c.Parts.Units <= 0 {
		return 0
	}
	return cmp.Or(s.cfg.PartUnits, c.Parts.Units)
}

// work is w as one part's call sees it: the part's diff as its input.
func (pp *partsPlan) work(w *store.Work, p *diff.Part) store.Work {
	in := make(map[string]json.RawMessage, len(pp.input))
	for k, v := range pp.input {
		in[k] = v
	}
	in["diff"], _ = json.Marshal(p.Text)
	raw, _ := json.Marshal(in)
	pw := *w
	pw.Input, pw.Repairs, pw.RepairNote = string(raw), 0, ""
	return pw
}

// partsRun is one lease reviewing its work in parts.
type partsRun struct {
	w         *store.Work
	c         *contract.Contract
	attemptID string
	token     string
	budgeted  bool
	pp        *partsPlan
	progress  func()

	// limit is the work's cost cap (0: none); published the parts a review
	// it continues published, which it neither reviews nor merges.
	limit     int64
	published []string
	cal       *calibration
	cov       diff.Coverage
	findings  [][]any // each reviewed part's findings, in plan order
	doc       map[string]any

	mu      sync.Mutex
	wake    chan struct{} // a part's calls ended
	probe   bool          // the next call is the circuit's probe
	calls   int           // calls started
	running int           // parts whose calls run
	calling int           // calls started and not ended
	// spent is what the calls that ended were billed, and the answers
	// reused from earlier leases at their calibrated estimates; pending
	// the calibrated estimates of the calls running.
	spent, pending int64
	answers        []*gate.Accepted // by part, the gate's accepted answers
	// What ended the calls early: a call without an answer (err, reply),
	// a part that failed the gate twice (failed, naming it), a lease gone
	// (lost), or a reason the parts left were not reviewed (stop).
	reply   *model.Reply
	err     error
	outage  bool
	failed  *gate.Failure
	lost    bool
	stop    string
	stopEnd string // the work's outcome when nothing was reviewed
}

// reviewInParts runs the lease's calls and records the claimed attempt
// with what they came to.
func (s *Service) reviewInParts(ctx context.Context, r *partsRun, permit *servedPermit) consumer.Disposition {
	w := r.w
	claimedAt := time.Now()
	if r.budgeted {
		// The claim reserved for the whole diff in one call; each part's
		// call reserves its own.
		if err := s.d.Store.Release(context.WithoutCancel(ctx), r.attemptID); err != nil {
			s.d.Log.Warn("releasing a reservation failed", "key", w.ID, "attempt", r.attemptID, "err", err)
		}
	}
	r.cov = diff.Coverage{Parts: len(r.pp.plan.Parts), Skipped: r.pp.plan.Skipped, Reviewed: []string{}, Files: []string{}}
	r.answers, r.wake = make([]*gate.Accepted, len(r.pp.plan.Parts)), make(chan struct{}, 1)
	facts, err := s.d.Store.PartsFacts(ctx, w.ID)
	if err != nil {
		// Without its cap or what was published before, the work is not
		// reviewed on this lease.
		r.err = err
	}
	r.limit, r.published, r.cov.Of = s.costCap(r.c, facts), facts.Published, facts.RestOf
	earlier, err := s.d.Store.PartAnswers(ctx, w.ID)
	if err != nil {
		s.d.Log.Warn("reading earlier parts' answers failed; the parts are asked again", "key", w.ID, "err", err)
	}
	reused := map[string][]byte{}
	for _, a := range earlier {
		reused[a.Part] = a.Raw
	}
	r.cal = s.calibrationOf(ctx, r.c.Name, s.modelOf(w))
	if r.err == nil {
		s.runParts(ctx, r, reused)
	}
	for i, acc := range r.answers {
		if acc != nil {
			r.accept(&r.pp.plan.Parts[i], acc)
		}
	}
	sig := admission.Signal{Kind: admission.Ignore}
	if r.err != nil {
		sig = signal(r.reply, r.err)
	}
	permit.Release(sig)
	ctx = context.WithoutCancel(ctx)
	return s.settleParts(ctx, r, claimedAt)
}

// costCap is the most a work item's calls may cost — each call counted at
// what it was billed once it ends, and at its calibrated estimate until
// then: the work's own cap (a continuation's), else its tenant's, else the
// cell's setting, else its contract's; 0 for none.
func (s *Service) costCap(c *contract.Contract, f store.PartsFacts) int64 {
	return cmp.Or(f.CostCap, f.TenantCostCap, s.cfg.WorkCostCap, c.CostCapMicros)
}

// partBudgetWait is how long a part's call waits for its tenant's budget
// held by calls in flight, from the last of this work's own calls to end.
const partBudgetWait = 5 * time.Second

// startPart reserves the call's cost when its tenant has a budget and
// records the call before it is made, counting it among the calls running
// at its calibrated estimate proj; call is its place among the lease's
// calls. ok=false: the budget or the lease stops the review.
func (s *Service) startPart(ctx context.Context, r *partsRun, p *diff.Part, id string, est, proj int64) (call int, ok bool) {
	w := r.w
	if r.budgeted && !s.reservePart(ctx, r, id, est) {
		return 0, false
	}
	r.mu.Lock()
	r.calls++
	call = r.calls
	r.calling++
	r.pending += proj
	r.mu.Unlock()
	ok, err := s.d.Store.StartPart(ctx, store.PartCall{ID: id, WorkID: w.ID, Token: r.token, Part: p.ID, Call: call,
		Estimate: est, TTL: s.cfg.LeaseTTL})
	if err == nil && ok {
		return call, true
	}
	r.mu.Lock()
	r.calling--
	r.pending -= proj
	r.mu.Unlock()
	if r.budgeted {
		if rerr := s.d.Store.Release(context.WithoutCancel(ctx), id); rerr != nil {
			s.d.Log.Warn("releasing a reservation failed", "key", w.ID, "attempt", id, "err", rerr)
		}
	}
	if err != nil {
		r.halt(func() { r.err = err })
	} else {
		r.halt(func() { r.lost = true })
	}
	return 0, false
}

// reservePart reserves a call's estimate of its tenant's budget. The
// budget held by this work's own calls, reserved at their estimates, is
// freed as the ledger settles them at their cost: moments after they end,
// so while any runs, and partBudgetWait after the last, a call the budget
// would cover once they settle waits for it. false: the budget stops the
// review (or the database did not answer).
func (s *Service) reservePart(ctx context.Context, r *partsRun, id string, est int64) bool {
	w := r.w
	res, err := s.d.Store.Reserve(ctx, w.TenantID, id, est)
	for until := time.Now().Add(partBudgetWait); err == nil && res == store.Busy; {
		if r.callsRunning() > 0 {
			until = time.Now().Add(partBudgetWait)
		}
		if time.Now().After(until) {
			break
		}
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-time.After(100 * time.Millisecond):
			res, err = s.d.Store.Reserve(ctx, w.TenantID, id, est)
		}
	}
	switch {
	case err != nil:
		r.halt(func() { r.err = fmt.Errorf("budget reservation: %w", err) })
		return false
	case res != store.Reserved:
		r.halt(func() {
			r.stop, r.stopEnd = fmt.Sprintf("tenant %s's budget cannot cover the next part, estimated at %d micro-dollars",
				w.TenantID, est), outcome.BudgetExhausted
		})
		return false
	}
	return true
}

// recordPart records how one call ended, with its ATTEMPT event, sent again
// while it fails before reaching the database (the call is paid for), as
// an attempt's record is. It returns the event: what the ledger charges.
func (s *Service) recordPart(ctx context.Context, r *partsRun, pw *store.Work, id string, p *diff.Part, call int,
	reply *model.Reply, callErr error, out string, hasOutput bool, fail *gate.Failure) event.Attempt {
	ctx = context.WithoutCancel(ctx)
	oc, reason := outcome.AttemptOK, ""
	switch {
	case hasOutput && fail != nil:
		oc, reason = outcome.AttemptInvalidOutput, fail.Error()
	case !hasOutput:
		v := judge(answer{stillMine: true, err: callErr, now: time.Now(), deadline: r.w.DeadlineAt}, s.limits())
		oc, reason = v.outcome, v.reason
	}
	raw := []byte(out)
	if !hasOutput && reply != nil {
		raw = reply.Raw
	}
	att := s.attemptEvent(r.c, pw, id, oc, reply, callErr)
	msg, err := s.attemptMsg(ctx, pw, att)
	for i := 0; err == nil; i++ {
		if err = s.d.Store.RecordPart(ctx, store.PartRecord{ID: id, Outcome: oc, Reason: reason, Raw: raw,
			Outbox: []store.OutboxMsg{msg}}); err == nil || !store.Unsent(err) || i == len(recordBackoff) {
			break
		}
		time.Sleep(recordBackoff[i])
	}
	if err != nil {
		// The row stays without an outcome: the ledger's reaper charges the
		// call its reservation once the lease is gone.
		s.d.Log.Error("recording a part's call failed", "key", r.w.ID, "attempt", id, "part", p.ID, "err", err)
	}
	telemetry.Decision(ctx, s.d.Log, r.w.ID, "part_"+oc, cmp.Or(reason, "model answered"),
		slog.String("attempt", id), slog.String("part", p.ID), slog.Int("call", call))
	return att
}

// accept keeps a part's accepted answer.
func (r *partsRun) accept(p *diff.Part, acc *gate.Accepted) {
	var doc map[string]any
	dec := json.NewDecoder(bytes.NewReader(acc.Output))
	dec.UseNumber()
	if dec.Decode(&doc) != nil {
		return // the gate re-encoded it; unreachable
	}
	fs, _ := doc["findings"].([]any)
	r.findings = append(r.findings, fs)
	if r.doc == nil {
		r.doc = doc
	}
	r.cov.Reviewed = append(r.cov.Reviewed, p.ID)
	for _, f := range p.Files {
		if !slices.Contains(r.cov.Files, f) {
			r.cov.Files = append(r.cov.Files, f)
		}
	}
}

// merged is the parts' answers as one: the first part's document with
// every part's findings, those that point at one issue merged
// (mergeFindings), and no more than the contract allows, the most severe
// kept.
func (r *partsRun) merged() ([]byte, error) {
	all, folded := mergeFindings(r.findings)
	r.cov.Folded = folded
	if limit := r.c.MaxFindings; limit > 0 && len(all) > limit {
		slices.SortStableFunc(all, func(a, b any) int { return severity(b) - severity(a) })
		r.cov.Dropped = len(all) - limit
		all = all[:limit]
	}
	if all == nil {
		all = []any{}
	}
	doc := make(map[string]any, len(r.doc))
	for k, v := range r.doc {
		doc[k] = v
	}
	doc["findings"] = all
	return json.Marshal(doc)
}

// severity orders findings for the cap: blocking, then warning, then the
// rest.
func severity(f any) int {
	m, _ := f.(map[string]any)
	switch m["severity"] {
	case "blocking":
		return 2
	case "warning":
		return 1
	}
	return 0
}

// settleParts records the claimed attempt with what its parts came to.
func (s *Service) settleParts(ctx context.Context, r *partsRun, claimedAt time.Time) consumer.Disposition {
	w, c := r.w, r.c
	a := answer{stillMine: !r.lost, attempts: counted(w, r.outage), repairs: w.Repairs, now: time.Now(),
		deadline: w.DeadlineAt, backoff: s.backoff(w.Attempts), retryRefusals: c.OnRefusal == contract.RefusalRetry,
		outputCap: s.outputCap(w), outage: r.outage}
	if r.outage {
		a.condition = s.circuitOf(w).condition()
	}
	if w.OutputCap == 0 {
		a.raisedCap = 2 * s.cfg.MaxOutputUnits
	}
	r.cov.Partial = len(r.cov.Reviewed)+len(r.cov.Earlier) < r.cov.Parts
	r.cov.Why = r.stop
	for i := range r.pp.plan.Parts {
		p := &r.pp.plan.Parts[i]
		if slices.Contains(r.cov.Reviewed, p.ID) || slices.Contains(r.cov.Earlier, p.ID) {
			continue
		}
		pw := r.pp.work(w, p)
		r.cov.LeftCost += r.cal.project(s.estimate(c, &pw, len(pw.Input)))
		for _, f := range p.Files {
			if !slices.Contains(r.cov.Left, f) {
				r.cov.Left = append(r.cov.Left, f)
			}
		}
	}
	switch {
	case r.lost:
	case r.failed != nil:
		// No whole repair: the part was asked again already.
		a.hasOutput, a.fail, a.repairs = true, r.failed, s.cfg.MaxRepairs
	case r.err != nil:
		// A call that brought no answer (output is false only with an
		// error), or a database that did not answer.
		a.err = r.err
	case len(r.cov.Reviewed) == 0:
		return s.endUnreviewed(ctx, r)
	default:
		merged, err := r.merged()
		if err != nil {
			return consumer.Retry(time.Second)
		}
		cov, _ := json.Marshal(r.cov)
		ok, err := s.d.Store.SetWholeAnswer(ctx, r.attemptID, r.token, merged, cov)
		if err != nil {
			s.d.Log.Warn("keeping the parts' answer failed", "key", w.ID, "err", err)
			return consumer.Retry(time.Second)
		}
		a.stillMine = ok
		a.hasOutput, a.output = true, string(merged)
		_, a.fail = gate.Check(c, merged, gate.ExpectFor(c, seen(w), w.Digest, []byte(w.Input)))
		if a.fail != nil {
			a.repairs = s.cfg.MaxRepairs
		}
	}
	v, ok := s.record(ctx, w, c, r.attemptID, r.token, a, nil, s.judge, noCall)
	if !ok {
		return consumer.Retry(time.Second)
	}
	failCode := ""
	if a.fail != nil {
		failCode = a.fail.Code
	}
	s.m.judged(ctx, w, c, claimedAt, nil, a.err, failCode, v)
	telemetry.Decision(ctx, s.d.Log, w.ID, v.outcome, cmp.Or(v.reason, "parts reviewed"),
		slog.String("attempt", r.attemptID), slog.String("next", v.next), slog.Int("parts", r.cov.Parts),
		slog.Int("reviewed", len(r.cov.Reviewed)), slog.Int("calls", r.calls), slog.String("stopped", r.stop))
	return v.disp
}

// endUnreviewed ends work of which not one part could be reviewed: its cost
// cap or budget cannot pay for the first part, or its deadline came first.
func (s *Service) endUnreviewed(ctx context.Context, r *partsRun) consumer.Disposition {
	return s.endClaimed(ctx, r.w, r.c, r.attemptID, r.token, r.stopEnd, "no part of the diff was reviewed: "+r.stop)
}

// endClaimed ends claimed work before any call: its claimed attempt ends
// canceled, the work with end and reason.
func (s *Service) endClaimed(ctx context.Context, w *store.Work, c *contract.Contract, attemptID, token, end, reason string) consumer.Disposition {
	decide := func(a answer) verdict {
		if !a.stillMine {
			return s.judge(a)
		}
		return verdict{outcome: outcome.AttemptCanceled, reason: reason, change: store.Finish, workOutcome: end,
			workReason: reason, final: true, disp: consumer.Done(), next: "ended"}
	}
	v, ok := s.record(ctx, w, c, attemptID, token, answer{stillMine: true}, nil, decide, noCall)
	if !ok {
		return consumer.Retry(time.Second)
	}
	telemetry.Decision(ctx, s.d.Log, w.ID, end, reason, slog.String("attempt", attemptID))
	return v.disp
}

// reserveWhole reserves for a whole call of work whose claim reserved for
// one part (claimedInput) and which is reviewed whole after all (its diff
// could not be cut): the claim's reservation is replaced by the whole
// call's, and work its tenant cannot pay for ends budget_exhausted before
// the call.
func (s *Service) reserveWhole(ctx context.Context, w *store.Work, c *contract.Contract, attemptID, token string) (consumer.Disposition, bool) {
	if err := s.d.Store.Release(ctx, attemptID); err != nil {
		return consumer.Retry(time.Second), false
	}
	est := s.estimate(c, w, len(w.Input))
	res, err := s.d.Store.Reserve(ctx, w.TenantID, attemptID, est)
	if err != nil {
		return consumer.Retry(time.Second), false
	}
	if res != store.Reserved {
		return s.endClaimed(ctx, w, c, attemptID, token, outcome.BudgetExhausted,
			fmt.Sprintf("tenant %s's budget cannot cover an attempt estimated at %d micro-dollars", w.TenantID, est)), false
	}
	return consumer.Disposition{}, true
}

// noCall is the ATTEMPT event of a claimed attempt that made no call of
// its own: none.
func noCall(string) *event.Attempt { return nil }
