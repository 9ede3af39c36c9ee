-- An outbox row that cannot be published (too large for the broker, a
-- subject no stream takes, a permission the relay lacks) is tried a bounded
-- number of times and then set aside with its error, so it never holds up
-- the rows behind it. Set-aside rows are listed and retried by the operator.
ALTER TABLE outbox
    ADD COLUMN tries int NOT NULL DEFAULT 0,
    ADD COLUMN last_error text,
    ADD COLUMN first_failed_at timestamptz,
    ADD COLUMN set_aside_at timestamptz;

DROP INDEX IF EXISTS outbox_pending_stream;
CREATE INDEX outbox_pending_stream ON outbox (stream, id) WHERE published_at IS NULL AND set_aside_at IS NULL;
CREATE INDEX outbox_set_aside ON outbox (set_aside_at) WHERE set_aside_at IS NOT NULL AND published_at IS NULL;

-- When requeued work may be tried again: a retry honours Retry-After and
-- the backoff even when the work is announced again meanwhile.
ALTER TABLE work ADD COLUMN retry_at timestamptz;

-- What an attempt's call may cost from above, kept from its claim: the
-- ledger charges it for an attempt whose worker died before reporting,
-- budget or no budget.
ALTER TABLE attempts ADD COLUMN estimate_micros bigint NOT NULL DEFAULT 0;
