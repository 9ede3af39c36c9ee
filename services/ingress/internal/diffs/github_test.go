package diffs

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
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

func TestGitHubDiffs(t *testing.T) {
	t.Parallel()
	var got *http.Request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Clone(context.Background())
		fmt.Fprint(w, strings.Repeat("+", 100))
	}))
	defer srv.Close()
	g := &GitHubDiffs{API: srv.URL + "/", MaxBytes: 100, Timeout: time.Second}
	d, err := g.Diff(t.Context(), PullRef{Owner: "shop", Repo: "checkout.js", Number: 7, HeadSHA: "9f1c2a7d4e5b6c8a0f1e2d3c4b5a69788776655a"})
	if err != nil || len(d) != 100 {
		t.Fatalf("Diff = %d bytes, %v", len(d), err)
	}
	if got.URL.Path != "/repos/shop/checkout.js/pulls/7" {
		t.Fatalf("without a base: GET %s, want the pull request's diff", got.URL.Path)
	}
	if _, err := g.Diff(t.Context(), PullRef{Owner: "shop", Repo: "checkout.js", Number: 7, HeadSHA: "bbb", BaseSHA: "aaa"}); err != nil ||
		got.URL.Path != "/repos/shop/checkout.js/compare/aaa...bbb" {
		t.Fatalf("with a base: GET %s (%v), want compare/aaa...bbb: the delivered revision", got.URL.Path, err)
	}
	if got.Header.Get("Accept") != "application/vnd.github.diff" ||
		got.Header.Get("Authorization") != "" || got.Header.Get("X-GitHub-Api-Version") == "" {
		t.Fatalf("request %s %v", got.URL, got.Header)
	}
	g.MaxBytes = 99
	if _, err := g.Diff(t.Context(), PullRef{Owner: "shop", Repo: "checkout", Number: 7}); !errors.Is(err, ErrDiffTooLarge) {
		t.Fatalf("over the cap: %v, want ErrDiffTooLarge", err)
	}
	g.Token = "ghs_x"
	g.MaxBytes = 0
	if _, err := g.Diff(t.Context(), PullRef{Owner: "shop", Repo: "checkout", Number: 7}); err != nil || got.Header.Get("Authorization") != "Bearer ghs_x" {
		t.Fatalf("with token: %v, Authorization %q", err, got.Header.Get("Authorization"))
	}
}
