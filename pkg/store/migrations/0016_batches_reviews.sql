-- Batches: a manifest of items, each a work item found by its stable
-- item id. The work rows are ordinary work (the ingress fence applies per
-- item); the manifest only names them.
CREATE TABLE batches (
    id           text PRIMARY KEY,
    tenant_id    text NOT NULL REFERENCES tenants (id),
    contract     text NOT NULL,
    item_count   int NOT NULL CHECK (item_count > 0),
    -- sha256 of the items as asked, so a batch key used again with other
    -- items is told apart from a retry of the same request
    items_digest text NOT NULL,
    deadline_at  timestamptz NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    canceled_at  timestamptz,
    CONSTRAINT batches_tenant UNIQUE (id, tenant_id)
);
CREATE INDEX batches_tenant_created ON batches (tenant_id, created_at);

CREATE TABLE batch_items (
    batch_id  text NOT NULL,
    item_id   text NOT NULL,
    tenant_id text NOT NULL,
    work_id   text NOT NULL,
    PRIMARY KEY (batch_id, item_id),
    FOREIGN KEY (batch_id, tenant_id) REFERENCES batches (id, tenant_id),
    FOREIGN KEY (work_id, tenant_id) REFERENCES work (id, tenant_id)
);
CREATE INDEX batch_items_work ON batch_items (work_id);

-- The human review queue: one item per work at most (reviews_one_per_work
-- is the fence), so a redelivered verdict or a re-run adds nothing.
-- Entries are made by the triggers below, which fire only for work that
-- ends needing a person; every other write to work and results pays a WHEN
-- test and nothing else.
CREATE TABLE reviews (
    id          bigserial PRIMARY KEY,
    work_id     text NOT NULL,
    tenant_id   text NOT NULL,
    contract    text NOT NULL,
    lane        text NOT NULL,
    reason      text NOT NULL CHECK (reason IN ('needs_human_review', 'schema_rejected', 'retry_exhausted')),
    state       text NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'resolved')),
    verdict     text CHECK (verdict IN ('approved', 'rejected', 'dismissed')),
    resolved_by text,
    note        text,
    resolved_at timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT reviews_one_per_work UNIQUE (work_id),
    CONSTRAINT reviews_resolution CHECK ((state = 'resolved') =
        (verdict IS NOT NULL AND resolved_by IS NOT NULL AND resolved_at IS NOT NULL)),
    FOREIGN KEY (work_id, tenant_id) REFERENCES work (id, tenant_id)
);
CREATE INDEX reviews_tenant_created ON reviews (tenant_id, created_at, id);

-- Work that ends schema_rejected (the repair budget is spent) or, on the
-- interactive lane, retry_exhausted: someone was waiting for it.
CREATE FUNCTION review_ended_work() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO reviews (work_id, tenant_id, contract, lane, reason)
    VALUES (NEW.id, NEW.tenant_id, NEW.contract, NEW.lane, NEW.state)
    ON CONFLICT (work_id) DO NOTHING;
    RETURN NULL;
END
$$;
CREATE TRIGGER work_needs_review AFTER UPDATE OF state ON work FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state AND (NEW.state = 'schema_rejected'
        OR (NEW.state = 'retry_exhausted' AND NEW.lane = 'interactive')))
    EXECUTE FUNCTION review_ended_work();

-- An accepted answer that asks for a person (moderation's needsHumanReview).
CREATE FUNCTION review_accepted_result() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO reviews (work_id, tenant_id, contract, lane, reason)
    SELECT w.id, w.tenant_id, w.contract, w.lane, 'needs_human_review' FROM work w WHERE w.id = NEW.work_id
    ON CONFLICT (work_id) DO NOTHING;
    RETURN NULL;
END
$$;
CREATE TRIGGER result_needs_review AFTER INSERT ON results FOR EACH ROW
    WHEN (NEW.output @> '{"needsHumanReview": true}')
    EXECUTE FUNCTION review_accepted_result();
