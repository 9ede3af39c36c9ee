package fakegithub

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// send makes one request with token and a JSON body (nil for none), and
// returns the status, the Retry-After header and the body.
func send(t *testing.T, s *Server, token, method, path string, body any) (int, string, []byte) {
	t.Helper()
	var b bytes.Buffer
	if body != nil {
		if err := json.NewEncoder(&b).Encode(body); err != nil {
			t.Fatal(err)
		}
	}
	req, err := http.NewRequest(method, s.URL+path, &b)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "token "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out bytes.Buffer
	_, _ = out.ReadFrom(resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), out.Bytes()
}

// A review is made with all its comments at once, each a review comment
// of the pull request that names it; one that lacks a commit, a place or
// the COMMENT event is refused; its comments are listed by review.
func TestReview(t *testing.T) {
	t.Parallel()
	s := New()
	t.Cleanup(s.Close)
	review := map[string]any{"commit_id": "abc", "body": "two findings <!-- assay:work=w1 key=review-accepted -->", "event": "COMMENT",
		"comments": []map[string]any{
			{"path": "a.go", "line": 3, "side": "RIGHT", "body": "x <!-- assay:work=w1 key=0 -->"},
			{"path": "b.go", "line": 9, "side": "RIGHT", "body": "y <!-- assay:work=w1 key=1 -->"}}}
	for _, bad := range []map[string]any{
		{"body": "b", "event": "COMMENT", "comments": []map[string]any{{"path": "a.go", "line": 3, "body": "x"}}},
		{"commit_id": "abc", "body": "b", "event": "APPROVE"},
		{"commit_id": "abc", "body": "b", "event": "COMMENT", "comments": []map[string]any{{"path": "a.go", "line": 0, "body": "x"}}},
		{"commit_id": "abc", "body": "b", "event": "COMMENT", "comments": []map[string]any{{"line": 3, "body": "x"}}},
	} {
		if status, _, _ := send(t, s, "ghs_fake_7", "POST", "/repos/shop/app/pulls/4/reviews", bad); status != http.StatusUnprocessableEntity {
			t.Errorf("review %v: HTTP %d, want 422", bad, status)
		}
	}
	status, _, raw := send(t, s, "ghs_fake_7", "POST", "/repos/shop/app/pulls/4/reviews", review)
	var made Review
	if status != http.StatusOK || json.Unmarshal(raw, &made) != nil || made.ID == 0 || made.State != "COMMENTED" {
		t.Fatalf("review: HTTP %d %s", status, raw)
	}
	rs, cs := s.Reviews(), s.Comments()
	if len(rs) != 1 || rs[0].Repo != "shop/app" || rs[0].Number != 4 || rs[0].Comments != 2 || len(cs) != 2 || s.CommentsOf("w1") != 2 {
		t.Fatalf("reviews %+v, comments %+v", rs, cs)
	}
	for _, c := range cs {
		if !c.Review || c.ReviewID != made.ID || c.CommitID != "abc" || c.Number != 4 || c.Line <= 0 {
			t.Errorf("comment %+v: want a review comment of review %d at abc", c, made.ID)
		}
	}
	var listed []Review
	if status, _, raw := send(t, s, "ghs_fake_7", "GET", "/repos/shop/app/pulls/4/reviews?per_page=100", nil); status != 200 ||
		json.Unmarshal(raw, &listed) != nil || len(listed) != 1 || !strings.Contains(listed[0].Body, "key=review-accepted") {
		t.Fatalf("reviews of #4: HTTP %d %s", status, raw)
	}
	var of []Comment
	if status, _, raw := send(t, s, "ghs_fake_7", "GET", "/repos/shop/app/pulls/4/reviews/"+itoa(made.ID)+"/comments", nil); status != 200 ||
		json.Unmarshal(raw, &of) != nil || len(of) != 2 {
		t.Fatalf("the review's comments: HTTP %d %s", status, raw)
	}
	if status, _, raw := send(t, s, "ghs_fake_7", "GET", "/repos/shop/app/pulls/4/comments", nil); status != 200 ||
		json.Unmarshal(raw, &of) != nil || len(of) != 2 {
		t.Fatalf("the pull request's review comments: HTTP %d %s", status, raw)
	}
	if s.Writes(7) != 1 || s.WritesTo("shop/app", 4) != 1 {
		t.Fatalf("writes: %d by installation 7, %d to shop/app#4; want the review's 1", s.Writes(7), s.WritesTo("shop/app", 4))
	}
}

func itoa(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// clock is a server clock the test moves.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Limit holds each installation to its content-creating requests a minute
// and an hour, in sliding windows of the server's clock: past either, a 403
// for a secondary rate limit with the seconds until one more fits. Reads,
// other installations and refused requests do not count.
func TestLimit(t *testing.T) {
	t.Parallel()
	s := New()
	t.Cleanup(s.Close)
	clk := &clock{t: time.Unix(1_800_000_000, 0)}
	s.SetClock(clk.now)
	s.Limit(3, 5)
	run := map[string]any{"name": "assay", "head_sha": "abc", "status": "completed", "conclusion": "success"}
	post := func(token string) (int, string, []byte) {
		return send(t, s, token, "POST", "/repos/shop/app/check-runs", run)
	}
	for i := range 3 {
		if status, _, raw := post("ghs_fake_1"); status != http.StatusCreated {
			t.Fatalf("write %d: HTTP %d %s", i, status, raw)
		}
		clk.add(10 * time.Second)
	}
	// At 30s: three in the minute, the first made at 0s.
	status, wait, raw := post("ghs_fake_1")
	if status != http.StatusForbidden || wait != "30" || !strings.Contains(string(raw), "secondary rate limit") {
		t.Fatalf("fourth write in the minute: HTTP %d Retry-After %q %s; want 403 after 30s", status, wait, raw)
	}
	if status, _, _ := send(t, s, "ghs_fake_1", "GET", "/repos/shop/app/commits/abc/check-runs", nil); status != 200 {
		t.Fatalf("a read while limited: HTTP %d", status)
	}
	if status, _, _ := post("ghs_fake_2"); status != http.StatusCreated {
		t.Fatalf("another installation's write: HTTP %d", status)
	}
	clk.add(30 * time.Second)
	for i := range 2 {
		if status, _, raw := post("ghs_fake_1"); status != http.StatusCreated {
			t.Fatalf("write %d after the minute: HTTP %d %s", i, status, raw)
		}
		clk.add(30 * time.Second)
	}
	// At 120s: five in the hour, the first made at 0s.
	if status, wait, _ := post("ghs_fake_1"); status != http.StatusForbidden || wait != "3480" {
		t.Fatalf("sixth write in the hour: HTTP %d Retry-After %q; want 403 after 3480s", status, wait)
	}
	clk.add(3480 * time.Second)
	if status, _, _ := post("ghs_fake_1"); status != http.StatusCreated {
		t.Fatalf("a write once the hour allows one: HTTP %d", status)
	}
	if s.SecondaryLimited() != 2 || s.Writes(1) != 6 || s.Writes(2) != 1 {
		t.Fatalf("limited %d, writes %d and %d; want 2, 6 and 1", s.SecondaryLimited(), s.Writes(1), s.Writes(2))
	}
	if s.Writes(0) != 0 {
		t.Fatalf("static writes %d, want 0", s.Writes(0))
	}
}
