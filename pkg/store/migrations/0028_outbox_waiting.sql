-- An outbox row is written once and then only dated. Until now it was its
-- own queue entry: sending it set published_at, a column three of its
-- indexes named, so every row was written twice in full, its payload
-- included, with a new entry in each index. What waits to be sent, and how
-- its tries went, is now a narrow row of outbox_waiting, made by a trigger
-- for every row written to the outbox (by any statement, of any release)
-- and deleted when the row is sent. The outbox row's own published_at is
-- named by no index, and the table leaves half of each page free, so
-- dating a row is a heap-only update of that page. The table of what
-- waits holds only rows sent in the last moments (a relay is handed what
-- its process wrote and sends it at once) and those set aside: its key is
-- all a relay's poll needs. The outbox's own tries, last_error,
-- first_failed_at and set_aside_at stay for an older release still
-- running beside this one; this release neither reads nor writes them.
CREATE TABLE outbox_waiting (
    id              bigint PRIMARY KEY,
    stream          text NOT NULL,
    tries           int NOT NULL DEFAULT 0,
    last_error      text,
    first_failed_at timestamptz,
    set_aside_at    timestamptz
);
CREATE INDEX outbox_waiting_set_aside ON outbox_waiting (set_aside_at) WHERE set_aside_at IS NOT NULL;

INSERT INTO outbox_waiting (id, stream, tries, last_error, first_failed_at, set_aside_at)
SELECT id, stream, tries, last_error, first_failed_at, set_aside_at FROM outbox WHERE published_at IS NULL;

CREATE FUNCTION outbox_wait() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox_waiting (id, stream) SELECT id, stream FROM written WHERE published_at IS NULL;
    RETURN NULL;
END $$;
CREATE TRIGGER outbox_wait AFTER INSERT ON outbox REFERENCING NEW TABLE AS written
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_wait();

-- Published rows are found by stream and age (the reapers, a move's
-- settle count, retention) through the time they were written, which
-- never changes.
DROP INDEX outbox_pending_stream;
DROP INDEX outbox_set_aside;
DROP INDEX outbox_stream_published;
CREATE INDEX outbox_stream_created ON outbox (stream, created_at);
ALTER TABLE outbox SET (fillfactor = 50);
