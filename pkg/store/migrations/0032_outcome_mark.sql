-- The cell's outcome mark: every outcome dated before it (an OUTCOME
-- outbox row by when it was written, a commit's outcome by when its work
-- row last changed) has what the publisher records for it, or is no
-- longer the outcome its work publishes. The committer's reaper reads lost
-- outcomes back from a little before the mark, however far back that is,
-- and moves the mark up to the oldest outcome still owed; retention keeps
-- the OUTCOME outbox rows written since. It starts an hour back, as far
-- as the reaper read before the cell had a mark, so an upgrade publishes
-- nothing older than it would have.
CREATE TABLE outcome_mark (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    at       timestamptz NOT NULL
);
INSERT INTO outcome_mark (at) VALUES (now() - interval '1 hour');
