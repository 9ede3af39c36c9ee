package ingress

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"assay.dev/pkg/devkit/fakegithub"
	"assay.dev/pkg/githubapp"
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

// ASSAY_GITHUB_TOKEN is the single-tenant option: beside the App's
// credentials start-up stops, naming it; alone it reads every diff.
func TestGitHubTokenIsSingleTenantOnly(t *testing.T) {
	t.Parallel()
	key, _ := rsa.GenerateKey(rand.Reader, 2048)
	file := filepath.Join(t.TempDir(), "app.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"ASSAY_GITHUB_APP_ID": "9", "ASSAY_GITHUB_APP_KEY_FILE": file, "ASSAY_GITHUB_TOKEN": "ghp_one_persons"}
	var c Config
	if err := c.FromEnv(func(k string) string { return env[k] }); err == nil || !strings.HasPrefix(err.Error(), "ASSAY_GITHUB_TOKEN:") {
		t.Fatalf("App and static token: %v, want an error naming ASSAY_GITHUB_TOKEN", err)
	}
	delete(env, "ASSAY_GITHUB_TOKEN")
	c = Config{}
	if err := c.FromEnv(func(k string) string { return env[k] }); err != nil || c.GitHubAppID != 9 || c.GitHubKey == nil {
		t.Fatalf("App alone: %v, app %d", err, c.GitHubAppID)
	}
	c.Region = "us"
	if err := c.defaults(); err != nil {
		t.Fatal(err)
	}
	if d, ok := c.Diffs.(*GitHubDiffs); !ok || d.App == nil || d.App.ID != 9 || d.Token != "" {
		t.Fatalf("diff source %+v, want the App's", c.Diffs)
	}
	both := Config{Region: "us", GitHubAppID: 9, GitHubKey: key, GitHubToken: "x"}
	if err := both.defaults(); err == nil {
		t.Fatal("a Config with the App and a static token was taken")
	}
}

// GitHubDiffs sends the installation's token when the pull request names
// one, and none when it names none.
func TestGitHubDiffsAsTheInstallation(t *testing.T) {
	t.Parallel()
	key, _ := rsa.GenerateKey(rand.Reader, 2048)
	gh := fakegithub.New()
	t.Cleanup(gh.Close)
	gh.App(3, &key.PublicKey)
	gh.Install(77, "acme/*")
	gh.AddPull("acme/app", 5, "aaa", "bbb", "diff --git a/x b/x\n")
	g := &GitHubDiffs{API: gh.URL, Timeout: time.Second, App: &githubapp.App{API: gh.URL, ID: 3, Key: key, UserAgent: "assay-test"}}
	if d, err := g.Diff(t.Context(), PullRef{Owner: "acme", Repo: "app", Number: 5, HeadSHA: "bbb", BaseSHA: "aaa", Installation: 77}); err != nil || d == "" {
		t.Fatalf("as installation 77: %q, %v", d, err)
	}
	if _, err := g.Diff(t.Context(), PullRef{Owner: "acme", Repo: "app", Number: 5, HeadSHA: "bbb", BaseSHA: "aaa"}); err == nil ||
		!strings.Contains(err.Error(), "HTTP 401") {
		t.Fatalf("with no installation (no token): %v, want GitHub's 401", err)
	}
}
