-- Tenants carry their budget and admission settings; budgets are reserved
-- before a model call and settled from the ledger, per period.

ALTER TABLE tenants
    ADD COLUMN budget_micros bigint CHECK (budget_micros IS NULL OR budget_micros >= 0), -- per period; NULL = unlimited
    ADD COLUMN budget_period text NOT NULL DEFAULT 'month' CHECK (budget_period IN ('day', 'month')),
    ADD COLUMN rate_per_minute int NOT NULL DEFAULT 600 CHECK (rate_per_minute > 0),
    ADD COLUMN burst int NOT NULL DEFAULT 60 CHECK (burst > 0);

ALTER TABLE tenant_tokens
    ADD COLUMN id bigserial UNIQUE,
    ADD COLUMN label text NOT NULL DEFAULT '';

CREATE TABLE budget_periods (
    tenant_id       text NOT NULL REFERENCES tenants (id),
    period_start    timestamptz NOT NULL,
    limit_micros    bigint NOT NULL,
    reserved_micros bigint NOT NULL DEFAULT 0,
    spent_micros    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, period_start),
    -- The fence is the guarded UPDATE that reserves: it admits a reservation
    -- only while reserved + spent + amount stays within the limit.
    CONSTRAINT budget_non_negative CHECK (reserved_micros >= 0 AND spent_micros >= 0)
);

CREATE TABLE budget_reservations (
    attempt_id    uuid PRIMARY KEY,
    tenant_id     text NOT NULL,
    period_start  timestamptz NOT NULL,
    amount_micros bigint NOT NULL CHECK (amount_micros >= 0),
    created_at    timestamptz NOT NULL DEFAULT now(),
    settled_at    timestamptz,
    FOREIGN KEY (tenant_id, period_start) REFERENCES budget_periods (tenant_id, period_start)
);

-- Where webhook-originated work comes from: a GitHub App installation or a
-- repository, mapped to the tenant that owns it.
CREATE TABLE tenant_sources (
    kind      text NOT NULL CHECK (kind IN ('github_installation', 'github_repository')),
    key       text NOT NULL,
    tenant_id text NOT NULL REFERENCES tenants (id),
    PRIMARY KEY (kind, key)
);

-- The outbox is shared by a cell's services; each relay publishes only the
-- subjects its credential may publish.
CREATE INDEX outbox_pending_subject ON outbox (subject text_pattern_ops, id) WHERE published_at IS NULL;

CREATE TABLE webhook_deliveries (
    delivery_id text PRIMARY KEY, -- X-GitHub-Delivery
    tenant_id   text REFERENCES tenants (id),
    event       text NOT NULL,
    action      text NOT NULL DEFAULT '',
    decision    text NOT NULL,
    work_id     text,
    received_at timestamptz NOT NULL DEFAULT now()
);
