package store_test

import (
	"errors"
	"sync"
	"testing"

	"assay.dev/pkg/store"
)

func TestLinkSourceAndTenantBySource(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	if _, err := s.TenantBySource(ctx, store.SourceGitHubInstallation, "42"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unlinked installation: err = %v, want ErrNotFound", err)
	}
	if err := s.LinkSource(ctx, store.Link{Kind: store.SourceGitHubInstallation, Key: "42", Tenant: "acme", Repositories: []string{"octo/*"}}); err != nil {
		t.Fatalf("link: %v", err)
	}
	if err := s.LinkSource(ctx, store.Link{Kind: store.SourceGitHubRepository, Key: "octo/shop", Tenant: "other"}); err != nil {
		t.Fatalf("link repository: %v", err)
	}
	got, err := s.TenantBySource(ctx, store.SourceGitHubInstallation, "42")
	if err != nil || got.ID != "acme" || got.HomeRegion != "us" || got.Status != "active" {
		t.Fatalf("TenantBySource = %+v, %v; want acme, us, active", got, err)
	}
	// The kind is part of the key: the same text under another kind is
	// another source.
	if _, err := s.TenantBySource(ctx, store.SourceGitHubRepository, "42"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("repository 42: err = %v, want ErrNotFound", err)
	}
	if got, err := s.TenantBySource(ctx, store.SourceGitHubRepository, "octo/shop"); err != nil || got.ID != "other" {
		t.Fatalf("repository octo/shop = %+v, %v; want other", got, err)
	}

	// Relinking moves the source.
	if err := s.LinkSource(ctx, store.Link{Kind: store.SourceGitHubInstallation, Key: "42", Tenant: "other", Repositories: []string{"octo/*"}}); err != nil {
		t.Fatalf("relink: %v", err)
	}
	if got, err := s.TenantBySource(ctx, store.SourceGitHubInstallation, "42"); err != nil || got.ID != "other" {
		t.Fatalf("after relink = %+v, %v; want other", got, err)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM tenant_sources`); n != 2 {
		t.Fatalf("%d tenant_sources rows, want 2", n)
	}

	if err := s.LinkSource(ctx, store.Link{Kind: store.SourceGitHubInstallation, Key: "7", Tenant: "nobody", Repositories: []string{"octo/*"}}); err == nil {
		t.Fatal("linked a source to a tenant that does not exist")
	}
	if err := s.LinkSource(ctx, store.Link{Kind: "gitlab_group", Key: "7", Tenant: "acme"}); err == nil {
		t.Fatal("linked a source of an unknown kind")
	}
}

func delivery(id string) store.Delivery {
	return store.Delivery{ID: id, TenantID: "acme", Event: "pull_request", Action: "opened"}
}

func TestInsertWebhookWorkDeliveryFence(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	if _, err := s.GetDelivery(ctx, "d-1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetDelivery before any: err = %v, want ErrNotFound", err)
	}

	const n = 20
	results := make([]store.WebhookInsert, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			results[i], errs[i] = s.InsertWebhookWork(ctx, delivery("d-1"), newWork("acme", "octo/shop#7", "aaa"), announce)
		})
	}
	wg.Wait()
	first, created := 0, 0
	for i, r := range results {
		if errs[i] != nil {
			t.Fatalf("insert %d: %v", i, errs[i])
		}
		if r.Work == nil || r.Work.ID != results[0].Work.ID || r.Delivery.WorkID != r.Work.ID {
			t.Fatalf("insert %d: %+v, want the same work as insert 0 (%+v)", i, r, results[0])
		}
		if r.First {
			first++
		}
		if r.Created {
			created++
		}
		if r.Created != r.First {
			t.Fatalf("insert %d: first=%v created=%v; a repeated delivery must not create work", i, r.First, r.Created)
		}
	}
	if first != 1 || created != 1 {
		t.Fatalf("first=%d created=%d, want 1 and 1", first, created)
	}
	for table, want := range map[string]int{"work": 1, "outbox": 1, "webhook_deliveries": 1} {
		if got := count(t, ctx, s, `SELECT count(*) FROM `+table); got != want {
			t.Fatalf("%d %s rows, want %d", got, table, want)
		}
	}
	d, err := s.GetDelivery(ctx, "d-1")
	if err != nil {
		t.Fatalf("GetDelivery: %v", err)
	}
	if d.TenantID != "acme" || d.Event != "pull_request" || d.Action != "opened" ||
		d.Decision != store.DeliveryQueued || d.WorkID != results[0].Work.ID || d.ReceivedAt.IsZero() {
		t.Fatalf("delivery row = %+v", d)
	}

	// Another delivery for the same key (a reopen at the same head) is
	// recorded, costs nothing and names the same work.
	r, err := s.InsertWebhookWork(ctx, store.Delivery{ID: "d-2", TenantID: "acme", Event: "pull_request", Action: "reopened"},
		newWork("acme", "octo/shop#7", "aaa"), announce)
	if err != nil {
		t.Fatalf("second delivery: %v", err)
	}
	if !r.First || r.Created || r.Work.ID != results[0].Work.ID || r.Delivery.Decision != store.DeliveryDuplicate {
		t.Fatalf("second delivery = %+v (delivery %+v), want first, not created, duplicate", r, r.Delivery)
	}
	if d, _ := s.GetDelivery(ctx, "d-2"); d == nil || d.Decision != store.DeliveryDuplicate || d.WorkID != results[0].Work.ID {
		t.Fatalf("second delivery row = %+v", d)
	}
	if got := count(t, ctx, s, `SELECT count(*) FROM outbox`); got != 1 {
		t.Fatalf("%d outbox rows after a duplicate key, want 1", got)
	}
}

func TestInsertWebhookWorkSupersedes(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	old, err := s.InsertWebhookWork(ctx, delivery("d-old"), newWork("acme", "octo/shop#9", "aaa"), announce)
	if err != nil {
		t.Fatalf("first revision: %v", err)
	}
	w := newWork("acme", "octo/shop#9", "bbb")
	w.SupersedeOlder = true
	d := delivery("d-new")
	d.Action = "synchronize"
	next, err := s.InsertWebhookWork(ctx, d, w, announce)
	if err != nil {
		t.Fatalf("second revision: %v", err)
	}
	if !next.Created || next.Work.ID == old.Work.ID {
		t.Fatalf("second revision = %+v, want new work", next)
	}
	got, err := s.GetWork(ctx, old.Work.ID)
	if err != nil {
		t.Fatalf("read old work: %v", err)
	}
	if got.State != "superseded" || got.Reason != "superseded by revision bbb" {
		t.Fatalf("old work state=%q reason=%q, want superseded by revision bbb", got.State, got.Reason)
	}
	if got, _ := s.GetWork(ctx, next.Work.ID); got.State != "queued" {
		t.Fatalf("new work state = %q, want queued", got.State)
	}
}

func TestInsertWebhookWorkRollsBackWhole(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	boom := errors.New("boom")
	_, err := s.InsertWebhookWork(ctx, delivery("d-1"), newWork("acme", "octo/shop#3", "aaa"), func(*store.Work) ([]store.OutboxMsg, error) {
		return nil, boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the announce error", err)
	}
	for _, table := range []string{"work", "outbox", "webhook_deliveries"} {
		if got := count(t, ctx, s, `SELECT count(*) FROM `+table); got != 0 {
			t.Fatalf("%d %s rows after a failed insert, want 0", got, table)
		}
	}
	// The delivery was not marked seen, so its redelivery does the work.
	r, err := s.InsertWebhookWork(ctx, delivery("d-1"), newWork("acme", "octo/shop#3", "aaa"), announce)
	if err != nil || !r.First || !r.Created {
		t.Fatalf("redelivery = %+v, %v; want first and created", r, err)
	}

	// A delivery naming a tenant that does not exist stores nothing.
	bad := delivery("d-2")
	bad.TenantID = "nobody"
	if _, err := s.InsertWebhookWork(ctx, bad, newWork("nobody", "octo/shop#4", "aaa"), announce); err == nil {
		t.Fatal("recorded a delivery for a tenant that does not exist")
	}
	if _, err := s.GetDelivery(ctx, "d-2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delivery d-2 after a failed insert: err = %v, want ErrNotFound", err)
	}
}
