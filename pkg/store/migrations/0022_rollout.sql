-- Rollouts: several versions of a contract live side by side, a route
-- names which one new work gets, and a candidate (another version, model
-- or prompt) runs in the shadow before it may take the route.

-- A prompt other than the one its contract version ships with, by the
-- sha256 of its text: work that names a digest is asked with this text.
CREATE TABLE contract_prompts (
    digest     text PRIMARY KEY CHECK (digest ~ '^sha256:[0-9a-f]{64}$'),
    contract   text NOT NULL,
    body       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The route of a contract's new work: for every tenant (scope '*') or for
-- one tenant, which overrides it. The live version (with the model and
-- prompt it is asked with; NULL: the cell's model, the version's own
-- prompt) and, optionally, a candidate that a share of live work also
-- runs with, in the shadow.
CREATE TABLE contract_routes (
    scope            text NOT NULL CHECK (scope = '*' OR scope ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    contract         text NOT NULL,
    live_version     text NOT NULL,
    live_model       text,
    live_prompt      text REFERENCES contract_prompts (digest),
    candidate_version text,
    candidate_model  text,
    candidate_prompt text REFERENCES contract_prompts (digest),
    shadow_share     real NOT NULL DEFAULT 0 CHECK (shadow_share >= 0 AND shadow_share <= 1),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    updated_by       text,
    PRIMARY KEY (scope, contract),
    CHECK (candidate_version IS NOT NULL OR (candidate_model IS NULL AND candidate_prompt IS NULL AND shadow_share = 0))
);

-- What a work item is asked with besides its contract version, and
-- whether it is a shadow: shadow_of names the live work it runs beside,
-- or 'check:<id>' for an item of a rollout check. Shadow work is never
-- published and opens no review item; its calls are ledgered, marked.
ALTER TABLE work
    ADD COLUMN model text,
    ADD COLUMN prompt_digest text REFERENCES contract_prompts (digest),
    ADD COLUMN shadow_of text;
CREATE INDEX work_shadow_of ON work (shadow_of) WHERE shadow_of IS NOT NULL;

ALTER TABLE ledger ADD COLUMN shadow boolean NOT NULL DEFAULT false;

-- Each run of assay rollout check: for exactly which version, model and
-- prompt digest, whether it passed, and its report.
CREATE TABLE rollout_checks (
    id             bigserial PRIMARY KEY,
    contract       text NOT NULL,
    schema_version text NOT NULL,
    model          text NOT NULL DEFAULT '',  -- '': the cell's model
    prompt_digest  text NOT NULL,
    tenant_id      text NOT NULL REFERENCES tenants (id),
    state          text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'passed', 'failed')),
    report         jsonb,
    started_at     timestamptz NOT NULL DEFAULT now(),
    ended_at       timestamptz
);
CREATE INDEX rollout_checks_of ON rollout_checks (contract, schema_version, model, prompt_digest, id);

-- Shadow work opens no review item.
DROP TRIGGER work_needs_review ON work;
CREATE TRIGGER work_needs_review AFTER UPDATE OF state ON work FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state AND NEW.shadow_of IS NULL AND (NEW.state = 'schema_rejected'
        OR (NEW.state = 'retry_exhausted' AND NEW.lane = 'interactive'
            AND coalesce(NEW.reason, '') NOT LIKE 'provider_unavailable%')))
    EXECUTE FUNCTION review_ended_work();

CREATE OR REPLACE FUNCTION review_accepted_result() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO reviews (work_id, tenant_id, contract, lane, reason)
    SELECT w.id, w.tenant_id, w.contract, w.lane, 'needs_human_review' FROM work w
    WHERE w.id = NEW.work_id AND w.shadow_of IS NULL
    ON CONFLICT (work_id) DO NOTHING;
    RETURN NULL;
END
$$;
