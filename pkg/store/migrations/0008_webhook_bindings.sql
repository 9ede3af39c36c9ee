-- An installation link binds the installation to the repositories it may
-- speak for: patterns "owner/*" or "owner/repo". A link made before this
-- column existed covers nothing until it is made again with them.
ALTER TABLE tenant_sources
    ADD COLUMN repositories text[] NOT NULL DEFAULT '{}',
    ADD CONSTRAINT tenant_sources_repositories_only_installations
        CHECK (kind = 'github_installation' OR cardinality(repositories) = 0);

-- A tenant's own webhook secret signs the repository hooks of repositories
-- linked to it, so no tenant holds a secret that signs for another.
CREATE TABLE tenant_webhook_secrets (
    tenant_id  text PRIMARY KEY REFERENCES tenants (id),
    secret     text NOT NULL CHECK (length(secret) >= 32),
    created_at timestamptz NOT NULL DEFAULT now()
);
