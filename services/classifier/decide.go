package classifier

import (
	"context"
	"errors"
	"fmt"
	"time"

	"assay.dev/pkg/consumer"
	"assay.dev/pkg/event"
	"assay.dev/pkg/gate"
	"assay.dev/pkg/model"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

// The classifier's decisions are pure functions of what it knows at the
// moment it decides; process.go carries them out. Each decision names the
// disposition of the message that carried the work.

// step is a decision taken before the model call.
type step struct {
	// proceed: go on to the next stage.
	proceed bool
	// finish, when set, ends the unleased work with this outcome.
	finish string
	// decision is logged when the work is neither tried nor finished.
	decision string
	reason   string
	disp     consumer.Disposition
}

func proceed() step { return step{proceed: true} }

func finishWith(state, reason string) step {
	return step{finish: state, reason: reason, disp: consumer.Done()}
}

func skip(decision, reason string, disp consumer.Disposition) step {
	return step{decision: decision, reason: reason, disp: disp}
}

// screen decides on an announcement before anything is read: another
// cell's work is refused, and work too close to its deadline is passed over
// (the sweeper ends it expired) so it never takes a permit live work needs.
func screen(ev event.Work, region string, now time.Time, need time.Duration) step {
	if why, foreign := event.ForeignRegion("work", ev.Region, region); foreign {
		return skip("refused", why, consumer.Refuse())
	}
	if left := ev.DeadlineAt.Sub(now); !ev.DeadlineAt.IsZero() && left < need {
		return skip("passed_over", shortOfTime(left, need)+"; the sweeper ends it expired", consumer.Done())
	}
	return proceed()
}

// admit decides on the work row the announcement points to.
func admit(ev event.Work, w *store.Work, now time.Time, need time.Duration, maxAttempts int, contractKnown bool) step {
	switch {
	case w.TenantID != ev.TenantID:
		return skip("refused", "message tenant does not match the work's tenant", consumer.Refuse())
	case w.Terminal():
		return skip(w.State, "already terminal; duplicate delivery ignored", consumer.Done())
	case !now.Before(w.DeadlineAt):
		return finishWith(outcome.Expired, "deadline passed before an attempt could start")
	case w.DeadlineAt.Sub(now) < need:
		return finishWith(outcome.Expired, shortOfTime(w.DeadlineAt.Sub(now), need))
	case counted(w, false) >= maxAttempts:
		return finishWith(outcome.RetryExhausted, fmt.Sprintf("all %d attempts spent", maxAttempts))
	case !contractKnown:
		return finishWith(outcome.TransportRejected, fmt.Sprintf("contract %q is not known to this worker", w.Contract))
	}
	return proceed()
}

// afford decides on the budget reservation for an attempt estimated at
// est. delay is how long a busy budget waits before it is asked again.
func afford(res store.Reservation, w *store.Work, est int64, now time.Time, delay time.Duration) step {
	switch res {
	case store.Exhausted:
		return finishWith(outcome.BudgetExhausted,
			fmt.Sprintf("tenant %s's budget cannot cover an attempt estimated at %d micro-dollars", w.TenantID, est))
	case store.Busy:
		// Attempts in flight hold the rest; they settle at their real
		// cost, which may leave room. Ask again later holding nothing.
		if now.Add(delay).After(w.DeadlineAt) {
			return finishWith(outcome.BudgetExhausted,
				fmt.Sprintf("tenant %s's budget is held by attempts in flight past this work's deadline", w.TenantID))
		}
		return skip("deferred", "budget held by attempts in flight", consumer.Retry(delay))
	}
	return proceed()
}

// shortOfTime says why work with left before its deadline is not tried.
func shortOfTime(left, need time.Duration) string {
	return fmt.Sprintf("%s left before the deadline; an accepted answer needs about %s",
		left.Round(time.Millisecond), need.Round(time.Millisecond))
}

// answer is what one attempt's call came back with, and what the worker
// knows when it decides about it.
type answer struct {
	// stillMine: the lease was still the attempt's after the call.
	stillMine bool
	// err is the call's error; nil when the model answered.
	err error
	// output reached the gate: the model's content, or a 2xx body that is
	// not a usable answer (its fault is the gate's to name).
	output    string
	hasOutput bool
	// fail is the gate's verdict on output; nil when it passed or did not
	// run.
	fail *gate.Failure

	attempts, repairs int
	now, deadline     time.Time
	// backoff is the jittered delay to use when the provider gives none.
	backoff time.Duration
	// retryRefusals: the contract has a refusal tried again rather than
	// ended (contract.RefusalRetry).
	retryRefusals bool
	// outputCap is the answer cap this call had; raisedCap the cap a
	// re-ask after a cut answer gets, 0 when the cap was raised already.
	outputCap, raisedCap int
	// outage: the call failed because the provider is unreachable (the
	// cell's circuit for the work's model is open, or this call opened it);
	// condition says so, for the reason of work that ends.
	outage    bool
	condition string
}

// counted are the attempts at w its budget counts: those lost to a
// provider outage are not, this one included when outage says so.
func counted(w *store.Work, outage bool) int {
	n := w.Attempts - w.OutageAttempts
	if outage {
		n--
	}
	return n
}

// limits bound retries and repairs.
type limits struct {
	maxAttempts, maxRepairs int
}

// verdict is the classifier's decision on one attempt: the attempt's
// outcome, what happens to the work, the RESULT event's Final flag, and
// the disposition of the message.
type verdict struct {
	outcome, reason string
	change          store.WorkChange
	workOutcome     string
	workReason      string
	repairNote      string
	// outputCap is the next attempt's raised answer cap, 0 to keep it.
	outputCap int
	final     bool
	disp      consumer.Disposition
	// next names what follows, for the decision log.
	next string
}

// judge decides what one attempt's answer means.
func judge(a answer, l limits) verdict {
	var mErr *model.Error
	errors.As(a.err, &mErr)
	switch {
	case !a.stillMine:
		// Lost, or superseded while the call ran: recorded, never published.
		return verdict{outcome: outcome.AttemptStaleLease, reason: "lease lost during the model call",
			final: true, disp: consumer.Done(), next: "recorded_stale"}
	case a.hasOutput && a.fail == nil:
		return verdict{outcome: outcome.AttemptOK, change: store.Handoff, final: true, disp: consumer.Done(),
			next: "handed_to_committer"}
	case a.hasOutput:
		return judgeInvalid(a, l)
	case mErr != nil && mErr.Kind == model.KindRejected:
		return verdict{outcome: outcome.AttemptTransportRejected, reason: mErr.Public(), change: store.Finish,
			workOutcome: outcome.TransportRejected, workReason: mErr.Public(), final: true, disp: consumer.Done(), next: "ended"}
	case mErr != nil && (mErr.Kind == model.KindRefused || mErr.Kind == model.KindFiltered) && !a.retryRefusals:
		// The model or the provider declined this input: asking again
		// gets the same answer, so the work ends, and the refusal is kept
		// with the attempt.
		return verdict{outcome: retryOutcome(a.err, mErr), reason: mErr.Public(), change: store.Finish,
			workOutcome: outcome.TransportRejected, workReason: mErr.Public(), final: true, disp: consumer.Done(), next: "ended"}
	case mErr != nil && mErr.Kind == model.KindTruncated:
		return judgeTruncated(a, mErr, l)
	}
	return judgeRetry(a, mErr, l)
}

// judgeTruncated decides on an answer cut at its cap. A repair at the same
// cap would be cut again, so none is asked: the work is asked once more
// with the cap raised (its reservation is priced at the new cap, so the
// budget still decides), and a second cut ends it.
func judgeTruncated(a answer, mErr *model.Error, l limits) verdict {
	v := verdict{outcome: outcome.AttemptTruncated, reason: mErr.Public(), final: true}
	switch {
	case a.raisedCap > a.outputCap && a.attempts < l.maxAttempts && a.now.Before(a.deadline):
		v.change, v.outputCap, v.disp, v.next = store.Requeue, a.raisedCap, consumer.Retry(0), "retry_raised_cap"
	default:
		v.change, v.workOutcome, v.disp, v.next = store.Finish, outcome.RetryExhausted, consumer.Done(), "ended"
		v.workReason = fmt.Sprintf("the answer was cut at its cap of %d units", a.outputCap)
		if a.raisedCap == 0 {
			v.workReason += ", already raised once"
		}
	}
	return v
}

// judgeInvalid decides on an answer the gate refused: a bounded repair
// re-ask that tells the model what failed, else the committer rejects it.
func judgeInvalid(a answer, l limits) verdict {
	v := verdict{outcome: outcome.AttemptInvalidOutput, reason: a.fail.Error(), change: store.Handoff,
		final: true, disp: consumer.Done(), next: "handed_to_committer"}
	// A stale taxonomy or a changed digest is the work's, not the answer's:
	// no re-ask can pass, so none is paid for.
	unfixable := a.fail.Code == gate.CodeTaxonomyVersion || a.fail.Code == gate.CodeDigest
	if !unfixable && a.repairs < l.maxRepairs && a.attempts < l.maxAttempts {
		v.change, v.repairNote, v.final = store.Requeue, a.fail.Error(), false
		v.disp, v.next = consumer.Retry(0), "repair"
	}
	return v
}

// judgeRetry decides on a call that brought no answer: try again after the
// provider's Retry-After, exactly, or the backoff, within the attempt
// budget and the deadline.
func judgeRetry(a answer, mErr *model.Error, l limits) verdict {
	v := verdict{outcome: retryOutcome(a.err, mErr), reason: publicText(a.err), final: true}
	delay := a.backoff
	if mErr != nil && mErr.RetryAfter > 0 {
		delay = mErr.RetryAfter // honoured exactly, never early
	}
	switch {
	case v.outcome == outcome.AttemptCanceled:
		// The worker stopped: the work goes back at once, whatever its
		// attempts, for another worker.
		v.change, v.disp, v.next = store.Requeue, consumer.Retry(0), "retry"
	case a.attempts < l.maxAttempts && a.now.Add(delay).Before(a.deadline):
		v.change, v.disp, v.next = store.Requeue, consumer.Retry(delay), "retry"
	default:
		v.change, v.workOutcome, v.disp, v.next = store.Finish, outcome.RetryExhausted, consumer.Done(), "ended"
		v.workReason = fmt.Sprintf("%s after %d of %d attempts", v.outcome, a.attempts, l.maxAttempts)
		if !a.now.Add(delay).Before(a.deadline) {
			v.workReason = fmt.Sprintf("%s and the next try would pass the deadline", v.outcome)
		}
		if a.outage {
			// The provider's condition, not this work's: no person's to judge.
			v.workReason = a.condition + "; " + v.workReason
		}
	}
	return v
}

// retryOutcome names a call that brought no answer.
func retryOutcome(err error, mErr *model.Error) string {
	switch {
	case errors.Is(err, context.Canceled):
		return outcome.AttemptCanceled
	case mErr == nil:
		return outcome.AttemptTransportError
	case mErr.Kind == model.KindRateLimited:
		return outcome.AttemptRateLimited
	case mErr.Kind == model.KindTimeout:
		return outcome.AttemptTimeout
	case mErr.Kind == model.KindCanceled:
		return outcome.AttemptCanceled
	case mErr.Kind == model.KindRefused:
		return outcome.AttemptRefused
	case mErr.Kind == model.KindFiltered:
		return outcome.AttemptContentFiltered
	case mErr.Kind == model.KindToolCall:
		return outcome.AttemptToolCall
	case mErr.Kind == model.KindTruncated:
		return outcome.AttemptTruncated
	}
	return outcome.AttemptTransportError
}

// output is what of a call's result reaches the gate: the model's content,
// or a 2xx body that is not a usable chat completion (truncated or
// garbled), which the gate names as the invalid output it is.
func output(reply *model.Reply, err error) (string, bool) {
	var mErr *model.Error
	switch {
	case err == nil && reply != nil:
		return reply.Content, true
	case errors.As(err, &mErr) && mErr.Kind == model.KindMalformed && reply != nil:
		return string(reply.Raw), true
	}
	return "", false
}

// errText is an error as an operator's record says it, "" for none.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// publicText is a call's error as an attempt's reason says it, which its
// tenant reads: a model error's public words (never the provider's text or
// address; the decision log carries those), else the error.
func publicText(err error) string {
	var mErr *model.Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &mErr):
		return mErr.Public()
	}
	return err.Error()
}

// framingUnits is room for the units a provider counts beyond the bytes
// sent or answered: message framing, a reasoning model's hidden thoughts up
// to the cap.
const framingUnits = 1024

// plausible reports whether a provider's usage could be true of one call
// that sent reqBytes and answered ansBytes under a cap of maxTokens. No
// tokenizer makes more than one unit of a byte, so each count is bounded by
// what it counts; a negative count is never true.
func plausible(u model.Usage, reqBytes, ansBytes, maxTokens int) bool {
	return u.PromptTokens >= 0 && u.CompletionTokens >= 0 &&
		u.PromptTokens <= reqBytes+framingUnits &&
		u.CompletionTokens <= max(maxTokens, ansBytes)+framingUnits
}
