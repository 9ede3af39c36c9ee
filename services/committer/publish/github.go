package publish

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"assay.dev/pkg/config"
	"assay.dev/pkg/githubapp"
	"assay.dev/pkg/httpwait"
)

// RetryError says the call may be made again, no earlier than Wait from
// now: GitHub said so (Retry-After, a rate limit's reset) or it failed in a
// way a later try can mend (a 5xx).
type RetryError struct {
	Wait time.Duration
	Err  error
}

func (e *RetryError) Error() string {
	if e.Wait <= 0 {
		return e.Err.Error()
	}
	return fmt.Sprintf("%v (retry in %s)", e.Err, e.Wait)
}
func (e *RetryError) Unwrap() error { return e.Err }

// StatusError is an answer GitHub gave that no retry mends.
type StatusError struct {
	Method, Path string
	Status       int
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("github: %s %s: HTTP %d", e.Method, e.Path, e.Status)
}

// GitHub speaks the REST API as a GitHub App: the App's installation
// token makes the calls.
type GitHub struct {
	// App holds the App's credentials and its installations' tokens; its
	// API and Now are the publisher's too.
	App *githubapp.App
	// Client defaults to one with a 30s timeout.
	Client *http.Client
	// Budget paces each installation's content-creating requests under
	// GitHub's limits and holds all its calls while GitHub said to wait.
	// Default: one of this process's own at GitHub's limits.
	Budget *Budget

	once sync.Once
}

func (g *GitHub) now() time.Time {
	if g.App.Now != nil {
		return g.App.Now()
	}
	return time.Now()
}

// do makes one call as the installation. A refused token is judged as any
// other answer of GitHub's.
func (g *GitHub) do(ctx context.Context, installation int64, method, path string, in, out any) error {
	if err := g.pace(ctx, installation, method, path); err != nil {
		return err
	}
	tok, err := g.App.Token(ctx, installation)
	var ae *githubapp.Error
	switch {
	case errors.As(err, &ae):
		return g.judge(ctx, installation, &StatusError{Method: http.MethodPost, Path: "/app/installations/{id}/access_tokens", Status: ae.Status},
			ae.Header, ae.Body)
	case errors.Is(err, githubapp.ErrNoInstallation):
		return fmt.Errorf("%w: the work names no GitHub App installation to publish as", errFinal)
	case err != nil:
		return &RetryError{Err: err}
	}
	return g.call(ctx, installation, "token "+tok, method, path, in, out)
}

func (g *GitHub) budget() *Budget {
	g.once.Do(func() {
		if g.Budget == nil {
			g.Budget = &Budget{Now: g.now}
		}
	})
	return g.Budget
}

// writes are the methods GitHub counts as content-creating.
func writes(method string) bool {
	return method == http.MethodPost || method == http.MethodPatch || method == http.MethodPut || method == http.MethodDelete
}

// pace is the wait the installation's budget imposes on a
// content-creating call, as an error: a hold GitHub asked for, or no room
// for one more write. A write it lets through is counted. A read asks
// nothing of the budget, so it costs no round trip to the bucket: a read
// GitHub refuses for a limit holds the installation as any refusal does.
func (g *GitHub) pace(ctx context.Context, inst int64, method, path string) error {
	if !writes(method) {
		return nil
	}
	wait, err := g.budget().Take(ctx, inst)
	switch {
	case err != nil:
		return &RetryError{Err: fmt.Errorf("github: %s %s: %w", method, path, err)}
	case wait > 0:
		return &RetryError{Wait: wait, Err: fmt.Errorf("github: %s %s: %w", method, path, errPaced)}
	}
	return nil
}

// judge says what an answer that is not a success means: final, or a
// RetryError with GitHub's wait; a rate limit holds every write of the
// installation back.
func (g *GitHub) judge(ctx context.Context, inst int64, failed *StatusError, h http.Header, body []byte) error {
	wait, retry, limited := RetryAfter(failed.Status, h, body, g.now())
	if !retry {
		return failed
	}
	if limited {
		if err := g.budget().Hold(ctx, inst, g.now().Add(wait)); err != nil {
			return &RetryError{Wait: wait, Err: errors.Join(failed, err)}
		}
	}
	return &RetryError{Wait: wait, Err: failed}
}

// spent holds the installation's calls until the primary limit's reset
// when an answer says none of its requests remain.
func (g *GitHub) spent(ctx context.Context, inst int64, h http.Header) {
	if h.Get("X-Ratelimit-Remaining") != "0" {
		return
	}
	if reset, err := strconv.ParseInt(h.Get("X-Ratelimit-Reset"), 10, 64); err == nil {
		// Not held is no worse than before: the next call's 403 says so.
		_ = g.budget().Hold(ctx, inst, time.Unix(reset, 0))
	}
}

func (g *GitHub) call(ctx context.Context, inst int64, auth, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(g.App.API, "/")+path, body)
	if err != nil {
		return fmt.Errorf("github: %w", config.RedactError(err))
	}
	req.Header.Set("Accept", "application/vnd.github+json")
	req.Header.Set("X-GitHub-Api-Version", "2022-11-28")
	req.Header.Set("User-Agent", "assay-publisher")
	req.Header.Set("Authorization", auth)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	c := g.Client
	if c == nil {
		c = &http.Client{Timeout: 30 * time.Second}
	}
	resp, err := c.Do(req)
	if err != nil {
		return &RetryError{Wait: 0, Err: fmt.Errorf("github: %s %s: %w", method, path, config.RedactError(err))}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return &RetryError{Err: fmt.Errorf("github: %s %s: read: %w", method, path, err)}
	}
	if resp.StatusCode/100 == 2 {
		g.spent(ctx, inst, resp.Header)
		if out == nil || len(b) == 0 {
			return nil
		}
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("github: %s %s: decode: %w", method, path, err)
		}
		return nil
	}
	return g.judge(ctx, inst, &StatusError{Method: method, Path: path, Status: resp.StatusCode}, resp.Header, b)
}

// RetryAfter says whether an answer may be tried again and how long to
// wait first. A 429, or a 403 for a primary or secondary rate limit, waits
// what Retry-After says, else until x-ratelimit-reset when none remain,
// else (a secondary limit that says nothing) a minute; limited says the
// wait holds for every call, not only this one. A 5xx waits its
// Retry-After, if any. Any other status is final.
func RetryAfter(status int, h http.Header, body []byte, now time.Time) (wait time.Duration, retry, limited bool) {
	ra, hasRA := httpwait.RetryAfter(h.Get("Retry-After"), now)
	switch {
	case status >= 500:
		return ra, true, hasRA
	case status != http.StatusTooManyRequests && status != http.StatusForbidden:
		return 0, false, false
	case hasRA:
		return ra, true, true
	case h.Get("X-Ratelimit-Remaining") == "0":
		reset, err := strconv.ParseInt(h.Get("X-Ratelimit-Reset"), 10, 64)
		if err == nil {
			return max(time.Unix(reset, 0).Sub(now), time.Second), true, true
		}
		return time.Minute, true, true
	case status == http.StatusTooManyRequests || strings.Contains(strings.ToLower(string(body)), "secondary rate limit"):
		return time.Minute, true, true
	}
	return 0, false, false
}

// The REST shapes the publisher uses.

type checkRunOutput struct {
	Title   string `json:"title"`
	Summary string `json:"summary"`
}

type checkRunRequest struct {
	Name        string         `json:"name,omitempty"`
	HeadSHA     string         `json:"head_sha,omitempty"`
	ExternalID  string         `json:"external_id,omitempty"`
	Status      string         `json:"status"`
	Conclusion  string         `json:"conclusion"`
	CompletedAt time.Time      `json:"completed_at"`
	Output      checkRunOutput `json:"output"`
}

type checkRun struct {
	ID         int64  `json:"id"`
	ExternalID string `json:"external_id"`
	Name       string `json:"name"`
}

type comment struct {
	ID   int64  `json:"id"`
	Body string `json:"body"`
}

// reviewCommentRequest edits a review comment, or makes or edits a
// conversation comment.
type reviewCommentRequest struct {
	Body string `json:"body"`
}

func repoPath(p Plan) string {
	owner, repo, _ := strings.Cut(p.Repository, "/")
	return "/repos/" + url.PathEscape(owner) + "/" + url.PathEscape(repo)
}

// findCheckRun looks for the work's check run on its head: a publisher
// that died before recording the id finds it by its external id, on
// whichever page it is (a head many works share has many assay runs).
func (g *GitHub) findCheckRun(ctx context.Context, inst int64, p Plan) (int64, error) {
	const per = 100
	base := repoPath(p) + "/commits/" + url.PathEscape(p.HeadSHA) + "/check-runs?check_name=" + url.QueryEscape(CheckName) +
		"&per_page=" + strconv.Itoa(per)
	for page := 1; page <= 50; page++ {
		var out struct {
			CheckRuns []checkRun `json:"check_runs"`
		}
		if err := g.do(ctx, inst, http.MethodGet, base+"&page="+strconv.Itoa(page), nil, &out); err != nil {
			return 0, err
		}
		for _, c := range out.CheckRuns {
			if c.ExternalID == p.WorkID {
				return c.ID, nil
			}
		}
		if len(out.CheckRuns) < per {
			break
		}
	}
	return 0, nil
}

// putCheckRun creates the check run (id 0) or edits it.
func (g *GitHub) putCheckRun(ctx context.Context, inst int64, p Plan, id int64) (int64, error) {
	req := checkRunRequest{Status: "completed", Conclusion: p.CheckRun.Conclusion, CompletedAt: g.now().UTC().Truncate(time.Second),
		Output: checkRunOutput{Title: p.CheckRun.Title, Summary: p.CheckRun.Summary}}
	var out checkRun
	if id != 0 {
		return id, g.do(ctx, inst, http.MethodPatch, fmt.Sprintf("%s/check-runs/%d", repoPath(p), id), req, &out)
	}
	req.Name, req.HeadSHA, req.ExternalID = CheckName, p.HeadSHA, p.WorkID
	if err := g.do(ctx, inst, http.MethodPost, repoPath(p)+"/check-runs", req, &out); err != nil {
		return 0, err
	}
	return out.ID, nil
}

// markedComments lists the comments of a pull request (review comments,
// or with issue the conversation's) that carry the work's marker, by key.
func (g *GitHub) markedComments(ctx context.Context, inst int64, p Plan, issue bool) (map[string]int64, error) {
	base := fmt.Sprintf("%s/pulls/%d/comments", repoPath(p), p.Number)
	if issue {
		base = fmt.Sprintf("%s/issues/%d/comments", repoPath(p), p.Number)
	}
	return g.marked(ctx, inst, base, p.WorkID)
}

// marked reads a list of comments or reviews (base, a page at a time) and
// returns those that carry the work's marker, by key; the first of a key
// is kept.
func (g *GitHub) marked(ctx context.Context, inst int64, base, workID string) (map[string]int64, error) {
	prefix := "<!-- assay:work=" + workID + " key="
	found := map[string]int64{}
	for page := 1; page <= 50; page++ {
		var cs []comment
		if err := g.do(ctx, inst, http.MethodGet, fmt.Sprintf("%s?per_page=100&page=%d", base, page), nil, &cs); err != nil {
			return nil, err
		}
		for _, c := range cs {
			if i := strings.Index(c.Body, prefix); i >= 0 {
				key, _, ok := strings.Cut(c.Body[i+len(prefix):], " -->")
				if _, dup := found[key]; ok && !dup {
					found[key] = c.ID
				}
			}
		}
		if len(cs) < 100 {
			break
		}
	}
	return found, nil
}

// editReviewComment edits the body of review comment id, which an earlier
// outcome of the work made for the finding c: its place stays.
func (g *GitHub) editReviewComment(ctx context.Context, inst int64, p Plan, c Comment, id int64) error {
	var out comment
	return g.do(ctx, inst, http.MethodPatch, fmt.Sprintf("%s/pulls/comments/%d", repoPath(p), id),
		reviewCommentRequest{Body: withMarker(c.Body, p.WorkID, c.Key)}, &out)
}

// putIssueComment creates a conversation comment (id 0) or edits it.
func (g *GitHub) putIssueComment(ctx context.Context, inst int64, p Plan, key, text string, id int64) (int64, error) {
	body := reviewCommentRequest{Body: withMarker(text, p.WorkID, key)}
	var out comment
	if id != 0 {
		return id, g.do(ctx, inst, http.MethodPatch, fmt.Sprintf("%s/issues/comments/%d", repoPath(p), id), body, &out)
	}
	err := g.do(ctx, inst, http.MethodPost, fmt.Sprintf("%s/issues/%d/comments", repoPath(p), p.Number), body, &out)
	return out.ID, err
}

type reviewRequest struct {
	CommitID string          `json:"commit_id"`
	Body     string          `json:"body"`
	Event    string          `json:"event"`
	Comments []reviewComment `json:"comments"`
}

type reviewComment struct {
	Path string `json:"path"`
	Line int    `json:"line"`
	Side string `json:"side"`
	Body string `json:"body"`
}

// markedReviews lists the pull request's reviews that carry the work's
// marker, by key (reviewKey of the outcome that made each).
func (g *GitHub) markedReviews(ctx context.Context, inst int64, p Plan) (map[string]int64, error) {
	return g.marked(ctx, inst, fmt.Sprintf("%s/pulls/%d/reviews", repoPath(p), p.Number), p.WorkID)
}

// reviewComments lists the comments review id made, by key.
func (g *GitHub) reviewComments(ctx context.Context, inst int64, p Plan, id int64) (map[string]int64, error) {
	return g.marked(ctx, inst, fmt.Sprintf("%s/pulls/%d/reviews/%d/comments", repoPath(p), p.Number, id), p.WorkID)
}

// postReview makes one review of the pull request at the plan's head that
// carries the comments cs, each with its marker, its body with the
// outcome's: one request however many findings there are.
func (g *GitHub) postReview(ctx context.Context, inst int64, p Plan, cs []Comment) (int64, error) {
	req := reviewRequest{CommitID: p.HeadSHA, Body: withMarker(p.Review, p.WorkID, reviewKey(p.Outcome)), Event: "COMMENT"}
	for _, c := range cs {
		req.Comments = append(req.Comments, reviewComment{Path: c.Path, Line: c.Line, Side: "RIGHT", Body: withMarker(c.Body, p.WorkID, c.Key)})
	}
	var out comment
	if err := g.do(ctx, inst, http.MethodPost, fmt.Sprintf("%s/pulls/%d/reviews", repoPath(p), p.Number), req, &out); err != nil {
		return 0, err
	}
	return out.ID, nil
}
