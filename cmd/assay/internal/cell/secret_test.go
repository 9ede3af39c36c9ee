package cell_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/model"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/telemetry"
	"assay.dev/services/classifier"
	"assay.dev/services/ingress"
)

// secret is a credential a diff carries; a model quotes it back.
const secret = "CUSTOMER-SECRET-hunter2"

const secretDiff = "diff --git a/config/db.go b/config/db.go\n--- a/config/db.go\n+++ b/config/db.go\n" +
	"@@ -1,3 +1,4 @@\n package config\n \n+const dbPassword = \"" + secret + "\"\n var host = \"db\"\n"

var secretLine = `const dbPassword = "` + secret + `"`

// quoting is a provider whose every answer quotes the secret, each way
// picked by the title of the work: in a field that fails the gate, in an
// error it returns, or in an answer that passes.
func quoting(t *testing.T) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var req model.ChatRequest
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			corr, _ := model.ParseCorrelation(req.Messages)
			var in struct{ Title string }
			_ = json.Unmarshal([]byte(model.Input(req.Messages)), &in)
			good := sim.CodeFinding{File: "config/db.go", Line: 3, Severity: "blocking", Summary: "A database password is committed.", Evidence: secretLine}
			review := sim.CodeReview{SchemaVersion: json.RawMessage("1"), ChangeID: corr.WorkID, Findings: []sim.CodeFinding{good}}
			var content string
			switch in.Title {
			case "accepted":
			case "enum":
				review.Findings[0].Severity = secret
			case "changeid":
				review.ChangeID = secret
			case "schemaversion":
				review.SchemaVersion = json.RawMessage(`"` + secret + `"`)
			case "file":
				review.Findings[0].File = secret + ".go"
			case "line":
				review.Findings[0].Line = 40
			case "evidence":
				review.Findings[0].Evidence = "password := \"" + secret + "-rotated\""
			case "duplicate":
				review.Findings = append(review.Findings, good)
			case "extra", "notjson":
			case "provider400":
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadRequest)
				fmt.Fprintf(w, `{"error":{"message":"Content rejected: %s appears to be a credential","type":"invalid_request_error"}}`, secret)
				return
			case "provider500":
				w.Header().Set("Content-Type", "text/html")
				w.WriteHeader(http.StatusBadGateway)
				fmt.Fprintf(w, "<html>upstream echoed your request: %s</html>", secretLine)
				return
			default:
				t.Errorf("no answer for title %q", in.Title)
			}
			b, _ := json.Marshal(review)
			content = string(b)
			switch in.Title {
			case "extra":
				content = strings.TrimSuffix(content, "}") + `,"` + secret + `":true}`
			case "notjson":
				content = "Here is the review. " + secretLine + " is a committed password."
			}
			resp := model.ChatResponse{ID: "chatcmpl-q", Object: "chat.completion", Created: time.Now().Unix(), Model: req.Model,
				Choices: []model.Choice{{Message: model.Message{Role: "assistant", Content: content}, FinishReason: "stop"}}}
			resp.Usage.PromptTokens, resp.Usage.CompletionTokens = 300, len(content)/4
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(resp)
		})
	}
}

// A diff carrying a credential goes through every way an answer is
// refused — each gate check the model's text can fail, a provider that
// quotes it in an error, and input refused at the edge — and through an
// answer that passes: the credential is in no log line, no span (name,
// attribute, status or event) and no metric.
func TestSecretReachesNoTelemetry(t *testing.T) {
	t.Parallel()
	logs := &lockedBuffer{}
	spans := tracetest.NewInMemoryExporter()
	b := celltest.SetupFront(t, cell.Options{
		Log:        telemetry.NewLogger(logs, "test", "us", slog.LevelDebug),
		Telemetry:  []telemetry.Option{telemetry.WithSpanProcessor(sdktrace.NewSimpleSpanProcessor(spans))},
		Classifier: classifier.Config{MaxAttempts: 2, BackoffBase: 50 * time.Millisecond, BackoffCap: 100 * time.Millisecond},
	}, quoting(t))

	want := map[string]string{
		"accepted":      outcome.Accepted,
		"enum":          "schema.violation",
		"extra":         "schema.violation",
		"changeid":      "correlation.work_id",
		"schemaversion": "schema.violation",
		"file":          "grounding.file_not_in_diff",
		"line":          "grounding.line_outside_hunk",
		"evidence":      "grounding.evidence_not_in_diff",
		"duplicate":     "policy.duplicate_finding",
		"notjson":       "syntax.invalid_json",
		"provider400":   outcome.TransportRejected,
		"provider500":   outcome.RetryExhausted,
	}
	ids := map[string]string{}
	for title := range want {
		in, _ := json.Marshal(map[string]string{"diff": secretDiff, "title": title})
		_, r := b.Submit(t, ingress.SubmitRequest{Contract: "code-review", SourceID: "vault/config#" + title, Revision: "r1", Input: in})
		ids[title] = r.WorkID
	}
	for title, id := range ids {
		v := b.Wait(t, id)
		got, w := *v.Outcome, want[title]
		if strings.Contains(w, ".") {
			// A gate check: the work ends schema_rejected naming it.
			if got != outcome.SchemaRejected || !strings.Contains(v.Reason, w) {
				t.Errorf("%s: %s (%s), want schema_rejected by %s", title, got, v.Reason, w)
			}
		} else if got != w {
			t.Errorf("%s: %s (%s), want %s", title, got, v.Reason, w)
		}
		if strings.Contains(v.Reason, secret) || strings.Contains(v.Reason, "hunter2") {
			t.Errorf("%s: the work's reason quotes the secret: %s", title, v.Reason)
		}
	}
	// Input refused at the edge, naming the secret where a caller might.
	for name, input := range map[string]string{
		"unknown input property": `{"diff":` + quoteJSON(secretDiff) + `,"` + secret + `":1}`,
		"diff that is no diff":   `{"diff":` + quoteJSON("+"+secretLine+"\n") + `}`,
	} {
		status, raw := b.Post(t, b.Token, ingress.SubmitRequest{Contract: "code-review", SourceID: "vault/refused#1", Revision: "r1", Input: json.RawMessage(input)})
		if status != http.StatusBadRequest {
			t.Errorf("%s: HTTP %d %s, want 400", name, status, raw)
		}
	}

	resp, err := b.HTTP.Get(b.Cell.MetricsURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(metrics, []byte("assay_")) {
		t.Fatalf("/metrics carries no assay metric:\n%.500s", metrics)
	}
	var spanText strings.Builder
	for _, s := range spans.GetSpans() {
		fmt.Fprintf(&spanText, "%s %s %v\n", s.Name, s.Status.Description, s.Attributes)
		for _, e := range s.Events {
			fmt.Fprintf(&spanText, "  %s %v\n", e.Name, e.Attributes)
		}
	}
	if len(spans.GetSpans()) == 0 {
		t.Fatal("no spans recorded")
	}
	for what, text := range map[string]string{"logs": logs.String(), "spans": spanText.String(), "metrics": string(metrics)} {
		for _, needle := range []string{secret, "hunter2", "dbPassword"} {
			if i := strings.Index(text, needle); i >= 0 {
				t.Errorf("%s carry %q: …%s…", what, needle, text[max(0, i-200):min(len(text), i+100)])
			}
		}
	}
	t.Logf("%d log bytes, %d spans, %d metric bytes searched", len(logs.String()), len(spans.GetSpans()), len(metrics))
}

func quoteJSON(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
