-- A review in parts calibrates its cost cap on what the last calls of
-- reviews in parts were billed (PartCallCosts): newest first, read through
-- this index of the calls alone (a claimed attempt's call is NULL). The
-- hot path's attempts are not in it, and finished_at is indexed already
-- (attempts_called), so their updates stay as they were.
CREATE INDEX attempts_part_calls ON attempts (finished_at) WHERE call IS NOT NULL;
