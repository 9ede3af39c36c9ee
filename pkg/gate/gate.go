// Package gate decides whether a model's output may become an accepted
// result. It runs the stages of the committer's gate in order — syntax,
// schema, correlation, grounding, policy — and stops at the first failure,
// which names the stage, a stable code and the offending field.
package gate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"

	"assay.dev/pkg/contract"
	"assay.dev/pkg/diff"
)

// Stage is one step of the gate.
type Stage string

// The stages, in the order Check runs them.
const (
	StageSyntax      Stage = "syntax"
	StageSchema      Stage = "schema"
	StageCorrelation Stage = "correlation"
	StageGrounding   Stage = "grounding"
	StagePolicy      Stage = "policy"
)

// Failure codes. They are stable: metrics, logs, repair notes and tests key
// on them.
const (
	CodeTooLarge = "syntax.too_large"
	// CodeInvalidEncoding: bytes that are not valid UTF-8, a NUL, or a
	// string escaping U+0000, none of which Postgres stores as text or
	// JSON.
	CodeInvalidEncoding = "syntax.invalid_encoding"
	CodeInvalidJSON     = "syntax.invalid_json"
	CodeNotObject       = "syntax.not_object"
	CodeTrailingData    = "syntax.trailing_data"

	CodeNoContract      = "schema.no_contract"
	CodeSchemaViolation = "schema.violation"

	CodeWorkID          = "correlation.work_id"
	CodeSchemaVersion   = "correlation.schema_version"
	CodeTaxonomyVersion = "correlation.taxonomy_version"
	CodeDigest          = "correlation.digest"

	CodeBadInput          = "grounding.bad_input"
	CodeFileNotInDiff     = "grounding.file_not_in_diff"
	CodeLineOutsideHunk   = "grounding.line_outside_hunk"
	CodeEvidenceNotInDiff = "grounding.evidence_not_in_diff"

	CodeDuplicateFinding    = "policy.duplicate_finding"
	CodeSelfHarmNeedsHuman  = "policy.self_harm_needs_review"
	CodeSeverityUnderstated = "policy.severity_understated"
)

// Failure says why an output was refused.
type Failure struct {
	Stage Stage
	Code  string
	// Detail names the check's location (a field, a finding's index, a
	// line number, lengths, a hash), never the answer's or the input's
	// text: it goes into logs, reasons and repair notes. For example
	// findings[0].file (9 bytes, sha256:1a2b3c4d) is not a file of the diff.
	Detail string
}

func (f *Failure) Error() string {
	return "gate: " + f.Code + ": " + f.Detail
}

// Expect is what the worker was asked to do and what is true now.
type Expect struct {
	// WorkID, SchemaVersion and TaxonomyVersion entered the worker with the work.
	WorkID, SchemaVersion, TaxonomyVersion string
	// CurrentTaxonomyVersion is the contract's taxonomy now.
	CurrentTaxonomyVersion string
	// Digest is the content digest the worker saw; CurrentDigest the work's
	// digest now. They must be equal (both empty counts as equal).
	Digest, CurrentDigest string
	// Input is the work's input; grounding reads {"diff": ...} from it.
	Input json.RawMessage
}

// Seen is what entered the worker with the work; an answer must name it.
type Seen struct {
	WorkID, SchemaVersion, TaxonomyVersion, Digest string
}

// ExpectFor is what an answer to work seen so must match now: the
// contract's current taxonomy, the work's current digest, and its input,
// which grounds the answer's findings. The classifier and the committer
// both check answers against it.
func ExpectFor(c *contract.Contract, seen Seen, currentDigest string, input []byte) Expect {
	e := Expect{WorkID: seen.WorkID, SchemaVersion: seen.SchemaVersion, TaxonomyVersion: seen.TaxonomyVersion,
		Digest: seen.Digest, CurrentDigest: currentDigest, Input: input}
	if c != nil {
		e.CurrentTaxonomyVersion = c.TaxonomyVersion
	}
	return e
}

// Accepted is an output that passed the whole gate, in the one reading
// that every later reader of it shares.
type Accepted struct {
	// Output is the answer's canonical JSON: Doc encoded compactly, keys
	// sorted, strings with their escapes resolved and HTML left unescaped.
	// It is exactly what was checked, whatever whitespace, duplicate keys,
	// escapes or spellings of numbers the model sent, and it is what the
	// committer stores as the result.
	Output json.RawMessage
	// Doc is the validated document, normalised: each number is a
	// json.Number in its canonical spelling (see canonicalNumber), so a
	// line written 2.0, 2e0 or 0.2e1 is 2.
	Doc map[string]any
	// Findings are Doc's findings, typed; nil when it has no "findings".
	Findings []Finding
}

// MaxOutputBytes caps an output before it is parsed.
const MaxOutputBytes = 256 << 10

// Check runs the gate on one output of contract c.
func Check(c *contract.Contract, output []byte, exp Expect) (*Accepted, *Failure) {
	if c == nil {
		return nil, fail(StageSchema, CodeNoContract, "no contract to check against")
	}
	doc, f := checkSyntax(output)
	if f != nil {
		return nil, f
	}
	// Every stage checks the normalised document: what is checked is what
	// is stored and what every reader reads.
	if at := normalize(doc, "output"); at != "" {
		return nil, fail(StageSyntax, CodeInvalidJSON, "%s is a number beyond the range of a double", at)
	}
	if err := c.ValidateOutput(doc); err != nil {
		return nil, fail(StageSchema, CodeSchemaViolation, "%s", err.Error())
	}
	if f := checkCorrelation(c, doc, exp); f != nil {
		return nil, f
	}
	if c.Grounding == contract.GroundingDiff {
		if f := checkGrounding(doc, exp.Input); f != nil {
			return nil, f
		}
	}
	if f := checkPolicy(doc); f != nil {
		return nil, f
	}
	acc, err := accepted(doc)
	if err != nil {
		// Unreachable for a document the schema accepted; refuse rather
		// than let a reader find nothing in it.
		return nil, fail(StageSchema, CodeSchemaViolation, "%v", err)
	}
	return acc, nil
}

func fail(s Stage, code, format string, args ...any) *Failure {
	return &Failure{Stage: s, Code: code, Detail: fmt.Sprintf(format, args...)}
}

// TooLarge is the failure of an output of n bytes that was too large to be
// read whole: the gate names its real size, not the part that was read. A
// negative n is a size beyond what the reader counts.
func TooLarge(n int64) *Failure {
	if n < 0 {
		return fail(StageSyntax, CodeTooLarge, "output is larger than the reader counts, over the %d-byte limit", MaxOutputBytes)
	}
	return fail(StageSyntax, CodeTooLarge, "output is %d bytes, over the %d-byte limit", n, MaxOutputBytes)
}

func checkSyntax(output []byte) (map[string]any, *Failure) {
	if len(output) > MaxOutputBytes {
		return nil, fail(StageSyntax, CodeTooLarge, "output is %d bytes, over the %d-byte limit", len(output), MaxOutputBytes)
	}
	// encoding/json would silently replace bad bytes with U+FFFD, so the
	// accepted text would differ from what the model sent; and neither a
	// NUL nor bytes that are not UTF-8 can be stored as text.
	if err := contract.CheckText(output); err != nil {
		return nil, fail(StageSyntax, CodeInvalidEncoding, "output has %v", err)
	}
	if len(bytes.TrimSpace(output)) == 0 {
		return nil, fail(StageSyntax, CodeInvalidJSON, "output is empty")
	}
	dec := json.NewDecoder(bytes.NewReader(output))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fail(StageSyntax, CodeInvalidJSON, "output ends inside a JSON value (truncated?)")
		}
		return nil, fail(StageSyntax, CodeInvalidJSON, "output is not JSON%s", syntaxAt(err))
	}
	doc, ok := v.(map[string]any)
	if !ok {
		return nil, fail(StageSyntax, CodeNotObject, "output is %s, not a JSON object", kind(v))
	}
	if off := dec.InputOffset(); len(bytes.TrimSpace(output[off:])) > 0 {
		return nil, fail(StageSyntax, CodeTrailingData, "%d bytes follow the JSON object at offset %d", len(bytes.TrimSpace(output[off:])), off)
	}
	if path := nulString(doc, "output"); path != "" {
		return nil, fail(StageSyntax, CodeInvalidEncoding, "%s escapes U+0000, which a JSON column cannot hold", path)
	}
	return doc, nil
}

// nulString names the first string (key or value) under v that holds
// U+0000, "" when none does.
func nulString(v any, at string) string {
	switch x := v.(type) {
	case string:
		if strings.IndexByte(x, 0) >= 0 {
			return at
		}
	case []any:
		for i, e := range x {
			if p := nulString(e, fmt.Sprintf("%s[%d]", at, i)); p != "" {
				return p
			}
		}
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(x)) {
			if strings.IndexByte(k, 0) >= 0 {
				return at + " (a key)"
			}
			if p := nulString(x[k], at+"."+k); p != "" {
				return p
			}
		}
	}
	return ""
}

func kind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

func checkCorrelation(c *contract.Contract, doc map[string]any, exp Expect) *Failure {
	if f := c.Correlation.WorkID; f != "" {
		if got, _ := doc[f].(string); got != exp.WorkID {
			return fail(StageCorrelation, CodeWorkID, "%s %s is not the work id %s", f, contract.Describe(got), exp.WorkID)
		}
	}
	if exp.SchemaVersion != c.SchemaVersion {
		return fail(StageCorrelation, CodeSchemaVersion, "the work entered the worker with schema version %q, the contract is %q", exp.SchemaVersion, c.SchemaVersion)
	}
	if f := c.Correlation.SchemaVersion; f != "" {
		if got, _ := json.Marshal(doc[f]); !bytes.Equal(got, c.WireSchemaVersion) {
			return fail(StageCorrelation, CodeSchemaVersion, "%s %s is not the contract's schema version %s", f, contract.DescribeJSON(got), c.WireSchemaVersion)
		}
	}
	if exp.TaxonomyVersion != exp.CurrentTaxonomyVersion || exp.CurrentTaxonomyVersion != c.TaxonomyVersion {
		return fail(StageCorrelation, CodeTaxonomyVersion, "taxonomy version %q entered the worker, the current one is %q and the contract's is %q",
			exp.TaxonomyVersion, exp.CurrentTaxonomyVersion, c.TaxonomyVersion)
	}
	if exp.Digest == "" || exp.Digest != exp.CurrentDigest {
		return fail(StageCorrelation, CodeDigest, "the worker saw content digest %q, the work's digest is now %q", exp.Digest, exp.CurrentDigest)
	}
	return nil
}

func checkGrounding(doc map[string]any, input json.RawMessage) *Failure {
	in, err := contract.DecodeObject(input)
	if err != nil {
		return fail(StageGrounding, CodeBadInput, "work input: %v", err)
	}
	text, ok := in.(map[string]any)["diff"].(string)
	if !ok {
		return fail(StageGrounding, CodeBadInput, "work input has no string \"diff\"")
	}
	d, err := diff.Parse(text)
	if err != nil {
		// The parser's errors name line numbers only.
		return fail(StageGrounding, CodeBadInput, "work input diff: %v", err)
	}
	findings, _ := doc["findings"].([]any)
	for i, raw := range findings {
		// The schema stage has already guaranteed each finding's shape.
		fd, _ := raw.(map[string]any)
		file, _ := fd["file"].(string)
		df := d.File(file)
		if df == nil {
			return fail(StageGrounding, CodeFileNotInDiff, "findings[%d].file %s is not a file of the diff", i, contract.Describe(file))
		}
		if line, ok := lineOf(fd["line"]); !ok || !df.InHunk(line) {
			return fail(StageGrounding, CodeLineOutsideHunk, "findings[%d].line %v is outside every changed hunk of findings[%d].file", i, fd["line"], i)
		}
		if ev, _ := fd["evidence"].(string); !evidenceIn(df, ev) {
			return fail(StageGrounding, CodeEvidenceNotInDiff, "findings[%d].evidence %s is not text of the diff of findings[%d].file", i, contract.Describe(ev), i)
		}
	}
	return nil
}

// lineOf reads a line number of a normalised document. JSON allows 12,
// 12.0 and 1.2e1 alike; normalize has spelled each of them 12.
func lineOf(v any) (int, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	i, err := n.Int64()
	if err != nil || i < 1 || i > math.MaxInt32 {
		return 0, false
	}
	return int(i), true
}

// evidenceIn accepts evidence found within one diff line of the file, or
// evidence spanning several lines when each of its non-blank lines is.
func evidenceIn(f *diff.File, ev string) bool {
	if f.Contains(ev) {
		return true
	}
	lines := strings.Split(strings.TrimSpace(ev), "\n")
	if len(lines) < 2 {
		return false
	}
	for _, l := range lines {
		if strings.TrimSpace(l) != "" && !f.Contains(l) {
			return false
		}
	}
	return true
}

// checkPolicy holds the rules a schema cannot express. They key on fields,
// not contract names, so a new version of a contract keeps them:
//
//   - policy.duplicate_finding: two findings with the same identity — the
//     same file, line and summary (code-review) or the same code and summary
//     (change-review). Repeats inflate counts and post twice to a pull request.
//   - policy.severity_understated: an overall "severity" (low < medium <
//     high) below that of one of its findings.
//   - policy.self_harm_needs_review: category "self_harm" without
//     needsHumanReview; such a verdict must never be handled unattended.
func checkPolicy(doc map[string]any) *Failure {
	findings, _ := doc["findings"].([]any)
	seen := make(map[string]int, len(findings))
	for i, raw := range findings {
		fd, _ := raw.(map[string]any)
		key, err := json.Marshal([]any{fd["file"], fd["line"], fd["code"], fd["summary"]})
		if err != nil {
			continue
		}
		if j, dup := seen[string(key)]; dup {
			return fail(StagePolicy, CodeDuplicateFinding, "findings[%d] repeats findings[%d]: the same file, line, code and summary, identity %s",
				i, j, contract.Describe(string(key)))
		}
		seen[string(key)] = i
	}
	if overall, ok := doc["severity"].(string); ok {
		for i, raw := range findings {
			fd, _ := raw.(map[string]any)
			if s, _ := fd["severity"].(string); rank(s) > rank(overall) && rank(overall) > 0 {
				// Both are words of the schema's enum, not free text.
				return fail(StagePolicy, CodeSeverityUnderstated, "severity %q is below findings[%d].severity %q", overall, i, s)
			}
		}
	}
	if doc["category"] == "self_harm" && doc["needsHumanReview"] != true {
		return fail(StagePolicy, CodeSelfHarmNeedsHuman, "category \"self_harm\" requires needsHumanReview true")
	}
	return nil
}

func rank(severity string) int {
	switch severity {
	case "low":
		return 1
	case "medium":
		return 2
	case "high":
		return 3
	}
	return 0
}

// syntaxAt says where JSON stopped parsing, by offset: the decoder's own
// message repeats the character it met.
func syntaxAt(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf(" (a syntax error at byte %d)", se.Offset)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf(" (a type error at byte %d)", te.Offset)
	}
	return ""
}
