-- The cell's system of record. The three fences are constraints here:
-- ingress = work_ingress_key, claim = attempts_claim (plus the guarded
-- UPDATE on work.lease_token), commit = results primary key.

CREATE TABLE tenants (
    id          text PRIMARY KEY CHECK (id ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    home_region text NOT NULL,
    status      text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'suspended')),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE tenant_tokens (
    token_hash bytea PRIMARY KEY, -- sha256 of the token; the token itself is never stored
    tenant_id  text NOT NULL REFERENCES tenants (id),
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);

CREATE TABLE work (
    id               text PRIMARY KEY,
    tenant_id        text NOT NULL REFERENCES tenants (id),
    region           text NOT NULL,
    contract         text NOT NULL,
    schema_version   text NOT NULL,
    taxonomy_version text NOT NULL,
    source_id        text NOT NULL,
    revision         text NOT NULL,
    lane             text NOT NULL CHECK (lane IN ('interactive', 'batch')),
    input            text NOT NULL,
    content_digest   text NOT NULL,
    state            text NOT NULL DEFAULT 'queued' CHECK (state IN (
        'queued', 'running', 'accepted', 'schema_rejected', 'retry_exhausted',
        'transport_rejected', 'dropped', 'expired', 'superseded', 'canceled', 'budget_exhausted')),
    reason           text,
    lease_token      uuid,
    lease_expires_at timestamptz,
    attempts         int NOT NULL DEFAULT 0,
    repairs          int NOT NULL DEFAULT 0,
    repair_note      text,
    dispatch         int NOT NULL DEFAULT 1,
    deadline_at      timestamptz NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT work_ingress_key UNIQUE (tenant_id, contract, source_id, revision),
    CONSTRAINT work_tenant UNIQUE (id, tenant_id),
    CONSTRAINT work_lease CHECK ((state = 'running') = (lease_token IS NOT NULL))
);
CREATE INDEX work_queued ON work (updated_at) WHERE state = 'queued';
CREATE INDEX work_running ON work (lease_expires_at) WHERE state = 'running';

CREATE TABLE attempts (
    id           uuid PRIMARY KEY,
    work_id      text NOT NULL,
    tenant_id    text NOT NULL,
    number       int NOT NULL,
    lease_token  uuid NOT NULL,
    outcome      text, -- NULL while the call runs
    reason       text,
    raw_response text, -- kept in the cell for diagnosis
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    -- an attempt's tenant is its work's tenant, by construction
    FOREIGN KEY (work_id, tenant_id) REFERENCES work (id, tenant_id),
    CONSTRAINT attempts_claim UNIQUE (work_id, lease_token),
    CONSTRAINT attempts_number UNIQUE (work_id, number)
);

CREATE TABLE results (
    work_id        text NOT NULL,
    schema_version text NOT NULL,
    tenant_id      text NOT NULL,
    attempt_id     uuid NOT NULL REFERENCES attempts (id),
    output         jsonb NOT NULL,
    findings       int NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (work_id, schema_version),
    FOREIGN KEY (work_id, tenant_id) REFERENCES work (id, tenant_id)
);

CREATE TABLE outbox (
    id           bigserial PRIMARY KEY,
    subject      text NOT NULL,
    msg_id       text NOT NULL,
    payload      bytea NOT NULL,
    headers      jsonb NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);
CREATE INDEX outbox_pending ON outbox (id) WHERE published_at IS NULL;

CREATE TABLE ledger (
    attempt_id        uuid PRIMARY KEY,
    tenant_id         text NOT NULL,
    work_id           text NOT NULL,
    model             text NOT NULL,
    outcome           text NOT NULL,
    upstream_attempts int NOT NULL DEFAULT 1,
    input_units       bigint NOT NULL DEFAULT 0,
    output_units      bigint NOT NULL DEFAULT 0,
    cost_micros       bigint NOT NULL DEFAULT 0, -- millionths of a US dollar
    latency_ms        bigint NOT NULL DEFAULT 0,
    occurred_at       timestamptz NOT NULL,
    recorded_at       timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (work_id, tenant_id) REFERENCES work (id, tenant_id)
);
CREATE INDEX ledger_tenant_time ON ledger (tenant_id, occurred_at);
