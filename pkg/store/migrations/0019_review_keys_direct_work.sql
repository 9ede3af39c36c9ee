-- A review item is named by its work (one review per work at most), so
-- its public id tells a tenant nothing of how many others exist; its
-- listing pages by creation time and work.
CREATE INDEX reviews_tenant_created_work ON reviews (tenant_id, created_at, work_id);
DROP INDEX reviews_tenant_created;

-- Work asked for on its own (POST /v1/work, a webhook) and not only as a
-- batch's item: canceling a batch that also names it leaves it alone.
-- Work from before that only batches name was a batch's.
ALTER TABLE work ADD COLUMN direct boolean NOT NULL DEFAULT true;
UPDATE work SET direct = false WHERE id IN (SELECT work_id FROM batch_items);
