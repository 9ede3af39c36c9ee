package main

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/devkit/fakegithub"
	"assay.dev/pkg/store"
	"assay.dev/services/committer"
	"assay.dev/services/ingress"
)

// A pull request whose diff is 2 MiB, over the cell's 1 MiB cap, delivered
// three times (one delivery twice, and again under a new delivery id): one
// work item, dropped for its size with no diff kept, and exactly one
// comment on the pull request through GitHub saying so and naming the
// setting — no check run, no model call.
func TestTwoMiBPullRequestGetsOneComment(t *testing.T) {
	t.Parallel()
	gh := fakegithub.New()
	t.Cleanup(gh.Close)
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	const secret, token, installation = "hook-secret", "ghs_reads_every_diff", 51234567
	gh.App(7, &key.PublicKey)
	gh.Install(installation, "shop/*")
	gh.StaticToken(token)
	b := celltest.Setup(t, cell.Options{
		Ingress:   ingress.Config{GitHubSecret: secret, GitHubAPI: gh.URL, GitHubToken: token},
		Committer: committer.Config{GitHubAPI: gh.URL, GitHubAppID: 7, GitHubKey: key}})
	ctx := t.Context()
	if err := b.Cell.Env.Store.LinkSource(ctx, store.Link{Kind: store.SourceGitHubInstallation, Key: fmt.Sprint(installation),
		Tenant: b.Tenant, Repositories: []string{"shop/*"}}); err != nil {
		t.Fatal(err)
	}
	body, err := os.ReadFile("../../services/ingress/testdata/pull_request_opened.json")
	if err != nil {
		t.Fatal(err)
	}
	const head, base = "9f1c2a7d4e5b6c8a0f1e2d3c4b5a69788776655a", "c0ffee1234567890abcdef1234567890abcdef12"
	var diff strings.Builder
	for i := 0; diff.Len() < 2<<20; i++ {
		fmt.Fprintf(&diff, "diff --git a/gen/f%04d.go b/gen/f%04d.go\nnew file mode 100644\n--- /dev/null\n+++ b/gen/f%04d.go\n@@ -0,0 +1,40 @@\n", i, i, i)
		for l := range 40 {
			fmt.Fprintf(&diff, "+var v%d_%d = %q\n", i, l, strings.Repeat("x", 40))
		}
	}
	gh.AddPull("shop/checkout", 41, base, head, diff.String())

	var workID string
	for _, delivery := range []string{"d-2mib", "d-2mib", "d-2mib-again"} {
		req, _ := http.NewRequest(http.MethodPost, b.Cell.URL+"/v1/webhooks/github", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-GitHub-Event", "pull_request")
		req.Header.Set("X-GitHub-Delivery", delivery)
		req.Header.Set("X-Hub-Signature-256", ingress.Sign(secret, body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var r ingress.WebhookResponse
		err = json.NewDecoder(resp.Body).Decode(&r)
		resp.Body.Close()
		if err != nil || resp.StatusCode >= 300 || r.WorkID == "" || (workID != "" && r.WorkID != workID) {
			t.Fatalf("delivery %s: %d %+v %v; want the one work item", delivery, resp.StatusCode, r, err)
		}
		workID = r.WorkID
	}
	v := b.Wait(t, workID)
	if *v.Outcome != "dropped" || !strings.HasPrefix(v.Reason, "diff_too_large: ") {
		t.Fatalf("work %s: %s (%s), want dropped for its size", workID, *v.Outcome, v.Reason)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if p := githubOf(view(t, b, workID)); p != nil && p.State == store.PublicationPublished {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no github publication of %s after 30s: %+v", workID, view(t, b, workID).Publications)
		}
		time.Sleep(50 * time.Millisecond)
	}
	comments := gh.Comments()
	if len(comments) != 1 || gh.CommentsOf(workID) != 1 || !strings.Contains(comments[0].Body, "did not review this pull request") ||
		!strings.Contains(comments[0].Body, "ASSAY_MAX_DIFF_BYTES") {
		t.Fatalf("comments %+v; want one saying the pull request was too large, naming the setting", comments)
	}
	if runs := gh.CheckRuns(); len(runs) != 0 {
		t.Errorf("check runs %+v, want none for work not reviewed", runs)
	}
	if n := b.Calls(b.Tenant); n != 0 {
		t.Errorf("%d model calls for work not reviewed", n)
	}
	if n := b.Count(t, `SELECT count(*) FROM work WHERE tenant_id = $1`, b.Tenant); n != 1 {
		t.Errorf("%d work items, want 1", n)
	}
}
