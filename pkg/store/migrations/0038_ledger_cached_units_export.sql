-- A ledger row keeps the part of its input units the provider read from
-- its prompt cache (priced at the cached-input price) and the part of its
-- output units spent on hidden reasoning (billed as output). Rows written
-- before hold 0 of each: they were priced at the full input price.
ALTER TABLE ledger
    ADD COLUMN cached_input_units bigint NOT NULL DEFAULT 0,
    ADD COLUMN reasoning_units bigint NOT NULL DEFAULT 0;

-- The export's order (assay usage export): the transaction that inserted
-- the row, then its attempt id. A row is exported only once every
-- transaction that could still insert one before it has ended (its xact is
-- below the oldest running transaction's), so a cursor past a row never
-- skips one committed later. A constant default fills the rows written
-- before without rewriting the table (they sort first); new rows take
-- their own transaction's id.
ALTER TABLE ledger ADD COLUMN xact xid8 NOT NULL DEFAULT '0';
ALTER TABLE ledger ALTER COLUMN xact SET DEFAULT pg_current_xact_id();
CREATE INDEX ledger_export ON ledger (xact, attempt_id);
