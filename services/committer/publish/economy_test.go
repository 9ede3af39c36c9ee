package publish

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"assay.dev/pkg/event"
	"assay.dev/pkg/store"
)

// scaledClock runs factor times as fast as the wall clock from start, so
// a minute of GitHub's windows passes in less than one.
type scaledClock struct {
	start, wall time.Time
	factor      float64
}

func (c scaledClock) Now() time.Time {
	return c.start.Add(time.Duration(float64(time.Since(c.wall)) * c.factor))
}

// answerOf is an answer with k findings, each on its own line.
func answerOf(k int) string {
	var fs []string
	for j := range k {
		fs = append(fs, fmt.Sprintf(`{"file":"cart.js","line":%d,"severity":"info","summary":"finding %d","evidence":"x"}`, 10*j+1, j))
	}
	return `{"schemaVersion":1,"changeId":"c","findings":[` + strings.Join(fs, ",") + `]}`
}

// A burst of 60 pull requests of one installation, 15 each with 1, 2, 3
// and 4 findings, delivered at once to a GitHub that holds an installation
// to 80 content-creating requests a minute and 500 an hour: every review
// arrives, each with one check run and each finding once, in at most two
// such requests per pull request, with no request GitHub refuses, and the
// last within 120s of the delivery. The clock the publisher, its budget
// and GitHub share runs twice as fast as the wall's
// (ASSAY_BURST_CLOCK_SCALE=1 runs it in real time).
func TestABurstStaysUnderGitHubsLimits(t *testing.T) {
	t.Parallel()
	// Twice the wall's speed keeps the budget's 2s margin a second of the
	// wall, more than a loaded machine delays one request behind another.
	factor := 2.0
	if v := os.Getenv("ASSAY_BURST_CLOCK_SCALE"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 {
			t.Fatalf("ASSAY_BURST_CLOCK_SCALE=%q is not a positive number", v)
		}
		factor = f
	}
	clk := scaledClock{start: time.Now().UTC(), wall: time.Now(), factor: factor}
	b := setup(t, func(c *Config) { c.Now = clk.Now })
	b.gh.SetClock(clk.Now)
	b.gh.Limit(DefaultWritesPerMinute, DefaultWritesPerHour)
	const pulls = 60
	var works []*store.Work
	for i := range pulls {
		works = append(works, b.acceptedWith(t, 100+i, answerOf(1+i%4)))
	}
	b.start(t)
	for _, w := range works {
		b.deliver(t, outcomeOf(w), 1)
	}
	delivered := clk.Now()

	// Every publication ends; the wall's deadline leaves room for a loaded
	// machine at any clock scale.
	ctx := t.Context()
	deadline := time.Now().Add(time.Duration(float64(10*time.Minute) / factor * 2))
	var last time.Time
	for {
		published := 0
		for _, w := range works {
			ps, err := b.st.PublicationsOf(ctx, w.ID)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range ps {
				if p.Target == TargetGitHub && p.State == store.PublicationPublished {
					published++
					if p.LastTriedAt.After(last) {
						last = p.LastTriedAt
					}
				}
			}
		}
		if published == pulls {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d reviews published after %s of the clock", published, pulls, clk.Now().Sub(delivered))
		}
		time.Sleep(100 * time.Millisecond)
	}

	runs := map[string]int{}
	for _, r := range b.gh.CheckRuns() {
		runs[r.ExternalID]++
	}
	most := 0
	for i, w := range works {
		if runs[w.ID] != 1 {
			t.Errorf("%s has %d check runs, want 1", w.ID, runs[w.ID])
		}
		want := 1 + i%4
		keys := map[string]int{}
		for _, c := range b.gh.Comments() {
			if k, ok := markerKey(c.Body, w.ID); ok {
				keys[k]++
			}
		}
		if len(keys) != want {
			t.Errorf("%s: comments under %d keys, want its %d findings", w.ID, len(keys), want)
		}
		for k, n := range keys {
			if n != 1 {
				t.Errorf("%s: finding %s commented %d times", w.ID, k, n)
			}
		}
		n := b.gh.WritesTo("shop/app", int64(100+i))
		if n > 2 {
			t.Errorf("%s: %d content-creating requests, want at most 2", w.ID, n)
		}
		most = max(most, n)
	}
	if n := b.gh.SecondaryLimited(); n != 0 {
		t.Errorf("GitHub refused %d requests for its secondary limit", n)
	}
	took := last.Sub(delivered)
	if took > 120*time.Second {
		t.Errorf("the last review was published %s after the burst was delivered, want within 120s", took)
	}
	t.Logf("%d pull requests: %d content-creating requests (at most %d for one), the last published %s after delivery (clock x%g)",
		pulls, b.gh.Writes(42), most, took.Round(100*time.Millisecond), factor)
}

// markerKey is the key of the work's marker in a comment's body.
func markerKey(body, workID string) (string, bool) {
	prefix := "<!-- assay:work=" + workID + " key="
	i := strings.Index(body, prefix)
	if i < 0 {
		return "", false
	}
	k, _, ok := strings.Cut(body[i+len(prefix):], " -->")
	return k, ok
}

// A review whose pull request has a newer revision accepted, or on its
// way, before it is published is not posted: its publication ends
// superseded, naming the revision. One whose newer revision ended
// without an answer (canceled) is posted.
func TestNoReviewOfASupersededRevision(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	old := b.accepted(t, 300)
	newer := b.revision(t, old, "w_pub300b", strings.Repeat("c", 40))
	kept := b.accepted(t, 301)
	canceled := b.revision(t, kept, "w_pub301b", strings.Repeat("d", 40))
	if _, err := b.st.CancelWork(ctx, canceled.ID, "closed", func(*store.Work, bool) ([]store.OutboxMsg, error) { return nil, nil },
		nil); err != nil {
		t.Fatal(err)
	}
	b.start(t)
	b.deliver(t, outcomeOf(old), 1)
	b.deliver(t, outcomeOf(kept), 1)
	waitFor(t, "both publications recorded", func() bool {
		o, err1 := b.st.PublicationsOf(ctx, old.ID)
		k, err2 := b.st.PublicationsOf(ctx, kept.ID)
		return err1 == nil && err2 == nil && len(o) == 1 && len(k) == 1 && o[0].State != store.PublicationPending &&
			k[0].State == store.PublicationPublished
	})
	pubs, err := b.st.PublicationsOf(ctx, old.ID)
	if err != nil {
		t.Fatal(err)
	}
	if p := pubs[0]; p.State != store.PublicationSuperseded || !strings.Contains(p.Reason, newer.Revision) {
		t.Fatalf("the older revision's publication is %s (%q), want superseded naming revision %s", p.State, p.Reason, newer.Revision)
	}
	for _, r := range b.gh.CheckRuns() {
		if r.ExternalID == old.ID {
			t.Fatalf("a check run was made for the superseded revision %s", old.ID)
		}
	}
	if n := b.gh.CommentsOf(old.ID); n != 0 {
		t.Fatalf("%d comments made for the superseded revision", n)
	}
	if n := b.gh.CommentsOf(kept.ID); n != 2 {
		t.Fatalf("the review whose newer revision was canceled has %d comments, want its 2 findings", n)
	}
}

// revision stores a newer revision (head sha) of w's pull request, queued.
func (b *bundle) revision(t *testing.T, w *store.Work, id, sha string) *store.Work {
	t.Helper()
	nw := &store.Work{ID: id, TenantID: w.TenantID, Region: "us", Contract: w.Contract, SchemaVersion: "1",
		TaxonomyVersion: "2026-11", SourceID: w.SourceID, Revision: sha, Lane: event.Interactive, Input: `{}`,
		Digest: "sha256:01", DeadlineAt: time.Now().Add(time.Minute)}
	r, err := b.st.InsertWebhookWork(t.Context(), store.Delivery{ID: "d-" + id, TenantID: w.TenantID, Event: "pull_request",
		Action: "synchronize", Installation: 42, BaseSHA: strings.Repeat("b", 40)}, nw,
		func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil })
	if err != nil {
		t.Fatal(err)
	}
	return r.Work
}
