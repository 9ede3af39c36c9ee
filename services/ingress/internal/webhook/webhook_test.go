package webhook

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"assay.dev/pkg/api"
	"assay.dev/services/ingress/internal/door"
)

func TestDecodePullRequestEvent(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]struct{ action, head string }{
		"pull_request_opened.json":      {"opened", headOpened},
		"pull_request_synchronize.json": {"synchronize", headSync},
		"pull_request_reopened.json":    {"reopened", headSync},
		"pull_request_closed.json":      {"closed", headSync},
	} {
		e, err := DecodePullRequestEvent(readPayload(t, name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if e.Action != want.action || e.Number != 41 || e.PullRequest.Head.SHA != want.head ||
			e.Repository.FullName != "shop/checkout" || e.Installation == nil || e.Installation.ID != 51234567 ||
			e.Owner() != "shop" || e.Repo() != "checkout" || e.SourceID() != prSource ||
			e.PullRequest.Title != "Mark orders paid on confirmation and shipped from the warehouse" {
			t.Fatalf("%s: decoded %+v", name, e)
		}
	}

	// A repository webhook has no installation; GitHub adds fields over time.
	e, err := DecodePullRequestEvent(mutate(t, "pull_request_opened.json", func(m map[string]any) {
		delete(m, "installation")
		m["some_future_field"] = map[string]any{"nested": []any{1, "x", nil}}
		pull(m)["head"].(map[string]any)["future"] = true
	}))
	if err != nil || e.Installation != nil {
		t.Fatalf("without installation, with new fields: %+v, %v", e, err)
	}
	if e, err := DecodePullRequestEvent(mutate(t, "pull_request_opened.json", func(m map[string]any) { m["installation"] = nil })); err != nil || e.Installation != nil {
		t.Fatalf("installation null: %+v, %v", e, err)
	}

	refused := map[string]func(map[string]any){
		"number as string":       func(m map[string]any) { m["number"] = "41" },
		"number fractional":      func(m map[string]any) { m["number"] = 41.5 },
		"number zero":            func(m map[string]any) { m["number"] = 0; pull(m)["number"] = 0 },
		"number negative":        func(m map[string]any) { m["number"] = -41; pull(m)["number"] = -41 },
		"numbers disagree":       func(m map[string]any) { pull(m)["number"] = 42 },
		"no pull_request":        func(m map[string]any) { delete(m, "pull_request") },
		"pull_request array":     func(m map[string]any) { m["pull_request"] = []any{} },
		"head sha missing":       func(m map[string]any) { delete(pull(m)["head"].(map[string]any), "sha") },
		"head sha number":        func(m map[string]any) { pull(m)["head"].(map[string]any)["sha"] = 12345 },
		"head sha short":         func(m map[string]any) { pull(m)["head"].(map[string]any)["sha"] = headOpened[:12] },
		"head sha upper":         func(m map[string]any) { pull(m)["head"].(map[string]any)["sha"] = strings.ToUpper(headOpened) },
		"head sha ref":           func(m map[string]any) { pull(m)["head"].(map[string]any)["sha"] = "refs/heads/main" },
		"title number":           func(m map[string]any) { pull(m)["title"] = 7 },
		"action missing":         func(m map[string]any) { delete(m, "action") },
		"action bool":            func(m map[string]any) { m["action"] = true },
		"action odd":             func(m map[string]any) { m["action"] = "Opened; DROP" },
		"repository missing":     func(m map[string]any) { delete(m, "repository") },
		"full_name no owner":     func(m map[string]any) { m["repository"].(map[string]any)["full_name"] = "checkout" },
		"full_name traversal":    func(m map[string]any) { m["repository"].(map[string]any)["full_name"] = "shop/.." },
		"full_name dot":          func(m map[string]any) { m["repository"].(map[string]any)["full_name"] = "shop/." },
		"full_name deep":         func(m map[string]any) { m["repository"].(map[string]any)["full_name"] = "shop/a/b" },
		"full_name space":        func(m map[string]any) { m["repository"].(map[string]any)["full_name"] = "shop/check out" },
		"full_name query":        func(m map[string]any) { m["repository"].(map[string]any)["full_name"] = "shop/x?y" },
		"installation id string": func(m map[string]any) { m["installation"].(map[string]any)["id"] = "51234567" },
		"installation id zero":   func(m map[string]any) { m["installation"].(map[string]any)["id"] = 0 },
		"installation array":     func(m map[string]any) { m["installation"] = []any{1} },
	}
	for name, edit := range refused {
		if e, err := DecodePullRequestEvent(mutate(t, "pull_request_opened.json", edit)); err == nil {
			t.Errorf("%s: accepted as %+v", name, e)
		}
	}
	opened := readPayload(t, "pull_request_opened.json")
	for name, body := range map[string][]byte{
		"null": []byte("null"), "array": []byte("[]"), "string": []byte(`"x"`), "empty": nil,
		"trailing object": append(bytes.Clone(opened), "{}"...), "trailing garbage": append(bytes.Clone(opened), 'x'),
		"truncated": opened[:len(opened)-3], "huge number": []byte(`{"action":"opened","number":1e400}`),
	} {
		if e, err := DecodePullRequestEvent(body); err == nil {
			t.Errorf("%s: accepted as %+v", name, e)
		}
	}
}

func FuzzWebhook(f *testing.F) {
	// Minimizing an input costs time quadratic in its length, so the seeds
	// are the pull_request shape cut down to what the decoder reads plus a
	// field it must skip; the full payloads are exercised by the tests.
	const seed = `{"action":%q,"number":41,"pull_request":{"number":41,"title":"Fix cart","draft":false,` +
		`"head":{"sha":%q}},"repository":{"id":7,"full_name":"shop/checkout"}%s}`
	for _, s := range []string{
		fmt.Sprintf(seed, "opened", headOpened, `,"installation":{"id":51234567}`),
		fmt.Sprintf(seed, "synchronize", headSync, `,"before":"`+headOpened+`","installation":null`),
		fmt.Sprintf(seed, "closed", headSync, ""),
		`{"zen":"Keep it logically awesome.","hook_id":4}`,
		`{}`, `null`, `[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		_ = api.VerifySignature(testSecret, body, string(body))
		e, err := DecodePullRequestEvent(body)
		if err != nil {
			return
		}
		if !json.Valid(body) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		// What an accepted payload yields must pass the same checks as an
		// API submission, and name a safe API path.
		if !door.SourceRE.MatchString(e.SourceID()) || !door.RevisionRE.MatchString(e.PullRequest.Head.SHA) {
			t.Fatalf("accepted source %q revision %q", e.SourceID(), e.PullRequest.Head.SHA)
		}
		if e.Owner() == "" || e.Repo() == "" || e.Repo() == "." || e.Repo() == ".." || strings.Contains(e.Repo(), "/") {
			t.Fatalf("accepted repository %q", e.Repository.FullName)
		}
		if e.Number <= 0 || (e.Installation != nil && e.Installation.ID <= 0) {
			t.Fatalf("accepted number %d installation %+v", e.Number, e.Installation)
		}
		if in, err := reviewInput("diff", e.PullRequest.Title); err != nil || !json.Valid(in) {
			t.Fatalf("review input from title %q: %q, %v", e.PullRequest.Title, in, err)
		}
	})
}

func TestReviewInputTitle(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 400)
	for title, want := range map[string]string{
		"Fix <cart> & totals":   "Fix <cart> & totals",
		"a\x00b\nc\u202e":       "a b c\u202e",
		"  padded\t":            "padded",
		long:                    strings.Repeat("é", 300),
		"bad \xff utf8":         "bad \uFFFD utf8",
		"":                      "",
		"\x1b[31mred\x1b[0m ok": "[31mred [0m ok",
	} {
		in, err := reviewInput("d", title)
		if err != nil {
			t.Fatal(err)
		}
		var got struct{ Diff, Title string }
		if err := json.Unmarshal(in, &got); err != nil || got.Title != want || got.Diff != "d" {
			t.Errorf("title %q: input %s (%v), want title %q", title, in, err, want)
		}
	}
}

const (
	testSecret = "whsec-4c1f0e7a9b2d"
	headOpened = "9f1c2a7d4e5b6c8a0f1e2d3c4b5a69788776655a"
	headSync   = "3b8e0c6f1a2d4e5f60718293a4b5c6d7e8f90a1b"
	prSource   = "shop/checkout#41"
)

// readPayload reads a delivery GitHub sent, from the service's testdata.
func readPayload(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// mutate rewrites a testdata payload, as GitHub would send a variant of it.
func mutate(t testing.TB, name string, edit func(map[string]any)) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(readPayload(t, name), &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func pull(m map[string]any) map[string]any { return m["pull_request"].(map[string]any) }
