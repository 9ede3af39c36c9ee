package classifier

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"assay.dev/pkg/model"
	"assay.dev/pkg/store"
)

func TestProviderBatchFromEnv(t *testing.T) {
	t.Parallel()
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	var off Config
	if err := off.FromEnv(env(nil)); err != nil || off.ProviderBatch.On {
		t.Fatalf("unset: on=%v err=%v", off.ProviderBatch.On, err)
	}
	var on Config
	if err := on.FromEnv(env(map[string]string{"ASSAY_PROVIDER_BATCH": "on", "ASSAY_PROVIDER_BATCH_URL": "https://batch.example/v1",
		"ASSAY_PROVIDER_BATCH_WINDOW": "48h", "ASSAY_PROVIDER_BATCH_MAX_LINES": "50", "ASSAY_PROVIDER_BATCH_FLUSH": "1m",
		"ASSAY_PROVIDER_BATCH_POLL": "10s"})); err != nil {
		t.Fatal(err)
	}
	want := ProviderBatch{On: true, URL: "https://batch.example/v1", Window: 48 * time.Hour, MaxLines: 50, Flush: time.Minute, PollEvery: 10 * time.Second}
	if on.ProviderBatch != want {
		t.Fatalf("read %+v, want %+v", on.ProviderBatch, want)
	}
	for name, kv := range map[string]map[string]string{
		"ASSAY_PROVIDER_BATCH":           {"ASSAY_PROVIDER_BATCH": "yes"},
		"ASSAY_PROVIDER_BATCH_URL":       {"ASSAY_PROVIDER_BATCH": "on", "ASSAY_PROVIDER_BATCH_URL": "ftp://x"},
		"ASSAY_PROVIDER_BATCH_URL ":      {"ASSAY_PROVIDER_BATCH_URL": "https://batch.example"}, // set while off
		"ASSAY_PROVIDER_BATCH_WINDOW":    {"ASSAY_PROVIDER_BATCH": "on", "ASSAY_PROVIDER_BATCH_WINDOW": "90m"},
		"ASSAY_PROVIDER_BATCH_MAX_LINES": {"ASSAY_PROVIDER_BATCH": "on", "ASSAY_PROVIDER_BATCH_MAX_LINES": "0"},
		"ASSAY_PROVIDER_BATCH_POLL":      {"ASSAY_PROVIDER_BATCH": "on", "ASSAY_PROVIDER_BATCH_POLL": "soon"},
	} {
		var c Config
		err := c.FromEnv(env(kv))
		if err == nil || !strings.Contains(err.Error(), strings.TrimSpace(name)) {
			t.Errorf("%v: error %v does not name %s", kv, err, name)
		}
	}
}

// lineOf matches by custom_id, so it is given the line found (or not) and
// says what the provider did with it.
func TestLineOf(t *testing.T) {
	t.Parallel()
	req, _ := json.Marshal(model.ChatRequest{Model: "m", Messages: []model.Message{{Role: "user", Content: "x"}}, MaxTokens: 100})
	line := store.BatchLine{AttemptID: "a1", Request: req}
	ok := `{"object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"{}"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`
	completed, expired, failed := model.BatchObject{ID: "b", Status: model.BatchCompleted}, model.BatchObject{ID: "b", Status: model.BatchExpired}, model.BatchObject{ID: "b", Status: model.BatchFailed}
	for _, tc := range []struct {
		name  string
		obj   model.BatchObject
		ol    model.BatchOutputLine
		found bool
		line  string
		kind  model.Kind // of the error, "" for none
	}{
		{"answered", completed, model.BatchOutputLine{CustomID: "a1", Response: &model.BatchResponse{StatusCode: 200, Body: json.RawMessage(ok)}}, true, store.LineAnswered, ""},
		{"answered 500", completed, model.BatchOutputLine{CustomID: "a1", Response: &model.BatchResponse{StatusCode: 500, Body: json.RawMessage(`{"error":{"message":"x"}}`)}}, true, store.LineFailed, model.KindTransient},
		{"answered 400", completed, model.BatchOutputLine{CustomID: "a1", Response: &model.BatchResponse{StatusCode: 400, Body: json.RawMessage(`{"error":{"message":"x"}}`)}}, true, store.LineFailed, model.KindRejected},
		{"answered 429", completed, model.BatchOutputLine{CustomID: "a1", Response: &model.BatchResponse{StatusCode: 429, Body: json.RawMessage(`{}`)}}, true, store.LineFailed, model.KindRateLimited},
		{"cut answer", completed, model.BatchOutputLine{CustomID: "a1", Response: &model.BatchResponse{StatusCode: 200, Body: json.RawMessage(`"{\"obj"`)}}, true, store.LineAnswered, model.KindMalformed},
		{"expired line", expired, model.BatchOutputLine{CustomID: "a1", Error: &model.BatchError{Code: model.ErrorCodeBatchExpired}}, true, store.LineExpired, model.KindTransient},
		{"error line", completed, model.BatchOutputLine{CustomID: "a1", Error: &model.BatchError{Code: "server_error"}}, true, store.LineFailed, model.KindTransient},
		{"invalid line", completed, model.BatchOutputLine{CustomID: "a1", Error: &model.BatchError{Code: "invalid_request"}}, true, store.LineFailed, model.KindRejected},
		{"missing", completed, model.BatchOutputLine{}, false, store.LineMissing, model.KindTransient},
		{"not run, expired", expired, model.BatchOutputLine{}, false, store.LineExpired, model.KindTransient},
		{"not run, failed", failed, model.BatchOutputLine{}, false, store.LineExpired, model.KindTransient},
		{"batch lost", model.BatchObject{ID: "b", Status: statusLost}, model.BatchOutputLine{}, false, store.LineMissing, model.KindTransient},
	} {
		r := lineOf(tc.obj, tc.ol, tc.found, line)
		if r.line != tc.line || !r.checkLease {
			t.Errorf("%s: line %q (check lease %v), want %q", tc.name, r.line, r.checkLease, tc.line)
		}
		var mErr *model.Error
		switch {
		case tc.kind == "" && r.err != nil:
			t.Errorf("%s: error %v, want none", tc.name, r.err)
		case tc.kind != "" && (!errors.As(r.err, &mErr) || mErr.Kind != tc.kind):
			t.Errorf("%s: error %v, want kind %s", tc.name, r.err, tc.kind)
		}
		if tc.line == store.LineAnswered && r.reply == nil {
			t.Errorf("%s: no reply", tc.name)
		}
		if tc.name == "answered" && (r.reply.Content != "{}" || r.reply.Usage.PromptTokens != 3) {
			t.Errorf("answered: reply %+v", r.reply)
		}
	}
}
