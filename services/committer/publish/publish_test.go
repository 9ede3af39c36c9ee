package publish

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric/noop"

	"assay.dev/pkg/devkit/fakegithub"
	"assay.dev/pkg/devkit/storetest"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/event"
	"assay.dev/pkg/githubapp"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// installations keeps each test's streams and durable apart on the shared
// server.
var installations atomic.Int32

const head = "0123456789abcdef0123456789abcdef01234567"

type bundle struct {
	names event.Names
	st    *store.Store
	js    jetstream.JetStream
	gh    *fakegithub.Server
	pub   *Publisher
}

// setup starts a publisher on real Postgres and JetStream, publishing to a
// fake GitHub API as app 1.
func setup(t *testing.T, edit ...func(*Config)) *bundle {
	t.Helper()
	ctx := t.Context()
	names := event.Names{Installation: fmt.Sprintf("pub%d", installations.Add(1)), Cell: "us"}
	st, _ := storetest.Migrated(t, store.TenantSeed{ID: "acme", HomeRegion: "us", Token: "tok-acme"})
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := event.EnsureStream(ctx, js, nil, names, event.KindOutcome, event.StreamSettings{}); err != nil {
		t.Fatal(err)
	}
	gh := fakegithub.New()
	t.Cleanup(gh.Close)
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	gh.App(1, &key.PublicKey)
	cfg := Config{Region: "us", Names: names, GitHub: &GitHub{App: &githubapp.App{API: gh.URL, ID: 1, Key: key, UserAgent: "assay-test"}},
		Rerun: func(id string) string { return "assay work rerun " + id + " --region us" }, RetryEvery: 20 * time.Millisecond}
	for _, e := range edit {
		e(&cfg)
	}
	if cfg.GitHub != nil {
		cfg.GitHub.App.Now = cfg.Now
	}
	p, err := New(cfg, st, js, slog.New(slog.NewTextHandler(io.Discard, nil)), noop.NewMeterProvider().Meter("test"))
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{names: names, st: st, js: js, gh: gh, pub: p}
}

func (b *bundle) start(t *testing.T) {
	t.Helper()
	if err := b.pub.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.pub.Stop(context.Background()) })
}

// webhookWork stores code-review work for shop/app#7 as a webhook delivery
// from installation 42 would; drop, when set, stores it dropped.
func (b *bundle) webhookWork(t *testing.T, n int, drop string) *store.Work {
	t.Helper()
	w := &store.Work{ID: fmt.Sprintf("w_pub%d", n), TenantID: "acme", Region: "us", Contract: "code-review",
		SchemaVersion: "1", TaxonomyVersion: "2026-11", SourceID: fmt.Sprintf("shop/app#%d", n), Revision: head,
		Lane: event.Interactive, Input: `{}`, Digest: "sha256:00", DeadlineAt: time.Now().Add(time.Minute), DropReason: drop}
	r, err := b.st.InsertWebhookWork(t.Context(), store.Delivery{ID: fmt.Sprintf("d-%d", n), TenantID: "acme", Event: "pull_request",
		Action: "opened", Installation: 42, BaseSHA: strings.Repeat("b", 40)}, w, func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil })
	if err != nil {
		t.Fatal(err)
	}
	return r.Work
}

// twoFindings is an answer with two findings.
const twoFindings = `{"schemaVersion":1,"changeId":"c","findings":[
		{"file":"cart.js","line":12,"severity":"blocking","summary":"total can go negative","evidence":"total -= d"},
		{"file":"cart.js","line":20,"severity":"info","summary":"unused variable","evidence":"let x"}]}`

// accepted commits an answer with two findings for the work.
func (b *bundle) accepted(t *testing.T, n int) *store.Work {
	t.Helper()
	return b.acceptedWith(t, n, twoFindings)
}

// acceptedWith commits the answer out for the work.
func (b *bundle) acceptedWith(t *testing.T, n int, out string) *store.Work {
	t.Helper()
	w := b.webhookWork(t, n, "")
	attempt := fmt.Sprintf("00000000-0000-4000-8000-%012d", n)
	token := fmt.Sprintf("00000000-0000-4000-9000-%012d", n)
	if _, ok, err := b.st.Claim(t.Context(), w.ID, attempt, token, time.Minute, 0); err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	if v, err := b.st.Commit(t.Context(), w, attempt, token, json.RawMessage(out), 2, nil); err != nil || v != store.Committed {
		t.Fatalf("commit: %v %v", v, err)
	}
	w.State = outcome.Accepted
	return w
}

func outcomeOf(w *store.Work) event.Outcome {
	return event.Outcome{OutcomeID: event.OutcomeMsgID(w.ID, w.State), WorkID: w.ID, TenantID: w.TenantID, Region: "us",
		Outcome: w.State, At: time.Now()}
}

// deliver publishes the outcome event without a message id, so the
// stream keeps every copy: each is a delivery of its own.
func (b *bundle) deliver(t *testing.T, ev event.Outcome, times int) {
	t.Helper()
	raw, _ := json.Marshal(ev)
	for range times {
		if _, err := b.js.Publish(t.Context(), b.names.Outcome(ev.TenantID), raw); err != nil {
			t.Fatal(err)
		}
	}
}

// waitFor polls cond until it holds, or fails saying what is missing.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ackedAll is whether the publisher's durable has acknowledged every
// message of the stream.
func (b *bundle) ackedAll(t *testing.T) bool {
	c, err := b.js.Consumer(t.Context(), b.names.Stream(event.KindOutcome), b.names.OutcomeConsumer())
	if err != nil {
		return false
	}
	info, err := c.Info(t.Context())
	if err != nil {
		return false
	}
	s, err := b.js.Stream(t.Context(), b.names.Stream(event.KindOutcome))
	if err != nil {
		return false
	}
	si, err := s.Info(t.Context())
	return err == nil && info.AckFloor.Stream == si.State.LastSeq && info.NumAckPending == 0 && info.NumPending == 0
}

// An outcome delivered ten times gives one check run and one review with
// a comment per finding; the nine redeliveries find the publication made
// and send nothing.
func TestTenDeliveriesOnePublication(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t)
	w := b.accepted(t, 1)
	b.deliver(t, outcomeOf(w), 10)
	waitFor(t, "ten deliveries acknowledged", func() bool { return b.ackedAll(t) })
	runs := b.gh.CheckRuns()
	if len(runs) != 1 || runs[0].ExternalID != w.ID || runs[0].Conclusion != "neutral" || runs[0].HeadSHA != head {
		t.Fatalf("check runs = %+v, want one neutral (advisory) run for %s", runs, w.ID)
	}
	if runs[0].Edits != 0 {
		t.Errorf("check run edited %d times, want 0: a redelivery changes nothing", runs[0].Edits)
	}
	cs := b.gh.Comments()
	if len(cs) != 2 || b.gh.CommentsOf(w.ID) != 2 {
		t.Fatalf("comments = %+v, want one set of 2", cs)
	}
	reviews := b.gh.Reviews()
	if len(reviews) != 1 || reviews[0].Comments != 2 || reviews[0].CommitID != head || reviews[0].Number != 1 ||
		!strings.Contains(reviews[0].Body, "<!-- assay:work="+w.ID+" key=review-accepted -->") {
		t.Fatalf("reviews = %+v, want one with the 2 comments, marked", reviews)
	}
	for _, c := range cs {
		if !c.Review || c.ReviewID != reviews[0].ID || c.Path != "cart.js" || c.CommitID != head || c.Side != "RIGHT" || c.Edits != 0 {
			t.Errorf("comment %+v: want a comment of the review on cart.js at the head, never edited", c)
		}
	}
	pub, err := b.st.GetPublication(t.Context(), w.ID, TargetGitHub)
	if err != nil || pub.CheckRunID != runs[0].ID || pub.ReviewID != reviews[0].ID || len(pub.CommentIDs) != 2 ||
		pub.PublishedAt.IsZero() || pub.State != store.PublicationPublished {
		t.Fatalf("fence row = %+v, %v", pub, err)
	}
	// The first delivery's calls: the check-run lookup, the check run, the
	// review lookup, the review and the read of its comments' ids (the token
	// request is not an API call).
	if reqs := apiCalls(b.gh); reqs != 5 {
		t.Errorf("GitHub got %d API calls for ten deliveries, want the first delivery's 5", reqs)
	}
	t.Logf("10 deliveries: %d check run, 1 review of %d comments, %d API calls", len(runs), len(cs), apiCalls(b.gh))
}

// contentWrites counts the content-creating requests GitHub got (POST, PATCH,
// PUT and DELETE to a repository), answered or refused.
func contentWrites(gh *fakegithub.Server) int {
	n := 0
	for _, r := range gh.Requests() {
		if r.Method != http.MethodGet && strings.HasPrefix(r.Path, "/repos/") {
			n++
		}
	}
	return n
}

// The findings of a pull request, however many, go out as one review: a
// publication makes two content-creating requests, the check run and the
// review.
func TestFindingsAsOneReviewTwoWrites(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var fs []string
	for i := range 12 {
		fs = append(fs, fmt.Sprintf(`{"file":"cart.js","line":%d,"severity":"info","summary":"finding %d","evidence":"x"}`, 10+i, i))
	}
	w := b.acceptedWith(t, 8, `{"schemaVersion":1,"changeId":"c","findings":[`+strings.Join(fs, ",")+`]}`)
	if err := b.pub.Publish(t.Context(), outcomeOf(w)); err != nil {
		t.Fatal(err)
	}
	pub, err := b.st.GetPublication(t.Context(), w.ID, TargetGitHub)
	if err != nil || pub.State != store.PublicationPublished || len(pub.CommentIDs) != 12 {
		t.Fatalf("publication %+v, %v; want published with 12 comment ids", pub, err)
	}
	if n := contentWrites(b.gh); n != 2 || b.gh.Writes(42) != 2 || b.gh.WritesTo("shop/app", 8) != 2 {
		t.Fatalf("%d content-creating requests (%d by installation 42, %d to shop/app#8), want 2: the check run and the review",
			n, b.gh.Writes(42), b.gh.WritesTo("shop/app", 8))
	}
	if rs := b.gh.Reviews(); len(rs) != 1 || rs[0].Comments != 12 || b.gh.CommentsOf(w.ID) != 12 {
		t.Fatalf("reviews %+v, %d comments; want one review of 12", rs, b.gh.CommentsOf(w.ID))
	}
	t.Logf("12 findings: %d content-creating requests, %d API calls", contentWrites(b.gh), apiCalls(b.gh))
}

// A try whose review call failed after the check run was made is tried
// again without editing the check run: the retry makes the review alone.
func TestReviewFailedRetryMakesOnlyTheReview(t *testing.T) {
	t.Parallel()
	clk := newClock()
	b := setup(t, func(c *Config) { c.Now = clk.Now })
	w := b.accepted(t, 9)
	b.gh.FailNext(fakegithub.Fault{Status: http.StatusBadGateway, Body: `{"message":"Bad Gateway"}`, Method: http.MethodPost,
		Path: "/pulls/9/reviews"})
	if err := b.pub.Publish(t.Context(), outcomeOf(w)); err != nil {
		t.Fatal(err)
	}
	pub, err := b.st.GetPublication(t.Context(), w.ID, TargetGitHub)
	if err != nil || pub.State != store.PublicationPending || pub.Tries != 1 || !strings.Contains(pub.LastError, "502") ||
		!pub.Done(store.StepCheckRun) || pub.Done(store.StepReview) {
		t.Fatalf("after the 502: %+v, %v; want pending with the check run done and the review not", pub, err)
	}
	clk.Set(pub.NextTryAt)
	if _, err := b.pub.RetryDue(t.Context()); err != nil {
		t.Fatal(err)
	}
	if pub, _ = b.st.GetPublication(t.Context(), w.ID, TargetGitHub); pub.State != store.PublicationPublished {
		t.Fatalf("after the retry: %+v", pub)
	}
	runs := b.gh.CheckRuns()
	if len(runs) != 1 || runs[0].Edits != 0 || len(b.gh.Reviews()) != 1 || b.gh.CommentsOf(w.ID) != 2 {
		t.Fatalf("after the retry: %d check runs (edits %d), %d reviews, %d comments; want 1 never edited, 1 and 2",
			len(runs), runs[0].Edits, len(b.gh.Reviews()), b.gh.CommentsOf(w.ID))
	}
	var posts, patches int
	for _, r := range b.gh.Requests() {
		switch {
		case r.Method == http.MethodPost && strings.HasSuffix(r.Path, "/reviews"):
			posts++
		case r.Method == http.MethodPatch:
			patches++
		}
	}
	if posts != 2 || patches != 0 || contentWrites(b.gh) != 3 || b.gh.Writes(42) != 2 {
		t.Fatalf("review posts %d, edits %d, content-creating requests %d (%d made); want the refused post and one more, no edit, 3 and 2",
			posts, patches, contentWrites(b.gh), b.gh.Writes(42))
	}
}

// A person's review of accepted work, with one finding amended and one
// added, leaves each finding on the pull request once: the comments the
// model's review made are edited, the new finding goes out in a review of
// its own, and the check run is edited once. A redelivery sends nothing.
func TestReviewedAfterAcceptedEachFindingOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.acceptedWith(t, 10, strings.Replace(twoFindings, `"changeId":"c"`, `"changeId":"c","needsHumanReview":true`, 1))
	if err := b.pub.Publish(t.Context(), outcomeOf(w)); err != nil {
		t.Fatal(err)
	}
	accepted := contentWrites(b.gh)
	amended := json.RawMessage(`{"schemaVersion":1,"changeId":"c","findings":[
		{"file":"cart.js","line":12,"severity":"blocking","summary":"total can go negative","evidence":"total -= d"},
		{"file":"cart.js","line":20,"severity":"warning","summary":"unused variable, and shadowed","evidence":"let x"},
		{"file":"cart.js","line":31,"severity":"info","summary":"a person's own finding","evidence":"y"}]}`)
	if _, err := b.st.ResolveReview(t.Context(), "acme", w.ID, store.Resolution{Verdict: store.VerdictAmended,
		By: store.Actor{Kind: store.ActorReviewer, ID: "ana", Route: store.RouteConsole}, Output: amended}); err != nil {
		t.Fatal(err)
	}
	reviewed := event.Outcome{OutcomeID: event.OutcomeMsgID(w.ID, outcome.Reviewed), WorkID: w.ID, TenantID: "acme", Region: "us",
		Outcome: outcome.Reviewed, At: time.Now()}
	for range 2 {
		if err := b.pub.Publish(t.Context(), reviewed); err != nil {
			t.Fatal(err)
		}
	}
	pub, err := b.st.GetPublication(t.Context(), w.ID, TargetGitHub)
	if err != nil || pub.State != store.PublicationPublished || pub.Outcome != outcome.Reviewed || len(pub.CommentIDs) != 3 {
		t.Fatalf("reviewed publication %+v, %v", pub, err)
	}
	at := map[int]int{}
	for _, c := range b.gh.Comments() {
		at[c.Line]++
		if c.Line == 20 && (!strings.Contains(c.Body, "and shadowed") || c.Edits != 1) {
			t.Errorf("the amended finding's comment %+v: want the model's, edited once to the person's text", c)
		}
	}
	if len(at) != 3 || at[12] != 1 || at[20] != 1 || at[31] != 1 {
		t.Fatalf("comments by line %v; want each of the three findings once", at)
	}
	rs := b.gh.Reviews()
	if len(rs) != 2 || rs[1].Comments != 1 || !strings.Contains(rs[1].Body, "key=review-reviewed") {
		t.Fatalf("reviews %+v; want the model's and one for the person's new finding", rs)
	}
	if runs := b.gh.CheckRuns(); len(runs) != 1 || runs[0].Edits != 1 || !strings.HasPrefix(runs[0].Output.Title, "Reviewed by a person") {
		t.Fatalf("check runs %+v; want one, edited once for the person's review", runs)
	}
	// The check run, the two comments edited and the new finding's review.
	if n := contentWrites(b.gh) - accepted; n != 4 {
		t.Errorf("the reviewed outcome made %d content-creating requests, want 4", n)
	}
	t.Logf("accepted: %d content-creating requests; reviewed: %d more", accepted, contentWrites(b.gh)-accepted)
}

// apiCalls counts the requests GitHub got other than token requests.
func apiCalls(gh *fakegithub.Server) int {
	n := 0
	for _, r := range gh.Requests() {
		if !strings.HasPrefix(r.Path, "/app/") {
			n++
		}
	}
	return n
}

// A publication cut off after GitHub made the review, before its id was
// learned, is recorded as a failed try; the next try makes nothing twice:
// the check run is recorded done, the review's marker finds it.
func TestKilledMidPublicationResumes(t *testing.T) {
	t.Parallel()
	clk := newClock()
	b := setup(t, func(c *Config) { c.Now = clk.Now })
	w := b.accepted(t, 2)
	hung := b.gh.HangAfter(2) // the check run, then the review
	ctx, kill := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- b.pub.Publish(ctx, outcomeOf(w)) }()
	select {
	case <-hung:
	case err := <-done:
		t.Fatalf("publication ended before GitHub hung: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("GitHub never got the review")
	}
	kill()
	if err := <-done; err != nil {
		t.Fatalf("killed publication: %v; want its try recorded", err)
	}
	pub, err := b.st.GetPublication(t.Context(), w.ID, TargetGitHub)
	if err != nil || pub.CheckRunID == 0 || len(pub.CommentIDs) != 0 || pub.State != store.PublicationPending || pub.Tries != 1 ||
		!strings.Contains(pub.LastError, "context canceled") || !pub.NextTryAt.After(clk.Now()) {
		t.Fatalf("after the kill the fence holds %+v, %v; want the check run, no comment id, one failed try and a next one", pub, err)
	}
	if !pub.Done(store.StepCheckRun) || pub.Done(store.StepReview) || pub.ReviewID != 0 {
		t.Fatalf("after the kill the steps are %v (review %d); want the check run done alone", pub.Steps, pub.ReviewID)
	}
	if err := b.pub.Publish(t.Context(), outcomeOf(w)); err != nil || apiCallsTo(b.gh, "/pulls/") != 2 {
		t.Fatalf("redelivered before its next try: %v, %d comment calls; want nothing sent", err, apiCallsTo(b.gh, "/pulls/"))
	}
	clk.Set(pub.NextTryAt)
	if _, err := b.pub.RetryDue(t.Context()); err != nil {
		t.Fatalf("resumed publication: %v", err)
	}
	runs, n := b.gh.CheckRuns(), b.gh.CommentsOf(w.ID)
	if len(runs) != 1 || runs[0].Edits != 0 || n != 2 || len(b.gh.Reviews()) != 1 || contentWrites(b.gh) != 2 {
		t.Fatalf("after resuming: %d check runs (edits %d), %d comments, %d reviews, %d content-creating requests; want 1 (0), 2, 1 and 2",
			len(runs), runs[0].Edits, n, len(b.gh.Reviews()), contentWrites(b.gh))
	}
	pub, _ = b.st.GetPublication(t.Context(), w.ID, TargetGitHub)
	if len(pub.CommentIDs) != 2 || pub.ReviewID != b.gh.Reviews()[0].ID || pub.PublishedAt.IsZero() || pub.State != store.PublicationPublished {
		t.Fatalf("fence row after resuming = %+v", pub)
	}
	t.Logf("killed after GitHub made the check run and the review; resumed: %d check run, 1 review, %d comments, %d content-creating requests",
		len(b.gh.CheckRuns()), b.gh.CommentsOf(w.ID), contentWrites(b.gh))
}

// A publisher killed after GitHub made the check run, before it recorded
// the id, finds that run again on a head with 150 other assay runs (a
// later page of the list), and makes no second one.
func TestKilledMidPublicationFindsItsRunOnALaterPage(t *testing.T) {
	t.Parallel()
	clk := newClock()
	b := setup(t, func(c *Config) { c.Now = clk.Now })
	w := b.accepted(t, 3)
	for i := range 150 {
		b.gh.AddCheckRun("shop/app", fakegithub.CheckRun{Name: CheckName, HeadSHA: w.Revision, ExternalID: fmt.Sprintf("w_other_%d", i),
			Status: "completed", Conclusion: "success"})
	}
	hung := b.gh.HangAfter(1) // the check run
	ctx, kill := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- b.pub.Publish(ctx, outcomeOf(w)) }()
	select {
	case <-hung:
	case err := <-done:
		t.Fatalf("publication ended before GitHub hung: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("GitHub never got the check run")
	}
	kill()
	if err := <-done; err != nil {
		t.Fatalf("killed publication: %v; want its try recorded", err)
	}
	pub, err := b.st.GetPublication(t.Context(), w.ID, TargetGitHub)
	if err != nil || pub.CheckRunID != 0 || pub.State != store.PublicationPending {
		t.Fatalf("after the kill: %+v, %v; want no check run id recorded", pub, err)
	}
	clk.Set(pub.NextTryAt)
	if _, err := b.pub.RetryDue(t.Context()); err != nil {
		t.Fatalf("resumed publication: %v", err)
	}
	mine := 0
	for _, r := range b.gh.CheckRuns() {
		if r.ExternalID == w.ID {
			mine++
		}
	}
	pub, _ = b.st.GetPublication(t.Context(), w.ID, TargetGitHub)
	if mine != 1 || len(b.gh.CheckRuns()) != 151 || pub.State != store.PublicationPublished || pub.CheckRunID == 0 {
		t.Fatalf("after resuming: %d check runs of the work, %d in all, publication %+v; want 1, 151 and published", mine,
			len(b.gh.CheckRuns()), pub)
	}
	// Each look reads both pages of the list: before the first try made
	// the run, and when the resumed try looked for it.
	lists := 0
	for _, r := range b.gh.Requests() {
		if r.Method == "GET" && strings.HasSuffix(r.Path, "/commits/"+w.Revision+"/check-runs") {
			lists++
		}
	}
	if lists != 4 {
		t.Errorf("%d reads of the head's check runs, want 4 (two pages, twice)", lists)
	}
}

// apiCallsTo counts the API calls whose path contains part.
func apiCallsTo(gh *fakegithub.Server, part string) int {
	n := 0
	for _, r := range gh.Requests() {
		if strings.Contains(r.Path, part) {
			n++
		}
	}
	return n
}

// clock is a publisher's clock that moves only when the test says.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Now().UTC().Truncate(time.Second)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set moves the clock to t, never back.
func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.t) {
		c.t = t
	}
}

// A 5xx with Retry-After and a secondary rate limit are tried again, each
// no earlier than GitHub said.
func TestRetriedNoEarlierThanTold(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t)
	w := b.accepted(t, 3)
	b.gh.FailNext(fakegithub.Fault{Status: 503, RetryAfter: "1", Body: `{"message":"Service Unavailable"}`},
		fakegithub.Fault{Status: 403, RetryAfter: "2",
			Body: `{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again."}`})
	b.deliver(t, outcomeOf(w), 1)
	waitFor(t, "the publication after two faults", func() bool {
		p, err := b.st.GetPublication(t.Context(), w.ID, TargetGitHub)
		return err == nil && !p.PublishedAt.IsZero()
	})
	var gaps []time.Duration
	reqs := b.gh.Requests()
	want := []time.Duration{time.Second, 2 * time.Second}
	for i, r := range reqs {
		if r.Status != 503 && r.Status != 403 {
			continue
		}
		if i+1 >= len(reqs) {
			t.Fatalf("no request after the %d", r.Status)
		}
		gaps = append(gaps, reqs[i+1].At.Sub(r.At))
	}
	if len(gaps) != 2 {
		t.Fatalf("faults answered: %d, want 2 (requests %+v)", len(gaps), reqs)
	}
	for i, g := range gaps {
		if g < want[i] {
			t.Errorf("fault %d was tried again after %s, before the %s GitHub asked for", i, g, want[i])
		}
	}
	if runs := b.gh.CheckRuns(); len(runs) != 1 || b.gh.CommentsOf(w.ID) != 2 {
		t.Fatalf("after retries: %d check runs, %d comments", len(runs), b.gh.CommentsOf(w.ID))
	}
	t.Logf("503 Retry-After 1 retried after %s; secondary rate limit Retry-After 2 retried after %s", gaps[0], gaps[1])
}

// Dropped webhook work gets exactly one comment, with its rerun command,
// and no check run; superseded work gets a check run that says so and no
// comments.
func TestDroppedAndSuperseded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t)
	d := b.webhookWork(t, 4, "over acme's interactive rate; ask again with: assay work rerun w_pub4 --region us")
	if d.State != outcome.Dropped {
		t.Fatalf("work is %s, want dropped", d.State)
	}
	s := b.webhookWork(t, 5, "")
	if _, err := b.st.FinishUnleased(t.Context(), s.ID, outcome.Superseded, "a newer revision arrived"); err != nil {
		t.Fatal(err)
	}
	s.State = outcome.Superseded
	b.deliver(t, outcomeOf(d), 3)
	b.deliver(t, outcomeOf(s), 3)
	waitFor(t, "six deliveries acknowledged", func() bool { return b.ackedAll(t) })
	cs := b.gh.Comments()
	if len(cs) != 1 || cs[0].Review || !strings.Contains(cs[0].Body, "assay work rerun w_pub4 --region us") || cs[0].Number != 4 {
		t.Fatalf("comments = %+v, want one conversation comment on #4 with the rerun command", cs)
	}
	runs := b.gh.CheckRuns()
	if len(runs) != 1 || runs[0].ExternalID != s.ID || runs[0].Conclusion != "skipped" || !strings.Contains(runs[0].Output.Title, "Superseded") {
		t.Fatalf("check runs = %+v, want one skipped run saying superseded", runs)
	}
}
