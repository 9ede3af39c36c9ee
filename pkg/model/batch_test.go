package model

import (
	"encoding/json"
	"testing"
)

func TestParseBatchOutputMatchesByCustomID(t *testing.T) {
	t.Parallel()
	raw := []byte(`{"id":"r2","custom_id":"b","response":{"status_code":200,"body":{"object":"chat.completion","choices":[{"message":{"role":"assistant","content":"{\"n\":2}"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2}}}}
not json
{"id":"r0","response":{"status_code":200,"body":{}}}

{"id":"r1","custom_id":"a","response":null,"error":{"code":"batch_expired","message":"late"}}
`)
	lines, bad := ParseBatchOutput(raw)
	if bad != 2 || len(lines) != 2 || lines[0].CustomID != "b" || lines[1].CustomID != "a" {
		t.Fatalf("lines %+v, %d unreadable; want b then a, and 2 unreadable", lines, bad)
	}
	req, _ := json.Marshal(ChatRequest{Model: "m", MaxTokens: 10})
	rep, err := LineReply(req, *lines[0].Response)
	if err != nil || rep.Content != `{"n":2}` || rep.Usage.PromptTokens != 5 || rep.Model != "m" || !rep.Sent {
		t.Fatalf("reply %+v, %v", rep, err)
	}
	if lines[1].Error.Code != ErrorCodeBatchExpired {
		t.Fatalf("error line %+v", lines[1])
	}
}

func FuzzBatchOutput(f *testing.F) {
	f.Add([]byte(`{"custom_id":"a","response":{"status_code":200,"body":{"choices":[]}}}`))
	f.Add([]byte(`{"custom_id":"a","response":{"status_code":429,"body":{"error":{"message":"slow down"}}}}` + "\n{}"))
	f.Add([]byte("\xff\xfe\x00"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		lines, bad := ParseBatchOutput(raw)
		if bad < 0 {
			t.Fatal("negative count")
		}
		for _, l := range lines {
			if l.CustomID == "" {
				t.Fatal("a line without a custom_id was kept")
			}
			if l.Response != nil {
				rep, err := LineReply(raw, *l.Response)
				if rep == nil || (err == nil && (l.Response.StatusCode < 200 || l.Response.StatusCode > 299)) {
					t.Fatalf("status %d read as an answer", l.Response.StatusCode)
				}
			}
		}
	})
}
