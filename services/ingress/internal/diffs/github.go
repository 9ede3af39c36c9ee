// Package diffs reads the diffs of pull requests from GitHub, as the
// installation that may read each, within a size cap.
package diffs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"assay.dev/pkg/config"
	"assay.dev/pkg/githubapp"
)

// PullRef names one revision of a pull request: its head, and the base
// it was delivered against; Installation is the GitHub App installation
// that may read it, 0 for none.
type PullRef struct {
	Owner, Repo  string
	Number       int64
	HeadSHA      string
	BaseSHA      string
	Installation int64
}

func (p PullRef) String() string {
	return fmt.Sprintf("%s/%s#%d@%s", p.Owner, p.Repo, p.Number, p.HeadSHA)
}

// DiffSource fetches the unified diff of a pull request. A webhook carries
// no diff, so ingress asks for it before it stores the work.
type DiffSource interface {
	Diff(ctx context.Context, pr PullRef) (string, error)
}

// ErrDiffTooLarge is returned when a diff exceeds the fetcher's cap. Asking
// again would not help, unlike any other fetch error.
var ErrDiffTooLarge = errors.New("diff exceeds the size cap")

// GitHubDiffs fetches diffs from the GitHub REST API.
type GitHubDiffs struct {
	// API is the REST API's base URL, e.g. https://api.github.com.
	API string
	// App, when set, reads each pull request with the token of the GitHub
	// App installation the pull request names (the one that delivered it,
	// or that its tenant linked for the repository): one App serves every
	// tenant, each reading only what it installed the App on. A pull
	// request no installation covers is read without a token.
	App *githubapp.App
	// Token, when set, is sent with every fetch instead: the single-tenant
	// option, one token that reads the tenant's repositories.
	Token string
	// MaxBytes caps a diff.
	MaxBytes int64
	// Timeout bounds one fetch, headers and body.
	Timeout time.Duration
	// Client defaults to http.DefaultClient.
	Client *http.Client
}

// Diff asks for the diff between the delivered base and head SHAs
// (compare/{base}...{head}), so the work reviews the revision the webhook
// named even when a newer push has since arrived. Without a base it falls
// back to the pull request's diff as it is now (pulls/{n}).
func (g *GitHubDiffs) Diff(ctx context.Context, pr PullRef) (string, error) {
	if g.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.Timeout)
		defer cancel()
	}
	u := strings.TrimRight(g.API, "/") + "/repos/" + url.PathEscape(pr.Owner) + "/" + url.PathEscape(pr.Repo)
	if pr.BaseSHA != "" && pr.HeadSHA != "" {
		u += "/compare/" + url.PathEscape(pr.BaseSHA) + "..." + url.PathEscape(pr.HeadSHA)
	} else {
		u += "/pulls/" + strconv.FormatInt(pr.Number, 10)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", fmt.Errorf("github: %w", config.RedactError(err))
	}
	req.Header.Set("Accept", "application/vnd.github.diff")
	req.Header.Set("X-GitHub-Api-Version", "2022-11-28")
	// GitHub refuses API requests without a User-Agent.
	req.Header.Set("User-Agent", "assay-ingress")
	switch {
	case g.App != nil && pr.Installation > 0:
		tok, err := g.App.Token(ctx, pr.Installation)
		if err != nil {
			return "", fmt.Errorf("github: %s diff: %w", pr, err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	case g.Token != "":
		req.Header.Set("Authorization", "Bearer "+g.Token)
	}
	c := g.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", fmt.Errorf("github: get %s diff: %w", pr, config.RedactError(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// Drain a little so the connection can be reused; the body is not
		// echoed, it may say more about the token than a log should.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return "", fmt.Errorf("github: get %s diff: HTTP %d", pr, resp.StatusCode)
	}
	limit := g.MaxBytes
	if limit <= 0 {
		limit = 1 << 20
	}
	if resp.ContentLength > limit {
		return "", fmt.Errorf("github: %s: %w (%d bytes, cap %d)", pr, ErrDiffTooLarge, resp.ContentLength, limit)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return "", fmt.Errorf("github: read %s diff: %w", pr, err)
	}
	if int64(len(b)) > limit {
		return "", fmt.Errorf("github: %s: %w (cap %d bytes)", pr, ErrDiffTooLarge, limit)
	}
	return string(b), nil
}
