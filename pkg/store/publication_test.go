package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"assay.dev/pkg/store"
)

// Where work is published back to: a webhook delivery names its
// installation; work submitted through the API is published only as an
// installation its own tenant linked for the repository.
func TestWorkPullSource(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	head := strings.Repeat("a", 40)
	mk := func(id, tenant, source string) *store.Work {
		return &store.Work{ID: id, TenantID: tenant, Region: "us", Contract: "code-review", SchemaVersion: "1",
			TaxonomyVersion: "t", SourceID: source, Revision: head, Lane: "interactive", Input: `{}`, Digest: "d",
			DeadlineAt: time.Now().Add(time.Minute)}
	}
	none := func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil }
	// Where the publisher reads it: the facts of the work, one statement.
	source := func(w *store.Work) (store.PullSource, error) {
		f, err := s.PublishFacts(ctx, w.ID)
		if err != nil {
			return store.PullSource{}, err
		}
		return store.PullSourceOf(f.Work, f.Delivery, f.Links)
	}
	hooked := mk("w_hook", "acme", "octo/shop#3")
	if _, err := s.InsertWebhookWork(ctx, store.Delivery{ID: "d1", TenantID: "acme", Event: "pull_request", Action: "opened",
		Installation: 42, BaseSHA: strings.Repeat("b", 40)}, hooked, none); err != nil {
		t.Fatal(err)
	}
	if p, err := source(hooked); err != nil || !p.Webhook || p.Installation != 42 || p.Owner != "octo" ||
		p.Repo != "shop" || p.Number != 3 || p.HeadSHA != head || p.BaseSHA != strings.Repeat("b", 40) {
		t.Fatalf("webhook work: %+v, %v", p, err)
	}
	if err := s.LinkSource(ctx, store.Link{Kind: store.SourceGitHubInstallation, Key: "77", Tenant: "other", Repositories: []string{"octo/*"}}); err != nil {
		t.Fatal(err)
	}
	api := mk("w_api", "acme", "octo/shop#4")
	if _, _, err := s.InsertWork(ctx, api, none); err != nil {
		t.Fatal(err)
	}
	if p, err := source(api); err != nil || p.Webhook || p.Installation != 0 {
		t.Fatalf("API work of acme with only other's installation covering the repository: %+v, %v; want none", p, err)
	}
	if err := s.LinkSource(ctx, store.Link{Kind: store.SourceGitHubInstallation, Key: "55", Tenant: "acme", Repositories: []string{"octo/shop"}}); err != nil {
		t.Fatal(err)
	}
	if p, err := source(api); err != nil || p.Installation != 55 {
		t.Fatalf("API work of acme with its own link: %+v, %v; want installation 55", p, err)
	}
	if _, err := store.PullSourceOf(mk("w_mod", "acme", "reviews-9001"), nil, nil); !errors.Is(err, store.ErrNoPullSource) {
		t.Fatalf("a source that is no pull request: %v", err)
	}
}

// A publication's rows: opened pending for each target, a row of the same
// outcome left as it is (a redelivery changes nothing), a row of another
// outcome of the work (dropped work run again) started over with the ids
// it holds; deferred and failed tries are counted, failed ones put back
// once.
func TestPublicationRows(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	w := &store.Work{ID: "w_pubrows", TenantID: "acme", Region: "us", Contract: "code-review", SchemaVersion: "1",
		TaxonomyVersion: "t", SourceID: "shop/app#9", Revision: strings.Repeat("b", 40), Lane: "interactive", Input: `{}`,
		Digest: "d", DeadlineAt: time.Now().Add(time.Minute)}
	if _, _, err := s.InsertWork(ctx, w, func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	targets := []string{"github", "callback"}
	rows, err := s.OpenPublications(ctx, w.ID, "acme", "dropped", targets, t0, t0.Add(time.Hour))
	if err != nil || len(rows) != 2 || rows["github"].State != store.PublicationPending || !rows["github"].NextTryAt.Equal(t0) ||
		!rows["callback"].DeadlineAt.Equal(t0.Add(time.Hour)) {
		t.Fatalf("opened: %+v, %v", rows, err)
	}
	if err := s.FinishRerunComment(ctx, w.ID, "github", "dropped", 77); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishPublication(ctx, w.ID, "github", "dropped", []byte(`{}`), t0); err != nil {
		t.Fatal(err)
	}
	if err := s.DeferPublication(ctx, w.ID, "callback", "HTTP 503", t0, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	again, err := s.OpenPublications(ctx, w.ID, "acme", "dropped", targets, t0.Add(time.Hour), t0.Add(2*time.Hour))
	if err != nil || again["github"].State != store.PublicationPublished || !again["github"].Done(store.StepRerun) || again["callback"].Tries != 1 ||
		!again["callback"].NextTryAt.Equal(t0.Add(time.Minute)) || !again["callback"].DeadlineAt.Equal(t0.Add(time.Hour)) {
		t.Fatalf("the same outcome again: %+v, %v; want the rows as they were", again, err)
	}
	next, err := s.OpenPublications(ctx, w.ID, "acme", "accepted", targets, t0.Add(time.Hour), t0.Add(2*time.Hour))
	if err != nil || next["github"].State != store.PublicationPending || next["github"].Outcome != "accepted" ||
		next["github"].RerunCommentID != 77 || next["github"].Done(store.StepRerun) || len(next["github"].Steps) != 0 ||
		next["callback"].Tries != 0 || !next["callback"].DeadlineAt.Equal(t0.Add(2*time.Hour)) {
		t.Fatalf("the work's next outcome: %+v, %v; want pending again, keeping the ids and no step done", next, err)
	}
	due, err := s.DuePublications(ctx, t0.Add(time.Hour), 10)
	if err != nil || len(due) != 2 {
		t.Fatalf("due at the next outcome's open: %d, %v", len(due), err)
	}
	if err := s.FailPublication(ctx, w.ID, "callback", "HTTP 503", "not made by its deadline", t0.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if failed, err := s.FailedPublications(ctx, w.ID, time.Time{}, 10); err != nil || len(failed) != 1 || failed[0].Tries != 1 ||
		failed[0].Reason != "not made by its deadline" {
		t.Fatalf("failed: %+v, %v", failed, err)
	}
	counts, err := s.UnfinishedPublications(ctx, "acme")
	if err != nil || len(counts) != 2 || counts[0] != (store.PublicationCount{Target: "callback", State: "failed", Count: 1}) ||
		counts[1] != (store.PublicationCount{Target: "github", State: "pending", Count: 1}) {
		t.Fatalf("unfinished: %+v, %v", counts, err)
	}
	if back, err := s.RetryPublications(ctx, w.ID, time.Time{}, time.Hour); err != nil || len(back) != 1 || back[0].State != store.PublicationPending ||
		back[0].Tries != 0 {
		t.Fatalf("retried: %+v, %v", back, err)
	}
	if back, err := s.RetryPublications(ctx, w.ID, time.Time{}, time.Hour); err != nil || len(back) != 0 {
		t.Fatalf("retried twice: %d rows, %v; want none", len(back), err)
	}
	if err := s.SkipPublication(ctx, w.ID, "none", "acme", "accepted", "no installation covers shop/app"); err != nil {
		t.Fatal(err)
	}
	all, err := s.PublicationsOf(ctx, w.ID)
	if err != nil || len(all) != 3 || all[2].Target != "none" || all[2].State != store.PublicationSkipped {
		t.Fatalf("publications of the work: %+v, %v", all, err)
	}
}

// The steps of a publication to GitHub are recorded with their ids, each
// complete for the outcome it was done for: a retry of that outcome finds
// them done, a later outcome of the work finds none done but keeps the ids.
func TestPublicationSteps(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	w := &store.Work{ID: "w_pubsteps", TenantID: "acme", Region: "us", Contract: "code-review", SchemaVersion: "1",
		TaxonomyVersion: "t", SourceID: "shop/app#10", Revision: strings.Repeat("c", 40), Lane: "interactive", Input: `{}`,
		Digest: "d", DeadlineAt: time.Now().Add(time.Minute)}
	if _, _, err := s.InsertWork(ctx, w, func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	if _, err := s.OpenPublications(ctx, w.ID, "acme", "accepted", []string{"github"}, t0, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishCheckRun(ctx, w.ID, "github", "accepted", 5); err != nil {
		t.Fatal(err)
	}
	if err := s.DeferPublication(ctx, w.ID, "github", "HTTP 502", t0, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	p, err := s.GetPublication(ctx, w.ID, "github")
	if err != nil || p.CheckRunID != 5 || !p.Done(store.StepCheckRun) || p.Done(store.StepReview) || p.Tries != 1 {
		t.Fatalf("after the check run and a failed review: %+v, %v; want the check run done, the review not", p, err)
	}
	if err := s.FinishReview(ctx, w.ID, "github", "accepted", 9, map[string]int64{"0": 10, "1": 11}); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishPublication(ctx, w.ID, "github", "accepted", []byte(`{}`), t0); err != nil {
		t.Fatal(err)
	}
	if p, err = s.GetPublication(ctx, w.ID, "github"); err != nil || p.ReviewID != 9 || len(p.CommentIDs) != 2 || !p.Done(store.StepReview) {
		t.Fatalf("after the review: %+v, %v", p, err)
	}
	next, err := s.OpenPublications(ctx, w.ID, "acme", "reviewed", []string{"github"}, t0, t0.Add(time.Hour))
	if p = next["github"]; err != nil || p.Done(store.StepCheckRun) || p.Done(store.StepReview) || p.CheckRunID != 5 || p.ReviewID != 9 ||
		p.CommentIDs["1"] != 11 {
		t.Fatalf("reopened for reviewed: %+v, %v; want no step done and every id kept", p, err)
	}
	// A step recorded late for the earlier outcome counts for nothing.
	if err := s.FinishCheckRun(ctx, w.ID, "github", "accepted", 5); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishComment(ctx, w.ID, "github", "reviewed", "1", 11); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishReview(ctx, w.ID, "github", "reviewed", 0, map[string]int64{"2": 12}); err != nil {
		t.Fatal(err)
	}
	if p, err = s.GetPublication(ctx, w.ID, "github"); err != nil || p.Done(store.StepCheckRun) || !p.Done(store.StepComment("1")) ||
		p.Done(store.StepComment("0")) || !p.Done(store.StepReview) || p.ReviewID != 9 || len(p.CommentIDs) != 3 {
		t.Fatalf("reviewed's steps: %+v, %v", p, err)
	}
}
