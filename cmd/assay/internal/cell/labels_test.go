package cell_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/model"
	"assay.dev/pkg/outcome"
	"assay.dev/services/classifier"
)

// caps records the max_tokens of every call, by the title in its input.
type caps struct {
	mu   sync.Mutex
	seen map[string][]int
}

func (c *caps) front(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var req model.ChatRequest
		if json.Unmarshal(body, &req) == nil {
			var in struct{ Title string }
			_ = json.Unmarshal([]byte(model.Input(req.Messages)), &in)
			c.mu.Lock()
			c.seen[in.Title] = append(c.seen[in.Title], req.MaxTokens)
			c.mu.Unlock()
		}
		next.ServeHTTP(w, r)
	})
}

func (c *caps) of(title string) []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.seen[title]...)
}

// Provider answers that are not model output are labelled as what they
// are, each row of the table with its exact calls and ledger rows: a fault
// is retried and never repaired, a refusal or a content filter ends the
// work transport_rejected after one call, a cut answer is asked once more
// with its cap doubled, and a 503's Retry-After is waited out like a 429's.
func TestProviderAnswersThatAreNotOutput(t *testing.T) {
	t.Parallel()
	const capUnits = 1024
	c := &caps{seen: map[string][]int{}}
	b := celltest.SetupFront(t, cell.Options{Classifier: classifier.Config{MaxAttempts: 3, MaxOutputUnits: capUnits,
		BackoffBase: 50 * time.Millisecond, BackoffCap: 100 * time.Millisecond}}, c.front)
	cases := []struct {
		fault    sim.Fault
		outcome  string
		attempts []string
		caps     []int
	}{
		{sim.Fault{Kind: sim.FaultNoChoices, Times: 1}, outcome.Accepted, []string{"transport_error", "ok"}, nil},
		{sim.Fault{Kind: sim.FaultErrorBody, Times: 1}, outcome.Accepted, []string{"transport_error", "ok"}, nil},
		{sim.Fault{Kind: sim.FaultRefusal}, outcome.TransportRejected, []string{"refused"}, nil},
		{sim.Fault{Kind: sim.FaultContentFilter}, outcome.TransportRejected, []string{"content_filtered"}, nil},
		{sim.Fault{Kind: sim.FaultToolCalls, Times: 1}, outcome.Accepted, []string{"tool_call", "ok"}, nil},
		{sim.Fault{Kind: sim.FaultUnavailable, RetryAfter: time.Second, Times: 1}, outcome.Accepted, []string{"transport_error", "ok"}, nil},
		{sim.Fault{Kind: sim.FaultUnavailable, RetryAfter: time.Second}, outcome.RetryExhausted, []string{"transport_error", "transport_error", "transport_error"}, nil},
		{sim.Fault{Kind: sim.FaultLength, Times: 1}, outcome.Accepted, []string{"truncated", "ok"}, []int{capUnits, 2 * capUnits}},
		{sim.Fault{Kind: sim.FaultLength}, outcome.RetryExhausted, []string{"truncated", "truncated"}, []int{capUnits, 2 * capUnits}},
	}
	ids := make([]string, len(cases))
	titles := make([]string, len(cases))
	for i, tc := range cases {
		titles[i] = fmt.Sprintf("label case %c.", 'a'+i)
		tc.fault.Tenant, tc.fault.Match = "acme", titles[i]
		if err := b.Sim.AddFault(tc.fault); err != nil {
			t.Fatal(err)
		}
		req := celltest.CodeReview(evalset.Items()[3], titles[i])
		req.SourceID = fmt.Sprintf("shop/labels#%d", i+1)
		_, r := b.Submit(t, req)
		ids[i] = r.WorkID
	}
	total := 0
	for i, tc := range cases {
		name := tc.fault.Kind
		if tc.fault.Times == 0 {
			name += " every call"
		}
		v := b.Wait(t, ids[i])
		var got []string
		for _, a := range v.Attempts {
			got = append(got, a.Outcome)
		}
		t.Logf("%-26s %s after %d call(s): %s (%s)", name, *v.Outcome, len(got), strings.Join(got, ", "), v.Reason)
		if *v.Outcome != tc.outcome || strings.Join(got, ",") != strings.Join(tc.attempts, ",") {
			t.Errorf("%s: %s with attempts %v, want %s with %v", name, *v.Outcome, got, tc.outcome, tc.attempts)
		}
		if n := b.Count(t, `SELECT repairs FROM work WHERE id = $1`, ids[i]); n != 0 {
			t.Errorf("%s: %d repair re-asks for an answer that was not invalid output", name, n)
		}
		if tc.caps != nil {
			if seen := c.of(titles[i]); len(seen) != len(tc.caps) || seen[0] != tc.caps[0] || seen[1] != tc.caps[1] {
				t.Errorf("%s: max_tokens of the calls %v, want %v", name, seen, tc.caps)
			}
		}
		if tc.fault.Kind == sim.FaultUnavailable {
			for j := 1; j < len(v.Attempts); j++ {
				if gap := v.Attempts[j].StartedAt.Sub(*v.Attempts[j-1].FinishedAt); gap < time.Second {
					t.Errorf("%s: retried %s after a 503 that asked for 1s", name, gap)
				}
			}
		}
		total += len(tc.attempts)
	}
	b.WaitLedger(t, "acme", total)
	if n := b.Calls("acme"); n != int64(total) {
		t.Errorf("model calls %d, ledger rows %d", n, total)
	}
	if early := b.Sim.Stats().Tenants["acme"].Early; early != 0 {
		t.Errorf("%d calls came before the Retry-After given for them", early)
	}
	// The refusal's own words are kept with its attempt in the cell.
	if n := b.Count(t, `SELECT count(*) FROM attempts WHERE outcome = 'refused' AND position('can''t help' in convert_from(raw_response, 'UTF8')) > 0`); n != 1 {
		t.Errorf("%d refused attempts keep the refusal text, want 1", n)
	}
	// GET /v1/usage and the metrics count them apart.
	rep := usageOf(t, b)
	byOutcome := map[string]int64{}
	for _, l := range rep.ByOutcome {
		byOutcome[l.Outcome] = l.Calls
	}
	for o, want := range map[string]int64{"refused": 1, "content_filtered": 1, "truncated": 3, "tool_call": 1, "transport_error": 6} {
		if byOutcome[o] != want {
			t.Errorf("usage counts %d %s calls, want %d (%v)", byOutcome[o], o, want, byOutcome)
		}
	}
	resp, err := b.HTTP.Get(b.Cell.MetricsURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, o := range []string{"refused", "content_filtered", "truncated", "tool_call"} {
		if !bytes.Contains(metrics, []byte(`outcome="`+o+`"`)) {
			t.Errorf("no metric series for attempt outcome %s", o)
		}
	}
}
