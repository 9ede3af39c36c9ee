package workapi

import (
	"assay.dev/pkg/api"
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestDecodeSubmitAccepts(t *testing.T) {
	t.Parallel()
	var req api.SubmitRequest
	if err := DecodeSubmit([]byte(validSubmit), &req); err != nil {
		t.Fatalf("decode: %v", err)
	}
	if req.Contract != "pr-review" || req.SourceID != "octo/repo#12" || req.Revision != "abc123" ||
		req.Lane != "interactive" || req.DeadlineSeconds != 30 || string(req.Input) != `{"diff":"x"}` {
		t.Fatalf("decoded %+v", req)
	}
	for _, body := range []string{validSubmit + "\n", " \t" + validSubmit + " \r\n", `{"contract":"c"}`, `{}`} {
		var r api.SubmitRequest
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
		var req api.SubmitRequest
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
		var req api.SubmitRequest
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

const validSubmit = `{"contract":"pr-review","sourceId":"octo/repo#12","revision":"abc123","lane":"interactive","input":{"diff":"x"},"deadlineSeconds":30}`
