package classifier

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"assay.dev/pkg/admission"
	"assay.dev/pkg/diff"
	"assay.dev/pkg/gate"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

// errLeaseLost cancels the calls of a review in parts whose lease went.
var errLeaseLost = errors.New("the lease of the review in parts is gone")

// runParts reviews the parts not published before, in plan order: an
// earlier lease's answer the gate still accepts is reused, and the others
// are called, up to PartConcurrency at once, each starting once its cost
// fits the cap beside what was spent and what runs. It returns when every
// call it started has ended.
func (s *Service) runParts(ctx context.Context, r *partsRun, reused map[string][]byte) {
	ctx, cancel, release := s.cancelable(ctx, r.w.ID)
	defer release()
	stopKeeping := s.keepLease(ctx, r, cancel)
	defer stopKeeping()
	// Once no part is left to start, the permits not in use go back at
	// once; the lease is kept until the last call ends.
	defer r.waitForCalls()
	sl := s.newPartSlots(ctx, r)
	defer sl.close()
	for i := range r.pp.plan.Parts {
		p := &r.pp.plan.Parts[i]
		if r.halted() {
			return
		}
		if slices.Contains(r.published, p.ID) {
			r.cov.Earlier = append(r.cov.Earlier, p.ID)
			continue
		}
		pw := r.pp.work(r.w, p)
		est := s.estimate(r.c, &pw, len(pw.Input))
		if s.reuse(r, i, &pw, est, reused[p.ID]) {
			continue
		}
		slot, proj, ok := s.waitForRoom(ctx, r, sl, p, est)
		if !ok || !s.launchPart(ctx, r, sl, slot, i, pw, est, proj) {
			return
		}
	}
}

// reuse takes an earlier lease's answer to part i when the gate still
// accepts it, counting it at its calibrated estimate.
func (s *Service) reuse(r *partsRun, i int, pw *store.Work, est int64, earlier []byte) bool {
	if earlier == nil {
		return false
	}
	acc, fail := gate.Check(r.c, earlier, gate.ExpectFor(r.c, seen(r.w), r.w.Digest, []byte(pw.Input)))
	if fail != nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.answers[i] = acc
	r.spent += r.cal.project(est)
	return true
}

// waitForRoom waits until part p, reserved at est, may be called: the
// cap, beside what was spent and what runs, takes its calibrated estimate
// proj, the deadline leaves time for it, and a slot is free. false: the
// review goes no further (why is on r).
func (s *Service) waitForRoom(ctx context.Context, r *partsRun, sl *partSlots, p *diff.Part, est int64) (slot partSlot, proj int64, ok bool) {
	for {
		if r.halted() {
			return partSlot{}, 0, false
		}
		// Calls that ended meanwhile calibrated it further.
		proj = r.cal.project(est)
		why, end, wait := s.room(r, p, proj)
		if why != "" {
			r.halt(func() { r.stop, r.stopEnd = why, end })
			return partSlot{}, 0, false
		}
		if !wait {
			if slot, ok := sl.take(); ok {
				return slot, proj, true
			}
		}
		select {
		case <-r.wake:
		case pm := <-sl.extra:
			sl.spare = append(sl.spare, pm)
		case <-ctx.Done():
			err := context.Cause(ctx)
			r.halt(func() { r.err = err })
			return partSlot{}, 0, false
		}
	}
}

// room says why part p, estimated at proj, cannot be called ("" when it
// can, or, wait, when it can once calls running end and say what they
// cost): the work's cost cap or its deadline; end is the work's outcome
// should nothing have been reviewed.
func (s *Service) room(r *partsRun, p *diff.Part, proj int64) (why, end string, wait bool) {
	r.mu.Lock()
	spent, pending := r.spent, r.pending
	r.mu.Unlock()
	if r.limit > 0 && spent+pending+proj > r.limit {
		if pending > 0 {
			return "", "", true
		}
		n, _ := r.cal.ratio()
		return fmt.Sprintf("the work's cost cap of %d micro-dollars would be crossed by part %s, estimated at %d "+
			"(%.1f%% of its reservation, as recent calls were billed), with %d spent",
			r.limit, p.ID, proj, 100*n, spent), outcome.BudgetExhausted, false
	}
	if left := time.Until(r.w.DeadlineAt); left < s.timeNeeded() {
		return "the work's deadline was near: " + shortOfTime(left, s.timeNeeded()), outcome.Expired, false
	}
	return "", "", false
}

// launchPart records part i's first call, reserved at est and counted at
// proj, and starts its calls on slot. false: the budget or the lease
// stopped the review.
func (s *Service) launchPart(ctx context.Context, r *partsRun, sl *partSlots, slot partSlot, i int, pw store.Work, est, proj int64) bool {
	p := &r.pp.plan.Parts[i]
	id := newUUID()
	call, ok := s.startPart(ctx, r, p, id, est, proj)
	if !ok {
		sl.put(slot, admission.Signal{Kind: admission.Ignore})
		return false
	}
	r.mu.Lock()
	r.running++
	r.mu.Unlock()
	go func() {
		sig := s.callPart(ctx, r, i, pw, est, proj, id, call)
		sl.put(slot, sig)
		r.mu.Lock()
		r.running--
		r.mu.Unlock()
		r.signal()
	}()
	return true
}

// callPart makes part i's calls: the first (id, its place call, counted
// at proj, recorded already), and once more when the answer fails the
// gate, up to MaxRepairs. It returns what the last call tells the limiter.
func (s *Service) callPart(ctx context.Context, r *partsRun, i int, pw store.Work, est, proj int64, id string, call int) admission.Signal {
	w, c, p := r.w, r.c, &r.pp.plan.Parts[i]
	exp := gate.ExpectFor(c, seen(w), w.Digest, []byte(pw.Input))
	for try := 0; ; try++ {
		if try > 0 {
			proj = r.cal.project(est)
			if !s.roomToRepair(ctx, r, p, proj) {
				return admission.Signal{Kind: admission.Ignore}
			}
			var ok bool
			id = newUUID()
			if call, ok = s.startPart(ctx, r, p, id, est, proj); !ok {
				return admission.Signal{Kind: admission.Ignore}
			}
		}
		deadlineBound := time.Until(w.DeadlineAt) < s.cfg.CallTimeout
		reply, callErr := s.call(ctx, &pw, c, id, r.token, r.progress)
		probe := r.takeProbe()
		outage := s.circuitOf(w).observe(ctx, reply, callErr, deadlineBound, probe)
		out, hasOutput := output(reply, callErr)
		var fail *gate.Failure
		var acc *gate.Accepted
		if hasOutput {
			acc, fail = gate.Check(c, []byte(out), exp)
		}
		att := s.recordPart(ctx, r, &pw, id, p, call, reply, callErr, out, hasOutput, fail)
		r.ended(est, proj, s.cfg.Prices.CostMicros(att.Model, att.InputUnits, att.OutputUnits), hasOutput && !att.Estimated, outage)
		sig := callSignal(reply, callErr, deadlineBound)
		switch {
		case hasOutput && fail == nil:
			r.mu.Lock()
			r.answers[i] = acc
			r.mu.Unlock()
			return sig
		case !hasOutput:
			r.halt(func() { r.reply, r.err = reply, callErr })
			return sig
		case try >= s.cfg.MaxRepairs || fail.Code == gate.CodeTaxonomyVersion || fail.Code == gate.CodeDigest:
			f := *fail
			f.Detail = fmt.Sprintf("part %s (%s): %s", p.ID, strings.Join(p.Files, ", "), fail.Detail)
			r.halt(func() { r.failed = &f })
			return sig
		}
		// Asked again, told what failed: as many times as a whole work's
		// answer would be (ASSAY_MAX_REPAIRS).
		pw.Repairs, pw.RepairNote = try+1, fail.Error()
	}
}

// roomToRepair waits until part p may be asked again at proj, as the loop
// that starts the parts waits for a part: false when the review went no
// further meanwhile, or the cap or the deadline leaves no room for it.
func (s *Service) roomToRepair(ctx context.Context, r *partsRun, p *diff.Part, proj int64) bool {
	for {
		if r.halted() {
			return false
		}
		why, end, wait := s.room(r, p, proj)
		switch {
		case why != "":
			r.halt(func() { r.stop, r.stopEnd = why, end })
			return false
		case !wait:
			return true
		}
		select {
		case <-ctx.Done():
			err := context.Cause(ctx)
			r.halt(func() { r.err = err })
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// keepLease extends the lease every Heartbeat while the parts run, between
// calls as during them, and cancels the calls once the lease is gone: an
// answer that can no longer be committed is not paid for.
func (s *Service) keepLease(ctx context.Context, r *partsRun, cancel context.CancelCauseFunc) (stop func()) {
	return keepAlive(func() {
		r.progress()
		if ok, err := s.d.Store.ExtendLease(ctx, r.w.ID, r.token, s.cfg.LeaseTTL); err == nil && !ok {
			r.halt(func() { r.lost = true })
			cancel(errLeaseLost)
		}
	}, s.cfg.Heartbeat)
}

// halt records, under r's lock, what stops the review: the first reason
// set wins, and no part is called after.
func (r *partsRun) halt(set func()) {
	r.mu.Lock()
	if r.err == nil && r.failed == nil && !r.lost && r.stop == "" {
		set()
	}
	r.mu.Unlock()
	r.signal()
}

// halted says whether the review goes no further.
func (r *partsRun) halted() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err != nil || r.failed != nil || r.lost || r.stop != ""
}

// signal wakes the loop that starts the parts.
func (r *partsRun) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// ended counts a call estimated at proj as ended, billed cost; a call the
// model answered with the provider's own usage (billed) calibrates the
// estimates of the calls after it.
func (r *partsRun) ended(est, proj, cost int64, billed, outage bool) {
	if billed {
		r.cal.observe(est, cost)
	}
	r.mu.Lock()
	r.calling--
	r.pending -= proj
	r.spent += cost
	r.outage = r.outage || outage
	r.mu.Unlock()
	r.signal()
}

// takeProbe says whether this call was the circuit's probe: the lease's
// first call to answer, when the lease was given the probe.
func (r *partsRun) takeProbe() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.probe
	r.probe = false
	return p
}

// callsRunning is how many of the lease's calls are running.
func (r *partsRun) callsRunning() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calling
}

// waitForCalls waits until every part's calls have ended.
func (r *partsRun) waitForCalls() {
	for {
		r.mu.Lock()
		n := r.running
		r.mu.Unlock()
		if n == 0 {
			return
		}
		<-r.wake
	}
}
