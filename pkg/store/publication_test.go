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
