package publish

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"assay.dev/pkg/devkit/fakegithub"
	"assay.dev/pkg/store"
)

// tryAgain moves the clock to the publication's next try and waits until
// the retrier has made it; it returns the row after.
func (b *bundle) tryAgain(t *testing.T, clk *clock, workID, target string) *store.Publication {
	t.Helper()
	before, err := b.st.GetPublication(t.Context(), workID, target)
	if err != nil {
		t.Fatal(err)
	}
	clk.Set(before.NextTryAt)
	var after *store.Publication
	waitFor(t, target+" tried again", func() bool {
		after, err = b.st.GetPublication(t.Context(), workID, target)
		return err == nil && (after.Tries > before.Tries || after.State != before.State)
	})
	return after
}

// endpoint is a tenant's callback receiver that answers 503 while down.
type endpoint struct {
	*httptest.Server
	mu   sync.Mutex
	down bool
	ids  []string // webhook-id of each request
	ok   int
}

func newEndpoint(t *testing.T, down bool) *endpoint {
	e := &endpoint{down: down}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		e.mu.Lock()
		defer e.mu.Unlock()
		e.ids = append(e.ids, r.Header.Get(HeaderID))
		if e.down {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		e.ok++
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(e.Close)
	return e
}

func (e *endpoint) set(down bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.down = down
}

func (e *endpoint) counts() (requests, ok int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.ids), e.ok
}

// GitHub answering 500 for over three minutes of the publisher's clock —
// longer than the two seconds times fifty deliveries the publication once
// had — then recovering: the publication is tried with a growing backoff,
// made exactly once, and a storm of redeliveries after changes nothing.
// The tenant's callback, up all along, is delivered at once.
func TestGitHubDownThreeMinutesThenOnePublication(t *testing.T) {
	t.Parallel()
	clk := newClock()
	start := clk.Now()
	b := setup(t, func(c *Config) { c.Now = clk.Now })
	cb := newEndpoint(t, false)
	if err := b.st.SetCallback(t.Context(), "acme", store.Callback{URL: cb.URL, Secret: store.NewCallbackSecret()}); err != nil {
		t.Fatal(err)
	}
	b.gh.Down(&fakegithub.Fault{Status: http.StatusInternalServerError, Body: `{"message":"Server Error"}`})
	b.start(t)
	w := b.accepted(t, 11)
	b.deliver(t, outcomeOf(w), 1)
	var pub *store.Publication
	waitFor(t, "the first try", func() bool {
		var err error
		pub, err = b.st.GetPublication(t.Context(), w.ID, TargetGitHub)
		return err == nil && pub.Tries == 1
	})
	// The callback's try runs beside GitHub's, on its own: delivered at
	// the first try, at the publisher's clock's start.
	var c *store.Publication
	waitFor(t, "the callback", func() bool {
		var err error
		c, err = b.st.GetPublication(t.Context(), w.ID, TargetCallback)
		return err == nil && c.State != store.PublicationPending
	})
	if c.State != store.PublicationPublished || !c.LastTriedAt.Equal(start) {
		t.Fatalf("callback while GitHub is down: %+v; want it delivered at the first try", c)
	}
	var gaps []time.Duration
	for clk.Now().Sub(start) < 3*time.Minute+10*time.Second {
		gap := pub.NextTryAt.Sub(pub.LastTriedAt)
		if least := b.pub.cfg.Backoff.Base << min(pub.Tries-1, 30) / 2; gap < min(least, b.pub.cfg.Backoff.Cap/2) || gap > b.pub.cfg.Backoff.Cap {
			t.Fatalf("try %d waits %s: outside the backoff's interval", pub.Tries, gap)
		}
		gaps = append(gaps, gap)
		pub = b.tryAgain(t, clk, w.ID, TargetGitHub)
		if pub.State != store.PublicationPending {
			t.Fatalf("after %s of 500s the publication is %s (%s); want it still pending", clk.Now().Sub(start), pub.State, pub.Reason)
		}
	}
	outage := clk.Now().Sub(start)
	tries := pub.Tries
	if len(b.gh.CheckRuns()) != 0 || b.gh.CommentsOf(w.ID) != 0 {
		t.Fatal("GitHub made something while it answered 500")
	}
	b.gh.Down(nil)
	pub = b.tryAgain(t, clk, w.ID, TargetGitHub)
	if pub.State != store.PublicationPublished {
		t.Fatalf("after recovery the publication is %s (%s, last error %s)", pub.State, pub.Reason, pub.LastError)
	}
	runs := b.gh.CheckRuns()
	if len(runs) != 1 || b.gh.CommentsOf(w.ID) != 2 {
		t.Fatalf("after recovery: %d check runs, %d comments; want 1 and 2", len(runs), b.gh.CommentsOf(w.ID))
	}
	calls := apiCalls(b.gh)
	// The storm: fifty redeliveries, and the retrier running through them.
	b.deliver(t, outcomeOf(w), 50)
	waitFor(t, "the storm acknowledged", func() bool { return b.ackedAll(t) })
	clk.Set(clk.Now().Add(time.Hour))
	if _, err := b.pub.RetryDue(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := len(b.gh.CheckRuns()); n != 1 || b.gh.CommentsOf(w.ID) != 2 || apiCalls(b.gh) != calls || b.gh.CheckRuns()[0].Edits != 0 {
		t.Fatalf("after the storm: %d check runs, %d comments, %d API calls (%d before), %d edits; want nothing changed",
			n, b.gh.CommentsOf(w.ID), apiCalls(b.gh), calls, b.gh.CheckRuns()[0].Edits)
	}
	if reqs, ok := cb.counts(); reqs != 1 || ok != 1 {
		t.Fatalf("callback got %d requests (%d ok), want exactly 1", reqs, ok)
	}
	t.Logf("GitHub 500 for %s of publisher time: %d tries, waits %v; after recovery 1 check run, 2 comments; 50 redeliveries: %d API calls more",
		outage.Round(time.Second), tries, roundAll(gaps), apiCalls(b.gh)-calls)
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(100 * time.Millisecond)
	}
	return out
}

// Past its deadline a publication is failed, with its reason, counted by
// the gauge; put back (as assay publish retry does), it is made exactly
// once, and putting back again finds nothing.
func TestPastTheDeadlineFailedThenRetriedOnce(t *testing.T) {
	t.Parallel()
	clk := newClock()
	start := clk.Now()
	b := setup(t, func(c *Config) { c.Now, c.Deadline = clk.Now, 10*time.Minute })
	b.gh.Down(&fakegithub.Fault{Status: http.StatusBadGateway})
	b.start(t)
	w := b.accepted(t, 12)
	b.deliver(t, outcomeOf(w), 1)
	waitFor(t, "the first try", func() bool {
		p, err := b.st.GetPublication(t.Context(), w.ID, TargetGitHub)
		return err == nil && p.Tries == 1
	})
	pub, _ := b.st.GetPublication(t.Context(), w.ID, TargetGitHub)
	for pub.State == store.PublicationPending {
		pub = b.tryAgain(t, clk, w.ID, TargetGitHub)
	}
	if pub.State != store.PublicationFailed || !strings.Contains(pub.Reason, "deadline") || !pub.LastTriedAt.Equal(pub.DeadlineAt) {
		t.Fatalf("publication %+v; want failed after a last try at its deadline", pub)
	}
	if _, err := b.pub.countUnfinished(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := b.pub.counts[[2]string{TargetGitHub, store.PublicationFailed}]; n != 1 {
		t.Fatalf("gauge of failed github publications = %d, want 1", n)
	}
	b.gh.Down(nil)
	back, err := b.st.RetryPublications(t.Context(), w.ID, time.Time{}, time.Hour)
	if err != nil || len(back) != 1 {
		t.Fatalf("retry: %d rows, %v", len(back), err)
	}
	// Put back due at the database's now, which the publisher's clock,
	// ten minutes on, has passed.
	waitFor(t, "the retried publication", func() bool {
		p, err := b.st.GetPublication(t.Context(), w.ID, TargetGitHub)
		return err == nil && p.State == store.PublicationPublished
	})
	if again, err := b.st.RetryPublications(t.Context(), w.ID, time.Time{}, time.Hour); err != nil || len(again) != 0 {
		t.Fatalf("second retry: %d rows, %v; want none", len(again), err)
	}
	if _, err := b.pub.RetryDue(t.Context()); err != nil {
		t.Fatal(err)
	}
	if runs := b.gh.CheckRuns(); len(runs) != 1 || b.gh.CommentsOf(w.ID) != 2 {
		t.Fatalf("after the retry: %d check runs, %d comments; want 1 and 2", len(runs), b.gh.CommentsOf(w.ID))
	}
	t.Logf("failed after %d tries over %s: %s; retried: 1 check run, 2 comments", pub.Tries, pub.LastTriedAt.Sub(start).Round(time.Second), pub.Reason)
}

// A tenant's callback endpoint down for an hour of the publisher's clock
// does not delay the GitHub publication of the same outcome, which is made
// at its first try; the callback is tried all along, and delivered once
// when the endpoint is back.
func TestCallbackDownAnHourDoesNotDelayGitHub(t *testing.T) {
	t.Parallel()
	clk := newClock()
	start := clk.Now()
	b := setup(t, func(c *Config) { c.Now = clk.Now })
	cb := newEndpoint(t, true)
	if err := b.st.SetCallback(t.Context(), "acme", store.Callback{URL: cb.URL, Secret: store.NewCallbackSecret()}); err != nil {
		t.Fatal(err)
	}
	b.start(t)
	w := b.accepted(t, 13)
	b.deliver(t, outcomeOf(w), 1)
	var gh *store.Publication
	waitFor(t, "the GitHub publication", func() bool {
		var err error
		gh, err = b.st.GetPublication(t.Context(), w.ID, TargetGitHub)
		return err == nil && gh.State == store.PublicationPublished
	})
	if !gh.LastTriedAt.Equal(start) || gh.Tries != 0 || len(b.gh.CheckRuns()) != 1 || b.gh.CommentsOf(w.ID) != 2 {
		t.Fatalf("GitHub publication %+v; want it made at the first try, at once", gh)
	}
	calls := apiCalls(b.gh)
	var c *store.Publication
	waitFor(t, "the first callback try", func() bool {
		var err error
		c, err = b.st.GetPublication(t.Context(), w.ID, TargetCallback)
		return err == nil && c.Tries == 1
	})
	for clk.Now().Sub(start) < time.Hour {
		c = b.tryAgain(t, clk, w.ID, TargetCallback)
		if c.State != store.PublicationPending {
			t.Fatalf("callback after %s down: %s (%s); want pending within its day", clk.Now().Sub(start), c.State, c.Reason)
		}
	}
	if apiCalls(b.gh) != calls {
		t.Fatalf("GitHub got %d more calls while the callback was retried", apiCalls(b.gh)-calls)
	}
	tries := c.Tries
	cb.set(false)
	c = b.tryAgain(t, clk, w.ID, TargetCallback)
	reqs, ok := cb.counts()
	if c.State != store.PublicationPublished || ok != 1 || reqs != tries+1 {
		t.Fatalf("callback after recovery: %s, %d requests (%d ok); want published, %d requests, 1 ok", c.State, reqs, ok, tries+1)
	}
	for _, id := range cb.ids {
		if id != outcomeOf(w).OutcomeID {
			t.Fatalf("a callback try carried webhook-id %q, want %q on every try", id, outcomeOf(w).OutcomeID)
		}
	}
	t.Logf("callback down %s: %d tries, GitHub published at the first try (%s after the outcome), callback delivered once after",
		clk.Now().Sub(start).Round(time.Minute), tries, gh.LastTriedAt.Sub(start))
}

// A pending publication whose target went away (the tenant removed its
// callback) is recorded skipped, with why, and not tried again.
func TestPendingTargetGoneIsSkipped(t *testing.T) {
	t.Parallel()
	clk := newClock()
	b := setup(t, func(c *Config) { c.Now = clk.Now })
	cb := newEndpoint(t, true)
	if err := b.st.SetCallback(t.Context(), "acme", store.Callback{URL: cb.URL, Secret: store.NewCallbackSecret()}); err != nil {
		t.Fatal(err)
	}
	w := b.accepted(t, 14)
	if err := b.pub.Publish(t.Context(), outcomeOf(w)); err != nil {
		t.Fatal(err)
	}
	c, err := b.st.GetPublication(t.Context(), w.ID, TargetCallback)
	if err != nil || c.State != store.PublicationPending || c.Tries != 1 {
		t.Fatalf("callback after its first try: %+v, %v", c, err)
	}
	if err := b.st.SetCallback(t.Context(), "acme", store.Callback{}); err != nil {
		t.Fatal(err)
	}
	clk.Set(c.NextTryAt)
	if _, err := b.pub.RetryDue(t.Context()); err != nil {
		t.Fatal(err)
	}
	c, _ = b.st.GetPublication(t.Context(), w.ID, TargetCallback)
	if c.State != store.PublicationSkipped || !strings.Contains(c.Reason, "no longer goes to callback") {
		t.Fatalf("callback removed: %+v; want skipped, saying why", c)
	}
	if due, err := b.st.DuePublications(t.Context(), clk.Now().Add(24*time.Hour), 10); err != nil || len(due) != 0 {
		t.Fatalf("due after: %d, %v; want none", len(due), err)
	}
	if reqs, _ := cb.counts(); reqs != 1 {
		t.Fatalf("the endpoint got %d requests, want the first try's alone", reqs)
	}
}
