-- Operators' credentials: not a tenant's. An operator token reads the
-- cell-wide console; it never submits work or reads a tenant's records.
CREATE TABLE operator_tokens (
    id         bigserial PRIMARY KEY,
    name       text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,62}$'),
    token_hash bytea NOT NULL UNIQUE, -- sha256 of the token; the token itself is never stored
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
-- One active token per name, so a name says whose it is.
CREATE UNIQUE INDEX operator_tokens_active_name ON operator_tokens (name) WHERE revoked_at IS NULL;

-- The console's recent decisions: ended work, newest first.
CREATE INDEX work_ended ON work (updated_at DESC) WHERE state NOT IN ('queued', 'running');
