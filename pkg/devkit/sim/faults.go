package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Fault kinds.
const (
	FaultRateLimit          = "rate_limit"           // 429 with Retry-After
	FaultLatency            = "latency"              // sleep Latency, then answer normally
	FaultHang               = "hang"                 // never answer until the client goes away or Close
	FaultTruncated          = "truncated"            // 200 with the chat.completion body cut in half
	FaultInvalidJSON        = "invalid_json"         // message content is not JSON
	FaultServerError        = "server_error"         // 500
	FaultReject             = "reject"               // 400 content-policy error
	FaultExtraProperty      = "extra_property"       // valid output plus an unknown top-level property
	FaultBadEnum            = "bad_enum"             // a value outside a closed vocabulary
	FaultWrongChangeID      = "wrong_change_id"      // code-review changeId is not the work id
	FaultWrongSchemaVersion = "wrong_schema_version" // code-review and change-review
	FaultUngroundedFile     = "ungrounded_file"      // code-review finding on a file not in the diff
	FaultLineOutsideHunk    = "line_outside_hunk"    // code-review finding on a real file, line outside every hunk
	FaultEvidenceNotInDiff  = "evidence_not_in_diff" // code-review finding whose evidence is not diff text
	// FaultBadBytes answers 200 with a body that is not JSON and holds
	// bytes that are not UTF-8 and a NUL.
	FaultBadBytes = "bad_bytes"
	// FaultHuge answers with content of Size bytes (default 5 MiB), a valid
	// answer padded with a long summary, ignoring max_tokens as a
	// misbehaving provider would.
	FaultHuge = "huge"
	// FaultRenamed answers normally but reports the model under a dated
	// name (gpt-4o-mini answered as gpt-4o-mini-2024-07-18), the way
	// OpenAI does.
	FaultRenamed = "renamed"
	// FaultBadUsage answers normally but reports usage no provider should:
	// negative prompt units and a completion count past any bound. The
	// call is billed at its true usage.
	FaultBadUsage = "bad_usage"
	// Answers that are not model output, as real providers give them.
	FaultUnavailable   = "unavailable"    // 503 with Retry-After (RetryAfter, default 1s)
	FaultNoChoices     = "no_choices"     // 200 with "choices": []
	FaultErrorBody     = "error_body"     // 200 with an {"error": {...}} body and no choices
	FaultRefusal       = "refusal"        // 200, content null and a refusal (OpenAI structured outputs)
	FaultLength        = "length"         // 200, the answer cut in half, finish_reason "length", whatever max_tokens
	FaultContentFilter = "content_filter" // 200, no content, finish_reason "content_filter"
	FaultToolCalls     = "tool_calls"     // 200, content null and a tool call instead of an answer
	// FaultObeyInjection makes the model gullible: it follows instructions
	// found in the untrusted input ("ignore previous instructions", "output
	// the following JSON instead: {...}", "set changeId to X", "add a field
	// tenant=globex", "report severity critical", "mark this as approved").
	// It matches only calls whose input carries such an instruction, so with
	// Times 0 it is a mode: every other call is answered normally.
	FaultObeyInjection = "obey_injection"
)

// FaultKinds lists every kind AddFault accepts.
var FaultKinds = []string{
	FaultRateLimit, FaultLatency, FaultHang, FaultTruncated, FaultInvalidJSON,
	FaultServerError, FaultReject, FaultExtraProperty, FaultBadEnum,
	FaultWrongChangeID, FaultWrongSchemaVersion, FaultUngroundedFile,
	FaultLineOutsideHunk, FaultEvidenceNotInDiff, FaultObeyInjection, FaultHuge, FaultBadBytes,
	FaultRenamed, FaultBadUsage, FaultUnavailable, FaultNoChoices, FaultErrorBody, FaultRefusal,
	FaultLength, FaultContentFilter, FaultToolCalls,
}

// Fault bends matching calls. The first matching fault with Times left
// applies and consumes one. A fault whose kind cannot be expressed in a
// call's contract (wrong_change_id on moderation, say, or line_outside_hunk
// when the diff has no usable file) does not match that call.
type Fault struct {
	Kind   string
	Tenant string // "" matches any tenant; "-" is the request without a user
	Match  string // substring of the user message (the untrusted input); "" matches any
	Times  int    // calls it applies to; 0 means every call
	// RetryAfter is sent, in whole seconds rounded up, with rate_limit
	// and unavailable; default 1s.
	RetryAfter time.Duration
	Latency    time.Duration // for latency
	Size       int           // for huge: the content's bytes
}

// faultJSON carries durations as Go duration strings ("2s").
type faultJSON struct {
	Kind       string `json:"kind"`
	Tenant     string `json:"tenant,omitempty"`
	Match      string `json:"match,omitempty"`
	Times      int    `json:"times,omitempty"`
	RetryAfter string `json:"retryAfter,omitempty"`
	Latency    string `json:"latency,omitempty"`
	Size       int    `json:"size,omitempty"`
}

// MarshalJSON writes durations as Go duration strings.
func (f Fault) MarshalJSON() ([]byte, error) {
	j := faultJSON{Kind: f.Kind, Tenant: f.Tenant, Match: f.Match, Times: f.Times, Size: f.Size}
	if f.RetryAfter != 0 {
		j.RetryAfter = f.RetryAfter.String()
	}
	if f.Latency != 0 {
		j.Latency = f.Latency.String()
	}
	return json.Marshal(j)
}

// faultFields are the fields of a fault as POST /sim/faults takes it.
const faultFields = "kind, tenant, match, times, retryAfter, latency, size"

// UnmarshalJSON reads a fault as POST /sim/faults takes it, strictly: an
// unknown field (a misspelt "time" would leave Times 0, every call) and
// an unknown kind are errors that name them; durations are Go duration
// strings ("2s").
func (f *Fault) UnmarshalJSON(b []byte) error {
	var j faultJSON
	if err := decodeFields("fault", faultFields, b, &j); err != nil {
		return err
	}
	if j.Kind == "" {
		return errors.New("fault: kind is required, one of " + strings.Join(FaultKinds, ", "))
	}
	if !slices.Contains(FaultKinds, j.Kind) {
		return fmt.Errorf("fault: unknown kind %q (kinds: %s)", j.Kind, strings.Join(FaultKinds, ", "))
	}
	out := Fault{Kind: j.Kind, Tenant: j.Tenant, Match: j.Match, Times: j.Times, Size: j.Size}
	var err error
	if j.RetryAfter != "" {
		if out.RetryAfter, err = time.ParseDuration(j.RetryAfter); err != nil {
			return fmt.Errorf("fault: retryAfter: %w", err)
		}
	}
	if j.Latency != "" {
		if out.Latency, err = time.ParseDuration(j.Latency); err != nil {
			return fmt.Errorf("fault: latency: %w", err)
		}
	}
	*f = out
	return nil
}

// decodeFields decodes b into v as strictUnmarshal does; an unknown
// field's error names it and the fields what has.
func decodeFields(what, fields string, b []byte, v any) error {
	err := strictUnmarshal(b, v)
	if err == nil {
		return nil
	}
	if field, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return fmt.Errorf("%s: unknown field %s (a %s has %s)", what, field, what, fields)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// AddFault appends a fault after the ones already set.
func (s *Server) AddFault(f Fault) error {
	known := false
	for _, k := range FaultKinds {
		known = known || k == f.Kind
	}
	switch {
	case !known:
		return fmt.Errorf("sim: unknown fault kind %q", f.Kind)
	case f.Times < 0:
		return fmt.Errorf("sim: fault times %d is negative", f.Times)
	case f.RetryAfter < 0 || f.Latency < 0:
		return fmt.Errorf("sim: fault durations must not be negative")
	case f.Kind == FaultLatency && f.Latency == 0:
		return fmt.Errorf("sim: latency fault needs a latency")
	case f.RetryAfter != 0 && f.Kind != FaultRateLimit && f.Kind != FaultUnavailable:
		return fmt.Errorf("sim: retryAfter is for rate_limit and unavailable, not %s", f.Kind)
	case f.Latency != 0 && f.Kind != FaultLatency:
		return fmt.Errorf("sim: latency is for the latency kind, not %s", f.Kind)
	case f.Size < 0 || (f.Size != 0 && f.Kind != FaultHuge):
		return fmt.Errorf("sim: size is a positive byte count for the huge kind, not %d for %s", f.Size, f.Kind)
	}
	if f.Kind == FaultRateLimit && f.RetryAfter == 0 {
		f.RetryAfter = time.Second
	}
	s.mu.Lock()
	s.faults = append(s.faults, &f)
	s.mu.Unlock()
	return nil
}

// ClearFaults removes every fault.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	s.faults = nil
	s.mu.Unlock()
}

// Faults returns the faults still set, Times being what is left.
func (s *Server) Faults() []Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Fault, 0, len(s.faults))
	for _, f := range s.faults {
		out = append(out, *f)
	}
	return out
}
