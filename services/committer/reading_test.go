package committer_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"assay.dev/pkg/contract"
	"assay.dev/pkg/devkit/fakegithub"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry/telemetrytest"
	"assay.dev/services/committer"
)

// cartDiff adds line 2 of cart.js.
const cartDiff = `diff --git a/cart.js b/cart.js
--- a/cart.js
+++ b/cart.js
@@ -1,2 +1,3 @@
 let total = sum(items);
+total -= discount;
 export { total };
`

// A blocking finding whose line the model wrote 2.0 passes the gate as
// line 2, is stored as the gate's canonical JSON (the answer as sent stays
// on its attempt), and reaches the pull request as a blocking comment on
// line 2 that fails the tenant's blocking check: the committer and the
// publisher read the answer alike.
func TestLineWrittenAsFloatReachesThePullRequest(t *testing.T) {
	t.Parallel()
	b := setupCell(t)
	ctx := t.Context()
	gh := fakegithub.New()
	t.Cleanup(gh.Close)
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	gh.App(5, &key.PublicKey)
	own := event.Names{Installation: "onereading", Cell: "us"}
	reg, _ := contract.Load()
	svc, err := committer.New(committer.Config{Region: "us", Names: own, AnnounceEvery: 50 * time.Millisecond,
		GitHubAPI: gh.URL, GitHubAppID: 5, GitHubKey: key},
		committer.Deps{Store: b.st, JS: b.js, Contracts: reg, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Tel: telemetrytest.Provider(t, "committer", "us")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := event.EnsureStream(ctx, b.js, nil, own, event.KindResult, event.StreamSettings{}); err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Stop(context.Background()) })
	if err := b.st.SetCheckPolicy(ctx, "acme", store.CheckBlocking); err != nil {
		t.Fatal(err)
	}
	if err := b.st.LinkSource(ctx, store.Link{Kind: store.SourceGitHubInstallation, Key: "42", Tenant: "acme",
		Repositories: []string{"shop/app"}}); err != nil {
		t.Fatal(err)
	}
	input, _ := json.Marshal(map[string]string{"diff": cartDiff})
	w, _, err := b.st.InsertWork(ctx, &store.Work{ID: "w_float71", TenantID: "acme", Region: "us", Contract: "code-review",
		SchemaVersion: "code-review/1", TaxonomyVersion: "2026-11", SourceID: "shop/app#71", Revision: strings.Repeat("f", 40),
		Lane: event.Interactive, Input: string(input), Digest: "sha256:00", DeadlineAt: time.Now().Add(time.Minute)},
		func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil })
	if err != nil {
		t.Fatal(err)
	}
	attempt, token := "00000000-0000-4000-8000-000000000071", "00000000-0000-4000-9000-000000000071"
	if _, ok, err := b.st.Claim(ctx, w.ID, attempt, token, time.Minute, 0); err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	ev := event.Result{AttemptID: attempt, WorkID: w.ID, TenantID: "acme", Region: "us", Number: 1, LeaseToken: token,
		Contract: "code-review", SchemaVersion: w.SchemaVersion, TaxonomyVersion: w.TaxonomyVersion, Digest: w.Digest,
		Outcome: outcome.AttemptOK, Final: true}
	const answer = `{"schemaVersion": 1, "changeId": "w_float71", "findings": [
		{"file": "cart.js", "line": 2.0, "severity": "blocking", "summary": "total can go negative", "evidence": "total -= discount;"}]}`
	b.answered(t, ev, answer)
	if err := svc.Commit(ctx, ev); err != nil {
		t.Fatal(err)
	}
	b.waitState(t, w.ID, outcome.Accepted)

	// jsonb keeps a number's scale (2.0 stays 2.0), so this reads the
	// spelling the committer stored.
	var line string
	var findings int
	if err := b.db.QueryRow(ctx, `SELECT (output->'findings'->0->'line')::text, findings FROM results WHERE work_id = $1`, w.ID).
		Scan(&line, &findings); err != nil || line != "2" || findings != 1 {
		t.Fatalf("the result holds line %s and %d findings (%v); want the canonical line 2, one finding", line, findings, err)
	}
	var raw []byte
	if err := b.db.QueryRow(ctx, `SELECT raw_response FROM attempts WHERE id = $1`, attempt).Scan(&raw); err != nil || string(raw) != answer {
		t.Fatalf("the attempt keeps %q (%v); want the answer as the model sent it", raw, err)
	}

	waitRow(t, "the review on the pull request", func() bool { return len(gh.Comments()) > 0 && len(gh.CheckRuns()) > 0 })
	cs := gh.Comments()
	if len(cs) != 1 || cs[0].Path != "cart.js" || cs[0].Line != 2 || !strings.HasPrefix(cs[0].Body, "**blocking**: total can go negative") {
		t.Fatalf("comments %+v; want one blocking comment on cart.js line 2", cs)
	}
	if runs := gh.CheckRuns(); len(runs) != 1 || runs[0].Conclusion != "failure" || runs[0].Output.Title != "1 blocking of 1 finding" {
		t.Fatalf("check runs %+v; want one, failed by the blocking finding", runs)
	}
}
