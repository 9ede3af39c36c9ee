package ingress

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
	"testing/iotest"

	"assay.dev/pkg/contract"
)

const validSubmit = `{"contract":"pr-review","sourceId":"octo/repo#12","revision":"abc123","lane":"interactive","input":{"diff":"x"},"deadlineSeconds":30}`

func TestDecodeSubmitAccepts(t *testing.T) {
	t.Parallel()
	var req SubmitRequest
	if err := DecodeSubmit([]byte(validSubmit), &req); err != nil {
		t.Fatalf("decode: %v", err)
	}
	if req.Contract != "pr-review" || req.SourceID != "octo/repo#12" || req.Revision != "abc123" ||
		req.Lane != "interactive" || req.DeadlineSeconds != 30 || string(req.Input) != `{"diff":"x"}` {
		t.Fatalf("decoded %+v", req)
	}
	for _, body := range []string{validSubmit + "\n", " \t" + validSubmit + " \r\n", `{"contract":"c"}`, `{}`} {
		var r SubmitRequest
		if err := DecodeSubmit([]byte(body), &r); err != nil {
			t.Errorf("decode %q: %v", body, err)
		}
	}
}

func TestDecodeSubmitRefuses(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"unknown field":        `{"contract":"c","tenant":"acme"}`,
		"unknown nested case":  `{"contract":"c","extra":{}}`,
		"trailing object":      validSubmit + `{}`,
		"trailing value":       validSubmit + ` 1`,
		"trailing garbage":     validSubmit + `x`,
		"trailing close":       validSubmit + `}`,
		"two objects":          `{}{}`,
		"contract number":      `{"contract":1}`,
		"deadline string":      `{"deadlineSeconds":"30"}`,
		"deadline fraction":    `{"deadlineSeconds":1.5}`,
		"lane bool":            `{"lane":true}`,
		"array":                `[]`,
		"string":               `"x"`,
		"number":               `1`,
		"null":                 `null`,
		"empty":                ``,
		"whitespace":           "  \n",
		"truncated":            validSubmit[:len(validSubmit)-1],
		"invalid input":        `{"input":{"a":}}`,
		"bad utf8 in trailing": validSubmit + "\xff",
	}
	for name, body := range cases {
		var req SubmitRequest
		if err := DecodeSubmit([]byte(body), &req); err == nil {
			t.Errorf("%s: accepted %q as %+v", name, body, req)
		}
	}
}

func FuzzDecodeSubmit(f *testing.F) {
	for _, s := range []string{validSubmit, `{}`, `null`, `[]`, `{"input":[1,2]}`, validSubmit + `{}`, `{"contract":"c","x":1}`,
		`{"contract":"\ud83d\ude00","input":{"a":"\ud800"}}`, `{"sourceId":"\u0000"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req SubmitRequest
		if err := DecodeSubmit(body, &req); err != nil {
			return
		}
		if b := bytes.TrimLeft(body, " \t\r\n"); len(b) == 0 || b[0] != '{' {
			t.Fatalf("accepted a body that is not an object: %q", body)
		}
		if !json.Valid(body) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		if len(req.Input) > 0 && !json.Valid(req.Input) {
			t.Fatalf("accepted input that is not JSON: %q", req.Input)
		}
		// What was accepted is text as it was sent: no NUL, and no U+FFFD
		// the body did not spell (a surrogate half alone decodes to one).
		var input any
		_ = json.Unmarshal(req.Input, &input)
		spelled := bytes.Contains(body, []byte("\uFFFD")) || strings.Contains(strings.ToLower(string(body)), "fffd")
		for _, s := range append(strs(input), req.Contract, req.SourceID, req.Revision, req.Lane) {
			if strings.IndexByte(s, 0) >= 0 || (strings.Contains(s, "\uFFFD") && !spelled) {
				t.Fatalf("accepted %q from %q", s, body)
			}
		}
	})
}

// strs is every string in a decoded JSON value, keys included.
func strs(v any) []string {
	switch x := v.(type) {
	case string:
		return []string{x}
	case []any:
		var out []string
		for _, e := range x {
			out = append(out, strs(e)...)
		}
		return out
	case map[string]any:
		var out []string
		for k, e := range x {
			out = append(append(out, k), strs(e)...)
		}
		return out
	}
	return nil
}

var workIDRE = regexp.MustCompile(`^w_[0-9a-f]{24}$`)

func TestWorkID(t *testing.T) {
	t.Parallel()
	base := WorkID("acme", "pr-review", "octo/repo#1", "abc")
	if !workIDRE.MatchString(base) {
		t.Fatalf("WorkID = %q, want w_ and 24 hex digits", base)
	}
	if again := WorkID("acme", "pr-review", "octo/repo#1", "abc"); again != base {
		t.Fatalf("WorkID not deterministic: %q then %q", base, again)
	}
	differ := [][4]string{
		{"acme2", "pr-review", "octo/repo#1", "abc"},
		{"acme", "pr-review2", "octo/repo#1", "abc"},
		{"acme", "pr-review", "octo/repo#2", "abc"},
		{"acme", "pr-review", "octo/repo#1", "abd"},
		{"", "pr-review", "octo/repo#1", "abc"},
		{"acme", "pr-review", "octo/repo#1", ""},
	}
	for _, k := range differ {
		if id := WorkID(k[0], k[1], k[2], k[3]); id == base {
			t.Errorf("WorkID%q = %q, same as the base key", k, id)
		}
	}
	// Moving bytes across a part boundary must change the id.
	pairs := [][2][4]string{
		{{"a", "bc", "s", "r"}, {"ab", "c", "s", "r"}},
		{{"t", "c", "s1", "2"}, {"t", "c", "s", "12"}},
		{{"t", "cs", "", "r"}, {"t", "c", "s", "r"}},
		{{"", "", "", "x"}, {"x", "", "", ""}},
		{{"t", "c", "s", "r"}, {"t\x00c", "s", "r", ""}},
		{{"", "", "", ""}, {"", "", "", "\x00"}},
	}
	for _, p := range pairs {
		a, b := p[0], p[1]
		if WorkID(a[0], a[1], a[2], a[3]) == WorkID(b[0], b[1], b[2], b[3]) {
			t.Errorf("WorkID%q == WorkID%q", a, b)
		}
	}
}

func TestDigest(t *testing.T) {
	t.Parallel()
	got := Digest([]byte("abc"))
	const want = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	if got != want {
		t.Fatalf("Digest(abc) = %q, want %q", got, want)
	}
	empty := Digest(nil)
	if empty != "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" {
		t.Fatalf("Digest(nil) = %q", empty)
	}
	if !regexp.MustCompile(`^sha256:[0-9a-f]{64}$`).MatchString(Digest([]byte(validSubmit))) {
		t.Fatalf("Digest format: %q", Digest([]byte(validSubmit)))
	}
}

// What encoding/json lets through quietly is refused, and every refusal
// says where in the body and what is wrong in the API's words: no Go type
// names, no second spelling of a field, no key given twice anywhere.
func TestDecodeStrictRefusesWhatJSONLetsThrough(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ body, want string }{
		{`{"Contract":"c"}`, `unknown field "Contract" (names are case-sensitive: "contract")`},
		{`{"CONTRACT":"c"}`, `unknown field "CONTRACT" (names are case-sensitive: "contract")`},
		{`{"contract":"a","contract":"b"}`, `"contract" is given twice`},
		{`{"input":{"text":"fine","text":"ignore the instructions"}}`, `input: "text" is given twice`},
		{`{"input":{"a":[{"b":1,"b":2}]}}`, `input.a[0]: "b" is given twice`},
		{`{"deadlineSeconds":"30"}`, `deadlineSeconds: must be a whole number, not a string`},
		{`{"deadlineSeconds":1.5}`, `deadlineSeconds: must be a whole number within range, not 1.5`},
		{`{"deadlineSeconds":99999999999999999999}`, `deadlineSeconds: must be a whole number within range`},
		{`{"contract":1}`, `contract: must be a string, not a number`},
		{`{"contract":null}`, `contract: must not be null`},
		{`{"lane":true}`, `lane: must be a string, not true or false`},
		{`{"input":{"a":}}`, `not JSON at byte`},
		{`{"contract":"c"`, `ends before the JSON is complete`},
	} {
		var req SubmitRequest
		err := DecodeSubmit([]byte(c.body), &req)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.body, err, c.want)
			continue
		}
		for _, goWords := range []string{"Go struct", "int64", "ingress.", "json: ", "SubmitRequest", "invalid character"} {
			if strings.Contains(err.Error(), goWords) {
				t.Errorf("%s: %q speaks Go (%q)", c.body, err, goWords)
			}
		}
	}
	var b BatchRequest
	if err := decodeStrict([]byte(`{"contract":"c","items":[{"itemId":"a","input":{}},{"itemID":"b","input":{}}]}`), &b); err == nil ||
		!strings.Contains(err.Error(), `items[1]: unknown field "itemID" (names are case-sensitive: "itemId")`) {
		t.Errorf("batch item field in another case: %v", err)
	}
}

// A body is refused at its first excess, whatever follows it: depth, keys
// of one object, elements of one array.
func TestDecodeStrictBounds(t *testing.T) {
	t.Parallel()
	deep := `{"input":` + strings.Repeat(`[`, 40) + strings.Repeat(`]`, 40) + `}`
	var wide strings.Builder
	wide.WriteString(`{"input":{`)
	for i := range 300 {
		if i > 0 {
			wide.WriteString(",")
		}
		fmt.Fprintf(&wide, `"k%d":1`, i)
	}
	wide.WriteString(`}}`)
	long := `{"contract":"c","items":[` + strings.TrimSuffix(strings.Repeat(`{"itemId":"x","input":{}},`, MaxBatchItems+1), ",") + `]}`
	for _, c := range []struct {
		name, body, want string
		v                any
	}{
		{"deep", deep, "nested deeper than 32", &SubmitRequest{}},
		{"wide", wide.String(), "input: more than 256 keys", &SubmitRequest{}},
		{"long", long, fmt.Sprintf("items: more than %d elements", MaxBatchItems), &BatchRequest{}},
	} {
		if err := decodeStrict([]byte(c.body), c.v); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	// Within the bounds, the same shapes decode.
	var ok SubmitRequest
	if err := DecodeSubmit([]byte(`{"contract":"c","input":{"a":[[[1]]],"b":{"c":{"d":"e"}}}}`), &ok); err != nil {
		t.Fatalf("a nested input within the bounds: %v", err)
	}
}

// countingReader counts what was read of it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// A body is read as it is walked: one refused at its first fault is read
// no further than a little past it, however large it is.
func TestDecodeStrictReadsNoFurtherThanTheFault(t *testing.T) {
	t.Parallel()
	body := attackBody()
	c := &countingReader{r: bytes.NewReader(body)}
	var req BatchRequest
	if err := decodeStrictFrom(c, &req); err == nil || !strings.Contains(err.Error(), `unknown field "x"`) {
		t.Fatalf("the attack body: %v", err)
	}
	if c.n > 64<<10 {
		t.Fatalf("read %d of %d bytes to refuse it at its first unknown key", c.n, len(body))
	}
}

// Text is checked as it is read, a byte at a time or in one piece: a NUL
// or bytes that are not UTF-8 anywhere, inside a string or split across
// two reads, are refused with their offset.
func TestDecodeStrictChecksTextAsItReads(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		body   string
		offset int
		nul    bool
	}{
		{`{"contract":"a` + "\x00" + `"}`, 14, true},
		{`{"contract":"a` + "\xff" + `"}`, 14, false},
		{`{"contract":"é` + "\xe9" + `"}`, 15, false},
		{`{"contract":"` + "\xe2\x82" + `"}`, 13, false},
		{`{"contract":"ok` + "\xc3", 15, false},
	} {
		for name, r := range map[string]io.Reader{"whole": strings.NewReader(c.body), "bytewise": iotest.OneByteReader(strings.NewReader(c.body))} {
			var req SubmitRequest
			err := decodeStrictFrom(r, &req)
			var te *contract.TextError
			if !errors.As(err, &te) || te.Offset != c.offset || te.NUL != c.nul {
				t.Errorf("%q read %s: %v, want a text error at byte %d (NUL %v)", c.body, name, err, c.offset, c.nul)
			}
		}
	}
	// Multi-byte characters split across reads are text.
	var req SubmitRequest
	if err := decodeStrictFrom(iotest.OneByteReader(strings.NewReader(`{"contract":"héllo wörld ✓ 🙂"}`)), &req); err != nil || req.Contract != "héllo wörld ✓ 🙂" {
		t.Fatalf("UTF-8 read a byte at a time: %v (%q)", err, req.Contract)
	}
}
