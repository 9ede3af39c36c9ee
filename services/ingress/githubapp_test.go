package ingress

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"assay.dev/pkg/devkit/fakegithub"
	"assay.dev/pkg/store"
)

// With a GitHub App, each delivery's diff is read with the token of its
// installation — the one that delivered it, or for a tenant's own
// repository hook the one the tenant linked — bought with the App's key,
// and never with a static token. An installation's token reads only what
// it was installed on.
func TestWebhookDiffsReadWithInstallationTokens(t *testing.T) {
	t.Parallel()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	gh := fakegithub.New()
	t.Cleanup(gh.Close)
	gh.App(9, &key.PublicKey)
	gh.Install(51234567, "shop/*")
	gh.AddPull("shop/checkout", 41, "c0ffee1234567890abcdef1234567890abcdef12", headOpened, evalDiff(t, "05-checkout-state"))
	e := newWebhookEnv(t, func(c *Config) {
		c.GitHubAPI, c.GitHubToken, c.GitHubAppID, c.GitHubKey = gh.URL, "", 9, key
	})
	// The App's delivery, naming installation 51234567.
	a := e.deliver("pull_request", "d-app", readPayload(t, "pull_request_opened.json"))
	if a.status != http.StatusAccepted {
		t.Fatalf("App delivery: %d %s, want 202", a.status, a.body)
	}
	w, err := e.st.GetWork(t.Context(), a.work().WorkID)
	if err != nil {
		t.Fatal(err)
	}
	var in struct{ Diff string }
	if err := json.Unmarshal([]byte(w.Input), &in); err != nil || in.Diff != evalDiff(t, "05-checkout-state") {
		t.Fatalf("stored diff of %d bytes (%v), want the pull request's", len(in.Diff), err)
	}
	// The tenant's own repository hook names no installation: the one the
	// tenant linked for shop/* reads it.
	secret := store.NewWebhookSecret()
	e.link(store.Link{Kind: store.SourceGitHubRepository, Key: "shop/checkout", Tenant: "acme"})
	if err := e.st.SetWebhookSecret(t.Context(), "acme", secret); err != nil {
		t.Fatal(err)
	}
	hook := mutate(t, "pull_request_opened.json", func(m map[string]any) { delete(m, "installation") })
	if a := e.deliver("pull_request", "d-hook", hook, Sign(secret, hook)); a.status != http.StatusOK || a.work().WorkID != w.ID {
		t.Fatalf("tenant's hook: %d %s, want the same work (200)", a.status, a.body)
	}
	var tokens, diffs int
	for _, r := range gh.Requests() {
		switch {
		case r.Path == "/app/installations/51234567/access_tokens" && r.Status == http.StatusCreated:
			tokens++
		case strings.HasPrefix(r.Path, "/repos/shop/checkout/compare/") && r.Status == http.StatusOK:
			diffs++
		default:
			t.Errorf("GitHub got %s %s (%d)", r.Method, r.Path, r.Status)
		}
	}
	if tokens != 1 || diffs != 2 {
		t.Fatalf("GitHub sold %d tokens and served %d diffs; want one token (kept) read both", tokens, diffs)
	}
	// The same App, installed only on another owner's repositories, reads
	// nothing of shop: GitHub answers 404 and the delivery is refused 502,
	// nothing stored.
	gh.Install(51234567, "other/*")
	sync := mutate(t, "pull_request_opened.json", func(m map[string]any) {
		pull(m)["head"].(map[string]any)["sha"] = headSync
	})
	gh.AddPull("shop/checkout", 41, "c0ffee1234567890abcdef1234567890abcdef12", headSync, evalDiff(t, "05-checkout-state"))
	if a := e.deliver("pull_request", "d-uncovered", sync); a.status != http.StatusBadGateway || a.code() != "upstream_unavailable" {
		t.Fatalf("installation that does not cover the repository: %d %s, want 502 upstream_unavailable", a.status, a.body)
	}
}
