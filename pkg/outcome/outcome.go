// Package outcome is assay's closed vocabulary of work states, work
// outcomes and attempt outcomes. The same words are used in the database
// (its CHECK constraints list them), in events, metrics, logs and the API.
package outcome

import "slices"

// Work states before an outcome.
const (
	Queued  = "queued"
	Running = "running"
	// Elsewhere is work of a tenant that moved to this cell which the cell
	// it moved from still finishes: the row holds its key here, and takes
	// its outcome once that cell has finished it.
	Elsewhere = "elsewhere"
)

// Work outcomes: every work item ends in exactly one.
const (
	// Accepted passed the whole gate; the only outcome that is published.
	Accepted = "accepted"
	// SchemaRejected: the output failed syntax, schema, correlation or
	// grounding and the repair budget is spent.
	SchemaRejected = "schema_rejected"
	// RetryExhausted: rate limits or transient faults outlasted the
	// attempt budget or the deadline.
	RetryExhausted = "retry_exhausted"
	// TransportRejected: the provider refused for good.
	TransportRejected = "transport_rejected"
	// Dropped: admission refused it; its reason says how to ask again.
	Dropped = "dropped"
	// Expired: its deadline passed before a result was accepted.
	Expired = "expired"
	// Superseded: a newer revision of the same source arrived.
	Superseded = "superseded"
	// Canceled: the caller canceled it.
	Canceled = "canceled"
	// BudgetExhausted: the tenant's budget could not cover another attempt.
	BudgetExhausted = "budget_exhausted"
)

// Reviewed is not a work state: it is the outcome published for work whose
// review item a person resolved from the console with an answer (approved
// as it was, or amended), after and instead of the work's own outcome. Its
// id is the work's id and "reviewed", so it is published once.
const Reviewed = "reviewed"

// ReasonProviderUnavailable starts the reason of work that ended without
// an answer because the provider was unreachable (the cell's circuit for
// the model was open): a condition of the cell, not an answer a person must
// judge, so it opens no review item.
const ReasonProviderUnavailable = "provider_unavailable"

// ReasonDiffTooLarge starts the reason of a pull request's review dropped
// because its diff was over the cell's cap: its diff was not kept, so it
// cannot be run again as it is; its pull request gets one comment saying
// so.
const ReasonDiffTooLarge = "diff_too_large"

// Terminal lists the work outcomes.
var Terminal = []string{Accepted, SchemaRejected, RetryExhausted, TransportRejected, Dropped, Expired,
	Superseded, Canceled, BudgetExhausted}

// WorkStates lists every state a work row can be in.
var WorkStates = append([]string{Queued, Running, Elsewhere}, Terminal...)

// IsTerminal reports whether state is a work outcome.
func IsTerminal(state string) bool { return slices.Contains(Terminal, state) }

// Attempt outcomes: how one claim and one model call ended.
const (
	// AttemptOK: the model answered and the answer passed the worker's gate.
	AttemptOK = "ok"
	// AttemptInvalidOutput: the model answered and the gate refused it.
	AttemptInvalidOutput = "invalid_output"
	// AttemptRateLimited: the provider answered 429.
	AttemptRateLimited = "rate_limited"
	// AttemptTimeout: the call outlasted its deadline.
	AttemptTimeout = "timeout"
	// AttemptTransportError: a transient fault (5xx, connection error).
	AttemptTransportError = "transport_error"
	// AttemptTransportRejected: the provider refused the call for good.
	AttemptTransportRejected = "transport_rejected"
	// AttemptStaleLease: an answer from a lease that was no longer the
	// work's (lost, superseded, or past the deadline); recorded, never
	// published.
	AttemptStaleLease = "stale_lease"
	// AttemptCanceled: the worker stopped and gave the work back.
	AttemptCanceled = "canceled"
	// AttemptLeaseExpired: the worker never reported back.
	AttemptLeaseExpired = "lease_expired"
	// AttemptRefused: the model declined to answer (a refusal).
	AttemptRefused = "refused"
	// AttemptContentFiltered: the provider's content filter stopped the
	// answer.
	AttemptContentFiltered = "content_filtered"
	// AttemptTruncated: the answer was cut at its max_tokens cap.
	AttemptTruncated = "truncated"
	// AttemptToolCall: the model called a tool instead of answering.
	AttemptToolCall = "tool_call"
	// AttemptBatchExpired: the provider's batch ended (expired, failed or
	// canceled) before this line ran; the provider bills it nothing.
	AttemptBatchExpired = "batch_expired"
	// AttemptBatchMissing: the provider's batch finished without a line
	// for this attempt in its output or error file.
	AttemptBatchMissing = "batch_missing"
)

// Attempts lists every attempt outcome.
var Attempts = []string{AttemptOK, AttemptInvalidOutput, AttemptRateLimited, AttemptTimeout,
	AttemptTransportError, AttemptTransportRejected, AttemptStaleLease, AttemptCanceled, AttemptLeaseExpired,
	AttemptRefused, AttemptContentFiltered, AttemptTruncated, AttemptToolCall, AttemptBatchExpired, AttemptBatchMissing}
