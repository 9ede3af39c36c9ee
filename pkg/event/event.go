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

// ValidToken reports whether s can be used as one subject token.
func ValidToken(s string) bool { return tokenRE.MatchString(s) }

// ValidLane reports whether s is a lane.
func ValidLane(s string) bool { return s == Interactive || s == Batch }

// WorkSubject is where work for a tenant is announced.
func WorkSubject(region, lane, tenant string) string {
	return "assay." + region + ".work." + lane + "." + tenant
}

// LaneSubjects is the filter of one lane's work in a cell.
func LaneSubjects(region, lane string) string { return "assay." + region + ".work." + lane + ".>" }

// CancelSubject is where a cell tells its classifiers to stop a model call
// for work that no longer needs it (a newer revision superseded it). It is
// captured by the WORK stream, so cancels can be replayed with the work, but
// no lane consumer reads it: every classifier subscribes to it directly.
func CancelSubject(region, tenant string) string { return "assay." + region + ".work.cancel." + tenant }

// CancelSubjects is the filter of a cell's cancels.
func CancelSubjects(region string) string { return "assay." + region + ".work.cancel.>" }

// ResultSubject carries every attempt's output.
func ResultSubject(region, tenant string) string { return "assay." + region + ".result." + tenant }

// AttemptSubject carries every attempt's usage.
func AttemptSubject(region, tenant string) string { return "assay." + region + ".attempt." + tenant }

// Stream kinds.
const (
	KindWork    = "WORK"
	KindResult  = "RESULT"
	KindAttempt = "ATTEMPT"
)

// StreamName is e.g. WORK_US.
func StreamName(kind, region string) string { return kind + "_" + strings.ToUpper(region) }

// StreamPrefix is what every subject of a cell's stream of one kind starts
// with, e.g. "assay.us.work.".
func StreamPrefix(kind, region string) string {
	return "assay." + region + "." + strings.ToLower(kind) + "."
}

// StreamSubjects is the subject filter of a cell's stream of one kind.
func StreamSubjects(kind, region string) string { return StreamPrefix(kind, region) + ">" }

// WorkMsgID is the Nats-Msg-Id of a work announcement: the work id and the
// dispatch number, so a re-announcement inside the window is not stored twice.
func WorkMsgID(workID string, dispatch int) string { return fmt.Sprintf("%s.%d", workID, dispatch) }

// Work announces a work item. The worker reads everything else from the
// cell's database: the message is a pointer, Postgres is the record.
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
	Final  bool   `json:"final"`
	Output string `json:"output,omitempty"`
}

// Attempt is one attempt's usage, for the ledger.
type Attempt struct {
	AttemptID        string    `json:"attemptId"`
	WorkID           string    `json:"workId"`
	TenantID         string    `json:"tenantId"`
	Region           string    `json:"region"`
	Number           int       `json:"number"`
	Model            string    `json:"model"`
	Outcome          string    `json:"outcome"`
	UpstreamAttempts int       `json:"upstreamAttempts"`
	InputUnits       int64     `json:"inputUnits"`
	OutputUnits      int64     `json:"outputUnits"`
	LatencyMS        int64     `json:"latencyMs"`
	At               time.Time `json:"at"`
}

// MaxEventBytes caps any event a consumer will decode.
const MaxEventBytes = 1 << 20

// Decode reads an event strictly: one JSON object, known fields only, then
// checks the fields every consumer relies on.
func Decode(data []byte, v interface{ check() error }) error {
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
	case !ValidToken(a.TenantID):
		return fmt.Errorf("event: attempt: bad tenantId %q", a.TenantID)
	case a.Outcome == "":
		return errors.New("event: attempt: outcome missing")
	case a.InputUnits < 0 || a.OutputUnits < 0:
		return errors.New("event: attempt: negative units")
	}
	return nil
}
