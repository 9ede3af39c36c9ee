-- A partial review (a review in parts that its cost cap, its tenant's
-- budget or its deadline stopped) is continued by work of its own: the
-- rest of the same revision, under a cost cap given for it. rest_of names
-- the work whose review it continues (always the first, partial one);
-- its revision is that work's with "+rest<n>" after it, so the ingress
-- key keeps one work per continuation and a newer push of the source
-- supersedes it as it would any revision. cost_cap_micros, when set, is
-- the work's own cap on its calls' estimated cost.
ALTER TABLE work
    ADD COLUMN rest_of text,
    ADD COLUMN cost_cap_micros bigint CHECK (cost_cap_micros > 0);
CREATE INDEX work_rest_of ON work (rest_of) WHERE rest_of IS NOT NULL;

-- A tenant's cap on one work item's estimated cost, over the cell's
-- (ASSAY_WORK_COST_CAP_MICROS) and the contract's; a continuation's own cap
-- is over it.
ALTER TABLE tenants
    ADD COLUMN work_cost_cap_micros bigint CHECK (work_cost_cap_micros > 0);
