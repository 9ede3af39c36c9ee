package api

import (
	"regexp"
	"strings"
	"testing"
)

const validSubmit = `{"contract":"pr-review","sourceId":"octo/repo#12","revision":"abc123","lane":"interactive","input":{"diff":"x"},"deadlineSeconds":30}`

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

// GitHub's published example for X-Hub-Signature-256.
func TestSignatureTestVector(t *testing.T) {
	t.Parallel()
	const (
		secret  = "It's a Secret to Everybody"
		payload = "Hello, World!"
		want    = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
	)
	if got := Sign(secret, []byte(payload)); got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
	if !VerifySignature(secret, []byte(payload), want) {
		t.Fatal("the published test vector does not verify")
	}
	refused := map[string]struct{ secret, payload, header string }{
		"other payload":    {secret, payload + " ", want},
		"other secret":     {secret + ".", payload, want},
		"empty secret":     {"", payload, Sign("", []byte(payload))},
		"one digit off":    {secret, payload, want[:len(want)-1] + "f"},
		"truncated":        {secret, payload, want[:len(want)-2]},
		"extended":         {secret, payload, want + "00"},
		"no prefix":        {secret, payload, strings.TrimPrefix(want, "sha256=")},
		"sha1 prefix":      {secret, payload, "sha1=" + strings.TrimPrefix(want, "sha256=")},
		"not hex":          {secret, payload, "sha256=" + strings.Repeat("zz", 32)},
		"empty":            {secret, payload, ""},
		"prefix only":      {secret, payload, "sha256="},
		"leading space":    {secret, payload, " " + want},
		"upper-case sha":   {secret, payload, "SHA256=" + strings.TrimPrefix(want, "sha256=")},
		"odd length hex":   {secret, payload, want + "0"},
		"empty body match": {secret, "", want},
	}
	for name, c := range refused {
		if VerifySignature(c.secret, []byte(c.payload), c.header) {
			t.Errorf("%s: verified %q", name, c.header)
		}
	}
}
