-- The W3C traceparent of the request that created the work, so a later
-- announcement (the sweeper's) links to the trace it began in.
ALTER TABLE work ADD COLUMN traceparent text
    CHECK (traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$');
