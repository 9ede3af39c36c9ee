package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/devkit/fakegithub"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/store"
	"assay.dev/services/committer"
	"assay.dev/services/committer/publish"
	"assay.dev/services/ingress"
)

func publishRun(ctx context.Context, args []string, out *bytes.Buffer) error {
	return publishCmd(ctx, args, out)
}

// GitHub down past an accepted work's publication deadline: the
// publication is failed, and says so in GET /v1/work/{id}, assay work show,
// the console and the gauge; assay publish retry sends it again once GitHub
// is back, and exactly once. The deadline is 3s here, a day by default.
func TestFailedPublicationShowsAndRetriesOnce(t *testing.T) {
	t.Parallel()
	gh := fakegithub.New()
	t.Cleanup(gh.Close)
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	gh.App(7, &key.PublicKey)
	// Each pass of the committer's publication retrier begins by asking
	// which publications are due.
	retrier := &statements{service: "committer", fragment: "WHERE state = 'pending' AND next_try_at <="}
	b := celltest.Setup(t, cell.Options{Committer: committer.Config{GitHubAPI: gh.URL, GitHubAppID: 7, GitHubKey: key,
		PublishDeadline: 3 * time.Second, PublishBackoff: publish.Backoff{Base: 100 * time.Millisecond, Cap: 500 * time.Millisecond},
		PublishRetryEvery: 50 * time.Millisecond, PublishCountEvery: 100 * time.Millisecond}, StoreTracer: retrier.tracer})
	ctx := t.Context()
	if err := b.Cell.Env.Store.LinkSource(ctx, store.Link{Kind: store.SourceGitHubInstallation, Key: "42", Tenant: "acme",
		Repositories: []string{"shop/*"}}); err != nil {
		t.Fatal(err)
	}
	opToken := store.NewToken()
	if err := b.Cell.Env.Store.AddOperatorToken(ctx, "ops", opToken); err != nil {
		t.Fatal(err)
	}
	db := []string{"--region", "us", "--database-url", b.Cell.Env.Config.DatabaseURL}
	gh.Down(&fakegithub.Fault{Status: http.StatusInternalServerError, Body: `{"message":"Server Error"}`})
	req := celltest.CodeReview(evalset.Items()[0], "published after an incident")
	req.SourceID = "shop/app#77"
	_, r := b.Submit(t, req)
	v := b.Wait(t, r.WorkID)
	if *v.Outcome != "accepted" || v.Result == nil || v.Result.Findings == 0 {
		t.Fatalf("work %s: %s with %+v, want accepted with findings", r.WorkID, *v.Outcome, v.Result)
	}
	findings := v.Result.Findings
	deadline := time.Now().Add(30 * time.Second)
	for {
		v = view(t, b, r.WorkID)
		if p := githubOf(v); p != nil && p.State == store.PublicationFailed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failed github publication after 30s: %+v", v.Publications)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// 1: GET /v1/work/{id}.
	p := githubOf(v)
	if p.Tries < 2 || !strings.Contains(p.Reason, "deadline") || !strings.Contains(p.LastError, "HTTP 500") || p.NextTryAt != nil {
		t.Errorf("GET /v1/work/%s github publication %+v: want failed past its deadline after tries, with the 500", r.WorkID, p)
	}
	// 2: assay work show, its publications section.
	show := string(assay(t, work, append([]string{"show", r.WorkID, "--no-messages"}, db...)...))
	if !regexp.MustCompile(`(?m)^publications\n  github +failed +accepted +\d+ tries .*deadline.*last error: .*HTTP 500`).MatchString(show) {
		t.Errorf("assay work show has no failed github publication:\n%s", show)
	}
	// 3: the console.
	var con ingress.Console
	consoleJSON(t, b, opToken, &con)
	if len(con.FailedPublications) != 1 || con.FailedPublications[0].WorkID != r.WorkID || con.Publications[0].Target != "github" ||
		con.Publications[0].Failed != 1 {
		t.Errorf("console publications %+v, failed %+v; want this work's github publication failed", con.Publications, con.FailedPublications)
	}
	// 4: the gauge by state.
	waitMetric(t, b, `assay_publications_unfinished{`, `state="failed"`, `target="github"`, "1")
	// The dry run counts it; a wrong count is refused; assay publish list names it.
	if out := assay(t, publishRun, append([]string{"retry", "--since", "1h"}, db...)...); !bytes.Contains(out, []byte("dry run: 1 failed publication(s)")) {
		t.Errorf("dry run said:\n%s", out)
	}
	if err := publishCmd(ctx, append([]string{"retry", "--since", "1h", "--confirm", "2"}, db...), io.Discard); err == nil {
		t.Error("--confirm 2 with 1 failed publication was taken")
	}
	if out := assay(t, publishRun, append([]string{"list"}, db...)...); !bytes.Contains(out, []byte(r.WorkID)) {
		t.Errorf("assay publish list does not name %s:\n%s", r.WorkID, out)
	}
	if len(gh.CheckRuns()) != 0 {
		t.Fatal("GitHub made a check run while it answered 500")
	}
	gh.Down(nil)
	out := assay(t, publishRun, append([]string{"retry", "--work", r.WorkID}, db...)...)
	if !bytes.Contains(out, []byte("github publication of accepted pending again")) {
		t.Fatalf("retry said:\n%s", out)
	}
	deadline = time.Now().Add(30 * time.Second)
	for p = githubOf(view(t, b, r.WorkID)); p.State != store.PublicationPublished; p = githubOf(view(t, b, r.WorkID)) {
		if time.Now().After(deadline) {
			t.Fatalf("retried publication still %s: %+v", p.State, p)
		}
		time.Sleep(50 * time.Millisecond)
	}
	again := assay(t, publishRun, append([]string{"retry", "--work", r.WorkID}, db...)...)
	if !bytes.Contains(again, []byte("has no failed publication; nothing sent")) {
		t.Errorf("second retry said:\n%s", again)
	}
	retrier.waitNext(t, 4) // three whole retrier passes: none may send anything
	if runs := gh.CheckRuns(); len(runs) != 1 || runs[0].Edits != 0 || gh.CommentsOf(r.WorkID) != findings {
		t.Fatalf("after two retries: %d check runs (%+v), %d comments; want 1 check run and %d comments", len(runs), runs, gh.CommentsOf(r.WorkID), findings)
	}
	waitMetric(t, b, `assay_publications_unfinished{`, `state="failed"`, `target="github"`, "0")
	t.Logf("failed after %d tries past a 3s deadline; shown in the API, work show, the console and the gauge; retried: 1 check run, %d comments; a second retry sent nothing",
		githubTries(v), findings)
}

func githubTries(v ingress.WorkView) int {
	if p := githubOf(v); p != nil {
		return p.Tries
	}
	return 0
}

func githubOf(v ingress.WorkView) *ingress.PublicationView {
	for i := range v.Publications {
		if v.Publications[i].Target == publish.TargetGitHub {
			return &v.Publications[i]
		}
	}
	return nil
}

func view(t *testing.T, b *celltest.Bundle, id string) ingress.WorkView {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, b.Cell.URL+"/v1/work/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+b.Token)
	resp, err := b.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v ingress.WorkView
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/work/%s: %d, %v", id, resp.StatusCode, err)
	}
	return v
}

func consoleJSON(t *testing.T, b *celltest.Bundle, token string, into any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, b.Cell.URL+"/v1/console", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := b.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(into); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/console: %d, %v", resp.StatusCode, err)
	}
}

// waitMetric waits until the cell's /metrics has a line of the series
// (prefix, with every label) whose value is want.
func waitMetric(t *testing.T, b *celltest.Bundle, prefix string, rest ...string) {
	t.Helper()
	labels, want := rest[:len(rest)-1], rest[len(rest)-1]
	deadline := time.Now().Add(20 * time.Second)
	last := ""
	for time.Now().Before(deadline) {
		resp, err := http.Get(b.Cell.MetricsURL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for line := range strings.Lines(string(body)) {
			series, value, _ := strings.Cut(strings.TrimSpace(line), " ")
			match := strings.HasPrefix(series, prefix)
			for _, l := range labels {
				match = match && strings.Contains(series, l)
			}
			if match {
				if last = line; value == want {
					return
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s%v is not %s on /metrics (last: %q)", prefix, labels, want, last)
}
