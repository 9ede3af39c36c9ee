package webhook

import (
	"testing"

	"assay.dev/pkg/api"
	"assay.dev/pkg/store"
)

// bind, as a table: who signed, which links exist, and what the delivery
// names decide its tenant or its refusal.
func TestBind(t *testing.T) {
	t.Parallel()
	acme := &store.SourceLink{Tenant: store.Tenant{ID: "acme"}}
	initech := &store.SourceLink{Tenant: store.Tenant{ID: "initech"}}
	inst := func(tenant string, repos ...string) *store.SourceLink {
		return &store.SourceLink{Tenant: store.Tenant{ID: tenant}, Repositories: repos}
	}
	pr := func(repo string, installation int64) *PullRequestEvent {
		e := &PullRequestEvent{Repository: Repository{FullName: repo}}
		if installation > 0 {
			e.Installation = &Installation{ID: installation}
		}
		return e
	}
	app := signer{app: true}
	cases := []struct {
		name   string
		pr     *PullRequestEvent
		by     signer
		links  store.WebhookLinks
		tenant string
		code   string
	}{
		{"installation over a covered owner", pr("shop/checkout", 7), app, store.WebhookLinks{Installation: inst("acme", "shop/*")}, "acme", ""},
		{"installation over a named repository", pr("shop/checkout", 7), app, store.WebhookLinks{Installation: inst("acme", "shop/checkout")}, "acme", ""},
		{"installation over another owner", pr("initech/private", 7), app, store.WebhookLinks{Installation: inst("acme", "shop/*")}, "", "repository_not_covered"},
		{"installation over a sibling repository", pr("shop/billing", 7), app, store.WebhookLinks{Installation: inst("acme", "shop/checkout")}, "", "repository_not_covered"},
		{"installation over another tenant's repository", pr("shop/checkout", 7), app, store.WebhookLinks{Installation: inst("acme", "shop/*"), Repository: initech}, "", "repository_not_covered"},
		{"installation and its tenant's repository", pr("shop/checkout", 7), app, store.WebhookLinks{Installation: inst("acme", "shop/*"), Repository: acme}, "acme", ""},
		{"installation linked before repositories were", pr("shop/checkout", 7), app, store.WebhookLinks{Installation: inst("acme")}, "", "repository_not_covered"},
		{"unlinked installation, linked repository", pr("shop/checkout", 7), app, store.WebhookLinks{Repository: acme}, "acme", ""},
		{"unlinked installation and repository", pr("shop/checkout", 7), app, store.WebhookLinks{}, "", "unknown_installation"},
		{"repository hook, cell secret", pr("shop/checkout", 0), app, store.WebhookLinks{Repository: acme}, "acme", ""},
		{"repository hook, nothing linked", pr("shop/checkout", 0), app, store.WebhookLinks{}, "", "unknown_installation"},
		{"tenant secret over its repository", pr("initech/private", 0), signer{tenant: "initech"}, store.WebhookLinks{Repository: initech}, "initech", ""},
		{"tenant secret naming an installation", pr("initech/private", 7), signer{tenant: "initech"}, store.WebhookLinks{Repository: initech}, "initech", ""},
		{"tenant secret over another's repository", pr("shop/checkout", 0), signer{tenant: "initech"}, store.WebhookLinks{Repository: acme}, "", "invalid_signature"},
		{"tenant secret, repository since unlinked", pr("initech/private", 0), signer{tenant: "initech"}, store.WebhookLinks{}, "", "invalid_signature"},
	}
	for _, c := range cases {
		got, _, refused := bind(c.pr, c.by, c.links)
		code := ""
		if refused != nil {
			code = refused.Code
		}
		if got.ID != c.tenant || code != c.code {
			t.Errorf("%s: tenant %q, refused %q; want %q, %q", c.name, got.ID, code, c.tenant, c.code)
		}
	}
	for p, ok := range map[string]bool{"shop/*": true, "shop/checkout": true, "shop": false, "*/*": false, "shop/..": false, "shop/a/b": false, "-x/*": false} {
		if api.RepositoryPatternOK(p) != ok {
			t.Errorf("RepositoryPatternOK(%q) = %v", p, !ok)
		}
	}
}
