-- A publication is retried to a deadline, never to a count, and its state
-- is its own: 'pending' (tried again at next_try_at), 'published', 'failed'
-- (its deadline passed, or the target refused it for good: only
-- assay publish retry sends it again) and 'skipped' (target 'none': the
-- outcome has nowhere to go, and reason says why, so the reaper reads it
-- once). Each target of a work item is a row of its own and is retried on
-- its own.
ALTER TABLE publications DROP CONSTRAINT publications_target_check;
ALTER TABLE publications ADD CONSTRAINT publications_target_check
    CHECK (target IN ('github', 'callback', 'dry', 'none'));
ALTER TABLE publications
    ADD COLUMN state text NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'published', 'failed', 'skipped')),
    ADD COLUMN next_try_at timestamptz,
    ADD COLUMN deadline_at timestamptz,
    ADD COLUMN last_tried_at timestamptz,
    ADD COLUMN reason text;
-- Rows from before: published ones are, the rest are tried again within a
-- day (those given up after ten tries included).
UPDATE publications SET state = 'published' WHERE published_at IS NOT NULL;
UPDATE publications SET next_try_at = now(), deadline_at = now() + interval '1 day'
    WHERE published_at IS NULL;
CREATE INDEX publications_due ON publications (next_try_at) WHERE state = 'pending';
CREATE INDEX publications_failed ON publications (updated_at) WHERE state = 'failed';

-- An attempt lost to a provider outage (a transport failure while the
-- cell's circuit for the model was open, or the one that opened it) does
-- not count against the work's attempt budget: the work waits for the
-- provider within its deadline instead.
ALTER TABLE work ADD COLUMN outage_attempts int NOT NULL DEFAULT 0;

-- Work that ended because the provider was unreachable says so in its
-- reason ('provider_unavailable: …') and is not a person's to judge: it
-- opens no review item.
DROP TRIGGER work_needs_review ON work;
CREATE TRIGGER work_needs_review AFTER UPDATE OF state ON work FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state AND (NEW.state = 'schema_rejected'
        OR (NEW.state = 'retry_exhausted' AND NEW.lane = 'interactive'
            AND coalesce(NEW.reason, '') NOT LIKE 'provider_unavailable%')))
    EXECUTE FUNCTION review_ended_work();

-- The cell's circuit per model: 'closed' (calls go out) or 'open' (the
-- provider failed call after call: work waits in the stream, and one call
-- at next_probe_at asks whether it answers again). The classifiers of the
-- cell share it: one probe per interval for the whole cell.
CREATE TABLE provider_circuits (
    model         text PRIMARY KEY,
    state         text NOT NULL CHECK (state IN ('closed', 'open')),
    since         timestamptz NOT NULL,
    -- consecutive transport failures that opened it, and the last one's error
    failures      int NOT NULL DEFAULT 0,
    last_error    text,
    probes        int NOT NULL DEFAULT 0,
    probe_every   interval,
    next_probe_at timestamptz,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
