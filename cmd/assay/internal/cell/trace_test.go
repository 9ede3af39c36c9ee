package cell_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/telemetry"
	"assay.dev/services/ingress"
)

// A caller's traceparent on POST /v1/work is continued through every
// service: one trace holds ingress's, the classifier's, the committer's
// and the ledger's spans, and the provider's request carries it too.
func TestOneTraceSpansTheCell(t *testing.T) {
	t.Parallel()
	spans := tracetest.NewInMemoryExporter()
	var mu sync.Mutex
	var seen []string
	front := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			seen = append(seen, r.Header.Get("traceparent"))
			mu.Unlock()
			next.ServeHTTP(w, r)
		})
	}
	b := celltest.SetupFront(t, cell.Options{
		Telemetry: []telemetry.Option{telemetry.WithSpanProcessor(sdktrace.NewSimpleSpanProcessor(spans))},
	}, front)
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	body, _ := json.Marshal(celltest.CodeReview(evalset.Items()[1], "traced"))
	req, _ := http.NewRequest(http.MethodPost, b.Cell.URL+"/v1/work", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+b.Token)
	req.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	resp, err := b.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var sub ingress.SubmitResponse
	_ = json.NewDecoder(resp.Body).Decode(&sub)
	resp.Body.Close()
	if v := b.Wait(t, sub.WorkID); *v.Outcome != outcome.Accepted {
		t.Fatalf("%s (%s)", *v.Outcome, v.Reason)
	}
	b.WaitLedger(t, "acme", 1)
	want := []string{"ingress.submit", "classifier.process", "chat ", "committer.commit", "ledger."}
	deadline := time.Now().Add(30 * time.Second)
	for {
		names := map[string]bool{}
		for _, s := range spans.GetSpans() {
			if s.SpanContext.TraceID().String() == traceID {
				names[s.Name] = true
			}
		}
		missing := []string{}
		for _, w := range want {
			found := false
			for n := range names {
				found = found || strings.HasPrefix(n, w)
			}
			if !found {
				missing = append(missing, w)
			}
		}
		if len(missing) == 0 {
			t.Logf("trace %s holds %d spans: %v", traceID, len(names), names)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("trace %s lacks %v; it holds %v", traceID, missing, names)
		}
		time.Sleep(100 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) == 0 || !strings.Contains(seen[0], traceID) {
		t.Errorf("the provider's request carried traceparent %q, want the work's trace", seen)
	}
}

// A caller's traceparent that is not one is ignored: the work still goes,
// in a trace of its own.
func TestMalformedTraceparentStartsANewTrace(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	body, _ := json.Marshal(celltest.CodeReview(evalset.Items()[2], "bad trace"))
	req, _ := http.NewRequest(http.MethodPost, b.Cell.URL+"/v1/work", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+b.Token)
	req.Header.Set("traceparent", "00-zzzz-not-a-trace-'; DROP TABLE work; --")
	resp, err := b.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("HTTP %d", resp.StatusCode)
	}
	if n := b.Count(t, `SELECT count(*) FROM work WHERE traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]$'`); n != 1 {
		t.Errorf("%d work rows keep a well-formed traceparent of their own", n)
	}
}

// The sweeper's re-announcement of work nobody took is a trace of its own,
// linked to the trace the work began in.
func TestReannouncementLinksToTheOriginalTrace(t *testing.T) {
	t.Parallel()
	spans := tracetest.NewInMemoryExporter()
	b := celltest.Setup(t, cell.Options{NoClassifier: true,
		Ingress:   ingress.Config{SweepEvery: 100 * time.Millisecond, QueuedFor: 300 * time.Millisecond},
		Telemetry: []telemetry.Option{telemetry.WithSpanProcessor(sdktrace.NewSimpleSpanProcessor(spans))}})
	const traceID = "0af7651916cd43dd8448eb211c80319c"
	body, _ := json.Marshal(celltest.CodeReview(evalset.Items()[3], "swept"))
	req, _ := http.NewRequest(http.MethodPost, b.Cell.URL+"/v1/work", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+b.Token)
	req.Header.Set("traceparent", "00-"+traceID+"-b7ad6b7169203331-01")
	resp, err := b.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		for _, s := range spans.GetSpans() {
			if s.Name != "ingress.reannounce" {
				continue
			}
			if len(s.Links) != 1 || s.Links[0].SpanContext.TraceID().String() != traceID || s.SpanContext.TraceID().String() == traceID {
				t.Fatalf("re-announcement span in trace %s with links %v; want a new trace linked to %s", s.SpanContext.TraceID(), s.Links, traceID)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no re-announcement within 15s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
