package classifier

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"assay.dev/pkg/admission"
	"assay.dev/pkg/consumer"
	"assay.dev/pkg/contract"
	"assay.dev/pkg/event"
	"assay.dev/pkg/gate"
	"assay.dev/pkg/model"
	"assay.dev/pkg/outbox"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

// Process runs one delivery of a work announcement: screen it, read the
// work, take a permit, reserve budget, claim, call the model, and record
// what the answer means. Every decision is one of decide.go's; this carries
// them out.
func (s *Service) Process(ctx context.Context, ev event.Work, d consumer.Delivery) consumer.Disposition {
	ctx, span := s.d.Tel.Tracer().Start(ctx, "classifier.process", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("assay.work_id", ev.WorkID), attribute.String("assay.tenant", ev.TenantID)))
	defer span.End()
	need := s.timeNeeded()
	if st := screen(ev, s.cfg.Region, time.Now(), need); !st.proceed {
		return s.carry(ctx, ev.WorkID, nil, st)
	}
	j, disp, ok := s.job(ctx, ev, d, need)
	if !ok {
		return disp
	}
	// The work's model is known once it is read (or taken from its
	// facts): only work for a model whose circuit is open waits.
	if disp, held := s.waitForProvider(ctx, ev, j.w, need); held {
		return disp
	}
	if s.batches != nil && j.w.Lane == event.Batch && s.partsOf(j.c, j.w) == nil {
		// Sent as a line of a provider batch: no permit, no call here. A
		// diff over one part is not a line: it is reviewed in parts here.
		return s.batches.enqueue(ctx, j.w, j.budgeted, j.c)
	}
	// A permit from the cell's limiter before anything is held: waiting here
	// costs a goroutine and a message in hand, both bounded by the limiter.
	permit, err := s.acquire(ctx, j.w, d)
	if err != nil {
		return consumer.Retry(0)
	}
	defer permit.Release(admission.Signal{Kind: admission.Ignore})
	if j.facts != nil && !admit(ev, j.w, time.Now(), need, s.cfg.MaxAttempts, true).proceed {
		// Time ran short on the way to the permit: decide on the row.
		if j, disp, ok = s.read(ctx, ev, need); !ok {
			return disp
		}
	}
	if disp, ok := s.stillInTime(ctx, ev, j.w, need); !ok {
		return disp
	}
	probe, disp, ok := s.probeTurn(ctx, j.w)
	if !ok {
		return disp
	}
	cw, attemptID, token, disp, ok := s.claim(ctx, j)
	if !ok && j.facts != nil && disp == readRow {
		// The row is not as its facts said, or not to be claimed on them:
		// read it and decide again.
		if j, disp, ok = s.read(ctx, ev, need); ok {
			cw, attemptID, token, disp, ok = s.claim(ctx, j)
		}
	}
	if !ok {
		return disp
	}
	c := j.c
	if pp := s.partsOf(c, cw); pp != nil {
		return s.reviewInParts(ctx, &partsRun{w: cw, c: c, attemptID: attemptID, token: token, budgeted: j.budgeted,
			pp: pp, probe: probe, progress: func() { _ = d.InProgress() }}, permit)
	}
	if j.budgeted && s.claimedInput(c, len(cw.Input)) < len(cw.Input) {
		if disp, ok := s.reserveWhole(ctx, cw, c, attemptID, token); !ok {
			return disp
		}
	}
	claimedAt := time.Now()
	span.SetAttributes(attribute.String("assay.attempt_id", attemptID), attribute.Int("assay.attempt", cw.Attempts))
	return s.callAndSettle(ctx, cw, c, attemptID, token, permit, probe, claimedAt, func() { _ = d.InProgress() })
}

// callAndSettle makes the claimed attempt's model call, tells the limiter
// and the circuit how it went, and settles it.
func (s *Service) callAndSettle(ctx context.Context, cw *store.Work, c *contract.Contract, attemptID, token string,
	permit *servedPermit, probe bool, claimedAt time.Time, progress func()) consumer.Disposition {
	// A call cut short by the work's own deadline says nothing of the
	// provider: only the call timeout counts as its slowness.
	deadlineBound := time.Until(cw.DeadlineAt) < s.cfg.CallTimeout
	callCtx, _, release := s.cancelable(ctx, cw.ID)
	reply, callErr := s.call(callCtx, cw, c, attemptID, token, progress)
	release()
	permit.Release(callSignal(reply, callErr, deadlineBound))
	outage := s.circuitOf(cw).observe(ctx, reply, callErr, deadlineBound, probe)
	// What the call cost must be recorded even when the worker is stopping.
	ctx = context.WithoutCancel(ctx)
	// Whether the lease is still the attempt's is asked by the statement
	// that records the answer: the handoff lease is taken there, and when
	// the lease has gone the attempt is recorded stale instead.
	return s.settle(ctx, cw, c, attemptID, token, reply, callErr, claimedAt, outage)
}

// callSignal is what a call tells the limiter: signal, with a timeout of a
// call bound by the work's own deadline ignored.
func callSignal(reply *model.Reply, callErr error, deadlineBound bool) admission.Signal {
	sig := signal(reply, callErr)
	if sig.Kind == admission.Timeout && deadlineBound {
		sig.Kind = admission.Ignore
	}
	return sig
}

// read reads the work the announcement points to and admits it; ok=false
// ends the delivery with disp.
func (s *Service) read(ctx context.Context, ev event.Work, need time.Duration) (j job, disp consumer.Disposition, ok bool) {
	got := s.toRun.Do(ctx, ev.WorkID)
	w, budgeted, err := got.Work, got.Budgeted, got.Err
	if errors.Is(err, store.ErrNotFound) {
		telemetry.Decision(ctx, s.d.Log, ev.WorkID, "refused", "no such work in this cell")
		return job{}, consumer.Refuse(), false
	}
	if err != nil {
		s.d.Log.Warn("read work failed", "key", ev.WorkID, "err", err)
		return job{}, consumer.Retry(time.Second), false
	}
	s.budgets.saw(w.TenantID, budgeted)
	c, known, err := s.contractOf(ctx, w)
	if err != nil {
		s.d.Log.Warn("read work's prompt failed", "key", ev.WorkID, "err", err)
		return job{}, consumer.Retry(time.Second), false
	}
	if st := admit(ev, w, time.Now(), need, s.cfg.MaxAttempts, known); !st.proceed {
		return job{}, s.carry(ctx, w.ID, w, st), false
	}
	return job{w: w, budgeted: budgeted, c: c}, consumer.Disposition{}, true
}

// claim reserves the attempt's budget, when its tenant has one, then takes
// the lease: work whose tenant cannot pay ends without a claim, an attempt
// or a call. ok=false ends the delivery with disp, or, for a job on facts,
// with readRow: its row is to be read and the claim asked again.
func (s *Service) claim(ctx context.Context, j job) (cw *store.Work, attemptID, token string,
	disp consumer.Disposition, ok bool) {
	w := j.w
	attemptID, token = newUUID(), newUUID()
	est := s.estimate(j.c, w, s.claimedInput(j.c, j.inputLen()))
	res := store.Reserved
	if j.budgeted {
		var err error
		if res, err = s.d.Store.Reserve(ctx, w.TenantID, attemptID, est); err != nil {
			s.d.Log.Warn("budget reservation failed", "key", w.ID, "err", err)
			return nil, "", "", consumer.Retry(time.Second), false
		}
	}
	if st := afford(res, w, est, time.Now(), s.backoff(1)); !st.proceed {
		if j.facts != nil {
			return nil, "", "", readRow, false
		}
		if st.finish != "" {
			s.m.denied(ctx, w)
		}
		return nil, "", "", s.carry(ctx, w.ID, w, st), false
	}
	claimed := s.claims.Do(ctx, store.ClaimReq{WorkID: w.ID, AttemptID: attemptID, Token: token, TTL: s.cfg.LeaseTTL,
		Estimate: est, Expect: j.expect()})
	cw, ok, err := claimed.Work, claimed.OK, claimed.Err
	if (err != nil || !ok) && j.budgeted {
		if rerr := s.d.Store.Release(context.WithoutCancel(ctx), attemptID); rerr != nil {
			s.d.Log.Warn("releasing a reservation failed", "key", w.ID, "attempt", attemptID, "err", rerr)
		}
	}
	if err != nil {
		s.d.Log.Warn("claim failed", "key", w.ID, "err", err)
		return nil, "", "", consumer.Retry(time.Second), false
	}
	if !ok && j.facts != nil {
		s.m.onFacts(ctx, w, false)
		return nil, "", "", readRow, false
	}
	if !ok {
		telemetry.Decision(ctx, s.d.Log, w.ID, "claim_lost", "another worker holds the lease or the work just ended")
		return nil, "", "", consumer.Done(), false
	}
	if j.facts != nil {
		s.m.onFacts(ctx, w, true)
	}
	s.m.claimed(ctx, w, time.Now())
	telemetry.Decision(ctx, s.d.Log, cw.ID, "claimed", "lease taken", slog.String("attempt", attemptID), slog.Int("number", cw.Attempts))
	return cw, attemptID, token, consumer.Disposition{}, true
}

// carry carries out a decision taken before any call: end the unleased
// work, or log why the delivery ends here.
func (s *Service) carry(ctx context.Context, key string, w *store.Work, st step) consumer.Disposition {
	if st.finish != "" {
		return s.finishUnleased(ctx, w, st.finish, st.reason)
	}
	var attrs []slog.Attr
	if st.disp.Settle == consumer.Nak {
		attrs = append(attrs, slog.Duration("delay", st.disp.Delay))
	}
	telemetry.Decision(ctx, s.d.Log, key, st.decision, st.reason, attrs...)
	return st.disp
}

// timeNeeded is how long before its deadline work must start for an answer
// to be accepted in time: twice a typical call, plus DeadlineMargin for the
// way to the committer.
func (s *Service) timeNeeded() time.Duration {
	return 2*s.lim.Stats().Baseline + s.cfg.DeadlineMargin
}

// cancelable is ctx ended by a CANCEL of work workID (a superseding push):
// the work's model call, or every call of its review in parts. release
// ends it and forgets it.
func (s *Service) cancelable(ctx context.Context, workID string) (context.Context, context.CancelCauseFunc, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	s.mu.Lock()
	s.running[workID] = cancel
	s.mu.Unlock()
	return ctx, cancel, func() {
		cancel(nil)
		s.mu.Lock()
		delete(s.running, workID)
		s.mu.Unlock()
	}
}

// call runs attempt attemptID's model call with a deadline, keeping the
// lease and the delivery alive while it runs, in a span and the metrics
// of the GenAI conventions (genai.go).
func (s *Service) call(ctx context.Context, w *store.Work, c *contract.Contract, attemptID, token string,
	progress func()) (*model.Reply, error) {
	timeout := min(s.cfg.CallTimeout, time.Until(w.DeadlineAt))
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if s.cfg.Heartbeat > 0 {
		hb := time.NewTicker(s.cfg.Heartbeat)
		defer hb.Stop()
		go func() {
			for {
				select {
				case <-callCtx.Done():
					return
				case <-hb.C:
					progress()
					if ok, err := s.d.Store.ExtendLease(callCtx, w.ID, token, s.cfg.LeaseTTL); err == nil && !ok {
						// The lease is gone: stop paying for an answer that
						// can no longer be committed.
						cancel()
						return
					}
				}
			}
		}()
	}
	cc := s.chatOf(w)
	ctx, span := s.startChat(callCtx, w, c, attemptID, cc)
	defer span.End()
	start := time.Now()
	reply, err := s.d.Model.Complete(ctx, s.modelCall(c, w))
	endChat(span, reply, err)
	s.m.chat(ctx, cc, w, reply, err, time.Since(start))
	return reply, err
}

// settle decides what the call's result means and records it: the
// attempt's outcome, the work's next state and the ATTEMPT event, in one
// statement.
func (s *Service) settle(ctx context.Context, w *store.Work, c *contract.Contract, attemptID, token string,
	reply *model.Reply, callErr error, claimedAt time.Time, outage bool) consumer.Disposition {
	a, raw := s.answerTo(w, c, reply, callErr, true, counted(w, outage))
	a.outage = outage
	if outage {
		a.condition = s.circuitOf(w).condition()
	}
	v, ok := s.record(ctx, w, c, attemptID, token, a, raw, s.judge, func(outcome string) *event.Attempt {
		att := s.attemptEvent(c, w, attemptID, outcome, reply, callErr)
		return &att
	})
	if !ok {
		return consumer.Retry(time.Second)
	}
	failCode := ""
	if a.fail != nil {
		failCode = a.fail.Code
	}
	s.m.judged(ctx, w, c, claimedAt, reply, callErr, failCode, v)
	s.logVerdict(ctx, w, attemptID, v, callErr)
	return v.disp
}

// answerTo is the answer to judge of one call's result at w, the gate's
// verdict on its output included while the lease is still the attempt's
// (stillMine), and the raw bytes to keep of it. attempts are the attempts
// the budget counts.
func (s *Service) answerTo(w *store.Work, c *contract.Contract, reply *model.Reply, callErr error,
	stillMine bool, attempts int) (answer, []byte) {
	out, hasOutput := output(reply, callErr)
	a := answer{stillMine: stillMine, err: callErr, output: out, hasOutput: hasOutput,
		attempts: attempts, repairs: w.Repairs, now: time.Now(), deadline: w.DeadlineAt, backoff: s.backoff(w.Attempts),
		retryRefusals: c.OnRefusal == contract.RefusalRetry, outputCap: s.outputCap(w)}
	if w.OutputCap == 0 {
		a.raisedCap = 2 * s.cfg.MaxOutputUnits
	}
	var mErr *model.Error
	switch {
	case !stillMine || !hasOutput:
	case errors.As(callErr, &mErr) && mErr.BodyBytes != 0:
		// Too large to be read whole: the gate's reason gives its real size.
		a.fail = gate.TooLarge(mErr.BodyBytes)
	default:
		_, a.fail = gate.Check(c, []byte(out), gate.ExpectFor(c, seen(w), w.Digest, []byte(w.Input)))
	}
	// Keep the raw answer in the cell, byte for byte, whatever happens to
	// it next.
	raw := []byte(out)
	if !hasOutput && reply != nil {
		// Not the model's output (a refusal, a cut answer, an error
		// object): the provider's body is kept all the same.
		raw = reply.Raw
	}
	return a, raw
}

// logVerdict writes an attempt's verdict to the decision log: the
// attempt's id, then also, then what follows, and a failed call's detail.
func (s *Service) logVerdict(ctx context.Context, w *store.Work, attemptID string, v verdict, callErr error, also ...slog.Attr) {
	reason := v.reason
	if reason == "" {
		reason = "model answered"
	}
	attrs := append([]slog.Attr{slog.String("attempt", attemptID)}, also...)
	attrs = append(attrs, slog.String("next", v.next), slog.Duration("delay", v.disp.Delay))
	telemetry.Decision(ctx, s.d.Log, w.ID, v.outcome, reason, append(attrs, callDetail(callErr)...)...)
}

// record records an attempt as decide (judge, mostly) decides on a — its outcome, its work's
// next state, and its ATTEMPT event, with the call's usage when attempt gives
// one, in one statement — and counts it. A lease gone while the call ran
// has the attempt recorded as what it then is. ok=false: nothing could be
// recorded, and the delivery is to be tried again.
func (s *Service) record(ctx context.Context, w *store.Work, c *contract.Contract, attemptID, token string, a answer,
	raw []byte, decide func(answer) verdict, attempt func(outcome string) *event.Attempt) (v verdict, ok bool) {
	var written []store.OutboxMsg // the events of the record that applied, handed to the relay
	for {
		v = decide(a)
		res := s.resultEvent(w, c, attemptID, token, v)
		att := attempt(v.outcome)
		msgs, err := s.events(ctx, w, res, att)
		if err != nil {
			return v, false
		}
		if !s.cfg.SplitEvents {
			// The one ATTEMPT event is kept on the attempt's row, not as an
			// outbox row: it is handed to the relay below once recorded, and
			// the reapers read back what the broker loses of it.
			store.NoRows(msgs)
		}
		applied, err := s.recordAttempt(ctx, s.attemptRecord(w, attemptID, token, v, raw, msgs, a.outage))
		if applied && err == nil {
			written = msgs
		}
		if store.Permanent(err) {
			// The database refused the record for good (a data exception, an
			// integrity violation): retrying would claim and pay again for
			// nothing. The attempt is recorded without what was refused and
			// the work ends with the reason.
			v, err = s.refused(ctx, w, res, att, token, a.hasOutput, err)
			applied = err == nil
		}
		if err != nil {
			s.d.Log.Error("recording attempt failed", "key", w.ID, "attempt", attemptID, "err", err)
			return v, false
		}
		if applied || !a.stillMine {
			break
		}
		// The lease went while the call ran (taken back, superseded):
		// nothing was written; the attempt is recorded as what it now is.
		a.stillMine = false
	}
	if written != nil {
		s.relay.Send(written...)
	} else {
		s.relay.Kick()
	}
	s.countAttempt(ctx, w, v.outcome)
	return v, true
}

// resultEvent is the result of an attempt at w under c, as v decides.
func (s *Service) resultEvent(w *store.Work, c *contract.Contract, attemptID, token string, v verdict) event.Result {
	return event.Result{AttemptID: attemptID, WorkID: w.ID, TenantID: w.TenantID, Region: w.Region,
		Number: w.Attempts, LeaseToken: token, Contract: c.Name, SchemaVersion: w.SchemaVersion,
		TaxonomyVersion: w.TaxonomyVersion, Digest: w.Digest, Outcome: v.outcome, Reason: v.reason,
		Final: v.final}
}

// attemptRecord is the record of an attempt at w as v decides, with the
// raw answer and the outbox rows of its events.
func (s *Service) attemptRecord(w *store.Work, attemptID, token string, v verdict, raw []byte, msgs []store.OutboxMsg,
	outage bool) store.AttemptRecord {
	return store.AttemptRecord{AttemptID: attemptID, WorkID: w.ID, LeaseToken: token,
		Outcome: v.outcome, Reason: v.reason, Raw: raw, Change: v.change, HandoffTTL: s.cfg.HandoffTTL,
		RepairNote: v.repairNote, RetryAfter: v.disp.Delay, OutputCap: v.outputCap, WorkOutcome: v.workOutcome,
		WorkReason: v.workReason, Outbox: msgs, Outage: outage}
}

// countAttempt counts one recorded attempt at w by its outcome.
func (s *Service) countAttempt(ctx context.Context, w *store.Work, outcome string) {
	s.attempts.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", outcome), attribute.String("region", s.cfg.Region),
		attribute.String("tenant", s.d.Tel.Tenant(w.TenantID))))
}

// callDetail is what the decision log adds to a failed call's public
// reason for the operator: the provider's own message (redacted), the URL
// asked and the underlying error, none of which a tenant reads.
func callDetail(err error) []slog.Attr {
	var mErr *model.Error
	if !errors.As(err, &mErr) {
		return nil
	}
	var out []slog.Attr
	if mErr.Provider != "" {
		out = append(out, slog.String("provider_message", mErr.Provider))
	}
	if mErr.URL != "" {
		out = append(out, slog.String("asked", mErr.URL))
	}
	if mErr.Err != nil {
		out = append(out, slog.String("err", mErr.Err.Error()))
	}
	return out
}

// recordBackoff are the waits between tries of an attempt's record that
// never reached the database: the call is paid for and its answer is held
// only here, and given up, the work waits for its lease to lapse and is
// called again.
var recordBackoff = []time.Duration{100 * time.Millisecond, 300 * time.Millisecond, time.Second, 2 * time.Second}

// recordAttempt is RecordAttempt, in a group with the records of other
// calls that ended meanwhile, sent again while it failed before
// reaching the server (no connection to be had). An error after that may
// have committed, and is left to the caller.
func (s *Service) recordAttempt(ctx context.Context, r store.AttemptRecord) (bool, error) {
	for i := 0; ; i++ {
		got := s.records.Do(ctx, r)
		applied, err := got.Applied, got.Err
		if err == nil || !store.Unsent(err) || i == len(recordBackoff) {
			return applied, err
		}
		s.d.Log.Warn("recording attempt failed before it reached the database; trying again", "key", r.WorkID,
			"attempt", r.AttemptID, "err", err)
		select {
		case <-ctx.Done():
			return applied, err
		case <-time.After(recordBackoff[i]):
		}
	}
}

// refused records an attempt whose record the database refused for good:
// without its raw answer, ending the work — schema_rejected when the model
// answered (what it answered cannot be kept), retry_exhausted otherwise —
// with a reason that names the refusal, and the events of that.
func (s *Service) refused(ctx context.Context, w *store.Work, res event.Result, att *event.Attempt, token string,
	hasOutput bool, cause error) (verdict, error) {
	code := store.SQLState(cause)
	s.storeRefused.Add(ctx, 1, metric.WithAttributes(attribute.String("sqlstate_class", code[:min(2, len(code))]),
		attribute.String("region", s.cfg.Region)))
	v := refusedVerdict(res.Outcome, hasOutput, cause)
	res.Outcome, res.Reason, res.Final = v.outcome, v.reason, true
	if att != nil {
		att.Outcome = v.outcome
	}
	msgs, err := s.events(ctx, w, res, att)
	if err != nil {
		return v, err
	}
	rec := store.AttemptRecord{AttemptID: res.AttemptID, WorkID: w.ID, LeaseToken: token,
		Outcome: v.outcome, Reason: v.reason, Change: store.Finish, WorkOutcome: v.workOutcome, WorkReason: v.workReason, Outbox: msgs}
	applied, err := s.d.Store.RecordAttempt(ctx, rec)
	if err == nil && !applied {
		// The lease went meanwhile: the attempt is recorded, the work is
		// another's to end.
		rec.Change = store.NoChange
		_, err = s.d.Store.RecordAttempt(ctx, rec)
	}
	return v, err
}

// refusedVerdict is the verdict on an attempt of outcome oc whose record the
// database refused for good (cause): the work ends, schema_rejected when
// the model answered (hasOutput), retry_exhausted otherwise, with a reason
// that names the refusal.
func refusedVerdict(oc string, hasOutput bool, cause error) verdict {
	reason := fmt.Sprintf("the cell's database refused the attempt's record for good (SQLSTATE %s); not retried", store.SQLState(cause))
	v := verdict{outcome: oc, reason: reason, change: store.Finish, workOutcome: outcome.RetryExhausted,
		workReason: reason, final: true, disp: consumer.Done(), next: "ended"}
	if hasOutput {
		v.outcome, v.workOutcome = outcome.AttemptInvalidOutput, outcome.SchemaRejected
	}
	return v
}

// seen is what entered this worker with the work.
func seen(w *store.Work) gate.Seen {
	return gate.Seen{WorkID: w.ID, SchemaVersion: w.SchemaVersion, TaxonomyVersion: w.TaxonomyVersion, Digest: w.Digest}
}

// judge is judge within this worker's limits.
func (s *Service) judge(a answer) verdict { return judge(a, s.limits()) }

func (s *Service) limits() limits {
	return limits{maxAttempts: s.cfg.MaxAttempts, maxRepairs: s.cfg.MaxRepairs}
}

// attemptEvent is the ATTEMPT event of one attempt: its usage, for the
// ledger. A call that left and brought no usage back (a timeout, a cancel,
// a 5xx) is charged the request's estimated input units, and a 2xx answer
// whose usage cannot be read those and its bytes as output, marked
// estimated: the provider may bill them, and the ledger never under-counts.
func (s *Service) attemptEvent(c *contract.Contract, w *store.Work, attemptID, outcome string, reply *model.Reply, callErr error) event.Attempt {
	att := event.Attempt{AttemptID: attemptID, WorkID: w.ID, TenantID: w.TenantID, Region: w.Region,
		Number: w.Attempts, Model: s.modelOf(w), Outcome: outcome, UpstreamAttempts: 1, At: time.Now().UTC()}
	if reply == nil {
		return att
	}
	att.InputUnits, att.OutputUnits = int64(reply.Usage.PromptTokens), int64(reply.Usage.CompletionTokens)
	att.LatencyMS = reply.Latency.Milliseconds()
	if reply.Model != "" && reply.Model != att.Model {
		// Priced at what was asked for, and reserved at; the echo is kept.
		att.ServedModel = reply.Model
	}
	kind := unbilled(reply, callErr)
	if kind == billed && !plausible(reply.Usage, s.requestBytes(c, w, len(w.Input)), len(reply.Raw), s.outputCap(w)) {
		kind = implausible
	}
	switch kind {
	case implausible:
		// Numbers no tokenizer can produce are not copied, and the call is
		// not dropped: it is charged its reservation's estimate, or its
		// bytes when the answer ran past the cap.
		out := max(int64(s.outputCap(w)), int64(math.Ceil(float64(len(reply.Raw))/s.cfg.BytesPerUnit)))
		att.InputUnits, att.OutputUnits, att.Estimated = s.inputUnits(c, w, len(w.Input)), out, true
	case noAnswer:
		att.InputUnits, att.OutputUnits, att.Estimated = s.inputUnits(c, w, len(w.Input)), 0, true
	case unreadable:
		body := int64(len(reply.Raw))
		var mErr *model.Error
		if errors.As(callErr, &mErr) && mErr.BodyBytes > body {
			body = mErr.BodyBytes // a body too large to be read whole
		}
		out := int64(math.Ceil(float64(body) / s.cfg.BytesPerUnit))
		att.InputUnits, att.OutputUnits, att.Estimated = s.inputUnits(c, w, len(w.Input)), out, true
	}
	if !att.Estimated && !s.cfg.SplitEvents { // split: the form earlier ledgers and committers read
		att.CachedInputUnits, att.ReasoningUnits = int64(reply.Usage.CachedInputTokens()), int64(reply.Usage.ReasoningTokens())
	}
	return att
}

// What the provider may have billed that no usage says.
const (
	billed      = iota // the usage came back, or nothing left, or the provider refused
	noAnswer           // the request left and no answer came (a timeout, a cancel, a 5xx, a cut connection)
	unreadable         // a 2xx answer whose usage could not be read (cut or garbled)
	implausible        // usage came back with numbers no real call can have
)

func unbilled(reply *model.Reply, err error) int {
	var mErr *model.Error
	if !reply.Sent || reply.Usage.PromptTokens > 0 || !errors.As(err, &mErr) {
		return billed
	}
	switch mErr.Kind {
	case model.KindTimeout, model.KindCanceled, model.KindTransient:
		return noAnswer
	case model.KindMalformed:
		return unreadable
	}
	return billed
}

// events are the outbox row of an attempt's one ATTEMPT event: the call's
// usage (att) with the result it came to; an attempt that made no call of
// its own (att nil) carries the result alone. Split (SplitEvents), they are
// a RESULT event and the call's ATTEMPT event.
func (s *Service) events(ctx context.Context, w *store.Work, res event.Result, att *event.Attempt) ([]store.OutboxMsg, error) {
	if s.cfg.SplitEvents {
		return s.splitEvents(ctx, w, res, att)
	}
	ev := event.Attempt{AttemptID: res.AttemptID, WorkID: res.WorkID, TenantID: res.TenantID, Region: res.Region,
		Number: res.Number, Outcome: res.Outcome, At: time.Now().UTC(), NoCall: true}
	if att != nil {
		ev = *att
	}
	ev.Result = &res
	msg, err := s.attemptMsg(ctx, w, ev)
	if err != nil {
		return nil, err
	}
	if ev.NoCall {
		msg.Headers[event.NoCallHeader] = "1"
	}
	return []store.OutboxMsg{msg}, nil
}

// splitEvents are the outbox rows of an attempt's RESULT event and, when it
// made a call (att), its ATTEMPT event without the result.
func (s *Service) splitEvents(ctx context.Context, w *store.Work, res event.Result, att *event.Attempt) ([]store.OutboxMsg, error) {
	resMsg, err := outbox.Msg(ctx, event.KindResult, s.cfg.Names.Result(w.TenantID), res.AttemptID, res)
	if err != nil || att == nil {
		return []store.OutboxMsg{resMsg}, err
	}
	attMsg, err := s.attemptMsg(ctx, w, *att)
	if err != nil {
		return nil, err
	}
	return []store.OutboxMsg{resMsg, attMsg}, nil
}

// attemptMsg is the outbox row of one call's ATTEMPT event.
func (s *Service) attemptMsg(ctx context.Context, w *store.Work, att event.Attempt) (store.OutboxMsg, error) {
	return outbox.Msg(ctx, event.KindAttempt, s.cfg.Names.Attempt(w.TenantID), att.AttemptID, att)
}

// modelCall is the request for one attempt at w; a repair re-ask carries
// what failed last time.
func (s *Service) modelCall(c *contract.Contract, w *store.Work) model.Call {
	repair := ""
	if w.Repairs > 0 {
		repair = w.RepairNote
	}
	return model.Call{
		Tenant:   w.TenantID,
		Contract: c.Name,
		Schema:   c.Schema,
		Messages: model.Messages(c.Prompt, model.Correlation{WorkID: w.ID, SchemaVersion: c.WireSchemaVersion,
			TaxonomyVersion: w.TaxonomyVersion}, repair, json.RawMessage(w.Input)),
		MaxTokens: s.outputCap(w),
		Model:     w.Model,
	}
}

// modelOf is the model w is asked of: its own (a rollout's), or the cell's.
func (s *Service) modelOf(w *store.Work) string {
	if w.Model != "" {
		return w.Model
	}
	return s.cfg.Model
}

// contractOf is the contract w was made for: its version, which it carries
// from ingress to its result, asked with its prompt when a rollout named
// another than the version's own. known is false for a version or prompt
// this cell does not have; err is a failed read, worth trying again.
func (s *Service) contractOf(ctx context.Context, w *store.Work) (c *contract.Contract, known bool, err error) {
	c, known = s.d.Contracts.Of(w.Contract, w.SchemaVersion)
	if !known || w.PromptDigest == "" || w.PromptDigest == c.PromptDigest {
		return c, known, nil
	}
	if v, ok := s.prompts.Load(w.PromptDigest); ok {
		return v.(*contract.Contract), true, nil
	}
	text, err := s.d.Store.Prompt(ctx, w.PromptDigest)
	if errors.Is(err, store.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if contract.PromptDigest(text) != w.PromptDigest {
		// Not the text the rollout checked: never asked with it.
		return nil, false, nil
	}
	cp := *c
	cp.Prompt, cp.PromptDigest = text, w.PromptDigest
	v, _ := s.prompts.LoadOrStore(w.PromptDigest, &cp)
	return v.(*contract.Contract), true, nil
}

// outputCap is the answer cap of the next attempt at w: the classifier's,
// or the work's own once a cut answer raised it.
func (s *Service) outputCap(w *store.Work) int {
	if w.OutputCap > 0 {
		return w.OutputCap
	}
	return s.cfg.MaxOutputUnits
}

// Estimate bounds one attempt's cost from above: the request's input units
// and the answer at its cap.
func (s *Service) Estimate(c *contract.Contract, w *store.Work) int64 {
	return s.estimate(c, w, len(w.Input))
}

// estimate is Estimate for w with an input of inputLen bytes (w.Input
// itself not read).
func (s *Service) estimate(c *contract.Contract, w *store.Work, inputLen int) int64 {
	return s.cfg.Prices.CostMicros(s.modelOf(w), s.inputUnits(c, w, inputLen), int64(s.outputCap(w)))
}

// inputUnits estimates a request's input units from above: its bytes over
// BytesPerUnit.
func (s *Service) inputUnits(c *contract.Contract, w *store.Work, inputLen int) int64 {
	return int64(math.Ceil(float64(s.requestBytes(c, w, inputLen)) / s.cfg.BytesPerUnit))
}

// requestBytes is the size of what an attempt at w sends: its schema and
// messages, the input being inputLen bytes.
func (s *Service) requestBytes(c *contract.Contract, w *store.Work, inputLen int) int {
	bare := *w
	bare.Input = ""
	call := s.modelCall(c, &bare)
	in := len(call.Schema) + inputLen
	for _, m := range call.Messages {
		in += len(m.Content)
	}
	return in
}

// signal is what one call tells the limiter: success with its latency,
// or congestion (a 429, a 503 that says when to come back, or a timeout).
// A 2xx that is not model output (a refusal, a cut answer, garbled) still
// says the provider answered in time. Anything else says nothing about the
// provider's capacity.
func signal(reply *model.Reply, err error) admission.Signal {
	var mErr *model.Error
	errors.As(err, &mErr)
	switch {
	case err == nil && reply != nil:
		return admission.Signal{Kind: admission.Success, Latency: reply.Latency}
	case mErr != nil && (mErr.Kind == model.KindRateLimited || (mErr.Status == http.StatusServiceUnavailable && mErr.RetryAfter > 0)):
		return admission.Signal{Kind: admission.RateLimited}
	case mErr != nil && mErr.Kind == model.KindTimeout:
		return admission.Signal{Kind: admission.Timeout}
	case mErr != nil && reply != nil && mErr.Status >= 200 && mErr.Status < 300:
		return admission.Signal{Kind: admission.Success, Latency: reply.Latency}
	}
	return admission.Signal{Kind: admission.Ignore}
}

func (s *Service) finishUnleased(ctx context.Context, w *store.Work, state, reason string) consumer.Disposition {
	ok, err := s.d.Store.FinishUnleased(ctx, w.ID, state, reason)
	if err != nil {
		s.d.Log.Warn("finish failed", "key", w.ID, "err", err)
		return consumer.Retry(time.Second)
	}
	if ok {
		telemetry.Decision(ctx, s.d.Log, w.ID, state, reason)
	} else {
		telemetry.Decision(ctx, s.d.Log, w.ID, "claim_lost", "work is held by a live lease or already ended")
	}
	return consumer.Done()
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
