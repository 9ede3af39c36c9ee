package diffs

import (
	"crypto/rand"
	"crypto/rsa"
	"strings"
	"testing"
	"time"

	"assay.dev/pkg/devkit/fakegithub"
	"assay.dev/pkg/githubapp"
)

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
