package contract

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/kaptinlin/jsonschema"
)

// Violation is one failed schema keyword at one place in a document.
type Violation struct {
	// Pointer is the JSON pointer of the offending value ("" for the root).
	Pointer string
	// Field is Pointer in a readable form, e.g. "output.findings[0].line".
	Field string
	// Keyword is the schema keyword that failed, e.g. "maxItems"; "json" for
	// a document that is not a single JSON object, "diff" for an unparsable
	// diff.
	Keyword string
	Message string
}

func (v Violation) String() string {
	return v.Field + ": " + v.Keyword + ": " + v.Message
}

// ValidationError lists what made a document invalid, in document order.
type ValidationError struct {
	Doc        string // "input" or "output"
	Violations []Violation
}

// maxListed bounds Error's text: a repair note or a log line needs the first
// problems, not all of them.
const maxListed = 5

func (e *ValidationError) Error() string {
	var b strings.Builder
	for i, v := range e.Violations {
		if i == maxListed {
			fmt.Fprintf(&b, "; and %d more", len(e.Violations)-maxListed)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(v.String())
	}
	return b.String()
}

// aggregateKeywords only summarise the failures of their subschemas, which
// are reported on their own.
var aggregateKeywords = map[string]bool{
	"properties": true, "patternProperties": true, "additionalProperties": true,
	"items": true, "prefixItems": true,
}

func validate(s *jsonschema.Schema, name string, doc any) error {
	res := s.Validate(doc)
	if res.IsValid() {
		return nil
	}
	e := &ValidationError{Doc: name}
	collect(res, nil, doc, e)
	if len(e.Violations) == 0 {
		// The library said no without a leaf we could place: still refuse.
		e.Violations = append(e.Violations, Violation{Field: name, Keyword: "schema", Message: "document does not match the schema"})
	}
	slices.SortStableFunc(e.Violations, func(a, b Violation) int {
		return cmp.Or(cmp.Compare(a.Pointer, b.Pointer), cmp.Compare(a.Keyword, b.Keyword))
	})
	return e
}

func collect(r *jsonschema.EvaluationResult, parent []string, doc any, e *ValidationError) {
	loc := append(slices.Clip(parent), splitPointer(r.InstanceLocation)...)
	// The library evaluates a missing required property as null; that
	// phantom type error would hide the real one ("required" on the parent).
	if _, ok := lookup(doc, loc); !ok {
		return
	}
	add := func(kw, msg string) {
		e.Violations = append(e.Violations, Violation{Pointer: joinPointer(loc), Field: field(e.Doc, doc, loc), Keyword: kw, Message: msg})
	}
	// A property matched by additionalProperties: false shows up as a child
	// failing the "false" schema; say what it means instead. Its name is
	// the document's text, so the field is its parent's and the name is
	// described, not repeated.
	if strings.HasPrefix(r.EvaluationPath, "/additionalProperties/") && len(loc) > 0 {
		name := loc[len(loc)-1]
		e.Violations = append(e.Violations, Violation{Pointer: joinPointer(loc[:len(loc)-1]), Field: field(e.Doc, doc, loc[:len(loc)-1]),
			Keyword: "additionalProperties", Message: "has a property the schema does not allow, named " + Describe(name)})
		return
	}
	value, _ := lookup(doc, loc)
	childFailed := false
	for _, d := range r.Details {
		childFailed = childFailed || !d.IsValid()
	}
	for kw, err := range r.Errors {
		if childFailed && aggregateKeywords[kw] {
			continue
		}
		add(kw, safeMessage(kw, err, value))
	}
	for _, d := range r.Details {
		if !d.IsValid() {
			collect(d, loc, doc, e)
		}
	}
}

// Describe names a text from a document without repeating it: its length
// and the first bytes of its SHA-256, so two reports of the same value can
// be matched while neither carries it. Reasons, logs and repair notes say
// this of anything a caller or a model wrote.
func Describe(s string) string {
	sum := sha256.Sum256([]byte(s))
	return fmt.Sprintf("(%d bytes, sha256:%x)", len(s), sum[:4])
}

// DescribeJSON is Describe for an encoded JSON value: a number, boolean or
// null is shown as it is, since it carries no text.
func DescribeJSON(raw []byte) string {
	var v any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if dec.Decode(&v) == nil {
		switch v.(type) {
		case nil, bool, json.Number:
			return string(raw)
		}
	}
	return Describe(string(raw))
}

// describeValue is Describe for any decoded JSON value: numbers, booleans
// and null say what they are, a string is described, an object or an
// array named by kind.
func describeValue(v any) string {
	switch x := v.(type) {
	case string:
		return Describe(x)
	case nil, bool, json.Number:
		b, _ := json.Marshal(x)
		return string(b)
	}
	return jsonKind(v)
}

// instanceParams are the parameters in which the schema library repeats
// the document's own values; a message carries a description instead. A
// type error's "received" is the value's type, and the properties a
// "required" names are the schema's: both are kept.
var instanceParams = []string{"received", "property", "properties", "value"}

// safeMessage renders a schema error with the document's values described,
// never repeated: an enum refusal would otherwise quote whatever the model
// put there.
func safeMessage(kw string, err *jsonschema.EvaluationError, value any) string {
	if len(err.Params) == 0 {
		return err.Error()
	}
	p := make(map[string]any, len(err.Params))
	for k, v := range err.Params {
		p[k] = v
	}
	for _, k := range instanceParams {
		if _, ok := p[k]; !ok || (k == "received" && kw == "type") {
			continue
		}
		if (k == "property" || k == "properties") && kw != "propertyNames" && kw != "additionalProperties" {
			// The names a "required" wants are the schema's own.
			continue
		}
		switch {
		case k == "value" && isNumber(value):
			// A number is kept: it carries no text.
		case k == "property" || k == "properties":
			p[k] = "(names not repeated)"
		default:
			p[k] = describeValue(value)
		}
	}
	return (&jsonschema.EvaluationError{Keyword: err.Keyword, Code: err.Code, Message: err.Message, Params: p}).Error()
}

func isNumber(v any) bool {
	_, ok := v.(json.Number)
	return ok
}

var (
	unescapePointer = strings.NewReplacer("~1", "/", "~0", "~")
	escapePointer   = strings.NewReplacer("~", "~0", "/", "~1")
)

func splitPointer(p string) []string {
	if p == "" {
		return nil
	}
	segs := strings.Split(strings.TrimPrefix(p, "/"), "/")
	for i, s := range segs {
		segs[i] = unescapePointer.Replace(s)
	}
	return segs
}

func joinPointer(segs []string) string {
	var b strings.Builder
	for _, s := range segs {
		b.WriteByte('/')
		b.WriteString(escapePointer.Replace(s))
	}
	return b.String()
}

func lookup(doc any, segs []string) (any, bool) {
	cur := doc
	for _, s := range segs {
		switch v := cur.(type) {
		case map[string]any:
			next, ok := v[s]
			if !ok {
				return nil, false
			}
			cur = next
		case []any:
			i, err := strconv.Atoi(s)
			if err != nil || i < 0 || i >= len(v) {
				return nil, false
			}
			cur = v[i]
		default:
			return nil, false
		}
	}
	return cur, true
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// field renders a location the way a reader of the contract names it.
func field(root string, doc any, segs []string) string {
	var b strings.Builder
	b.WriteString(root)
	cur := doc
	for _, s := range segs {
		switch v := cur.(type) {
		case []any:
			b.WriteString("[" + s + "]")
			i, _ := strconv.Atoi(s)
			cur = v[i]
		default:
			if identifier.MatchString(s) {
				b.WriteString("." + s)
			} else {
				// A name no schema of ours defines: the document's text.
				b.WriteString("[" + Describe(s) + "]")
			}
			m, _ := v.(map[string]any)
			cur = m[s]
		}
	}
	return b.String()
}

// TextError says where bytes stop being text a Postgres text column can
// hold: the first byte that is not valid UTF-8 (an overlong encoding, a
// surrogate, a stray continuation byte), or a NUL.
type TextError struct {
	Offset int
	NUL    bool
}

func (e *TextError) Error() string {
	if e.NUL {
		return fmt.Sprintf("a NUL byte at byte %d", e.Offset)
	}
	return fmt.Sprintf("bytes that are not valid UTF-8 at byte %d", e.Offset)
}

// CheckText returns a *TextError for the first byte of b that is not
// storable text, or nil.
func CheckText(b []byte) error {
	for i := 0; i < len(b); {
		if b[i] == 0 {
			return &TextError{Offset: i, NUL: true}
		}
		if b[i] < utf8.RuneSelf {
			i++
			continue
		}
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return &TextError{Offset: i}
		}
		i += n
	}
	return nil
}
