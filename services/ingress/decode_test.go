package ingress

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
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
