-- An attempt's ATTEMPT event may be kept on the attempt's own row instead
-- of an outbox row. The statement that records the attempt already writes
-- a new version of that row; the event adds its bytes to it, where an
-- outbox row added a row, its index entries, a row of outbox_waiting made
-- and deleted, and a second version when it was dated. The worker publishes
-- the event once the record has committed; what the broker loses of it is
-- read back from here by the ledger's and the committer's reapers, as they
-- read back an outbox row. event_call is false for an attempt that made no
-- model call of its own (the ledger has no row to write for it).
ALTER TABLE attempts ADD COLUMN event bytea, ADD COLUMN event_call boolean;
-- Kept compressed in the row: the table moves large values out of line
-- early (toast_tuple_target), and an event is read back only when lost.
ALTER TABLE attempts ALTER COLUMN event SET STORAGE MAIN;
-- The ledger's reaper reads the events of calls of its horizon that have
-- no ledger row, by the time they were recorded.
CREATE INDEX attempts_called ON attempts (finished_at) WHERE event_call;
