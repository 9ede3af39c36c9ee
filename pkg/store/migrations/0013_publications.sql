-- What a webhook delivery needs to be published back to: the GitHub App
-- installation that sent it and the base it was opened against (the head is
-- the work's revision).
ALTER TABLE webhook_deliveries
    ADD COLUMN installation_id bigint,
    ADD COLUMN base_sha text;

-- Work whose outcome has been written to the OUTCOME stream's outbox. The
-- commit transaction sets it; outcomes reached elsewhere (superseded,
-- expired, dropped, canceled) are announced by the committer's sweep.
ALTER TABLE work ADD COLUMN outcome_announced_at timestamptz;
-- Work that ended before this column existed is not announced again.
UPDATE work SET outcome_announced_at = updated_at
    WHERE state NOT IN ('queued', 'running');
CREATE INDEX work_outcome_unannounced ON work (updated_at)
    WHERE outcome_announced_at IS NULL AND state NOT IN ('queued', 'running');

-- The publication fence: one row per work and target ('github', 'callback',
-- 'dry'). The remote ids recorded here turn a redelivered outcome into an
-- edit of what exists, never a second check run or comment.
CREATE TABLE publications (
    work_id          text NOT NULL,
    target           text NOT NULL CHECK (target IN ('github', 'callback', 'dry')),
    tenant_id        text NOT NULL,
    outcome          text NOT NULL,
    check_run_id     bigint,
    -- finding index (as text) -> review comment id
    comment_ids      jsonb NOT NULL DEFAULT '{}',
    rerun_comment_id bigint,
    -- what was (or, for 'dry', would be) published
    plan             jsonb NOT NULL DEFAULT '{}',
    tries            int NOT NULL DEFAULT 0,
    last_error       text,
    published_at     timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (work_id, target)
);

-- A tenant's check-run policy: 'advisory' (the default) never fails a
-- check; 'blocking' fails it when an accepted result has a blocking finding.
ALTER TABLE tenants
    ADD COLUMN check_policy text NOT NULL DEFAULT 'advisory' CHECK (check_policy IN ('advisory', 'blocking'));

-- A tenant that is not on GitHub gets its outcomes as signed callbacks
-- (Standard Webhooks) at its endpoint, signed with its own secret.
CREATE TABLE tenant_callbacks (
    tenant_id  text PRIMARY KEY REFERENCES tenants (id),
    url        text NOT NULL CHECK (url ~ '^https?://'),
    secret     text NOT NULL CHECK (secret LIKE 'whsec_%'),
    created_at timestamptz NOT NULL DEFAULT now()
);
