package request

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"assay.dev/pkg/api"
	"assay.dev/pkg/contract"
)

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
		var req api.SubmitRequest
		err := Decode([]byte(c.body), &req)
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
	var b api.BatchRequest
	if err := Decode([]byte(`{"contract":"c","items":[{"itemId":"a","input":{}},{"itemID":"b","input":{}}]}`), &b); err == nil ||
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
	long := `{"contract":"c","items":[` + strings.TrimSuffix(strings.Repeat(`{"itemId":"x","input":{}},`, api.MaxBatchItems+1), ",") + `]}`
	for _, c := range []struct {
		name, body, want string
		v                any
	}{
		{"deep", deep, "nested deeper than 32", &api.SubmitRequest{}},
		{"wide", wide.String(), "input: more than 256 keys", &api.SubmitRequest{}},
		{"long", long, fmt.Sprintf("items: more than %d elements", api.MaxBatchItems), &api.BatchRequest{}},
	} {
		if err := Decode([]byte(c.body), c.v); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	// Within the bounds, the same shapes decode.
	var ok api.SubmitRequest
	if err := Decode([]byte(`{"contract":"c","input":{"a":[[[1]]],"b":{"c":{"d":"e"}}}}`), &ok); err != nil {
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
	var req api.BatchRequest
	if err := decodeFrom(c, &req); err == nil || !strings.Contains(err.Error(), `unknown field "x"`) {
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
			var req api.SubmitRequest
			err := decodeFrom(r, &req)
			var te *contract.TextError
			if !errors.As(err, &te) || te.Offset != c.offset || te.NUL != c.nul {
				t.Errorf("%q read %s: %v, want a text error at byte %d (NUL %v)", c.body, name, err, c.offset, c.nul)
			}
		}
	}
	// Multi-byte characters split across reads are text.
	var req api.SubmitRequest
	if err := decodeFrom(iotest.OneByteReader(strings.NewReader(`{"contract":"héllo wörld ✓ 🙂"}`)), &req); err != nil || req.Contract != "héllo wörld ✓ 🙂" {
		t.Fatalf("UTF-8 read a byte at a time: %v (%q)", err, req.Contract)
	}
}

// A string whose JSON escapes spell a NUL or a surrogate half alone is
// refused with where it is, as a value or a key, in a field or in a free
// input; escapes that spell text (a pair, U+FFFD itself, an escaped
// backslash before "ud800") pass, read whole or a byte at a time.
func TestDecodeStrictRefusesEscapesThatAreNotText(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		body, path string
		key, nul   bool
	}{
		{`{"contract":"a\u0000b"}`, "contract", false, true},
		{`{"contract":"\ud800"}`, "contract", false, false},
		{`{"contract":"x\uDBFFy"}`, "contract", false, false},
		{`{"contract":"\udc00\ud800"}`, "contract", false, false},
		{`{"contract":"\ud800\u0041"}`, "contract", false, false},
		{`{"contract":"\ud800` + "\uFFFD" + `"}`, "contract", false, false},
		{`{"input":{"text":"\udfff"}}`, "input.text", false, false},
		{`{"input":{"a":["ok","\u0000"]}}`, "input.a[1]", false, true},
		{`{"input":{"k\u0000":1}}`, "input", true, true},
		{`{"input":{"\ud800":1}}`, "input", true, false},
		{`{"sou\u0000rceId":"x"}`, "", true, true},
	} {
		for name, read := range map[string]func() error{
			"whole": func() error { var r api.SubmitRequest; return Decode([]byte(c.body), &r) },
			"bytewise": func() error {
				var r api.SubmitRequest
				return decodeFrom(iotest.OneByteReader(strings.NewReader(c.body)), &r)
			},
		} {
			var ee *EscapeError
			if err := read(); !errors.As(err, &ee) || ee.Path != c.path || ee.Key != c.key || ee.NUL != c.nul {
				t.Errorf("%s read %s: %v, want an escape error at %q (key %v, NUL %v)", c.body, name, err, c.path, c.key, c.nul)
			}
		}
	}
	for _, body := range []string{
		`{"contract":"\ud83d\ude00 \uD83D\uDE00"}`,
		`{"contract":"\ufffd and ` + "\uFFFD" + `"}`,
		`{"contract":"\\ud800"}`,
		`{"contract":"\\\ud83d\ude00\"\\"}`,
		`{"input":{"note":"a \"quoted\" \ufffd"}}`,
	} {
		var r api.SubmitRequest
		if err := Decode([]byte(body), &r); err != nil {
			t.Errorf("%s: %v, want it read", body, err)
		}
	}
}

// loneSurrogate reads a literal's escapes in order: an escaped backslash
// starts no escape, and a high half is paired only by a low half right
// after it.
func TestLoneSurrogate(t *testing.T) {
	t.Parallel()
	for lit, want := range map[string]bool{
		``: false, `plain`: false, `\ud83d\ude00`: false, `\\ud800`: false, `\\\ud83d\ude00`: false,
		`\ud800`: true, `\\\ud800`: true, `\udc00`: true, `\ud83d`: true, `\ud83dx\ude00`: true,
		`\ud83d\u0041`: true, `\ud83d\ud83d\ude00`: true, `\ud83d\ude00\ude00`: true, `\u00e9\ud800`: true,
	} {
		if got := loneSurrogate([]byte(lit)); got != want {
			t.Errorf("loneSurrogate(%s) = %v, want %v", lit, got, want)
		}
	}
	for b, want := range map[string]string{`"x"`: `x`, `"a\"b"`: `a\"b`, `{"k":"a\\"`: `a\\`, `"\\\""`: `\\\"`, `x`: ``} {
		if got := string(rawString([]byte(b))); got != want {
			t.Errorf("rawString(%s) = %s, want %s", b, got, want)
		}
	}
}
