-- The rows the hot path rewrites stay narrow. Each change of a work row
-- writes a new version of it, and until now every version copied its
-- input (about a kilobyte, inline below the 2 kB TOAST threshold): with a
-- toast_tuple_target of 128 bytes the input goes out of line once, at the
-- insert, and a version copies a pointer. The same for an attempt's raw
-- answer, rewritten when the committer records its verdict. (An outbox
-- row's payload stays inline: the relay reads every payload it sends, and
-- reading it out of line cost more than its one rewrite saved.) Rows
-- already there keep their layout until they are next written.
ALTER TABLE work SET (toast_tuple_target = 128, fillfactor = 85);
ALTER TABLE attempts SET (toast_tuple_target = 128);

-- A lease moved on (the handoff to the committer, an extension while a long
-- call runs) changes lease_expires_at alone. Indexed, it made every such
-- change a new version in every index of the table; the sweeper needs only
-- the running rows, few, and reads their leases in the heap. With the key
-- the id, and room left on the page (fillfactor 85), a lease's change is a
-- heap-only update.
DROP INDEX work_running;
CREATE INDEX work_running ON work (id) WHERE state = 'running';

-- The ingress key's first three columns are this index's: its lookups by
-- source are the key's.
DROP INDEX work_source;
