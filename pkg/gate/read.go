package gate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"assay.dev/pkg/contract"
)

// Finding is one finding of an accepted answer, its fields as the
// contracts name them (code review: file, line, severity, summary,
// evidence and, from version 2, category and confidence; change review:
// code, severity, summary). A field the answer's contract does not have
// is zero.
type Finding struct {
	File       string
	Line       int
	Code       string
	Severity   string
	Category   string
	Confidence float64
	Summary    string
	Evidence   string
}

// Read reads an answer the gate accepted, as it was stored, into what
// Check returned for it. The publisher, the review desk and every other
// reader of a result read it through Read rather than with a decoder of
// their own, so each reads what the gate checked: a line written 2.0 is
// line 2 for all of them. Read does not run the gate again. It fails when
// the bytes are not one JSON object, hold a number no double can hold, or
// have findings that are not findings — none of which an accepted answer
// can be, so a caller must treat the error as loud, never as "no
// findings".
func Read(output []byte) (*Accepted, error) {
	v, err := contract.DecodeObject(output)
	if err != nil {
		return nil, fmt.Errorf("gate: read an accepted answer: %w", err)
	}
	doc := v.(map[string]any)
	if at := normalize(doc, "output"); at != "" {
		return nil, fmt.Errorf("gate: read an accepted answer: %s is a number beyond the range of a double", at)
	}
	acc, err := accepted(doc)
	if err != nil {
		return nil, fmt.Errorf("gate: read an accepted answer: %w", err)
	}
	return acc, nil
}

// accepted is the Accepted of a normalised document: its typed findings
// and its canonical JSON.
func accepted(doc map[string]any) (*Accepted, error) {
	findings, err := findingsOf(doc)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("re-encoding: %w", err)
	}
	return &Accepted{Output: bytes.TrimRight(buf.Bytes(), "\n"), Doc: doc, Findings: findings}, nil
}

// findingsOf types the findings of a normalised document; nil when it has
// no "findings". A finding whose fields are not of their kind is an error
// naming its index and field.
func findingsOf(doc map[string]any) ([]Finding, error) {
	raw, ok := doc["findings"]
	if !ok {
		return nil, nil
	}
	list, ok := raw.([]any)
	if !ok {
		return nil, fmt.Errorf("findings is %s, not an array", kind(raw))
	}
	out := make([]Finding, 0, len(list))
	for i, r := range list {
		fd, ok := r.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("findings[%d] is %s, not an object", i, kind(r))
		}
		var f Finding
		for _, s := range []struct {
			name string
			dst  *string
		}{{"file", &f.File}, {"code", &f.Code}, {"severity", &f.Severity}, {"category", &f.Category},
			{"summary", &f.Summary}, {"evidence", &f.Evidence}} {
			if v, ok := fd[s.name]; ok {
				if *s.dst, ok = v.(string); !ok {
					return nil, fmt.Errorf("findings[%d].%s is %s, not a string", i, s.name, kind(v))
				}
			}
		}
		if v, ok := fd["line"]; ok {
			if f.Line, ok = lineOf(v); !ok {
				return nil, fmt.Errorf("findings[%d].line is not a line number", i)
			}
		}
		if v, ok := fd["confidence"]; ok {
			n, _ := v.(json.Number)
			c, err := n.Float64()
			if err != nil {
				return nil, fmt.Errorf("findings[%d].confidence is %s, not a number", i, kind(v))
			}
			f.Confidence = c
		}
		out = append(out, f)
	}
	return out, nil
}

// normalize rewrites every number under v (decoded with UseNumber) to its
// canonical spelling, in place, so that the gate checks, and the result
// stores, the one reading every later reader gets. It returns the path of
// a number no double can hold, "" when there is none.
func normalize(v any, at string) string {
	switch x := v.(type) {
	case []any:
		for i, e := range x {
			if n, ok := e.(json.Number); ok {
				c, ok := canonicalNumber(string(n))
				if !ok {
					return fmt.Sprintf("%s[%d]", at, i)
				}
				x[i] = json.Number(c)
				continue
			}
			if p := normalize(e, fmt.Sprintf("%s[%d]", at, i)); p != "" {
				return p
			}
		}
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(x)) {
			if n, ok := x[k].(json.Number); ok {
				c, ok := canonicalNumber(string(n))
				if !ok {
					return at + "." + k
				}
				x[k] = json.Number(c)
				continue
			}
			if p := normalize(x[k], at+"."+k); p != "" {
				return p
			}
		}
	}
	return ""
}

// canonicalNumber is the one spelling of a JSON number: an integer that
// an int64 holds exactly, however it was written (2, 2.0, 2e0, 20e-1,
// 0.2e1), as its digits alone; any other number as encoding/json writes
// the double it reads as (0.50 and 5e-1 as 0.5). false: the number is
// beyond the range of a double, so no reader could read it.
func canonicalNumber(s string) (string, bool) {
	if c, ok := exactInt(s); ok {
		return c, true
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return "", false
	}
	if f == 0 {
		f = 0 // -0 and an underflow read as 0
	}
	b, err := json.Marshal(f)
	if err != nil {
		return "", false
	}
	return string(b), true
}

// exactInt spells s, a JSON number, as the digits of the int64 it equals
// exactly; false when it equals none.
func exactInt(s string) (string, bool) {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, exp := s, int64(0)
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		var err error
		if exp, err = strconv.ParseInt(strings.TrimPrefix(s[i+1:], "+"), 10, 64); err != nil {
			return "", false
		}
		mant = s[:i]
	}
	whole, frac, _ := strings.Cut(mant, ".")
	if exp < -1<<20 || exp > 1<<20 {
		// Far beyond an int64 either way, unless every digit is 0.
		if strings.Trim(whole+frac, "0") == "" {
			return "0", true
		}
		return "", false
	}
	digits := strings.TrimLeft(whole+frac, "0")
	exp -= int64(len(frac))
	if digits == "" {
		return "0", true
	}
	for strings.HasSuffix(digits, "0") {
		digits = digits[:len(digits)-1]
		exp++
	}
	if exp < 0 || int64(len(digits))+exp > 19 {
		return "", false
	}
	digits += strings.Repeat("0", int(exp))
	if neg {
		digits = "-" + digits
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return "", false
	}
	return strconv.FormatInt(n, 10), true
}
