-- When the source last changed (a pull request's updated_at), so revisions
-- delivered out of order still supersede in the order they were pushed.
ALTER TABLE work ADD COLUMN source_updated_at timestamptz;
CREATE INDEX work_source ON work (tenant_id, contract, source_id);
