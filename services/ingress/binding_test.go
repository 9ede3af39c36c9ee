package ingress

import (
	"net/http"
	"strings"
	"testing"

	"assay.dev/pkg/store"
	"assay.dev/services/ingress/internal/webhook"
)

// Another tenant's repository, as a payload can name it.
const otherRepo = "initech/private"

// otherPayload is the opened delivery of PR 41 rewritten to name
// initech/private, with or without acme's installation.
func otherPayload(t *testing.T, withInstallation bool) []byte {
	t.Helper()
	return mutate(t, "pull_request_opened.json", func(m map[string]any) {
		m["repository"].(map[string]any)["full_name"] = otherRepo
		if !withInstallation {
			delete(m, "installation")
		}
	})
}

func (e *webhookEnv) seedInitech() {
	e.t.Helper()
	if err := e.st.SeedTenants(e.t.Context(), []store.TenantSeed{{ID: "initech", HomeRegion: "us", Token: "tok-initech"}}); err != nil {
		e.t.Fatal(err)
	}
	e.gh.setDiff(otherRepo+"#41", "diff --git a/vault.go b/vault.go\n--- a/vault.go\n+++ b/vault.go\n@@ -1 +1,2 @@\n package vault\n+const key = \"initech-only\"\n")
}

// An installation speaks only for the repositories its link names: acme's
// installation naming initech's repository is refused before anything is
// fetched, and so is a repository another tenant has linked.
func TestWebhookInstallationCoversOnlyItsRepositories(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, nil)
	e.seedInitech()
	a := e.deliver("pull_request", "d-cross", otherPayload(t, true))
	if a.status != http.StatusForbidden || a.code() != "repository_not_covered" {
		t.Fatalf("acme's installation naming %s: %d %s, want 403 repository_not_covered", otherRepo, a.status, a.body)
	}
	if d := e.decision(webhook.DeliveryKey("d-cross"), "refused"); !strings.Contains(d["reason"].(string), otherRepo) {
		t.Fatalf("decision %v", d)
	}
	e.nothingStored()
	if n := e.gh.calls.Load(); n != 0 {
		t.Fatalf("GitHub asked %d times for a repository the installation does not cover", n)
	}

	// A repository linked to another tenant is not the installation's
	// either, even inside its owner pattern.
	e.link(store.Link{Kind: store.SourceGitHubRepository, Key: "shop/checkout", Tenant: "initech"})
	if a := e.deliver("pull_request", "d-linked", readPayload(t, "pull_request_opened.json")); a.status != http.StatusForbidden {
		t.Fatalf("installation over another tenant's repository: %d %s, want 403", a.status, a.body)
	}
	e.nothingStored()

	// The same repository, linked to acme and named by an exact pattern,
	// is accepted.
	e.link(store.Link{Kind: store.SourceGitHubRepository, Key: "shop/checkout", Tenant: "acme"})
	e.link(store.Link{Kind: store.SourceGitHubInstallation, Key: installation, Tenant: "acme", Repositories: []string{"shop/checkout"}})
	if a := e.deliver("pull_request", "d-own", readPayload(t, "pull_request_opened.json")); a.status != http.StatusAccepted {
		t.Fatalf("acme's own repository: %d %s, want 202", a.status, a.body)
	}
}

// A tenant's webhook secret signs only the repositories linked to that
// tenant: acme's secret cannot sign for initech's repository, nor
// initech's for acme's, and naming an installation steers nothing.
func TestWebhookTenantSecretSignsOnlyItsRepositories(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, nil)
	e.seedInitech()
	e.link(store.Link{Kind: store.SourceGitHubRepository, Key: "shop/checkout", Tenant: "acme"})
	e.link(store.Link{Kind: store.SourceGitHubRepository, Key: otherRepo, Tenant: "initech"})
	acme, initech := store.NewWebhookSecret(), store.NewWebhookSecret()
	for tenant, secret := range map[string]string{"acme": acme, "initech": initech} {
		if err := e.st.SetWebhookSecret(t.Context(), tenant, secret); err != nil {
			t.Fatal(err)
		}
	}
	theirs := otherPayload(t, false)
	if a := e.deliver("pull_request", "d-1", theirs, Sign(acme, theirs)); a.status != http.StatusUnauthorized || a.code() != "invalid_signature" {
		t.Fatalf("acme's secret over initech's repository: %d %s, want 401 invalid_signature", a.status, a.body)
	}
	ours := mutate(t, "pull_request_opened.json", func(m map[string]any) { delete(m, "installation") })
	if a := e.deliver("pull_request", "d-2", ours, Sign(initech, ours)); a.status != http.StatusUnauthorized {
		t.Fatalf("initech's secret over acme's repository: %d %s, want 401", a.status, a.body)
	}
	e.nothingStored()
	if n := e.gh.calls.Load(); n != 0 {
		t.Fatalf("GitHub asked %d times for deliveries no secret of theirs signed", n)
	}

	// initech's own delivery is initech's, whatever installation it names.
	steered := otherPayload(t, true)
	a := e.deliver("pull_request", "d-3", steered, Sign(initech, steered))
	if a.status != http.StatusAccepted {
		t.Fatalf("initech's own repository: %d %s, want 202", a.status, a.body)
	}
	if w, err := e.st.GetWork(t.Context(), a.work().WorkID); err != nil || w.TenantID != "initech" {
		t.Fatalf("work %+v, %v; want initech's", w, err)
	}
}

// A delivery id answers only the tenant that recorded it: another tenant
// reusing it learns nothing of the work, and the owner's redelivery is
// still a duplicate.
func TestWebhookDuplicateDeliveryAnswersOnlyItsTenant(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, nil)
	e.seedInitech()
	e.link(store.Link{Kind: store.SourceGitHubRepository, Key: otherRepo, Tenant: "initech"})
	secret := store.NewWebhookSecret()
	if err := e.st.SetWebhookSecret(t.Context(), "initech", secret); err != nil {
		t.Fatal(err)
	}
	const id = "72d3162e-cc78-11e3-81ab-4c9367dc0958"
	first := e.deliver("pull_request", id, readPayload(t, "pull_request_opened.json"))
	if first.status != http.StatusAccepted {
		t.Fatalf("acme's delivery: %d %s", first.status, first.body)
	}
	acmeWork := first.work().WorkID
	theirs := otherPayload(t, false)
	a := e.deliver("pull_request", id, theirs, Sign(secret, theirs))
	if a.status != http.StatusConflict || a.code() != "delivery_conflict" {
		t.Fatalf("initech reusing acme's delivery id: %d %s, want 409 delivery_conflict", a.status, a.body)
	}
	if strings.Contains(string(a.body), acmeWork) || strings.Contains(string(a.body), "acme") {
		t.Fatalf("the answer tells initech about acme's work: %s", a.body)
	}
	if n := e.count(`SELECT count(*) FROM work WHERE tenant_id = 'initech'`); n != 0 {
		t.Fatalf("%d initech work rows from a refused delivery", n)
	}
	if again := e.deliver("pull_request", id, readPayload(t, "pull_request_opened.json")); again.status != http.StatusOK || again.work().WorkID != acmeWork {
		t.Fatalf("acme's redelivery: %d %s, want 200 with %s", again.status, again.body, acmeWork)
	}
}
