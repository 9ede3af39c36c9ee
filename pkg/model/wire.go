// Package model is the one adapter to an OpenAI-compatible chat-completions
// endpoint. This file holds the wire shapes and the message layout that the
// adapter sends and the simulated provider reads.
package model

import (
	"encoding/json"
	"errors"
	"math"
	"regexp"
	"strings"
)

// ChatRequest is the body of POST /v1/chat/completions.
type ChatRequest struct {
	Model          string          `json:"model"`
	Messages       []Message       `json:"messages"`
	ResponseFormat *ResponseFormat `json:"response_format,omitempty"`
	// User carries the tenant id so that a provider (and the simulated one)
	// can attribute every call.
	User        string   `json:"user,omitempty"`
	Temperature *float64 `json:"temperature,omitempty"`
	MaxTokens   int      `json:"max_tokens,omitempty"`
}

// Message is one chat message. Refusal and ToolCalls are read from an
// answer only: a model that declines (OpenAI structured outputs answer
// content null and a refusal) or calls a tool instead of answering.
type Message struct {
	Role      string            `json:"role"`
	Content   string            `json:"content"`
	Refusal   string            `json:"refusal,omitempty"`
	ToolCalls []json.RawMessage `json:"tool_calls,omitempty"`
}

// ResponseFormat asks for structured output against a JSON Schema.
type ResponseFormat struct {
	Type       string      `json:"type"` // "json_schema"
	JSONSchema *JSONSchema `json:"json_schema,omitempty"`
}

// JSONSchema names the contract and carries its schema file verbatim.
type JSONSchema struct {
	Name   string          `json:"name"`
	Strict bool            `json:"strict"`
	Schema json.RawMessage `json:"schema"`
}

// ChatResponse is the subset of a chat.completion answer assay reads.
type ChatResponse struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"`
	Created int64    `json:"created"`
	Model   string   `json:"model"`
	Choices []Choice `json:"choices"`
	Usage   Usage    `json:"usage"`
	// Error is set by providers that answer a failure with 2xx.
	Error json.RawMessage `json:"error,omitempty"`
}

// Choice is one completion choice.
type Choice struct {
	Index        int     `json:"index"`
	Message      Message `json:"message"`
	FinishReason string  `json:"finish_reason"`
}

// Usage is the provider's own count of units. The details are what
// OpenAI reports beside the counts: the prompt's units it read from its
// prompt cache, and the completion's units spent on hidden reasoning (both
// already counted in PromptTokens and CompletionTokens). A provider that
// sends no details leaves them zero.
type Usage struct {
	PromptTokens            int                     `json:"prompt_tokens"`
	CompletionTokens        int                     `json:"completion_tokens"`
	TotalTokens             int                     `json:"total_tokens"`
	PromptTokensDetails     PromptTokensDetails     `json:"prompt_tokens_details,omitzero"`
	CompletionTokensDetails CompletionTokensDetails `json:"completion_tokens_details,omitzero"`
}

// PromptTokensDetails is usage.prompt_tokens_details.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// CompletionTokensDetails is usage.completion_tokens_details.
type CompletionTokensDetails struct {
	ReasoningTokens int `json:"reasoning_tokens"`
}

// UnmarshalJSON reads prompt_tokens_details leniently: a detail that is
// not a whole number (null, a string, a fraction) reads as 0, so it never
// makes an answer unreadable, and 0 cached units never prices a call
// below what the provider may bill.
func (d *PromptTokensDetails) UnmarshalJSON(b []byte) error {
	var raw struct {
		CachedTokens json.RawMessage `json:"cached_tokens"`
	}
	_ = json.Unmarshal(b, &raw)
	*d = PromptTokensDetails{CachedTokens: wholeNumber(raw.CachedTokens)}
	return nil
}

// UnmarshalJSON reads completion_tokens_details as leniently as
// PromptTokensDetails.
func (d *CompletionTokensDetails) UnmarshalJSON(b []byte) error {
	var raw struct {
		ReasoningTokens json.RawMessage `json:"reasoning_tokens"`
	}
	_ = json.Unmarshal(b, &raw)
	*d = CompletionTokensDetails{ReasoningTokens: wholeNumber(raw.ReasoningTokens)}
	return nil
}

// wholeNumber is raw as an int, 0 when it is not a JSON whole number
// (12 and 12.0 are; "12", null and 12.5 are not).
func wholeNumber(raw json.RawMessage) int {
	var f float64
	if json.Unmarshal(raw, &f) != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return 0
	}
	return int(f)
}

// CachedInputTokens are the prompt's units the provider read from its
// prompt cache (usage.prompt_tokens_details.cached_tokens), within
// [0, PromptTokens]: a count outside it is not the provider's to bill.
func (u Usage) CachedInputTokens() int {
	return max(0, min(u.PromptTokensDetails.CachedTokens, u.PromptTokens))
}

// ReasoningTokens are the completion's units spent on reasoning the answer
// does not show (usage.completion_tokens_details.reasoning_tokens), within
// [0, CompletionTokens]: they are part of the completion, not beside it.
func (u Usage) ReasoningTokens() int {
	return max(0, min(u.CompletionTokensDetails.ReasoningTokens, u.CompletionTokens))
}

// Correlation is what the worker tells the model to echo back. It travels in
// the system message, never in the untrusted input.
type Correlation struct {
	WorkID string `json:"workId"`
	// SchemaVersion is the value the answer's schema version field must
	// hold, as the contract spells it (1, "change-review.v1", …).
	SchemaVersion   json.RawMessage `json:"schemaVersion"`
	TaxonomyVersion string          `json:"taxonomyVersion,omitempty"`
}

// correlationMarker starts the line of the system message that carries the
// correlation document.
const correlationMarker = "assay-correlation: "

// gateCodeRE matches a gate failure code such as "schema.violation".
var gateCodeRE = regexp.MustCompile(`gate: ([a-z_]+\.[a-z_]+):`)

// Messages lays out one call: the contract's instructions and the correlation
// line in the system message, and the untrusted input, verbatim, alone in
// the last user message. A repair re-ask adds a system line naming only the
// failed check, and the gate's detail as data in a user message of its own:
// the detail quotes the rejected answer, which an injected input may have
// shaped, so it never reaches the instructions.
func Messages(instructions string, c Correlation, repair string, input json.RawMessage) []Message {
	corr, _ := json.Marshal(c)
	msgs := []Message{{Role: "system", Content: strings.TrimRight(instructions, "\n") + "\n\n" + correlationMarker + string(corr)}}
	if repair != "" {
		code := "the gate"
		if m := gateCodeRE.FindStringSubmatch(repair); m != nil {
			code = "check " + m[1]
		}
		detail, _ := json.Marshal(map[string]string{"previousAnswerRejected": repair})
		msgs = append(msgs,
			Message{Role: "system", Content: "Your previous answer was rejected by " + code +
				". The next user message holds the rejection as data. Answer again with JSON that satisfies the schema."},
			Message{Role: "user", Content: string(detail)})
	}
	return append(msgs, Message{Role: "user", Content: string(input)})
}

// ErrNoCorrelation is returned by ParseCorrelation when no system message
// carries a correlation line.
var ErrNoCorrelation = errors.New("model: no correlation line in the system message")

// ParseCorrelation finds the correlation document in a request's messages.
func ParseCorrelation(msgs []Message) (Correlation, error) {
	for _, m := range msgs {
		if m.Role != "system" {
			continue
		}
		for _, l := range strings.Split(m.Content, "\n") {
			if rest, ok := strings.CutPrefix(l, correlationMarker); ok {
				var c Correlation
				if err := json.Unmarshal([]byte(rest), &c); err != nil {
					return Correlation{}, err
				}
				return c, nil
			}
		}
	}
	return Correlation{}, ErrNoCorrelation
}

// Input returns the content of the last user message: the untrusted input.
func Input(msgs []Message) string {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == "user" {
			return msgs[i].Content
		}
	}
	return ""
}
