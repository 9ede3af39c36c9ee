-- A tenant's weight in its lanes' fair share: served in turn with the
-- other tenants waiting there, weight turns for each of theirs' one.
ALTER TABLE tenants ADD COLUMN weight integer NOT NULL DEFAULT 1
    CHECK (weight BETWEEN 1 AND 1000);

-- Ingress bounds each tenant's open batch work; the count reads this index
-- alone, and only batch rows carry it.
CREATE INDEX work_batch_open ON work (tenant_id)
    WHERE lane = 'batch' AND state IN ('queued', 'running');
