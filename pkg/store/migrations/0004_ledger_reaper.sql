-- The ledger reaper: Postgres, not the broker, is the record of every
-- attempt. A ledger row the reaper writes for an attempt whose worker died
-- before it could report is an estimate (the attempt's reservation, no
-- units); the attempt's own event, should it still arrive, replaces it.
ALTER TABLE ledger ADD COLUMN estimated boolean NOT NULL DEFAULT false;

-- Attempts nobody reported for: running ones and those marked lease_expired
-- when the work was claimed again.
CREATE INDEX attempts_unreported ON attempts (started_at)
    WHERE outcome IS NULL OR outcome = 'lease_expired';

-- An attempt's ATTEMPT event in the outbox, found by its message id.
CREATE INDEX outbox_msg_id ON outbox (msg_id);

-- ATTEMPT events by publication time, for re-reading the ones the broker
-- lost.
CREATE INDEX outbox_attempt_published ON outbox (published_at)
    WHERE subject LIKE 'assay.%.attempt.%';
