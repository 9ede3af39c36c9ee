-- Outbox rows name the stream they go to, so a relay selects the streams
-- its credential may publish to and the ledger's reaper finds ATTEMPT
-- events without the store knowing how subjects are spelled.
ALTER TABLE outbox ADD COLUMN stream text NOT NULL DEFAULT '';
UPDATE outbox SET stream = upper(split_part(subject, '.', 3)) WHERE stream = '';
ALTER TABLE outbox ALTER COLUMN stream DROP DEFAULT;

DROP INDEX IF EXISTS outbox_pending_subject;
DROP INDEX IF EXISTS outbox_attempt_published;
CREATE INDEX outbox_pending_stream ON outbox (stream, id) WHERE published_at IS NULL;
CREATE INDEX outbox_stream_published ON outbox (stream, published_at) WHERE published_at IS NOT NULL;

-- The budget period rule, once: the start (UTC) of the period of kind
-- period ('day' or 'month') that holds at. Every reservation, settlement
-- and correction asks this function.
CREATE FUNCTION budget_period_start(period text, at timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT date_trunc(CASE period WHEN 'day' THEN 'day' ELSE 'month' END, at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
$$;
