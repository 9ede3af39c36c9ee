-- A tenant moves between cells of a region while its traffic flows. At the
-- cut-over the receiving cell gets the tenant's history; work the sending
-- cell admitted and has not finished is held there as a row in state
-- 'elsewhere' (its key, its batch items, its deliveries), so a duplicate
-- finds it and nothing in the receiving cell runs, reaps or publishes it.
-- The sending cell finishes it, and the move copies it over as it ends.
ALTER TABLE work DROP CONSTRAINT work_state_check;
ALTER TABLE work ADD CONSTRAINT work_state_check CHECK (state IN (
    'queued', 'running', 'accepted', 'schema_rejected', 'retry_exhausted',
    'transport_rejected', 'dropped', 'expired', 'superseded', 'canceled', 'budget_exhausted',
    'elsewhere'));

-- One row per work held for another cell: which cell finishes it, and what
-- of the tenant's budget the copy counted for it at the cut (spent by its
-- recorded calls, reserved for its calls in flight), so that its final
-- figures replace those and the budget counts each call once.
CREATE TABLE work_held (
    work_id         text PRIMARY KEY,
    tenant_id       text NOT NULL,
    cell            text NOT NULL,
    spent_micros    bigint NOT NULL DEFAULT 0,
    reserved_micros bigint NOT NULL DEFAULT 0,
    period_start    timestamptz,
    held_at         timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (work_id, tenant_id) REFERENCES work (id, tenant_id) ON DELETE CASCADE
);
CREATE INDEX work_held_tenant ON work_held (tenant_id);

-- The sending cell's fence: from the cut-over it admits no new work of a
-- tenant that moved out. A request for work it holds already (the same key)
-- is still answered with that work.
ALTER TABLE tenants ADD COLUMN moved_to text;

CREATE FUNCTION work_moved_out() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    dest text;
BEGIN
    SELECT moved_to INTO dest FROM tenants WHERE id = NEW.tenant_id;
    IF dest IS NOT NULL AND NOT EXISTS (SELECT 1 FROM work
            WHERE tenant_id = NEW.tenant_id AND contract = NEW.contract AND source_id = NEW.source_id AND revision = NEW.revision) THEN
        RAISE EXCEPTION 'tenant % moved to cell %', NEW.tenant_id, dest USING ERRCODE = 'AS421';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER work_moved_out BEFORE INSERT ON work FOR EACH ROW EXECUTE FUNCTION work_moved_out();
