// Package event defines what travels on a cell's streams: subjects, stream
// settings and the envelopes of WORK, RESULT and ATTEMPT messages.
package event

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Lanes.
const (
	Interactive = "interactive"
	Batch       = "batch"
)

// tokenRE keeps tenant ids and other subject tokens subject-safe: no dots,
// wildcards or whitespace.
var tokenRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// uuidRE is the text form of an attempt id or lease token.
var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// ValidToken reports whether s can be used as one subject token.
func ValidToken(s string) bool { return tokenRE.MatchString(s) }

// Lanes are every lane, interactive first.
var Lanes = []string{Interactive, Batch}

// ValidLane reports whether s is a lane.
func ValidLane(s string) bool { return s == Interactive || s == Batch }

// Stream kinds.
const (
	KindWork    = "WORK"
	KindResult  = "RESULT"
	KindAttempt = "ATTEMPT"
	// KindOutcome carries each work item's outcome, from the committer's
	// commit transaction to its publisher.
	KindOutcome = "OUTCOME"
)

// Kinds lists the stream kinds of a cell, in the order work flows through
// them.
var Kinds = []string{KindWork, KindResult, KindAttempt, KindOutcome}

// DefaultInstallation names an installation that sets none.
const DefaultInstallation = "assay"

// Names are the names one cell of one installation uses on NATS: its
// subjects, streams and durables. Everything is named by cell id, which
// defaults to the region's name, and prefixed by the installation, so
// several installations can share a NATS cluster and a region can later
// hold several cells.
type Names struct {
	// Installation prefixes every subject, stream and durable. It must be
	// a subject token. Default "assay".
	Installation string
	// Cell is the cell id, e.g. "us". Required; a subject token.
	Cell string
}

// Check reports a name that cannot be used.
func (n Names) Check() error {
	if !ValidToken(n.inst()) {
		return fmt.Errorf("event: installation %q is not a subject token (lower-case letters, digits, hyphens)", n.Installation)
	}
	if !ValidToken(n.Cell) {
		return fmt.Errorf("event: cell %q is not a subject token (lower-case letters, digits, hyphens)", n.Cell)
	}
	return nil
}

func (n Names) inst() string {
	if n.Installation == "" {
		return DefaultInstallation
	}
	return n.Installation
}

// Work is where work for a tenant is announced.
func (n Names) Work(lane, tenant string) string { return n.Prefix(KindWork) + lane + "." + tenant }

// Lane is the filter of one lane's work in the cell.
func (n Names) Lane(lane string) string { return n.Prefix(KindWork) + lane + ".>" }

// Cancel is where the cell tells its classifiers to stop a model call for
// work that no longer needs it (a newer revision superseded it). It is
// captured by the WORK stream, so cancels can be replayed with the work, but
// no lane consumer reads it: every classifier subscribes to it directly.
func (n Names) Cancel(tenant string) string { return n.Prefix(KindWork) + "cancel." + tenant }

// Cancels is the filter of the cell's cancels.
func (n Names) Cancels() string { return n.Prefix(KindWork) + "cancel.>" }

// Result carries every attempt's output.
func (n Names) Result(tenant string) string { return n.Prefix(KindResult) + tenant }

// Attempt carries every attempt's usage.
func (n Names) Attempt(tenant string) string { return n.Prefix(KindAttempt) + tenant }

// Outcome carries work outcomes for a tenant.
func (n Names) Outcome(tenant string) string { return n.Prefix(KindOutcome) + tenant }

// OutcomeConsumer is the durable that consumes the cell's OUTCOME stream
// (the publisher's, inside the committer service).
func (n Names) OutcomeConsumer() string { return n.Durable("publisher") }

// Stream is the name of the cell's stream of one kind, e.g. ASSAY_WORK_US.
func (n Names) Stream(kind string) string {
	return streamToken(n.inst()) + "_" + kind + "_" + streamToken(n.Cell)
}

// Prefix is what every subject of the cell's stream of one kind starts
// with, e.g. "assay.us.work.".
func (n Names) Prefix(kind string) string {
	return n.inst() + "." + n.Cell + "." + strings.ToLower(kind) + "."
}

// Subjects is the subject filter of the cell's stream of one kind.
func (n Names) Subjects(kind string) string { return n.Prefix(kind) + ">" }

// Durable is the name of a durable consumer of the installation, e.g.
// assay-committer.
func (n Names) Durable(name string) string { return n.inst() + "-" + name }

// WorkConsumer is the durable that consumes one lane of the cell's WORK
// stream (the classifier's); ingress reads its progress to tell lost
// announcements from a backlog.
func (n Names) WorkConsumer(lane string) string { return n.Durable("classifier-" + lane) }

// ResultConsumer is the committer's durable, on the ATTEMPT stream (the
// results attempts carry) and on the RESULT stream (results a classifier
// of an earlier release published on their own).
func (n Names) ResultConsumer() string { return n.Durable("committer") }

// AttemptConsumer is the ledger's durable on the cell's ATTEMPT stream.
func (n Names) AttemptConsumer() string { return n.Durable("ledger") }

// StreamDurable is a durable consumer and the stream it reads.
type StreamDurable struct {
	Stream, Durable string
}

// Durables are every durable consumer of the cell, in the order work flows
// through them: the classifier's per lane on WORK, the committer's on
// RESULT and ATTEMPT, the ledger's on ATTEMPT, the publisher's on OUTCOME.
func (n Names) Durables() []StreamDurable {
	var out []StreamDurable
	for _, lane := range Lanes {
		out = append(out, StreamDurable{n.Stream(KindWork), n.WorkConsumer(lane)})
	}
	return append(out, StreamDurable{n.Stream(KindResult), n.ResultConsumer()},
		StreamDurable{n.Stream(KindAttempt), n.ResultConsumer()},
		StreamDurable{n.Stream(KindAttempt), n.AttemptConsumer()},
		StreamDurable{n.Stream(KindOutcome), n.OutcomeConsumer()})
}

// streamToken is a subject token as stream names spell it.
func streamToken(s string) string { return strings.ToUpper(strings.ReplaceAll(s, "-", "_")) }

// ForeignRegion says whether a message of region reaching the cell that
// serves served belongs to another cell, and then why it is refused, naming
// both: a cell takes only its own region's work, results and attempts,
// never acting on another's. what names the message ("work", "result",
// "attempt").
func ForeignRegion(what, region, served string) (reason string, foreign bool) {
	if region == served {
		return "", false
	}
	return fmt.Sprintf("%s of region %s reached the %s cell", what, region, served), true
}

// WorkMsgID is the Nats-Msg-Id of a work announcement: the work id and the
// dispatch number, so a re-announcement inside the window is not stored twice.
func WorkMsgID(workID string, dispatch int) string { return fmt.Sprintf("%s.%d", workID, dispatch) }

// Work announces a work item. The message is a pointer, Postgres is the
// record: what the worker does not read from the row it takes from the
// facts beside the message (FactsHeader), and its claim checks them.
type Work struct {
	WorkID   string `json:"workId"`
	TenantID string `json:"tenantId"`
	Region   string `json:"region"`
	Lane     string `json:"lane"`
	Dispatch int    `json:"dispatch"`
	// DeadlineAt is the work's deadline when it was announced, so a worker
	// can pass over work that cannot finish in time without reading it.
	DeadlineAt time.Time `json:"deadlineAt,omitzero"`
}

// NoCallHeader marks an ATTEMPT event of an attempt that made no call of
// its own (Attempt.NoCall), in its outbox row too: the ledger's read-back
// passes over those rows without reading their payloads.
const NoCallHeader = "Assay-No-Call"

// FactsHeader is the header of a work announcement that carries the
// work's facts (WorkFacts, as JSON). A header and not a field: a reader
// that does not know it decodes the announcement as before.
const FactsHeader = "Assay-Work-Facts"

// WorkFacts are what the work row said when it was announced: enough for a
// worker to decide on the work, estimate its call and claim it without
// reading the row first. They are a hint, never the record: the claim made
// on them expects each of them of the row (store.Expect), and a worker
// whose claim finds the row changed reads it and decides again.
type WorkFacts struct {
	Contract        string    `json:"contract"`
	SchemaVersion   string    `json:"schemaVersion"`
	TaxonomyVersion string    `json:"taxonomyVersion"`
	PromptDigest    string    `json:"promptDigest,omitempty"`
	Model           string    `json:"model,omitempty"`
	InputBytes      int       `json:"inputBytes"`
	Attempts        int       `json:"attempts"`
	OutageAttempts  int       `json:"outageAttempts"`
	Repairs         int       `json:"repairs"`
	OutputCap       int       `json:"outputCap,omitempty"`
	DeadlineAt      time.Time `json:"deadlineAt"`
	// ReadyAt is when the work became ready to run: its last change, or
	// the retry it waited for.
	ReadyAt time.Time `json:"readyAt"`
}

// ParseFacts reads a FactsHeader value; ok is false for one that is
// missing or does not decode strictly (Decode).
func ParseFacts(v string) (f WorkFacts, ok bool) {
	if v == "" || Decode([]byte(v), &f) != nil {
		return WorkFacts{}, false
	}
	return f, true
}

func (f *WorkFacts) check() error {
	if f.Contract == "" || f.DeadlineAt.IsZero() {
		return errors.New("event: work facts: contract and deadlineAt are required")
	}
	return nil
}

// Cancel asks whoever runs a model call for the work to stop it.
type Cancel struct {
	WorkID   string `json:"workId"`
	TenantID string `json:"tenantId"`
	Region   string `json:"region"`
	Reason   string `json:"reason"`
}

func (c *Cancel) check() error {
	switch {
	case c.WorkID == "":
		return errors.New("event: cancel: workId missing")
	case !ValidToken(c.TenantID):
		return fmt.Errorf("event: cancel: bad tenantId %q", c.TenantID)
	}
	return nil
}

// Result is one attempt's output, handed to the committer.
type Result struct {
	AttemptID       string `json:"attemptId"`
	WorkID          string `json:"workId"`
	TenantID        string `json:"tenantId"`
	Region          string `json:"region"`
	Number          int    `json:"number"`
	LeaseToken      string `json:"leaseToken"`
	Contract        string `json:"contract"`
	SchemaVersion   string `json:"schemaVersion"`
	TaxonomyVersion string `json:"taxonomyVersion"`
	Digest          string `json:"digest"`
	// Outcome is the attempt's outcome as the worker saw it: ok,
	// invalid_output, rate_limited, timeout, transport_error,
	// transport_rejected or stale_lease.
	Outcome string `json:"outcome"`
	Reason  string `json:"reason,omitempty"`
	// Final is false when a repair attempt follows this one.
	Final bool `json:"final"`
	// The answer itself stays in the cell's database with the attempt, so
	// no event grows with it: the committer reads it by AttemptID.
}

// Attempt is the one event of an attempt, on the ATTEMPT stream: the
// usage of its model call, for the ledger, and the result it came to,
// for the committer. A call that is one part of a review in parts has no
// result of its own (the review's last attempt carries it); an attempt
// that made no call of its own (NoCall) has no usage.
type Attempt struct {
	AttemptID string `json:"attemptId"`
	WorkID    string `json:"workId"`
	TenantID  string `json:"tenantId"`
	Region    string `json:"region"`
	Number    int    `json:"number"`
	// Model is the model the classifier asked for: what the budget was
	// reserved at and what the ledger prices.
	Model string `json:"model"`
	// ServedModel is the name the provider answered with, when it differs
	// (gpt-4o-mini answered as gpt-4o-mini-2024-07-18); recorded beside.
	ServedModel      string    `json:"servedModel,omitempty"`
	Outcome          string    `json:"outcome"`
	UpstreamAttempts int       `json:"upstreamAttempts"`
	InputUnits       int64     `json:"inputUnits"`
	OutputUnits      int64     `json:"outputUnits"`
	LatencyMS        int64     `json:"latencyMs"`
	At               time.Time `json:"at"`
	// CachedInputUnits are the part of InputUnits the provider read from
	// its prompt cache (usage.prompt_tokens_details.cached_tokens), which
	// the ledger prices at the table's cached-input price; ReasoningUnits
	// the part of OutputUnits spent on hidden reasoning
	// (completion_tokens_details.reasoning_tokens), billed as output. Both
	// are 0 for an estimate. Left out when 0, so an event without them is
	// the form earlier releases read; their strict decoders refuse one
	// that carries them, so a classifier writes none while such a ledger
	// or committer runs (ASSAY_ATTEMPT_EVENTS=split).
	CachedInputUnits int64 `json:"cachedInputUnits,omitempty"`
	ReasoningUnits   int64 `json:"reasoningUnits,omitempty"`
	// Estimated: the call left and brought no usage back (a timeout, a
	// cancel, a 5xx), so InputUnits is the request's estimate and the
	// ledger marks the row estimated.
	Estimated bool `json:"estimated,omitempty"`
	// Batch: the attempt was one line of a provider batch (the Batch API),
	// priced at the table's batch price.
	Batch bool `json:"batch,omitempty"`
	// NoCall: the attempt ended without a model call of its own (a review
	// in parts ending, claimed work ended before its call); the ledger has
	// no row to write for it.
	NoCall bool `json:"noCall,omitempty"`
	// Result is what the attempt came to, for the committer, which checks
	// it (AttemptResult); the ledger records the call whatever it says.
	Result *Result `json:"result,omitempty"`
}

// OutcomeMsgID is the Nats-Msg-Id of an outcome event, and the outcome's
// id: the work id and its outcome. A work dropped and then re-admitted has
// two outcomes, and two ids.
func OutcomeMsgID(workID, outcome string) string { return workID + "." + outcome }

// Outcome says a work item reached its outcome. The publisher reads the
// result and the source from the cell's database.
type Outcome struct {
	OutcomeID string `json:"outcomeId"`
	WorkID    string `json:"workId"`
	TenantID  string `json:"tenantId"`
	Region    string `json:"region"`
	// Outcome is the work's terminal state: accepted, schema_rejected, …
	Outcome string    `json:"outcome"`
	At      time.Time `json:"at"`
}

func (o *Outcome) check() error {
	switch {
	case o.WorkID == "" || o.Outcome == "":
		return errors.New("event: outcome: workId and outcome are required")
	case o.OutcomeID != OutcomeMsgID(o.WorkID, o.Outcome):
		return errors.New("event: outcome: outcomeId is not workId.outcome")
	case !ValidToken(o.TenantID):
		return fmt.Errorf("event: outcome: bad tenantId %q", o.TenantID)
	}
	return nil
}

// MaxEventBytes caps any event a consumer will decode.
const MaxEventBytes = 1 << 20

// Decode reads an event strictly: one JSON object, known fields only, then
// checks the fields every consumer relies on.
func Decode(data []byte, v checker) error {
	if len(data) > MaxEventBytes {
		return fmt.Errorf("event: %d bytes is over the %d limit", len(data), MaxEventBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("event: %w", err)
	}
	if dec.More() {
		return errors.New("event: trailing data")
	}
	return v.check()
}

// checker is an event that checks its own fields after decoding.
type checker interface{ check() error }

// Parse decodes data strictly as a T, as Decode does.
func Parse[T any, P interface {
	*T
	checker
}](data []byte) (T, error) {
	var v T
	err := Decode(data, P(&v))
	return v, err
}

func (w *Work) check() error {
	switch {
	case w.WorkID == "":
		return errors.New("event: work: workId missing")
	case !ValidToken(w.TenantID):
		return fmt.Errorf("event: work: bad tenantId %q", w.TenantID)
	case !ValidLane(w.Lane):
		return fmt.Errorf("event: work: bad lane %q", w.Lane)
	case w.Region == "":
		return errors.New("event: work: region missing")
	}
	return nil
}

func (r *Result) check() error {
	switch {
	case r.AttemptID == "" || r.WorkID == "" || r.LeaseToken == "":
		return errors.New("event: result: attemptId, workId and leaseToken are required")
	case !uuidRE.MatchString(r.AttemptID) || !uuidRE.MatchString(r.LeaseToken):
		return errors.New("event: result: attemptId and leaseToken must be UUIDs")
	case !ValidToken(r.TenantID):
		return fmt.Errorf("event: result: bad tenantId %q", r.TenantID)
	case r.Outcome == "":
		return errors.New("event: result: outcome missing")
	}
	return nil
}

func (a *Attempt) check() error {
	switch {
	case a.AttemptID == "" || a.WorkID == "":
		return errors.New("event: attempt: attemptId and workId are required")
	case !uuidRE.MatchString(a.AttemptID):
		return errors.New("event: attempt: attemptId must be a UUID")
	case !ValidToken(a.TenantID):
		return fmt.Errorf("event: attempt: bad tenantId %q", a.TenantID)
	case a.Outcome == "":
		return errors.New("event: attempt: outcome missing")
	case a.InputUnits < 0 || a.OutputUnits < 0 || a.CachedInputUnits < 0 || a.ReasoningUnits < 0:
		return errors.New("event: attempt: negative units")
	case a.NoCall && a.Result == nil:
		return errors.New("event: attempt: neither a call nor a result")
	}
	return nil
}

// AttemptResult decodes an ATTEMPT event for the committer: the result it
// carries, checked as a RESULT event is and naming the event's attempt,
// work and tenant; nil for a call that carries none (one part of a review
// in parts).
func AttemptResult(data []byte) (*Result, error) {
	a, err := Parse[Attempt](data)
	switch {
	case err != nil || a.Result == nil:
		return nil, err
	case a.Result.AttemptID != a.AttemptID || a.Result.WorkID != a.WorkID || a.Result.TenantID != a.TenantID:
		return nil, errors.New("event: attempt: its result names another attempt, work or tenant")
	}
	return a.Result, a.Result.check()
}
