// Package contract loads the extraction contracts from assay.dev/schemas: the
// schema sent to the model, the input schema ingress checks, the prompt and
// the versions the gate correlates against. Every schema is compiled once, at
// Load, so a broken contract file stops start-up instead of a request.
package contract

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"

	"assay.dev/pkg/diff"
	"assay.dev/schemas"
	"github.com/kaptinlin/jsonschema"
)

// manifestFile lists the contracts inside schemas.FS.
const manifestFile = "contracts.json"

// GroundingDiff marks a contract whose findings must point into the input diff.
const GroundingDiff = "diff"

// Contract is one loaded contract.
type Contract struct {
	Name            string
	SchemaVersion   string // e.g. "code-review/1"
	TaxonomyVersion string // e.g. "2026-11"
	// Prompt is the text of the contract's instructions, and PromptDigest
	// its PromptDigest: a rollout names a prompt by it.
	Prompt       string
	PromptDigest string
	// Schema is the output schema file's bytes verbatim: what the model gets
	// as response_format.json_schema.schema.
	Schema json.RawMessage
	// InputSchema is the input schema file's bytes verbatim.
	InputSchema json.RawMessage
	// Correlation names the output fields that must echo the work id and the
	// schema version; "" means the contract carries no such field.
	Correlation struct{ WorkID, SchemaVersion string }
	// WireSchemaVersion is the schema version as the contract's own field
	// spells it, a JSON value (code review: 1; change review:
	// "change-review.v1"): what the correlation line tells the model and
	// the gate holds the answer to. Without a field of its own it is
	// SchemaVersion as a JSON string.
	WireSchemaVersion json.RawMessage
	// Grounding is GroundingDiff or "".
	Grounding string
	// OnRefusal is what a refusal or a content filter does to the work:
	// RefusalEnd (the default) ends it transport_rejected, RefusalRetry
	// tries again with backoff within the attempt budget.
	OnRefusal string
	// Parts, for a contract grounded in a diff, is how large a part of the
	// diff one model call carries; a diff over it is reviewed in parts.
	// Zero reviews every diff whole.
	Parts Parts
	// CostCapMicros bounds what one work item's calls may cost, in
	// micro-dollars, counted at their estimates; 0 sets none. A review in
	// parts that reaches it ends as a partial review.
	CostCapMicros int64
	// MaxFindings is the output schema's maxItems on findings, 0 when it
	// sets none: a merge of several parts' findings keeps to it.
	MaxFindings int

	output *jsonschema.Schema
	input  *jsonschema.Schema
}

// Registry holds every contract of the manifest: each name's versions side
// by side, one of them the name's default.
type Registry struct {
	byName    map[string]*Contract // the default version
	byVersion map[string]*Contract // by SchemaVersion
	versions  map[string][]*Contract
	names     []string
}

type manifestEntry struct {
	Name            string `json:"name"`
	Schema          string `json:"schema"`
	Input           string `json:"input"`
	SchemaVersion   string `json:"schemaVersion"`
	TaxonomyVersion string `json:"taxonomyVersion"`
	Prompt          string `json:"prompt"`
	Correlation     struct {
		WorkID             string          `json:"workId"`
		SchemaVersion      string          `json:"schemaVersion"`
		SchemaVersionValue json.RawMessage `json:"schemaVersionValue"`
	} `json:"correlation"`
	Grounding string `json:"grounding"`
	OnRefusal string `json:"onRefusal"`
	Parts     Parts  `json:"parts"`
	// CostCapMicros bounds a work item's calls (see Contract).
	CostCapMicros int64 `json:"costCapMicros"`
	// Default marks the version new work of the name gets when no route
	// names one; needed when the name has several versions.
	Default bool `json:"default"`
}

// Parts is how a diff too large for one call is cut: into parts of at most
// Units model units, a unit counted per BytesPerUnit bytes of diff (a
// stated rule, on the safe side of what tokenizers of the model families
// assay asks count for code).
type Parts struct {
	Units        int     `json:"units"`
	BytesPerUnit float64 `json:"bytesPerUnit"`
}

// What a refusal does to a contract's work.
const (
	RefusalEnd   = "end"
	RefusalRetry = "retry"
)

// Load reads and compiles the contracts embedded in assay.dev/schemas.
func Load() (*Registry, error) {
	return load(schemas.FS)
}

func load(fsys fs.FS) (*Registry, error) {
	raw, err := fs.ReadFile(fsys, manifestFile)
	if err != nil {
		return nil, fmt.Errorf("contract: %w", err)
	}
	var entries []manifestEntry
	if err := decodeStrict(raw, &entries); err != nil {
		return nil, fmt.Errorf("contract: %s: %w", manifestFile, err)
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("contract: %s: no contracts", manifestFile)
	}
	// One compiler for all: no schema carries an $id, so nothing is shared
	// between them through its cache.
	compiler := jsonschema.NewCompiler()
	r := &Registry{byName: map[string]*Contract{}, byVersion: map[string]*Contract{}, versions: map[string][]*Contract{}}
	defaults := map[string]int{}
	for i, e := range entries {
		c, err := build(fsys, compiler, e)
		if err != nil {
			return nil, fmt.Errorf("contract: %s[%d] (%q): %w", manifestFile, i, e.Name, err)
		}
		if _, dup := r.byVersion[c.SchemaVersion]; dup {
			return nil, fmt.Errorf("contract: %s[%d]: duplicate schemaVersion %q", manifestFile, i, c.SchemaVersion)
		}
		if !strings.HasPrefix(c.SchemaVersion, c.Name+"/") {
			return nil, fmt.Errorf("contract: %s[%d]: schemaVersion %q is not %q and a version", manifestFile, i, c.SchemaVersion, c.Name+"/")
		}
		r.byVersion[c.SchemaVersion] = c
		if len(r.versions[c.Name]) == 0 {
			r.names = append(r.names, c.Name)
		}
		r.versions[c.Name] = append(r.versions[c.Name], c)
		if e.Default {
			defaults[c.Name]++
			r.byName[c.Name] = c
		}
	}
	for _, name := range r.names {
		vs := r.versions[name]
		switch {
		case defaults[name] > 1:
			return nil, fmt.Errorf("contract: %s: %q has %d default versions, want one", manifestFile, name, defaults[name])
		case defaults[name] == 0 && len(vs) > 1:
			return nil, fmt.Errorf("contract: %s: %q has %d versions and none is the default", manifestFile, name, len(vs))
		case defaults[name] == 0:
			r.byName[name] = vs[0]
		}
	}
	slices.Sort(r.names)
	return r, nil
}

// build makes the contract of one manifest entry, reading and compiling the
// files it names.
func build(fsys fs.FS, compiler *jsonschema.Compiler, e manifestEntry) (*Contract, error) {
	if err := e.settle(); err != nil {
		return nil, err
	}
	c := &Contract{
		Name:            e.Name,
		SchemaVersion:   e.SchemaVersion,
		TaxonomyVersion: e.TaxonomyVersion,
		Grounding:       e.Grounding,
		OnRefusal:       e.OnRefusal,
		Parts:           e.Parts,
		CostCapMicros:   e.CostCapMicros,
	}
	c.Correlation.WorkID = e.Correlation.WorkID
	c.Correlation.SchemaVersion = e.Correlation.SchemaVersion
	var err error
	if c.WireSchemaVersion, err = e.wireSchemaVersion(); err != nil {
		return nil, err
	}
	if c.Prompt, err = readPrompt(fsys, e.Prompt); err != nil {
		return nil, err
	}
	c.PromptDigest = PromptDigest(c.Prompt)

	var outDoc, inDoc map[string]any
	if c.Schema, outDoc, c.output, err = compile(fsys, compiler, e.Schema, true); err != nil {
		return nil, err
	}
	if c.InputSchema, inDoc, c.input, err = compile(fsys, compiler, e.Input, false); err != nil {
		return nil, err
	}
	if err := c.checkFields(e, outDoc, inDoc); err != nil {
		return nil, err
	}
	if c.Grounding == GroundingDiff {
		c.MaxFindings = maxFindings(outDoc)
	}
	return c, nil
}

// settle checks the entry's own fields and fills in the defaults of those
// it leaves unset.
func (e *manifestEntry) settle() error {
	for _, f := range []struct{ name, value string }{
		{"name", e.Name}, {"schema", e.Schema}, {"input", e.Input},
		{"schemaVersion", e.SchemaVersion}, {"taxonomyVersion", e.TaxonomyVersion}, {"prompt", e.Prompt},
	} {
		if strings.TrimSpace(f.value) == "" {
			return fmt.Errorf("%s is empty", f.name)
		}
	}
	if e.Grounding != "" && e.Grounding != GroundingDiff {
		return fmt.Errorf("grounding %q is not %q or empty", e.Grounding, GroundingDiff)
	}
	switch e.OnRefusal {
	case "":
		e.OnRefusal = RefusalEnd
	case RefusalEnd, RefusalRetry:
	default:
		return fmt.Errorf("onRefusal %q is not %q or %q", e.OnRefusal, RefusalEnd, RefusalRetry)
	}
	switch {
	case e.Parts.Units < 0 || e.Parts.BytesPerUnit < 0:
		return fmt.Errorf("parts: units %d and bytesPerUnit %g must not be negative", e.Parts.Units, e.Parts.BytesPerUnit)
	case e.Parts.Units > 0 && e.Grounding != GroundingDiff:
		return fmt.Errorf("parts: only a contract grounded in a diff is reviewed in parts")
	case e.CostCapMicros < 0:
		return fmt.Errorf("costCapMicros %d is negative", e.CostCapMicros)
	}
	if e.Parts.Units > 0 && e.Parts.BytesPerUnit == 0 {
		e.Parts.BytesPerUnit = 1
	}
	return nil
}

// wireSchemaVersion is the entry's schema version as its correlation field
// spells it: correlation.schemaVersionValue compacted, or else the
// schemaVersion as a JSON string.
func (e *manifestEntry) wireSchemaVersion() (json.RawMessage, error) {
	wire, _ := json.Marshal(e.SchemaVersion)
	if len(e.Correlation.SchemaVersionValue) > 0 {
		if e.Correlation.SchemaVersion == "" {
			return nil, errors.New("correlation.schemaVersionValue needs correlation.schemaVersion, the field it is the value of")
		}
		var b bytes.Buffer
		if err := json.Compact(&b, e.Correlation.SchemaVersionValue); err != nil {
			return nil, fmt.Errorf("correlation.schemaVersionValue: %w", err)
		}
		wire = b.Bytes()
	}
	return wire, nil
}

// readPrompt reads the prompt file name, which must hold more than
// whitespace.
func readPrompt(fsys fs.FS, name string) (string, error) {
	prompt, err := fs.ReadFile(fsys, name)
	if err != nil {
		return "", err
	}
	if len(bytes.TrimSpace(prompt)) == 0 {
		return "", fmt.Errorf("%s: empty prompt", name)
	}
	return string(prompt), nil
}

// checkFields checks that the output and input schemas (outDoc and inDoc,
// the files e names) have the fields c's correlation and grounding read.
func (c *Contract) checkFields(e manifestEntry, outDoc, inDoc map[string]any) error {
	// The gate reads these fields by name, so they must exist: the work id
	// as a string, the schema version as the schema spells it.
	if f := c.Correlation.WorkID; f != "" && propType(outDoc, f) != "string" {
		return fmt.Errorf("%s: correlation field %q is not a string property", e.Schema, f)
	}
	if f := c.Correlation.SchemaVersion; f != "" {
		if t := propType(outDoc, f); t != "string" && t != "integer" {
			return fmt.Errorf("%s: correlation field %q is not a string or integer property", e.Schema, f)
		}
	}
	if c.Grounding == GroundingDiff {
		if propType(inDoc, "diff") != "string" {
			return fmt.Errorf("%s: grounding %q needs a string property \"diff\"", e.Input, GroundingDiff)
		}
		item := findingItem(outDoc)
		if propType(item, "file") != "string" || propType(item, "line") != "integer" || propType(item, "evidence") != "string" {
			return fmt.Errorf("%s: grounding %q needs findings items with file (string), line (integer) and evidence (string)", e.Schema, GroundingDiff)
		}
	}
	return nil
}

// compile reads one schema file, checks it against the keywords assay relies
// on (and, for output schemas, the strict structured-output rules) and
// compiles it.
func compile(fsys fs.FS, compiler *jsonschema.Compiler, name string, strict bool) (json.RawMessage, map[string]any, *jsonschema.Schema, error) {
	raw, err := fs.ReadFile(fsys, name)
	if err != nil {
		return nil, nil, nil, err
	}
	var doc map[string]any
	if err := decodeStrict(raw, &doc); err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	if err := lint(doc, "#", strict); err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	s, err := compiler.Compile(raw)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: compile: %w", name, err)
	}
	return json.RawMessage(raw), doc, s, nil
}

// knownKeywords are the schema keywords the contracts may use. The validator
// ignores keywords it does not know, so a misspelt "maxitems" would silently
// stop constraining the model; lint refuses it instead.
var knownKeywords = map[string]bool{
	"$schema": true, "title": true, "description": true,
	"type": true, "enum": true, "const": true,
	"properties": true, "required": true, "additionalProperties": true,
	"items": true, "minItems": true, "maxItems": true, "uniqueItems": true,
	"minLength": true, "maxLength": true, "pattern": true,
	"minimum": true, "maximum": true,
}

// lint walks a schema document. With strict set it also enforces OpenAI's
// strict structured-output rules: every object closes additionalProperties
// and lists every property as required.
func lint(s map[string]any, at string, strict bool) error {
	for k := range s {
		if !knownKeywords[k] {
			return fmt.Errorf("%s: keyword %q is not one assay supports", at, k)
		}
	}
	if _, ok := s["type"]; !ok {
		return fmt.Errorf("%s: no type", at)
	}
	props, _ := s["properties"].(map[string]any)
	if s["type"] == "object" {
		if ap, ok := s["additionalProperties"].(bool); !ok || ap {
			return fmt.Errorf("%s: object without \"additionalProperties\": false", at)
		}
		if strict {
			req, _ := s["required"].([]any)
			if len(req) != len(props) {
				return fmt.Errorf("%s: strict output needs every property in \"required\"", at)
			}
			for _, r := range req {
				if name, _ := r.(string); props[name] == nil {
					return fmt.Errorf("%s: required %v is not a property", at, r)
				}
			}
		}
	}
	for name, p := range props {
		ps, ok := p.(map[string]any)
		if !ok {
			return fmt.Errorf("%s/properties/%s: not a schema object", at, name)
		}
		if err := lint(ps, at+"/properties/"+name, strict); err != nil {
			return err
		}
	}
	if items, ok := s["items"]; ok {
		is, ok := items.(map[string]any)
		if !ok {
			return fmt.Errorf("%s/items: not a schema object", at)
		}
		if err := lint(is, at+"/items", strict); err != nil {
			return err
		}
	}
	return nil
}

func propType(s map[string]any, name string) string {
	props, _ := s["properties"].(map[string]any)
	p, _ := props[name].(map[string]any)
	t, _ := p["type"].(string)
	return t
}

func findingItem(s map[string]any) map[string]any {
	props, _ := s["properties"].(map[string]any)
	f, _ := props["findings"].(map[string]any)
	item, _ := f["items"].(map[string]any)
	return item
}

// maxFindings is the schema's maxItems on its findings, 0 when it sets
// none.
func maxFindings(s map[string]any) int {
	props, _ := s["properties"].(map[string]any)
	f, _ := props["findings"].(map[string]any)
	switch n := f["maxItems"].(type) {
	case json.Number:
		v, _ := n.Int64()
		return int(v)
	case float64:
		return int(n)
	}
	return 0
}

// Get returns the named contract: its default version.
func (r *Registry) Get(name string) (*Contract, bool) {
	c, ok := r.byName[name]
	return c, ok
}

// Version returns the contract of one schema version ("code-review/2"),
// whether or not it is its name's default.
func (r *Registry) Version(schemaVersion string) (*Contract, bool) {
	c, ok := r.byVersion[schemaVersion]
	return c, ok
}

// Of returns the contract a work item was made for: its schema version,
// which it carries from ingress to its result. Work of a version this
// build does not know is not read as another version's.
func (r *Registry) Of(name, schemaVersion string) (*Contract, bool) {
	c, ok := r.byVersion[schemaVersion]
	if !ok || c.Name != name {
		return nil, false
	}
	return c, true
}

// Versions returns a name's versions in the manifest's order.
func (r *Registry) Versions(name string) []*Contract {
	return slices.Clone(r.versions[name])
}

// Names returns the contract names, sorted.
func (r *Registry) Names() []string {
	return slices.Clone(r.names)
}

// ValidateInput checks a work's input: one JSON object, nothing after it,
// matching the input schema; for diff-grounded contracts the diff must parse,
// since the gate could not ground any finding otherwise.
func (c *Contract) ValidateInput(raw []byte) error {
	doc, err := DecodeObject(raw)
	if err != nil {
		return &ValidationError{Doc: "input", Violations: []Violation{{Field: "input", Keyword: "json", Message: err.Error()}}}
	}
	if err := validate(c.input, "input", doc); err != nil {
		return err
	}
	if c.Grounding == GroundingDiff {
		d, _ := doc.(map[string]any)["diff"].(string)
		if _, err := diff.Parse(d); err != nil {
			return &ValidationError{Doc: "input", Violations: []Violation{{Pointer: "/diff", Field: "input.diff", Keyword: "diff", Message: "not a unified diff: " + err.Error()}}}
		}
	}
	return nil
}

// ValidateOutput checks a decoded output document (from encoding/json, with
// or without UseNumber) against the output schema. A []byte or
// json.RawMessage is decoded first.
func (c *Contract) ValidateOutput(doc any) error {
	switch b := doc.(type) {
	case json.RawMessage:
		return c.ValidateOutput([]byte(b))
	case []byte:
		v, err := decodeValue(b)
		if err != nil {
			return &ValidationError{Doc: "output", Violations: []Violation{{Field: "output", Keyword: "json", Message: err.Error()}}}
		}
		doc = v
	}
	return validate(c.output, "output", doc)
}

// DecodeObject decodes exactly one JSON object, numbers as json.Number, and
// refuses anything after it.
func DecodeObject(raw []byte) (any, error) {
	v, err := decodeValue(raw)
	if err != nil {
		return nil, err
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, fmt.Errorf("not a JSON object but %s", jsonKind(v))
	}
	return v, nil
}

func decodeValue(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("invalid JSON: data after the top-level value")
	}
	return v, nil
}

func decodeStrict(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("data after the top-level value")
	}
	return nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number, float64:
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

// LoadFS reads and compiles the contracts of the manifest in fsys, another
// version of assay.dev/schemas (a directory holding a contracts.json and
// the files it names): what an operator checks historical answers against.
func LoadFS(fsys fs.FS) (*Registry, error) {
	return load(fsys)
}

// PromptDigest names a prompt's text: "sha256:" and the hex of its sha256.
func PromptDigest(text string) string {
	sum := sha256.Sum256([]byte(text))
	return "sha256:" + hex.EncodeToString(sum[:])
}
