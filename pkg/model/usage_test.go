package model

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// chatBody is a chat.completion whose usage is usage.
func chatBody(usage string) string {
	return `{"id":"chatcmpl-7","object":"chat.completion","created":1,"model":"m-served",
"choices":[{"index":0,"message":{"role":"assistant","content":"{}"},"finish_reason":"stop"}],"usage":` + usage + `}`
}

// The reply carries the provider's cached and reasoning units, its
// answer's id and each choice's finish reason.
func TestReplyReadsUsageDetails(t *testing.T) {
	t.Parallel()
	b := setup(t, answer(200, chatBody(`{"prompt_tokens":2006,"completion_tokens":300,"total_tokens":2306,
		"prompt_tokens_details":{"cached_tokens":1920,"audio_tokens":0},
		"completion_tokens_details":{"reasoning_tokens":192,"audio_tokens":0,"accepted_prediction_tokens":0}}`)))
	rep, err := b.client.Complete(context.Background(), testCall)
	if err != nil {
		t.Fatal(err)
	}
	u := rep.Usage
	if u.PromptTokens != 2006 || u.CompletionTokens != 300 || u.CachedInputTokens() != 1920 || u.ReasoningTokens() != 192 {
		t.Fatalf("usage %+v: cached %d, reasoning %d", u, u.CachedInputTokens(), u.ReasoningTokens())
	}
	if rep.ID != "chatcmpl-7" || !slices.Equal(rep.FinishReasons, []string{"stop"}) {
		t.Fatalf("id %q, finish reasons %q", rep.ID, rep.FinishReasons)
	}
}

// A detail the client cannot read, or one outside the counts it details,
// neither fails the answer nor reads as more than the provider may bill
// at the cached price.
func TestUsageDetailsReadLeniently(t *testing.T) {
	t.Parallel()
	const counts = `"prompt_tokens":100,"completion_tokens":50,"total_tokens":150`
	for _, c := range []struct {
		name, details     string
		cached, reasoning int
	}{
		{"none", ``, 0, 0},
		{"null", `,"prompt_tokens_details":null,"completion_tokens_details":null`, 0, 0},
		{"null counts", `,"prompt_tokens_details":{"cached_tokens":null},"completion_tokens_details":{"reasoning_tokens":null}`, 0, 0},
		{"strings", `,"prompt_tokens_details":{"cached_tokens":"40"},"completion_tokens_details":{"reasoning_tokens":"9"}`, 0, 0},
		{"whole floats", `,"prompt_tokens_details":{"cached_tokens":40.0},"completion_tokens_details":{"reasoning_tokens":9.0}`, 40, 9},
		{"fractions", `,"prompt_tokens_details":{"cached_tokens":40.5},"completion_tokens_details":{"reasoning_tokens":9.5}`, 0, 0},
		{"negative", `,"prompt_tokens_details":{"cached_tokens":-40},"completion_tokens_details":{"reasoning_tokens":-9}`, 0, 0},
		{"past the counts", `,"prompt_tokens_details":{"cached_tokens":400},"completion_tokens_details":{"reasoning_tokens":90}`, 100, 50},
		{"not objects", `,"prompt_tokens_details":40,"completion_tokens_details":[9]`, 0, 0},
	} {
		b := setup(t, answer(200, chatBody(`{`+counts+c.details+`}`)))
		rep, err := b.client.Complete(context.Background(), testCall)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		u := rep.Usage
		if u.PromptTokens != 100 || u.CompletionTokens != 50 || u.CachedInputTokens() != c.cached || u.ReasoningTokens() != c.reasoning {
			t.Errorf("%s: usage %+v reads cached %d, reasoning %d; want %d, %d", c.name, u, u.CachedInputTokens(),
				u.ReasoningTokens(), c.cached, c.reasoning)
		}
	}
}

// Written, a usage without details is the plain three counts, and one
// with details has them where OpenAI puts them.
func TestUsageDetailsOnTheWire(t *testing.T) {
	t.Parallel()
	plain, _ := json.Marshal(Usage{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7})
	if string(plain) != `{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}` {
		t.Fatalf("plain usage %s", plain)
	}
	u := Usage{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7,
		PromptTokensDetails: PromptTokensDetails{CachedTokens: 2}, CompletionTokensDetails: CompletionTokensDetails{ReasoningTokens: 1}}
	detailed, _ := json.Marshal(u)
	if !strings.Contains(string(detailed), `"prompt_tokens_details":{"cached_tokens":2}`) ||
		!strings.Contains(string(detailed), `"completion_tokens_details":{"reasoning_tokens":1}`) {
		t.Fatalf("detailed usage %s", detailed)
	}
	var back Usage
	if err := json.Unmarshal(detailed, &back); err != nil || back != u {
		t.Fatalf("read back %+v, %v; want %+v", back, err, u)
	}
}
