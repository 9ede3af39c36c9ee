-- The history of every route: each change of its live variant (set-live,
-- promote, or override when it moved without a passed rollout check) and
-- of its candidate (set-candidate), who made it, the check that allowed a
-- move of live traffic and, for an override, why it moved without one.
-- A variant is its version, model and prompt digest; a version of '' is
-- none (a route without a candidate), a model or prompt of '' the cell's
-- model or the version's own prompt.
CREATE TABLE route_changes (
    id           bigserial PRIMARY KEY,
    scope        text NOT NULL,
    contract     text NOT NULL,
    at           timestamptz NOT NULL DEFAULT now(),
    changed_by   text NOT NULL DEFAULT '',
    verb         text NOT NULL CHECK (verb IN ('set-live', 'promote', 'set-candidate', 'override')),
    from_version text NOT NULL DEFAULT '',
    from_model   text NOT NULL DEFAULT '',
    from_prompt  text NOT NULL DEFAULT '',
    to_version   text NOT NULL DEFAULT '',
    to_model     text NOT NULL DEFAULT '',
    to_prompt    text NOT NULL DEFAULT '',
    check_id     bigint REFERENCES rollout_checks (id),
    reason       text,
    -- An override says why, and only an override has a reason and no check.
    CHECK ((verb = 'override') = (btrim(coalesce(reason, '')) <> '')),
    CHECK (verb <> 'override' OR check_id IS NULL)
);
CREATE INDEX route_changes_of ON route_changes (contract, scope, id);

-- The change that put a route's live variant where it is: NULL for a
-- route made before the history was kept. The console and assay rollout
-- status mark a live variant whose change is an override.
ALTER TABLE contract_routes ADD COLUMN live_change bigint REFERENCES route_changes (id);
