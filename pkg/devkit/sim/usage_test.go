package sim

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"assay.dev/pkg/model"
)

// simCall is a moderation call for tenant to modelName carrying text.
func simCall(tenant, modelName, text string) model.Call {
	in, _ := json.Marshal(map[string]string{"text": text})
	return model.Call{Tenant: tenant, Contract: ContractModeration, Schema: json.RawMessage(`{}`), Model: modelName,
		Messages: model.Messages(strings.Repeat("Moderate the post. ", 8), model.Correlation{WorkID: "w1",
			SchemaVersion: json.RawMessage(`"moderation/1"`)}, "", in)}
}

// promptOf is the text the simulated provider counts and caches of call.
func promptOf(call model.Call) string {
	var b strings.Builder
	for _, m := range call.Messages {
		b.WriteString(m.Content)
	}
	return b.String()
}

// cachedFor is what a prompt cache of minUnits, then blocks of blockUnits,
// reads of a prompt whose first common bytes it saw before.
func cachedFor(common, minUnits, blockUnits int) int {
	if common < minUnits*4 {
		return 0
	}
	return minUnits + (common-minUnits*4)/(blockUnits*4)*blockUnits
}

func commonPrefix(a, b string) int {
	n := 0
	for n < min(len(a), len(b)) && a[n] == b[n] {
		n++
	}
	return n
}

// With a prompt cache, a prompt whose start the provider answered before
// (for the same model) reports that start, cut to the cache's steps, as
// cached_tokens, and the model client reads it; reasoning units are
// reported within the completion. The tenant's stats count both.
func TestUsageDetailsPromptCacheAndReasoning(t *testing.T) {
	t.Parallel()
	s, base := start(t)
	mc := &model.Client{BaseURL: APIBase(base), Model: "m1"}
	complete := func(call model.Call) model.Usage {
		t.Helper()
		rep, err := mc.Complete(context.Background(), call)
		if err != nil {
			t.Fatal(err)
		}
		return rep.Usage
	}
	first := simCall("acme", "m1", "buy now, free money")
	if u := complete(first); u.CachedInputTokens() != 0 || strings.Contains(string(mustJSON(t, u)), "details") {
		t.Fatalf("without usage details the usage is %+v", u)
	}
	if err := s.SetUsageDetails(UsageDetails{CacheMinTokens: 16, CacheBlockTokens: 4, ReasoningTokens: 7}); err != nil {
		t.Fatal(err)
	}
	if u := complete(first); u.CachedInputTokens() != 0 || u.ReasoningTokens() != 7 {
		t.Fatalf("a first prompt: cached %d, reasoning %d; want 0, 7", u.CachedInputTokens(), u.ReasoningTokens())
	}
	second := simCall("globex", "m1", "a post about cats")
	want := cachedFor(commonPrefix(promptOf(first), promptOf(second)), 16, 4)
	if u := complete(second); want == 0 || u.CachedInputTokens() != want {
		t.Fatalf("a prompt sharing its start: cached %d, want %d", u.CachedInputTokens(), want)
	}
	if u := complete(second); u.CachedInputTokens() != cachedFor(len(promptOf(second)), 16, 4) {
		t.Fatalf("the same prompt again: cached %d of %d prompt units", u.CachedInputTokens(), u.PromptTokens)
	}
	if u := complete(simCall("acme", "m2", "a post about cats")); u.CachedInputTokens() != 0 {
		t.Fatalf("another model's prompt: cached %d, want 0", u.CachedInputTokens())
	}
	st := s.Stats().Tenants
	if st["globex"].CachedPromptUnits != int64(want+cachedFor(len(promptOf(second)), 16, 4)) || st["acme"].ReasoningUnits != 14 {
		t.Fatalf("stats %+v", st)
	}
}

// /sim/usage-details sets, shows and clears the usage details.
func TestUsageDetailsOverHTTP(t *testing.T) {
	t.Parallel()
	s, base := start(t)
	url := base + "/sim/usage-details"
	if r := mustDo(t, "POST", url, `{"cacheMinTokens":1024}`); r.status != http.StatusOK ||
		!strings.Contains(string(r.body), `"cacheBlockTokens":128`) {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	if got := s.UsageDetails(); got != (UsageDetails{CacheMinTokens: 1024, CacheBlockTokens: 128}) {
		t.Fatalf("details %+v", got)
	}
	for _, bad := range []string{`{"cacheMinTokens":-1}`, `{"cacheBlockTokens":64}`, `{"cachedShare":0.5}`} {
		if r := mustDo(t, "POST", url, bad); r.status != http.StatusBadRequest {
			t.Errorf("POST %s: %d %s", bad, r.status, r.body)
		}
	}
	if r := mustDo(t, "DELETE", url, nil); r.status != http.StatusNoContent || s.UsageDetails() != (UsageDetails{}) {
		t.Fatalf("DELETE: %d, details %+v", r.status, s.UsageDetails())
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
