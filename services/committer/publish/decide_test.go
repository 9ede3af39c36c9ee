package publish

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"assay.dev/pkg/diff"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	src := store.PullSource{Owner: "shop", Repo: "app", Number: 7, HeadSHA: head}
	blocking := []Finding{{File: "a.go", Line: 3, Severity: "blocking", Summary: "x"}, {File: "a.go", Line: 9, Severity: "info", Summary: "y"}}
	for _, c := range []struct {
		name, outcome, policy string
		findings              []Finding
		conclusion            string // "" for no check run
		comments              int
		rerun                 bool
	}{
		{"accepted, nothing found", outcome.Accepted, store.CheckAdvisory, nil, "success", 0, false},
		{"accepted, advisory", outcome.Accepted, store.CheckAdvisory, blocking, "neutral", 2, false},
		{"accepted, blocking policy", outcome.Accepted, store.CheckBlocking, blocking, "failure", 2, false},
		{"accepted, blocking policy, none blocking", outcome.Accepted, store.CheckBlocking, blocking[1:], "neutral", 1, false},
		{"superseded", outcome.Superseded, store.CheckBlocking, blocking, "skipped", 0, false},
		{"expired", outcome.Expired, "", nil, "timed_out", 0, false},
		{"canceled", outcome.Canceled, "", nil, "cancelled", 0, false},
		{"schema_rejected", outcome.SchemaRejected, "", nil, "neutral", 0, false},
		{"dropped", outcome.Dropped, "", nil, "", 0, true},
	} {
		p := Decide(Input{WorkID: "w1", Outcome: c.outcome, Policy: c.policy, Findings: c.findings, Source: src,
			Rerun: "assay work rerun w1 --region us", Reason: "over the rate; ask again with: x"})
		got := ""
		if p.CheckRun != nil {
			got = p.CheckRun.Conclusion
		}
		if got != c.conclusion || len(p.Comments) != c.comments || (p.Rerun != "") != c.rerun || p.Repository != "shop/app" {
			t.Errorf("%s: check %q, %d comments, rerun %q; want %q, %d, %v", c.name, got, len(p.Comments), p.Rerun, c.conclusion, c.comments, c.rerun)
		}
	}
}

// A neutral check run's title says why it does not fail.
func TestDecideTitles(t *testing.T) {
	t.Parallel()
	src := store.PullSource{Owner: "shop", Repo: "app", Number: 7, HeadSHA: head}
	f := func(sev ...string) []Finding {
		var out []Finding
		for i, s := range sev {
			out = append(out, Finding{File: "a.go", Line: i + 1, Severity: s, Summary: "x"})
		}
		return out
	}
	for _, c := range []struct {
		policy   string
		findings []Finding
		want     string
	}{
		{store.CheckAdvisory, f("blocking", "blocking", "blocking", "blocking"), "4 findings, 4 marked blocking (advisory: this check does not fail)"},
		{store.CheckAdvisory, f("info", "warning"), "2 findings, none blocking"},
		{store.CheckBlocking, f("info"), "1 finding, none blocking"},
		{store.CheckBlocking, f("blocking", "info"), "1 blocking of 2 findings"},
	} {
		p := Decide(Input{WorkID: "w1", Outcome: outcome.Accepted, Policy: c.policy, Findings: c.findings, Source: src})
		if p.CheckRun == nil || p.CheckRun.Title != c.want {
			t.Errorf("%s, %d findings: %+v, want title %q", c.policy, len(c.findings), p.CheckRun, c.want)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Set(kv[i], kv[i+1])
		}
		return out
	}
	for _, c := range []struct {
		name           string
		status         int
		h              http.Header
		body           string
		wait           time.Duration
		retry, limited bool
	}{
		{"503 with Retry-After", 503, h("Retry-After", "7"), "", 7 * time.Second, true, true},
		{"502 bare", 502, h(), "", 0, true, false},
		{"secondary with Retry-After", 403, h("Retry-After", "30"), "secondary rate limit", 30 * time.Second, true, true},
		{"secondary bare", 403, h(), "You have exceeded a secondary rate limit", time.Minute, true, true},
		{"primary exhausted", 403, h("X-Ratelimit-Remaining", "0", "X-Ratelimit-Reset", "1800000090"), "", 90 * time.Second, true, true},
		{"429 bare", 429, h(), "", time.Minute, true, true},
		{"403 forbidden", 403, h(), "Resource not accessible by integration", 0, false, false},
		{"422", 422, h("Retry-After", "5"), "", 0, false, false},
		{"Retry-After as a date", 503, h("Retry-After", now.Add(3*time.Second).UTC().Format(http.TimeFormat)), "", 3 * time.Second, true, true},
	} {
		wait, retry, limited := RetryAfter(c.status, c.h, []byte(c.body), now)
		if wait != c.wait || retry != c.retry || limited != c.limited {
			t.Errorf("%s: %s %v %v, want %s %v %v", c.name, wait, retry, limited, c.wait, c.retry, c.limited)
		}
	}
}

// A review in parts says so; a partial one is never a clean pass, names
// what it left and why, and keeps its findings' comments and conclusion.
func TestDecidePartial(t *testing.T) {
	t.Parallel()
	src := store.PullSource{Owner: "shop", Repo: "app", Number: 7, HeadSHA: head}
	whole := &diff.Coverage{Parts: 3, Reviewed: []string{"p1", "p2", "p3"}, Files: []string{"a.go", "b.go"},
		Skipped: []diff.Skipped{{Path: "go.sum", Reason: "lock file"}}}
	part := &diff.Coverage{Parts: 3, Reviewed: []string{"p1"}, Files: []string{"a.go"}, Left: []string{"b.go", "c_test.go"},
		Partial: true, Why: "the work's cost cap of 100 micro-dollars was reached"}
	blocking := []Finding{{File: "a.go", Line: 3, Severity: "blocking", Summary: "x"}}
	for _, c := range []struct {
		name       string
		cov        *diff.Coverage
		findings   []Finding
		policy     string
		conclusion string
		title      string
		says       []string
	}{
		{"whole, nothing found", whole, nil, store.CheckAdvisory, "success", "No findings",
			[]string{"reviewed in 3 parts", "Skipped: go.sum (lock file)"}},
		{"partial, nothing found", part, nil, store.CheckAdvisory, "neutral", "Partial review: No findings in the part reviewed",
			[]string{"1 of the 3 parts", "cost cap of 100", "Not reviewed (2): b.go, c_test.go"}},
		{"partial, blocking", part, blocking, store.CheckBlocking, "failure", "Partial review: 1 blocking of 1 finding",
			[]string{"Reviewed (1): a.go"}},
	} {
		p := Decide(Input{WorkID: "w1", Outcome: outcome.Accepted, Policy: c.policy, Findings: c.findings, Source: src, Coverage: c.cov})
		if p.CheckRun == nil || p.CheckRun.Conclusion != c.conclusion || p.CheckRun.Title != c.title || len(p.Comments) != len(c.findings) {
			t.Errorf("%s: %+v, %d comments; want %s %q", c.name, p.CheckRun, len(p.Comments), c.conclusion, c.title)
			continue
		}
		for _, s := range c.says {
			if !strings.Contains(p.CheckRun.Summary, s) {
				t.Errorf("%s: summary %q does not say %q", c.name, p.CheckRun.Summary, s)
			}
		}
	}
}

// A pull request dropped for the size of its diff gets one comment that
// says why and what would review it, and no rerun command: its diff was
// not kept.
func TestDecideTooLarge(t *testing.T) {
	t.Parallel()
	src := store.PullSource{Owner: "shop", Repo: "app", Number: 7, HeadSHA: head}
	p := Decide(Input{WorkID: "w1", Outcome: outcome.Dropped, Source: src, Rerun: "assay work rerun w1 --region us",
		Reason: outcome.ReasonDiffTooLarge + ": the pull request's diff is over the 1048576 bytes this installation reviews (ASSAY_MAX_DIFF_BYTES)"})
	if p.CheckRun != nil || !strings.HasPrefix(p.Rerun, "assay did not review this pull request: the pull request's diff is over") ||
		strings.Contains(p.Rerun, "assay work rerun") || !strings.Contains(p.Rerun, "ASSAY_MAX_DIFF_BYTES") {
		t.Fatalf("plan %+v; want one comment naming the cap and no rerun command", p)
	}
}
