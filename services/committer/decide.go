package committer

import (
	"fmt"

	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

// The committer's decisions are pure functions: triage says what a result
// event asks for, given the work as it is now; the verdict functions say
// what the store's guarded statements did. committer.go carries them out.

// action is what a result asks of the committer.
type action int

const (
	// record: not a final answer (a retry, a repair, a refusal, a stale
	// answer); the attempt row already holds it.
	record action = iota
	// refuse: the event names work this cell does not have for its tenant.
	refuse
	// markStale: the work already has its outcome; a second answer never
	// becomes a second result.
	markStale
	// reject: a final invalid answer, or one the committer cannot check,
	// ends the work schema_rejected.
	reject
	// check: run the gate, then commit or reject.
	check
)

// screen decides on ev before the work is read: only a final answer of
// this cell's needs it.
func screen(ev event.Result, region string) (action, string) {
	if why, foreign := event.ForeignRegion("result", ev.Region, region); foreign {
		return refuse, why
	}
	if ev.Outcome != outcome.AttemptOK && !(ev.Outcome == outcome.AttemptInvalidOutput && ev.Final) {
		// Retries, repairs, refusals and stale answers are the classifier's
		// to decide; the attempt row already holds them.
		return record, "not a final answer; recorded only"
	}
	return check, ""
}

// triage decides what a final answer asks for, given the work as it is
// now. w is nil when the work is not found; known says whether the work's
// contract is loaded here.
func triage(ev event.Result, w *store.Work, known bool) (action, string) {
	switch {
	case w == nil || w.TenantID != ev.TenantID:
		return refuse, "result names work this cell does not have for that tenant"
	case w.Terminal():
		return markStale, "work already " + w.State
	case ev.Outcome == outcome.AttemptInvalidOutput:
		return reject, ev.Reason
	case !known:
		return reject, fmt.Sprintf("contract %q is not known to this committer", w.Contract)
	}
	return check, ""
}

// verdict is the word and reason logged for what the store did.
type verdict struct {
	word, reason string
}

// Verdict words, as metrics and logs name them.
const (
	verdictAccepted  = outcome.Accepted
	verdictRejected  = outcome.SchemaRejected
	verdictLate      = outcome.Expired
	verdictStale     = outcome.AttemptStaleLease
	verdictDuplicate = "duplicate"
)

// committed says what Commit did with an answer that passed the gate.
func committed(v store.Verdict) verdict {
	switch v {
	case store.Late:
		return verdict{verdictLate, "deadline passed before the verdict; answer recorded, not published"}
	case store.Lost:
		return verdict{verdictStale, "lease lost before commit; answer recorded, not published"}
	}
	return verdict{verdictAccepted, "passed syntax, schema, correlation, grounding and policy"}
}

// rejected says what Reject did.
func rejected(ok bool, reason string) verdict {
	if !ok {
		return verdict{verdictStale, "lease lost before the rejection; recorded only"}
	}
	return verdict{verdictRejected, reason}
}

// marked says what MarkStale did with an answer for work that has its
// outcome: a redelivered verdict changes nothing, a second answer is
// recorded stale.
func marked(ok bool, state string) verdict {
	if !ok {
		return verdict{verdictDuplicate, "this answer's verdict is already recorded"}
	}
	return verdict{verdictStale, "work already " + state + "; answer recorded, not published"}
}
