package classifier

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"assay.dev/pkg/admission"
	"assay.dev/pkg/contract"
	"assay.dev/pkg/event"
	"assay.dev/pkg/gate"
	"assay.dev/pkg/model"
	"assay.dev/pkg/outbox"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

// Attempt outcomes the classifier decides.
const (
	OutcomeOK            = "ok"
	OutcomeInvalidOutput = "invalid_output"
	OutcomeRateLimited   = "rate_limited"
	OutcomeTimeout       = "timeout"
	OutcomeTransport     = "transport_error"
	OutcomeRejected      = "transport_rejected"
	OutcomeStaleLease    = "stale_lease"
	OutcomeCanceled      = "canceled"
)

// Process runs one delivery of a work announcement: claim, call, decide.
// progress is called while the model call runs, to keep the delivery alive.
func (s *Service) Process(ctx context.Context, ev event.Work, progress func()) Disposition {
	ctx, span := s.d.Tel.Tracer().Start(ctx, "classifier.process", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("assay.work_id", ev.WorkID), attribute.String("assay.tenant", ev.TenantID)))
	defer span.End()
	log := s.d.Log
	if ev.Region != s.cfg.Region {
		telemetry.Decision(ctx, log, ev.WorkID, "refused", fmt.Sprintf("work of region %s reached the %s cell", ev.Region, s.cfg.Region))
		return Disposition{Kind: Term}
	}
	// A backlog brings work near its deadline, where a call whose answer
	// cannot be accepted in time would only hold a permit that live work
	// needs. The announcement carries the deadline, so such work is passed
	// over without a read; the sweeper ends it expired.
	need := s.timeNeeded()
	if left := time.Until(ev.DeadlineAt); !ev.DeadlineAt.IsZero() && left < need {
		telemetry.Decision(ctx, log, ev.WorkID, "passed_over", shortOfTime(left, need)+"; the sweeper ends it expired")
		return Disposition{Kind: Ack}
	}
	w, err := s.d.Store.GetWork(ctx, ev.WorkID)
	if errors.Is(err, store.ErrNotFound) {
		telemetry.Decision(ctx, log, ev.WorkID, "refused", "no such work in this cell")
		return Disposition{Kind: Term}
	}
	if err != nil {
		log.Warn("read work failed", "key", ev.WorkID, "err", err)
		return Disposition{Kind: Nak, Delay: time.Second}
	}
	if w.TenantID != ev.TenantID {
		telemetry.Decision(ctx, log, ev.WorkID, "refused", "message tenant does not match the work's tenant")
		return Disposition{Kind: Term}
	}
	if w.Terminal() {
		telemetry.Decision(ctx, log, w.ID, w.State, "already terminal; duplicate delivery ignored")
		return Disposition{Kind: Ack}
	}
	if time.Now().After(w.DeadlineAt) {
		return s.finishUnleased(ctx, w, "expired", "deadline passed before an attempt could start")
	}
	if left := time.Until(w.DeadlineAt); left < need {
		return s.finishUnleased(ctx, w, "expired", shortOfTime(left, need))
	}
	if w.Attempts >= s.cfg.MaxAttempts {
		return s.finishUnleased(ctx, w, "retry_exhausted", fmt.Sprintf("all %d attempts spent", s.cfg.MaxAttempts))
	}
	c, ok := s.d.Contracts.Get(w.Contract)
	if !ok {
		return s.finishUnleased(ctx, w, "transport_rejected", fmt.Sprintf("contract %q is not known to this worker", w.Contract))
	}

	// A permit from the cell's limiter before anything is held: waiting here
	// costs a goroutine and a message in hand, both bounded by the limiter.
	permit, err := s.lim.Acquire(ctx, w.Lane)
	if err != nil {
		return Disposition{Kind: Nak}
	}
	defer permit.Release(admission.Signal{Kind: admission.Ignore})

	attemptID, token := newUUID(), newUUID()
	// Reserve before claiming: work whose tenant cannot pay ends without a
	// claim, an attempt or a call.
	est := s.Estimate(c, w)
	switch res, err := s.d.Store.Reserve(ctx, w.TenantID, attemptID, est); {
	case err != nil:
		log.Warn("budget reservation failed", "key", w.ID, "err", err)
		return Disposition{Kind: Nak, Delay: time.Second}
	case res == store.Exhausted:
		return s.finishUnleased(ctx, w, "budget_exhausted",
			fmt.Sprintf("tenant %s's budget cannot cover an attempt estimated at %d micro-dollars", w.TenantID, est))
	case res == store.Busy:
		// Attempts in flight hold the rest; they settle at their real cost,
		// which may leave room. Ask again later without holding anything.
		delay := s.backoff(1)
		if time.Now().Add(delay).After(w.DeadlineAt) {
			return s.finishUnleased(ctx, w, "budget_exhausted",
				fmt.Sprintf("tenant %s's budget is held by attempts in flight past this work's deadline", w.TenantID))
		}
		telemetry.Decision(ctx, log, w.ID, "deferred", "budget held by attempts in flight", slog.Duration("delay", delay))
		return Disposition{Kind: Nak, Delay: delay}
	}
	cw, ok, err := s.d.Store.Claim(ctx, w.ID, attemptID, token, s.cfg.LeaseTTL)
	if err != nil || !ok {
		if rerr := s.d.Store.Release(context.WithoutCancel(ctx), attemptID); rerr != nil {
			log.Warn("releasing a reservation failed", "key", w.ID, "attempt", attemptID, "err", rerr)
		}
	}
	if err != nil {
		log.Warn("claim failed", "key", w.ID, "err", err)
		return Disposition{Kind: Nak, Delay: time.Second}
	}
	if !ok {
		telemetry.Decision(ctx, log, w.ID, "claim_lost", "another worker holds the lease or the work just ended")
		return Disposition{Kind: Ack}
	}
	span.SetAttributes(attribute.String("assay.attempt_id", attemptID), attribute.Int("assay.attempt", cw.Attempts))
	telemetry.Decision(ctx, log, cw.ID, "claimed", "lease taken", slog.String("attempt", attemptID), slog.Int("number", cw.Attempts))

	// A call cut short by the work's own deadline says nothing of the
	// provider: only the call timeout counts as its slowness.
	deadlineBound := time.Until(cw.DeadlineAt) < s.cfg.CallTimeout
	reply, callErr := s.call(ctx, cw, c, token, progress)
	sig := signal(reply, callErr)
	if sig.Kind == admission.Timeout && deadlineBound {
		sig.Kind = admission.Ignore
	}
	permit.Release(sig)
	// What the call cost must be recorded even when the worker is stopping.
	ctx = context.WithoutCancel(ctx)
	// The ordinary lease until the answer is recorded: the handoff lease is
	// taken in the transaction that hands it to the committer, so a worker
	// that dies before that strands the work for LeaseTTL, not HandoffTTL.
	stillMine, err := s.d.Store.ExtendLease(ctx, cw.ID, token, s.cfg.LeaseTTL)
	if err != nil {
		// Unknown whether the lease holds; record the attempt as if it did
		// not, the committer's compare-and-set decides anyway.
		log.Warn("lease check failed", "key", cw.ID, "err", err)
	}
	return s.settle(ctx, cw, c, attemptID, token, reply, callErr, stillMine)
}

// timeNeeded is how long before its deadline work must start for an answer
// to be accepted in time: twice a typical call, plus DeadlineMargin for the
// way to the committer.
func (s *Service) timeNeeded() time.Duration {
	return 2*s.lim.Stats().Baseline + s.cfg.DeadlineMargin
}

// shortOfTime says why work with left before its deadline is not tried.
func shortOfTime(left, need time.Duration) string {
	return fmt.Sprintf("%s left before the deadline; an accepted answer needs about %s",
		left.Round(time.Millisecond), need.Round(time.Millisecond))
}

// call runs one model call with a deadline, keeping the lease and the
// delivery alive while it runs.
func (s *Service) call(ctx context.Context, w *store.Work, c *contract.Contract, token string, progress func()) (*model.Reply, error) {
	timeout := min(s.cfg.CallTimeout, time.Until(w.DeadlineAt))
	ctx, cancelCause := context.WithCancelCause(ctx)
	defer cancelCause(nil)
	s.mu.Lock()
	s.running[w.ID] = cancelCause
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.running, w.ID)
		s.mu.Unlock()
	}()
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
	ctx, span := s.d.Tel.Tracer().Start(callCtx, "model.complete", trace.WithSpanKind(trace.SpanKindClient))
	defer span.End()
	reply, err := s.d.Model.Complete(ctx, s.modelCall(c, w))
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	return reply, err
}

// settle turns the call's result into the attempt's outcome, the work's next
// state and the RESULT and ATTEMPT events, all in one transaction.
func (s *Service) settle(ctx context.Context, w *store.Work, c *contract.Contract, attemptID, token string,
	reply *model.Reply, callErr error, stillMine bool) Disposition {
	res := event.Result{AttemptID: attemptID, WorkID: w.ID, TenantID: w.TenantID, Region: w.Region,
		Number: w.Attempts, LeaseToken: token, Contract: c.Name, SchemaVersion: w.SchemaVersion,
		TaxonomyVersion: w.TaxonomyVersion, Digest: w.Digest, Final: true}
	att := event.Attempt{AttemptID: attemptID, WorkID: w.ID, TenantID: w.TenantID, Region: w.Region,
		Number: w.Attempts, Model: s.cfg.Model, UpstreamAttempts: 1, At: time.Now().UTC()}
	if reply != nil {
		att.InputUnits, att.OutputUnits = int64(reply.Usage.PromptTokens), int64(reply.Usage.CompletionTokens)
		att.LatencyMS = reply.Latency.Milliseconds()
		if reply.Model != "" {
			att.Model = reply.Model
		}
	}

	var mErr *model.Error
	errors.As(callErr, &mErr)
	output := ""
	switch {
	case callErr == nil:
		output = reply.Content
	case mErr != nil && mErr.Kind == model.KindMalformed && reply != nil:
		// A truncated or garbled body is an invalid output: the gate
		// says what is wrong with it and the repair path applies.
		output = string(reply.Raw)
	}

	disp := Disposition{Kind: Ack}
	var workChange func(pgx.Tx) error
	ended := false // workChange gives the work its outcome
	reason := ""
	switch {
	case !stillMine:
		res.Outcome, reason = OutcomeStaleLease, "lease lost during the model call"
		res.Output = output
	case callErr == nil || (mErr != nil && mErr.Kind == model.KindMalformed && reply != nil):
		res.Output = output
		_, fail := gate.Check(c, []byte(output), gate.Expect{WorkID: w.ID, SchemaVersion: w.SchemaVersion,
			TaxonomyVersion: w.TaxonomyVersion, CurrentTaxonomyVersion: c.TaxonomyVersion,
			Digest: w.Digest, CurrentDigest: w.Digest, Input: json.RawMessage(w.Input)})
		if fail == nil {
			res.Outcome = OutcomeOK
			workChange = s.handoff(ctx, w.ID, token)
			break
		}
		res.Outcome, reason = OutcomeInvalidOutput, fail.Error()
		// A stale taxonomy or a changed digest is the work's, not the
		// answer's: no re-ask can pass, so none is paid for.
		unfixable := fail.Code == gate.CodeTaxonomyVersion || fail.Code == gate.CodeDigest
		workChange = s.handoff(ctx, w.ID, token)
		if !unfixable && w.Repairs < s.cfg.MaxRepairs && w.Attempts < s.cfg.MaxAttempts {
			res.Final = false
			workChange = func(tx pgx.Tx) error {
				_, err := s.d.Store.Requeue(ctx, tx, w.ID, token, fail.Error())
				return err
			}
			disp = Disposition{Kind: Nak}
		}
	case mErr != nil && mErr.Kind == model.KindRejected:
		res.Outcome, reason = OutcomeRejected, mErr.Error()
		ended = true
		workChange = func(tx pgx.Tx) error {
			_, err := s.d.Store.FinishLeased(ctx, tx, w.ID, token, "transport_rejected", reason)
			return err
		}
	default:
		res.Outcome, reason = retryOutcome(callErr, mErr), errText(callErr)
		delay := s.backoff(w.Attempts)
		if mErr != nil && mErr.RetryAfter > 0 {
			delay = mErr.RetryAfter // honoured exactly, never early
		}
		switch {
		case res.Outcome == OutcomeCanceled:
			delay = 0
			fallthrough
		case w.Attempts < s.cfg.MaxAttempts && time.Now().Add(delay).Before(w.DeadlineAt):
			workChange = func(tx pgx.Tx) error {
				_, err := s.d.Store.Requeue(ctx, tx, w.ID, token, "")
				return err
			}
			disp = Disposition{Kind: Nak, Delay: delay}
		default:
			final := "retry_exhausted"
			why := fmt.Sprintf("%s after %d of %d attempts", res.Outcome, w.Attempts, s.cfg.MaxAttempts)
			if !time.Now().Add(delay).Before(w.DeadlineAt) {
				why = fmt.Sprintf("%s and the next try would pass the deadline", res.Outcome)
			}
			ended = true
			workChange = func(tx pgx.Tx) error {
				_, err := s.d.Store.FinishLeased(ctx, tx, w.ID, token, final, why)
				return err
			}
		}
	}
	res.Reason, att.Outcome = reason, res.Outcome

	resMsg, err := outbox.Msg(ctx, event.ResultSubject(w.Region, w.TenantID), attemptID, res)
	if err != nil {
		return Disposition{Kind: Nak, Delay: time.Second}
	}
	attMsg, err := outbox.Msg(ctx, event.AttemptSubject(w.Region, w.TenantID), attemptID, att)
	if err != nil {
		return Disposition{Kind: Nak, Delay: time.Second}
	}
	// Keep the raw answer in the cell whatever happens to it next.
	err = s.d.Store.Tx(ctx, func(tx pgx.Tx) error {
		if err := s.d.Store.FinishAttempt(ctx, tx, attemptID, res.Outcome, reason, output); err != nil {
			return err
		}
		if workChange != nil {
			if err := workChange(tx); err != nil {
				return err
			}
		}
		return s.d.Store.InsertOutbox(ctx, tx, []store.OutboxMsg{resMsg, attMsg})
	})
	if err != nil {
		s.d.Log.Error("recording attempt failed", "key", w.ID, "attempt", attemptID, "err", err)
		return Disposition{Kind: Nak, Delay: time.Second}
	}
	s.relay.Kick()
	s.attempts.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", res.Outcome), attribute.String("region", s.cfg.Region)))
	next := "handed_to_committer"
	switch {
	case disp.Kind == Nak && res.Outcome == OutcomeInvalidOutput:
		next = "repair"
	case disp.Kind == Nak:
		next = "retry"
	case ended:
		next = "ended"
	case res.Outcome == OutcomeStaleLease:
		next = "recorded_stale"
	}
	telemetry.Decision(ctx, s.d.Log, w.ID, res.Outcome, orDefault(reason, "model answered"),
		slog.String("attempt", attemptID), slog.String("next", next), slog.Duration("delay", disp.Delay))
	return disp
}

// handoff keeps the lease while the committer decides, written in the
// transaction that hands the answer over: no record, no handoff.
func (s *Service) handoff(ctx context.Context, workID, token string) func(pgx.Tx) error {
	return func(tx pgx.Tx) error {
		_, err := s.d.Store.ExtendLeaseTx(ctx, tx, workID, token, s.cfg.HandoffTTL)
		return err
	}
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
		Messages: model.Messages(c.Prompt, model.Correlation{WorkID: w.ID, SchemaVersion: w.SchemaVersion,
			TaxonomyVersion: w.TaxonomyVersion}, repair, json.RawMessage(w.Input)),
		MaxTokens: s.cfg.MaxOutputUnits,
	}
}

// Estimate bounds one attempt's cost from above: the request's bytes over
// BytesPerUnit as its units, and the answer at its cap.
func (s *Service) Estimate(c *contract.Contract, w *store.Work) int64 {
	call := s.modelCall(c, w)
	in := len(call.Schema)
	for _, m := range call.Messages {
		in += len(m.Content)
	}
	units := int64(math.Ceil(float64(in) / s.cfg.BytesPerUnit))
	return s.cfg.Prices.CostMicros(s.cfg.Model, units, int64(s.cfg.MaxOutputUnits))
}

// signal is what one call tells the limiter: success with its latency,
// or congestion (a 429 or a timeout). Anything else says nothing about the
// provider's capacity.
func signal(reply *model.Reply, err error) admission.Signal {
	var mErr *model.Error
	errors.As(err, &mErr)
	switch {
	case err == nil && reply != nil:
		return admission.Signal{Kind: admission.Success, Latency: reply.Latency}
	case mErr != nil && mErr.Kind == model.KindRateLimited:
		return admission.Signal{Kind: admission.RateLimited}
	case mErr != nil && mErr.Kind == model.KindTimeout:
		return admission.Signal{Kind: admission.Timeout}
	case mErr != nil && mErr.Kind == model.KindMalformed && reply != nil:
		return admission.Signal{Kind: admission.Success, Latency: reply.Latency}
	}
	return admission.Signal{Kind: admission.Ignore}
}

func retryOutcome(err error, mErr *model.Error) string {
	switch {
	case errors.Is(err, context.Canceled):
		return OutcomeCanceled
	case mErr == nil:
		return OutcomeTransport
	case mErr.Kind == model.KindRateLimited:
		return OutcomeRateLimited
	case mErr.Kind == model.KindTimeout:
		return OutcomeTimeout
	case mErr.Kind == "canceled":
		return OutcomeCanceled
	}
	return OutcomeTransport
}

func (s *Service) finishUnleased(ctx context.Context, w *store.Work, outcome, reason string) Disposition {
	ok, err := s.d.Store.FinishUnleased(ctx, w.ID, outcome, reason)
	if err != nil {
		s.d.Log.Warn("finish failed", "key", w.ID, "err", err)
		return Disposition{Kind: Nak, Delay: time.Second}
	}
	if ok {
		telemetry.Decision(ctx, s.d.Log, w.ID, outcome, reason)
	} else {
		telemetry.Decision(ctx, s.d.Log, w.ID, "claim_lost", "work is held by a live lease or already ended")
	}
	return Disposition{Kind: Ack}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
